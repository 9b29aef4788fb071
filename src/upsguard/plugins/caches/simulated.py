"""A cache that exists only in the simulator and the demo: dirty data drains at a set rate
once the cache is out of write-back, and guests' writes add to it while it is in write-back."""

from __future__ import annotations

from upsguard.clock import Clock
from upsguard.config.caches import SimulatedCacheSettings
from upsguard.models import CacheMode, CacheState, CacheTarget


class SimulatedCache:
    def __init__(
        self,
        settings: SimulatedCacheSettings,
        clock: Clock,
        dirty: int | None = None,
        rate: float | None = None,
    ) -> None:
        self.name = settings.name
        self._clock = clock
        self._target = CacheTarget(settings.name, settings.name)
        self._dirty = float(settings.dirty if dirty is None else dirty)
        self._rate = float(settings.destage_rate if rate is None else rate)
        self._mode = CacheMode.WRITE_BACK
        self._since = clock.monotonic()
        self.mode_changes: list[CacheMode] = []

    async def targets(self) -> list[CacheTarget]:
        return [self._target]

    def _dirty_now(self) -> float:
        if self._mode is CacheMode.WRITE_BACK:
            return self._dirty
        drained = self._rate * (self._clock.monotonic() - self._since)
        return max(0.0, self._dirty - drained)

    def write(self, nbytes: int) -> None:
        """Guests wrote ``nbytes`` through the cache: dirty data while it is in write-back;
        in any other mode the writes go through to the backing store."""
        if self._mode is CacheMode.WRITE_BACK:
            self._dirty += nbytes

    @property
    def mode(self) -> CacheMode:
        return self._mode

    def dirty_bytes(self) -> int:
        """The dirty data now, without a provider's read (for a test watching the world)."""
        return int(self._dirty_now())

    async def read(self, target: CacheTarget) -> CacheState:
        dirty = self.dirty_bytes()
        clean = dirty == 0 and self._mode.holds_no_new_writes
        return CacheState(target, self._clock.now(), self._mode, dirty, clean)

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        self._dirty = self._dirty_now()
        self._since = self._clock.monotonic()
        if mode is not self._mode:
            self.mode_changes.append(mode)
        self._mode = mode

    async def flush(self, target: CacheTarget) -> None:
        return None

    async def close(self) -> None:
        return None
