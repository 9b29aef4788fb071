"""Value types of the site file: durations, sizes, rates, secrets.

Strings such as ``"30s"`` or ``"20GiB"`` become typed values here, at load
time; nothing past ``config`` sees the raw text.
"""

from __future__ import annotations

import functools
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any

from pydantic import BeforeValidator, PlainSerializer, WithJsonSchema

from upsguard.errors import ConfigError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}


def parse_duration(value: Any) -> timedelta:
    """Accept ``90``, ``"90s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``; plain numbers are seconds."""
    if isinstance(value, timedelta):
        return value
    if isinstance(value, bool):
        raise ValueError("a duration is a number of seconds or a string like '30s', '5m', '1h'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a duration cannot be negative")
        return timedelta(seconds=value)
    if isinstance(value, str):
        text = value.strip().replace(" ", "")
        parts = _DURATION_PART.findall(text)
        if parts and "".join(n + u for n, u in parts) == text:
            return timedelta(seconds=sum(float(n) * _UNIT_SECONDS[u] for n, u in parts))
    raise ValueError(f"{value!r} is not a duration: write it like '30s', '5m', '1h30m'")


@functools.lru_cache(maxsize=4096)
def format_duration(value: timedelta | float) -> str:
    """Short human form: ``45s``, ``12m30s``, ``2h05m``. Cached: plans and timelines of big
    sites repeat the same few durations thousands of times."""
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
    return f"{sign}{hours}h{minutes:02d}m"


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)B?$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_bytes(value: Any) -> int:
    """Accept ``1048576``, ``"512MiB"``, ``"20GB"``, ``"1.5T"`` (binary when 'i' or no 'B')."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '512MiB'")
    if isinstance(value, int | float):
        if value < 0:
            raise ValueError("a size cannot be negative")
        return int(value)
    if isinstance(value, str):
        match = _SIZE.match(value.strip())
        if match:
            number, prefix, binary = match.groups()
            decimal = value.strip().upper().endswith("B") and not binary and prefix
            base = 1000 if decimal else 1024
            return int(float(number) * base ** _POWERS[prefix.upper()])
    raise ValueError(f"{value!r} is not a size: write it like '512MiB' or '20GB'")


def parse_rate(value: Any) -> float:
    """Bytes per second from ``"200MiB/s"`` or a plain number."""
    if isinstance(value, str) and value.strip().endswith("/s"):
        return float(parse_bytes(value.strip()[:-2]))
    return float(parse_bytes(value))


def format_bytes(value: float | None) -> str:
    if value is None:
        return "?"
    size = float(value)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(size) < 1024 or unit == "TiB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


_DURATION_SCHEMA = {
    "anyOf": [
        {"type": "number", "minimum": 0, "description": "seconds"},
        {"type": "string", "pattern": r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d)\s*)+$"},
    ]
}

Duration = Annotated[
    timedelta,
    BeforeValidator(parse_duration),
    PlainSerializer(format_duration, return_type=str),
    WithJsonSchema(_DURATION_SCHEMA),
]
ByteSize = Annotated[
    int,
    BeforeValidator(parse_bytes),
    WithJsonSchema({"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string"}]}),
]
ByteRate = Annotated[
    float,
    BeforeValidator(parse_rate),
    WithJsonSchema({"anyOf": [{"type": "number", "minimum": 0}, {"type": "string"}]}),
]


def resolve_secret(what: str, file: Path | None, env: str | None) -> str | None:
    """Read a secret from its file or environment variable; never echo it.

    Raises ``ConfigError`` naming the file or variable (not the value) when it
    cannot be read. Returns None when neither is given.
    """
    if file is not None:
        try:
            return file.read_text(encoding="utf-8").strip()
        except OSError as exc:
            raise ConfigError(f"{what}: cannot read {file}: {exc.strerror}") from exc
    if env is not None:
        value = os.environ.get(env)
        if value is None:
            raise ConfigError(f"{what}: environment variable {env} is not set")
        return value
    return None
