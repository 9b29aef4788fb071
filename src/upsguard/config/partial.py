"""What did validate of a site that did not: the cross-section checks run on it.

When some entries of a site file fail validation, the others can still be checked for
unknown references and cycles, so that ``validate`` reports every problem in one pass
instead of reporting reference problems only once the field problems are fixed. The
entries that failed are left out; the names they carry count as known, so that a
reference to an entry with a bad field is not called unknown as well.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pydantic import TypeAdapter, ValidationError

from upsguard.config.checks import Loc, Problem, Unchecked, site_problems
from upsguard.config.site import SiteConfig

#: The key naming an entry of each list section that others refer to.
_NAME_KEY = {"ups": "name", "resources": "id", "caches": "name"}


@dataclass
class PartialSite:
    """The entries that validated, and where each list entry was in the file."""

    site: SiteConfig | None
    unchecked: Unchecked = field(default_factory=Unchecked)
    positions: dict[str, list[int]] = field(default_factory=dict)

    def problems(self) -> list[Problem]:
        if self.site is None:
            return []
        return [(self._in_file(loc), msg) for loc, msg in site_problems(self.site, self.unchecked)]

    def _in_file(self, loc: Loc) -> Loc:
        """``resources[2]`` of the partial site is ``resources[5]`` of the file when three
        entries before it failed."""
        if len(loc) >= 2 and isinstance(loc[1], int) and str(loc[0]) in self.positions:
            return (loc[0], self.positions[str(loc[0])][loc[1]], *loc[2:])
        return loc


@functools.cache
def _section(name: str) -> TypeAdapter[Any]:
    """The validator of one section of the site: made once, as making one builds its schema
    (milliseconds, several times what checking a small site's section takes)."""
    annotation = SiteConfig.model_fields[name].annotation
    if annotation is None:  # partial_site checks only the sections that have a type
        raise KeyError(name)
    return TypeAdapter[Any](annotation)


def partial_site(data: dict[Any, Any], exc: ValidationError) -> PartialSite:
    failed: dict[str, set[Any]] = {}
    for error in exc.errors(include_url=False):
        loc = error["loc"]
        if not loc:
            return PartialSite(None)
        failed.setdefault(str(loc[0]), set()).add(loc[1] if len(loc) > 1 else None)
    values: dict[str, Any] = {}
    skipped: dict[str, frozenset[str] | None] = {}
    positions: dict[str, list[int]] = {}
    for name, info in SiteConfig.model_fields.items():
        if name not in data or info.annotation is None:
            continue
        raw, bad = data[name], failed.get(name, set())
        if None in bad:  # the section itself is wrong (not a list, empty, ...)
            skipped[name] = None
            continue
        if isinstance(raw, list) and bad:
            positions[name] = [i for i in range(len(raw)) if i not in bad]
            skipped[name] = _names((raw[i] for i in sorted(bad) if i < len(raw)), name)
            raw = [raw[i] for i in positions[name]]
        elif isinstance(raw, dict) and bad and name == "platforms":
            skipped[name] = frozenset(str(k) for k in bad)
            raw = {k: v for k, v in raw.items() if k not in bad}
        try:
            values[name] = _section(name).validate_python(raw)
        except ValidationError:
            skipped[name] = None
    values.setdefault("site", "")
    values.setdefault("ups", [])  # a section that failed as a whole: nothing of it to check
    unchecked = Unchecked(
        ups=skipped.get("ups", frozenset()),
        resources=skipped.get("resources", frozenset()),
        platforms=skipped.get("platforms", frozenset()),
    )
    return PartialSite(SiteConfig.model_construct(**values), unchecked, positions)


def _names(entries: Iterable[Any], section: str) -> frozenset[str] | None:
    """The names the failed entries would have had; None when one has no readable name
    (then any reference into the section may be to it)."""
    key = _NAME_KEY.get(section)
    names: set[str] = set()
    for entry in entries:
        name = entry.get(key) if isinstance(entry, dict) and key else None
        if not isinstance(name, str):
            return None
        names.add(name)
    return frozenset(names)
