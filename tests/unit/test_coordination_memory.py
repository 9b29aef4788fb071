"""The in-memory store's own clockwork, on the virtual loop the outage and pair machines use
(its contract with etcd is ``tests/integration/test_coordination_store.py``'s)."""

from __future__ import annotations

import asyncio
import math
from datetime import UTC, datetime

import pytest

from upsguard.clock import LoopClock, run_virtual
from upsguard.plugins.coordination.memory import MemorySite


@pytest.mark.timeout(30)  # before the fix the wait spun here, the virtual clock stopped
def test_a_lease_that_ends_a_hair_after_now_is_waited_for_not_spun_on() -> None:
    """Found by the pair machine at length: a follower's wait for a change spun at 100% CPU
    for good, the virtual clock stopped. A lease ended a hair after the site clock's now,
    less than the loop's clock can add to its own time (the two clocks differ by the site
    clock's start), so the wait until that end was zero on the loop: the timer fired at
    once, the lease had not ended, and so on. The wait for a lease's end is at least a
    millisecond, and the lease ends then."""

    async def main() -> bool:
        loop = asyncio.get_running_loop()
        await asyncio.sleep(1e6)  # the loop's clock far from the site clock's zero
        site = MemorySite(LoopClock(loop, datetime(2026, 11, 29, tzinfo=UTC)))
        lease = site.grant(math.ulp(0.0))  # ends a hair after now
        site.change(lambda: site.put("leader", b"a", lease))
        return await site.changed_after(site.revision, 5.0)

    assert run_virtual(main()) is True  # the lease ended, its key with it: a change
