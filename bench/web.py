#!/usr/bin/env python3
"""The web page under load: does watching the outage slow the reaction to it?

One real ``upsguard run`` with its web page on (and a real upsd, as bench/reaction.py
starts it). In one run, side by side, outages alternate between two conditions:

- no browser on the page;
- 50 browsers following the live status (server-sent events, read as fast as they come).

Each outage is measured as bench/reaction.py measures it: from the driver's data change to
the journaled cache flip. Then, with the 50 streams still open, the overview page and its
data (``/api/status``) are each asked for 20 times a second, paced, and their response
times taken. Prints p50/p95/max of each and the ratio of the two reaction p95s (target:
within 10 %) and whether the overview's p95 is under 100 ms. A benchmark, not a test.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from tests.peers.nut import start_nut  # noqa: E402
from tests.peers.ports import free_port  # noqa: E402

import reaction  # noqa: E402  (bench/reaction.py, beside this file)
from upsguard.controller.web.auth import hash_password  # noqa: E402
from upsguard.controller.web.live import STREAMS_PER_USER  # noqa: E402

PASSWORD = "bench passphrase"
VIEWERS = 8
"""The page gives a user ``STREAMS_PER_USER`` live streams: the browsers share these logins."""


def site(tmp: Path, nut: reaction.NutServer, port: int) -> Path:
    path = reaction.site(tmp, nut, None)
    data = yaml.safe_load(path.read_text())
    hashed = hash_password(PASSWORD)
    data["web"] = {
        "port": port,
        "users": [
            {"name": f"bench-{i}", "role": "viewer", "password_hash": hashed}
            for i in range(VIEWERS)
        ],
    }
    path.write_text(yaml.safe_dump(data))
    return path


async def login(session: aiohttp.ClientSession, base: str, name: str = "bench-0") -> None:
    form = await (await session.get(f"{base}/login")).text()
    token = re.search(r'name="csrf" value="([^"]+)"', form)
    assert token is not None
    data = {"csrf": token.group(1), "name": name, "password": PASSWORD, "next": "/"}
    async with session.post(f"{base}/login", data=data, headers={"Origin": base}) as answer:
        if answer.status != 200 or "upsguard_session" not in {c.key for c in session.cookie_jar}:
            raise SystemExit(f"bench: could not log in ({answer.status})")


class Streams:
    """``count`` browsers on the live status, in a thread of their own."""

    def __init__(self, base: str, count: int) -> None:
        self.base, self.count = base, count
        self.messages = 0
        self.open = 0
        self._stop: asyncio.Event | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()
        reaction.wait_for(lambda: self.open == self.count, f"{self.count} streams open", 60)

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        self._thread.join(30)

    async def _main(self) -> None:
        self._loop, self._stop = asyncio.get_running_loop(), asyncio.Event()
        if self.count > VIEWERS * STREAMS_PER_USER:
            raise SystemExit(f"bench: at most {VIEWERS * STREAMS_PER_USER} browsers")
        async with contextlib.AsyncExitStack() as stack:
            tasks = []
            for first in range(0, self.count, STREAMS_PER_USER):
                jar = aiohttp.CookieJar(unsafe=True)
                session = await stack.enter_async_context(aiohttp.ClientSession(cookie_jar=jar))
                await login(session, self.base, f"bench-{first // STREAMS_PER_USER}")
                group = min(STREAMS_PER_USER, self.count - first)
                tasks += [asyncio.create_task(self._follow(session)) for _ in range(group)]
            await self._stop.wait()
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)

    async def _follow(self, session: aiohttp.ClientSession) -> None:
        async with session.get(f"{self.base}/api/stream", timeout=None) as stream:
            self.open += 1
            async for line in stream.content:
                if line.startswith(b"event: status"):
                    self.messages += 1


async def paced(base: str, path: str, rate: float, seconds: float) -> list[float]:
    """GET ``path`` ``rate`` times a second for ``seconds``, each on time whatever the last
    one took; the response times."""
    jar = aiohttp.CookieJar(unsafe=True)
    async with aiohttp.ClientSession(cookie_jar=jar) as session:
        await login(session, base)
        times: list[float] = []

        async def one() -> None:
            started = time.perf_counter()
            async with session.get(base + path) as answer:
                await answer.read()
                if answer.status != 200:
                    raise SystemExit(f"bench: {path} answered {answer.status}")
            times.append(time.perf_counter() - started)

        loop = asyncio.get_running_loop()
        start, tasks = loop.time(), []
        for i in range(int(rate * seconds)):
            await asyncio.sleep(max(0.0, start + i / rate - loop.time()))
            tasks.append(asyncio.create_task(one()))
        await asyncio.gather(*tasks)
        return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", type=int, default=12, help="per condition (default 12)")
    parser.add_argument("--clients", type=int, default=50)
    parser.add_argument("--rate", type=float, default=20.0, help="overview requests a second")
    parser.add_argument("--seconds", type=float, default=15.0, help="of paced requests")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="upsguard-web-bench-") as name:
        tmp = Path(name)
        nut = start_nut(tmp / "nut", {"ups1": reaction.ONLINE}, ext="dev")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        service = None
        streams: Streams | None = None
        try:
            path = site(tmp, nut, port)
            log = (tmp / "service.log").open("wb")
            service = subprocess.Popen(
                [*reaction.CLI, "run", "-c", str(path)], stdout=log, stderr=log
            )
            reaction.wait_for((tmp / "journal.sqlite").exists, "the journal", 20)
            db = sqlite3.connect(tmp / "journal.sqlite")
            reaction.wait_for(lambda: reaction.polled(db), "the first poll")
            alone: list[float] = []
            watched: list[float] = []
            for i in range(args.outages * 2):
                if i % 2 == 1:
                    streams = Streams(base, args.clients)
                    streams.start()
                _, acted = reaction.one_outage(nut, db, i)
                (watched if streams else alone).append(acted)
                label = f"{args.clients} streams" if streams else "no stream "
                print(f"outage {i + 1:2d} ({label}): {acted * 1000:7.1f} ms", flush=True)
                if streams is not None:
                    streams.stop()
                    streams = None
            streams = Streams(base, args.clients)
            streams.start()
            page = asyncio.run(paced(base, "/", args.rate, args.seconds))
            data = asyncio.run(paced(base, "/api/status", args.rate, args.seconds))
            messages = streams.messages
        finally:
            if streams is not None:
                streams.stop()
            if service is not None:
                service.terminate()
                service.wait(20)
            nut.stop()
    report(args, alone, watched, page, data, messages)


def report(
    args: argparse.Namespace,
    alone: list[float],
    watched: list[float],
    page: list[float],
    data: list[float],
    messages: int,
) -> None:
    print()
    print(f"reaction from the driver's data change, {len(alone)} + {len(watched)} outages, "
          "alternating, one run")  # fmt: skip
    print(f"  {'condition':<44} {'p50':>9} {'p95':>9} {'max':>9}")
    rows = [
        ("no browser on the web page", reaction.figures(alone)),
        (f"{args.clients} browsers following the live status", reaction.figures(watched)),
    ]
    for name, (p50, p95, top) in rows:
        print(f"  {name:<44} {p50:7.0f}ms {p95:7.0f}ms {top:7.0f}ms")
    ratio = rows[1][1][1] / rows[0][1][1]
    verdict = "within 10 %" if ratio <= 1.10 else "OVER 10 %"
    print(f"  reaction p95 with / without the streams: {ratio:.3f} ({verdict})")
    print()
    print(f"response times at {args.rate:g} requests/s for {args.seconds:g} s, "
          f"{args.clients} streams open ({messages} status messages received by them)")  # fmt: skip
    for name, times in (("overview page  GET /", page), ("its data  GET /api/status", data)):
        ms = sorted(t * 1000 for t in times)
        p95 = ms[max(0, round(0.95 * len(ms)) - 1)]
        print(
            f"  {name:<28} p50 {statistics.median(ms):6.1f} ms  p95 {p95:6.1f} ms  "
            f"max {ms[-1]:6.1f} ms  ({len(ms)} requests){'' if p95 < 100 else '  OVER 100 ms'}"
        )


if __name__ == "__main__":
    main()
