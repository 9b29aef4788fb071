"""The journal's event stream as it grows: what ``GET /events`` long-polls (and the coming
web page) follow.

Only a line the journal adds to its events table is news to them. The service says much
more than that to itself: a reading every poll, which the journal keeps in its own table
(or not at all). When every message woke the long-polls, an idle service answered each of
them with no events about once a second, and clients asked again at once; so the stream
is its own signal, fed by the journal (``Journal(on_line=...)``), not by the event bus.
"""

from __future__ import annotations

import asyncio

from upsguard.journal.rows import EventRow


class EventStream:
    """Wakes those waiting for the journal's next event line."""

    def __init__(self) -> None:
        self._next = asyncio.Event()
        self.last: EventRow | None = None
        """The line added last, since the service started."""

    def added(self, row: EventRow) -> None:
        """The journal's hook: ``row`` was added to its events table."""
        self.last = row
        self._next.set()
        self._next = asyncio.Event()

    async def next_line(self) -> EventRow:
        """The next line the journal adds (when several come at once, the last of them)."""
        await self._next.wait()
        assert self.last is not None, "a line was added"
        return self.last
