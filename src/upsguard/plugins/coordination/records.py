"""The JSON forms of what a coordination store holds, for every backend alike.

Values are typed dataclasses turned into JSON by pydantic's ``TypeAdapter``, so nothing
past a store's boundary handles a raw dict. Reading is lenient one way only: a field a
newer controller added is ignored, and a field this version has but the stored value
lacks takes its default, so the two controllers of a pair may run adjacent versions
during an upgrade. A value that is not JSON of the expected shape is a ``ValueError``.
"""

from __future__ import annotations

from typing import Any, TypeVar

from pydantic import TypeAdapter, ValidationError

from upsguard.plugins.coordination.base import (
    AloneNotice,
    Candidate,
    ControllerView,
    OwedCaches,
    StepMark,
)
from upsguard.runs import RunRecord

T = TypeVar("T")

_ADAPTERS: dict[type[Any], TypeAdapter[Any]] = {
    kind: TypeAdapter(kind)
    for kind in (Candidate, RunRecord, StepMark, AloneNotice, ControllerView, OwedCaches)
}


def encode(
    value: Candidate | RunRecord | StepMark | AloneNotice | ControllerView | OwedCaches,
) -> bytes:
    return _ADAPTERS[type(value)].dump_json(value)


def decode(kind: type[T], data: bytes) -> T:
    """``data`` read back as ``kind``; ``ValueError`` saying what is wrong, never the whole
    value (a record may be large)."""
    try:
        value: T = _ADAPTERS[kind].validate_json(data)
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(part) for part in first["loc"]) or "the value"
        raise ValueError(f"not a {kind.__name__}: {where}: {first['msg']}") from None
    return value
