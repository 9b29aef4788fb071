"""One exception tree: every error upsguard raises on purpose is defined in ``errors.py`` and
drawn in its docstring, so a reader finds all of them, and what each means, in one place."""

from __future__ import annotations

import importlib
import pkgutil

import upsguard
from upsguard import errors


def every_module() -> list[str]:
    names = [m.name for m in pkgutil.walk_packages(upsguard.__path__, "upsguard.")]
    # heavy or optional SDKs load only where a site uses them; their modules are still ours
    return [n for n in names if not n.endswith("__main__")]


def test_every_upsguard_error_lives_in_errors_py_and_is_drawn_in_its_tree() -> None:
    for name in every_module():
        try:
            importlib.import_module(name)
        except ImportError:  # an optional SDK missing here (libvirt): its module is checked too
            continue
    found = {cls for cls in _subclasses(errors.UpsguardError)}
    outside = sorted(
        f"{c.__module__}.{c.__name__}" for c in found if c.__module__ != errors.__name__
    )
    assert outside == []
    tree = errors.__doc__ or ""
    undrawn = sorted(c.__name__ for c in found if c.__name__ not in tree)
    assert undrawn == []


def _subclasses(cls: type) -> set[type]:
    out: set[type] = set()
    sub: type
    for sub in cls.__subclasses__():
        out |= {sub, *_subclasses(sub)}
    return out
