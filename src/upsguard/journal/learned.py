"""Durations learned from the journal: how long each resource's step took in past runs.

Every finished step leaves its start and end in the journal (table ``steps``). For each
resource and direction the last ``LEARN_FROM_RUNS`` runs that finished its step ``done``
(real outages and drills alike) give a median and a p90; the planner uses the p90. The
steps of a group's members (``member``, as recorded) give a per-member figure.

Left out, as they say nothing about how long the step takes:

- steps that found their target already in the wanted state (the ``already_there`` the
  step recorded): a resumed run re-checks what was done before in no time;
- steps that did not end ``done`` (failed, skipped, cancelled, interrupted, abandoned).

A step's time runs from its start to its end: waiting for a dirty cache comes before the
start and is not counted; waiting for a free slot of its platform is (the journal does not
tell them apart).

The journal is a record, not a precondition: one that cannot be read teaches nothing, and
the plan falls back on the site file's estimates.
"""

from __future__ import annotations

import logging
import sqlite3
import statistics
from collections import defaultdict
from datetime import datetime
from pathlib import Path

from upsguard.errors import PermanentError
from upsguard.journal.file import journal_exists
from upsguard.journal.rows import StepRow, iso, parse_iso
from upsguard.journal.store import Journal
from upsguard.models import Direction, ResourceId
from upsguard.runbooks.plan import LearnedDuration

log = logging.getLogger(__name__)

LEARN_FROM_RUNS = 10
"""How many of the newest runs that did a resource's step count: old enough runs describe
hardware and guests that may have changed since."""

Key = tuple[ResourceId, Direction]


def learned_durations(
    journal: Journal, *, before: datetime | None = None, runs: int = LEARN_FROM_RUNS
) -> dict[Key, LearnedDuration]:
    """Median and p90 per resource and direction; ``before``: only from runs that started
    before then (what a run's own plan knew). Empty when the journal cannot be read."""
    try:
        return _learn(journal.read.finished_steps(iso(before) if before else None), runs)
    except (sqlite3.Error, ValueError) as exc:  # a journal damaged or written by another build
        log.warning("journal %s: cannot learn durations from it: %s", journal.path, exc)
        return {}


def _learn(rows: list[tuple[StepRow, Direction]], runs: int) -> dict[Key, LearnedDuration]:
    samples: dict[tuple[Key, bool], dict[str, list[float]]] = defaultdict(dict)
    for step, direction in rows:
        if step.ended is None or step.already_there or step.resource is None:
            continue
        resource = ResourceId(step.resource)
        member = step.member
        per_run = samples[((resource, direction), member)]
        if step.run not in per_run and len(per_run) >= runs:
            continue  # older than the newest ``runs`` runs of this step
        seconds = (parse_iso(step.ended) - parse_iso(step.started)).total_seconds()
        per_run.setdefault(step.run, []).append(max(0.0, seconds))
    out: dict[Key, LearnedDuration] = {}
    for (key, member), per_run in samples.items():
        if key in out and not member:
            continue  # both whole-resource and member figures: keep the members'
        values = [v for run in per_run.values() for v in run]
        out[key] = LearnedDuration(
            median_s=statistics.median(values),
            p90_s=p90(values),
            runs=len(per_run),
            per_member=member,
        )
    return out


def p90(values: list[float]) -> float:
    """The 90th percentile, interpolated between the samples (never above the largest)."""
    if len(values) == 1:
        return values[0]
    return statistics.quantiles(values, n=10, method="inclusive")[-1]


def learned_or_none(path: str | Path) -> dict[Key, LearnedDuration] | None:
    """The durations learned from the journal at ``path``; None when there is no journal
    there, it cannot be read, or it holds no finished step (the CLI then plans with the
    configured figures)."""
    try:
        if not journal_exists(path):
            return None
        journal = Journal(path, read_only=True)
    except PermanentError as exc:
        log.warning("%s: planning with the configured durations", exc)
        return None
    try:
        return learned_durations(journal) or None
    finally:
        journal.close()
