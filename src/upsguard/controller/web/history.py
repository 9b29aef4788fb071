"""The history panel: charge, runtime and load from the journal over 24 hours, 7 days or 90
days, with the outages (readings on battery) shaded and the runs marked, drawn by pygal.

Ninety days of readings are a few hundred thousand rows: they are read and drawn in a
worker thread, on a journal connection of its own (as ``upsguard report`` reads it beside
the running service), so the power watch on the event loop never waits for a chart. Each
chart is kept for a while (``FRESH_S``): a page reloaded by ten people draws it once.
"""

from __future__ import annotations

import threading
import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path

from upsguard.journal import Journal
from upsguard.journal.rows import ReadingRow, iso, parse_iso

SPANS = {"24h": timedelta(hours=24), "7d": timedelta(days=7), "90d": timedelta(days=90)}
METRICS = {
    "charge": ("battery charge", "%"),
    "runtime": ("runtime left", "min"),
    "load": ("load", "%"),
}
POINTS = 360
"""Buckets per series: enough for a phone or a laptop, few enough to draw at once."""
FRESH_S = {"24h": 30.0, "7d": 300.0, "90d": 900.0}
MAX_RUNS = 500

COLORS = ("#f4c7a1", "#6a3d9a", "#1f77b4", "#2ca02c", "#d62728", "#8c564b", "#17becf")
"""Outages shaded orange, runs purple; then one color per UPS."""


@dataclass(frozen=True, slots=True)
class Span:
    name: str
    start: datetime
    end: datetime
    readings: tuple[ReadingRow, ...]
    runs: tuple[tuple[datetime, str], ...]
    """(start, 'kind id: state') of each run in the span."""


def read_span(journal_path: Path, name: str, now: datetime) -> Span:
    """The readings and runs of the last ``name`` (24h, 7d, 90d); in a worker thread."""
    start = now - SPANS[name]
    journal = Journal(journal_path, read_only=True)
    try:
        readings = journal.read.readings_between(iso(start), iso(now))
        runs = [
            (parse_iso(r.started), f"{r.kind} {r.id}: {r.state}")
            for r in journal.read.runs(limit=MAX_RUNS, with_steps=False)
            if parse_iso(r.started) >= start
        ]
    finally:
        journal.close()
    return Span(name, start, now, tuple(readings), tuple(runs))


def chart_svg(span: Span, metric: str) -> str:
    """One metric of every UPS, bucketed, with the outages shaded and the runs marked.
    pygal is imported here: the service loads it only when someone looks at a chart."""
    import pygal
    from pygal.style import Style

    from upsguard.reports.charts import svg

    title, unit = METRICS[metric]
    width = (span.end - span.start) / POINTS
    buckets: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(list))
    on_battery: set[int] = set()
    for row in span.readings:
        index = min(POINTS - 1, int((parse_iso(row.at) - span.start) / width))
        value = _value(row, metric)
        if value is not None:
            buckets[row.ups][index].append(value)
        if "OB" in row.status.split():
            on_battery.add(index)
    series = {
        ups: {i: (min(v) if metric == "runtime" else sum(v) / len(v)) for i, v in by.items()}
        for ups, by in sorted(buckets.items())
    }
    top = max([100.0] + [v for s in series.values() for v in s.values()])
    chart = pygal.DateTimeLine(
        js=[],
        disable_xml_declaration=True,
        style=Style(
            background="white",
            plot_background="white",
            font_family="DejaVu Sans, Helvetica, Arial, sans-serif",
            colors=COLORS,
        ),
        width=900,
        height=300,
        title=f"{title} ({unit})",
        allow_interruptions=True,
        dots_size=1.5,
        legend_at_bottom=True,
        x_title="UTC",
        x_label_rotation=0,
        x_value_formatter=_time_label(span),
        range=(0, top),
        truncate_legend=30,
    )
    at = [span.start + width * (i + 0.5) for i in range(POINTS)]
    chart.add(
        "on battery",
        [(at[i], top if i in on_battery else None) for i in range(POINTS)],
        fill=True,
        stroke=False,
        show_dots=False,
    )
    chart.add("runs", [(when, top * 0.95) for when, _ in span.runs], stroke=False, dots_size=5)
    for ups, values in series.items():
        chart.add(f"UPS {ups}", [(at[i], values.get(i)) for i in range(POINTS)], show_dots=True)
    return svg(chart)


def _value(row: ReadingRow, metric: str) -> float | None:
    if metric == "charge":
        return row.charge
    if metric == "load":
        return row.load
    return None if row.runtime is None else row.runtime / 60.0


def _time_label(span: Span) -> object:
    fmt = "%H:%M" if span.name == "24h" else "%d %b"
    return lambda value: value.strftime(fmt)


class ChartCache:
    """Charts drawn lately, per span and metric; drawn again once ``FRESH_S`` old."""

    def __init__(self, journal_path: Path) -> None:
        self._path = journal_path
        self._kept: dict[tuple[str, str], tuple[float, str]] = {}
        self._lock = threading.Lock()

    def chart(self, span: str, metric: str, now: datetime) -> str:
        """In a worker thread: the chart, drawn now or lately."""
        with self._lock:  # one drawing at a time: the second asker gets the first's chart
            kept = self._kept.get((span, metric))
            if kept is not None and time.monotonic() - kept[0] < FRESH_S[span]:
                return kept[1]
            svg = chart_svg(read_span(self._path, span, now), metric)
            self._kept[(span, metric)] = (time.monotonic(), svg)
            return svg
