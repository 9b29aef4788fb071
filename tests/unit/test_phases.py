"""The phase machine alone: debounce, hysteresis, hold, critical floor."""

from __future__ import annotations

from datetime import UTC, datetime

from upsguard.config.policies import PoliciesConfig
from upsguard.decisions import PlanTime
from upsguard.models import Phase, RunId
from upsguard.policies.phases import Act, Decision, PhaseEngine, PowerView
from upsguard.policies.power import FeedReading
from upsguard.runs import RunKind, RunOrigin, RunRecord, RunSpec, SiteRuns

PLAN_60 = {"f": PlanTime(60)}
PLAN_600 = {"f": PlanTime(600)}


def view(
    at: float,
    on_battery: bool,
    runtime: float = 3600,
    charge: float = 90,
    low: bool = False,
    fsd: bool = False,
    since: float = 0.0,
) -> PowerView:
    """The feed ``f`` at ``at`` s; on battery since ``since`` (the feed's own clock)."""
    feed = FeedReading(
        name="f",
        online=0 if on_battery else 1,
        needed=1,
        runtime_s=runtime if on_battery else None,
        charge_pct=charge if on_battery else None,
        depletion_pct_per_min=None,
        low_battery=low,
        forced_shutdown=fsd,
        lost=False,
        at_risk_for_s=at - since if on_battery else 0.0,
        read_on_mains=0 if on_battery else 1,
    )
    return PowerView(at_s=at, feeds=(feed,), min_charge_pct=charge)


def engine(**policies: object) -> PhaseEngine:
    return PhaseEngine(PoliciesConfig.model_validate(policies))


def acts(decisions: list[Decision]) -> list[Act]:
    return [d.act for d in decisions]


def phase(eng: PhaseEngine) -> Phase:
    """The engine's phase now (mypy would keep ``eng.phase`` narrowed across ``evaluate``)."""
    return eng.phase


def test_on_battery_only_after_the_debounce() -> None:
    eng = engine()
    assert eng.evaluate(view(0, True), SiteRuns(), PLAN_600) == []
    assert eng.evaluate(view(5, True), SiteRuns(), PLAN_600) == []
    assert acts(eng.evaluate(view(10, True), SiteRuns(), PLAN_600)) == [Act.CACHES_WRITE_THROUGH]
    assert eng.phase is Phase.ON_BATTERY


def test_a_blip_resets_the_debounce() -> None:
    eng = engine()
    eng.evaluate(view(0, True), SiteRuns(), PLAN_600)
    eng.evaluate(view(5, False), SiteRuns(), PLAN_600)
    assert eng.evaluate(view(10, True, since=10), SiteRuns(), PLAN_600) == []
    assert eng.phase is Phase.NORMAL


def test_the_debounce_counts_on_the_feeds_clock_not_the_engines() -> None:
    """A feed at risk for 30 s (a restart, a link grace that ran first) is past a 10 s
    debounce on the engine's first look: one clock, as documented."""
    eng = engine()
    decided = eng.evaluate(view(100, True, since=70), SiteRuns(), PLAN_600)
    assert acts(decided) == [Act.CACHES_WRITE_THROUGH] and eng.phase is Phase.ON_BATTERY


def test_low_battery_skips_the_debounce_and_shuts_down() -> None:
    eng = engine()
    decided = acts(eng.evaluate(view(0, True, low=True), SiteRuns(), PLAN_600))
    assert Act.START_SHUTDOWN in decided
    assert eng.phase is Phase.SHUTTING_DOWN


def test_runtime_against_plan_plus_margin() -> None:
    eng = engine(shutdown={"when_any": ["runtime < plan + 5m"]})
    eng.evaluate(view(0, True, runtime=2000), SiteRuns(), PLAN_600)
    assert Act.START_SHUTDOWN not in acts(
        eng.evaluate(view(10, True, runtime=901), SiteRuns(), PLAN_600)
    )
    decided = eng.evaluate(view(15, True, runtime=899), SiteRuns(), PLAN_600)
    assert Act.START_SHUTDOWN in acts(decided)


def test_hold_defers_shutdown_until_the_floor() -> None:
    eng = engine(shutdown={"when_any": ["runtime < 10m"]}, critical_floor={"charge_below": 10})
    eng.held = "maintenance window"
    eng.evaluate(view(0, True, runtime=300, charge=40), SiteRuns(), PLAN_60)
    held = eng.evaluate(view(10, True, runtime=300, charge=40), SiteRuns(), PLAN_60)
    assert Act.START_SHUTDOWN not in acts(held)
    assert eng.phase is Phase.ON_BATTERY
    decided = eng.evaluate(view(20, True, runtime=200, charge=9), SiteRuns(), PLAN_60)
    assert Act.START_SHUTDOWN in acts(decided)
    assert eng.at_floor


def test_power_must_stay_back_before_recovering() -> None:
    eng = engine(power_returns={"online_for": "30s"})
    eng.evaluate(view(0, True), SiteRuns(), PLAN_600)
    eng.evaluate(view(10, True), SiteRuns(), PLAN_600)
    eng.evaluate(view(20, False), SiteRuns(), PLAN_600)
    assert eng.phase is Phase.ON_BATTERY
    eng.evaluate(view(50, False), SiteRuns(), PLAN_600)
    assert phase(eng) is Phase.RECOVERING


def test_caches_go_back_only_above_the_charge_threshold() -> None:
    eng = engine(power_returns={"online_for": "0s"}, startup={"online_for": "0s"})
    eng.evaluate(view(0, True), SiteRuns(), PLAN_600)
    eng.evaluate(view(10, True), SiteRuns(), PLAN_600)
    eng.evaluate(view(20, False, charge=40), SiteRuns(), PLAN_600)
    assert eng.phase is Phase.RECOVERING
    assert eng.evaluate(view(30, False, charge=45), SiteRuns(), PLAN_600) == []
    decided = eng.evaluate(view(40, False, charge=55), SiteRuns(), PLAN_600)
    assert acts(decided) == [Act.CACHES_WRITE_BACK]
    assert phase(eng) is Phase.NORMAL


def test_a_decision_says_the_figures_it_was_made_on() -> None:
    """'runtime < plan + 5m' fired, and only the code showed why: a destage not measured
    yet counted as its whole destage_timeout. Now the reason says so."""
    changes: list[tuple[Phase, str]] = []
    eng = PhaseEngine(
        PoliciesConfig.model_validate({"shutdown": {"when_any": ["runtime < plan + 5m"]}}),
        on_change=lambda old, new, reason, figures: changes.append((new, reason)),
        phase=Phase.ON_BATTERY,
    )
    plan = {"f": PlanTime(485.0, destage_s=600.0, destage_measured=False)}
    decided = eng.evaluate(view(100, True, runtime=780), SiteRuns(), plan)
    start = next(d for d in decided if d.act is Act.START_SHUTDOWN)
    assert start.figures is not None and start.figures.value == 780.0
    assert start.reason == (
        "runtime < plan + 5m: runtime 13m < plan 8m05s + destage 10m (not measured yet) + margin 5m"
    )
    assert changes == [(Phase.SHUTTING_DOWN, start.reason)]


def test_a_policys_shutdown_resumed_in_phase_normal_is_cancelled_once_the_mains_stay() -> None:
    """A controller that wins the lease resumes the shared ledger's shutdown while its own
    phase reads normal (it followed the outage's end as standby). Found by the pair machine:
    the resumed run waited before its point of no return for the mains to stay, which only
    the shutting_down phase cancels, so the site never came back. The run in progress says
    the phase; the mains back cancel it as any policy's shutdown before that point."""
    eng = engine(power_returns={"online_for": "30s"})
    eng.evaluate(view(0, False), SiteRuns(), PLAN_600)
    spec = RunSpec(RunId("r1"), RunKind.SHUTDOWN, RunOrigin.POLICY, "fsd", datetime.now(UTC))
    resumed = SiteRuns(latest=RunRecord(spec), active=RunRecord(spec))

    decided = eng.evaluate(view(40, False), resumed, PLAN_600)

    assert acts(decided) == [Act.CANCEL_SHUTDOWN]
    assert phase(eng) is Phase.RECOVERING
