"""Watching one UPS: never an exception for the policy layer, never a lost UPS taken as on line.

``UpsWatch`` wraps a ``UpsSource``. When the source fails, the policy layer
gets the last known reading marked ``lost`` with its age; while on battery it
also computes the observed depletion rate (%/min over a sliding window) and
the runtime that rate implies, because aged batteries and hot rooms drain
faster than the UPS's own estimate says.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

from upsguard.clock import Clock
from upsguard.errors import UpsguardError
from upsguard.models import LinkState, UpsFlag, UpsReading
from upsguard.plugins.ups.base import UpsSource

log = logging.getLogger(__name__)


class UpsWatch:
    def __init__(self, source: UpsSource, clock: Clock, window_s: float = 300.0) -> None:
        self.source = source
        self.name = source.name
        self._clock = clock
        self._window_s = window_s
        self._samples: deque[tuple[float, float]] = deque()
        self.last: UpsReading | None = None
        self.last_ok: UpsReading | None = None
        self.last_error: str | None = None

    async def poll(self) -> UpsReading:
        """A reading now: fresh, or the last known one marked lost with its age."""
        try:
            reading = await self.source.read()
        except UpsguardError as exc:
            reading = self._lost(str(exc))
        else:
            self.last_error = None
            if reading.link is LinkState.OK:
                self.last_ok = reading
        self._track(reading)
        self.last = reading
        return reading

    def _lost(self, error: str) -> UpsReading:
        if error != self.last_error:
            log.warning("%s: %s", self.name, error)
        self.last_error = error
        now = self._clock.now()
        if self.last_ok is None:
            return UpsReading(ups=self.name, at=now, link=LinkState.LOST, age_s=float("inf"))
        age = (now - self.last_ok.at).total_seconds()
        flags = self.last_ok.flags - {UpsFlag.OL} if self.last_ok.on_battery else self.last_ok.flags
        return dataclasses.replace(self.last_ok, flags=flags, link=LinkState.LOST, age_s=age)

    def _track(self, reading: UpsReading) -> None:
        if not reading.on_battery or reading.link is not LinkState.OK:
            if not reading.on_battery:
                self._samples.clear()
            return
        if reading.charge_pct is None:
            return
        now = self._clock.monotonic()
        self._samples.append((now, reading.charge_pct))
        while self._samples and now - self._samples[0][0] > self._window_s:
            self._samples.popleft()

    @property
    def depletion_pct_per_min(self) -> float | None:
        """Charge lost per minute over the window (least squares), None until two samples."""
        if len(self._samples) < 2:
            return None
        times = [t for t, _ in self._samples]
        charges = [c for _, c in self._samples]
        mean_t = sum(times) / len(times)
        mean_c = sum(charges) / len(charges)
        spread = sum((t - mean_t) ** 2 for t in times)
        if spread <= 0:
            return None
        slope = sum((t - mean_t) * (c - mean_c) for t, c in self._samples) / spread
        return max(0.0, -slope * 60.0)

    @property
    def observed_runtime_s(self) -> float | None:
        """The runtime left if the charge keeps falling at the observed rate."""
        rate = self.depletion_pct_per_min
        if not rate or self.last is None or self.last.charge_pct is None:
            return None
        return self.last.charge_pct / rate * 60.0

    def runtime_s(self) -> float | None:
        """The faster (smaller) of the UPS's own estimate and the observed one, counted down
        from the last known value while the link is lost."""
        if self.last is None:
            return None
        reported = self.last.runtime_s
        if reported is not None and self.last.link is not LinkState.OK:
            reported = max(0.0, reported - self.last.age_s)
        observed = self.observed_runtime_s
        candidates = [v for v in (reported, observed) if v is not None]
        return min(candidates) if candidates else None
