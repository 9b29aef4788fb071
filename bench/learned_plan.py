#!/usr/bin/env python3
"""How well a plan predicts a real run: the site file's figures against learned ones.

One site of ``command`` resources whose shutdowns really sleep (the ``command`` platform
runs them through its shell, three at a time), with dependencies between them. The site
file's estimates are what a person would write: some given, most left to upsguard's
defaults. Then, in one run of this script:

1. a real run of the shutdown plan, journaled (``Journal.record``): what upsguard learns
   from;
2. a second real run, each step a little slower or faster than the first (as guests are):
   the run both plans are judged against.

Prints, for the judged run: the configured plan's estimate over the real duration, and
the learned plan's (learned from the first run only) over the same, both as ratios
(1.00x = a perfect plan; above 1 the plan is pessimistic). A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import yaml
from tests.runs import executor_for

from upsguard.clock import SystemClock
from upsguard.config.loading import load_site
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.journal import Journal
from upsguard.journal.learned import learned_durations
from upsguard.models import Direction
from upsguard.plugins.registry import build_platforms
from upsguard.runbooks.plan import Plan
from upsguard.runbooks.planner import Planner

#: resource -> (how long its shutdown takes, what must stop before it)
RESOURCES = {
    "app1": (0.6, []),
    "app2": (0.9, []),
    "app3": (0.4, []),
    "db": (1.2, ["app1", "app2"]),
    "cache": (0.5, ["app3"]),
    "files": (0.8, ["db"]),
    "host1": (1.0, ["db", "cache"]),
    "host2": (0.7, ["files"]),
    "nas": (1.5, ["host1", "host2"]),
}
GIVEN = {"db": "20s", "nas": "2m"}  # the estimates a person wrote; the rest are defaults


def write_site(root: Path) -> Path:
    resources: list[dict[str, Any]] = []
    for rid in RESOURCES:
        entry: dict[str, Any] = {
            "id": rid,
            "kind": "command",
            "platform": "cmd",
            "shutdown": f"sleep $(cat {root / rid})",
        }
        if rid in GIVEN:
            entry["estimate"] = {"stop": GIVEN[rid]}
        resources.append(entry)
    for entry in resources:  # what a resource waits for needs it running: it depends on it
        entry["depends_on"] = [
            other for other, (_, needs) in RESOURCES.items() if entry["id"] in needs
        ]
    site = {
        "site": "bench",
        "journal": str(root / "journal.sqlite"),
        "ups": [{"name": "ups1", "simulated": {}}],
        "platforms": {"cmd": {"type": "command", "max_parallel": 3}},
        "resources": resources,
    }
    path = root / "site.yaml"
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return path


def set_durations(root: Path, rng: random.Random, spread: float) -> None:
    for rid, (seconds, _) in RESOURCES.items():
        (root / rid).write_text(f"{seconds * rng.uniform(1 - spread, 1 + spread):.3f}\n")


async def real_run(site: SiteConfig, plan: Plan, journal: Journal) -> float:
    platforms = build_platforms(site, SystemClock())
    started = time.monotonic()
    result = await executor_for(plan, platforms, SystemClock(), journal.write.record).run()
    took = time.monotonic() - started
    failed = [s for s, o in result.outcomes.items() if o.state.value != "done"]
    if failed:
        raise SystemExit(f"steps did not finish: {failed}")
    return took


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--spread", type=float, default=0.2, help="step jitter between runs")
    parser.add_argument("--seed", type=int, default=7)
    args = parser.parse_args()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="upsguard-bench-") as tmp:
        root = Path(tmp)
        site = load_site(write_site(root))
        configured = Planner(site).plan(Direction.SHUTDOWN)
        journal = Journal(site.journal)
        try:
            set_durations(root, rng, args.spread)
            first = asyncio.run(real_run(site, configured, journal))
            learned = Planner(site, durations=learned_durations(journal)).plan(Direction.SHUTDOWN)
            set_durations(root, rng, args.spread)
            judged = asyncio.run(real_run(site, configured, journal))
        finally:
            journal.close()
    print(
        f"site: {len(configured.steps)} command steps (real sleeps), 3 at a time; "
        f"learning run {format_duration(first)}, judged run {format_duration(judged)}"
    )
    for name, plan in (("configured", configured), ("learned", learned)):
        sources = sorted({s.estimate_source for s in plan.steps})
        print(
            f"{name:>10} plan: {plan.estimate_s:8.2f} s  -> plan / real run = "
            f"{plan.estimate_s / judged:6.2f}x   (estimates from: {', '.join(sources)})"
        )


if __name__ == "__main__":
    main()
