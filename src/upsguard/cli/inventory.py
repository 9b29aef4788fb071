"""``upsguard inventory``: what each platform sees, and which resource covers each VM.

For every platform that can list its inventory (vSphere), it shows datacenters,
clusters, hosts and VMs (power, VMware Tools, host, folder, custom attributes)
and the site resource each VM belongs to. VMs that no resource covers are listed
as *unplanned*: in an outage they get the site's default policy, so nothing is
forgotten. System VMs (vCLS) are shown but never unplanned. A resource that
cannot be resolved (a missing VM, a bad selector) is reported on its own line
and the command ends non-zero.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import TYPE_CHECKING, Any

from upsguard.cli.common import Subparsers, add_format_option, add_site_option, run_async, site_of
from upsguard.errors import PermanentError, TemporaryError
from upsguard.models import PlatformName, ResourceKind

if TYPE_CHECKING:
    from rich.console import RenderableType

    from upsguard.config.site import SiteConfig
    from upsguard.plugins.platforms.base import Platform


def register(commands: Subparsers) -> None:
    """Add ``inventory``."""
    p = commands.add_parser(
        "inventory",
        help="what the platforms see, which resource covers each VM, and unplanned VMs",
    )
    add_site_option(p)
    add_format_option(p)
    p.add_argument("platforms", nargs="*", metavar="PLATFORM", help="platforms (default: all)")
    p.set_defaults(handler=cmd_inventory)


def cmd_inventory(args: argparse.Namespace) -> int:
    from upsguard.cli import output

    site = site_of(args)
    reports = run_async(collect(site, args.platforms))
    if args.format == "json":
        print(json.dumps(reports, indent=2, sort_keys=True))
    else:
        output.show(*(part for r in reports for part in report_parts(r)))
    problems = [p for r in reports for p in r["problems"]]
    for problem in problems:
        print(f"upsguard: {problem}", file=sys.stderr)
    return 1 if problems else 0


async def collect(site: SiteConfig, only: list[str]) -> list[dict[str, Any]]:
    """One report per platform that lists inventory, with resource coverage filled in."""
    from upsguard.clock import SystemClock
    from upsguard.plugins.platforms.base import InventorySource
    from upsguard.plugins.registry import build_platforms

    platforms = build_platforms(site, SystemClock())
    chosen = {n: p for n, p in platforms.items() if isinstance(p, InventorySource)}
    if only:
        unknown = sorted(set(only) - set(chosen))
        if unknown:
            raise PermanentError(
                f"no platform with an inventory named {', '.join(unknown)} "
                f"(these have one: {', '.join(sorted(chosen)) or 'none'})"
            )
        chosen = {n: p for n, p in chosen.items() if n in only}
    reports = []
    for name, platform in chosen.items():
        try:
            await platform.open()
            reports.append(await _report(site, name, platform))
        finally:
            await platform.close()
    return reports


async def _report(site: SiteConfig, name: PlatformName, platform: Platform) -> dict[str, Any]:
    from upsguard.plugins.platforms.base import InventorySource

    assert isinstance(platform, InventorySource)
    report = await platform.inventory_report()
    covered: dict[str, list[str]] = {}
    problems: list[str] = []
    for res in site.resources:
        if res.platform != name or res.kind not in (ResourceKind.VM, ResourceKind.VM_GROUP):
            continue
        try:
            targets = await platform.resolve(res)
        except (PermanentError, TemporaryError) as exc:
            problems.append(str(exc))
            continue
        for target in targets:
            covered.setdefault(target.ref or target.name, []).append(res.id)
    for vm in report["vms"]:
        vm["resources"] = covered.get(vm["ref"], [])
        vm["unplanned"] = not vm["resources"] and not vm["system"]
    report["unplanned"] = [vm["name"] for vm in report["vms"] if vm["unplanned"]]
    report["problems"] = problems
    return report


def report_parts(report: dict[str, Any]) -> list[RenderableType]:
    """One platform's report: a summary, the hosts, the VMs and what no resource covers."""
    from upsguard.cli import output

    hosts, vms = report["hosts"], report["vms"]
    summary = "\n".join(
        [
            f"platform {report['platform']} ({report['address']}): "
            f"{len(report['datacenters'])} datacenter(s), {len(report['clusters'])} cluster(s), "
            f"{len(hosts)} host(s), {len(vms)} VM(s)",
            f"datacenters: {', '.join(report['datacenters']) or '-'}",
            f"clusters:    {', '.join(report['clusters']) or '-'}",
        ]
    )
    host_table = output.table(
        ["HOST", "POWER", "CONNECTION", "MAINTENANCE", "CLUSTER"],
        [
            [
                h["name"],
                h["power"],
                h["connection"],
                "yes" if h["maintenance"] else "no",
                h["cluster"] or "-",
            ]
            for h in hosts
        ],
    )
    vm_table = output.table(
        ["VM", "POWER", "TOOLS", "HOST", "FOLDER", "ATTRIBUTES", "RESOURCE"],
        [
            [
                vm["name"],
                vm["power"],
                _tools(vm["tools"]),
                vm["host"] or "-",
                vm["folder"] or "-",
                ",".join(f"{k}={v}" for k, v in sorted(vm["attributes"].items())) or "-",
                _covered_by(vm),
            ]
            for vm in vms
        ],
    )
    unplanned = report["unplanned"]
    if unplanned:
        verdict = (
            f"unplanned: {len(unplanned)} VM(s) no resource covers; they get the site's "
            f"default policy: {', '.join(unplanned)}"
        )
    else:
        verdict = "unplanned: none, every VM is covered by a resource"
    return [summary, host_table, vm_table, verdict]


def _tools(status: str) -> str:
    return {
        "guestToolsRunning": "running",
        "guestToolsNotRunning": "not running",
        "guestToolsExecutingScripts": "starting",
    }.get(status, status)


def _covered_by(vm: dict[str, Any]) -> str:
    if vm["resources"]:
        return ",".join(vm["resources"])
    return "(system)" if vm["system"] else "UNPLANNED"
