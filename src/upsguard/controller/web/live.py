"""The live part of the page: one status per change, pushed to every browser by server-sent
events.

The service wakes the feed at each event (a poll's readings, a step, a phase); the feed
builds the status once, at most every ``MIN_INTERVAL_S`` however many events come, and at
least every ``REFRESH_S`` so the data age shown stays true. Every browser is sent the
same encoded bytes: fifty browsers cost fifty socket writes, not fifty status builds.
With no browser connected nothing is built at all. New journal events go along as
``journal`` messages, so the events page grows without asking.

Browsers reconnect by themselves (``EventSource``); a browser that falls behind skips to
the newest status (a status replaces the one before, nothing is lost) and is told to
fetch the events it missed.

Streams are shared out (``StreamLimits``): a few per user, and some kept for operators, so
that no viewer (nor a script with a viewer's login) can take the one an operator needs
during an outage. Each stream checks its session again at each status it is sent: the
stream of a session logged out of, expired, or of a user taken out of the site file ends
there (its browser's reconnection then finds the login page).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass

import msgspec
from aiohttp import web

from upsguard.controller.web.auth import User
from upsguard.controller.web.context import current_user
from upsguard.journal.rows import EventRow
from upsguard.status import SiteStatus

log = logging.getLogger(__name__)

MIN_INTERVAL_S = 0.25
REFRESH_S = 5.0
KEEPALIVE_S = 15.0
MAX_CLIENTS = 192  # of the listener's 256 connections: the rest stay for logins and acts
STREAMS_PER_USER = 16
"""A person's tabs, phones and wall screens; a group login shares them."""
KEPT_FOR_OPERATORS = 32
KEPT_EVENTS = 256
RETRY_MS = 2000


def message(kind: str, data: str) -> bytes:
    return f"event: {kind}\ndata: {data}\n\n".encode()


@dataclass(frozen=True, slots=True)
class StreamLimits:
    """How the live streams are shared out."""

    total: int = MAX_CLIENTS
    per_user: int = STREAMS_PER_USER
    kept_for_operators: int = KEPT_FOR_OPERATORS
    """Of ``total``: viewers never hold these."""


STREAM_LIMITS = StreamLimits()

Asker = Callable[[web.Request], User | None]
"""Who a request's credentials name now (None: nobody any more)."""


class LiveFeed:
    def __init__(
        self,
        status: Callable[[], SiteStatus],
        events_after: Callable[[int], list[EventRow]],
        changed: Callable[[], asyncio.Event],
        on_clients: Callable[[int], None] = lambda n: None,
        asker: Asker = lambda request: None,
        limits: StreamLimits = STREAM_LIMITS,
    ) -> None:
        """``changed``: the service's event of the next change (set once, then replaced);
        ``asker``: who a stream's request names now, checked at each status sent."""
        self._status = status
        self._asker = asker
        self._limits = limits
        self._by_user: Counter[str] = Counter()
        self._viewers = 0
        self._events_after = events_after
        self._changed = changed
        self._on_clients = on_clients
        self.version = 0
        self.clients = 0
        self._status_chunk = b""
        self._events: deque[tuple[int, bytes]] = deque(maxlen=KEPT_EVENTS)
        self._last_event: int | None = None
        self._dropped_upto = 0
        self._built_at = float("-inf")
        self._published = asyncio.Event()
        self._watched = asyncio.Event()
        self._closing = asyncio.Event()
        self.builds = 0

    # -- the one builder ---------------------------------------------------------------

    async def run(self) -> None:
        """Build and publish while anyone watches; until cancelled."""
        loop = asyncio.get_running_loop()
        while True:
            if self.clients == 0:
                self._watched.clear()
                await self._watched.wait()
            change = self._changed()
            started = loop.time()
            self.publish()
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(REFRESH_S):
                    await change.wait()
            await asyncio.sleep(max(0.0, started + MIN_INTERVAL_S - loop.time()))

    def publish(self) -> None:
        """Build the status now and hand it (and new journal events) to every browser."""
        try:
            status = self._status()
        except Exception:  # a bug in a status field must not end the live page
            log.exception("web: building the status failed")
            return
        self.builds += 1
        self._built_at = asyncio.get_running_loop().time()
        self.version += 1
        self._status_chunk = message("status", msgspec.json.encode(status).decode())
        self._collect_events()
        self._published.set()
        self._published = asyncio.Event()

    def _collect_events(self) -> None:
        if self._last_event is None:  # browsers load the past themselves; from here on, live
            rows = self._events_after(-1)
            self._last_event = rows[-1].id if rows else 0
            return
        for row in self._events_after(self._last_event):
            if len(self._events) == KEPT_EVENTS:
                self._dropped_upto = self._events[0][0]
            self._events.append((self.version, message("journal", json.dumps(row.to_dict()))))
            self._last_event = row.id

    def close(self) -> None:
        self._closing.set()

    # -- one browser -------------------------------------------------------------------

    async def stream(self, request: web.Request) -> web.StreamResponse:
        user = current_user(request)
        self._admit(user)
        response = web.StreamResponse(
            headers={
                "Content-Type": "text/event-stream",
                "Cache-Control": "no-store",
                "X-Accel-Buffering": "no",  # nginx: pass each message on at once
            }
        )
        await response.prepare(request)
        self._joined(+1, user)
        try:
            if asyncio.get_running_loop().time() - self._built_at > MIN_INTERVAL_S:
                self.publish()  # a browser arriving at an idle feed gets today's status
            await response.write(f"retry: {RETRY_MS}\n\n".encode() + self._status_chunk)
            await self._follow(response, self.version, lambda: self._still(request, user))
        except (ConnectionResetError, ConnectionError):
            pass  # the browser went away; it reconnects by itself if it wants to
        finally:
            self._joined(-1, user)
        return response

    def _admit(self, user: User) -> None:
        """Room for one more stream of ``user``; else 429 (theirs are many) or 503."""
        limits = self._limits
        if self._by_user[user.name] >= limits.per_user:
            raise web.HTTPTooManyRequests(
                text=f"{user.name} has {limits.per_user} live pages open already: close one"
            )
        if self.clients >= limits.total:
            raise web.HTTPServiceUnavailable(text=f"{limits.total} live pages are open already")
        if not user.may_act and self._viewers >= limits.total - limits.kept_for_operators:
            raise web.HTTPServiceUnavailable(
                text="the live pages left are kept for operators: try again later"
            )

    def _still(self, request: web.Request, user: User) -> bool:
        """Whether the stream's session still names its user (not logged out, expired, or
        taken out of the site file)."""
        now = self._asker(request)
        return now is not None and now.name == user.name

    async def _follow(
        self, response: web.StreamResponse, seen: int, still: Callable[[], bool]
    ) -> None:
        while not self._closing.is_set():
            published = self._published
            if self.version == seen:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(KEEPALIVE_S):
                        await _first(published.wait(), self._closing.wait())
            if not still():
                return  # the session is over: so is its stream
            if self.version == seen:
                await response.write(b": keep-alive\n\n")
                continue
            if self._dropped_upto > seen:  # it fell behind the events kept: it fetches them
                await response.write(message("resync", "{}"))
            fresh = [chunk for version, chunk in self._events if version > seen]
            seen = self.version
            await response.write(b"".join([*fresh, self._status_chunk]))

    def _joined(self, delta: int, user: User) -> None:
        self.clients += delta
        self._by_user[user.name] += delta
        if self._by_user[user.name] <= 0:
            del self._by_user[user.name]
        if not user.may_act:
            self._viewers += delta
        if self.clients > 0:
            self._watched.set()
        self._on_clients(self.clients)


async def _first(*waits: object) -> None:
    tasks = [asyncio.ensure_future(w) for w in waits]  # type: ignore[call-overload]
    try:
        await asyncio.wait(tasks, return_when=asyncio.FIRST_COMPLETED)
    finally:
        for task in tasks:
            task.cancel()
