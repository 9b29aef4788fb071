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
