"""The doctor panel: the newest checkup the service journaled (its scheduled ``checks:``),
each finding with its verdict and fix, as ``upsguard doctor`` prints them.

``upsguard doctor`` on the command line journals nothing (it may run where the service's
journal is not writable); the panel shows what the service itself found.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from upsguard.findings import Finding, Verdict
from upsguard.journal import Journal
from upsguard.journal.checkups import last_checkup

STATE_OF = {Verdict.OK: "ok", Verdict.WARN: "warning", Verdict.FAIL: "failed"}
"""A verdict as the page's state colours name it."""


@dataclass(frozen=True, slots=True)
class DoctorResult:
    at: datetime
    findings: tuple[Finding, ...]

    @property
    def ok(self) -> bool:
        return all(f.verdict is not Verdict.FAIL for f in self.findings)


def last_result(journal: Journal) -> DoctorResult | None:
    """The newest checkup in the journal; None: none has run yet."""
    last = last_checkup(journal.db)
    if last is None:
        return None
    at, findings = last
    return DoctorResult(at, tuple(findings))
