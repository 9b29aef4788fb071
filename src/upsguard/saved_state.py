"""A small JSON file of what upsguard must put back later (a cache's user settings, what it
changed on a cluster), read at start and written whole at each change."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

V = TypeVar("V")


class SavedState(Generic[V]):
    """What a provider must put back later (the user's settings), per target, in a JSON file,
    so that a restarted upsguard, or the CLI in another process, still restores it."""

    def __init__(self, path: Path, what: str) -> None:
        self._path = path
        self._what = what
        self._values: dict[str, V] = {}
        with contextlib.suppress(OSError, ValueError):
            self._values = json.loads(path.read_text())

    def has(self, key: str) -> bool:
        return key in self._values

    def get(self, key: str, default: V) -> V:
        return self._values.get(key, default)

    def put(self, key: str, value: V) -> None:
        self._values[key] = value
        self._save()

    def drop(self, key: str) -> None:
        if self._values.pop(key, None) is not None:
            self._save()

    def _save(self) -> None:
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            tmp = self._path.with_suffix(".tmp")
            tmp.write_text(json.dumps(self._values, indent=1, sort_keys=True))
            tmp.replace(self._path)
        except OSError as exc:
            log.warning("cannot keep %s in %s: %s", self._what, self._path, exc.strerror)
