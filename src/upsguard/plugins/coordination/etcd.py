"""The coordination store on etcd v3, through aetcd (asyncio over gRPC).

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

aetcd talks to one address per client, so there is one client per endpoint. A request goes
to the endpoint that answered last and, when it fails (refused, no answer within
``request_timeout``, no quorum behind it), to the next: a call returns or raises within
about ``len(endpoints) * request_timeout``. Requests that write are safe to repeat on the
next endpoint: a campaign that landed is recognised by its lease, and a fenced write puts
the same value again.

aetcd's errors are mapped here, at the boundary, to the project's (``raise ... from exc``):
no endpoint answering is ``StoreUnavailable``; a refused login, an expired session that a
new login cannot renew, or a missing permission is ``AuthenticationError``.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterable, Sequence
from typing import Any, TypeVar
from urllib.parse import quote, unquote

import aetcd
import aetcd.rpc

from upsguard.config.ha import HaConfig, endpoint_address
from upsguard.config.types import resolve_secret
from upsguard.errors import AuthenticationError, LeadershipLost, PermanentError, StoreUnavailable
from upsguard.models import RunId, StepId
from upsguard.plugins.coordination.base import (
    AloneNotice,
    Candidate,
    EndpointHealth,
    Leader,
    SharedLedger,
    StepMark,
    Term,
    Unreadable,
)
from upsguard.plugins.coordination.records import decode, encode
from upsguard.runs import RunRecord

T = TypeVar("T")

#: gRPC retries a refused connection with a backoff that grows to two minutes by default:
#: a member that comes back would stay unused that long.
GRPC_OPTIONS = {
    "grpc.initial_reconnect_backoff_ms": 200,
    "grpc.min_reconnect_backoff_ms": 200,
    "grpc.max_reconnect_backoff_ms": 1000,
}

#: What a member answers when it is down, cut off, or without a quorum behind it: the
#: next endpoint may do better.
_ENDPOINT_TROUBLE = frozenset(
    {
        aetcd.rpc.StatusCode.UNAVAILABLE,
        aetcd.rpc.StatusCode.DEADLINE_EXCEEDED,
        aetcd.rpc.StatusCode.UNKNOWN,
        aetcd.rpc.StatusCode.CANCELLED,
        aetcd.rpc.StatusCode.RESOURCE_EXHAUSTED,
        aetcd.rpc.StatusCode.INTERNAL,
    }
)

UNREADABLE_HOLDER = "(unreadable)"
"""The name of a leader whose key holds no Candidate (written by hand, or garbled)."""


class _NotFound(Exception):
    """etcd answered NOT_FOUND (a lease already gone); only ``resign`` expects it."""


class EtcdStore:
    """The ``CoordinationStore`` of one site on an etcd cluster."""

    def __init__(self, site: str, settings: HaConfig) -> None:
        """Reads the password now (``ConfigError`` naming its file or variable); connects
        on the first request."""
        self.site = site
        self._user = settings.user
        password = resolve_secret("etcd password", settings.password_file, settings.password_env)
        self._timeout_s = settings.request_timeout.total_seconds()
        self._endpoints = list(settings.endpoints)
        self._clients = [
            aetcd.Client(
                host,
                port,
                username=settings.user,
                password=password,
                timeout=self._timeout_s,
                options=GRPC_OPTIONS,
            )
            for host, port in map(endpoint_address, self._endpoints)
        ]
        self._current = 0
        self._prefix = f"/upsguard/{quote(site, safe='')}/"
        self._leader_key = (self._prefix + "leader").encode()

    # -- leadership -------------------------------------------------------------------------

    async def campaign(self, candidate: Candidate, ttl_s: float) -> Term | Leader:
        lease = await self._call("grant a lease", lambda c: c.lease(max(1, round(ttl_s))))
        key, value = self._leader_key, encode(candidate)

        async def attempt(client: Any) -> tuple[bool, list[Any]]:
            tx = client.transactions
            result: tuple[bool, list[Any]] = await client.transaction(
                compare=[tx.create(key) == 0],
                success=[tx.put(key, value, lease=lease.id), tx.get(key)],
                failure=[tx.get(key)],
            )
            return result

        try:
            _, responses = await self._call("campaign for leadership", attempt)
        except BaseException:
            await self._revoke_quietly(lease.id)
            raise
        kv = _only_kv(responses[-1])
        if kv is not None and kv.lease == lease.id:  # won now, or by an attempt that timed out
            return Term(candidate, kv.mod_revision, lease.id, float(lease.ttl))
        await self._revoke_quietly(lease.id)
        holder = self._leader_of(kv)
        if holder is None:  # the key went between the compare and the read: none in one txn
            raise StoreUnavailable("etcd: campaign for leadership: no answer about the leader")
        return holder

    async def renew(self, term: Term) -> float:
        reply = await self._call("renew the lease", lambda c: c.refresh_lease(term.lease))
        ttl = 0 if reply is None else int(reply.TTL)
        if ttl <= 0:
            raise LeadershipLost(f"etcd: the lease of term {term.token} has ended")
        return float(ttl)

    async def resign(self, term: Term) -> None:
        with contextlib.suppress(_NotFound):  # the lease ended already, and took the key along
            await self._call("revoke the lease", lambda c: c.revoke_lease(term.lease))

    async def leader(self) -> Leader | None:
        got = await self._call("read the leader", lambda c: c.get(self._leader_key))
        return self._leader_of(got)

    # -- the shared ledger (fenced writes) ---------------------------------------------------

    async def record_run(self, term: Term, record: RunRecord) -> None:
        key = self._run_key(record.spec.id)
        await self._fenced(
            term, f"record run {record.spec.id}", lambda tx: [tx.put(key, encode(record))]
        )

    async def record_step(self, term: Term, run: RunId, mark: StepMark) -> None:
        key = self._step_key(run, mark.step)
        what = f"record step {mark.step} of run {run} as {mark.state}"
        await self._fenced(term, what, lambda tx: [tx.put(key, encode(mark))])

    async def record_steps(self, term: Term, marks: Sequence[tuple[RunId, StepMark]]) -> None:
        puts = [(self._step_key(run, mark.step), encode(mark)) for run, mark in marks]
        what = f"record {len(marks)} step(s)"
        await self._fenced(term, what, lambda tx: [tx.put(key, value) for key, value in puts])

    async def forget_run(self, term: Term, run: RunId) -> None:
        run_key, steps = self._run_key(run), self._steps_prefix(run)
        await self._fenced(
            term,
            f"forget run {run}",
            lambda tx: [tx.delete(run_key), tx.delete(steps, range_end=_prefix_end(steps))],
        )

    async def declare_alone(self, term: Term, notice: AloneNotice) -> None:
        key = (self._prefix + "alone").encode()
        await self._fenced(
            term, "declare finishing alone", lambda tx: [tx.put(key, encode(notice))]
        )

    async def _fenced(self, term: Term, what: str, ops: Callable[[Any], list[Any]]) -> None:
        key = self._leader_key

        async def attempt(client: Any) -> tuple[bool, list[Any]]:
            tx = client.transactions
            result: tuple[bool, list[Any]] = await client.transaction(
                compare=[tx.mod(key) == term.token], success=ops(tx), failure=[tx.get(key)]
            )
            return result

        applied, responses = await self._call(what, attempt)
        if applied:
            return
        holder = self._leader_of(_only_kv(responses[-1]))
        now = (
            f"{holder.holder.name} leads now (term {holder.token})"
            if holder is not None
            else "nobody leads now (the lease ended)"
        )
        raise LeadershipLost(
            f"etcd: {what}: refused, the term {term.token} of {term.holder.name} is over: {now}",
            leader=holder.holder.name if holder is not None else None,
        )

    # -- reading --------------------------------------------------------------------------

    async def snapshot(self) -> SharedLedger:
        got = await self._call("read the ledger", lambda c: c.get_prefix(self._prefix.encode()))
        return self._ledger(int(got.header.revision), list(got))

    async def wait_for_change(self, after_revision: int, within_s: float) -> bool:
        index = self._current
        client = self._clients[index]
        try:
            async with asyncio.timeout(within_s):
                watch = await client.watch_prefix(
                    self._prefix.encode(), start_revision=after_revision + 1
                )
                try:
                    async for _event in watch:
                        return True
                finally:
                    await watch.cancel()
        except TimeoutError:
            return False
        except aetcd.RevisionCompactedError:
            return True  # what changed is gone from the history: read it all again
        except aetcd.ClientError as exc:
            self._current = (index + 1) % len(self._clients)
            raise StoreUnavailable(
                f"etcd at {self._endpoints[index]}: watching the ledger: {_detail(exc)}"
            ) from exc
        return False

    async def probe(self) -> list[EndpointHealth]:
        return list(await asyncio.gather(*(self._probe(i) for i in range(len(self._clients)))))

    async def _probe(self, index: int) -> EndpointHealth:
        endpoint, client = self._endpoints[index], self._clients[index]
        try:
            async with asyncio.timeout(self._timeout_s * 2):  # status asks twice: it and members
                status = await client.status()
        except (aetcd.ClientError, TimeoutError) as exc:
            return EndpointHealth(endpoint, answered=False, detail=_detail(exc))
        leader_urls = getattr(status.leader, "client_urls", None) or []
        return EndpointHealth(
            endpoint, answered=True, version=str(status.version), is_leader=endpoint in leader_urls
        )

    async def close(self) -> None:
        for client in self._clients:
            with contextlib.suppress(Exception):  # closing never stops the others closing
                await client.close()

    # -- requests, endpoints and errors ----------------------------------------------------

    async def _call(self, what: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """``request`` on the endpoint that answered last, then on each of the others."""
        failures: list[str] = []
        last: BaseException | None = None
        count = len(self._clients)
        for step in range(count):
            index = (self._current + step) % count
            try:
                result = await self._on(index, what, request)
            except (aetcd.ClientError, TimeoutError) as exc:
                failures.append(f"{self._endpoints[index]}: {_detail(exc)}")
                last = exc
                continue
            self._current = index
            return result
        raise StoreUnavailable(
            f"etcd: {what}: no endpoint answered ({'; '.join(failures)})"
        ) from last

    async def _on(self, index: int, what: str, request: Callable[[Any], Awaitable[T]]) -> T:
        """One endpoint: errors of that endpoint alone come out as aetcd's (the caller tries
        the next endpoint); errors no endpoint would answer otherwise come out mapped."""
        client = self._clients[index]
        for fresh_login in (False, True):
            try:
                async with asyncio.timeout(self._timeout_s * 1.5):  # aetcd's own deadline first
                    await self._connect(index)
                    return await request(client)
            except aetcd.ClientError as exc:
                code = _code(exc)
                if code in _ENDPOINT_TROUBLE or isinstance(
                    exc, aetcd.ConnectionFailedError | aetcd.ConnectionTimeoutError
                ):
                    raise
                if code is aetcd.rpc.StatusCode.UNAUTHENTICATED and not fresh_login:
                    await client.close()  # the session token expired: log in again
                    continue
                raise self._refused(index, what, code, exc) from exc
        raise AssertionError("unreachable")

    async def _connect(self, index: int) -> None:
        """Log in (aetcd does so when it connects); a refused login names the user."""
        try:
            await self._clients[index].connect()
        except aetcd.ClientError as exc:
            code = _code(exc)
            if code in (
                aetcd.rpc.StatusCode.INVALID_ARGUMENT,
                aetcd.rpc.StatusCode.FAILED_PRECONDITION,
            ):
                raise AuthenticationError(
                    f"etcd at {self._endpoints[index]}: user '{self._user}' was refused: "
                    f"{_detail(exc)}"
                ) from exc
            raise

    def _refused(self, index: int, what: str, code: Any, exc: aetcd.ClientError) -> Exception:
        where = f"etcd at {self._endpoints[index]}"
        if code is aetcd.rpc.StatusCode.NOT_FOUND:
            return _NotFound(_detail(exc))
        if code is aetcd.rpc.StatusCode.PERMISSION_DENIED:
            return AuthenticationError(
                f"{where}: user '{self._user}' may not {what}: grant it readwrite on the "
                f"prefix {self._prefix}"
            )
        if code in (
            aetcd.rpc.StatusCode.UNAUTHENTICATED,
            aetcd.rpc.StatusCode.INVALID_ARGUMENT,
        ) and (self._user is None):
            return AuthenticationError(
                f"{where}: {what}: refused ({_detail(exc)}): etcd has authentication on; "
                "give ha.user and password_file"
            )
        if code is aetcd.rpc.StatusCode.UNAUTHENTICATED:
            return AuthenticationError(
                f"{where}: user '{self._user}' was logged out: {_detail(exc)}"
            )
        return PermanentError(f"{where}: {what}: {_detail(exc)}")

    async def _revoke_quietly(self, lease: int) -> None:
        """A lease nobody will use: revoked if etcd answers, left to expire otherwise."""
        with contextlib.suppress(Exception):
            await self._call("revoke an unused lease", lambda c: c.revoke_lease(lease))

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
        return SharedLedger(revision, leader, ordered, steps, alone, tuple(unreadable))


def _only_kv(response: Any) -> Any:
    """The key-value of a transaction's get (a list of ``(value, Get)``), or None."""
    return response[0][1] if isinstance(response, list) and response else None


def _prefix_end(prefix: bytes) -> bytes:
    """The end of etcd's range of keys that start with ``prefix`` (its last byte plus one)."""
    return prefix[:-1] + bytes([prefix[-1] + 1])


def _code(exc: BaseException) -> Any:
    """The gRPC status code under an aetcd error (aetcd raises its errors from gRPC's)."""
    cause = exc.__cause__
    return cause.code() if isinstance(cause, aetcd.rpc.AioRpcError) else None


def _detail(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "no answer in time"
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:200]
