"""Logging in to vCenter or an ESXi host, and turning what pyvmomi raises into upsguard's errors.

Every pyvmomi call goes through ``Connection.call``: it runs the call, logs in
again once when the session expired or the connection dropped, and maps what
is left to ``AuthenticationError`` / ``PlatformUnreachable`` / ``PermanentError``
with one line that says what vSphere said. The password is read when needed
and never appears in a message.
"""

from __future__ import annotations

import http.client
import logging
import ssl
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

from pyVim import connect as _connect
from pyVmomi import vim, vmodl

from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    PermanentError,
    PlatformUnreachable,
    UpsguardError,
)

log = logging.getLogger(__name__)
T = TypeVar("T")
SmartConnect: Any = _connect.SmartConnect  # untyped in pyVmomi
Disconnect: Any = _connect.Disconnect

#: Socket timeout of one request; property waits ask the server for less than this.
HTTP_TIMEOUT_S = 30
_DROPPED = (ConnectionError, http.client.HTTPException, TimeoutError, OSError)


@dataclass(frozen=True)
class Endpoint:
    """Where and as whom to log in. ``label`` names it in messages (``vcenter 'vc1'``)."""

    label: str
    host: str
    port: int
    user: str
    password: Callable[[], str]
    verify_tls: bool = True
    ca_file: Path | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        if not self.verify_tls:
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
            return context
        try:
            return ssl.create_default_context(cafile=str(self.ca_file) if self.ca_file else None)
        except (OSError, ssl.SSLError) as exc:
            raise ConfigError(f"{self.label}: cannot read ca_file {self.ca_file}: {exc}") from exc


def fault_text(exc: BaseException) -> str:
    """What vSphere said, on one line: the fault's message, or its type when it has none."""
    msg = getattr(exc, "msg", None) or ""
    if not msg and isinstance(exc, vmodl.MethodFault):
        faults = getattr(exc, "faultMessage", None) or []
        msg = "; ".join(m.message for m in faults if getattr(m, "message", None))
    name = type(exc).__name__.split(".")[-1]
    text = str(msg).strip() or name
    if name not in text:
        text = f"{text} ({name})"
    return " ".join(text.split())


class Connection:
    """One logged-in session, shared by the worker threads of a platform."""

    def __init__(self, endpoint: Endpoint, pool_size: int = 8) -> None:
        self.endpoint = endpoint
        self.pool_size = pool_size  # one kept-alive HTTPS connection per worker thread
        self._si: Any = None
        self._lock = threading.Lock()
        self.round_trips = 0

    @property
    def si(self) -> Any:
        if self._si is None:
            self.login()
        return self._si

    def login(self) -> None:
        """Log in (again). Raises AuthenticationError, PlatformUnreachable, PermanentError."""
        ep = self.endpoint
        with self._lock:
            try:
                self._si = SmartConnect(
                    host=ep.host,
                    port=ep.port,
                    user=ep.user,
                    pwd=ep.password(),
                    sslContext=ep.ssl_context(),
                    httpConnectionTimeout=HTTP_TIMEOUT_S,
                )
            except vim.fault.InvalidLogin as exc:
                raise AuthenticationError(
                    f"{ep.label}: {ep.address} refused the login of user '{ep.user}': "
                    "check the user and its password file or variable"
                ) from exc
            except ssl.SSLCertVerificationError as exc:
                raise PermanentError(
                    f"{ep.label}: the TLS certificate of {ep.address} is not trusted "
                    f"({exc.verify_message}): set ca_file to its CA bundle "
                    "(or verify_tls: false, which trusts anyone on the path)"
                ) from exc
            except ssl.SSLError as exc:
                raise PlatformUnreachable(
                    f"{ep.label}: TLS handshake with {ep.address} failed: {exc.reason}"
                ) from exc
            except vmodl.MethodFault as exc:
                raise PermanentError(f"{ep.label}: login failed: {fault_text(exc)}") from exc
            except _DROPPED as exc:
                raise PlatformUnreachable(
                    f"{ep.label}: cannot reach {ep.address}: {_reason(exc)}"
                ) from exc
            # pyVmomi keeps 5 connections by default and closes the rest after each call:
            # with more threads than that, every call would pay a new TLS handshake.
            self._si._stub.poolSize = self.pool_size
            self.round_trips += 3  # version probe, service content, login

    def call(self, what: str, fn: Callable[[Any], T]) -> T:
        """Run ``fn(si)``; log in again once if the session expired or the connection dropped."""
        for attempt in (1, 2):
            try:
                self.round_trips += 1
                return fn(self.si)
            except vim.fault.NotAuthenticated as exc:
                if attempt == 2:
                    raise AuthenticationError(
                        f"{self.endpoint.label}: {what}: session lost"
                    ) from exc
                log.info("%s: session expired, logging in again", self.endpoint.label)
                self._si = None
            except vmodl.MethodFault as exc:
                raise PermanentError(f"{self.endpoint.label}: {what}: {fault_text(exc)}") from exc
            except UpsguardError:
                raise
            except _DROPPED as exc:
                if attempt == 2:
                    raise PlatformUnreachable(
                        f"{self.endpoint.label}: {what}: {self.endpoint.address} "
                        f"did not answer: {_reason(exc)}"
                    ) from exc
                log.info("%s: connection dropped (%s), reconnecting", self.endpoint.label, exc)
                self._si = None
        raise AssertionError("unreachable")  # pragma: no cover

    def forget(self, si: Any) -> None:
        """Drop ``si`` if it is still the current session, so the next call logs in again."""
        with self._lock:
            if self._si is si:
                self._si = None

    def close(self) -> None:
        si, self._si = self._si, None
        if si is not None:
            try:
                Disconnect(si)
            except Exception as exc:  # closing must never raise
                log.debug("%s: logout failed: %s", self.endpoint.label, exc)


def _reason(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return str(exc) or type(exc).__name__
