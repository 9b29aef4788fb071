"""A platform's parallelism limit: ``max_parallel`` targets at a time, first come first served.

``asyncio.Semaphore`` rescans its waiters on every release, which turns
5,000 VMs queued behind a limit of 200 into millions of checks; this queue
hands a freed slot to the oldest waiter in constant time. The executor takes a
free slot without a coroutine (``take_now``) and awaits ``wait_turn`` only when
it must queue: a coroutine per target for nothing is measurable at 5,000.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class Slots:
    def __init__(self, size: int) -> None:
        self._free = max(1, size)
        self._waiters: deque[asyncio.Future[None]] = deque()

    def take_now(self) -> bool:
        """Take a slot if one is free and nobody queues before us."""
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return True
        return False

    async def wait_turn(self) -> None:
        """Queue for a slot; on cancellation the turn passes to the next in line."""
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            raise

    async def __aenter__(self) -> None:
        if not self.take_now():
            await self.wait_turn()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.release()

    def release(self) -> None:
        while self._waiters:
            waiter = self._waiters.popleft()
            if not waiter.done():
                waiter.set_result(None)
                return
        self._free += 1
