"""Value types of the site file: durations, sizes, rates, secrets.

Strings such as ``"30s"`` or ``"20GiB"`` become typed values here, at load
time; nothing past ``config`` sees the raw text. Every value has bounds: a
duration of ``.inf`` or ``"99999999999999d"`` is refused with the field's
limit rather than overflowing later, far from the line that caused it.
"""

from __future__ import annotations

import functools
import math
import os
import re
from datetime import timedelta
from pathlib import Path
from typing import Annotated, Any
from urllib.parse import urlsplit

from pydantic import AfterValidator, BeforeValidator, Field, PlainSerializer, WithJsonSchema

from upsguard.config.reading import read_text
from upsguard.config.values import check_local_path, shorten
from upsguard.units import format_bytes, format_duration

__all__ = ["format_bytes", "format_duration"]  # where the rest of config/ finds them
from upsguard.errors import ConfigError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}

#: The longest duration a field takes unless it says otherwise.
MAX_DURATION = timedelta(days=30)
#: Polls and waits: never so short that a loop spins, never longer than an hour.
MIN_INTERVAL = timedelta(milliseconds=10)
MAX_INTERVAL = timedelta(hours=1)
#: Sizes and rates: a pebibyte (per second) is beyond any cache upsguard drives.
MAX_BYTES = 1024**5


def parse_duration(
    value: Any, maximum: timedelta = MAX_DURATION, minimum: timedelta = timedelta(0)
) -> timedelta:
    """Accept ``90``, ``"90s"``, ``"5m"``, ``"1h30m"``, ``"250ms"``; plain numbers are seconds.

    The result lies within ``minimum`` and ``maximum``; anything else (NaN, infinity, a
    negative number, a bool) is a ``ValueError`` saying what to write.
    """
    if isinstance(value, timedelta):
        seconds: float = value.total_seconds()
    elif isinstance(value, bool) or not isinstance(value, int | float | str):
        raise ValueError("a duration is a number of seconds or a string like '30s', '5m', '1h'")
    elif isinstance(value, str):
        seconds = _duration_text_seconds(value)
    elif isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{value} is not a duration: write it like '30s', '5m', '1h30m'")
    else:
        seconds = value
    if seconds < 0:
        raise ValueError("a duration cannot be negative")
    if seconds > maximum.total_seconds():  # compared before any conversion can overflow
        raise ValueError(
            f"{shorten(repr(value))} is longer than {duration_phrase(maximum)}, the most this "
            "field takes"
        )
    if seconds < minimum.total_seconds():
        raise ValueError(
            f"{shorten(repr(value))} is shorter than {duration_phrase(minimum)}, the least this "
            "field takes"
        )
    return value if isinstance(value, timedelta) else timedelta(seconds=seconds)


def _duration_text_seconds(value: str) -> float:
    text = value.strip().replace(" ", "")
    parts = _DURATION_PART.findall(text)
    if parts and "".join(n + u for n, u in parts) == text:
        seconds = sum(float(n) * _UNIT_SECONDS[u] for n, u in parts)
        if math.isfinite(seconds):
            return seconds
    raise ValueError(
        f"{shorten(repr(value))} is not a duration: write it like '30s', '5m', '1h30m'"
    )


def duration_phrase(limit: timedelta) -> str:
    """``30 days``, ``1 hour``, ``10 ms``, ``1m30s``: a duration as a message says it."""
    seconds = limit.total_seconds()
    for unit, size in (("day", 86400), ("hour", 3600)):
        if seconds >= size and seconds % size == 0:
            count = int(seconds // size)
            return f"{count} {unit}" if count == 1 else f"{count} {unit}s"
    if seconds < 1:
        return f"{seconds * 1000:.0f} ms"
    return format_duration(limit)


_SIZE = re.compile(r"^(\d+(?:\.\d+)?)\s*([KMGTP]?)(i?)B?$", re.IGNORECASE)
_POWERS = {"": 0, "K": 1, "M": 2, "G": 3, "T": 4, "P": 5}


def parse_bytes(value: Any) -> int:
    """Accept ``1048576``, ``"512MiB"``, ``"20GB"``, ``"1.5T"`` (binary when 'i' or no 'B');
    at most a pebibyte."""
    if isinstance(value, bool):
        raise ValueError("a size is a number of bytes or a string like '512MiB'")
    size: float | None = None
    if isinstance(value, int | float):
        size = value
    elif isinstance(value, str):
        match = _SIZE.match(value.strip())
        if match:
            number, prefix, binary = match.groups()
            decimal = value.strip().upper().endswith("B") and not binary and prefix
            base = 1000 if decimal else 1024
            size = float(number) * base ** _POWERS[prefix.upper()]
    if size is None or (isinstance(size, float) and not math.isfinite(size)):
        raise ValueError(f"{shorten(repr(value))} is not a size: write it like '512MiB' or '20GB'")
    if size < 0:
        raise ValueError("a size cannot be negative")
    if size > MAX_BYTES:
        raise ValueError(f"{shorten(repr(value))} is more than 1 PiB, the most a size can be")
    return int(size)


def parse_rate(value: Any) -> float:
    """Bytes per second from ``"200MiB/s"`` or a plain number."""
    if isinstance(value, str) and value.strip().endswith("/s"):
        return float(parse_bytes(value.strip()[:-2]))
    return float(parse_bytes(value))


LocalPath = Annotated[Path, AfterValidator(check_local_path)]


_DURATION_PATTERN = r"^\s*(\d+(\.\d+)?\s*(ms|s|m|h|d)\s*)+$"


def _duration_schema(maximum: timedelta, minimum: timedelta = timedelta(0)) -> dict[str, Any]:
    number = {
        "type": "number",
        "minimum": minimum.total_seconds(),
        "maximum": maximum.total_seconds(),
        "description": "seconds",
    }
    return {"anyOf": [number, {"type": "string", "pattern": _DURATION_PATTERN}]}


def _within(maximum: timedelta, minimum: timedelta = timedelta(0)) -> BeforeValidator:
    return BeforeValidator(functools.partial(parse_duration, maximum=maximum, minimum=minimum))


_AS_TEXT = PlainSerializer(format_duration, return_type=str)
_LONG = timedelta(days=3650)

#: A timedelta written as ``"30s"`` or seconds, up to 30 days.
Duration = Annotated[
    timedelta, _within(MAX_DURATION), _AS_TEXT, WithJsonSchema(_duration_schema(MAX_DURATION))
]
#: Retention and the like: up to ten years.
LongDuration = Annotated[
    timedelta, _within(_LONG), _AS_TEXT, WithJsonSchema(_duration_schema(_LONG))
]
#: How often something polls: 10 ms to an hour, so that no loop spins on a zero.
Interval = Annotated[
    timedelta,
    _within(MAX_INTERVAL, MIN_INTERVAL),
    _AS_TEXT,
    WithJsonSchema(_duration_schema(MAX_INTERVAL, MIN_INTERVAL)),
]

_SIZE_SCHEMA = {
    "anyOf": [{"type": "integer", "minimum": 0, "maximum": MAX_BYTES}, {"type": "string"}]
}
ByteSize = Annotated[int, BeforeValidator(parse_bytes), WithJsonSchema(_SIZE_SCHEMA)]
ByteRate = Annotated[
    float,
    BeforeValidator(parse_rate),
    WithJsonSchema(
        {"anyOf": [{"type": "number", "minimum": 0, "maximum": MAX_BYTES}, {"type": "string"}]}
    ),
]


def check_web_url(url: str, *, instead: str) -> str:
    """An ``http(s)://`` URL with a host and no ``user:password@`` in it: the URL is shown in
    logs, events and notifications, and urllib does not send such credentials anyway. The
    error names what to write ``instead``, never the URL."""
    try:
        parts = urlsplit(url.strip())
        parts.port  # noqa: B018 (a bad port raises here, not later)
    except ValueError:
        raise ValueError("not a valid URL (a port must be a number)") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ValueError("not an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        raise ValueError(
            f"credentials in the URL are not accepted (the URL is shown in logs and "
            f"messages): give {instead}"
        )
    return url.strip()


#: Variables of the service's environment a child process also gets. It gets no others
#: but PATH, HOME, the user, the locale and the time zone (``secrecy.child_env``): the
#: service's environment holds the secrets ``password_env`` and the like name.
PassEnv = Annotated[
    list[str],
    Field(
        description="variables of the service's environment passed on to the command (it "
        "gets no others but PATH, HOME, USER, the locale and TZ)",
    ),
]

#: A health check's URL: its credentials go in the check's own settings.
HealthUrl = Annotated[
    str,
    AfterValidator(
        functools.partial(
            check_web_url,
            instead="user with password_file or password_env, or header with value_file",
        )
    ),
]
#: The webhook's URL: its token goes in ``bearer_token_file``.
WebhookUrl = Annotated[
    str, AfterValidator(functools.partial(check_web_url, instead="bearer_token_file"))
]


def resolve_secret(what: str, file: Path | None, env: str | None) -> str | None:
    """Read a secret from its file or environment variable; never echo it.

    Raises ``ConfigError`` naming the file or variable (not the value) when it
    cannot be read. Returns None when neither is given.
    """
    if file is not None:
        try:  # a regular file of at most 64 KiB: never /dev/zero, never a FIFO
            return read_text(file, limit=64 * 1024).strip()
        except ConfigError as exc:
            raise ConfigError(f"{what}: {exc}") from None
    if env is not None:
        value = os.environ.get(env)
        if value is None:
            raise ConfigError(f"{what}: environment variable {env} is not set")
        return value
    return None
