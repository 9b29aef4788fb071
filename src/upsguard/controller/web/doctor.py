"""The doctor panel: the last result of ``upsguard doctor`` (its checks of the UPSes,
platforms, caches and the site file against the real world).

The doctor command is being built on its own branch; until it lands there is no result to
show, and the panel says so. This function is the one place that reads it: when the
doctor journals its results, ``last_result`` returns the newest (when it ran, and each
check with its verdict) and the page draws it as it is.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from upsguard.journal import Journal


@dataclass(frozen=True, slots=True)
class DoctorCheck:
    name: str
    ok: bool
    detail: str


@dataclass(frozen=True, slots=True)
class DoctorResult:
    at: datetime
    checks: tuple[DoctorCheck, ...]

    @property
    def ok(self) -> bool:
        return all(c.ok for c in self.checks)


def last_result(journal: Journal) -> DoctorResult | None:
    """The newest doctor result in the journal; None: no check run yet."""
    return None
