"""``doctor`` and ``drill``: knowing before the outage whether the plan will work.

``doctor`` checks what every step needs (logins, rights, commands, files, the live plan) and
prints one table, ok, warn or fail with a fix for each; it exits 1 on any fail, naming each
on stderr in one line. ``drill`` rehearses the shutdown plan read-only. Neither changes
anything on the site (``--notify`` sends one test message, as asked).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import asdict
from typing import TYPE_CHECKING, Any

from upsguard.cli.common import (
    Subparsers,
    add_format_option,
    add_site_option,
    duration_seconds,
    run_async,
    site_of,
)
from upsguard.errors import ConfigError
from upsguard.units import counted

if TYPE_CHECKING:
    from rich.table import Table

    from upsguard.config.site import SiteConfig
    from upsguard.doctor.checkup import Checkup, Selection
    from upsguard.doctor.drill import Drill
    from upsguard.findings import Finding


def register(commands: Subparsers) -> None:
    p = commands.add_parser(
        "doctor", help="check every login, right, command and file the plan needs; exit 1 on a fail"
    )
    add_site_option(p)
    add_format_option(p)
    p.add_argument(
        "--only",
        nargs="+",
        default=[],
        metavar="WHAT",
        help="only these: areas (ups, platform, resource, cache, store, file, notify, web, plan) "
        "or names of UPSes, platforms, resources and caches",
    )
    p.add_argument(
        "--notify",
        action="store_true",
        help="also send a test message through the hook, the webhook and each Apprise channel",
    )
    _timeout_option(p, None, "the longest one check may take (default: checks.timeout, or 30s)")
    p.set_defaults(handler=cmd_doctor)

    p = commands.add_parser(
        "drill", help="rehearse the shutdown read-only: what each step would do, or fail on"
    )
    add_site_option(p)
    add_format_option(p)
    _timeout_option(p, 30.0, "the longest one step's reads may take (default 30s)")
    p.set_defaults(handler=cmd_drill)


def _timeout_option(p: argparse.ArgumentParser, default: float | None, help: str) -> None:
    p.add_argument(
        "--timeout", type=duration_seconds, default=default, metavar="DURATION", help=help
    )


def cmd_doctor(args: argparse.Namespace) -> int:
    from upsguard.cli import output
    from upsguard.clock import SystemClock
    from upsguard.controller.notify import Notifier
    from upsguard.doctor.checkup import run_checkup
    from upsguard.findings import Verdict

    if not args.verbose:  # the table says what failed; the SDKs' own logs would say it twice
        logging.getLogger().setLevel(logging.CRITICAL)
    site = site_of(args)
    only = selection(site, args.only)
    timeout = args.timeout
    if timeout is None:
        timeout = site.checks.timeout.total_seconds() if site.checks else 30.0
    notifier = Notifier(site.service.notify, site.site, policies=site.policies)
    checkup = run_async(
        run_checkup(
            site,
            SystemClock(),
            timeout_s=timeout,
            only=only,
            notify=notifier.test if args.notify else None,
            channels=notifier.check if site.service.notify.apprise else None,
        )
    )
    if args.format == "json":
        print(json.dumps(checkup_json(site, checkup), indent=2))
    else:
        output.show(findings_table(checkup.findings), f"doctor: {checkup.summary()}")
    for finding in checkup.findings:
        if finding.verdict is Verdict.FAIL:
            print(f"upsguard: {fault_line(finding)}", file=sys.stderr)
    return checkup.exit_code


def selection(site: SiteConfig, words: list[str]) -> Selection:
    """``--only``: areas and entry names; an unknown word is a ConfigError naming the known."""
    from upsguard.doctor.checkup import Selection
    from upsguard.findings import Area
    from upsguard.plugins import registry

    areas = {a.value for a in Area}
    names = {
        *(u.name for u in site.ups),
        *registry.used_platform_names(site),
        *(r.id for r in site.resources),
        *(c.name for c in site.caches),
    }
    unknown = [w for w in words if w not in areas and w not in names]
    if unknown:
        raise ConfigError(
            f"--only: no area or entry named {', '.join(unknown)} (areas: "
            f"{', '.join(sorted(areas))}; entries: {', '.join(sorted(names))})"
        )
    return Selection(
        frozenset(w for w in words if w in areas), frozenset(w for w in words if w not in areas)
    )


def subject(finding: Finding) -> str:
    return f"{finding.area.value} {finding.subject}"


def fault_line(finding: Finding) -> str:
    """One line naming a fault and what to do: what ``doctor`` prints on stderr for a fail."""
    fix = f" -> {finding.fix}" if finding.fix else ""
    head = f"{finding.verdict.value.upper()} {subject(finding)}: {finding.check}"
    return f"{head}: {finding.detail}{fix}"


def findings_table(findings: tuple[Finding, ...] | list[Finding]) -> Table:
    from upsguard.cli import output

    rows = [
        [
            f.verdict.value,
            subject(f),
            f.check,
            "-" if f.took_s is None else f"{f.took_s:.1f}s",
            f.detail + (f" -> fix: {f.fix}" if f.fix else ""),
        ]
        for f in findings
    ]
    return output.table(["STATE", "WHAT", "CHECK", "TOOK", "FOUND"], rows)


def finding_json(finding: Finding) -> dict[str, Any]:
    out = asdict(finding)
    out["area"] = finding.area.value
    out["verdict"] = finding.verdict.value
    out["missing"] = list(finding.missing)
    return out


def checkup_json(site: SiteConfig, checkup: Checkup) -> dict[str, Any]:
    from upsguard.config.types import format_duration

    return {
        "site": site.site,
        "at": checkup.at.isoformat(),
        "took_s": round(checkup.took_s, 3),
        "verdict": checkup.verdict.value,
        "summary": checkup.summary(),
        "findings": [finding_json(f) for f in checkup.findings],
        "took": format_duration(checkup.took_s),
    }


def cmd_drill(args: argparse.Namespace) -> int:
    from upsguard.cli import output
    from upsguard.clock import SystemClock
    from upsguard.doctor.drill import Would, run_drill

    if not args.verbose:
        logging.getLogger().setLevel(logging.CRITICAL)
    site = site_of(args)
    drill = run_async(run_drill(site, SystemClock(), args.timeout))
    if args.format == "json":
        out = {
            "site": site.site,
            "live_inventory": drill.live,
            "estimate_s": drill.estimate_s,
            "took_s": round(drill.took_s, 3),
            "steps": [{**asdict(s), "would": s.would.value} for s in drill.steps],
        }
        print(json.dumps(out, indent=2))
    else:
        output.show(drill_table(drill), drill_summary(drill))
    for step in drill.steps:
        if step.would is Would.FAIL:
            print(f"upsguard: {step.step} would fail: {step.detail}", file=sys.stderr)
    return drill.exit_code


def drill_table(drill: Drill) -> Table:
    from upsguard.cli import output

    rows = [
        [
            s.step,
            s.would.value,
            ", ".join(s.states) or "-",
            f"{s.read_s:.2f}s",
            s.detail,
        ]
        for s in drill.steps
    ]
    return output.table(["STEP", "WOULD", "NOW", "READ", "WHAT"], rows)


def drill_summary(drill: Drill) -> str:
    from upsguard.config.types import format_duration
    from upsguard.doctor.drill import Would

    tally = {w: sum(1 for s in drill.steps if s.would is w) for w in Would}
    longest = max((s.read_s for s in drill.steps), default=0.0)
    source = "live inventory" if drill.live else "the site file alone (no live inventory)"
    return (
        f"drill: {counted(len(drill.steps), 'step')}: {tally[Would.ACT]} would act, "
        f"{tally[Would.DONE]} already done, {tally[Would.FAIL]} would fail; planned from "
        f"{source}; the drill took {format_duration(drill.took_s)} (the slowest step's reads "
        f"{longest:.2f}s); the plan's estimate is {format_duration(drill.estimate_s)}.\n"
        "Nothing was stopped, and a drill teaches the plan no durations."
    )
