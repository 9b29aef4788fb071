"""UpsWatch on virtual time: blips, self-tests, stale and lost links, observed discharge.

The source here is a scripted stand-in for a UpsSource (readings and errors in a list):
the real sources are tested against upsd and snmpsim in tests/integration.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from datetime import UTC, datetime
from typing import Any, TypeVar

import pytest

from upsguard.clock import LoopClock, run_virtual
from upsguard.config.site import FeedConfig
from upsguard.errors import AuthenticationError, UpsUnreachable
from upsguard.models import LinkState, UpsFlag, UpsName, UpsReading
from upsguard.policies.power import LostContact, read_feed
from upsguard.policies.watch import UpsWatch

T = TypeVar("T")
ORIGIN = datetime(2026, 1, 1, tzinfo=UTC)
UPS = UpsName("ups-a")
Step = Callable[[datetime], UpsReading]


def ok(*flags: str, charge: float = 100.0, runtime: float = 1800.0, volts: float = 230.0) -> Step:
    return lambda at: UpsReading(
        ups=UPS,
        at=at,
        flags=frozenset(UpsFlag(f) for f in flags),
        charge_pct=charge,
        runtime_s=runtime,
        input_voltage=volts,
    )


def stale() -> Step:
    return lambda at: UpsReading(ups=UPS, at=at, link=LinkState.STALE, raw={"nut.error": "X"})


class ScriptedSource:
    """Plays ``steps`` in order: a reading factory, or an exception to raise."""

    def __init__(self, clock: LoopClock, steps: list[Step | Exception]) -> None:
        self.name = UPS
        self._clock = clock
        self._steps = list(steps)

    async def read(self) -> UpsReading:
        step = self._steps.pop(0)
        if isinstance(step, Exception):
            raise step
        return step(self._clock.now())

    async def command(self, name: str) -> None:
        raise NotImplementedError

    async def watch_for_changes(self, news: Callable[[], None]) -> None:
        return None  # no push channel, as a source without traps

    async def close(self) -> None:
        return None


def play(
    steps: list[Step | Exception],
    every_s: float = 5.0,
    lost_contact: LostContact = "alert",
    **watch_args: Any,
) -> tuple[UpsWatch, list[UpsReading], list[Any]]:
    """Poll the whole script every ``every_s`` virtual seconds; readings and feed views."""

    async def scenario() -> tuple[UpsWatch, list[UpsReading], list[Any]]:
        clock = LoopClock(asyncio.get_running_loop(), ORIGIN)
        watch = UpsWatch(ScriptedSource(clock, steps), clock, **watch_args)
        readings, feeds = [], []
        feed = FeedConfig(ups=[UPS])
        for _ in range(len(steps)):
            readings.append(await watch.poll())
            feeds.append(read_feed("f", feed, {UPS: watch.figures()}, lost_contact))
            await asyncio.sleep(every_s)
        return watch, readings, feeds

    return run(scenario())


def run(coro: Coroutine[Any, Any, T]) -> T:
    return run_virtual(coro)


def lost() -> UpsUnreachable:
    return UpsUnreachable("upsd 127.0.0.1:3493 cannot be reached")


def test_short_link_blip_on_mains_is_not_an_outage() -> None:
    _, readings, feeds = play([ok("OL"), lost(), lost(), ok("OL")], every_s=4.0)
    assert [r.link for r in readings] == [
        LinkState.OK,
        LinkState.LOST,
        LinkState.LOST,
        LinkState.OK,
    ]
    assert not any(r.on_line for r in readings[1:3])  # never *read* as on line
    assert [f.at_risk for f in feeds] == [False, False, False, False]
    assert [f.held for f in feeds] == [0, 1, 1, 0]
    assert [f.members for f in feeds][1] == ("held",)


def test_long_link_loss_on_mains_is_an_alert_by_default() -> None:
    _, readings, feeds = play([ok("OL")] + [lost()] * 5, every_s=5.0, link_grace_s=15.0)
    assert not any(f.at_risk for f in feeds)
    assert feeds[5].members == ("unknown",) and readings[5].link is LinkState.LOST


def test_long_link_loss_treated_as_outage_is_at_risk_counted_from_the_loss() -> None:
    _, readings, feeds = play(
        [ok("OL")] + [lost()] * 5, every_s=5.0, link_grace_s=15.0, lost_contact="treat_as_outage"
    )
    # losses seen at 5, 10, 15, 20, 25 s: held while under 15 s since the first loss.
    assert [f.at_risk for f in feeds] == [False, False, False, False, True, True]
    assert feeds[4].at_risk_for_s == pytest.approx(15.0)
    assert feeds[5].at_risk_for_s == pytest.approx(20.0)
    assert readings[5].age_s == pytest.approx(25.0) and readings[5].charge_pct == 100.0
    assert feeds[5].members == ("unknown",)


def test_lost_on_battery_is_never_held_and_runtime_counts_down() -> None:
    watch, readings, feeds = play([ok("OB", "DISCHRG", runtime=600.0), lost(), lost()])
    assert [f.at_risk for f in feeds] == [True, True, True]
    assert feeds[2].at_risk_for_s == pytest.approx(10.0)
    assert readings[2].link is LinkState.LOST and readings[2].age_s == pytest.approx(10.0)
    assert watch.runtime_s() == pytest.approx(590.0)


def test_lost_before_any_reading_is_unknown_an_alert_and_not_an_outage() -> None:
    _, readings, feeds = play([lost()])
    assert readings[0].link is LinkState.LOST and readings[0].age_s == float("inf")
    assert not feeds[0].at_risk and feeds[0].members == ("unknown",)
    _, _, feeds = play([lost()], lost_contact="treat_as_outage")
    assert feeds[0].at_risk


def test_self_test_is_not_an_outage() -> None:
    watch, _, feeds = play(
        [ok("OL"), ok("OB", "CAL", charge=95.0), ok("OB", "CAL", charge=90.0), ok("OL")]
    )
    assert [f.at_risk for f in feeds] == [False, False, False, False]
    assert feeds[1].members == ("self-test",)
    assert watch.depletion_pct_per_min is None


def test_self_test_without_mains_voltage_is_an_outage() -> None:
    _, _, feeds = play([ok("OL"), ok("OB", "CAL", volts=0.0)])
    assert [f.at_risk for f in feeds] == [False, True]


def test_short_ob_blip_is_at_risk_only_for_its_duration() -> None:
    """The policy debounces OB with on_battery.after, fed by at_risk_for_s."""
    _, _, feeds = play([ok("OL"), ok("OB"), ok("OL"), ok("OB"), ok("OB")], every_s=2.0)
    assert [f.at_risk for f in feeds] == [False, True, False, True, True]
    assert [f.at_risk_for_s for f in feeds] == [0.0, 0.0, 0.0, 0.0, 2.0]


def test_stale_keeps_last_values_with_their_age_and_is_held_briefly() -> None:
    steps: list[Step | Exception] = [ok("OL", charge=99.0), stale(), stale(), stale(), stale()]
    _, readings, feeds = play(steps, lost_contact="treat_as_outage")
    assert readings[1].link is LinkState.STALE and readings[1].charge_pct == 99.0
    assert readings[1].raw["nut.error"] == "X" and readings[2].age_s == pytest.approx(10.0)
    assert [f.at_risk for f in feeds] == [False, False, False, False, True]


def test_observed_depletion_and_the_faster_runtime() -> None:
    # 1 % per 5 s = 12 %/min; the UPS still claims 30 minutes.
    steps: list[Step | Exception] = [
        ok("OB", "DISCHRG", charge=80.0 - i, runtime=1800.0) for i in range(6)
    ]
    watch, _, feeds = play(steps, min_span_s=20.0)
    assert watch.depletion_pct_per_min == pytest.approx(12.0)
    assert watch.observed_runtime_s == pytest.approx(75.0 / 12.0 * 60.0)
    assert watch.runtime_s() == watch.observed_runtime_s
    assert feeds[-1].depletion_pct_per_min == pytest.approx(12.0)
    assert feeds[-1].runtime_s == pytest.approx(375.0)


def test_depletion_window_forgets_an_earlier_outage() -> None:
    steps: list[Step | Exception] = [ok("OB", charge=90.0), ok("OB", charge=80.0), ok("OL")]
    steps += [ok("OB", charge=79.0)]
    watch, _, _ = play(steps, min_span_s=0.0)
    assert watch.depletion_pct_per_min is None


def test_refused_credentials_are_lost_contact_with_the_reason_never_an_exception() -> None:
    denied = AuthenticationError("upsd refused user 'mon'")
    watch, readings, _ = play([denied])
    assert readings[0].link is LinkState.LOST and watch.last_error == "upsd refused user 'mon'"
    watch, readings, _ = play([ok("OL"), denied])
    assert readings[1].link is LinkState.LOST and watch.last_error is not None


def test_a_source_bug_reads_lost_instead_of_stopping_the_watch() -> None:
    watch, readings, _ = play([ok("OL"), RuntimeError("plugin bug")])
    assert readings[1].link is LinkState.LOST and "plugin bug" in (watch.last_error or "")


def test_one_percent_step_early_in_an_outage_is_not_a_drain_rate() -> None:
    """1 %/min really, seen in whole percents every 5 s: the first step alone says nothing."""
    charges = [100.0, 99.0] + [99.0] * 11 + [98.0]
    steps: list[Step | Exception] = [ok("OB", charge=c) for c in charges]
    watch, _, _ = play(steps[:2])
    assert watch.depletion_pct_per_min is None
    watch, _, _ = play(steps)
    rate = watch.depletion_pct_per_min
    assert rate is not None and 0.5 < rate < 2.5
