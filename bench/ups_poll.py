"""One upsd serving 50 dummy UPSes: the time of one poll cycle, and how soon a change is seen.

Run: ``python3 bench/ups_poll.py [--upses 50] [--cycles 30] [--changes 8]`` (needs Debian's
nut-server: scripts/setup). It starts dummy-ups drivers and upsd on loopback (the test
fixture of tests/peers/nut.py) and prints:

1. a full poll cycle over all UPSes through ``NutSource`` (one connection per UPS, like
   upsmon; the reads of a cycle run concurrently), next to a plain asyncio-streams reader
   on the same number of connections that does not ask for quick ACKs (every answer then
   waits on a delayed ACK: what ``nut_client``'s one trick saves), and the CPU time of a
   cycle per UPS;
2. the latency from a status change written to a driver's data file to upsguard reading
   it, polling every 20 ms, against the driver's ``pollinterval``. The change is written to
   a ``.dev`` file (the ``.seq`` format, played once and re-read when its mtime changes), so
   the moment of the change is known; a ``.seq`` moves on its own timer.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from tests.peers.nut import ON_LINE, POLL_INTERVAL, NutServer, start_nut

from upsguard.clock import SystemClock
from upsguard.models import UpsFlag
from upsguard.plugins.ups.nut import NutSource

ON_BATTERY = ON_LINE.replace("OL", "OB DISCHRG")


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


async def poll_cycles(
    server: NutServer, names: list[str], cycles: int
) -> tuple[list[float], list[float]]:
    """Wall time of each cycle, and its CPU time per UPS."""
    clock = SystemClock()
    sources = [NutSource(server.ups_config(n), clock) for n in names]
    await asyncio.gather(*(s.read() for s in sources))  # connect once
    times, cpu = [], []
    for _ in range(cycles):
        start, start_cpu = time.perf_counter(), time.process_time()
        readings = await asyncio.gather(*(s.read() for s in sources))
        times.append(time.perf_counter() - start)
        cpu.append((time.process_time() - start_cpu) / len(names))
        assert all(r.link.value == "ok" for r in readings)
    await asyncio.gather(*(s.close() for s in sources))
    return times, cpu


async def plain_cycles(server: NutServer, names: list[str], cycles: int) -> list[float]:
    """The same reads with plain asyncio streams and no quick ACKs."""
    conns = [await asyncio.open_connection("127.0.0.1", server.port) for _ in names]

    async def list_var(
        reader: asyncio.StreamReader, writer: asyncio.StreamWriter, name: str
    ) -> None:
        writer.write(f"LIST VAR {name}\n".encode())
        await reader.readuntil(f"END LIST VAR {name}\n".encode())

    times = []
    for _ in range(cycles):
        start = time.perf_counter()
        await asyncio.gather(*(list_var(r, w, n) for (r, w), n in zip(conns, names, strict=True)))
        times.append(time.perf_counter() - start)
    for _, writer in conns:
        writer.close()
    return times


async def change_latencies(server: NutServer, name: str, changes: int) -> list[float]:
    source = NutSource(server.ups_config(name), SystemClock())
    latencies = []
    on_battery = False
    for _ in range(changes):
        on_battery = not on_battery
        time.sleep(1.1)  # dummy-ups compares mtimes in whole seconds
        server.write(name, ON_BATTERY if on_battery else ON_LINE)
        written = time.perf_counter()
        while True:
            reading = await source.read()
            if (UpsFlag.OB in reading.flags) == on_battery:
                break
            await asyncio.sleep(0.02)
        latencies.append(time.perf_counter() - written)
    await source.close()
    return latencies


def summary(label: str, values: list[float]) -> str:
    values = sorted(values)
    p95 = values[max(0, round(0.95 * len(values)) - 1)]
    return (
        f"{label:<44} median {ms(statistics.median(values))}   p95 {ms(p95)}   max {ms(values[-1])}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--upses", type=int, default=50)
    parser.add_argument("--cycles", type=int, default=30)
    parser.add_argument("--changes", type=int, default=8)
    args = parser.parse_args()
    names = [f"ups{i:02d}" for i in range(args.upses)]
    with tempfile.TemporaryDirectory() as tmp:
        started = time.perf_counter()
        server = start_nut(Path(tmp), dict.fromkeys(names, ON_LINE), ext="dev", timeout=120)
        print(
            f"{args.upses} dummy-ups drivers + upsd ready in {time.perf_counter() - started:.1f} s"
        )
        try:
            ours, cpu = asyncio.run(poll_cycles(server, names, args.cycles))
            plain = asyncio.run(plain_cycles(server, names, args.cycles))
            latencies = asyncio.run(change_latencies(server, names[0], args.changes))
        finally:
            server.stop()
    print(summary(f"poll cycle, {args.upses} UPSes, upsguard NutSource", ours))
    print(summary(f"poll cycle, {args.upses} UPSes, plain streams, no quick ACK", plain))
    ratio = statistics.median(plain) / statistics.median(ours)
    print(f"plain / upsguard (median): {ratio:.1f}x; target: a cycle under 100 ms")
    print(summary("CPU time of a cycle, per UPS", cpu))
    print(summary("change in data file -> seen by upsguard", latencies))
    worst = max(latencies) / POLL_INTERVAL
    print(
        f"driver pollinterval {POLL_INTERVAL} s; worst latency = {worst:.2f} poll intervals "
        "(target: within one)"
    )


if __name__ == "__main__":
    main()
