"""The coordination store on etcd v3, through etcd3aio (asyncio over gRPC), plain or TLS.

Keys of a site, all under ``/upsguard/<site>/`` (the site's name percent-quoted)::

    leader                   Candidate; held by the leader's lease; its mod revision is
                             the fencing token of the term
    alone                    AloneNotice
    runs/<run>               RunRecord
    steps/<run>/<step>       StepMark            (run and step ids percent-quoted)

Winning is one transaction: *if the leader key's create revision is 0 (no key), put it
with the new lease*. Every write of the leader is one transaction guarded by *the leader
key's mod revision equals the token*; a lease that ended took the key with it, and a new
leader's key has a newer revision, so a deposed leader's write is refused by etcd itself.
The key is written once, when it is won, so its mod revision is the token exactly when its
create revision is the token and its version is 1: the guard is said so, with etcd3aio's
public compares (it has none for the mod revision).

There is one etcd3aio client per endpoint, each dialling one address with one attempt per
request (etcd3aio would balance one channel over every address and retry on its own). A
request goes to the endpoint that answered last and, when it fails (refused, no answer
within ``request_timeout``, no quorum behind it), to the next: a call returns or raises
within about ``len(endpoints) * request_timeout``. Requests that write are safe to repeat on
the next endpoint: a campaign that landed is recognised by its lease, and a fenced write
puts the same value again. The client of an endpoint that failed is closed and made anew
on its next use, so a member that came back is dialled at once (gRPC's own reconnect
backoff grows to two minutes). etcd3aio dials IPv4 addresses: a host name is resolved here
each time its client is made. A watch is the exception: etcd3aio reconnects it on its own,
so a watch on an endpoint that went away ends with no change seen when its time is up, and
the follower's next read moves to the next endpoint.

TLS (``https://`` endpoints, ``ha.tls``): each member's certificate is verified against
``ca_file`` for the host or address its endpoint names; ``cert_file`` and ``key_file`` are
this controller's certificate, which etcd's ``--client-cert-auth`` asks for. gRPC reports a
refused handshake as it reports a member that is down, so it is ``StoreUnavailable``, whose
message says which part of ``ha.tls`` to check when the members are up.

etcd3aio's and gRPC's errors are mapped here, at the boundary, to the project's
(``raise ... from exc``): no endpoint answering is ``StoreUnavailable``; a refused login, an
expired session that a new login cannot renew, or a missing permission is
``AuthenticationError``; a fenced write refused, or a lease gone, is ``LeadershipLost``;
anything else etcd refuses is ``PermanentError``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import grpc
import grpc.aio
from etcd3aio import Etcd3Client, EtcdError, prefix_range_end
from etcd3aio.auth import AuthService
from etcd3aio.kv import KVService
from etcd3aio.lease import LeaseService
from etcd3aio.maintenance import MaintenanceService
from etcd3aio.watch import WatchService

from upsguard.config.ha import EtcdTls, HaConfig, endpoint_address
from upsguard.config.reading import read_bytes
from upsguard.config.types import resolve_secret
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    LeadershipLost,
    PermanentError,
    StoreUnavailable,
    UpsguardError,
)
from upsguard.models import RunId, StepId
from upsguard.plugins.coordination.base import (
    AloneNotice,
    Candidate,
    ControllerView,
    EndpointHealth,
    Leader,
    OwedCaches,
    SharedLedger,
    StepMark,
    Term,
    Unreadable,
)
from upsguard.plugins.coordination.records import decode, encode
from upsguard.runs import RunRecord

T = TypeVar("T")
log = logging.getLogger(__name__)

AUTH_OLD_REVISION = "revision of auth store is old"
"""etcd's ``ErrGRPCAuthOldRevision``: a token issued before a change of users or roles."""
VIEWS = "views/"
"""Where each controller's view is kept, beside the ledger (``exchange_views``)."""

#: What a member answers when it is down, cut off, refuses the TLS handshake, or has no
#: quorum behind it: the next endpoint may do better.
_ENDPOINT_TROUBLE = frozenset(
    {
        grpc.StatusCode.UNAVAILABLE,
        grpc.StatusCode.DEADLINE_EXCEEDED,
        grpc.StatusCode.UNKNOWN,
        grpc.StatusCode.CANCELLED,
        grpc.StatusCode.RESOURCE_EXHAUSTED,
        grpc.StatusCode.INTERNAL,
    }
)

#: The most a certificate or key file may hold (a chain of a few certificates is a few KiB).
_PEM_LIMIT = 1024 * 1024

UNREADABLE_HOLDER = "(unreadable)"
"""The name of a leader whose key holds no Candidate (written by hand, or garbled)."""


class _NotFound(Exception):
    """etcd answered NOT_FOUND (a lease already gone); only ``resign`` expects it."""


class _Unresolved(Exception):
    """An endpoint's host name has no IPv4 address now (DNS down, a typo)."""


class _WatchEnded(Exception):
    """etcd cancelled the watch for a reason other than a compacted history."""


class _ClientClosed(Exception):
    """Another call, failing on the same endpoint, closed its client under this one: gRPC
    then ends this call with a ``CancelledError`` that nobody asked this task for."""


def _closed_under(exc: asyncio.CancelledError) -> _ClientClosed:
    """A call's ``CancelledError`` when this task is not being cancelled: the endpoint's
    client was closed under it (passed on, it would end the caller's loop unheard).
    Re-raises the cancellation the task was asked for."""
    task = asyncio.current_task()
    if task is None or task.cancelling() > 0:
        raise exc
    return _ClientClosed("its client was closed by another call that failed there")


#: Errors of one endpoint, before they are mapped: etcd3aio's own, gRPC's it passes on as
#: they are (``UsageError``: a call on the endpoint's client that another call, failing
#: there, closed meanwhile, as etcd3aio's watch does when it reconnects), a deadline of
#: ours, a host name that did not resolve, a client closed under a call.
_ENDPOINT_ERRORS = (
    EtcdError,
    grpc.aio.AioRpcError,
    grpc.aio.UsageError,
    TimeoutError,
    _Unresolved,
    _ClientClosed,
)


@dataclass(frozen=True, slots=True)
class _Connection:
    """One endpoint's client and the services requests use (etcd3aio makes them when it
    connects)."""

    client: Etcd3Client
    kv: KVService
    lease: LeaseService
    watch: WatchService
    maintenance: MaintenanceService
    auth: AuthService


class EtcdStore:
    """The ``CoordinationStore`` of one site on an etcd cluster."""

    def __init__(self, site: str, settings: HaConfig) -> None:
        """Reads the password and the TLS files now (``ConfigError`` naming each file or
        variable); connects on the first request."""
        self.site = site
        self._user = settings.user
        self._secret = settings.password_file, settings.password_env
        self._password = resolve_secret("etcd password", *self._secret)
        self._timeout_s = settings.request_timeout.total_seconds()
        self._endpoints = list(settings.endpoints)
        self._tls = _tls_files(settings.tls)
        if self._tls is None and any(url.startswith("https://") for url in self._endpoints):
            raise ConfigError("ha.tls: https:// endpoints need ca_file")
        self._connections: list[_Connection | None] = [None] * len(self._endpoints)
        self._making = [asyncio.Lock() for _ in self._endpoints]
        self._current = 0
        self._prefix = f"/upsguard/{quote(site, safe='')}/"
        self._leader_key = (self._prefix + "leader").encode()
        self._view_lease: int | None = None

    # -- leadership -------------------------------------------------------------------------

    async def campaign(self, candidate: Candidate, ttl_s: float) -> Term | Leader:
        ttl = max(1, round(ttl_s))
        lease = await self._call(
            "grant a lease", lambda c: c.lease.grant(ttl, timeout=self._timeout_s)
        )
        key, value = self._leader_key, encode(candidate)
        read = KVService.txn_op_get(key)
        try:
            reply = await self._call(
                "campaign for leadership",
                lambda c: c.kv.txn(
                    [KVService.txn_compare_create_revision(key, 0)],
                    [KVService.txn_op_put(key, value, lease=lease.ID), read],
                    [read],
                    timeout=self._timeout_s,
                ),
            )
        except BaseException:
            await self._revoke_quietly(lease.ID)
            raise
        kv = _only_kv(reply.responses[-1])
        if kv is not None and kv.lease == lease.ID:  # won now, or by an attempt that timed out
            return Term(candidate, int(kv.mod_revision), int(lease.ID), float(lease.TTL))
        await self._revoke_quietly(lease.ID)
        holder = self._leader_of(kv)
        if holder is None:  # the key went between the compare and the read: none in one txn
            raise StoreUnavailable("etcd: campaign for leadership: no answer about the leader")
        return holder

    async def renew(self, term: Term) -> float:
        async def keep_alive(c: _Connection) -> int:
            """One keep-alive on the lease's stream; etcd answers TTL 0 for a lease gone."""
            stream = c.lease.keep_alive(term.lease)
            try:
                async for reply in stream:
                    return int(reply.TTL)
                return 0
            finally:
                stream.cancel()

        try:
            ttl = await self._call("renew the lease", keep_alive)
        except _NotFound:
            ttl = 0
        if ttl <= 0:
            raise LeadershipLost(f"etcd: the lease of term {term.token} has ended")
        return float(ttl)

    async def resign(self, term: Term) -> None:
        with contextlib.suppress(_NotFound):  # the lease ended already, and took the key along
            await self._call(
                "revoke the lease", lambda c: c.lease.revoke(term.lease, timeout=self._timeout_s)
            )

    async def leader(self) -> Leader | None:
        reply = await self._call(
            "read the leader", lambda c: c.kv.get(self._leader_key, timeout=self._timeout_s)
        )
        return self._leader_of(reply.kvs[0] if reply.kvs else None)

    # -- the shared ledger (fenced writes) ---------------------------------------------------

    async def record_run(self, term: Term, record: RunRecord) -> None:
        key = self._run_key(record.spec.id)
        await self._fenced(
            term, f"record run {record.spec.id}", [KVService.txn_op_put(key, encode(record))]
        )

    async def record_step(self, term: Term, run: RunId, mark: StepMark) -> None:
        key = self._step_key(run, mark.step)
        what = f"record step {mark.step} of run {run} as {mark.state}"
        await self._fenced(term, what, [KVService.txn_op_put(key, encode(mark))])

    async def record_steps(self, term: Term, marks: Sequence[tuple[RunId, StepMark]]) -> None:
        puts = [
            KVService.txn_op_put(self._step_key(run, mark.step), encode(mark))
            for run, mark in marks
        ]
        await self._fenced(term, f"record {len(marks)} step(s)", puts)

    async def forget_run(self, term: Term, run: RunId) -> None:
        run_key, steps = self._run_key(run), self._steps_prefix(run)
        deletes = [
            KVService.txn_op_delete(run_key),
            KVService.txn_op_delete(steps, range_end=prefix_range_end(steps)),
        ]
        await self._fenced(term, f"forget run {run}", deletes)

    async def record_owed(self, term: Term, owed: OwedCaches) -> None:
        key = (self._prefix + "owed").encode()
        await self._fenced(
            term, "record the caches owed write-back", [KVService.txn_op_put(key, encode(owed))]
        )

    async def declare_alone(self, term: Term, notice: AloneNotice) -> None:
        key = (self._prefix + "alone").encode()
        await self._fenced(
            term, "declare finishing alone", [KVService.txn_op_put(key, encode(notice))]
        )

    async def _fenced(self, term: Term, what: str, ops: Sequence[Any]) -> None:
        key = self._leader_key
        guard = [  # its mod revision is the token (the module's docstring)
            KVService.txn_compare_create_revision(key, term.token),
            KVService.txn_compare_version(key, 1),
        ]
        reply = await self._call(
            what,
            lambda c: c.kv.txn(guard, ops, [KVService.txn_op_get(key)], timeout=self._timeout_s),
        )
        if reply.succeeded:
            return
        holder = self._leader_of(_only_kv(reply.responses[-1]))
        now = (
            f"{holder.holder.name} leads now (term {holder.token})"
            if holder is not None
            else "nobody leads now (the lease ended)"
        )
        raise LeadershipLost(
            f"etcd: {what}: refused, the term {term.token} of {term.holder.name} is over: {now}",
            leader=holder.holder.name if holder is not None else None,
        )

    # -- each controller's view ------------------------------------------------------------

    async def exchange_views(self, view: ControllerView, ttl_s: float) -> list[ControllerView]:
        """Each view goes under a lease granted for it, and the one before is revoked: no
        keep-alive stream beside the leader's (two on one client lost each other's answers,
        and the leader's renewal hung past its timeout)."""
        granted = await self._call(
            "grant the view's lease",
            lambda c: c.lease.grant(max(1, round(ttl_s)), timeout=self._timeout_s),
        )
        lease, before = int(granted.ID), self._view_lease
        views = self._prefix + VIEWS
        mine = (views + quote(view.by, safe="")).encode()
        ops = [
            KVService.txn_op_put(mine, encode(view), lease=lease),
            KVService.txn_op_get(views.encode(), range_end=prefix_range_end(views.encode())),
        ]
        try:
            reply = await self._call(
                "publish this controller's view",
                lambda c: c.kv.txn([], ops, [], timeout=self._timeout_s),
            )
        except BaseException:
            await self._revoke_quietly(lease)
            raise
        self._view_lease = lease
        if before is not None:
            await self._revoke_quietly(before)  # the view holds on to the new one now
        others = []
        for kv in reply.responses[-1].response_range.kvs:
            if kv.key == mine:
                continue
            try:
                others.append(decode(ControllerView, kv.value))
            except ValueError as exc:
                log.debug("the view under %s: %s", kv.key.decode(errors="replace"), exc)
        return others

    # -- reading --------------------------------------------------------------------------

    async def snapshot(self) -> SharedLedger:
        prefix = self._prefix.encode()
        reply = await self._call(
            "read the ledger",
            lambda c: c.kv.get(prefix, range_end=prefix_range_end(prefix), timeout=self._timeout_s),
        )
        return self._ledger(int(reply.header.revision), list(reply.kvs))

    async def wait_for_change(self, after_revision: int, within_s: float) -> bool:
        index = self._current
        prefix = self._prefix.encode()
        connection: _Connection | None = None
        try:
            async with asyncio.timeout(within_s):
                connection = await self._connection(index)
                replies = connection.watch.watch(
                    prefix, range_end=prefix_range_end(prefix), start_revision=after_revision + 1
                )
                try:
                    async for reply in replies:
                        # a change, or a compacted history (what changed is gone from it):
                        # either way, read it all again
                        if reply.events or reply.compact_revision > 0:
                            return True
                        if reply.canceled:
                            raise _WatchEnded(reply.cancel_reason or "etcd cancelled the watch")
                except asyncio.CancelledError as exc:
                    raise _closed_under(exc) from exc
                finally:  # etcd3aio's watch is a generator: end its stream now, not when collected
                    if isinstance(replies, AsyncGenerator):
                        await replies.aclose()
        except TimeoutError:
            return False
        except (*_ENDPOINT_ERRORS, _WatchEnded) as exc:
            self._current = (index + 1) % len(self._endpoints)
            if connection is not None:
                await self._drop(index, connection)
            raise StoreUnavailable(
                f"etcd at {self._endpoints[index]}: watching the ledger: {_detail(exc)}"
            ) from exc
        return False

    async def probe(self) -> list[EndpointHealth]:
        return list(await asyncio.gather(*(self._probe(i) for i in range(len(self._endpoints)))))

    async def _probe(self, index: int) -> EndpointHealth:
        endpoint = self._endpoints[index]
        try:
            async with asyncio.timeout(self._timeout_s * 2):  # a login, then the status
                connection = await self._connection(index)
                status = await connection.maintenance.status(timeout=self._timeout_s)
        except (*_ENDPOINT_ERRORS, UpsguardError) as exc:
            await self._drop(index, self._connections[index])
            return EndpointHealth(endpoint, answered=False, detail=_detail(exc))
        return EndpointHealth(
            endpoint,
            answered=True,
            version=str(status.version),
            is_leader=status.leader == status.header.member_id,
        )

    async def close(self) -> None:
        for index, connection in enumerate(self._connections):
            await self._drop(index, connection)

    # -- requests, endpoints and errors ----------------------------------------------------

    async def _call(self, what: str, request: Callable[[_Connection], Awaitable[T]]) -> T:
        """``request`` on the endpoint that answered last, then on each of the others."""
        failures: list[str] = []
        refused_tls = False
        last: BaseException | None = None
        count = len(self._endpoints)
        for step in range(count):
            index = (self._current + step) % count
            try:
                result = await self._on(index, what, request)
            except _ENDPOINT_ERRORS as exc:
                failures.append(f"{self._endpoints[index]}: {_detail(exc)}")
                refused_tls |= self._endpoints[index].startswith("https://") and (
                    _status(exc) is grpc.StatusCode.UNAVAILABLE
                )
                last = exc
                continue
            self._current = index
            return result
        hint = self._tls_hint() if refused_tls else ""
        raise StoreUnavailable(
            f"etcd: {what}: no endpoint answered ({'; '.join(failures)}){hint}"
        ) from last

    async def _on(self, index: int, what: str, request: Callable[[_Connection], Awaitable[T]]) -> T:
        """One endpoint: errors of that endpoint alone come out as they are (the caller tries
        the next endpoint); errors no endpoint would answer otherwise come out mapped."""
        for fresh_login in (False, True):
            connection: _Connection | None = None
            try:
                async with asyncio.timeout(self._timeout_s * 1.5):  # gRPC's deadline first
                    connection = await self._connection(index)
                    try:
                        return await request(connection)
                    except asyncio.CancelledError as exc:
                        raise _closed_under(exc) from exc
            except _ENDPOINT_ERRORS as exc:
                code = _status(exc)
                if code is None or code in _ENDPOINT_TROUBLE:
                    await self._drop(index, connection)
                    raise
                if _token_stale(code, exc) and not fresh_login:
                    await self._drop(index, connection)  # log in again for a new token
                    continue
                raise self._refused(index, what, code, exc) from exc
        raise AssertionError("unreachable")

    async def _connection(self, index: int) -> _Connection:
        """The endpoint's client, made (and logged in) when it has none."""
        async with self._making[index]:
            connection = self._connections[index]
            if connection is None:
                connection = await self._connect(index)
                self._connections[index] = connection
            return connection

    async def _connect(self, index: int) -> _Connection:
        """A client for one endpoint, TLS for ``https://``; a refused login names the user."""
        url = self._endpoints[index]
        host, port = endpoint_address(url)
        address = await _ipv4(host, port)
        secure = url.startswith("https://")
        tls = self._tls if secure else None
        client = Etcd3Client(
            [f"{address}:{port}"],
            rpc_max_attempts=1,  # the next endpoint is the retry
            tls_server_name=host if secure else None,  # the name the certificate must hold
            ca_cert=tls.ca if tls else None,
            cert_chain=tls.cert if tls else None,
            cert_key=tls.key if tls else None,
        )
        await client.connect()
        kv, lease, watch = client.kv, client.lease, client.watch
        maintenance, auth = client.maintenance, client.auth
        assert kv and lease and watch and maintenance and auth, "etcd3aio connected"
        connection = _Connection(client, kv, lease, watch, maintenance, auth)
        if self._user is not None:
            try:
                reply = await auth.authenticate(
                    self._user, self._password_now(), timeout=self._timeout_s
                )
            except _ENDPOINT_ERRORS as exc:
                await client.close()
                if _status(exc) in (
                    grpc.StatusCode.INVALID_ARGUMENT,
                    grpc.StatusCode.FAILED_PRECONDITION,
                ):
                    raise AuthenticationError(
                        f"etcd at {url}: user '{self._user}' was refused: {_detail(exc)}"
                    ) from exc
                raise
            client.set_token(reply.token)
        return connection

    def _password_now(self) -> str:
        """The password, its file read again at each login: one rotated in etcd and in its
        file is used from the next login on (the old session ends), the service left
        running. A file that cannot be read now leaves the one read before (logged)."""
        try:
            password = resolve_secret("etcd password", *self._secret)
        except ConfigError as exc:
            if self._password is not None:
                log.warning("%s (logging in with the password read before)", exc)
        else:
            self._password = password
        return self._password or ""

    async def _drop(self, index: int, connection: _Connection | None) -> None:
        """Close an endpoint's client that failed (unless another took its place already);
        the next request to it makes a new one."""
        if connection is None:
            return
        if self._connections[index] is connection:
            self._connections[index] = None
        with contextlib.suppress(Exception):  # closing never stops the others closing
            await connection.client.close()

    def _refused(
        self, index: int, what: str, code: grpc.StatusCode | None, exc: BaseException
    ) -> Exception:
        where = f"etcd at {self._endpoints[index]}"
        if code is grpc.StatusCode.NOT_FOUND:
            return _NotFound(_detail(exc))
        if code is grpc.StatusCode.PERMISSION_DENIED:
            return AuthenticationError(
                f"{where}: user '{self._user}' may not {what}: grant it readwrite on the "
                f"prefix {self._prefix}"
            )
        if code in (
            grpc.StatusCode.UNAUTHENTICATED,
            grpc.StatusCode.INVALID_ARGUMENT,
        ) and (self._user is None):
            return AuthenticationError(
                f"{where}: {what}: refused ({_detail(exc)}): etcd has authentication on; "
                "give ha.user and password_file"
            )
        if code is grpc.StatusCode.UNAUTHENTICATED:
            return AuthenticationError(
                f"{where}: user '{self._user}' was logged out: {_detail(exc)}"
            )
        return PermanentError(f"{where}: {what}: {_detail(exc)}")

    def _tls_hint(self) -> str:
        """What to check when TLS endpoints did not answer: a refused handshake and a member
        that is down look the same from here (gRPC says UNAVAILABLE for both)."""
        if self._tls is None or self._tls.cert is None:
            return (
                "; if the members are up: this controller shows no client certificate "
                "(ha.tls cert_file and key_file), which a member started with "
                "--client-cert-auth refuses"
            )
        return (
            "; if the members are up: check that ha.tls ca_file is the CA that signed the "
            "members' certificates, for the name in each endpoint, and that the CA of the "
            "members' --trusted-ca-file signed cert_file"
        )

    async def _revoke_quietly(self, lease: int) -> None:
        """A lease nobody will use: revoked if etcd answers, left to expire otherwise."""
        with contextlib.suppress(Exception):
            await self._call(
                "revoke an unused lease",
                lambda c: c.lease.revoke(lease, timeout=self._timeout_s),
            )

    # -- keys and values ----------------------------------------------------------------------

    def _run_key(self, run: RunId) -> bytes:
        return f"{self._prefix}runs/{quote(run, safe='')}".encode()

    def _steps_prefix(self, run: RunId) -> bytes:
        return f"{self._prefix}steps/{quote(run, safe='')}/".encode()

    def _step_key(self, run: RunId, step: StepId) -> bytes:
        return self._steps_prefix(run) + quote(step, safe="").encode()

    def _leader_of(self, kv: Any) -> Leader | None:
        if kv is None:
            return None
        try:
            holder = decode(Candidate, kv.value)
        except ValueError:
            holder = Candidate(UNREADABLE_HOLDER)
        return Leader(holder, int(kv.mod_revision))

    def _ledger(self, revision: int, kvs: Iterable[Any]) -> SharedLedger:
        leader: Leader | None = None
        alone: AloneNotice | None = None
        owed: tuple[str, ...] = ()
        runs: list[tuple[int, RunRecord]] = []
        steps: dict[RunId, dict[StepId, StepMark]] = {}
        unreadable: list[Unreadable] = []
        for kv in kvs:
            key = kv.key.decode(errors="replace")
            name = key.removeprefix(self._prefix)
            try:
                if name == "leader":
                    leader = self._leader_of(kv)
                elif name == "alone":
                    alone = decode(AloneNotice, kv.value)
                elif name == "owed":
                    owed = decode(OwedCaches, kv.value).caches
                elif name.startswith(VIEWS):
                    continue  # each controller's view: exchange_views, not the ledger
                elif name.startswith("runs/"):
                    runs.append((int(kv.create_revision), decode(RunRecord, kv.value)))
                elif name.startswith("steps/") and name.count("/") == 2:
                    run = RunId(unquote(name.split("/")[1]))
                    mark = decode(StepMark, kv.value)
                    steps.setdefault(run, {})[mark.step] = mark
                else:
                    unreadable.append(Unreadable(key, "not a key upsguard writes"))
            except ValueError as exc:
                unreadable.append(Unreadable(key, str(exc)))
        ordered = tuple(record for _, record in sorted(runs, key=lambda pair: pair[0]))
        return SharedLedger(revision, leader, ordered, steps, alone, tuple(unreadable), owed)


@dataclass(frozen=True, slots=True)
class _TlsFiles:
    """What ``ha.tls``'s files hold (PEM): the members' CA, this controller's certificate."""

    ca: bytes
    cert: bytes | None
    key: bytes | None


def _tls_files(tls: EtcdTls | None) -> _TlsFiles | None:
    """``ha.tls``'s files read; None without a CA (no TLS)."""
    if tls is None or tls.ca_file is None:
        return None
    cert, key = tls.cert_file, tls.key_file
    return _TlsFiles(
        _read_pem("ca_file", tls.ca_file),
        None if cert is None else _read_pem("cert_file", cert),
        None if key is None else _read_pem("key_file", key),
    )


def _read_pem(field: str, path: Path) -> bytes:
    try:
        return read_bytes(path, _PEM_LIMIT)
    except ConfigError as exc:
        raise ConfigError(f"ha.tls.{field}: {exc}") from None


async def _ipv4(host: str, port: int) -> str:
    """The IPv4 address to dial for ``host`` (etcd3aio dials IPv4 addresses only)."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.IPv4Address(host))
    try:
        found = await asyncio.get_running_loop().getaddrinfo(
            host, port, family=socket.AF_INET, type=socket.SOCK_STREAM
        )
    except OSError as exc:
        raise _Unresolved(f"{host} has no IPv4 address: {exc.strerror or exc}") from exc
    if not found:
        raise _Unresolved(f"{host} has no IPv4 address")
    return str(found[0][4][0])


def _only_kv(response: Any) -> Any:
    """The key-value a transaction's get found (a ``ResponseOp``), or None."""
    kvs = response.response_range.kvs
    return kvs[0] if kvs else None


def _status(exc: BaseException) -> grpc.StatusCode | None:
    """The gRPC status under an error: etcd3aio raises its own errors from gRPC's, and
    passes some of gRPC's on as they are."""
    rpc = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
    if isinstance(rpc, grpc.aio.AioRpcError):
        code: grpc.StatusCode = rpc.code()
        return code
    return None


def _token_stale(code: grpc.StatusCode, exc: BaseException) -> bool:
    """The session's token is no longer taken, and a new login gets one that is (as etcd's
    own client does): it expired, or the users and roles changed since it was issued
    ("revision of auth store is old", for a JWT token after any role or user change)."""
    if code is grpc.StatusCode.UNAUTHENTICATED:
        return True
    return code is grpc.StatusCode.INVALID_ARGUMENT and AUTH_OLD_REVISION in _detail(exc)


def _detail(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    rpc = exc if isinstance(exc, grpc.aio.AioRpcError) else exc.__cause__
    if isinstance(rpc, grpc.aio.AioRpcError):
        text = f"{rpc.code().name}: {rpc.details() or 'no details'}"
    else:
        text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
