#!/usr/bin/env python3
"""vSphere at scale against upsguard-vcsim: 1,000 VMs on 50 hosts.

Prints (1) the time and the number of API round trips to read the whole inventory,
and (2) the wall time of an orchestrated shutdown of all of it divided by the
plan's critical-path bound. Guests take ``--guest`` seconds to shut down (the
simulator's per-guest time) and ShutdownHost ``--host`` seconds (vcsim's
method delay), so the critical path is guest + host.

Targets: inventory in a constant number of round trips (not proportional to
VMs), under 2 s; shutdown within 1.10x of the critical path.

    python3 bench/vsphere_scale.py [--clusters 10 --hosts 5 --vms 100]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import resource
import sys
import tempfile
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyVmomi import vim
from tests.peers.vcsim import Vcsim, make_tls, start_vcsim, wait_task
from tests.runs import executor_for

from upsguard.clock import SystemClock
from upsguard.config.loading import load_site
from upsguard.engine.inventory import live_inventory
from upsguard.models import Direction, PlatformName
from upsguard.plugins.registry import build_platforms
from upsguard.runbooks.planner import Planner


def timeline(events: list[Any]) -> str:
    """When VM and host steps started and finished, in seconds from the run's start."""
    if not events:
        return ""
    t0 = events[0].at
    marks: dict[str, list[float]] = {}
    for e in events:
        step = getattr(e, "step", "")
        if not step:
            continue
        kind = "host" if step.startswith("stop:DC0") else "vm"
        marks.setdefault(f"{kind} {e.kind}", []).append((e.at - t0).total_seconds())
    return "; ".join(f"{k} {min(v):.1f}-{max(v):.1f} s" for k, v in sorted(marks.items()))


def cpu_seconds(pid: int) -> float:
    """User plus system CPU time of a process, from /proc."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def power_on_all(sim: Vcsim) -> int:
    """vcsim starts 1,000 VMs much faster by API than with -autostart (see TEST-PEERS.md)."""
    vms = sim.all(vim.VirtualMachine)
    with ThreadPoolExecutor(16) as pool:
        tasks = list(pool.map(lambda vm: vm.PowerOnVM_Task(), vms))
        list(pool.map(wait_task, tasks))
    return len(vms)


def write_site(sim: Vcsim, directory: Path, guest_s: float, host_s: float, watch: str) -> Path:
    hosts = sorted(h.name for h in sim.all(vim.HostSystem))
    site = {
        "site": "scale",
        "journal": str(directory / "journal.sqlite"),
        "ups": [{"name": "ups-a", "simulated": {}}],
        "platforms": {
            "vc": sim.settings_dict(
                directory, max_parallel=1000, watch=watch, poll_interval="100ms"
            )
        },
        "resources": [
            {
                "id": "all-vms",
                "kind": "vm_group",
                "platform": "vc",
                "select": {"name": "*"},
                "estimate": {"stop": f"{guest_s}s"},
                "guest_timeout": f"{guest_s * 4}s",
            },
            *(
                {"id": h, "kind": "host", "platform": "vc", "estimate": {"stop": f"{host_s}s"}}
                for h in hosts
            ),
        ],
    }
    path = directory / "site.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return path


async def measure(site_path: Path) -> dict[str, Any]:
    site = load_site(site_path)
    platforms = build_platforms(site, SystemClock())
    vc: Any = platforms[PlatformName("vc")]
    await vc.open()
    try:
        start = time.perf_counter()
        snap = await vc.inventory()
        inventory_s = time.perf_counter() - start
        inventory = await live_inventory(site, platforms)
        plan = Planner(site, inventory).plan(Direction.SHUTDOWN)
        events: list[Any] = []
        executor = executor_for(plan, platforms, SystemClock(), events.append)
        trips0 = vc.manager.conn.round_trips
        start = time.perf_counter()
        result = await executor.run()
        shutdown_s = time.perf_counter() - start
        return {
            "vms": len(snap.vms),
            "hosts": len(snap.hosts),
            "inventory_s": inventory_s,
            "round_trips": snap.round_trips,
            "shutdown_s": shutdown_s,
            "critical_path_s": plan.critical_path_s,
            "steps": len(plan.steps),
            "state": result.outcome,
            "failed": [o.detail for o in result.failed][:3],
            "timeline": timeline(events),
            "shutdown_round_trips": vc.manager.conn.round_trips - trips0,
        }
    finally:
        await vc.close()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--clusters", type=int, default=10)
    ap.add_argument("--hosts", type=int, default=5, help="hosts per cluster")
    ap.add_argument("--vms", type=int, default=100, help="VMs per cluster")
    ap.add_argument("--guest", type=float, default=10.0, help="guest shutdown seconds")
    ap.add_argument("--host", type=float, default=5.0, help="ShutdownHost seconds")
    ap.add_argument(
        "--watch",
        choices=["poll", "updates"],
        default="poll",
        help="the platform's watch mode (vcsim re-reads an update filter's every object on "
        "every change anywhere: 'updates' is quadratic at this scale, ratio about 5)",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        sim = start_vcsim(
            make_tls(directory / "tls"),
            *("-dc", "1", "-cluster", str(args.clusters), "-host", str(args.hosts)),
            *("-vm", str(args.vms), "-standalone-host", "0", "-autostart=false"),
            *("-guest-shutdown-ms", str(int(args.guest * 1000))),
            *("-method-delay", f"ShutdownHost:{int(args.host * 1000)}"),
        )
        try:
            started = power_on_all(sim)
            sim_cpu0, own_cpu0 = (
                cpu_seconds(sim.process.pid),
                resource.getrusage(resource.RUSAGE_SELF),
            )
            figures = asyncio.run(
                measure(write_site(sim, directory, args.guest, args.host, args.watch))
            )
            sim_cpu = cpu_seconds(sim.process.pid) - sim_cpu0
            own = resource.getrusage(resource.RUSAGE_SELF)
            own_cpu = own.ru_utime + own.ru_stime - own_cpu0.ru_utime - own_cpu0.ru_stime
        finally:
            sim.stop()
    ratio = figures["shutdown_s"] / figures["critical_path_s"]
    print(f"vcsim: {figures['vms']} VMs ({started} powered on) on {figures['hosts']} hosts")
    print(
        f"inventory: {figures['inventory_s']:.2f} s, {figures['round_trips']} round trips "
        f"(target: constant, < 2 s)"
    )
    print(
        f"shutdown: {figures['steps']} steps, {figures['shutdown_s']:.2f} s wall, "
        f"critical path {figures['critical_path_s']:.2f} s, ratio {ratio:.3f} (target <= 1.10), "
        f"run {figures['state']}"
    )
    print(
        f"watch ({args.watch}): {figures['shutdown_round_trips']} API requests during the "
        f"shutdown for {figures['steps']} steps"
    )
    print(f"timeline: {figures['timeline']}")
    print(f"cpu during the run: vcsim {sim_cpu:.1f} s, upsguard {own_cpu:.1f} s")
    if figures["failed"]:
        print("failed:", *figures["failed"], sep="\n  ")
    return 0


if __name__ == "__main__":
    sys.exit(main())
