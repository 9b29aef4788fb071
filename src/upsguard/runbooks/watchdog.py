"""One watchdog for every platform request of a run, instead of one timer per request.

A request that hangs must not hold its step forever: after its allowance it is
abandoned and retried. ``asyncio.timeout`` would put one timer per request in the
loop's heap (5,000 VMs stopping at once: 5,000 timers, each costing a heap push and
a cancel); here requests register in a dict and one timer, ticking a quarter of the
allowance apart while any request is open, cancels the ones past their deadline.
A request so gets between 1 and 1.25 times its allowance.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from upsguard.config.types import format_duration
from upsguard.errors import TemporaryError

T = TypeVar("T")


class RequestTimedOut(TemporaryError):
    """The platform did not answer one request in time; the request may be repeated."""


class RequestWatchdog:
    def __init__(self, allowance_s: float) -> None:
        self.allowance_s = allowance_s
        self._open: dict[object, tuple[asyncio.Task[object], float]] = {}
        self._expired: set[object] = set()
        self._tick: asyncio.TimerHandle | None = None

    async def request(self, awaitable: Awaitable[T]) -> T:
        """Await ``awaitable``; past the allowance, raise ``RequestTimedOut`` instead."""
        task = asyncio.current_task()
        if task is None:  # pragma: no cover - always called from a task
            return await awaitable
        loop = asyncio.get_running_loop()
        token = object()
        cancelling = task.cancelling()
        self._open[token] = (task, loop.time() + self.allowance_s)
        if self._tick is None:
            self._tick = loop.call_later(self.allowance_s / 4, self._check)
        try:
            return await awaitable
        except asyncio.CancelledError:
            if token in self._expired and task.uncancel() <= cancelling:
                raise RequestTimedOut(
                    f"no answer within {format_duration(self.allowance_s)}"
                ) from None
            raise
        finally:
            del self._open[token]
            self._expired.discard(token)

    def _check(self) -> None:
        self._tick = None
        if not self._open:
            return
        loop = asyncio.get_running_loop()
        now = loop.time()
        for token, (task, deadline) in self._open.items():
            if deadline <= now and token not in self._expired:
                self._expired.add(token)
                task.cancel()
        self._tick = loop.call_later(self.allowance_s / 4, self._check)
