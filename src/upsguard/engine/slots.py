"""A platform's parallelism limit: ``max_parallel`` targets at a time, first come first served.

Why not ``asyncio.Semaphore``: in Python 3.11 its release scans the waiters from the
front, and the ones already handed a slot stay there until they run, so 5,000 VMs
queued behind a limit of 32 cost a scan of ~100 waiters per release (measured with
``bench/plan_scale.py``: a tenth of the simulation). This queue hands a freed slot to the
oldest waiter in constant time.
"""

from __future__ import annotations

import asyncio
from collections import deque
from types import TracebackType


class Slots:
    def __init__(self, size: int) -> None:
        self._free = max(1, size)
        self._waiters: deque[asyncio.Future[None]] = deque()

    async def __aenter__(self) -> None:
        if self._free > 0 and not self._waiters:
            self._free -= 1
            return
        waiter: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            if waiter.done() and not waiter.cancelled():
                self.release()  # handed a slot just as it was cancelled: pass it on
            raise

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
