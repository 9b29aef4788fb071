"""The local API: HTTP/1.1 + JSON on a unix socket, for the override CLI and for scripts.

The socket is mode 0660, owned by the group the site file names
(``service.socket_group``); who called is taken from the kernel
(``SO_PEERCRED``), not from the request, so the audit trail cannot be
forged by a client. One request per connection; bodies are small JSON.

    GET  /status                      phase, UPSes, feeds, run, caches
    GET  /history?limit=N             runs with their steps, phases, overrides, cache operations
    GET  /events?after=ID&wait=S      events after ID (waits up to S seconds for one)
    POST /hold     {"reason"}         POST /release {"reason"}
    POST /trigger  {"direction", "only", "reason"}
    POST /abort    {"reason"}
    POST /poll                        poll the UPSes now (for upsmon's NOTIFYCMD)
"""

from __future__ import annotations

import asyncio
import contextlib
import grp
import json
import logging
import os
import pwd
import socket
import struct
from collections.abc import Awaitable, Callable
from http import HTTPStatus
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from upsguard.errors import PermanentError, TemporaryError, UpsguardError

if TYPE_CHECKING:
    from upsguard.controller.service import Service

log = logging.getLogger(__name__)
MAX_BODY = 64 * 1024
READ_TIMEOUT_S = 10.0
MAX_WAIT_S = 60.0


class BadRequest(PermanentError):
    pass


Handler = Callable[["Request"], Awaitable[Any]]


class Request:
    def __init__(self, method: str, target: str, body: dict[str, Any], peer: str) -> None:
        self.method = method
        parts = urlsplit(target)
        self.path = parts.path
        self.query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        self.body = body
        self.peer = peer

    @property
    def who(self) -> str:
        """The kernel's word for the caller, with the user sudo ran for when the client says so."""
        claimed = str(self.body.get("who") or "")
        if claimed and claimed != self.peer:
            return f"{claimed} (as {self.peer})"
        return self.peer

    def number(self, name: str, default: float) -> float:
        try:
            return float(self.query.get(name, default))
        except ValueError:
            raise BadRequest(f"'{name}' must be a number") from None


class ApiServer:
    def __init__(self, svc: Service, path: Path, group: str | None) -> None:
        self.svc = svc
        self.path = path
        self.group = group
        self._server: asyncio.AbstractServer | None = None
        self._routes: dict[tuple[str, str], Handler] = {
            ("GET", "/status"): self._status,
            ("GET", "/history"): self._history,
            ("GET", "/events"): self._events,
            ("POST", "/hold"): self._hold,
            ("POST", "/release"): self._release,
            ("POST", "/trigger"): self._trigger,
            ("POST", "/abort"): self._abort,
            ("POST", "/poll"): self._poll,
        }

    async def start(self) -> None:
        gid = _group_id(self.group) if self.group else None
        self._clear_stale()
        old = os.umask(0o117)  # never a moment with the socket open to everybody
        try:
            self._server = await asyncio.start_unix_server(self._handle, path=str(self.path))
        except OSError as exc:
            raise PermanentError(f"API socket {self.path}: {exc}") from exc
        finally:
            os.umask(old)
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
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(Exception):
                await asyncio.wait_for(self._server.wait_closed(), 2.0)
            self._server = None
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()

    # -- one connection --------------------------------------------------------------------

    async def _handle(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, body = await self._answer(reader, writer)
            _respond(writer, status, body)
            await writer.drain()
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()

    async def _answer(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter
    ) -> tuple[HTTPStatus, Any]:
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                request = await _read_request(reader, _peer(writer))
            route = self._routes.get((request.method, request.path))
            if route is None:
                return HTTPStatus.NOT_FOUND, {"error": f"no {request.method} {request.path}"}
            return HTTPStatus.OK, await route(request)
        except TimeoutError:
            return HTTPStatus.REQUEST_TIMEOUT, {"error": "request not read in time"}
        except TemporaryError as exc:
            return HTTPStatus.CONFLICT, {"error": str(exc)}
        except UpsguardError as exc:
            return HTTPStatus.BAD_REQUEST, {"error": str(exc)}
        except Exception as exc:  # a bug in one request must not take the service down
            log.exception("API request failed")
            return HTTPStatus.INTERNAL_SERVER_ERROR, {"error": f"internal error: {exc!r}"}

    # -- routes ------------------------------------------------------------------------------

    async def _status(self, req: Request) -> Any:
        return self.svc.status()

    async def _history(self, req: Request) -> Any:
        limit = int(req.number("limit", 10))
        journal = self.svc.journal
        return {
            "runs": [r.to_dict() for r in journal.runs(limit=limit)],
            "phases": [p.to_dict() for p in journal.phases(limit=limit * 5)],
            "overrides": [o.to_dict() for o in journal.overrides(limit=limit * 5)],
            "cache_ops": [c.to_dict() for c in journal.cache_ops(limit=limit * 5)],
        }

    async def _events(self, req: Request) -> Any:
        after = int(req.number("after", -20))
        wait = min(req.number("wait", 0), MAX_WAIT_S)
        rows = self.svc.journal.events(after=after)
        if not rows and wait > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.svc.changed.wait(), wait)
            rows = self.svc.journal.events(after=after)
        last = rows[-1].id if rows else max(after, 0)
        return {"events": [r.to_dict() for r in rows], "last": last}

    async def _hold(self, req: Request) -> Any:
        return self.svc.overrides.hold(req.who, str(req.body.get("reason") or ""))

    async def _release(self, req: Request) -> Any:
        return self.svc.overrides.release(req.who, str(req.body.get("reason") or ""))

    async def _trigger(self, req: Request) -> Any:
        only = req.body.get("only") or []
        if not isinstance(only, list):
            raise BadRequest("'only' must be a list of resource ids")
        return await self.svc.overrides.trigger(
            req.who,
            str(req.body.get("direction") or ""),
            [str(o) for o in only],
            str(req.body.get("reason") or ""),
        )

    async def _poll(self, req: Request) -> Any:
        """Poll at once instead of at the next interval: a NOTIFYCMD hook calls this on ONBATT."""
        await self.svc.poll_now()
        return {"phase": self.svc.controller.engine.phase.value}

    async def _abort(self, req: Request) -> Any:
        return await self.svc.overrides.abort(req.who, str(req.body.get("reason") or ""))


async def _read_request(reader: asyncio.StreamReader, peer: str) -> Request:
    head = await reader.readuntil(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    try:
        method, target, _ = lines[0].split(" ", 2)
    except ValueError:
        raise BadRequest("malformed request line") from None
    headers = {}
    for line in lines[1:]:
        name, sep, value = line.partition(":")
        if sep:
            headers[name.strip().lower()] = value.strip()
    length = int(headers.get("content-length", "0") or 0)
    if length > MAX_BODY:
        raise BadRequest("request body too large")
    body: dict[str, Any] = {}
    if length:
        raw = await reader.readexactly(length)
        try:
            parsed = json.loads(raw)
        except ValueError:
            raise BadRequest("the body is not JSON") from None
        if not isinstance(parsed, dict):
            raise BadRequest("the body must be a JSON object")
        body = parsed
    return Request(method.upper(), target, body, peer)


def _respond(writer: asyncio.StreamWriter, status: HTTPStatus, body: Any) -> None:
    data = json.dumps(body, default=str).encode()
    head = (
        f"HTTP/1.1 {status.value} {status.phrase}\r\n"
        "Content-Type: application/json\r\n"
        f"Content-Length: {len(data)}\r\n"
        "Connection: close\r\n\r\n"
    )
    writer.write(head.encode() + data)


def _peer(writer: asyncio.StreamWriter) -> str:
    """The calling user, as the kernel knows it."""
    sock = writer.get_extra_info("socket")
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        _, uid, _ = struct.unpack("3i", raw)
    except (OSError, AttributeError):
        return "unknown"
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return f"uid {uid}"


def _group_id(name: str) -> int:
    try:
        return grp.getgrnam(name).gr_gid
    except KeyError:
        raise PermanentError(
            f"service.socket_group: no group named '{name}': create it (groupadd {name}) "
            "or change the site file"
        ) from None
