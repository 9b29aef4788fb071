"""The override commands and the history, as every caller sees them.

Three doors lead to the same overrides: the local API (the CLI's way in, and scripts'), the
web page's controls, and the CLI acting itself when no service runs. They share this
module, so a request is checked by one set of rules and answered by one set of types:

- a request is a frozen dataclass (``Hold``, ``Release``, ``Trigger``, ``Abort``), made
  by its ``of`` (who and why cleaned, the rules checked) or read from a JSON body by
  ``parse``; a hold needs a reason, the others say who asked when none is given
  (``controller.overrides``);
- an answer is a msgspec struct (``HoldAnswer``, ``ReleaseAnswer``, ``TriggerAnswer``,
  ``AbortAnswer``): the service sends it as JSON and the CLI reads it back into the model;
- an error has one HTTP status (``http_status``), and the CLI turns a status back into the
  error (``error_from``);
- the history (``history``) is built here, from the journal, whether the service answers
  or the CLI reads the journal itself.

What the transport adds stays with it: the API's caller is the kernel's word
(``SO_PEERCRED``), the page's is its logged-in operator, who must also confirm.
"""

from __future__ import annotations

import json
import unicodedata
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import msgspec

from upsguard.errors import ApiBusy, BadRequest, PermanentError, TemporaryError, UpsguardError
from upsguard.models import Direction, ResourceId, RunId

if TYPE_CHECKING:
    from upsguard.journal import Journal

MAX_REASON = 500
MAX_NAME = 200
MAX_ROWS = 1000


def clean_text(value: str, limit: int) -> str:
    """Text a caller gives is journaled and shown on terminals: control characters (newlines,
    ANSI escapes, bidi overrides) would forge lines there, so line breaks and tabs become
    spaces, the other controls go, and the rest is cut at ``limit`` characters."""
    kept = (
        " " if ch.isspace() else ch
        for ch in value
        if ch.isspace() or unicodedata.category(ch) not in ("Cc", "Cf", "Cs")
    )
    text = "".join(kept).strip()
    return text if len(text) <= limit else text[: limit - 1] + "…"


# -- requests ---------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Hold:
    """Defer the automatic actions (down to the critical floor), for a reason."""

    who: str
    reason: str

    @classmethod
    def of(cls, who: str, reason: str) -> Hold:
        who, reason = _cleaned(who, reason)
        if not reason:
            raise BadRequest("hold needs a reason: it is journaled with the hold")
        return cls(who, reason)


@dataclass(frozen=True, slots=True)
class Release:
    """End a hold; the reason may be left out."""

    who: str
    reason: str

    @classmethod
    def of(cls, who: str, reason: str = "") -> Release:
        return cls(*_cleaned(who, reason))


@dataclass(frozen=True, slots=True)
class Trigger:
    """Run the shutdown or startup runbook now: the whole site, or ``only`` these resources
    (whether they are the site's is for ``Overrides`` to say: it knows the site)."""

    who: str
    direction: Direction
    only: tuple[ResourceId, ...]
    reason: str

    @classmethod
    def of(cls, who: str, direction: str, only: Sequence[str], reason: str = "") -> Trigger:
        if direction not in (Direction.SHUTDOWN, Direction.STARTUP):
            shown = clean_text(direction, MAX_NAME)
            raise BadRequest(f"trigger: '{shown}' is neither shutdown nor startup")
        if len(only) > MAX_ROWS:
            raise BadRequest(f"'only' names more than {MAX_ROWS} resources")
        chosen = tuple(ResourceId(clean_text(rid, MAX_NAME)) for rid in only)
        who, reason = _cleaned(who, reason)
        return cls(who, Direction(direction), chosen, reason)


@dataclass(frozen=True, slots=True)
class Abort:
    """Cancel the run in progress, and hold so that the policy does not start it again."""

    who: str
    reason: str

    @classmethod
    def of(cls, who: str, reason: str = "") -> Abort:
        return cls(*_cleaned(who, reason))


Request = Hold | Release | Trigger | Abort
COMMANDS = ("hold", "release", "trigger", "abort")
"""The commands' names: the API's routes (``POST /hold``) and the page's (``/api/hold``)."""


def parse(command: str, body: Mapping[str, Any], who: str) -> Request:
    """The request ``body`` asks of ``command`` (one of ``COMMANDS``), for ``who``; a body
    that breaks a rule is a ``BadRequest`` naming the field."""
    reason = text_field(body, "reason", MAX_REASON)
    if command == "hold":
        return Hold.of(who, reason)
    if command == "release":
        return Release.of(who, reason)
    if command == "trigger":
        return Trigger.of(
            who, text_field(body, "direction", MAX_NAME), _names(body, "only"), reason
        )
    if command == "abort":
        return Abort.of(who, reason)
    raise BadRequest(f"no command '{clean_text(command, MAX_NAME)}'", status=404)


def text_field(body: Mapping[str, Any], name: str, limit: int) -> str:
    """The text of ``name`` in ``body``, cleaned ("" when it is not there)."""
    value = body.get(name)
    if value is None:
        return ""
    if not isinstance(value, str):
        raise BadRequest(f"'{name}' must be a string")
    return clean_text(value, limit)


def _names(body: Mapping[str, Any], name: str) -> list[str]:
    value = body.get(name) or []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise BadRequest(f"'{name}' must be a list of resource ids")
    return value


def _cleaned(who: str, reason: str) -> tuple[str, str]:
    return clean_text(who, MAX_NAME), clean_text(reason, MAX_REASON)


def json_object(raw: bytes) -> dict[str, Any]:
    """A request's body: a JSON object (an empty body is an empty one), or a ``BadRequest``."""
    if not raw:
        return {}
    try:
        parsed = json.loads(raw)
    except RecursionError:
        raise BadRequest("the body is JSON nested too deeply") from None
    except ValueError:
        raise BadRequest("the body is not JSON") from None
    if not isinstance(parsed, dict):
        raise BadRequest("the body must be a JSON object")
    return parsed


# -- answers ----------------------------------------------------------------------------------


class _Answer(msgspec.Struct, frozen=True):
    """An answer the CLI reads back. It is a msgspec struct, not a pydantic model, so that
    ``upsguard hold`` starts as fast as ``status`` (``upsguard.status`` says why). Each
    answer says ``frozen`` and ``kw_only`` again, for the reason ``status._Model`` gives."""


class HoldAnswer(_Answer, frozen=True, kw_only=True):
    held: bool = True
    reason: str
    """As journaled (cleaned)."""


class ReleaseAnswer(_Answer, frozen=True, kw_only=True):
    held: bool = False
    was: str | None
    """The reason of the hold released, or None when nothing was held."""


class TriggerAnswer(_Answer, frozen=True, kw_only=True):
    run: RunId
    direction: Direction
    only: list[ResourceId]
    """Empty for the whole site."""


class AbortAnswer(_Answer, frozen=True, kw_only=True):
    aborted: RunId | None
    """The run cancelled, or None when none was in progress."""
    held: str
    """The reason of the hold the abort implies."""


Answer = HoldAnswer | ReleaseAnswer | TriggerAnswer | AbortAnswer


# -- errors -----------------------------------------------------------------------------------


def http_status(exc: UpsguardError) -> int:
    """The one HTTP status of an error, for the API and the page alike: a request that is
    wrong says how (400, 404, 408, 413), a bound reached is 503, a state that forbids it now
    (a run in progress, a standby) 409, any other refusal 400."""
    if isinstance(exc, BadRequest):
        return exc.status
    if isinstance(exc, ApiBusy):
        return 503
    if isinstance(exc, TemporaryError):
        return 409
    return 400


def refusal(exc: UpsguardError) -> tuple[int, dict[str, str]]:
    """The status and the JSON body that say ``exc``."""
    return http_status(exc), {"error": str(exc)}


def error_from(status: int, message: str) -> UpsguardError:
    """The error a status stands for, on the caller's side: try again later (409, 503), or
    not as it is."""
    if status in (409, 503):
        return TemporaryError(message)
    return PermanentError(message)


# -- history ----------------------------------------------------------------------------------


class History(_Answer, frozen=True, kw_only=True):
    """The last runs (with their steps), and the phases, overrides and cache operations
    around them: ``upsguard history``, from the service or from the journal."""

    runs: list[dict[str, Any]]
    phases: list[dict[str, Any]]
    overrides: list[dict[str, Any]]
    cache_ops: list[dict[str, Any]]


def history(journal: Journal, limit: int) -> History:
    """The history of the last ``limit`` runs; five times as many of the other rows."""
    read = journal.read
    return History(
        runs=[r.to_dict() for r in read.runs(limit=limit)],
        phases=[p.to_dict() for p in read.phases(limit=limit * 5)],
        overrides=[o.to_dict() for o in read.overrides(limit=limit * 5)],
        cache_ops=[c.to_dict() for c in read.cache_ops(limit=limit * 5)],
    )
