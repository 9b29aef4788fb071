"""From a file on disk to typed models, with every problem reported at once.

Field problems and cross-section problems (unknown references, cycles) come in one
report: when some entries fail validation, the cross-section checks run on the entries
that passed (``upsguard.config.partial``), so a user fixes everything in one round.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, TypeVar

from pydantic import BaseModel, ValidationError

from upsguard.config.checks import PluginNames, Problem, plugin_problems, site_problems
from upsguard.config.files import named_files
from upsguard.config.partial import partial_site
from upsguard.config.site import SiteConfig
from upsguard.config.source import SourceText, is_secret, load_yaml, suggest
from upsguard.config.values import shorten
from upsguard.errors import ConfigError

M = TypeVar("M", bound=BaseModel)

#: The most entries a section (resources, ups, caches, ...) may have.
MAX_ENTRIES = 20_000


def load_site(path: Path | str, plugins: PluginNames | None = None) -> SiteConfig:
    """Parse and check a site file; raises ``ConfigError`` listing every problem with file:line.
    ``plugins``: the plugin names there are, to check the site's types against."""
    return check_site(load_yaml(Path(path)), plugins)


def check_site(source: SourceText, plugins: PluginNames | None = None) -> SiteConfig:
    """The site of a parsed file, or ``ConfigError`` with every problem found in one pass."""
    data = _top_mapping(source)
    _within_limits(data, source)
    try:
        site = SiteConfig.model_validate(data)
    except ValidationError as exc:
        problems = _describe(exc, source, SiteConfig)
        partial = partial_site(data, exc)
        problems += [source.problem(loc, msg) for loc, msg in partial.problems()]
        raise ConfigError(list(dict.fromkeys(problems))) from None
    found: list[Problem] = site_problems(site)
    if plugins is not None:
        found += plugin_problems(site, plugins)
    if found:
        raise ConfigError([source.problem(loc, msg) for loc, msg in found])
    kept = [p for i in range(len(site.ups)) for p in _ups_paths(i)]
    kept += [("resources", i) for i in range(len(site.resources))]
    kept += [("caches", i) for i in range(len(site.caches))]
    kept += [("platforms", key) for key in site.platforms]
    kept += [named.loc for named in named_files(site)]  # validate warns of missing ones
    if site.ha is not None:
        kept += [("ha",), ("ha", "endpoints")]
    site.keep_origin(source.origin(kept))
    return site


def _ups_paths(index: int) -> list[tuple[str | int, ...]]:
    return [("ups", index), ("ups", index, "runtime_at")]


def validate(model: type[M], source: SourceText) -> M:
    data = _top_mapping(source)
    _within_limits(data, source)
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_describe(exc, source, model)) from None


def _top_mapping(source: SourceText) -> dict[Any, Any]:
    if not isinstance(source.data, dict):
        raise ConfigError(f"{source.file}:1: expected a mapping of settings at the top")
    return source.data


def _within_limits(data: dict[Any, Any], source: SourceText) -> None:
    for section, value in data.items():
        if isinstance(value, list | dict) and len(value) > MAX_ENTRIES:
            raise ConfigError(
                source.problem(
                    (section,),
                    f"{len(value):,} entries: a section holds at most {MAX_ENTRIES:,} "
                    "(see docs/site-file.md, Limits)",
                )
            )


def _describe(exc: ValidationError, source: SourceText, model: type[BaseModel]) -> list[str]:
    problems: list[str] = []
    for error in exc.errors(include_url=False):
        loc = tuple(error["loc"])
        problems.append(source.problem(loc, _message(error, loc, source, model)))
    return list(dict.fromkeys(problems))


def _message(
    error: Any, loc: tuple[str | int, ...], source: SourceText, model: type[BaseModel]
) -> str:
    kind = error["type"]
    if kind == "missing":
        return "required field is missing"
    if kind == "extra_forbidden":
        path = source.known_path(loc)
        field = str(path[-1])
        known = _known_fields(model, path[:-1], source)
        return f"unknown field {shorten(field)!r}{suggest(field, known)}"
    if is_secret(loc) and kind in ("value_error", "assertion_error"):
        return "not a valid value (not shown: the field holds a secret)"
    if kind == "path_type":
        return "expected a path, written as a string like /etc/upsguard/nut.pw"
    if kind == "float_type" and isinstance(error.get("input"), int):
        return "the number is too large"
    message = str(error["msg"])
    message = message.removeprefix("Value error, ").removeprefix("Assertion failed, ")
    return _lower_first_word(message)


def _lower_first_word(message: str) -> str:
    """``Input should be ...`` reads ``input should be ...`` after the path; an acronym
    (``SNMP version 3 needs 'user'``) keeps its capitals."""
    first = message.split(" ", 1)[0]
    if first[1:2].isupper():
        return message
    return message[:1].lower() + message[1:]


def _known_fields(
    model: type[BaseModel], parent: tuple[str | int, ...], source: SourceText
) -> list[str]:
    """Names allowed next to an unknown one; read from the models by walking the path."""
    from upsguard.config.schema_walk import fields_at

    return fields_at(model, parent, source.data)
