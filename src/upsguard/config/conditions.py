"""The small condition language of the ``policies`` section.

A condition is a flag (``low_battery``, ``fsd``, ``on_battery``) or a comparison
``METRIC OP VALUE``: ``runtime < plan + 5m``, ``charge < 30``,
``depletion > 4 %/min``, ``on_battery_for > 10m``. It is parsed once, at load
time, into a ``Condition`` the policy engine evaluates.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Annotated, Any, Literal

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from upsguard.config.types import parse_duration
from upsguard.config.values import shorten

Metric = Literal["runtime", "charge", "depletion", "on_battery_for"]
FLAGS = ("low_battery", "fsd", "on_battery", "ups_lost")
METRICS: tuple[str, ...] = ("runtime", "charge", "depletion", "on_battery_for")
_OPS: dict[str, Callable[[float, float], bool]] = {
    "<": operator.lt,
    "<=": operator.le,
    ">": operator.gt,
    ">=": operator.ge,
}
_COMPARISON = re.compile(r"^\s*([a-z_]+)\s*(<=|>=|<|>)\s*(.+?)\s*$")
_PLAN = re.compile(r"^plan\s*(?:([+-])\s*(.+))?$")


@dataclass(frozen=True, slots=True)
class Condition:
    """``flag`` alone, or ``metric op threshold`` (+ the plan's duration when ``plus_plan``)."""

    text: str
    flag: str | None = None
    metric: str | None = None
    op: str = "<"
    threshold: float = 0.0
    plus_plan: bool = False

    def __str__(self) -> str:
        """As the site file says it: what a person reads in the run book and the plan."""
        return self.text

    def holds(self, values: dict[str, float | None], flags: set[str], plan_s: float) -> bool:
        if self.flag is not None:
            return self.flag in flags
        assert self.metric is not None
        value = values.get(self.metric)
        if value is None:
            return False
        limit = self.threshold + (plan_s if self.plus_plan else 0.0)
        return _OPS[self.op](value, limit)


def parse_condition(value: Any) -> Condition:
    if isinstance(value, Condition):
        return value
    if not isinstance(value, str):
        raise ValueError("a condition is a string like 'low_battery' or 'runtime < plan + 5m'")
    text = value.strip()
    if text in FLAGS:
        return Condition(text=text, flag=text)
    match = _COMPARISON.match(text)
    if not match:
        raise ValueError(
            f"{shorten(text)!r} is not a condition: use one of {', '.join(FLAGS)} "
            "or 'METRIC < VALUE' with METRIC one of " + ", ".join(METRICS)
        )
    metric, op, rhs = match.groups()
    if metric not in METRICS:
        raise ValueError(
            f"unknown metric {shorten(metric)!r} in {shorten(text)!r}: "
            f"use one of {', '.join(METRICS)}"
        )
    threshold, plus_plan = _parse_value(metric, rhs, text)
    return Condition(text=text, metric=metric, op=op, threshold=threshold, plus_plan=plus_plan)


def _parse_value(metric: str, rhs: str, text: str) -> tuple[float, bool]:
    if metric in ("runtime", "on_battery_for"):
        plan = _PLAN.match(rhs)
        if plan:
            sign, rest = plan.groups()
            offset = parse_duration(rest).total_seconds() if rest else 0.0
            return (-offset if sign == "-" else offset), True
        return parse_duration(rhs).total_seconds(), False
    number = rhs.replace("%/min", "").replace("%", "").strip()
    unit = "%/min" if metric == "depletion" else "%"
    try:
        value = float(number)
    except ValueError:
        value = math.nan
    if not 0 <= value <= 100:  # NaN too: a comparison with it would never hold
        raise ValueError(
            f"{shorten(text)!r}: {metric} is compared with a number from 0 to 100 {unit}"
        ) from None
    return value, False


ConditionText = Annotated[
    Condition,
    BeforeValidator(parse_condition),
    PlainSerializer(lambda c: c.text, return_type=str),
    WithJsonSchema({"type": "string", "examples": ["low_battery", "runtime < plan + 5m"]}),
]
