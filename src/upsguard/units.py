"""How upsguard writes durations and sizes for people: one way everywhere, from the plan to
the journal's lines (core, so that events and the figures of decisions use it too)."""

from __future__ import annotations

import functools
from collections.abc import Sequence
from datetime import timedelta


@functools.lru_cache(maxsize=4096)
def format_duration(value: timedelta | float) -> str:
    """Short human form: ``45s``, ``12m30s``, ``2h05m``, ``1h28m05s`` (seconds are kept past
    an hour as below it: a timeline's moments and the margins of a verdict must not lose
    them). Cached: plans and timelines of big sites repeat the same few durations thousands
    of times."""
    seconds = value.total_seconds() if isinstance(value, timedelta) else float(value)
    sign = "-" if seconds < 0 else ""
    seconds = abs(seconds)
    if seconds < 60:
        whole = seconds >= 10 or seconds == int(seconds)
        return f"{sign}{seconds:.0f}s" if whole else f"{sign}{seconds:.1f}s"
    minutes, secs = divmod(round(seconds), 60)
    if minutes < 60:
        return f"{sign}{minutes}m{secs:02d}s" if secs else f"{sign}{minutes}m"
    hours, minutes = divmod(minutes, 60)
    return f"{sign}{hours}h{minutes:02d}m{secs:02d}s" if secs else f"{sign}{hours}h{minutes:02d}m"


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """``1 cache``, ``2 caches``, ``0 caches``: a number with its noun in agreement
    (``plural`` for a noun that does not take an s: ``counted(2, "UPS", "UPS")``)."""
    return f"{count} {noun if count == 1 else plural or noun + 's'}"


def format_names(names: Sequence[str], noun: str, first: int = 5) -> str:
    """A few names as they are (``esx01, nas01``); more than ``first`` as their count and the
    first few (``132 resources (esx000, esx001, esx002, esx003, esx004 and 127 more)``): a
    line a person reads names a site's worth of VMs in a count, not by the hundred."""
    if len(names) <= first:
        return ", ".join(names)
    shown = ", ".join(names[:first])
    return f"{counted(len(names), noun)} ({shown} and {len(names) - first} more)"


def format_bytes(value: float | None) -> str:
    """Binary units, one decimal: ``512 B``, ``1.5 GiB``; ``?`` when unknown."""
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"
