"""Watching one UPS: never an exception for the policy layer, never a lost UPS taken as on line.

``UpsWatch`` wraps a ``UpsSource`` and is what the policy layer polls:

- ``poll()`` never raises: one broken UPS must not blind the controller to the others.
  When the source fails (unreachable, wrong password, unknown UPS, a plugin's bug) it
  returns the last known reading marked ``lost`` with its age, and ``last_error`` says
  why; when the source says its data is stale (NUT ``DATA-STALE``), the last known
  values marked ``stale``, and ``last_error`` says that: a UPS whose data is stale cannot
  be read either. Neither is ever ``on_line``; what a feed makes of it is
  ``policies.power``'s lost-contact rule.
- **Blip filter.** A link that drops while the UPS last said it was on mains is
  *held* on line for ``link_grace_s`` (15 s by default, the site file's
  ``link_grace``): the reading says ``lost``, but ``figures().held_online`` lets
  the feed count that UPS as supplying, so a 4-second network blip is not an
  outage. Past the grace the UPS counts as off line from the moment it was lost
  (``off_line_for_s`` includes the grace), so grace and the policy's own
  ``on_battery.after`` overlap instead of adding up. The grace lives here and
  not in the policy because only the watch knows "no news" from "the UPS said OB".
  A short ``OB`` reported by a UPS that answers *is* news: debouncing it is the
  policy's ``on_battery.after``, fed by ``FeedReading.at_risk_for_s``.
- **Self-test is not an outage.** A reading with ``CAL`` (battery test or
  calibration) counts as supplying from mains unless it also says ``LB``/``FSD``
  or the input voltage is known and below ``power.MAINS_PRESENT_V``; no depletion is
  computed from it.
- **A test upsguard started.** While a battery test the service asked for is under way
  (``expect_self_test``), a live reading on battery with mains present is marked ``CAL``:
  many UPSes report a quick test as plain ``OB``. A low battery, FSD, or an input voltage
  below ``power.MAINS_PRESENT_V`` is still an outage; so is anything after the test.
- **Observed discharge.** While on battery the watch fits the charge over a
  sliding window (least squares, %/min, once the samples span ``min_span_s``,
  60 s by default, since charge comes in whole percents) and the runtime that rate implies,
  because aged batteries and hot rooms drain faster than the UPS's own
  estimate; ``runtime_s()`` is the smaller of the two, counted down by the age
  of the data when the link is not ok.
"""

from __future__ import annotations

import dataclasses
import logging
from collections import deque

from upsguard.clock import Clock
from upsguard.config.ups import UpsConfig
from upsguard.errors import UpsguardError
from upsguard.models import LinkState, UpsFlag, UpsReading
from upsguard.plugins.ups.base import UpsSource
from upsguard.policies.power import DEFAULT_PEUKERT, UpsFigures, on_mains, self_test

log = logging.getLogger(__name__)

STALE_ERROR = "its data is stale"
"""``last_error`` while the source answers with stale data (its driver stopped updating)."""
DEFAULT_LINK_GRACE_S = 15.0
DEFAULT_MIN_SPAN_S = 60.0
"""No drain rate from samples spanning less: a UPS reports whole percents, and one step
seen 5 s into an outage would read as 12 %/min."""


class UpsWatch:
    def __init__(
        self,
        source: UpsSource,
        clock: Clock,
        window_s: float = 300.0,
        link_grace_s: float = DEFAULT_LINK_GRACE_S,
        min_span_s: float = DEFAULT_MIN_SPAN_S,
        peukert: float = DEFAULT_PEUKERT,
    ) -> None:
        """``peukert``: the UPS's ``peukert_exponent``, for a feed that counts how its
        runtime shrinks when another UPS's share of the load moves to it."""
        self.source = source
        self.name = source.name
        self._clock = clock
        self._window_s = window_s
        self.min_span_s = min_span_s
        self.link_grace_s = link_grace_s
        self.peukert = peukert
        self._samples: deque[tuple[float, float]] = deque()
        self._fit = _LineFit()
        self.last: UpsReading | None = None
        self.last_ok: UpsReading | None = None
        self.last_error: str | None = None
        self._link_bad_since: float | None = None
        self._off_since: float | None = None
        self.held_online = False
        self.off_line_for_s = 0.0
        self._self_test_until: float | None = None

    def expect_self_test(self, until: float | None) -> None:
        """upsguard asked this UPS for a battery test that ends by ``until`` (the clock's
        monotonic seconds): its readings on battery until then are the test's. None: over."""
        self._self_test_until = until

    @property
    def self_test_until(self) -> float | None:
        """When the battery test upsguard asked for ends, while one is expected."""
        return self._self_test_until

    def _mark_self_test(self, reading: UpsReading) -> UpsReading:
        until = self._self_test_until
        if until is None or self._clock.monotonic() > until or UpsFlag.CAL in reading.flags:
            return reading
        if reading.link is not LinkState.OK or not reading.on_battery:
            return reading
        marked = dataclasses.replace(reading, flags=reading.flags | {UpsFlag.CAL})
        return marked if self_test(marked) else reading

    @classmethod
    def for_config(cls, source: UpsSource, config: UpsConfig, clock: Clock) -> UpsWatch:
        """A watch with the UPS entry's own settings (``link_grace``, ``peukert_exponent``)."""
        return cls(
            source,
            clock,
            link_grace_s=config.link_grace.total_seconds(),
            peukert=config.peukert_exponent,
        )

    async def poll(self) -> UpsReading:
        """A reading now: fresh, or the last known one marked lost or stale with its age."""
        try:
            reading = await self.source.read()
        except UpsguardError as exc:
            reading = self._lost(str(exc))
        except Exception as exc:  # a plugin's bug must not stop the watch of the others
            if self.last_error is None:
                log.exception("%s: the UPS source failed unexpectedly", self.name)
            reading = self._lost(f"the UPS source failed: {type(exc).__name__}: {exc}")
        else:
            reading = self._mark_self_test(reading)
            if reading.link is LinkState.OK:
                if self.last_error is not None:
                    log.warning("%s: answering again", self.name)
                self.last_error = None
                self.last_ok = reading
            else:
                reading = self._stale(reading)
        now = self._clock.monotonic()
        self._follow_link(reading, now)
        self._track(reading, now)
        self.last = reading
        return reading

    def _lost(self, error: str) -> UpsReading:
        if error != self.last_error:
            log.warning("%s", error if self.name in error else f"{self.name}: {error}")
        self.last_error = error
        return self._aged(UpsReading(ups=self.name, at=self._clock.now()), LinkState.LOST)

    def _stale(self, reading: UpsReading) -> UpsReading:
        """A stale answer: the last known values, with the source's detail in ``raw``."""
        if self.last_error != STALE_ERROR:
            log.warning("%s: %s", self.name, STALE_ERROR)
        self.last_error = STALE_ERROR
        aged = self._aged(reading, LinkState.STALE)
        return dataclasses.replace(aged, raw={**aged.raw, **reading.raw})

    def _aged(self, fresh: UpsReading, link: LinkState) -> UpsReading:
        if self.last_ok is None:
            return dataclasses.replace(fresh, link=link, age_s=float("inf"))
        age = max(0.0, (self._clock.now() - self.last_ok.at).total_seconds())
        return dataclasses.replace(self.last_ok, link=link, age_s=age)

    def _follow_link(self, reading: UpsReading, now: float) -> None:
        """Hold a UPS last seen on mains during a short link loss; time how long it is off line."""
        if reading.link is LinkState.OK:
            self._link_bad_since = None
        elif self._link_bad_since is None:
            self._link_bad_since = now
        last_on_mains = self.last_ok is not None and on_mains(self.last_ok)
        bad_for = 0.0 if self._link_bad_since is None else now - self._link_bad_since
        self.held_online = (
            reading.link is not LinkState.OK and last_on_mains and bad_for < self.link_grace_s
        )
        if reading.link is LinkState.OK and on_mains(reading):
            self._off_since = None
        elif self._off_since is None:
            self._off_since = now if self._link_bad_since is None else self._link_bad_since
        if self.held_online or self._off_since is None:
            self.off_line_for_s = 0.0
        else:
            self.off_line_for_s = now - self._off_since

    def _track(self, reading: UpsReading, now: float) -> None:
        if reading.link is not LinkState.OK:
            return  # keep the window: the outage goes on while we cannot see it
        if not reading.on_battery or UpsFlag.CAL in reading.flags:
            self._samples.clear()
            self._fit = _LineFit()
            return
        if reading.charge_pct is None:
            return
        self._samples.append((now, reading.charge_pct))
        self._fit.add(now, reading.charge_pct, 1)
        while self._samples and now - self._samples[0][0] > self._window_s:
            self._fit.add(*self._samples.popleft(), -1)

    @property
    def depletion_pct_per_min(self) -> float | None:
        """Charge lost per minute over the window (least squares); None until the samples
        span ``min_span_s``."""
        if len(self._samples) < 2 or self._samples[-1][0] - self._samples[0][0] < self.min_span_s:
            return None
        slope = self._fit.slope()
        return None if slope is None else max(0.0, -slope * 60.0)

    @property
    def observed_runtime_s(self) -> float | None:
        """The runtime left if the charge keeps falling at the observed rate (counted down by
        the age of the data when the link is not ok)."""
        rate = self.depletion_pct_per_min
        if not rate or self.last is None or self.last.charge_pct is None:
            return None
        return max(0.0, self.last.charge_pct / rate * 60.0 - self._age())

    def _age(self) -> float:
        if self.last is None or self.last.link is LinkState.OK:
            return 0.0
        return self.last.age_s if self.last.age_s != float("inf") else 0.0

    def runtime_s(self) -> float | None:
        """The faster (smaller) of the UPS's own estimate and the observed one, counted down
        from the last known value while the link is not ok."""
        if self.last is None:
            return None
        reported = self.last.runtime_s
        if reported is not None:
            reported = max(0.0, reported - self._age())
        observed = self.observed_runtime_s
        candidates = [v for v in (reported, observed) if v is not None]
        return min(candidates) if candidates else None

    def figures(self) -> UpsFigures:
        """What a feed needs from this UPS: the reading and what the watch derived from it."""
        if self.last is None:
            raise RuntimeError(f"{self.name}: figures() before the first poll()")
        return UpsFigures(
            reading=self.last,
            runtime_s=self.runtime_s(),
            depletion_pct_per_min=self.depletion_pct_per_min,
            held_online=self.held_online,
            off_line_for_s=self.off_line_for_s,
            last_seen_on_mains=self.last_ok is None or on_mains(self.last_ok),
            peukert=self.peukert,
        )


class _LineFit:
    """A least-squares line through samples added and dropped one at a time.

    It keeps running sums, so a poll costs the same with 5 samples in the window
    as with 300; times are taken from the first sample so the sums stay small.
    """

    def __init__(self) -> None:
        self.origin: float | None = None
        self.n = 0
        self.sum_t = self.sum_y = self.sum_tt = self.sum_ty = 0.0

    def add(self, t: float, y: float, sign: int) -> None:
        """``sign`` 1 adds a sample, -1 drops one added before."""
        if self.origin is None:
            self.origin = t
        t -= self.origin
        self.n += sign
        self.sum_t += sign * t
        self.sum_y += sign * y
        self.sum_tt += sign * t * t
        self.sum_ty += sign * t * y

    def slope(self) -> float | None:
        spread = self.n * self.sum_tt - self.sum_t * self.sum_t
        if self.n < 2 or spread <= 0:
            return None
        return (self.n * self.sum_ty - self.sum_t * self.sum_y) / spread
