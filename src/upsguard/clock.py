"""Injected time, so the simulator's virtual clock drives the same code as the real one.

All waiting in upsguard goes through asyncio (``asyncio.sleep``,
``asyncio.timeout``); under ``VirtualTimeLoop`` those waits cost no wall time:
when nothing is ready to run, the loop jumps its clock to the next timer.
``Clock.now()`` is the wall-clock reading that matches the loop's time.
"""

from __future__ import annotations

import asyncio
import selectors
from collections.abc import Coroutine
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol, TypeVar

T = TypeVar("T")


class Clock(Protocol):
    def now(self) -> datetime:
        """The current UTC time."""
        ...

    def monotonic(self) -> float:
        """Seconds on the running event loop's clock."""
        ...


class SystemClock:
    """The real clock of the machine."""

    def now(self) -> datetime:
        return datetime.now(UTC)

    def monotonic(self) -> float:
        return asyncio.get_running_loop().time()


class LoopClock:
    """Wall time derived from a loop's clock: ``origin`` plus loop seconds since start."""

    def __init__(self, loop: asyncio.AbstractEventLoop, origin: datetime) -> None:
        self._loop = loop
        self._origin = origin
        self._start = loop.time()
        self._last: tuple[float, datetime] = (self._start, origin)

    def now(self) -> datetime:
        """Worked out once per loop instant: under virtual time thousands of steps share one."""
        at = self._loop.time()
        if at != self._last[0]:
            self._last = (at, self._origin + timedelta(seconds=at - self._start))
        return self._last[1]

    def monotonic(self) -> float:
        return self._loop.time() - self._start

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        """The loop whose time this clock tells (what a simulated world schedules on)."""
        return self._loop

    def seconds_since_start(self) -> float:
        return self._loop.time() - self._start


class SimulationStalled(RuntimeError):
    """Every task waits on something no timer will ever wake: a bug, not a user error."""


class _VirtualSelector(selectors.DefaultSelector):
    """A selector that never blocks: a wait of N seconds advances virtual time by N.

    With nothing registered but the loop's wake-up pipe it asks the kernel nothing:
    what that pipe announces (a callback from another thread) is already in the
    loop's ready queue, and a simulation turns the loop over thousands of times.
    """

    def __init__(self, loop: VirtualTimeLoop) -> None:
        super().__init__()
        self._vloop = loop

    def select(self, timeout: float | None = None) -> list[tuple[selectors.SelectorKey, int]]:
        if len(self.get_map()) > 1 or timeout is None:  # more than the loop's own wake-up pipe
            ready = super().select(0)
            if ready:
                return ready
        if timeout is None:
            raise SimulationStalled("simulation stalled: no task can make progress")
        self._vloop.advance(timeout)
        return []


class VirtualTimeLoop(asyncio.SelectorEventLoop):
    """An event loop whose clock moves only when every task waits on a timer."""

    def __init__(self) -> None:
        self._virtual_now = 0.0
        super().__init__(selector=_VirtualSelector(self))

    def time(self) -> float:
        return self._virtual_now

    def advance(self, seconds: float) -> None:
        if seconds > 0:
            self._virtual_now += seconds


def run_virtual(coro: Coroutine[Any, Any, T]) -> T:
    """Run a coroutine on a fresh virtual-time loop and close it after.

    The result travels outside the task: when the runner restores Ctrl-C
    handling it formats the finished task, result included, and a simulation
    report of 5,000 steps takes a quarter of a second to format.
    """
    box: list[T] = []

    async def keep() -> None:
        box.append(await coro)

    with asyncio.Runner(loop_factory=VirtualTimeLoop) as runner:
        runner.run(keep())
    return box[0]
