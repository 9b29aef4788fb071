"""One session with vCenter or an ESXi host, shared by every thread of the platform.

It is pyVmomi's own session-oriented stub (``pyVim.connect.VimSessionOrientedStub``
over ``SmartStubAdapter``): it logs in on first use, logs in again when vSphere
says the session is gone, and tries a call again when a kept-alive connection
dropped. So managed objects made once stay usable for the life of the platform,
across expired sessions and vCenter restarts. Every call runs inside
``vsphere_faults``.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from pyVim import connect
from pyVmomi import vim

from upsguard.errors import PlatformUnreachable
from upsguard.plugins.platforms.vsphere.endpoint import Endpoint
from upsguard.plugins.platforms.vsphere.faults import vsphere_faults
from upsguard.plugins.platforms.vsphere.lean import SDK_PATH, LeanRequests

log = logging.getLogger(__name__)
T = TypeVar("T")
SmartStubAdapter: Any = connect.SmartStubAdapter  # untyped in pyVmomi
SessionStub: Any = connect.VimSessionOrientedStub
ServiceInstance: Any = vim.ServiceInstance

#: Socket timeout of one request; property waits ask the server for less than this.
HTTP_TIMEOUT_S = 30
#: Attempts of one call: a dropped connection and a lost session may both need one more.
ATTEMPTS = 3


class Connection:
    """One logged-in session to ``endpoint``; ``call`` runs a blocking pyVmomi call on it."""

    def __init__(self, endpoint: Endpoint, pool_size: int = 8) -> None:
        self.endpoint = endpoint
        self.pool_size = pool_size  # kept-alive HTTPS connections: one per thread that calls
        self._stub: Any = None
        self._content: Any = None
        self.lean: LeanRequests | None = None  # the hot requests' cheaper path (after ``open``)
        self._lock = threading.Lock()
        self.round_trips = 0  # calls made through ``call``
        self.logins = 0
        self._closed = False  # a call still under way after close() must not log in again
        self._calls = 0  # calls under way; close() drops the connections once they are back
        self._idle = threading.Condition()

    def open(self) -> None:
        """Reach the endpoint and log in. Raises AuthenticationError, PlatformUnreachable,
        PermanentError (a certificate not trusted, a fault at login)."""
        try:
            self._open()
        except BaseException:
            self._drop()  # a failed open keeps no socket: the next one starts afresh
            raise

    def _open(self) -> None:
        ep = self.endpoint
        with self._lock, vsphere_faults(ep):
            self._closed = False
            if self._stub is None:
                soap = SmartStubAdapter(  # asks the endpoint which API version it speaks
                    host=ep.host,
                    port=ep.port,
                    path=SDK_PATH,
                    sslContext=ep.ssl_context(),
                    poolSize=self.pool_size,
                    httpConnectionTimeout=HTTP_TIMEOUT_S,
                )
                self._stub = SessionStub(soap, self._login, retryCount=ATTEMPTS)
                self.lean = LeanRequests(soap, ep.host, ep.port, ep.ssl_context(), HTTP_TIMEOUT_S)
            # the first call logs in
            self._content = ServiceInstance("ServiceInstance", self._stub).RetrieveContent()

    def _login(self, soap: Any) -> None:
        """pyVmomi's login hook, run under its lock on the bare stub before the first call
        and after a lost session."""
        if self._closed:
            raise PlatformUnreachable(f"{self.endpoint.label}: the session was closed")
        manager = ServiceInstance("ServiceInstance", soap).RetrieveContent().sessionManager
        if self.logins:
            # a call that failed with the old session asks again even when another thread
            # has logged in since, and a second Login on a live session is refused
            try:
                if manager.currentSession is not None:
                    return
            except vim.fault.NotAuthenticated:
                pass  # vcsim will not tell without a session; vCenter answers None
            log.info("%s: session expired, logging in again", self.endpoint.label)
        manager.Login(self.endpoint.user, self.endpoint.password())
        self.logins += 1

    @property
    def content(self) -> Any:
        """The endpoint's ServiceContent (its managers and root folder), read at ``open``."""
        if self._content is None:
            self.open()
        return self._content

    def ref(self, kind: Any, moid: str) -> Any:
        """The managed object ``moid`` of type ``kind`` (``vim.VirtualMachine``) on this session.

        No request is made; calls on it go through this session, logged in again as needed.
        """
        if self._stub is None:
            raise PlatformUnreachable(f"{self.endpoint.label}: not connected")
        return kind(moid, self._stub)

    def call(self, doing: str, fn: Callable[[], T]) -> T:
        """``fn()``, whose pyVmomi calls use this session; what it raises leaves mapped."""
        self.round_trips += 1
        with self._idle:
            self._calls += 1
        try:
            with vsphere_faults(self.endpoint, doing):
                if self._stub is None:
                    self.open()
                return fn()
        finally:
            with self._idle:
                self._calls -= 1
                self._idle.notify_all()

    def close(self) -> None:
        """Log out when logged in, and drop the kept-alive connections once the calls under
        way are back (a call to an endpoint that hangs returns its connection late: dropped
        before, it would be left open). Never raises."""
        self._closed = True
        stub, content = self._stub, self._content
        try:
            if stub is not None and content is not None and stub.state == stub.STATE_AUTHENTICATED:
                content.sessionManager.Logout()
        except Exception as exc:  # closing must never raise
            log.debug("%s: logout failed: %s", self.endpoint.label, exc)
        finally:
            with self._idle:
                self._idle.wait_for(lambda: self._calls == 0, HTTP_TIMEOUT_S * ATTEMPTS)
            self._drop()

    def _drop(self) -> None:
        """Forget the session and close its kept-alive connections."""
        stub, lean = self._stub, self.lean
        self._stub = self._content = self.lean = None
        if lean is not None:
            lean.close()
        if stub is not None:
            stub.DropConnections()
