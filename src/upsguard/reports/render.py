"""Stories and run books as HTML or Markdown, through the Jinja2 templates of this package.

The HTML is one self-contained file: its CSS inline, its charts inline SVG (``charts``),
no script, font or image fetched from anywhere.

Jinja2 and the charts (pygal) are imported when a report or run book is first rendered:
every ``upsguard`` command imports this module, and the service, which renders nothing,
would carry them for its whole life (``bench/idle_rss.py``).
"""

from __future__ import annotations

import functools
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, TypeVar

from upsguard import __version__
from upsguard.config.types import format_bytes, format_duration
from upsguard.reports import FORMATS as FORMATS
from upsguard.reports.runbook import RunBook
from upsguard.reports.story import DRAIN_READING, Story

MD_READINGS = 60
"""Readings listed in a Markdown report (it has no chart): spread over the outage."""
T = TypeVar("T")
MOMENT_LABELS = {
    "mains_failed": "MAINS FAILED",
    "mains_back": "MAINS BACK",
    "phase": "phase",
    "trigger": "trigger",
    "run": "run",
    "command": "UPS command",
    "command_failed": "UPS COMMAND FAILED",
    "override": "override",
    "risk": "RISK TAKEN",
}
"""How a report names each kind of moment; what a person looks for first is in capitals
(and bold in Markdown)."""

if TYPE_CHECKING:
    import jinja2


@functools.cache
def _environment() -> jinja2.Environment:
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.PackageLoader("upsguard.reports", "templates"),
        autoescape=lambda name: name is not None and ".html" in name,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    env.globals["DRAIN_READING"] = DRAIN_READING
    env.filters.update(
        duration=_duration,
        tplus=_tplus,
        ratio=_ratio,
        bytes=_bytes,
        pct=_pct,
        clock=_clock,
        wall=_wall,
        when=_when,
        md=_markdown_cell,
    )
    env.globals["MOMENT_LABELS"] = MOMENT_LABELS
    return env


def report(story: Story, fmt: str, ok: bool = True) -> str:
    """The retrospective; ``ok``: the simulation's verdict held (shown in its color)."""
    if fmt == "md":
        template = _environment().get_template("report.md.j2")
        rows = [b for b in story.battery if b.on_battery]
        return template.render(story=story, story_ok=ok, battery_rows=_thin(rows, MD_READINGS))
    from upsguard.reports import charts

    template = _environment().get_template("report.html.j2")
    return template.render(
        story=story,
        story_ok=ok,
        timelines={run.facts.id: charts.timeline_svg(run) for run in story.runs},
        battery_chart=charts.battery_svg(story.battery, story.moments),
        cache_chart=charts.cache_svg(story.caches),
        version=__version__,
    )


def runbook(book: RunBook, fmt: str) -> str:
    name = "runbook.md.j2" if fmt == "md" else "runbook.html.j2"
    return _environment().get_template(name).render(book=book, version=__version__)


def _thin(rows: list[T], most: int) -> list[T]:
    """At most about ``most`` rows, evenly spread, the last one kept."""
    if len(rows) <= most:
        return rows
    every = -(-len(rows) // most)
    return [*rows[::every][:-1], rows[-1]] if (len(rows) - 1) % every else rows[::every]


def _duration(value: float | None) -> str:
    return "" if value is None else format_duration(value)


def _tplus(value: float | None) -> str:
    if value is None:
        return ""
    return f"T-{format_duration(-value)}" if value < 0 else f"T+{format_duration(value)}"


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def _bytes(value: int | None) -> str:
    return "" if value is None else format_bytes(value)


def _pct(value: float | None) -> str:
    return "" if value is None else f"{value:.0f} %"


def _clock(value: datetime) -> str:
    return value.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")


def _wall(value: float | None, origin: datetime) -> str:
    """The wall-clock time (UTC) ``value`` seconds after ``origin``: the time of day, with
    the date when it is not the origin's day (an outage that runs past midnight)."""
    if value is None:
        return ""
    at = (origin + timedelta(seconds=value)).astimezone(UTC)
    same_day = at.date() == origin.astimezone(UTC).date()
    return at.strftime("%H:%M:%S" if same_day else "%Y-%m-%d %H:%M:%S")


def _when(value: float | None, origin: datetime) -> str:
    """The wall-clock time and the T+ beside it: ``00:02:35 (T+2m05s)``."""
    if value is None:
        return ""
    return f"{_wall(value, origin)} ({_tplus(value)})"


def _markdown_cell(value: str) -> str:
    """Text that stays inside one Markdown table cell."""
    return value.replace("|", "\\|").replace("\n", " ")
