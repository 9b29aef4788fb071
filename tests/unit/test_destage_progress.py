"""A destage as it happens: while a step waits on a dirty cache, its dirty bytes, drain rate
and ETA are told at a bounded rate (``DestageProgress``), in the journal, the simulator's
timeline and the demo alike."""

from __future__ import annotations

import asyncio
import io
import itertools
from datetime import UTC, datetime
from pathlib import Path

from tests.sites import simple_site, site_from
from upsguard.clock import LoopClock, run_virtual
from upsguard.config.caches import SimulatedCacheSettings
from upsguard.config.scenario import parse_scenario
from upsguard.config.site import SiteConfig
from upsguard.engine.destage import PROGRESS_EVERY_S, DestageWatch
from upsguard.events import CacheClean, DestageProgress, Event, describe
from upsguard.models import CacheMode, CacheName
from upsguard.plugins.caches.simulated import SimulatedCache
from upsguard.simulation.demo import run_demo
from upsguard.simulation.simulator import simulate

MiB = 1024 * 1024


def test_two_steps_waiting_on_one_cache_hear_of_it_every_half_minute() -> None:
    events: list[Event] = []

    async def main() -> float:
        clock = LoopClock(asyncio.get_running_loop(), datetime(2026, 1, 1, tzinfo=UTC))
        cache = SimulatedCacheSettings.model_validate(
            {
                "name": "flash",
                "provider": "simulated",
                "dirty": "6000MiB",
                "destage_rate": "20MiB/s",
                "poll_interval": "2s",
            }
        )
        site = SiteConfig.model_validate(
            {"site": "t", "ups": [{"name": "u", "simulated": {}}], "caches": [cache]}
        )
        watch = DestageWatch(site, {cache.name: SimulatedCache(cache, clock)}, clock, events.append)
        await watch.set_mode(CacheMode.WRITE_THROUGH)
        name = CacheName("flash")
        await asyncio.gather(watch.wait_clean([name]), watch.wait_clean([name]))
        return clock.monotonic()

    took = run_virtual(main())
    assert took == 300  # 6000 MiB at 20 MiB/s
    told = [e for e in events if isinstance(e, DestageProgress)]
    gaps = [(b.at - a.at).total_seconds() for a, b in itertools.pairwise(told)]
    assert len(told) == 10 and all(gap == PROGRESS_EVERY_S for gap in gaps)
    assert told[0].rate_bps is None and told[0].eta_s is None  # one reading: no rate yet
    assert describe(told[0]) == "cache flash destaging: 5.9 GiB dirty, rate not measured yet"
    later = told[1:]
    assert all(e.rate_bps == 20 * MiB for e in later)
    dirty = [e.dirty_bytes or 0 for e in later]
    assert dirty == sorted(dirty, reverse=True)
    assert all(e.eta_s == (e.dirty_bytes or 0) / (20 * MiB) for e in later)
    assert (
        describe(later[0]) == "cache flash destaging: 5.3 GiB dirty at 20.0 MiB/s, about 4m30s left"
    )
    clean = [i for i, e in enumerate(events) if isinstance(e, CacheClean)]
    assert len(clean) == 2  # one for each waiting step, and no progress after
    assert all(i < clean[0] for i, e in enumerate(events) if isinstance(e, DestageProgress))


def test_simulate_shows_the_destage_while_the_host_waits(tmp_path: Path) -> None:
    data = simple_site()
    data["caches"] = [{"name": "flash", "provider": "simulated", "carries": ["db"]}]
    site = site_from(tmp_path, data)
    # a destage longer than the guests' shutdown (25m): the host waits for it
    scenario = "outage: {at: 1m}\ncaches: {flash: {dirty: 60GiB, rate: 40MiB/s}}"
    report = simulate(site, parse_scenario(scenario, site))
    lines = [(m.at_s, m.text) for m in report.timeline]
    waiting = next(at for at, text in lines if text.startswith("  waiting  stop:h1"))
    clean = next(at for at, text in lines if text.startswith("cache flash clean"))
    told = [(at, text) for at, text in lines if text.startswith("cache flash destaging: ")]
    assert told and all(waiting <= at < clean for at, _ in told)
    assert len(told) <= (clean - waiting) / PROGRESS_EVERY_S + 1
    assert any(" at 40.0 MiB/s, about " in text for _, text in told)


def test_the_demo_shows_the_destage() -> None:
    out = io.StringIO()
    run_demo(speed=0, out=out)
    assert "cache esx01-flash destaging: " in out.getvalue()
