"""Platform requests of a run: asked again when they fail for a while or hang.

A request that hangs must not hold its step forever: after its allowance it is
abandoned and retried. ``asyncio.timeout`` would put one timer per request in the
loop's heap (5,000 VMs stopping at once: 5,000 timers, each costing a heap push and
a cancel); here requests register in a dict and one timer, ticking a quarter of the
allowance apart while any request is open, cancels the ones past their deadline.
A request so gets between 1 and 1.25 times its allowance.

The retry loop lives here too, in the same coroutine as the deadline, because
every step makes a few requests and a coroutine layer per request is measurable
when 5,000 steps run in a simulation.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TypeVar

from upsguard.config.types import format_duration
from upsguard.errors import TemporaryError

T = TypeVar("T")

MAX_BACKOFF_S = 30.0


class RequestTimedOut(TemporaryError):
    """The platform did not answer one request in time; the request may be repeated."""


class RequestWatchdog:
    def __init__(self, allowance_s: float) -> None:
        self.allowance_s = allowance_s
        self._open: dict[object, tuple[asyncio.Task[object], float]] = {}
        self._expired: set[object] = set()
        self._tick: asyncio.TimerHandle | None = None

    async def ask(self, call: Callable[[], Awaitable[T]], retries: int) -> T:
        """``call()``, again (with a growing pause) after a temporary error or no answer
        within the allowance, up to ``retries`` more times; then the last error."""
        task = asyncio.current_task()
        assert task is not None, "platform requests are made from a step's task"
        attempt = 0
        while True:
            attempt += 1
            token = self._register(task)
            cancelling = task.cancelling()
            try:
                return await call()
            except asyncio.CancelledError:
                if token not in self._expired or task.uncancel() > cancelling:
                    raise
                error: TemporaryError = RequestTimedOut(
                    f"no answer within {format_duration(self.allowance_s)}"
                )
            except TemporaryError as exc:
                error = exc
            finally:
                del self._open[token]
                self._expired.discard(token)
            if attempt > retries:
                raise error
            await asyncio.sleep(min(error.retry_after * attempt, MAX_BACKOFF_S))

    def _register(self, task: asyncio.Task[object]) -> object:
        loop = task.get_loop()
        token = object()
        self._open[token] = (task, loop.time() + self.allowance_s)
        if self._tick is None:
            self._tick = loop.call_later(self.allowance_s / 4, self._check)
        return token

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
