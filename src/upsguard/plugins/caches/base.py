"""The ``CacheProvider`` protocol: one configured cache and its targets."""

from __future__ import annotations

from typing import Any, Protocol, runtime_checkable

from upsguard.clock import Clock
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


class CacheProviderFactory(Protocol):
    def __call__(self, settings: Any, clock: Clock) -> CacheProvider: ...
