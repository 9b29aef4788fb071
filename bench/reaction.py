#!/usr/bin/env python3
"""Reaction time: from the UPS's data change at the driver to upsguard's first action.

A real ``upsguard run`` (a subprocess) watches a real upsd with a ``dummy-ups`` driver
(Debian's NUT, started as tests/peers/nut.py does). Twenty times the driver's data file
is switched to ``OB DISCHRG`` (the driver re-reads it within its one-second cycle); the
clock starts at that write, not at upsd's answer, so the driver's own delay counts, as it
does in an outage. Two watchers measure from the same write, in the same run:

- the floor: a loop that reads ``ups.status`` from upsd every 0.1 s (nothing that polls
  upsd can react sooner);
- upsguard at its defaults (``poll_interval`` 1 s), by the moment it journaled its first
  action, the cache flip to write-through (``on_battery.after`` is 0 so that the flip is
  the first thing the policy does).

Then mains return and the site goes back to normal before the next outage; a random pause
puts the outages at every phase of the polls. Prints p50/p95/max of both, the ratio, and
the idle service's CPU share over ``--idle`` seconds and its RSS. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.peers.nut import NutServer, start_nut

ONLINE = "ups.status: OL\nbattery.charge: 95\nbattery.runtime: 1800\ninput.voltage: 230\n"
ON_BATTERY = "ups.status: OB DISCHRG\nbattery.charge: 94\nbattery.runtime: 1700\ninput.voltage: 0\n"
CLI = [sys.executable, "-c", "import sys; from upsguard.cli import main; sys.exit(main())"]


def site(tmp: Path, nut: NutServer, poll: float | None) -> Path:
    data = {
        "site": "bench",
        "journal": str(tmp / "journal.sqlite"),
        "service": {"socket": str(tmp / "api.sock")},
        "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}],
        "caches": [{"name": "flash", "provider": "simulated", "dirty": "0"}],
        "policies": {
            **({"poll_interval": f"{poll}s"} if poll else {}),
            "on_battery": {"after": "0s"},
            "shutdown": {"when_any": ["fsd"]},
            "power_returns": {"online_for": "1s"},
            "startup": {"online_for": "1s", "charge_above": 0},
        },
    }
    path = tmp / "site.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def wait_for(check, what: str, timeout: float = 30.0, every: float = 0.002):  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(every)
    raise SystemExit(f"timed out waiting for {what}")


def flips(db: sqlite3.Connection, mode: str) -> list[str]:
    rows = db.execute("SELECT at FROM cache_ops WHERE mode = ? ORDER BY id", (mode,)).fetchall()
    return [r[0] for r in rows]


def polled(db: sqlite3.Connection) -> bool:
    try:
        return bool(db.execute("SELECT COUNT(*) FROM readings").fetchone()[0])
    except sqlite3.OperationalError:  # the service is still creating the schema
        return False


def last_phase(db: sqlite3.Connection) -> str:
    row = db.execute("SELECT new FROM phases ORDER BY id DESC LIMIT 1").fetchone()
    return str(row[0]) if row else "normal"


def at_seconds(text: str) -> float:
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", type=int, default=20)
    parser.add_argument(
        "--poll", type=float, help="policies.poll_interval, s (default: the site file's default)"
    )
    parser.add_argument("--idle", type=float, default=30.0, help="seconds of idle to measure")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="upsguard-reaction-") as name:
        tmp = Path(name)
        nut = start_nut(tmp / "nut", {"ups1": ONLINE}, ext="dev")
        service = None
        try:
            path = site(tmp, nut, args.poll)
            log = (tmp / "service.log").open("wb")
            service = subprocess.Popen([*CLI, "run", "-c", str(path)], stdout=log, stderr=log)
            wait_for((tmp / "journal.sqlite").exists, "the journal", 20)
            db = sqlite3.connect(tmp / "journal.sqlite")
            wait_for(lambda: polled(db), "the first poll")
            floor, latencies = run_outages(nut, db, args.outages)
            idle_cpu, rss = idle(service.pid, args.idle)
        finally:
            if service is not None:
                service.terminate()
                service.wait(20)
            nut.stop()
    report(floor, latencies, args.poll, args.idle, idle_cpu, rss)


def run_outages(
    nut: NutServer, db: sqlite3.Connection, count: int
) -> tuple[list[float], list[float]]:
    floor, upsguard = [], []
    for i in range(count):
        seen, acted = one_outage(nut, db, i)
        floor.append(seen)
        upsguard.append(acted)
        line = f"outage {i + 1:2d}: floor {seen * 1000:7.1f} ms   upsguard {acted * 1000:7.1f} ms"
        print(line, flush=True)
    return floor, upsguard


def one_outage(nut: NutServer, db: sqlite3.Connection, index: int) -> tuple[float, float]:
    """Seconds from the driver's data change to the floor poller's sight of it, and to
    upsguard's journaled action."""
    before = len(flips(db, "write-through"))
    time.sleep(random.uniform(0.0, 2.0))  # outages do not wait for the poll's phase
    nut.write("ups1", ON_BATTERY)  # the driver re-reads its data file within its cycle
    changed_at = time.time()
    wait_for(lambda: nut.get("ups1", "ups.status").startswith("OB"), "upsd to say OB", 10, 0.1)
    seen_at = time.time()
    new = wait_for(lambda: flips(db, "write-through")[before:], "the cache flip", 15)
    nut.write("ups1", ONLINE)

    def back() -> bool:
        return last_phase(db) == "normal" and len(flips(db, "write-back")) == index + 1

    wait_for(back, "the site back to normal", 30, 0.05)
    return seen_at - changed_at, at_seconds(new[0]) - changed_at


def idle(pid: int, seconds: float) -> tuple[float, float]:
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    used = cpu_seconds(pid) - start_cpu
    return 100.0 * used / (time.monotonic() - start), rss_mib(pid)


def figures(latencies: list[float]) -> tuple[float, float, float]:
    ms = sorted(x * 1000 for x in latencies)
    return statistics.median(ms), ms[max(0, round(0.95 * len(ms)) - 1)], ms[-1]


def report(
    floor: list[float],
    latencies: list[float],
    poll: float | None,
    idle_s: float,
    cpu: float,
    rss: float,
) -> None:
    print()
    print(f"reaction from the driver's data change, {len(latencies)} outages, one run")
    print(f"  {'watcher':<40} {'p50':>9} {'p95':>9} {'max':>9}")
    rows = [
        ("a 0.1 s poller of upsd (the floor)", figures(floor)),
        (f"upsguard, poll_interval {poll or 'default'}", figures(latencies)),
    ]
    for name, (p50, p95, top) in rows:
        print(f"  {name:<40} {p50:7.0f}ms {p95:7.0f}ms {top:7.0f}ms")
    (f50, f95, _), (u50, u95, _) = rows[0][1], rows[1][1]
    ratio = f"p50 {u50 / f50:.2f}x, p95 {u95 / f95:.2f}x"
    print(f"  upsguard / floor: {ratio} (1 s polls: one poll interval more, at worst)")
    print(
        f"idle service over {idle_s:.0f} s: CPU {cpu:.2f} % ({'OK' if cpu < 1 else 'over 1 %'}), "
        f"RSS {rss:.1f} MiB"
    )


if __name__ == "__main__":
    main()
