"""``validate``, ``schema``, ``plan`` and ``simulate``: working with the site file offline."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

from upsguard.cli.common import (
    Subparsers,
    add_format_option,
    add_site_option,
    run_async,
    site_of,
)
from upsguard.cli.reports import add_durations_option, durations_of, write_output
from upsguard.units import counted

if TYPE_CHECKING:
    from upsguard.config.site import SiteConfig
    from upsguard.engine.inventory import LiveInventory


def register(commands: Subparsers) -> None:
    p = commands.add_parser("validate", help="check a site file; every problem with file:line")
    add_site_option(p)
    p.set_defaults(handler=cmd_validate)

    p = commands.add_parser("schema", help="print the JSON Schema of the site file")
    p.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    p.set_defaults(handler=cmd_schema)

    p = commands.add_parser("plan", help="show the ordered shutdown or startup plan")
    p.add_argument("direction", choices=("shutdown", "startup"))
    add_site_option(p)
    add_format_option(p, "text", "json", "dot", "mermaid")
    p.add_argument("--live", action="store_true", help="expand VM groups from live inventory")
    add_durations_option(p)
    p.set_defaults(handler=cmd_plan)

    p = commands.add_parser("simulate", help="dry-run an outage on a virtual clock")
    add_site_option(p)
    p.add_argument("--scenario", type=Path, help="scenario file (default: mains fail for good)")
    add_format_option(p)
    add_durations_option(p)
    p.add_argument(
        "--report",
        type=Path,
        metavar="FILE",
        help="also write the retrospective of the dry run (FILE.html, or .md for Markdown)",
    )
    p.set_defaults(handler=cmd_simulate)


@contextlib.contextmanager
def _told_by_the_timeline(verbose: int) -> Iterator[None]:
    """A dry run tells what happens on its timeline, on the virtual clock. The log records of
    the same things (a UPS that cannot be read, a step that failed) would say them again on
    stderr, stamped with the wall clock of a run that took a second: they are left to ``-v``.
    Errors still show. The logger's level is restored after (the CLI may run in a caller's
    process)."""
    logger = logging.getLogger("upsguard")
    before = logger.level
    if not verbose:
        logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(before)


def cmd_validate(args: argparse.Namespace) -> int:
    from upsguard.config.checks import site_warnings
    from upsguard.runbooks.planner import Planner

    site = site_of(args)
    shutdown = Planner(site).plan("shutdown")
    for loc, message in site_warnings(site):
        print(f"upsguard: warning: {site.problem(loc, message)}", file=sys.stderr)
    print(
        f"{args.config}: ok: site '{site.site}', {counted(len(site.ups), 'UPS', 'UPS')}, "
        f"{counted(len(site.resources), 'resource')}, {counted(len(site.caches), 'cache')}, "
        f"shutdown plan of {counted(len(shutdown.steps), 'step')}"
    )
    return 0


def schema_text() -> str:
    from upsguard.config.site import SiteConfig

    schema = SiteConfig.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "upsguard site file"
    return json.dumps(schema, indent=2, sort_keys=True) + "\n"


def cmd_schema(args: argparse.Namespace) -> int:
    write_output(schema_text(), args.output, "the schema")
    return 0


def cmd_plan(args: argparse.Namespace) -> int:
    from upsguard.runbooks import render
    from upsguard.runbooks.planner import Planner

    site = site_of(args)
    live = run_async(_inventory(site)) if args.live else None
    durations = durations_of(args, site)
    planner = Planner(
        site,
        live.targets if live else None,
        live.unplanned if live else None,
        durations=durations,
    )
    plan = planner.plan(args.direction)
    output = {
        "text": render.plan_text,
        "json": render.plan_json,
        "dot": render.plan_dot,
        "mermaid": render.plan_mermaid,
    }[args.format](plan)
    print(output)
    return 0


async def _inventory(site: SiteConfig) -> LiveInventory:
    from upsguard.clock import SystemClock
    from upsguard.engine.inventory import read_inventory
    from upsguard.plugins.registry import build_platforms

    platforms = build_platforms(site, SystemClock())
    try:
        for platform in platforms.values():
            await platform.open()
        return await read_inventory(site, platforms)
    finally:
        for platform in platforms.values():
            await platform.close()


def cmd_simulate(args: argparse.Namespace) -> int:
    from upsguard.cli.simulated import simulated_report
    from upsguard.config.scenario import load_scenario
    from upsguard.runbooks.planner import Planner
    from upsguard.simulation import report
    from upsguard.simulation.simulator import simulate

    site = site_of(args)
    scenario = load_scenario(args.scenario, site)
    planner = Planner(site, durations=durations_of(args, site))
    with _told_by_the_timeline(args.verbose):
        if args.report is None:
            outcome = simulate(site, scenario, planner)
        else:
            outcome = simulated_report(site, scenario, planner, args.report)
    print(report.report_json(outcome) if args.format == "json" else report.report_text(outcome))
    return outcome.exit_code
