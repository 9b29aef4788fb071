"""The VMs the outage found already off, read from the journal: the startup leaves them off,
so the site comes back as it was before (``policies.startup.guests: as_before``).

A VM counts as off before the outage when every shutdown or shedding run since the last
startup that ended done read it off at its first look, asking nothing. Anything else about
it (stopped by a run, a step that failed, skipped or never started, a run resumed after a
restart whose first look may be the run's own shutdown from before the restart) means it
may have been running, and it is started as before. So is every VM when the journal cannot
be read: a VM started that was off before costs a little power; a VM left off that ran
costs its service.
"""

from __future__ import annotations

import logging
import sqlite3

from upsguard.journal.rows import RunRow
from upsguard.journal.store import Journal
from upsguard.models import ResourceId, RunId, StepState
from upsguard.runs import RunKind, RunState

log = logging.getLogger(__name__)

RUNS_BACK = 50
"""How many of the newest runs are read back for the last startup that ended done."""


def found_off(
    journal: Journal, startup: RunId, started_by: str | None = None
) -> dict[ResourceId, RunId]:
    """The resources found off at the first look of every run that stopped things since the
    last startup done (``startup``, the run asking, left out), each with the first run that
    found it so. ``started_by``: the startup's own start, when runs came after it (a
    report of a past startup). Empty when the journal cannot be read: everything is
    started."""
    try:
        runs = journal.read.runs(limit=RUNS_BACK, started_by=started_by)
    except (sqlite3.Error, ValueError) as exc:
        log.warning("journal %s: cannot read what was off before the outage: %s", journal.path, exc)
        return {}
    return _found_off(runs, startup)


def _found_off(newest_first: list[RunRow], startup: RunId) -> dict[ResourceId, RunId]:
    found: dict[ResourceId, RunId] = {}
    touched: set[ResourceId] = set()
    for run in newest_first:
        if run.id == startup:
            continue
        if run.kind is RunKind.STARTUP:
            if run.state is RunState.DONE:
                break  # what stopped before it was started again (or left off) by it
            continue
        for step in run.steps:
            if step.resource is None:
                continue
            resource = ResourceId(step.resource)
            first_look_off = step.state is StepState.DONE and step.already_there
            if first_look_off and not run.resumed:
                found[resource] = RunId(run.id)  # the oldest such run, read last
            else:
                touched.add(resource)
    return {resource: run for resource, run in found.items() if resource not in touched}
