"""When the service checks the site by itself: ``checks:`` (the doctor's checks) and each
UPS's ``battery_test:``.

``at`` is a wall-clock time in the machine's time zone, optionally with a day of the week
(``"Sun 03:00"``, ``"03:00"`` for any day): the battery test runs at the first such time
once ``every`` has passed since the last test in the journal.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Literal

from pydantic import Field, field_validator

from upsguard.config.base import Model
from upsguard.config.types import Duration, LongDuration

DAYS = ("mon", "tue", "wed", "thu", "fri", "sat", "sun")
_AT = re.compile(r"^\s*(?:(?P<day>[A-Za-z]{3})[a-z]*\s+)?(?P<hour>\d{1,2}):(?P<minute>\d{2})\s*$")


@dataclass(frozen=True, slots=True)
class At:
    """A time of day and, optionally, a day of the week (``day``: ``mon`` ... ``sun``)."""

    hour: int
    minute: int
    day: str | None = None


def parse_at(text: str) -> At:
    """``"Sun 03:00"``, ``"sunday 3:00"`` or ``"03:00"``; ValueError saying how to write it."""
    found = _AT.match(text)
    day = found.group("day").lower() if found and found.group("day") else None
    if found is None or (day is not None and day not in DAYS):
        raise ValueError(
            f"{text!r} is not a time like 'Sun 03:00' or '03:00' (a day of the week is "
            "optional: Mon, Tue, Wed, Thu, Fri, Sat, Sun)"
        )
    hour, minute = int(found.group("hour")), int(found.group("minute"))
    if hour > 23 or minute > 59:
        raise ValueError(f"{text!r}: the hour is 0 to 23 and the minute 0 to 59")
    return At(hour, minute, day)


def _at_least(value: timedelta, least: timedelta, why: str) -> timedelta:
    if value < least:
        raise ValueError(why)
    return value


class ChecksConfig(Model):
    """The checks of ``upsguard doctor``, run by the service on a schedule and journaled; what
    broke since the last run is notified (``alert``)."""

    every: LongDuration = Field(
        timedelta(days=1), description="how often; the first run comes a minute after start"
    )
    timeout: Duration = Field(
        timedelta(seconds=30), description="the longest one check may take before it fails"
    )

    @field_validator("every")
    @classmethod
    def _not_too_often(cls, value: timedelta) -> timedelta:
        return _at_least(
            value, timedelta(minutes=5), "checks log in everywhere: every 5m at the most often"
        )


class BatteryTestConfig(Model):
    """A battery test the service asks the UPS for on a schedule: NUT's
    ``test.battery.start.quick`` or ``.deep`` (SNMP: the MIB's own test), never while
    another UPS is on battery or a run is under way. Its result is journaled."""

    every: LongDuration = Field(description="at least this long between two tests, e.g. 30d")
    at: str = Field(
        "Sun 03:00",
        description="when, in the machine's time zone: 'Sun 03:00', or '03:00' for any day",
    )
    kind: Literal["quick", "deep"] = Field(
        "quick", description="deep: a runtime calibration, down to a low charge"
    )
    timeout: Duration = Field(
        timedelta(minutes=30),
        description="how long to wait for the UPS to report the test's result",
    )

    @field_validator("at")
    @classmethod
    def _readable_time(cls, value: str) -> str:
        parse_at(value)
        return value

    @field_validator("every")
    @classmethod
    def _not_too_often(cls, value: timedelta) -> timedelta:
        return _at_least(
            value, timedelta(days=1), "a battery test wears the battery: at most one a day"
        )

    @property
    def when(self) -> At:
        return parse_at(self.at)

    @property
    def command(self) -> str:
        """The NUT-style instant command that starts it."""
        return f"test.battery.start.{self.kind}"
