"""The virtual-time loop: asyncio waits cost no wall time and keep their order."""

from __future__ import annotations

import asyncio

import pytest

from upsguard.clock import SimulationStalled, run_virtual


def test_sleeps_and_timeouts_follow_virtual_time() -> None:
    async def main() -> list[tuple[str, float]]:
        loop = asyncio.get_running_loop()
        seen: list[tuple[str, float]] = []

        async def sleeper(name: str, seconds: float) -> None:
            await asyncio.sleep(seconds)
            seen.append((name, loop.time()))

        await asyncio.gather(sleeper("day", 86400), sleeper("minute", 60))
        try:
            async with asyncio.timeout(30):
                await asyncio.sleep(3600)
        except TimeoutError:
            seen.append(("timeout", loop.time()))
        return seen

    assert run_virtual(main()) == [("minute", 60), ("day", 86400), ("timeout", 86430)]


def test_a_stalled_simulation_is_reported() -> None:
    async def main() -> None:
        await asyncio.get_running_loop().create_future()  # nothing will ever set it

    with pytest.raises(SimulationStalled):
        run_virtual(main())
