"""``cache status|set|wait``: look at the write-back caches and override them by hand.

These act directly on the caches through their providers (the same plugins the
service uses), so they work whether or not the service runs. ``set write-through
--wait`` and ``wait`` show the dirty data falling, with rate and ETA, and end
non-zero when the caches are not clean within the timeout (each cache's
``destage_timeout`` unless ``--timeout`` says otherwise).
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import timedelta
from typing import TYPE_CHECKING, Any, TextIO, TypeVar

from upsguard.cli.common import (
    Subparsers,
    add_format_option,
    add_site_option,
    print_json,
    run_async,
)
from upsguard.cli.common import site_of as load_site_of
from upsguard.errors import ConfigError, StepTimeout
from upsguard.models import CacheMode, CacheName

if TYPE_CHECKING:
    from rich.progress import Progress, TaskID
    from rich.table import Table

    from upsguard.config.site import SiteConfig
    from upsguard.engine.destage import CacheStatus, DestageWatch, ModeResult
    from upsguard.events import Event
    from upsguard.plugins.caches.base import CacheProvider

log = logging.getLogger(__name__)
T = TypeVar("T")
BAR_WIDTH = 30


def register(commands: Subparsers) -> None:
    """Add ``cache status``, ``cache set`` and ``cache wait``."""
    cache = commands.add_parser("cache", help="write-back caches: status, manual override, wait")
    sub = cache.add_subparsers(dest="cache_command", metavar="ACTION", required=True)

    p = sub.add_parser("status", help="mode, dirty bytes, destage rate and ETA of each cache")
    _common(p)
    add_format_option(p)
    p.add_argument(
        "--sample",
        type=_seconds,
        default=2.0,
        metavar="DURATION",
        help="read twice this far apart to measure the destage rate (0: read once)",
    )
    p.set_defaults(handler=cmd_status)

    p = sub.add_parser("set", help="switch caches to write-through or write-back")
    p.add_argument("mode", choices=("write-through", "write-back"))
    _common(p)
    p.add_argument("--wait", action="store_true", help="then wait until clean, with progress")
    _timeout_option(p)
    p.set_defaults(handler=cmd_set)

    p = sub.add_parser("wait", help="wait until the caches have destaged their dirty data")
    _common(p)
    _timeout_option(p)
    p.set_defaults(handler=cmd_wait)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("names", nargs="*", metavar="NAME", help="caches (default: all)")
    add_site_option(parser)


def _timeout_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--timeout",
        type=_seconds,
        metavar="DURATION",
        help="give up after this long (default: the longest destage_timeout of the caches)",
    )


def _seconds(text: str) -> float:
    """``30s``, ``5m``, ``500ms``, or a plain number of seconds."""
    from upsguard.config.types import parse_duration

    try:
        return parse_duration(
            float(text) if text.replace(".", "", 1).isdigit() else text
        ).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def chosen_caches(site: SiteConfig, names: Sequence[str]) -> list[CacheName]:
    """The caches named on the command line (all when none), or a ConfigError naming the unknown."""
    known = [c.name for c in site.caches]
    if not known:
        raise ConfigError("the site file has no 'caches'")
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(f"no cache named {', '.join(unknown)} (caches: {', '.join(known)})")
    return [CacheName(n) for n in names] if names else known


# -- handlers ---------------------------------------------------------------------------


def cmd_status(args: argparse.Namespace) -> int:
    from upsguard.cli import output

    site = load_site_of(args)
    names = chosen_caches(site, args.names)

    async def go(watch: DestageWatch) -> list[CacheStatus]:
        import asyncio

        statuses = await watch.poll(names)
        if args.sample > 0:
            await asyncio.sleep(args.sample)
            statuses = await watch.poll(names)
        return statuses

    statuses = run_async(_with_watch(site, names, go))
    if args.format == "json":
        print_json([status_dict(s) for s in statuses])
    else:
        output.show(status_table(statuses))
    return 1 if any(s.error for s in statuses) else 0


def cmd_set(args: argparse.Namespace) -> int:
    site = load_site_of(args)
    names = chosen_caches(site, args.names)
    mode = CacheMode(args.mode)
    timeout = args.timeout if args.timeout is not None else _longest_timeout(site, names)

    async def go(watch: DestageWatch) -> tuple[list[ModeResult], bool]:
        results = await watch.set_mode(mode, names)
        for line in mode_lines(results):
            print(line, flush=True)
        failed = [r for r in results if not r.ok]
        if not args.wait or mode is not CacheMode.WRITE_THROUGH:
            return results, not failed
        ok_names = [n for n in names if all(r.ok for r in results if r.cache == n)]
        await _wait(watch, ok_names, timeout)
        return results, not failed

    _, ok = run_async(_with_watch(site, names, go))
    return 0 if ok else 1


def cmd_wait(args: argparse.Namespace) -> int:
    site = load_site_of(args)
    names = chosen_caches(site, args.names)
    timeout = args.timeout if args.timeout is not None else _longest_timeout(site, names)

    async def go(watch: DestageWatch) -> None:
        await _wait(watch, names, timeout)

    run_async(_with_watch(site, names, go))
    return 0


# -- the async side ---------------------------------------------------------------------


async def _with_watch(
    site: SiteConfig, names: list[CacheName], body: Callable[[DestageWatch], Awaitable[T]]
) -> T:
    """Build the chosen providers, run ``body`` with a watch over them, close them after."""
    from upsguard.clock import SystemClock
    from upsguard.engine.destage import DestageWatch
    from upsguard.plugins.registry import build_cache_providers

    clock = SystemClock()
    every = build_cache_providers(site, clock)
    providers: dict[CacheName, CacheProvider] = {n: every[n] for n in names}
    watch = DestageWatch(site, providers, clock, _log_event)
    try:
        return await body(watch)
    finally:
        for provider in providers.values():
            await provider.close()


async def _wait(watch: DestageWatch, names: list[CacheName], timeout: float) -> None:
    """Wait until clean, drawing progress; StepTimeout (exit 1) when time runs out."""
    import asyncio

    if not names:
        return
    bar = ProgressBar(sys.stderr)
    try:
        async with asyncio.timeout(timeout):
            clean = await watch.wait_clean(
                names, progress=lambda _: bar.draw(_statuses(watch, names))
            )
    except TimeoutError:
        bar.done()
        raise StepTimeout(_still_dirty(watch, names, timeout)) from None
    bar.done()
    if not clean:
        raise StepTimeout(_still_dirty(watch, names, timeout))
    print(f"clean: {', '.join(names)}")


def _statuses(watch: DestageWatch, names: list[CacheName]) -> list[CacheStatus]:
    """Every chosen target, clean ones too (the watch reports only those still waiting)."""
    return [s for s in watch.status.values() if s.cache in names]


def _longest_timeout(site: SiteConfig, names: list[CacheName]) -> float:
    limits = [c.destage_timeout for c in site.caches if c.name in names]
    return max(limits, default=timedelta(minutes=10)).total_seconds()


def _still_dirty(watch: DestageWatch, names: list[CacheName], timeout: float) -> str:
    """What is not known clean when the time runs out: what is dirty, and what could not be
    read (and why)."""
    from upsguard.config.types import format_bytes, format_duration

    statuses = [s for s in watch.status.values() if s.cache in names and not s.clean]
    dirty = [s for s in statuses if s.state is not None]
    left = sum(s.state.dirty_bytes or 0 for s in dirty if s.state is not None)
    said = []
    if dirty:
        which = ", ".join(sorted({f"{s.cache}/{s.target.name}" for s in dirty}))
        said.append(f"{which} ({format_bytes(left)} still dirty)")
    for status in (s for s in statuses if s.state is None):
        where = (
            status.cache if status.target.name == "*" else f"{status.cache}/{status.target.name}"
        )
        said.append(f"{where} could not be read ({status.error or 'no answer'})")
    return f"not clean after {format_duration(timeout)}: {'; '.join(said) or 'not read'}"


def _log_event(event: Event) -> None:
    log.info("%s", event)


# -- output ---------------------------------------------------------------------------


def mode_lines(results: list[ModeResult]) -> list[str]:
    return [f"{r.cache}/{r.target}: {'ok' if r.ok else 'FAILED'}: {r.detail}" for r in results]


def status_dict(status: CacheStatus) -> dict[str, Any]:
    state = status.state
    return {
        "cache": status.cache,
        "target": status.target.name,
        "mode": state.mode.value if state else None,
        "dirty_bytes": state.dirty_bytes if state else None,
        "clean": status.clean,
        "rate_bytes_per_s": status.rate_bps,
        "eta_s": status.eta_s,
        "detail": state.detail if state else "",
        "error": status.error,
        "at": state.at.isoformat() if state else None,
    }


def status_table(statuses: list[CacheStatus]) -> Table:
    from upsguard.cli import output

    header = ("CACHE", "TARGET", "MODE", "DIRTY", "RATE", "ETA", "CLEAN", "DETAIL")
    return output.table(header, (_row(s) for s in statuses))


def _row(status: CacheStatus) -> tuple[str, ...]:
    from upsguard.config.types import format_bytes, format_duration

    state = status.state
    if state is None:
        return (status.cache, status.target.name, "?", "?", "", "", "error", status.error or "")
    dirty = "n/a" if state.dirty_bytes is None else format_bytes(state.dirty_bytes)
    rate = "" if status.rate_bps is None else f"{format_bytes(status.rate_bps)}/s"
    eta = "" if status.eta_s is None or status.clean else format_duration(status.eta_s)
    clean = "yes" if state.clean else "no"
    return (status.cache, status.target.name, state.mode.value, dirty, rate, eta, clean,
            state.detail)  # fmt: skip


class ProgressBar:
    """Dirty bytes falling: a rich progress bar on a terminal, one plain line per poll otherwise
    (scripts and logs read those lines)."""

    def __init__(self, out: TextIO) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, Progress, TextColumn

        from upsguard.cli import output

        self._out = out
        self._start: int | None = None
        self._bar: Progress | None = None
        self._task: TaskID | None = None
        if output.is_terminal(out):
            self._bar = Progress(
                BarColumn(bar_width=BAR_WIDTH),
                TextColumn("{task.description}"),
                console=Console(file=out, highlight=False),
            )

    def draw(self, statuses: list[CacheStatus]) -> None:
        done, text = self.measure(statuses)
        if self._bar is None:
            filled = round(done * BAR_WIDTH)
            self._out.write(f"[{'#' * filled}{'.' * (BAR_WIDTH - filled)}] {text}\n")
            self._out.flush()
        elif self._task is None:
            self._bar.start()
            self._task = self._bar.add_task(text, total=1000, completed=round(done * 1000))
        else:
            self._bar.update(self._task, completed=round(done * 1000), description=text)

    def measure(self, statuses: list[CacheStatus]) -> tuple[float, str]:
        """The share destaged since the first poll (0 to 1), and the figures behind it."""
        from upsguard.config.types import format_bytes, format_duration

        dirty = sum(s.state.dirty_bytes or 0 for s in statuses if s.state is not None)
        if self._start is None or dirty > self._start:
            self._start = dirty
        done = 1.0 if self._start == 0 else 1 - dirty / self._start
        errors = sum(1 for s in statuses if s.error)
        if errors or not statuses:  # what was not read is not drained: the bar never fills
            done = min(done, 0.0 if not statuses else 1 - errors / len(statuses))
        rate = sum(s.rate_bps or 0.0 for s in statuses if not s.clean)
        etas = [s.eta_s for s in statuses if not s.clean]
        known = [e for e in etas if e is not None]
        eta = "?" if len(known) < len(etas) else format_duration(max(known, default=0.0))
        clean = sum(1 for s in statuses if s.clean)
        text = (
            f"{format_bytes(dirty)}{'+?' if errors else ''} dirty, "
            f"{format_bytes(max(rate, 0.0))}/s, ETA {eta}, {clean}/{len(statuses)} clean"
        )
        return done, text + (f", {errors} unreadable" if errors else "")

    def done(self) -> None:
        if self._bar is not None and self._task is not None:
            self._bar.stop()
