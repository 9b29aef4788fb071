"""From a file on disk to typed models, with every problem reported at once."""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from upsguard.config.checks import site_problems
from upsguard.config.site import SiteConfig
from upsguard.config.source import SourceText, load_yaml, suggest
from upsguard.errors import ConfigError
from upsguard.memory import collector_paused

M = TypeVar("M", bound=BaseModel)


def load_site(path: Path | str) -> SiteConfig:
    """Parse and check a site file; raises ``ConfigError`` listing every problem with file:line.

    The cyclic collector waits while the file is read (see ``upsguard.memory``); then the
    model is moved out of its reach for good (``gc.freeze``): it lives as long as the
    process, and the 60,000 objects of a 5,000-VM site would otherwise be rescanned for
    30 ms by every full collection, several of which planning triggers. Reference counting
    still frees a replaced model: none of it forms cycles.
    """
    with collector_paused():
        source = load_yaml(Path(path))
        site = validate(SiteConfig, source)
        problems = site_problems(site)
        if problems:
            raise ConfigError([source.problem(loc, msg) for loc, msg in problems])
        gc.freeze()
    return site


def validate(model: type[M], source: SourceText) -> M:
    if not isinstance(source.data, dict):
        raise ConfigError(f"{source.file}:1: expected a mapping of settings at the top")
    try:
        return model.model_validate(source.data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source)) from None


def _describe(exc: ValidationError, source: SourceText) -> list[str]:
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        problems.append(source.problem(loc, _message(error, loc, source)))
    return list(dict.fromkeys(problems))


def _message(error: Any, loc: tuple[str | int, ...], source: SourceText) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        path = source.known_path(loc)
        field = str(path[-1])
        known = _known_fields(path[:-1], source)
        return f"unknown field '{field}'{suggest(field, known)}"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return message[:1].lower() + message[1:]


def _known_fields(parent: tuple[str | int, ...], source: SourceText) -> list[str]:
    """Names allowed next to an unknown one; read from the models by walking the path."""
    from upsguard.config.schema_walk import fields_at

    return fields_at(SiteConfig, parent, source.data)
