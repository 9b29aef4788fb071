"""Feeds with min_supplies (NUT's MINSUPPLIES): what a policy sees per feed, not per UPS."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from upsguard.config.site import FeedConfig
from upsguard.models import LinkState, UpsFlag, UpsName, UpsReading
from upsguard.policies.power import UpsFigures, feed_name, read_feed, read_feeds

AT = datetime(2026, 1, 1, tzinfo=UTC)
A, B, C = UpsName("a"), UpsName("b"), UpsName("c")


def fig(
    ups: UpsName,
    *flags: str,
    runtime: float | None = 600.0,
    charge: float | None = 80.0,
    link: LinkState = LinkState.OK,
    off_for: float = 0.0,
    held: bool = False,
    rate: float | None = None,
) -> UpsFigures:
    reading = UpsReading(
        ups=ups,
        at=AT,
        flags=frozenset(UpsFlag(f) for f in flags),
        charge_pct=charge,
        runtime_s=runtime,
        input_voltage=230.0 if "OL" in flags else 0.0,
        link=link,
    )
    return UpsFigures(reading, runtime, rate, held_online=held, off_line_for_s=off_for)


def feed(*ups: UpsName, need: int = 1) -> FeedConfig:
    return FeedConfig(name="hosts", ups=list(ups), min_supplies=need)


def test_two_supplies_one_on_battery_is_degraded_not_at_risk() -> None:
    reading = read_feed("hosts", feed(A, B), {A: fig(A, "OL"), B: fig(B, "OB", off_for=30)})
    assert not reading.at_risk and reading.state == "degraded"
    assert reading.online == 1 and reading.runtime_s is None
    assert reading.members == ("online", "on-battery")


def test_both_on_battery_last_until_the_survivor_carrying_everything_is_empty() -> None:
    """Two power supplies share the load: once a's battery is empty, b carries all of it, and
    its runtime shrinks by Peukert's law (``peukert_exponent``, 1.15 by default). Counting b
    at its share (900 s) said the feed lasted 15 minutes; it lasts 300 + 600 * 0.5 ** 1.15."""
    figures = {A: fig(A, "OB", runtime=300, off_for=40), B: fig(B, "OB", runtime=900, off_for=10)}
    reading = read_feed("hosts", feed(A, B), figures)
    assert reading.at_risk and reading.runtime_s == pytest.approx(300 + 600 * 0.5**1.15)
    assert reading.at_risk_for_s == 10  # at risk since the second one went


def test_the_cluster_feed_lasts_far_less_than_its_longest_ups() -> None:
    """The cluster example, ups-a on battery at 1m and ups-b at 10m: at T+25m55s ups-a had
    12m49s and ups-b 23m57s at their shares; the trigger took 23m57s, the shutdown began too
    late and ups-a ended with 3m48s of the 5m margin. The feed has ups-a's 12m49s, then
    ups-b alone with what is left of its battery."""
    figures = {A: fig(A, "OB", runtime=769, off_for=1500), B: fig(B, "OB", runtime=1437)}
    reading = read_feed("hosts", feed(A, B), figures)
    assert reading.runtime_s is not None
    assert 769 < reading.runtime_s < 769 + (1437 - 769) / 2  # far below 23m57s
    assert reading.runtime_s == pytest.approx(769 + (1437 - 769) * 0.5**1.15)


def test_the_survivors_runtime_counts_with_each_ups_s_own_exponent() -> None:
    ideal = UpsFigures(fig(B, "OB").reading, 900.0, None, peukert=1.0)
    figures = {A: fig(A, "OB", runtime=300), B: ideal}
    assert read_feed("hosts", feed(A, B), figures).runtime_s == pytest.approx(300 + 600 / 2)


def test_a_member_already_empty_has_handed_its_load_over() -> None:
    """A UPS at 0 s carries nothing any more: the survivor's own runtime already counts the
    whole load, and must not be shrunk a second time."""
    figures = {A: fig(A, "OB", runtime=0), B: fig(B, "OB", runtime=400)}
    assert read_feed("hosts", feed(A, B), figures).runtime_s == 400


def test_a_member_whose_runtime_is_unknown_counts_as_gone_now() -> None:
    """Unknown is never good news: its share of the load is taken to move to the others at
    once."""
    figures = {A: fig(A, "OB", runtime=None), B: fig(B, "OB", runtime=900)}
    assert read_feed("hosts", feed(A, B), figures).runtime_s == pytest.approx(900 * 0.5**1.15)


def test_the_survivors_on_mains_take_their_share_of_the_load_too() -> None:
    """Three supplies, two needed, c on mains: when a is empty, b and c carry a third more
    each, so b lasts (900 - 300) * (2/3) ** 1.15 longer."""
    figures = {A: fig(A, "OB", runtime=300), B: fig(B, "OB", runtime=900), C: fig(C, "OL")}
    reading = read_feed("hosts", feed(A, B, C, need=2), figures)
    assert reading.runtime_s == pytest.approx(300 + 600 * (2 / 3) ** 1.15)


def test_min_supplies_two_needs_both() -> None:
    figures = {A: fig(A, "OL"), B: fig(B, "OB", runtime=300, off_for=5)}
    reading = read_feed("hosts", feed(A, B, need=2), figures)
    assert reading.at_risk and reading.runtime_s == 300 and reading.at_risk_for_s == 5


def test_three_supplies_need_two_last_until_the_second_is_empty() -> None:
    """a goes first (100 s); b and c then carry half the load each instead of a third, and c
    is the second to go: the feed lasts 100 + 300 * (2/3) ** 1.15, not c's 400 s."""
    figures = {
        A: fig(A, "OB", runtime=100, off_for=50),
        B: fig(B, "OB", runtime=700, off_for=20),
        C: fig(C, "OB", runtime=400, off_for=30),
    }
    reading = read_feed("hosts", feed(A, B, C, need=2), figures)
    assert reading.runtime_s == pytest.approx(100 + 300 * (2 / 3) ** 1.15)
    assert reading.at_risk_for_s == 30  # the second UPS off line made it at risk


def test_a_ups_out_of_contact_since_it_was_on_mains_is_an_alert_not_an_outage() -> None:
    figures = {A: fig(A, "OL", link=LinkState.LOST, off_for=20)}
    reading = read_feed("hosts", feed(A), figures)
    assert not reading.at_risk and not reading.lost
    assert reading.members == ("unknown",) and reading.unknown == 1


def test_out_of_contact_counts_as_lost_when_another_supply_has_failed() -> None:
    figures = {
        A: fig(A, "OL", link=LinkState.LOST, off_for=20),
        B: fig(B, "OB", runtime=300, off_for=5),
    }
    reading = read_feed("hosts", feed(A, B), figures)
    assert reading.at_risk and reading.lost and reading.members == ("unknown", "on-battery")


def test_treat_as_outage_counts_lost_contact_as_off_line() -> None:
    figures = {A: fig(A, "OL", link=LinkState.LOST, off_for=20)}
    reading = read_feed("hosts", feed(A), figures, lost_contact="treat_as_outage")
    assert reading.at_risk and reading.lost and reading.at_risk_for_s == 20


def test_contact_lost_on_battery_keeps_counting_down() -> None:
    lost_on_battery = UpsFigures(
        fig(A, "OB", link=LinkState.LOST).reading,
        240.0,
        None,
        off_line_for_s=60,
        last_seen_on_mains=False,
    )
    reading = read_feed("hosts", feed(A), {A: lost_on_battery})
    assert reading.at_risk and reading.runtime_s == 240 and reading.members == ("lost",)


def test_held_member_counts_while_its_grace_lasts() -> None:
    figures = {A: fig(A, "OL", link=LinkState.LOST, held=True)}
    reading = read_feed("hosts", feed(A), figures)
    assert not reading.at_risk and reading.held == 1 and not reading.lost


def test_low_battery_only_when_too_few_healthy_supplies_remain() -> None:
    figures = {A: fig(A, "OB", "LB", runtime=60), B: fig(B, "OB", runtime=900)}
    assert not read_feed("hosts", feed(A, B), figures).low_battery
    assert read_feed("hosts", feed(A, B, need=2), figures).low_battery
    assert read_feed("hosts", feed(A, B, need=2), figures).state == "low-battery"


def test_fsd_on_any_member_is_forced_shutdown() -> None:
    figures = {A: fig(A, "OL", "FSD"), B: fig(B, "OL")}
    reading = read_feed("hosts", feed(A, B), figures)
    assert reading.forced_shutdown and reading.state == "low-battery"


def test_unknown_member_is_not_online() -> None:
    reading = read_feed("hosts", feed(A, B, need=2), {A: fig(A, "OL")})
    assert reading.at_risk and reading.members == ("online", "unknown")


def test_charge_and_rate_are_the_worst_of_the_draining_members() -> None:
    figures = {
        A: fig(A, "OB", charge=40, rate=2.0),
        B: fig(B, "OB", charge=70, rate=5.0),
        C: fig(C, "OL", charge=10, rate=None),
    }
    reading = read_feed("hosts", feed(A, B, C), figures)
    assert reading.charge_pct == 40 and reading.depletion_pct_per_min == pytest.approx(5.0)


def test_feed_names_and_all_feeds() -> None:
    unnamed = FeedConfig(ups=[A, B])
    assert feed_name(unnamed, 3) == "feed3:a+b"
    readings = read_feeds([feed(A), unnamed], {A: fig(A, "OL"), B: fig(B, "OL")})
    assert [r.name for r in readings] == ["hosts", "feed1:a+b"]
    assert [r.state for r in readings] == ["online", "online"]
