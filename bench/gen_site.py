#!/usr/bin/env python3
"""Write a valid synthetic site: N VMs spread over H hosts, with dependencies, caches, two UPSes.

Usage: ``python3 bench/gen_site.py --vms 5000 --hosts 200 > /tmp/big.yaml``
"""

from __future__ import annotations

import argparse
import random
import sys


def site_text(vms: int, hosts: int, seed: int = 7) -> str:
    rng = random.Random(seed)
    lines = [
        "site: synthetic",
        "ups:",
        "  - {name: ups-a, simulated: {}, runtime_at: {minutes: 25, load_watts: 60000}}",
        "  - {name: ups-b, simulated: {}, runtime_at: {minutes: 25, load_watts: 60000}}",
        "platforms:",
        "  vc: {type: simulated, max_parallel: 200, guest_shutdown: 40s, host_shutdown: 2m}",
        "  bmc: {type: simulated, max_parallel: 32}",
        "  storage: {type: simulated, max_parallel: 4, device_shutdown: 3m}",
        "feeds:",
        "  - {ups: [ups-a, ups-b], min_supplies: 1, powers: ["
        + ", ".join([f"esx{h:03d}" for h in range(hosts)] + ["san1", "san2", "core-sw"])
        + "]}",
        "caches:",
        "  - {name: flash, provider: simulated, dirty: 8GiB, destage_rate: 400MiB/s,"
        " carries: [vm00000, vm00001]}",
        "resources:",
        "  - {id: san1, kind: storage, platform: storage, watts: 900, depends_on: [core-sw]}",
        "  - {id: san2, kind: storage, platform: storage, watts: 900, depends_on: [core-sw]}",
        "  - {id: core-sw, kind: switch, watts: 300}",
    ]
    for h in range(hosts):
        san = "san1" if h % 2 == 0 else "san2"
        lines.append(
            f"  - {{id: esx{h:03d}, kind: host, platform: vc, power_on_via: bmc, watts: 250,"
            f" depends_on: [{san}]}}"
        )
    tiers = max(1, vms // 50)
    for v in range(vms):
        host = f"esx{v % hosts:03d}"
        deps = []
        if v >= tiers and rng.random() < 0.6:  # a VM needs one or two of an earlier tier
            deps = sorted({f"vm{rng.randrange(0, tiers):05d}" for _ in range(rng.randint(1, 2))})
            deps = [d for d in deps if d != f"vm{v:05d}"]
        dep_text = f", depends_on: [{', '.join(deps)}]" if deps else ""
        lines.append(
            f"  - {{id: vm{v:05d}, kind: vm, platform: vc, runs_on: [{host}], watts: 8{dep_text}}}"
        )
    return "\n".join(lines) + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vms", type=int, default=5000)
    parser.add_argument("--hosts", type=int, default=200)
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    sys.stdout.write(site_text(args.vms, args.hosts, args.seed))
    return 0


if __name__ == "__main__":
    sys.exit(main())
