#!/usr/bin/env python3
"""The web page under load: does watching the outage, or flooding the page, slow the
reaction to it, and can wrong passwords lock an operator out?

One real ``upsguard run`` with its web page on (and a real upsd, as bench/reaction.py
starts it). In one run, side by side, outages alternate between two conditions:

- nothing on the page;
- 50 browsers following the live status (server-sent events, read as fast as they come)
  and 2,000 idle connections that never send a byte (each one the page closes, past its
  ceiling or after its head deadline, is opened again a second later, as a flood would).

Each outage is measured as bench/reaction.py measures it: from the driver's data change to
the journaled cache flip. After each, mains back, a shutdown of seven command steps is
triggered through the local API and must end ``done`` with every step done; all along, the
local API's ``status`` is asked twice a second and must answer. Then, with 50 streams open,
the overview page and its data (``/api/status``) are each asked for 20 times a second,
paced, and their response times taken. Last, the login: 20 addresses send wrong passwords
for the operator's name at once, as fast as they are answered, while the operator logs in
from a clean address once a second; each wrong password answered ``401`` cost one argon2
check (a ``429`` cost none).

Prints p50/p95/max of each, the ratio of the two reaction p95s (target: within 10 %),
steps done, status answers, whether the overview's p95 is under 100 ms, the argon2 checks
per address per second (target: at most one) and the operator's slowest login (target:
2 s). A benchmark, not a test. The flood needs some 2,100 descriptors in this process: the
soft open-file limit is raised to that when it is lower (and the service, its child,
inherits it).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import re
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import yaml

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))
sys.path.insert(0, str(HERE))

from tests.peers.nut import NutServer, start_nut  # noqa: E402
from tests.peers.ports import free_port  # noqa: E402

import reaction  # noqa: E402  (bench/reaction.py, beside this file)
from upsguard.cli.client import ApiClient  # noqa: E402
from upsguard.controller.web.auth import hash_password  # noqa: E402
from upsguard.controller.web.live import STREAMS_PER_USER  # noqa: E402

PASSWORD = "bench passphrase"
OPERATOR = "op"
VIEWERS = 8
"""The page gives a user ``STREAMS_PER_USER`` live streams: the browsers share these logins."""
JOBS = [f"job{i}" for i in range(7)]
"""The steps of the shutdown triggered after each outage."""


def site(tmp: Path, nut: NutServer, port: int) -> Path:
    path = reaction.site(tmp, nut, None)
    data = yaml.safe_load(path.read_text())
    hashed = hash_password(PASSWORD)
    data["platforms"] = {"cmd": {"type": "command"}}
    data["resources"] = [
        {"id": j, "kind": "command", "platform": "cmd", "shutdown": "true"} for j in JOBS
    ]
    data["web"] = {
        "port": port,
        "users": [
            {"name": OPERATOR, "role": "operator", "password_hash": hashed},
            *(
                {"name": f"bench-{i}", "role": "viewer", "password_hash": hashed}
                for i in range(VIEWERS)
            ),
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


class Flood:
    """``count`` TCP connections to the page that never send a byte, in a thread of their
    own; each one the page closes is opened again a second later."""

    def __init__(self, port: int, count: int) -> None:
        self.port, self.count = port, count
        self.connects = 0
        self.closed = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._main()), daemon=True)

    def start(self) -> None:
        self._thread.start()
        reaction.wait_for(lambda: self.connects >= self.count, f"{self.count} connections", 120)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    async def _main(self) -> None:
        await asyncio.gather(*(self._one() for _ in range(self.count)))

    async def _one(self) -> None:
        while not self._stop.is_set():
            try:
                reader, writer = await asyncio.open_connection("127.0.0.1", self.port)
            except OSError:
                await asyncio.sleep(1.0)
                continue
            self.connects += 1
            while not self._stop.is_set():
                try:  # nothing is sent; the page may close it (EOF) at any time
                    if await asyncio.wait_for(reader.read(1024), 0.5) == b"":
                        break
                except TimeoutError:
                    continue
                except OSError:
                    break
            self.closed += 1
            writer.close()
            await asyncio.sleep(1.0)


class StatusWatch:
    """The local API's ``status``, asked twice a second in a thread: answers and failures."""

    def __init__(self, socket_path: Path) -> None:
        self.client = ApiClient(socket_path, timeout=5.0)
        self.answered = 0
        self.failed: list[str] = []
        self.slowest = 0.0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._main, daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def _main(self) -> None:
        while not self._stop.wait(0.5):
            started = time.perf_counter()
            try:
                self.client.status()
            except Exception as exc:  # counted and shown, whatever it is
                self.failed.append(str(exc))
                continue
            self.answered += 1
            self.slowest = max(self.slowest, time.perf_counter() - started)


def shutdown_steps(client: ApiClient) -> tuple[int, int]:
    """Trigger a shutdown of ``JOBS`` and wait for it: (steps done, steps planned)."""
    client.post("/trigger", {"direction": "shutdown", "only": JOBS, "reason": "bench"})
    reaction.wait_for(lambda: client.status().run is None, "the shutdown to finish", 60, 0.05)
    (run,) = client.get("/history?limit=1")["runs"]
    return sum(step["state"] == "done" for step in run["steps"]), len(JOBS)


Logins = tuple[list[int], list[float], list[float]]


async def logins(base: str, addresses: int, seconds: float) -> Logins:
    """Wrong passwords for the operator from ``addresses`` loopback addresses at once, each as
    fast as it is answered, while the operator logs in once a second from two clean
    addresses: from a browser that never logged in before (a new one each time), and from
    one that did (its device cookie kept). The ``401`` answers (argon2 checks) of each
    address, and each operator's login times."""
    checked = [0] * addresses
    loop = asyncio.get_running_loop()
    end = loop.time() + seconds

    async def guesser(index: int) -> None:
        connector = aiohttp.TCPConnector(local_addr=(f"127.0.1.{index + 1}", 0))
        async with aiohttp.ClientSession(
            connector=connector, cookie_jar=aiohttp.CookieJar(unsafe=True)
        ) as session:
            form = await (await session.get(f"{base}/login")).text()
            token = re.search(r'name="csrf" value="([^"]+)"', form)
            assert token is not None
            data = {"csrf": token.group(1), "name": OPERATOR, "password": "guess", "next": "/"}
            while loop.time() < end:
                async with session.post(
                    f"{base}/login", data=data, headers={"Origin": base}, allow_redirects=False
                ) as answer:
                    await answer.read()
                    if answer.status == 401:
                        checked[index] += 1
                    elif answer.status != 429:
                        raise SystemExit(f"bench: a wrong password answered {answer.status}")

    known_jar = aiohttp.CookieJar(unsafe=True)

    async def operator(address: str, known: bool) -> list[float]:
        times = []
        while loop.time() < end:
            jar = known_jar if known else aiohttp.CookieJar(unsafe=True)
            connector = aiohttp.TCPConnector(local_addr=(address, 0))
            async with aiohttp.ClientSession(connector=connector, cookie_jar=jar) as session:
                started = time.perf_counter()
                await login(session, base, OPERATOR)
                times.append(time.perf_counter() - started)
            await asyncio.sleep(max(0.0, 1.0 - times[-1]))
        return times

    connector = aiohttp.TCPConnector(local_addr=("127.0.2.2", 0))
    async with aiohttp.ClientSession(connector=connector, cookie_jar=known_jar) as session:
        await login(session, base, OPERATOR)  # on duty before: the browser has its cookie
    new = asyncio.create_task(operator("127.0.2.1", known=False))
    known = asyncio.create_task(operator("127.0.2.2", known=True))
    await asyncio.gather(*(guesser(i) for i in range(addresses)))
    return checked, await new, await known


def enough_descriptors(needed: int) -> str:
    """Raise this process's soft open-file limit to ``needed`` when it is lower; says what."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft >= needed:
        return f"soft open-file limit {soft}, enough (not raised)"
    if hard != resource.RLIM_INFINITY and hard < needed:
        raise SystemExit(f"bench: {needed} descriptors needed, the hard limit is {hard}")
    resource.setrlimit(resource.RLIMIT_NOFILE, (needed, hard))
    return f"soft open-file limit raised from {soft} to {needed} (resource.setrlimit)"


@dataclass
class Condition:
    """The figures of one condition of the alternating outages."""

    reactions: list[float] = field(default_factory=list)
    steps_done: int = 0
    steps: int = 0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--outages", type=int, default=10, help="per condition (default 10)")
    parser.add_argument("--clients", type=int, default=50, help="live streams (default 50)")
    parser.add_argument("--idle", type=int, default=2000, help="idle connections (2,000)")
    parser.add_argument("--rate", type=float, default=20.0, help="overview requests a second")
    parser.add_argument("--seconds", type=float, default=15.0, help="of paced requests")
    parser.add_argument("--guessers", type=int, default=20, help="addresses guessing (20)")
    parser.add_argument("--guessing", type=float, default=30.0, help="seconds of guesses (30)")
    args = parser.parse_args()
    limit = enough_descriptors(args.idle + args.clients + 256)
    with tempfile.TemporaryDirectory(prefix="upsguard-web-bench-") as name:
        tmp = Path(name)
        nut = start_nut(tmp / "nut", {"ups1": reaction.ONLINE}, ext="dev")
        port = free_port()
        base = f"http://127.0.0.1:{port}"
        service = None
        streams: Streams | None = None
        flood: Flood | None = None
        watch: StatusWatch | None = None
        quiet, loaded = Condition(), Condition()
        try:
            path = site(tmp, nut, port)
            log = (tmp / "service.log").open("wb")
            service = subprocess.Popen(
                [*reaction.CLI, "run", "-c", str(path)], stdout=log, stderr=log
            )
            reaction.wait_for((tmp / "journal.sqlite").exists, "the journal", 20)
            db = sqlite3.connect(tmp / "journal.sqlite")
            reaction.wait_for(lambda: reaction.polled(db), "the first poll")
            api = ApiClient(tmp / "api.sock")
            watch = StatusWatch(tmp / "api.sock")
            watch.start()
            for i in range(args.outages * 2):
                if i % 2 == 1:
                    streams = Streams(base, args.clients)
                    streams.start()  # first: the flood would take the page's connections
                    flood = Flood(port, args.idle)
                    flood.start()
                _, acted = reaction.one_outage(nut, db, i)
                done, planned = shutdown_steps(api)
                condition = loaded if streams else quiet
                condition.reactions.append(acted)
                condition.steps_done += done
                condition.steps += planned
                label = f"{args.clients} streams + {args.idle} idle" if streams else "quiet"
                print(f"outage {i + 1:2d} ({label:<24}): {acted * 1000:7.1f} ms, "
                      f"{done}/{planned} steps done", flush=True)  # fmt: skip
                if flood is not None:
                    flood.stop()
                    reconnects = flood.connects
                    flood = None
                if streams is not None:
                    streams.stop()
                    streams = None
            streams = Streams(base, args.clients)
            streams.start()
            page = asyncio.run(paced(base, "/", args.rate, args.seconds))
            data = asyncio.run(paced(base, "/api/status", args.rate, args.seconds))
            messages = streams.messages
            streams.stop()
            streams = None
            logged = asyncio.run(logins(base, args.guessers, args.guessing))
            watch.stop()
        finally:
            for running in (streams, flood, watch):
                if running is not None:
                    running.stop()
            if service is not None:
                service.terminate()
                service.wait(20)
            nut.stop()
    print()
    print(limit)
    report(args, quiet, loaded, page, data, messages)
    print(f"  idle connections opened by the flood in its last outage: {reconnects} "
          f"(each closed by the page is opened again a second later)")  # fmt: skip
    print(f"  local API status: {watch.answered} answered, {len(watch.failed)} failed "
          f"(slowest {watch.slowest * 1000:.0f} ms)"
          + (f"; first failure: {watch.failed[0]}" if watch.failed else ""))  # fmt: skip
    report_logins(args, *logged)


def report(
    args: argparse.Namespace,
    quiet: Condition,
    loaded: Condition,
    page: list[float],
    data: list[float],
    messages: int,
) -> None:
    print()
    print(f"reaction from the driver's data change, {len(quiet.reactions)} + "
          f"{len(loaded.reactions)} outages, alternating, one run")  # fmt: skip
    print(f"  {'condition':<52} {'p50':>9} {'p95':>9} {'max':>9}  steps done")
    rows = [
        ("nothing on the web page", quiet),
        (f"{args.clients} live streams and {args.idle} idle connections", loaded),
    ]
    for name, condition in rows:
        p50, p95, top = reaction.figures(condition.reactions)
        steps = f"{condition.steps_done}/{condition.steps}"
        print(f"  {name:<52} {p50:7.0f}ms {p95:7.0f}ms {top:7.0f}ms  {steps}")
    ratio = reaction.figures(loaded.reactions)[1] / reaction.figures(quiet.reactions)[1]
    verdict = "within 10 %" if ratio <= 1.10 else "OVER 10 %"
    print(f"  reaction p95 loaded / quiet: {ratio:.3f} ({verdict})")
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


def report_logins(
    args: argparse.Namespace, checked: list[int], new: list[float], known: list[float]
) -> None:
    print()
    print(f"logins: wrong passwords for '{OPERATOR}' from {args.guessers} addresses at once, "
          f"{args.guessing:g} s; the operator logs in each second from two clean ones")  # fmt: skip
    rates = [count / args.guessing for count in checked]
    verdict = "at most 1" if max(rates) <= 1.0 else "OVER 1"
    print(f"  argon2 checks per address per second: max {max(rates):.2f}, mean "
          f"{statistics.mean(rates):.2f} ({sum(checked)} checks in all; {verdict})")  # fmt: skip
    for who, times in (("a new browser", new), ("a browser that logged in before", known)):
        ms = sorted(t * 1000 for t in times)
        verdict = "within 2 s" if ms[-1] <= 2000 else "OVER 2 s"
        print(f"  operator's login from {who}: {len(ms)} logins, p50 "
              f"{statistics.median(ms):.0f} ms, max {ms[-1]:.0f} ms ({verdict})")  # fmt: skip


if __name__ == "__main__":
    main()
