#!/usr/bin/env python3
"""vSphere at scale against upsguard-vcsim: 1,000 VMs on 50 hosts.

Prints (1) the time and the number of API round trips to read the whole inventory,
and (2) the wall time of an orchestrated shutdown of all of it divided by the
plan's critical-path bound. Guests take ``--guest`` seconds to shut down (the
simulator's per-guest time) and ShutdownHost ``--host`` seconds (vcsim's
method delay), so the critical path is guest + host.

Targets: inventory in a constant number of round trips (not proportional to
VMs), under 2 s; shutdown within 1.10x of the critical path.

With ``--pair`` the same shutdown also runs as the leader of a controller pair, on a second
vcsim with the same inventory and three etcd members on loopback (Debian's etcd-server,
tests/peers/etcd.py): every step is claimed first (the fenced write that records it
started), and every request and step end goes to the shared ledger, as in ``upsguard
run`` with ``ha:``. It prints the pair's wall time against the single controller's, both
measured in this run. Target: at most 1.05.

    python3 bench/vsphere_scale.py [--clusters 10 --hosts 5 --vms 100] [--pair]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
import resource
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pyVmomi import vim
from tests.peers.etcd import EtcdCluster, start_cluster
from tests.peers.vcsim import Vcsim, make_tls, start_vcsim, wait_task
from tests.runs import executor_for

from upsguard.clock import SystemClock
from upsguard.config.ha import HaConfig
from upsguard.config.loading import load_site
from upsguard.engine.inventory import live_inventory
from upsguard.engine.leadership import Leadership, Role
from upsguard.engine.pair import Pair
from upsguard.events import Event
from upsguard.models import Direction, PlatformName
from upsguard.plugins.coordination.base import Candidate
from upsguard.plugins.coordination.etcd import EtcdStore
from upsguard.plugins.registry import build_platforms
from upsguard.runbooks.plan import Step
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunSpec


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


@contextlib.asynccontextmanager
async def leading(cluster: EtcdCluster) -> AsyncIterator[Pair]:
    """This process as the leader of a pair on ``cluster``: its lease renewed, its writer of
    the shared ledger running, as ``upsguard run`` with ``ha:`` has them."""
    settings = HaConfig.model_validate(
        {"name": "bench", "endpoints": cluster.endpoints, "lease_ttl": "5s"}
    )
    store = EtcdStore("scale", settings)
    clock = SystemClock()
    leadership = Leadership(store, Candidate("bench"), ttl_s=5, fence_margin_s=1, clock=clock)
    pair = Pair(leadership, store, clock, members=len(cluster.endpoints))
    tasks = [asyncio.create_task(leadership.run()), asyncio.create_task(pair.write_in_order())]
    try:
        async with asyncio.timeout(30):
            while leadership.role is not Role.LEADER:
                await asyncio.sleep(0.01)
        yield pair
    finally:
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        if leadership.term is not None:
            await leadership.hand_over()
        await store.close()


async def measure(site_path: Path, cluster: EtcdCluster | None = None) -> dict[str, Any]:
    """One whole shutdown: by one controller, or by the leader of a pair on ``cluster``."""
    async with contextlib.AsyncExitStack() as stack:
        pair = await stack.enter_async_context(leading(cluster)) if cluster else None
        return await shut_down(site_path, pair)


async def shut_down(site_path: Path, pair: Pair | None) -> dict[str, Any]:
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

        def sink(event: Event) -> None:
            events.append(event)
            if pair is not None:
                pair.observe(event)

        async def claim(spec: RunSpec, step: Step) -> bool:
            assert pair is not None
            return await pair.claim(spec, step.id, step.resource)

        executor = executor_for(
            plan, platforms, SystemClock(), sink, claim=claim if pair is not None else None
        )
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
    ap.add_argument(
        "--pair",
        action="store_true",
        help="also as the leader of a pair on three etcd members, on a second vcsim",
    )
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(tmp)
        vcsim_args = (
            *("-dc", "1", "-cluster", str(args.clusters), "-host", str(args.hosts)),
            *("-vm", str(args.vms), "-standalone-host", "0", "-autostart=false"),
            *("-guest-shutdown-ms", str(int(args.guest * 1000))),
            *("-method-delay", f"ShutdownHost:{int(args.host * 1000)}"),
        )
        sim = start_vcsim(make_tls(directory / "tls"), *vcsim_args)
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
        paired = measure_pair(directory / "pair", vcsim_args, args) if args.pair else None
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
    if paired is not None:
        print(
            f"pair: the leader on 3 etcd members (loopback), {paired['steps']} steps, "
            f"{paired['shutdown_s']:.2f} s wall, critical path {paired['critical_path_s']:.2f} s, "
            f"run {paired['state']}"
        )
        print(f"pair timeline: {paired['timeline']}")
        print(
            f"pair / one controller, shutdown wall time: "
            f"{paired['shutdown_s'] / figures['shutdown_s']:.3f} (target <= 1.05)"
        )
        if paired["failed"]:
            print("pair failed:", *paired["failed"], sep="\n  ")
    return 0


def measure_pair(directory: Path, vcsim_args: tuple[str, ...], args: Any) -> dict[str, Any]:
    """The same shutdown by the leader of a pair: a fresh vcsim with the same inventory (the
    first one's hosts are down), and three etcd members."""
    logging.getLogger("upsguard").setLevel(logging.ERROR)  # each change of role is logged
    directory.mkdir()
    cluster = start_cluster(directory / "etcd")
    sim = start_vcsim(make_tls(directory / "tls"), *vcsim_args)
    try:
        power_on_all(sim)
        site = write_site(sim, directory, args.guest, args.host, args.watch)
        return asyncio.run(measure(site, cluster))
    finally:
        sim.stop()
        cluster.close()


if __name__ == "__main__":
    sys.exit(main())
