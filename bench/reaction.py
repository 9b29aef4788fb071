#!/usr/bin/env python3
"""Reaction time: from a status change at upsd to upsguard's first action.

A real ``upsguard run`` (a subprocess) watches a real upsd with a ``dummy-ups`` driver
(Debian's NUT, started as tests/peers/nut.py does). Twenty times the UPS is switched to
``OB DISCHRG`` (``SET VAR``, what ``upsrw`` does); this script polls upsd in a tight loop
to learn the moment upsd itself reports ``OB`` (the driver applies the change at its next
one-second cycle) and reads, from the service's journal, the moment the service journaled
its first action: the cache flip to write-through (``on_battery.after`` is 0 so that the
flip is the first thing the policy does). Then mains return and the site goes back to
normal before the next outage; a random pause and a poll interval that is not a multiple
of the driver's cycle put the outages at every phase of the poll.

Prints p50/p95/max of the latency against the poll interval (target: p95 within one poll
interval plus 200 ms), then the idle service's CPU share over ``--idle`` seconds and its
RSS. A benchmark, not a test: it prints its figures.
"""

from __future__ import annotations

import argparse
import os
import random
import socket
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

from tests.peers.nut import USERS, NutServer, start_nut

ONLINE = "ups.status: OL\nbattery.charge: 95\nbattery.runtime: 1800\ninput.voltage: 230\n"
CLI = [sys.executable, "-c", "import sys; from upsguard.cli import main; sys.exit(main())"]


def site(tmp: Path, nut: NutServer, poll: float) -> Path:
    data = {
        "site": "bench",
        "journal": str(tmp / "journal.sqlite"),
        "service": {"socket": str(tmp / "api.sock")},
        "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}],
        "caches": [{"name": "flash", "provider": "simulated", "dirty": "0"}],
        "policies": {
            "poll_interval": f"{poll}s",
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
        "--poll",
        type=float,
        default=1.1,
        help="policies.poll_interval, s (default 1.1: not a multiple of the driver's 1 s cycle, "
        "so the outages fall at every phase of the poll)",
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
            latencies = run_outages(nut, db, args.outages)
            idle_cpu, rss = idle(service.pid, args.idle)
        finally:
            if service is not None:
                service.terminate()
                service.wait(20)
            nut.stop()
    report(latencies, args.poll, args.idle, idle_cpu, rss)


def run_outages(nut: NutServer, db: sqlite3.Connection, count: int) -> list[float]:
    latencies = []
    for i in range(count):
        latencies.append(one_outage(nut, db, i))
        print(f"outage {i + 1:2d}: {latencies[-1] * 1000:7.1f} ms", flush=True)
    return latencies


def set_status(nut: NutServer, status: str) -> None:
    """``upsrw -s ups.status=...``: the change is at upsd the moment it answers OK."""
    user, (password, _) = "admin", USERS["admin"]
    with socket.create_connection(("127.0.0.1", nut.port), 5) as sock:
        answers = sock.makefile("rb")
        for line in (
            f"USERNAME {user}",
            f"PASSWORD {password}",
            f'SET VAR ups1 ups.status "{status}"',
        ):
            sock.sendall(line.encode() + b"\n")
            answer = answers.readline().decode().strip()
            if not answer.startswith("OK"):
                raise SystemExit(f"upsd refused '{line.split()[0]}': {answer}")


def one_outage(nut: NutServer, db: sqlite3.Connection, index: int) -> float:
    before = len(flips(db, "write-through"))
    time.sleep(random.uniform(0.0, 2.0))  # outages do not wait for the poll's phase
    set_status(nut, "OB DISCHRG")  # applied at the driver's next cycle
    wait_for(lambda: nut.get("ups1", "ups.status").startswith("OB"), "upsd to say OB", 10, 0.001)
    changed_at = time.time()
    new = wait_for(lambda: flips(db, "write-through")[before:], "the cache flip", 15)
    set_status(nut, "OL")

    def back() -> bool:
        return last_phase(db) == "normal" and len(flips(db, "write-back")) == index + 1

    wait_for(back, "the site back to normal", 30, 0.05)
    return at_seconds(new[0]) - changed_at


def idle(pid: int, seconds: float) -> tuple[float, float]:
    start_cpu, start = cpu_seconds(pid), time.monotonic()
    time.sleep(seconds)
    used = cpu_seconds(pid) - start_cpu
    return 100.0 * used / (time.monotonic() - start), rss_mib(pid)


def report(latencies: list[float], poll: float, idle_s: float, cpu: float, rss: float) -> None:
    ms = sorted(x * 1000 for x in latencies)
    p50 = statistics.median(ms)
    p95 = ms[max(0, round(0.95 * len(ms)) - 1)]
    target = poll * 1000 + 200
    print()
    print(f"reaction from upsd's status change to the journaled cache flip, {len(ms)} outages")
    print(f"  poll interval {poll * 1000:.0f} ms   target p95 <= {target:.0f} ms")
    print(f"  p50 {p50:7.1f} ms  ({p50 / (poll * 1000):.2f} x poll)")
    verdict = "OK" if p95 <= target else "MISSED"
    print(f"  p95 {p95:7.1f} ms  ({p95 / (poll * 1000):.2f} x poll)  {verdict}")
    print(f"  max {ms[-1]:7.1f} ms   min {ms[0]:7.1f} ms")
    print(
        f"idle service over {idle_s:.0f} s: CPU {cpu:.2f} % ({'OK' if cpu < 1 else 'over 1 %'}), "
        f"RSS {rss:.1f} MiB"
    )


if __name__ == "__main__":
    main()
