"""A decision's figures in words: what a person reads in the journal and the report."""

from __future__ import annotations

from upsguard.decisions import PlanTime, Reckoning


def test_figures_that_round_alike_are_told_apart() -> None:
    """139.6 s below a limit of 140 s read "runtime 2m20s < 2m20s", which says nothing."""
    close = Reckoning("runtime < 140s", "main", True, "runtime", "<", 139.6, 140.0)
    assert close.figures() == "runtime 139.6s < 140s"


def test_figures_name_the_plan_and_the_margin() -> None:
    plan = PlanTime(485.0, destage_s=600.0, destage_measured=False)
    low = Reckoning("runtime < plan + 5m", "main", True, "runtime", "<", 780.0, 1385.0, plan, 300)
    assert low.figures() == (
        "runtime 13m < plan 8m05s + destage 10m (not measured yet) + margin 5m"
    )


def test_a_destage_beside_the_guests_counts_only_the_wait_it_adds() -> None:
    """The host steps wait for the destage while the guests shut down: what it adds to the
    plan is the wait, not the whole destage."""
    plan = PlanTime(1140.0, destage_s=600.0, destage_measured=False, with_destage_s=1380.0)
    assert plan.total_s == 1380.0
    low = Reckoning("runtime < plan + 5m", "f", True, "runtime", "<", 1500.0, 1680.0, plan, 300)
    assert low.figures() == (
        "runtime 25m < plan 19m + 4m waiting for destage 10m (not measured yet) + margin 5m"
    )
    within = PlanTime(1140.0, destage_s=123.0, with_destage_s=1140.0)
    high = Reckoning("runtime < plan + 5m", "f", False, "runtime", "<", 2000.0, 1440.0, within, 300)
    assert high.figures() == (
        "runtime 33m20s >= plan 19m (destage 2m03s beside the guests' shutdown) + margin 5m"
    )
