"""Watching caches drain: what the runtime trigger counts for the destage still ahead."""

from __future__ import annotations

import asyncio
from datetime import UTC, datetime

from upsguard.clock import LoopClock, run_virtual
from upsguard.config.caches import SimulatedCacheSettings
from upsguard.config.site import SiteConfig
from upsguard.engine.destage import DestageWatch
from upsguard.errors import TemporaryError
from upsguard.events import CacheClean, Event, RiskAccepted
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget, Fact
from upsguard.plugins.caches.simulated import SimulatedCache


def test_dirty_data_of_unknown_drain_rate_counts_as_its_destage_timeout() -> None:
    """Until two readings give a rate, the runtime trigger must not count the destage as
    nothing: it counts the cache's destage_timeout, or its worst_case_rate when given."""

    async def eta(**settings: object) -> float | None:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        cache = SimulatedCacheSettings.model_validate(
            {"name": "flash", "provider": "simulated", "dirty": "1GiB", **settings}
        )
        site = SiteConfig.model_validate(
            {"site": "t", "ups": [{"name": "u", "simulated": {}}], "caches": [cache]}
        )
        watch = DestageWatch(site, {cache.name: SimulatedCache(cache, clock)}, clock, print)
        await watch.poll()  # one reading: dirty known, rate not yet
        return watch.eta_s()

    assert run_virtual(eta(destage_timeout="7m")) == 420.0
    assert run_virtual(eta(worst_case_rate="16MiB/s")) == 64.0


def test_the_drain_rate_counts_from_the_flip_not_from_the_write_back_before_it() -> None:
    """Readings taken while the cache was still write-back (nothing drains) must not dilute
    the rate measured after the flip, or the ETA is over-estimated and the shutdown fires
    too early."""

    async def rate() -> float | None:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        cache = SimulatedCacheSettings.model_validate(
            {"name": "flash", "provider": "simulated", "dirty": "6GiB", "destage_rate": "100MiB/s"}
        )
        site = SiteConfig.model_validate(
            {"site": "t", "ups": [{"name": "u", "simulated": {}}], "caches": [cache]}
        )
        watch = DestageWatch(site, {cache.name: SimulatedCache(cache, clock)}, clock, print)
        for _ in range(4):  # a minute of write-back: nothing drains
            await watch.poll()
            await asyncio.sleep(15)
        await watch.set_mode(CacheMode.WRITE_THROUGH)
        for _ in range(2):
            await asyncio.sleep(5)
            await watch.poll()
        (status,) = watch.status.values()
        return status.rate_bps

    assert run_virtual(rate()) == 100 * 1024 * 1024


def clean_cache() -> tuple[DestageWatch, SimulatedCache]:
    """A watch over one clean simulated cache, on the running loop's virtual clock."""
    clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
    cache = SimulatedCacheSettings.model_validate(
        {"name": "flash", "provider": "simulated", "dirty": "0"}
    )
    site = SiteConfig.model_validate(
        {"site": "t", "ups": [{"name": "u", "simulated": {}}], "caches": [cache]}
    )
    sim = SimulatedCache(cache, clock)
    return DestageWatch(site, {cache.name: sim}, clock, lambda e: None), sim


def test_a_short_outage_puts_the_cache_back_at_once() -> None:
    """The pause between asks is for a cache that refused a mode: a restore two seconds
    after a flip that worked waited 30 s (the bench of the reaction saw the site stay in
    write-through past its return)."""

    async def modes() -> tuple[CacheMode, CacheMode]:
        watch, sim = clean_cache()
        await watch.poll()
        await watch.write_through()
        during = sim.mode
        await asyncio.sleep(2)
        await watch.restore()
        return during, sim.mode

    assert run_virtual(modes()) == (CacheMode.WRITE_THROUGH, CacheMode.WRITE_BACK)


def test_the_second_outage_owes_the_cache_back_too() -> None:
    """After a restore on mains (where caches are not read) the last reading still said
    write-through: the next outage's flip was not owed, and the cache stayed in
    write-through after it."""

    async def mode_after_two_outages() -> CacheMode:
        watch, sim = clean_cache()
        for _ in range(2):
            await watch.write_through()
            await watch.poll()  # read on battery: write-through
            await asyncio.sleep(2)
            await watch.restore()  # on mains: not read
        return sim.mode

    assert run_virtual(mode_after_two_outages()) == CacheMode.WRITE_BACK


class UnreachableCache:
    """A cache whose host does not answer: neither its targets nor a reading can be had."""

    def __init__(self, name: str) -> None:
        self.name = CacheName(name)

    async def targets(self) -> list[CacheTarget]:
        raise TemporaryError(f"cache {self.name}: cannot connect to nas01: no answer")

    async def read(self, target: CacheTarget) -> CacheState:
        raise TemporaryError(f"cache {self.name}: cannot connect to nas01: no answer")

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        raise TemporaryError(f"cache {self.name}: cannot connect to nas01: no answer")

    async def flush(self, target: CacheTarget) -> None:
        return None

    async def close(self) -> None:
        return None


def unreachable_cache_watch(events: list[Event], clock: LoopClock) -> DestageWatch:
    cache = SimulatedCacheSettings.model_validate(
        {"name": "nas01-ssd", "provider": "simulated", "destage_timeout": "10m"}
    )
    site = SiteConfig.model_validate(
        {"site": "t", "ups": [{"name": "u", "simulated": {}}], "caches": [cache]}
    )
    return DestageWatch(site, {cache.name: UnreachableCache("nas01-ssd")}, clock, events.append)


def test_a_cache_that_cannot_be_read_is_never_clean() -> None:
    """Its targets could not be listed: ``all(...)`` over no statuses said clean at once, and
    the host steps behind it went ahead with no RiskAccepted (``cache wait`` printed
    ``0/0 clean`` and exit 0 while ``cache status`` said ``cannot connect``). Unknown waits,
    and only the critical floor lets go of it, as the risk it is."""
    events: list[Event] = []
    floor_at = 90.0

    async def wait() -> tuple[bool, float, Fact]:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        watch = unreachable_cache_watch(events, clock)
        name = CacheName("nas01-ssd")
        clean = await watch.wait_clean([name], floor=lambda: clock.monotonic() >= floor_at)
        return clean, clock.monotonic(), watch.clean(name)

    clean, at, fact = run_virtual(wait())
    assert clean is False and at >= floor_at
    assert not fact.known and "cannot connect" in fact.why
    assert not [e for e in events if isinstance(e, CacheClean)]
    (risk,) = [e for e in events if isinstance(e, RiskAccepted)]
    assert risk.cache == "nas01-ssd" and "could not be read" in risk.why
