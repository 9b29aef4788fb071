"""An event's typed fields as the JSON the journal keeps beside its line of text.

The line (``events.describe``) is for people and may be reworded any day; what code needs
to know of an event afterwards (which cache, which step, which state) it reads from here
(the ``events.payload`` column, schema 5). Every field of the event's dataclass is kept,
but ``at`` (the row's own column): enums as their values, times as the journal's ISO text,
durations as seconds, nested dataclasses as objects, tuples as lists.

Events journaled before schema 5 have no payload (NULL): what they said is in their text
only, and nothing reads facts back out of it.
"""

from __future__ import annotations

import dataclasses
import enum
import json
import math
from collections.abc import Mapping
from datetime import datetime, timedelta
from typing import Any

from upsguard.events import Event
from upsguard.journal.rows import iso

Plain = None | bool | int | float | str | list["Plain"] | dict[str, "Plain"]
"""What JSON holds."""


def fields_of(event: Event) -> dict[str, Plain]:
    """The event's fields as plain values (``at`` left out: the row has it)."""
    return {
        f.name: plain(getattr(event, f.name)) for f in dataclasses.fields(event) if f.name != "at"
    }


def to_json(fields: Mapping[str, Plain]) -> str:
    return json.dumps(fields, separators=(",", ":"), allow_nan=False)


def from_json(text: str | None) -> dict[str, Any] | None:
    """A payload column as written by ``to_json``; None for an event journaled before
    payloads were kept."""
    if text is None:
        return None
    found = json.loads(text)
    return found if isinstance(found, dict) else None


def plain(value: object) -> Plain:
    """A field's value as JSON can hold it. A value of a type not listed here is kept as its
    text rather than refused: a payload must never keep an event out of the journal."""
    if isinstance(value, enum.Enum):
        return plain(value.value)
    if value is None or isinstance(value, bool | int | str):
        return value
    if isinstance(value, float):
        return value if math.isfinite(value) else None  # JSON has no inf: "not known"
    if isinstance(value, datetime):
        return iso(value)
    if isinstance(value, timedelta):
        return value.total_seconds()
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return {f.name: plain(getattr(value, f.name)) for f in dataclasses.fields(value)}
    if isinstance(value, Mapping):
        return {str(k): plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else value
        return [plain(v) for v in items]
    return str(value)
