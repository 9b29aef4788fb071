"""The charts of a retrospective, drawn by pygal as inline SVG.

Every chart is rendered with no JavaScript to fetch (``js=[]``: pygal's tooltips load a
script from the web, and the report must open with the power out), without the inline
script of settings pygal adds anyway (inert without the tooltips' library: ``svg``), and
without an XML declaration, so it can sit inside the HTML as it is and be served with a
policy that runs no script at all.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from typing import Any

import pygal
from pygal.style import Style

from upsguard.models import StepState
from upsguard.reports.story import BatterySample, CacheSample, Moment, RunStory, StepStory

_SCRIPT = re.compile(r"<script\b[^>]*>.*?</script>", re.DOTALL)

MiB = 1024 * 1024
ROW_PX = 22
WIDTH = 1000

STYLE = Style(
    background="white",
    plot_background="white",
    foreground="#222",
    foreground_strong="#000",
    foreground_subtle="#888",
    font_family="DejaVu Sans, Helvetica, Arial, sans-serif",
    label_font_size=11,
    major_label_font_size=11,
    legend_font_size=12,
    title_font_size=14,
    colors=("#9aa5b1", "#1f77b4", "#d62728", "#ff7f0e", "#2ca02c", "#9467bd", "#8c564b"),
)
"""Planned grey, actual blue, critical red, trouble orange; then one color per series."""

Point = tuple[float, float] | None


def _chart(kind: type[pygal.XY], **config: object) -> pygal.XY:
    options: dict[str, object] = {
        "js": [],
        "disable_xml_declaration": True,
        "style": STYLE,
        "width": WIDTH,
        "allow_interruptions": True,
        "show_dots": False,
        "legend_at_bottom": True,
        "truncate_label": 40,
    }
    options.update(config)
    return kind(**options)


def _segments(pairs: Iterable[tuple[float, float, float]]) -> list[Point]:
    """Horizontal segments (start, end, y) as one series broken by None."""
    out: list[Point] = []
    for start, end, y in pairs:
        out += [(start, y), (end, y), None]
    return out


def timeline_svg(run: RunStory) -> str:
    """Every step of the run as bars on one time axis (minutes from the story's origin):
    planned (grey), actual (blue), the critical path (red), trouble (orange)."""
    steps = run.steps
    rows = {s.id: len(steps) - i for i, s in enumerate(steps)}  # the first step on top
    chart = _chart(
        pygal.XY,
        height=ROW_PX * len(steps) + 140,
        title=f"{run.facts.kind} run {run.facts.id}: planned against actual",
        x_title="minutes from the start of the outage",
        stroke_style={"width": 7, "linecap": "butt"},
        range=(0, len(steps) + 1),
        show_y_guides=False,
    )
    chart.y_labels = [{"label": s.id, "value": rows[s.id]} for s in steps]
    planned = [
        (s.planned_start_s / 60, (s.planned_start_s + s.planned_s) / 60, rows[s.id] + 0.2)
        for s in steps
        if s.planned_start_s is not None and s.planned_s is not None
    ]
    ran = {
        s.id: (s.start_s / 60, (s.start_s + s.actual_s) / 60)
        for s in steps
        if s.start_s is not None and s.actual_s is not None
    }

    def bars(chosen: Iterable[StepStory]) -> list[Point]:
        return _segments((*ran[s.id], rows[s.id] - 0.2) for s in chosen)

    done = [s for s in steps if s.id in ran]
    trouble = [s for s in done if s.state is StepState.FAILED or s.fallback_used]
    critical = [s for s in done if s.critical and s not in trouble]
    normal = [s for s in done if s not in trouble and s not in critical]
    chart.add("planned", _segments(planned) or [None])
    chart.add("actual", bars(normal) or [None])
    chart.add("actual, on the critical path", bars(critical) or [None])
    chart.add("failed or fell back", bars(trouble) or [None])
    return svg(chart)


def battery_svg(samples: Sequence[BatterySample], moments: Sequence[Moment]) -> str | None:
    """Runtime left as each UPS reported it, the battery model's figure for the same charge
    and load, charge on the right axis; trigger points, the mains failing and coming back
    as vertical lines."""
    if not samples:
        return None
    chart = _chart(
        pygal.XY,
        height=420,
        title="battery: observed against the model",
        x_title="minutes from T+0 (the mains failure, else the start of the outage)",
        y_title="runtime left (minutes)",
        stroke_style={"width": 2},
        secondary_range=(0, 100),
        value_formatter=lambda value: f"{value:.0f}",
    )
    top = 0.0
    for ups in sorted({s.ups for s in samples}):
        mine = [s for s in samples if s.ups == ups]
        runtime = [(s.at_s / 60, s.runtime_s / 60) for s in mine if s.runtime_s is not None]
        model = [
            (s.at_s / 60, s.model_runtime_s / 60) for s in mine if s.model_runtime_s is not None
        ]
        charge = [(s.at_s / 60, s.charge_pct) for s in mine if s.charge_pct is not None]
        top = max([top, *(v for _, v in runtime), *(v for _, v in model)])
        if runtime:
            chart.add(f"{ups} runtime (observed)", runtime)
        if model:
            chart.add(f"{ups} runtime (model)", model, stroke_style={"dasharray": "6,4"})
        if charge:
            chart.add(f"{ups} charge %", charge, secondary=True)
    triggers = [m for m in moments if m.kind in ("trigger", "phase")]
    if triggers and top > 0:
        lines: list[Point] = []
        for moment in triggers:
            lines += [(moment.at_s / 60, 0.0), (moment.at_s / 60, top), None]
        chart.add("trigger points", lines, stroke_style={"width": 1, "dasharray": "2,3"})
    for kind, title in (("mains_failed", "mains failed"), ("mains_back", "mains back")):
        marks = [m for m in moments if m.kind == kind]
        if marks and top > 0:
            lines = [p for m in marks for p in ((m.at_s / 60, 0.0), (m.at_s / 60, top), None)]
            chart.add(title, lines, stroke_style={"width": 3})
    return svg(chart)


def cache_svg(samples: Sequence[CacheSample]) -> str | None:
    """Each cache's dirty data over time, where figures are known (a dry run, or events that
    carry them)."""
    known = [s for s in samples if s.dirty_bytes is not None]
    if not any(s.dirty_bytes for s in known):
        return None
    chart = _chart(
        pygal.XY,
        height=360,
        title="caches: dirty data draining",
        x_title="minutes from the start of the outage",
        y_title="dirty (MiB)",
        stroke_style={"width": 2},
    )
    for cache in sorted({s.cache for s in known}):
        points = [(s.at_s / 60, (s.dirty_bytes or 0) / MiB) for s in known if s.cache == cache]
        chart.add(cache, points)
    return svg(chart)


def svg(chart: Any) -> str:
    """A pygal chart's SVG without pygal's inline scripts (its settings for a tooltips
    library that is never loaded): what is drawn is the same, and nothing is left to run."""
    return _SCRIPT.sub("", str(chart.render(is_unicode=True)))
