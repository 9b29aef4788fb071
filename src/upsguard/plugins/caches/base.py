"""The ``CacheProvider`` protocol: one configured cache and its targets."""

from __future__ import annotations

import contextlib
import json
import logging
from pathlib import Path
from typing import Any, Generic, Protocol, TypeVar, runtime_checkable

from upsguard.clock import Clock
from upsguard.errors import PermanentError
from upsguard.findings import Finding
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget


@runtime_checkable
class CacheProvider(Protocol):
    """Manages one ``caches:`` entry: its devices, their mode, their dirty data.

    Methods raise ``TemporaryError`` when a command or file cannot be read
    now (retry later) and ``PermanentError`` when the device is gone or the
    tool refuses; one target's failure never affects another's result.
    """

    name: CacheName

    async def targets(self) -> list[CacheTarget]:
        """The devices or objects this cache entry manages."""
        ...

    async def read(self, target: CacheTarget) -> CacheState:
        """Mode and dirty data now; ``clean`` only when nothing is left to destage."""
        ...

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        """Switch the mode; returns once accepted, without waiting for destage.

        Switching to write-through also does what makes the destage go fast
        (bcache: ``writeback_percent`` 0); switching back restores what the
        user had. Idempotent.
        """
        ...

    async def flush(self, target: CacheTarget) -> None:
        """Hurry the destage where the device offers it; a no-op elsewhere."""
        ...

    async def close(self) -> None:
        """Release connections (SSH). Never raises."""
        ...


@runtime_checkable
class CacheDiagnosis(Protocol):
    """A provider that can check, without flipping anything, that upsguard may flip its
    cache: an optional capability, asked by ``upsguard doctor``. Reading the mode and the
    dirty bytes the doctor checks itself, through ``targets`` and ``read``.
    """

    async def diagnose(self, targets: list[CacheTarget]) -> list[Finding]:
        """Whether the mode of each of ``targets`` can be switched by the user upsguard runs
        as (here or over SSH): the files it writes are writable, the tools it runs are
        there and run with enough rights.

        Never switches a mode and never writes. Each problem is a ``warn`` or ``fail``
        finding (``Area.CACHE``, subject: the cache's name) with its fix; an error it did
        not expect propagates, and the doctor makes it a ``fail``.
        """
        ...


class CacheProviderFactory(Protocol):
    def __call__(self, settings: Any, clock: Clock) -> CacheProvider: ...


log = logging.getLogger(__name__)
V = TypeVar("V")


def require_targets(found: list[CacheTarget], nothing: str) -> list[CacheTarget]:
    """Found targets; none at all is an error, never "nothing dirty, all clean"."""
    if not found:
        raise PermanentError(f"{nothing}: set 'targets' or check the settings")
    return found


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
