#!/usr/bin/env python3
"""Watching caches drain: 200 simulated targets on 20 hosts, or (``--real``) real kernel caches.

Default: half the hosts carry bcache devices (a sysfs tree per host in the kernel's formats,
tests/fixtures/caches/bcache_sysfs.py), the other half a vendor cache driven by the
``command`` provider (``cat`` of per-target files); a writer process drains each target at
its own rate once the provider has switched it (a load to watch, not a model of a cache).
Everything is switched to write-through through the real providers, then the lead's
``DestageWatch.wait_clean`` waits for all of them. Prints: how long after the last target
became clean upsguard noticed (target: within one poll interval), and what the watching
cost: sysfs file reads and commands per second, and the CPU time of this process.

``--real``: boots the QEMU guest of the tests (tests/peers/guest.py: Debian's kernel under
TCG) and destages bcache, dm-writecache and lvmcache through their providers over SSH, each
holding ``--mib`` MiB written in 1 MiB extents, on a backing disk whose writes take
``--write-delay`` ms (dm-delay, a spindle behind an SSD cache). Prints, in one run: destage
MB/s per cache type, from the provider's flip to the kernel's own clean; bcache's rate with
``cache_mode`` writethrough alone and with the provider's settings, and their ratio (on the
plain disk, the kernel's defaults, a light read load: docs/real-kernel-caches.md); and how
soon after the kernel said clean upsguard noticed it, in poll intervals. The kernel is
sampled in the guest every 0.1 s on the guest's clock. MB/s are those of an emulated CPU and
of disks that are files: the ratios carry over to real hardware, not the figures.

A benchmark, not a test: it prints its figures.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import multiprocessing
import os
import random
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.fixtures.caches.bcache_sysfs import BcacheSysfs, hprint

from upsguard.clock import SystemClock
from upsguard.config.site import SiteConfig
from upsguard.engine.destage import DestageWatch
from upsguard.events import Event
from upsguard.models import CacheMode, CacheName
from upsguard.plugins import remote
from upsguard.plugins.registry import build_cache_providers

MiB = 1024 * 1024
COUNTS = {"file_reads": 0, "commands": 0}
POLLS: list[float] = []  # when each poll of wait_clean finished
POLL_TIMES: list[float] = []  # how long each poll of every target took


class Writer:
    """Synthetic targets whose dirty data drains at its own rate once the provider has switched
    them: a load for the watch to follow, not a model of any cache (``--real`` is the kernel)."""

    def __init__(self, targets: dict[str, tuple[float, float]], tick: float) -> None:
        self.state = {name: [dirty, rate] for name, (dirty, rate) in targets.items()}
        self.clean_at: dict[str, float] = {}
        self.tick = tick
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        for name, (dirty, _) in self.state.items():
            self.publish(name, dirty)

    def switched(self, name: str) -> bool:
        raise NotImplementedError

    def publish(self, name: str, dirty: float) -> None:
        raise NotImplementedError

    def __enter__(self) -> Writer:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()

    def _run(self) -> None:
        last = time.monotonic()
        while not self._stop.wait(self.tick):
            now = time.monotonic()
            for name, values in self.state.items():
                if values[0] <= 0 or not self.switched(name):
                    continue
                values[0] = max(0.0, values[0] - values[1] * (now - last))
                self.publish(name, values[0])
                if values[0] == 0:
                    self.clean_at[name] = now
            last = now


class VendorWriter(Writer):
    """Per-target ``mode`` and ``dirty`` files for the ``command`` provider's ``cat``."""

    def __init__(self, root: Path, targets: dict[str, tuple[float, float]], tick: float) -> None:
        self.root = root
        for name in targets:
            (root / f"{name}.mode").write_text("write-back\n")
        super().__init__(targets, tick)

    def switched(self, name: str) -> bool:
        return "through" in (self.root / f"{name}.mode").read_text()

    def publish(self, name: str, dirty: float) -> None:
        _replace(self.root / f"{name}.dirty", str(int(dirty)))


class BcacheWriter(Writer):
    """bcache sysfs trees in the kernel's formats (tests/fixtures/caches/bcache_sysfs.py),
    draining once the provider has set ``writeback_percent`` to 0."""

    def __init__(self, root: Path, targets: dict[str, tuple[float, float]], tick: float) -> None:
        self.sysfs = BcacheSysfs(root, {name: {} for name in targets})
        super().__init__(targets, tick)

    def switched(self, name: str) -> bool:
        return self.sysfs.attr(name, "writeback_percent") == "0"

    def publish(self, name: str, dirty: float) -> None:
        _replace(self.sysfs.dir(name) / "dirty_data", hprint(dirty))
        _replace(self.sysfs.dir(name) / "state", "dirty" if dirty else "clean")


def _replace(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text + "\n")
    os.replace(tmp, path)


def _count_io() -> None:
    """Count what the providers spend: sysfs reads and commands, at the runner."""
    read_text, run = remote.Runner.read_text, remote.Runner.run

    async def counted_read(self: remote.Runner, path: Any, *, timeout: float) -> str:
        COUNTS["file_reads"] += 1
        return await read_text(self, path, timeout=timeout)

    async def counted_run(self: remote.Runner, argv: Any, **kw: Any) -> remote.CommandResult:
        COUNTS["commands"] += 1
        return await run(self, argv, **kw)

    read_texts = remote.Runner.read_texts

    async def counted_reads(self: remote.Runner, paths: Any, *, timeout: float) -> list[str]:
        COUNTS["file_reads"] += len(paths)
        return await read_texts(self, paths, timeout=timeout)

    poll = DestageWatch.poll

    async def timed_poll(self: DestageWatch, names: Any = None) -> Any:
        started = time.monotonic()
        try:
            return await poll(self, names)
        finally:
            POLL_TIMES.append(time.monotonic() - started)

    DestageWatch.poll = timed_poll  # type: ignore[method-assign]
    remote.Runner.read_texts = counted_reads  # type: ignore[method-assign]
    remote.Runner.read_text = counted_read  # type: ignore[method-assign]
    remote.Runner.run = counted_run  # type: ignore[method-assign]


Spec = list[tuple[str, Path, dict[str, tuple[float, float]]]]


def make_spec(tmp: Path, hosts: int, per_host: int, rng: random.Random) -> Spec:
    """Per host: its kind, its folder, and each target's (dirty bytes, drain rate)."""
    spec: Spec = []
    for h in range(hosts):
        kind = "bcache" if h % 2 == 0 else "command"
        prefix = "bcache" if kind == "bcache" else "nv"
        targets = {
            f"{prefix}{i}": (rng.uniform(50, 500) * MiB, rng.uniform(20, 200) * MiB)
            for i in range(per_host)
        }
        spec.append((kind, tmp / f"host{h:02d}", targets))
    return spec


def run_writers(spec: Spec, tick: float, stop: Any, ready: Any, results: Any) -> None:
    """In a process of its own: the fake devices drain; report when each became clean."""
    fakes: list[Writer] = []
    for kind, folder, targets in spec:
        if kind == "bcache":
            fakes.append(BcacheWriter(folder / "sys", targets, tick=tick))
        else:
            folder.mkdir(parents=True)
            fakes.append(VendorWriter(folder, targets, tick=tick))
    for fake in fakes:
        fake.__enter__()
    ready.set()
    stop.wait()
    for fake in fakes:
        fake.__exit__(None, None, None)
    results.put([t for fake in fakes for t in fake.clean_at.values()])


def site_dict(tmp: Path, hosts: int, per_host: int, poll: float) -> dict[str, Any]:
    caches: list[dict[str, Any]] = []
    for h in range(hosts):
        common = {"name": f"host{h:02d}", "poll_interval": poll, "destage_timeout": "10m"}
        if h % 2 == 0:
            caches.append(
                {
                    **common,
                    "provider": "bcache",
                    "sysfs_root": str(tmp / f"host{h:02d}" / "sys"),
                    "state_dir": str(tmp / "state"),
                }
            )
        else:
            d = tmp / f"host{h:02d}"
            caches.append(
                {
                    **common,
                    "provider": "command",
                    "targets": [f"nv{i}" for i in range(per_host)],
                    "read_mode": f"cat {d}/{{target}}.mode",
                    "read_dirty_bytes": f"cat {d}/{{target}}.dirty",
                    "set_write_through": f"echo write-through > {d}/{{target}}.mode",
                    "set_write_back": f"echo write-back > {d}/{{target}}.mode",
                }
            )
    return {
        "site": "bench",
        "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "ups": "ups1"}}],
        "caches": caches,
    }


async def watch_all(site: SiteConfig) -> tuple[float, float, int]:
    """Flip everything, wait until clean; (flipped at, noticed at, polls) in monotonic time."""
    clock = SystemClock()
    providers = build_cache_providers(site, clock)

    def ignore(event: Event) -> None:
        return None

    watch = DestageWatch(site, providers, clock, ignore)
    names = [CacheName(c.name) for c in site.caches]
    results = await watch.set_mode(CacheMode.WRITE_THROUGH, names)
    failed = [r for r in results if not r.ok]
    if failed:
        raise SystemExit(f"set_mode failed: {failed[:3]}")
    flipped = time.monotonic()

    def count(_: object) -> None:
        POLLS.append(time.monotonic())

    await watch.wait_clean(names, progress=count)
    noticed = time.monotonic()
    for provider in providers.values():
        await provider.close()
    return flipped, noticed, len(POLLS)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--hosts", type=int, default=20)
    parser.add_argument("--per-host", type=int, default=10)
    parser.add_argument("--poll", type=float, default=2.0, help="poll interval, seconds")
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument(
        "--writer-tick", type=float, default=0.05, help="how often the fake devices drain, s"
    )
    parser.add_argument(
        "--real", action="store_true", help="destage real kernel caches in the QEMU guest"
    )
    parser.add_argument("--mib", type=int, default=128, help="--real: dirty data per cache")
    parser.add_argument(
        "--write-delay", type=int, default=500, help="--real: backing disk write delay, ms"
    )
    parser.add_argument(
        "--window", type=float, default=15.0, help="--real: how long bcache's trickle is timed"
    )
    args = parser.parse_args()
    if args.real:
        return real_kernel(args)
    _count_io()
    with tempfile.TemporaryDirectory() as tmpdir:
        tmp = Path(tmpdir)
        site = SiteConfig.model_validate(site_dict(tmp, args.hosts, args.per_host, args.poll))
        spec = make_spec(tmp, args.hosts, args.per_host, random.Random(args.seed))
        stop, ready = multiprocessing.Event(), multiprocessing.Event()
        results: multiprocessing.Queue[list[float]] = multiprocessing.Queue()
        writers = multiprocessing.Process(
            target=run_writers, args=(spec, args.writer_tick, stop, ready, results)
        )
        writers.start()
        ready.wait()
        try:
            cpu0 = time.process_time()
            flipped, noticed, polls = asyncio.run(watch_all(site))
            cpu = time.process_time() - cpu0
        finally:
            stop.set()
            clean_times = results.get()
            writers.join()
    targets = args.hosts * args.per_host
    if len(clean_times) < targets:
        print(f"only {len(clean_times)} of {targets} targets became clean", file=sys.stderr)
        return 1
    last = max(clean_times)
    lag = noticed - last
    wall = noticed - flipped
    kinds = f"bcache sysfs x{args.hosts - args.hosts // 2}, command x{args.hosts // 2}"
    print(f"targets: {targets} on {args.hosts} hosts ({kinds})")
    gaps = [b - a for a, b in itertools.pairwise(POLLS)]
    cycle = sum(gaps) / len(gaps) if gaps else float("nan")
    print(
        f"poll interval: {args.poll:.1f} s; polls: {polls}, one every {cycle:.2f} s on average; "
        f"destage took {last - flipped:.1f} s"
    )
    print(
        f"one poll of all {targets} targets took {sum(POLL_TIMES) / len(POLL_TIMES):.2f} s "
        f"on average (max {max(POLL_TIMES):.2f} s)"
    )
    print(
        f"noticed the last clean target {lag:.2f} s after it became clean "
        f"({lag / args.poll:.2f} poll intervals; target <= 1.00)"
    )
    print(
        f"watching cost: {COUNTS['file_reads'] / wall:.0f} sysfs file reads/s, "
        f"{COUNTS['commands'] / wall:.0f} commands/s, CPU {cpu / wall * 100:.0f} % of one core "
        f"(the watching process; the fake writers run in another)"
    )
    return 0


def real_kernel(args: argparse.Namespace) -> int:
    """The ``--real`` run: see the module's docstring."""
    from tests.peers.guest import booted
    from tests.peers.guest_caches import (
        KINDS,
        Bcache,
        Destage,
        Kind,
        bcache_writethrough_alone,
        destage_through_provider,
    )

    def dirty_cache(guest: Any, kind: Kind, slow: bool) -> None:
        """A clean guest, ``kind``'s cache on the slow disk (or the plain one, with the
        kernel's defaults), ``--mib`` MiB of random data written through it, a light read load."""
        disk, fast, source = guest.disks
        guest.reset()
        dd = f"bs=1M count={args.mib} oflag=direct status=none"
        guest.check(f"dd if=/dev/urandom of={source} {dd}")
        if slow:
            kind.create(guest, guest.slow_disk(disk, args.write_delay), fast)
        else:
            kind.create(guest, disk, fast, tuned=False)
        guest.check(f"dd if={source} of={kind.device} {dd}")
        guest.start_load(
            "reads", f"dd if={kind.device} of=/dev/null bs=4k count=1 iflag=direct; sleep 0.2"
        )

    mb = 1e6
    with tempfile.TemporaryDirectory() as tmpdir, booted(Path(tmpdir)) as vm:
        guest = vm.guest
        state = Path(tmpdir) / "state"
        release = guest.check("uname -r").strip()
        print(f"guest: Debian kernel {release} under TCG, booted in {guest.boot_seconds:.1f} s")
        print(
            f"{args.mib} MiB dirty per cache in 1 MiB extents, backing disk writes delayed "
            f"{args.write_delay} ms, poll interval {args.poll:g} s:"
        )
        runs: list[tuple[str, Destage]] = []
        for kind_class in KINDS:
            kind = kind_class()
            dirty_cache(guest, kind, slow=True)
            run = destage_through_provider(guest, kind, state, args.poll)
            runs.append((kind.id, run))
            print(
                f"  {kind.id:<11} {run.dirty / mb:6.1f} MB destaged at {run.rate / mb:6.1f} MB/s; "
                f"upsguard noticed clean {run.lag_polls:.2f} poll intervals after the kernel"
            )
        bcache = Bcache()
        dirty_cache(guest, bcache, slow=False)
        alone = bcache_writethrough_alone(guest, args.window)
        helped = destage_through_provider(guest, bcache, state, args.poll)
    print(
        f"bcache on the plain disk, defaults (writeback_percent 10, writeback_delay 30), light "
        f"read load: cache_mode writethrough alone {alone.rate / mb:.2f} MB/s (the kernel's "
        f"writeback_rate {alone.writeback_rate / 1024:.1f} KiB/s, its floor); with upsguard's "
        f"settings {helped.rate / mb:.1f} MB/s: "
        f"{helped.rate / max(alone.rate, 1.0):.0f} times faster"
    )
    worst = max(run.lag_polls for _, run in [*runs, ("bcache", helped)])
    print(
        f"slowest notice of clean: {worst:.2f} poll intervals after the kernel (a poll on a "
        "fixed cadence, then one read over SSH, and bcache's settings put back, at most)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
