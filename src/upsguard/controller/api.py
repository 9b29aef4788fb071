"""The local API: HTTP/1.1 + JSON on a unix socket, for the override CLI and for scripts.

aiohttp reads and writes HTTP; this module adds what a local service needs on top of it:

- the socket is mode 0660, owned by the group the site file names (``service.socket_group``),
  and never open to everybody, not even for a moment;
- who called is taken from the kernel (``SO_PEERCRED``), not from the request, so the audit
  trail cannot be forged by a client;
- nothing a caller sends can cost the service more than a bounded share of it: at most
  ``MAX_CONNECTIONS`` connections and ``MAX_WAITERS`` long-polls, none while the process is
  short of file descriptors (the runbook needs them more), a 64 KiB body, numbers in range,
  reasons of at most 500 printable characters. One request per connection.

    GET  /status                      phase, UPSes, feeds, run, caches
    GET  /history?limit=N             runs with their steps, phases, overrides, cache operations
    GET  /events?after=ID&wait=S      events after ID (waits up to S seconds, 60 at most, for one)
    POST /hold     {"reason"}         POST /release {"reason"}
    POST /trigger  {"direction", "only", "reason"}
    POST /abort    {"reason"}
    POST /poll                        poll the UPSes now (for upsmon's NOTIFYCMD)

The override commands are read, carried out and answered by ``controller.commands``, as
the web page's are. Errors have the statuses ``commands.http_status`` gives them (a
``TemporaryError`` 409, too many long-polls 503, any other ``UpsguardError`` 400, 413 for
a body too large, 408 for one too slow); HTTP that cannot be parsed is 400, an unknown
route 404, a bug 500 (logged); every answer is JSON ``{"error": "one line"}``. A
connection past the ceiling is closed without an answer.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import pwd
import socket
import struct
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from http import HTTPStatus
from pathlib import Path
from typing import Any, Protocol

import msgspec
from aiohttp import web

from upsguard.controller import commands
from upsguard.controller.commands import MAX_NAME, MAX_ROWS, clean_text
from upsguard.controller.descriptors import API_RESERVE, Refused, to_spare
from upsguard.controller.overrides import Overrides
from upsguard.controller.socket_group import group_id
from upsguard.engine.outage_controller import OutageController
from upsguard.errors import ApiBusy, BadRequest, PermanentError, UpsguardError
from upsguard.journal import Journal
from upsguard.journal.rows import EventRow
from upsguard.journal.stream import EventStream
from upsguard.models import Phase
from upsguard.status import SiteStatus

log = logging.getLogger(__name__)

MAX_BODY = 64 * 1024
MAX_CONNECTIONS = 64
MAX_WAITERS = 16  # long-polls; the other connections stay free for status and overrides
MAX_WAIT_S = 60.0
REQUEST_TIMEOUT_S = 10.0  # for a request to arrive, head and body
LAST_ID = 2**63 - 1  # SQLite's largest integer


Route = Callable[["Call"], Awaitable[Any]]


@dataclass(frozen=True)
class Call:
    """One request as a route sees it: the query, the JSON body and the kernel's word on who."""

    name: str
    """The route's name: ``status``, ``hold``, ..."""
    query: Mapping[str, str]
    body: Mapping[str, Any]
    peer: str

    @property
    def who(self) -> str:
        """The kernel's word for the caller, with the user sudo ran for when the client says so."""
        claimed = commands.text_field(self.body, "who", 64)
        if claimed and claimed != self.peer:
            return f"{claimed} (as {self.peer})"
        return self.peer

    def integer(self, name: str, default: int, low: int, high: int) -> int:
        raw = self.query.get(name)
        if raw is None:
            return default
        try:
            value = int(raw)  # refuses "nan", "inf", "1e300" and "1.5" alike
        except ValueError:
            value = low - 1
        if not low <= value <= high:
            raise BadRequest(f"'{name}' must be a whole number from {low} to {high}")
        return value

    def seconds(self, name: str, default: float) -> float:
        raw = self.query.get(name)
        if raw is None:
            return default
        try:
            value = float(raw)
        except ValueError:
            value = math.nan
        if not (math.isfinite(value) and value >= 0):
            raise BadRequest(f"'{name}' must be a number of seconds, 0 or more")
        return value


class Served(Protocol):
    """What the API needs of the running service (``controller.service.Service``); named
    here so that the service may import the API and not the other way round."""

    @property
    def journal(self) -> Journal: ...
    @property
    def stream(self) -> EventStream: ...
    @property
    def overrides(self) -> Overrides: ...
    @property
    def controller(self) -> OutageController: ...
    @property
    def phase(self) -> Phase: ...
    def status(self) -> SiteStatus: ...
    async def poll_now(self) -> None: ...


class ApiServer:
    def __init__(self, svc: Served, path: Path, group: str | None) -> None:
        self.svc = svc
        self.path = path
        self.group = group
        self._runner: web.ServerRunner | None = None
        self._closing = asyncio.Event()
        self._waiting = 0
        self._routes: dict[tuple[str, str], Route] = {
            ("GET", "/status"): self._status,
            ("GET", "/history"): self._history,
            ("GET", "/events"): self._events,
            ("POST", "/poll"): self._poll,
        }
        for command in commands.COMMANDS:
            self._routes[("POST", f"/{command}")] = self._command

    async def start(self) -> None:
        gid = group_id(self.group) if self.group else None
        self._clear_stale()
        server = _BoundedServer(
            self._handle,
            access_log=None,  # what changes something is journaled with its caller instead
            keepalive_timeout=REQUEST_TIMEOUT_S,
        )
        runner = web.ServerRunner(server, shutdown_timeout=2.0)
        await runner.setup()
        old = os.umask(0o117)  # never a moment with the socket open to everybody
        try:
            await web.UnixSite(runner, str(self.path)).start()
        except OSError as exc:
            await runner.cleanup()
            raise PermanentError(f"API socket {self.path}: {exc}") from exc
        finally:
            os.umask(old)
        self._runner = runner
        os.chmod(self.path, 0o660)
        if gid is not None:
            try:
                os.chown(self.path, -1, gid)
            except PermissionError as exc:
                raise PermanentError(
                    f"API socket {self.path}: cannot give it to group '{self.group}' ({exc}): "
                    "run the service as root or as a member of that group"
                ) from exc

    def _clear_stale(self) -> None:
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            raise PermanentError(f"API socket {self.path}: {exc}") from exc
        if not self.path.exists():
            return
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            try:
                probe.connect(str(self.path))
            except OSError:
                self.path.unlink()  # left by a process that died
                return
        raise PermanentError(
            f"API socket {self.path}: another upsguard service answers there; stop it first"
        )

    async def stop(self) -> None:
        self._closing.set()  # long-polls answer now instead of holding the stop up
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -- one request -------------------------------------------------------------------------

    async def _handle(self, request: web.BaseRequest) -> web.StreamResponse:
        status, body = await self._answer(request)
        response = web.json_response(body, status=status, dumps=_dumps)
        response.force_close()
        return response

    async def _answer(self, request: web.BaseRequest) -> tuple[int, Any]:
        route = self._routes.get((request.method, request.path))
        if route is None:
            return 404, {"error": f"no {request.method} {clean_text(request.path, MAX_NAME)}"}
        try:
            body = await _json_body(request) if request.method == "POST" else {}
            call = Call(request.path.lstrip("/"), request.query, body, _peer(request))
            if request.method == "POST":  # a caller who hangs up must not cut an override in half
                return 200, await asyncio.shield(route(call))
            return 200, await route(call)
        except UpsguardError as exc:
            return commands.refusal(exc)
        except Exception as exc:  # a bug in one request must not take the service down
            log.exception("API request %s %s failed", request.method, request.path)
            return 500, {"error": f"internal error: {exc!r}"}

    # -- routes ------------------------------------------------------------------------------

    async def _status(self, call: Call) -> Any:
        return msgspec.to_builtins(self.svc.status())

    async def _history(self, call: Call) -> Any:
        limit = call.integer("limit", 10, 0, MAX_ROWS)
        return msgspec.to_builtins(commands.history(self.svc.journal, limit))

    async def _events(self, call: Call) -> Any:
        after = call.integer("after", -20, -MAX_ROWS, LAST_ID)
        wait = min(call.seconds("wait", 0.0), MAX_WAIT_S)
        rows = self.svc.journal.read.events(after=after)
        if not rows and wait > 0:
            rows = await self._events_to_come(after, wait)
        last = rows[-1].id if rows else max(after, 0)
        return {"events": [r.to_dict() for r in rows], "last": last}

    async def _events_to_come(self, after: int, timeout: float) -> list[EventRow]:
        """The events after ``after`` once the journal has some, or none after ``timeout``
        seconds or when the API stops. Each line the journal adds wakes the wait, and only
        that: an empty answer makes the client ask again at once."""
        if self._waiting >= MAX_WAITERS:
            raise ApiBusy(f"the API has {MAX_WAITERS} long-polls waiting already; try again")
        self._waiting += 1
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        rows: list[EventRow] = []
        try:
            while not rows and await self._next_line(deadline - loop.time()):
                rows = self.svc.journal.read.events(after=after)  # none yet if ``after`` is ahead
        finally:
            self._waiting -= 1
        return rows

    async def _next_line(self, timeout: float) -> bool:
        """Whether the journal added a line within ``timeout`` seconds, the API still running."""
        if timeout <= 0 or self._closing.is_set():
            return False
        line = asyncio.ensure_future(self.svc.stream.next_line())
        closing = asyncio.ensure_future(self._closing.wait())
        try:
            done, _ = await asyncio.wait(
                (line, closing), timeout=timeout, return_when=asyncio.FIRST_COMPLETED
            )
        finally:
            line.cancel()
            closing.cancel()
        return line in done and not self._closing.is_set()

    async def _command(self, call: Call) -> Any:
        """hold, release, trigger or abort, as ``commands`` reads and answers them."""
        request = commands.parse(call.name, call.body, call.who)
        answer = await self.svc.overrides.apply(request)
        return msgspec.to_builtins(answer)

    async def _poll(self, call: Call) -> Any:
        """Poll at once instead of at the next interval: a NOTIFYCMD hook calls this on ONBATT."""
        await self.svc.poll_now()
        return {"phase": self.svc.phase.value}


class _BoundedServer(web.Server):
    """aiohttp's low-level server with a ceiling on open connections.

    The unix server calls it for every connection it accepts, before a byte is read, so the
    ceiling holds however fast connections come: past ``MAX_CONNECTIONS``, or when the process
    has no descriptors to spare, the connection is closed at once. This is why the API uses
    ``web.Server`` rather than a ``web.Application``, whose runner builds a server of its own;
    eight routes need no router beyond ``ApiServer._routes``.
    """

    def __init__(self, handler: Callable[[web.BaseRequest], Awaitable[web.StreamResponse]],
                 **connection_args: Any) -> None:  # fmt: skip
        # A long-poll whose caller hung up stops waiting (the routes that change something
        # are shielded from that, in ApiServer._answer).
        super().__init__(handler, handler_cancellation=True, **connection_args)
        self.connection_args = connection_args
        self.open = 0
        self.warned_at = -math.inf

    def __call__(self) -> web.RequestHandler:
        if self.open >= MAX_CONNECTIONS or not _descriptors_to_spare():
            self._refusing()
            return Refused()  # type: ignore[return-value]  # any asyncio protocol will do
        self.open += 1
        return _Connection(self, loop=asyncio.get_running_loop(), **self.connection_args)

    def connection_lost(
        self, handler: web.RequestHandler, exc: BaseException | None = None
    ) -> None:
        self.open -= 1
        super().connection_lost(handler, exc)

    def _refusing(self) -> None:
        """Say so in the log, once a minute at most: a flood must not flood the log too."""
        now = time.monotonic()
        if now - self.warned_at >= 60.0:
            self.warned_at = now
            log.warning(
                "API: turning connections away (%d open, at most %d; descriptors to spare: %s)",
                self.open,
                MAX_CONNECTIONS,
                "yes" if _descriptors_to_spare() else "no",
            )


class _Connection(web.RequestHandler):
    """aiohttp's handler of one connection, answering HTTP it cannot parse the API's way: one
    JSON line, and no traceback in the service's log for what a client got wrong."""

    def handle_error(
        self,
        request: web.BaseRequest,
        status: int = 500,
        exc: BaseException | None = None,
        message: str | None = None,
    ) -> web.StreamResponse:
        if request.writer.output_size > 0:
            raise ConnectionError("an answer was being sent already")
        lines = (message or "").strip().splitlines()
        reason = clean_text(lines[0].rstrip(":"), MAX_NAME) if lines else HTTPStatus(status).phrase
        if status >= 500:
            log.error("API request failed: %s", reason, exc_info=exc)
            error = f"internal error: {reason}"
        else:
            log.debug("API: bad HTTP from a client: %s", reason)
            error = f"bad HTTP request: {reason}"
        response = web.json_response({"error": error}, status=status)
        response.force_close()
        return response


def _descriptors_to_spare() -> bool:
    """Whether one more connection leaves ``API_RESERVE`` descriptors for the runbook (its
    commands, SSH and HTTPS sessions) under the soft open-file limit."""
    return to_spare(API_RESERVE, 1 / 4)


async def _json_body(request: web.BaseRequest) -> dict[str, Any]:
    if (request.content_length or 0) > MAX_BODY:
        raise BadRequest(f"the body is over {MAX_BODY // 1024} KiB", status=413)
    raw = bytearray()
    try:
        async with asyncio.timeout(REQUEST_TIMEOUT_S):
            async for chunk in request.content.iter_any():
                raw += chunk
                if len(raw) > MAX_BODY:
                    raise BadRequest(f"the body is over {MAX_BODY // 1024} KiB", status=413)
    except TimeoutError:
        raise BadRequest("the body did not arrive in time", status=408) from None
    return commands.json_object(bytes(raw))


def _dumps(value: Any) -> str:
    return json.dumps(value, default=str)


def _peer(request: web.BaseRequest) -> str:
    """The calling user, as the kernel knows it."""
    transport = request.transport
    sock = transport.get_extra_info("socket") if transport is not None else None
    if sock is None:
        return "unknown"
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", raw)
    except (OSError, AttributeError):
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"
