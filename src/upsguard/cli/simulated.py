"""``simulate --report FILE``: the retrospective of a dry run, drawn like a real run's.

The dry run's events go into a journal of its own (a temporary file, as the demo's), and
the story is read back from it by the same code that reads the service's journal: a
simulated outage and a real one read alike. What only a dry run knows (its verdict, each
cache's dirty bytes as it drained) is added from the simulation's report.
"""

from __future__ import annotations

import tempfile
from dataclasses import replace
from pathlib import Path

from upsguard.cli.reports import with_battery_model, write_output
from upsguard.clock import run_virtual
from upsguard.config.scenario import Scenario
from upsguard.config.site import SiteConfig
from upsguard.journal import Journal
from upsguard.journal.learned import learned_or_none
from upsguard.journal.retrospective import story_from_journal
from upsguard.reports import render
from upsguard.reports.story import DRAIN_READING, CacheSample, Story
from upsguard.runbooks.planner import Planner
from upsguard.simulation.simulator import ORIGIN, Simulation, SimulationReport


def simulated_report(
    site: SiteConfig, scenario: Scenario, planner: Planner, output: Path
) -> SimulationReport:
    """Runs the dry run (with ``planner``'s durations), writes its report to ``output``."""
    with tempfile.TemporaryDirectory(prefix="upsguard-simulate-") as tmp:
        journal = Journal(Path(tmp) / "simulation.sqlite")
        try:
            simulation = Simulation(site, scenario, planner, observers=[journal.write.record])
            outcome = run_virtual(simulation.run())
            runs = journal.read.runs(limit=1000)
            title = f"Simulated outage: scenario {scenario.name}"
            story = story_from_journal(
                journal,
                site,
                runs,
                title=title,
                source="simulation",
                planned_with=planner.durations,
                learned=learned_or_none(site.journal) or {},
                origin=ORIGIN,
            )
        finally:
            journal.close()
    story = with_battery_model(site, _with_simulation(story, outcome))
    fmt = "md" if output.suffix.lower() in (".md", ".markdown") else "html"
    write_output(render.report(story, fmt, ok=outcome.ok), output)
    return outcome


def _with_simulation(story: Story, outcome: SimulationReport) -> Story:
    """The verdict, and the dirty bytes the destage watch read. The story counts its T+ from
    the start of the scenario (``ORIGIN``), as the verdict and simulate's timeline do: one
    T+ for all three."""
    drained = [
        CacheSample(s.cache, s.at_s, s.dirty_bytes, DRAIN_READING) for s in outcome.cache_samples
    ]
    caches = sorted((*story.caches, *drained), key=lambda c: c.at_s)
    notes = (
        *story.notes,
        "A dry run: the UPS readings are the battery model's own, and every platform is simulated.",
    )
    return replace(story, verdict=outcome.verdict, caches=tuple(caches), notes=notes)
