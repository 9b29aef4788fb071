"""``report``, ``runbook`` and ``battery``: what the journal and the site file tell a person
after an outage, and before the next one.

The CLI is where the two sides meet: the controller reads the journal into a story, the
simulation's battery model is fitted to it, and ``upsguard.reports`` renders it.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import asdict, replace
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from upsguard.cli.common import Subparsers, add_format_option, add_site_option, site_of
from upsguard.errors import PermanentError
from upsguard.models import LinkState
from upsguard.reports import FORMATS

if TYPE_CHECKING:
    from upsguard.config.site import SiteConfig
    from upsguard.journal import Journal
    from upsguard.journal.checkups import BatteryTestRow
    from upsguard.journal.outages import Outage
    from upsguard.reports.story import BatteryFit, BatterySample, Story
    from upsguard.runbooks.plan import Durations

CACHE_NOTE = (
    "The journal keeps when each cache was flipped and when it was clean, not its dirty "
    "bytes along the way: a real run's drain is shown by its events."
)


def register(commands: Subparsers) -> None:
    p = commands.add_parser("report", help="the retrospective of an outage, from the journal")
    p.add_argument("run", nargs="?", metavar="RUN_ID", help="one run alone (as --run)")
    p.add_argument("--run", dest="run_option", metavar="RUN_ID", help="one run alone")
    p.add_argument(
        "--last",
        action="store_true",
        help="the last outage: mains failure, shutdown, return of power, startup (the default)",
    )
    add_site_option(p)
    add_format_option(p, *FORMATS)
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(handler=cmd_report)

    p = commands.add_parser("runbook", help="the printable run book: order, actions, by hand")
    add_site_option(p)
    add_format_option(p, *FORMATS)
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    add_durations_option(p)
    p.set_defaults(handler=cmd_runbook)

    p = commands.add_parser("battery", help="each UPS's observed runtime against the model")
    add_site_option(p)
    add_format_option(p)
    p.set_defaults(handler=cmd_battery)


def add_durations_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--durations",
        choices=("configured", "learned"),
        help="step durations: the site file's, or learned from the journal's past runs "
        "(default: learned when the journal has any)",
    )


def durations_of(args: argparse.Namespace, site: SiteConfig) -> Durations | None:
    """The durations ``--durations`` asks for; learned ones only where the journal has some."""
    from upsguard.journal.learned import learned_or_none

    if args.durations == "configured":
        return None
    learned = learned_or_none(site.journal)
    if learned is None and args.durations == "learned":
        print(
            f"upsguard: no finished step in the journal {site.journal}: "
            "planning with the configured durations",
            file=sys.stderr,
        )
    return learned


def write_output(text: str, output: Path | None, what: str = "the report") -> None:
    """``text`` to ``output`` (stdout without one); a file that cannot be written (a folder
    that is not there, a folder, /proc) is one line naming it, not a traceback."""
    if output is None:
        print(text, end="" if text.endswith("\n") else "\n")
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise PermanentError(f"{output}: cannot write {what} ({exc.strerror or exc})") from exc


def cmd_report(args: argparse.Namespace) -> int:
    """One outage (``--last``, the default) or one run alone (``--run``)."""
    from upsguard.journal.outages import last_outage
    from upsguard.journal.retrospective import pick_runs, story_from_journal
    from upsguard.reports import render

    site = site_of(args)
    if args.run is not None and args.run_option is not None and args.run != args.run_option:
        raise PermanentError("give the RUN_ID once: as an argument or with --run")
    run_id = args.run or args.run_option
    if run_id is not None and args.last:
        raise PermanentError("give a RUN_ID or --last, not both")
    journal = open_existing(site)
    try:
        if run_id is not None:
            runs = pick_runs(journal, run_id)
            title = f"Outage report: {runs[0].kind} run {runs[0].id}"
            story = story_from_journal(journal, site, runs, title=title, source="journal")
        else:
            outage = last_outage(journal)
            if outage is None:
                raise PermanentError(f"journal {journal.path}: no outage and no run yet")
            story = story_from_journal(
                journal,
                site,
                outage.runs,
                title=outage_title(outage),
                source="journal",
                outage=outage,
            )
    finally:
        journal.close()
    story = with_battery_model(site, story)
    if story.caches:
        story = replace(story, notes=(*story.notes, CACHE_NOTE))
    write_output(render.report(story, args.format), args.output)
    return 0


def outage_title(outage: Outage) -> str:
    """The mains failure's time, or (a drill, a manual run) the runs it holds."""
    if outage.mains_failed is not None:
        return f"Outage report: mains failure at {outage.mains_failed:%Y-%m-%d %H:%M:%S} UTC"
    runs = ", ".join(f"{r.kind} run {r.id}" for r in outage.runs)
    return f"Outage report: {runs or f'from {outage.started:%Y-%m-%d %H:%M:%S} UTC'}"


def open_existing(site: SiteConfig) -> Journal:
    from upsguard.journal import Journal
    from upsguard.journal.file import journal_exists

    if not journal_exists(site.journal):
        raise PermanentError(
            f"journal {site.journal} does not exist: no run to report yet "
            "(is -c the site file the service runs with?)"
        )
    return Journal(site.journal, read_only=True)


def with_battery_model(site: SiteConfig, story: Story) -> Story:
    from upsguard.simulation import battery_fit

    samples, fits = battery_fit.fit(site, story.battery)
    return replace(story, battery=tuple(samples), battery_fits=tuple(fits))


def cmd_runbook(args: argparse.Namespace) -> int:
    from upsguard.reports import render
    from upsguard.reports.runbook import build_runbook
    from upsguard.runbooks.planner import Planner

    site = site_of(args)
    planner = Planner(site, durations=durations_of(args, site))
    book = build_runbook(site, planner, datetime.now(UTC))
    write_output(render.runbook(book, args.format), args.output)
    return 0


def cmd_battery(args: argparse.Namespace) -> int:
    from upsguard.journal.checkups import battery_tests
    from upsguard.journal.rows import parse_iso
    from upsguard.reports.story import BatterySample
    from upsguard.simulation import battery_fit

    site = site_of(args)
    journal = open_existing(site)
    try:
        rows = list(reversed(journal.read.readings(limit=100_000)))
        tests = battery_tests(journal.db, limit=50)
    finally:
        journal.close()
    rows = [r for r in rows if r.link is LinkState.OK]
    origin = parse_iso(rows[0].at) if rows else datetime.now(UTC)
    samples = [
        BatterySample(
            ups=r.ups,
            at_s=(parse_iso(r.at) - origin).total_seconds(),
            charge_pct=r.charge,
            runtime_s=r.runtime,
            load_pct=r.load,
            on_battery="OB" in r.status.split(),
        )
        for r in rows
    ]
    modelled, fits = battery_fit.fit(site, samples)
    if args.format == "json":
        out: dict[str, Any] = {
            "fits": [asdict(f) for f in fits],
            "on_battery": [asdict(s) for s in modelled if s.on_battery],
            "battery_tests": [_test_json(t) for t in tests],
        }
        print(json.dumps(out, indent=2))
        return 0
    print(_battery_text(site, modelled, fits))
    for line in _tests_text(tests):
        print(line)
    return 0


def _test_json(test: BatteryTestRow) -> dict[str, Any]:
    from upsguard.journal.rows import iso

    out = asdict(test)
    out.update(started=iso(test.started), ended=iso(test.ended), state=test.state.value)
    return out


def _tests_text(tests: list[BatteryTestRow]) -> list[str]:
    """The battery tests the service ran, newest first, with a deep test's observed runtime."""
    from upsguard.config.types import format_duration
    from upsguard.journal.rows import iso

    if not tests:
        return []
    lines = ["battery tests (newest first):"]
    for t in tests:
        charge = ""
        if t.charge_start is not None and t.charge_end is not None:
            charge = f", charge {t.charge_start:.0f} % -> {t.charge_end:.0f} %"
        observed = t.runtime_observed_s
        runtime = f", runtime observed {format_duration(observed)}" if observed else ""
        result = f"{t.kind} test {t.state.value} ({t.text})"
        lines.append(f"  {iso(t.started)}  {t.ups}: {result}{charge}{runtime}")
    return lines


def _battery_text(site: SiteConfig, samples: list[BatterySample], fits: list[BatteryFit]) -> str:
    from upsguard.config.types import format_duration

    if not fits:
        return f"no UPS of site {site.site} has been on battery in the journal {site.journal}"
    lines = []
    for f in fits:
        lines.append(f"{f.ups}: {f.verdict}")
        if f.suggestion:
            lines.append(f"  suggested: {f.suggestion}")
        mine = [s for s in samples if s.ups == f.ups and s.on_battery][-10:]
        if mine:
            lines.append("  last readings on battery: charge, runtime observed / model, load")
        for s in mine:
            charge = f"{s.charge_pct:.0f} %" if s.charge_pct is not None else "?"
            runtime = format_duration(s.runtime_s) if s.runtime_s is not None else "?"
            model = format_duration(s.model_runtime_s) if s.model_runtime_s is not None else "?"
            load = f"{s.load_pct:.0f} %" if s.load_pct is not None else "?"
            lines.append(f"    {charge:>6}  {runtime:>7} / {model:<7}  {load}")
    return "\n".join(lines)
