"""``ups status``: each UPS's normalized reading, and what each power feed makes of them.

It reads the UPSes directly through the same sources and watch the service uses, so
it works whether or not the service runs. A UPS that does not answer shows as
``lost`` with the age of its last reading (and one line on stderr saying why); the
command then ends non-zero. Refused credentials end it at once with one line.
``--watch`` keeps polling and redraws whenever what it shows changes.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from upsguard.cli.common import (
    Subparsers,
    add_format_option,
    add_site_option,
    duration_seconds,
    run_async,
)
from upsguard.cli.common import site_of as load_site_of
from upsguard.errors import ConfigError
from upsguard.models import LinkState, UpsFlag, UpsName

if TYPE_CHECKING:
    from rich.table import Table

    from upsguard.config.site import FeedConfig, SiteConfig
    from upsguard.policies.power import FeedReading, UpsFigures
    from upsguard.policies.watch import UpsWatch

    Feed = tuple[FeedConfig, FeedReading]

FLAG_ORDER = list(UpsFlag)


def register(commands: Subparsers) -> None:
    """Add ``ups status``."""
    ups = commands.add_parser("ups", help="UPS readings and power feeds")
    sub = ups.add_subparsers(dest="ups_command", metavar="ACTION", required=True)
    p = sub.add_parser(
        "status",
        help="status flags, charge, runtime, load, input voltage and link of each UPS; feeds",
    )
    p.add_argument("names", nargs="*", metavar="UPS", help="UPSes to show (default: all)")
    add_site_option(p)
    add_format_option(p)
    p.add_argument("--watch", action="store_true", help="keep polling, redraw on every change")
    p.add_argument(
        "--interval",
        type=duration_seconds,
        default=None,
        metavar="DURATION",
        help="time between polls with --watch (default: the site's policies.poll_interval)",
    )
    p.add_argument(
        "--polls", type=int, default=0, metavar="N", help="with --watch, stop after N polls"
    )
    p.set_defaults(handler=cmd_status)


def cmd_status(args: argparse.Namespace) -> int:
    if not getattr(args, "verbose", 0):
        # The command prints each UPS that does not answer itself, once.
        logging.getLogger("upsguard.policies.watch").setLevel(logging.ERROR)
    site = load_site_of(args)
    interval = args.interval or site.policies.poll_interval.total_seconds()
    return run_async(_status(site, args.names, args.format, args.watch, interval, args.polls))


async def _status(
    site: SiteConfig, names: Sequence[str], fmt: str, watch: bool, interval: float, polls: int
) -> int:
    import asyncio

    from upsguard.cli import output

    watches = _watches(site, names)
    screen = _Screen(redraw=watch and fmt == "text" and output.is_terminal(sys.stdout))
    try:
        shown: str | None = None
        count = 0
        while True:
            await asyncio.gather(*(w.poll() for w in watches.values()))
            count += 1
            if fmt == "json":
                text = render_json(site, watches, compact=watch)
                if text != shown:
                    print(text, flush=True)
            else:
                tables = (ups_table(list(watches.values())), feed_table(_feeds(site, watches)))
                text = output.plain(*tables)
                if text != shown:
                    screen.show(*tables)
            shown = text
            if not watch or (polls and count >= polls):
                return _report_errors(watches)
            await asyncio.sleep(interval)
    finally:
        screen.close()
        await asyncio.gather(*(w.source.close() for w in watches.values()))


class _Screen:
    """Where the tables go: redrawn in place (rich ``Live``) by ``--watch`` on a terminal,
    printed one after the other otherwise."""

    def __init__(self, redraw: bool) -> None:
        from rich.console import Console
        from rich.live import Live

        self._live = Live(console=Console(highlight=False), auto_refresh=False) if redraw else None
        if self._live is not None:
            self._live.start()

    def show(self, *tables: Table) -> None:
        from rich.console import Group
        from rich.text import Text

        from upsguard.cli import output

        if self._live is None:
            output.show(*tables)
            sys.stdout.flush()
            return
        framed = [output.framed(t) for t in tables]
        self._live.update(Group(framed[0], Text(""), *framed[1:]), refresh=True)

    def close(self) -> None:
        if self._live is not None:
            self._live.stop()


def _watches(site: SiteConfig, names: Sequence[str]) -> dict[UpsName, UpsWatch]:
    from upsguard.clock import SystemClock
    from upsguard.plugins.registry import build_ups_sources
    from upsguard.policies.watch import UpsWatch

    known = {u.name: u for u in site.ups}
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ConfigError(
            f"no UPS named {', '.join(unknown)} in the site file (known: {', '.join(known)})"
        )
    wanted = [known[UpsName(n)] for n in names] if names else list(site.ups)
    clock = SystemClock()
    selected = site.model_copy(update={"ups": wanted})
    sources = build_ups_sources(selected, clock)
    return {u.name: UpsWatch.for_config(sources[u.name], u, clock) for u in wanted}


def _report_errors(watches: dict[UpsName, UpsWatch]) -> int:
    code = 0
    for name, watch in watches.items():
        if watch.last is not None and watch.last.link is not LinkState.OK:
            why = watch.last_error or f"its data is {watch.last.link.value}"
            print(
                f"upsguard: {why if why.startswith('UPS ') else f'UPS {name}: {why}'}",
                file=sys.stderr,
            )
            code = 1
    return code


def _feeds(site: SiteConfig, watches: dict[UpsName, UpsWatch]) -> list[Feed]:
    """The feeds with at least one UPS shown, each with its reading."""
    from upsguard.policies.power import read_feeds

    feeds = site.effective_feeds()
    figures: dict[UpsName, UpsFigures] = {n: w.figures() for n, w in watches.items()}
    pairs = zip(feeds, read_feeds(feeds, figures), strict=True)
    return [(c, r) for c, r in pairs if any(u in watches for u in c.ups)]


def _members(feed: Feed) -> dict[str, str]:
    config, reading = feed
    return dict(zip(config.ups, reading.members, strict=True))


def render_json(site: SiteConfig, watches: dict[UpsName, UpsWatch], compact: bool) -> str:
    doc = {
        "ups": [ups_json(w) for w in watches.values()],
        "feeds": [feed_json(f) for f in _feeds(site, watches)],
    }
    return json.dumps(doc, separators=(",", ":")) if compact else json.dumps(doc, indent=2)


def flags_text(flags: frozenset[UpsFlag]) -> str:
    return " ".join(f.value for f in FLAG_ORDER if f in flags) or "-"


def ups_json(watch: UpsWatch) -> dict[str, Any]:
    r = watch.last
    assert r is not None
    return {
        "name": watch.name,
        "link": r.link.value,
        "age_s": None if r.age_s == float("inf") else round(r.age_s, 1),
        "flags": [f.value for f in FLAG_ORDER if f in r.flags],
        "charge_pct": r.charge_pct,
        "runtime_s": r.runtime_s,
        "observed_runtime_s": _round(watch.observed_runtime_s),
        "depletion_pct_per_min": _round(watch.depletion_pct_per_min),
        "load_pct": r.load_pct,
        "input_voltage": r.input_voltage,
        "error": watch.last_error,
    }


def feed_json(pair: Feed) -> dict[str, Any]:
    feed = pair[1]
    return {
        "name": feed.name,
        "state": feed.state,
        "online": feed.online,
        "needed": feed.needed,
        "unknown": feed.unknown,
        "members": _members(pair),
        "held": feed.held,
        "at_risk_for_s": round(feed.at_risk_for_s, 1),
        "runtime_s": _round(feed.runtime_s),
        "charge_pct": feed.charge_pct,
        "depletion_pct_per_min": _round(feed.depletion_pct_per_min),
        "low_battery": feed.low_battery,
        "forced_shutdown": feed.forced_shutdown,
    }


def _round(value: float | None) -> float | None:
    return None if value is None else round(value, 1)


def _pct(value: float | None) -> str:
    return "-" if value is None else f"{value:.0f}%"


def _dur(value: float | None) -> str:
    from upsguard.config.types import format_duration

    return "-" if value is None else format_duration(value)


def _link(watch: UpsWatch) -> str:
    from upsguard.config.types import format_duration

    r = watch.last
    assert r is not None
    if r.link is LinkState.OK:
        return "ok"
    age = "never read" if r.age_s == float("inf") else f"{format_duration(r.age_s)} old"
    return f"{r.link.value} ({age})"


def ups_table(watches: list[UpsWatch]) -> Table:
    from upsguard.cli import output

    header = ["UPS", "LINK", "STATUS", "CHARGE", "RUNTIME", "OBSERVED", "DRAIN", "LOAD", "INPUT"]
    rows = []
    for w in watches:
        r = w.last
        assert r is not None
        rate = w.depletion_pct_per_min
        rows.append(
            [
                w.name,
                _link(w),
                flags_text(r.flags),
                _pct(r.charge_pct),
                _dur(r.runtime_s),
                _dur(w.observed_runtime_s),
                "-" if rate is None else f"{rate:.1f}%/min",
                _pct(r.load_pct),
                "-" if r.input_voltage is None else f"{r.input_voltage:.0f}V",
            ]
        )
    return output.table(header, rows)


def feed_table(feeds: list[Feed]) -> Table:
    from upsguard.cli import output

    header = ["FEED", "STATE", "ON MAINS/NEEDED", "MEMBERS", "RUNTIME", "AT RISK FOR"]
    rows = []
    for pair in feeds:
        f = pair[1]
        members = " ".join(f"{ups}={word}" for ups, word in _members(pair).items())
        rows.append(
            [
                f.name,
                f.state,
                f"{f.online}/{f.needed}" + (f" ({f.unknown} unknown)" if f.unknown else ""),
                members,
                _dur(f.runtime_s),
                _dur(f.at_risk_for_s) if f.at_risk else "-",
            ]
        )
    return output.table(header, rows)
