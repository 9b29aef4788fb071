"""Policies: when the site moves from phase to phase, and what it does on the way."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field

from upsguard.config.base import Model
from upsguard.config.conditions import ConditionText, parse_condition
from upsguard.config.types import Duration, Interval

OnBatteryAction = Literal["caches_write_through"]
StartupAction = Literal["startup_runbook", "caches_write_back"]


class OnBatteryPolicy(Model):
    after: Duration = Field(timedelta(seconds=10), description="debounce before acting")
    then: list[OnBatteryAction] = Field(
        default_factory=lambda: list[OnBatteryAction](["caches_write_through"])
    )


class SheddingPolicy(Model):
    """Stop the resources marked ``shed: true`` early, to stretch the runtime."""

    when_any: list[ConditionText] = Field(
        default_factory=lambda: [parse_condition("on_battery_for > 5m")]
    )


class ShutdownPolicy(Model):
    when_any: list[ConditionText] = Field(
        default_factory=lambda: [
            parse_condition(c) for c in ("low_battery", "fsd", "runtime < plan + 5m")
        ]
    )


class PowerReturnsPolicy(Model):
    before_point_of_no_return: Literal["cancel", "finish"] = "cancel"
    after: Literal["finish"] = "finish"
    online_for: Duration = Field(
        timedelta(seconds=30), description="power must stay on this long to count as back"
    )


class StartupPolicy(Model):
    automatic: bool = True
    guests: Literal["all", "as_before"] = Field(
        "all",
        description="all: every VM of the plan is started; as_before: a VM the shutdown "
        "found already off stays off at the startup (the site comes back as it was)",
    )
    online_for: Duration = timedelta(minutes=10)
    charge_above: float = Field(50.0, ge=0, le=100)
    then: list[StartupAction] = Field(
        default_factory=lambda: list[StartupAction](["startup_runbook", "caches_write_back"])
    )


class CriticalFloor(Model):
    """Below this, nothing is waited for (dirty caches included); logged as a risk."""

    charge_below: float = Field(10.0, ge=0, le=100)
    runtime_below: Duration = timedelta(seconds=90)


class LearningPolicy(Model):
    """How far the plan trusts step durations learned from past runs (the journal).

    The runtime trigger (``runtime < plan + margin``) counts on the plan: a plan that shrinks
    on thin evidence starts the shutdown too late. A learned figure counts only once enough
    runs did the step, and it may raise the plan freely but lower it below the configured
    estimate only as far as ``may_lower_to_pct`` allows (off by default)."""

    min_runs: int = Field(
        3, ge=1, le=1000, description="a learned figure counts once this many runs did the step"
    )
    may_lower_to_pct: float = Field(
        100.0,
        ge=0,
        le=100,
        description="how far below its configured estimate a learned figure may bring a step "
        "(percent of the estimate; 100: never below it)",
    )


class PoliciesConfig(Model):
    poll_interval: Interval = Field(
        timedelta(seconds=1),
        description="how often every UPS is read: a poll of upsd costs microseconds, and the "
        "reaction to an outage is about one poll",
    )
    on_battery: OnBatteryPolicy = OnBatteryPolicy()
    shedding: SheddingPolicy | None = None
    shutdown: ShutdownPolicy = ShutdownPolicy()
    power_returns: PowerReturnsPolicy = PowerReturnsPolicy()
    startup: StartupPolicy = StartupPolicy()
    required_margin: Duration = timedelta(minutes=5)
    critical_floor: CriticalFloor = CriticalFloor()
    learning: LearningPolicy = LearningPolicy()
    on_lost_contact_while_on_line: Literal["alert", "treat_as_outage"] = Field(
        "alert",
        description="a UPS last seen on mains that stops answering: an alert only (counted as "
        "lost only in a feed where another supply already failed), or an outage after its "
        "link_grace",
    )
    step_failure: Literal["continue", "stop"] = Field(
        "continue",
        description="shutdown: a failed step lets its dependents go on (power is going anyway)",
    )
