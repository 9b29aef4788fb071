#!/usr/bin/env python3
"""Time to validate, plan and simulate a synthetic site of 5,000 VMs on 200 hosts, on one core.

Each is done once: the site file is read and checked, both plans are built, and the
simulation runs the shutdown plan built here (as ``upsguard simulate`` runs the one
it builds). Target: under 1 s for all three together. A benchmark, not a test: it
prints its figures.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from gen_site import site_text
from upsguard.config import load_site
from upsguard.config.scenario import DEFAULT_SCENARIO
from upsguard.runbooks.planner import build_plan
from upsguard.runbooks.simulator import simulate


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--vms", type=int, default=5000)
    parser.add_argument("--hosts", type=int, default=200)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "site.yaml"
        path.write_text(site_text(args.vms, args.hosts), encoding="utf-8")
        t0 = time.perf_counter()
        site = load_site(path)
        t1 = time.perf_counter()
        shutdown = build_plan(site, "shutdown")
        startup = build_plan(site, "startup")
        t2 = time.perf_counter()
        report = simulate(site, DEFAULT_SCENARIO, shutdown)
        t3 = time.perf_counter()
    total = t3 - t0
    print(f"site: {args.vms} VMs on {args.hosts} hosts, {len(site.resources)} resources")
    print(f"validate: {t1 - t0:7.3f} s")
    print(
        f"plan:     {t2 - t1:7.3f} s  (shutdown {len(shutdown.steps)} steps, "
        f"startup {len(startup.steps)} steps)"
    )
    print(
        f"simulate: {t3 - t2:7.3f} s  ({len(report.timeline)} timeline entries, "
        f"{report.end_s / 60:.0f} virtual minutes)"
    )
    print(f"total:    {total:7.3f} s  (target < 1 s: {'met' if total < 1 else 'NOT met'})")
    print(f"verdict:  {report.verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
