"""What a check of the site found: one ``Finding`` per thing checked, ok, warn or fail.

``upsguard doctor``, the service's scheduled checks and ``upsguard drill`` all produce
these; plugins produce them too (the optional ``diagnose`` capability of each family's
``base.py``), which is why they live in the core. Everything code reads back is a typed
field: the verdict, what was checked (``area``, ``subject``, ``check``), what is missing
(privileges, commands) and how long the finding adds to the shutdown. ``detail`` and
``fix`` are one line each, for people.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable
from dataclasses import dataclass, replace


class Verdict(enum.StrEnum):
    """How a check came out, from best to worst."""

    OK = "ok"
    """What the plan needs is there."""
    WARN = "warn"
    """The plan works, but not as well as it could (a VM powered off hard, a guess)."""
    FAIL = "fail"
    """A step of the plan, or the watch, would fail in an outage."""

    @property
    def rank(self) -> int:
        return _RANK[self]


_RANK = {Verdict.OK: 0, Verdict.WARN: 1, Verdict.FAIL: 2}


class Area(enum.StrEnum):
    """What kind of thing a finding is about."""

    UPS = "ups"
    PLATFORM = "platform"
    RESOURCE = "resource"
    """A resource of the plan: a VM, a host, a device."""
    CACHE = "cache"
    STORE = "store"
    """The coordination store of a controller pair (etcd): each endpoint, then this
    controller's access to the pair's keys."""
    FILE = "file"
    """A file the site file names (secrets, keys, CA bundles) and the journal."""
    NOTIFY = "notify"
    WEB = "web"
    """The live page's own settings (its trusted proxy)."""
    PLAN = "plan"


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing checked and what was found.

    ``(area, subject, check)`` names the check across runs, so that the service can say
    what broke since its last checkup. ``fix`` is empty when there is nothing to do.
    """

    area: Area
    subject: str
    """The UPS, platform, resource, cache or file, as the site file names it."""
    check: str
    """What was checked, a stable word: ``login``, ``commands``, ``privileges``..."""
    verdict: Verdict
    detail: str
    fix: str = ""
    missing: tuple[str, ...] = ()
    """What the check found lacking, one item each (privileges, instant commands)."""
    adds_s: float | None = None
    """How much longer the shutdown plan takes because of what was found, when known."""
    took_s: float | None = None
    """How long the check took (set by the doctor, which times each)."""

    @property
    def key(self) -> tuple[str, str, str]:
        return (self.area.value, self.subject, self.check)

    def timed(self, seconds: float) -> Finding:
        return replace(self, took_s=seconds)


def ok(area: Area, subject: str, check: str, detail: str) -> Finding:
    return Finding(area, subject, check, Verdict.OK, detail)


def warn(
    area: Area,
    subject: str,
    check: str,
    detail: str,
    fix: str,
    *,
    missing: tuple[str, ...] = (),
    adds_s: float | None = None,
) -> Finding:
    return Finding(area, subject, check, Verdict.WARN, detail, fix, missing, adds_s)


def fail(
    area: Area,
    subject: str,
    check: str,
    detail: str,
    fix: str,
    *,
    missing: tuple[str, ...] = (),
    adds_s: float | None = None,
) -> Finding:
    return replace(
        warn(area, subject, check, detail, fix, missing=missing, adds_s=adds_s),
        verdict=Verdict.FAIL,
    )


def worst(findings: Iterable[Finding]) -> Verdict:
    """The worst verdict among the findings (ok when there are none)."""
    return max((f.verdict for f in findings), key=lambda v: v.rank, default=Verdict.OK)


def counts(findings: Iterable[Finding]) -> dict[Verdict, int]:
    out = dict.fromkeys(Verdict, 0)
    for finding in findings:
        out[finding.verdict] += 1
    return out
