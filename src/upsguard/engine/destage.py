"""Flipping caches and watching their dirty data drain: rate, ETA, and the gate steps wait on.

On battery the caches in the data path go to write-through (``write_through``); one that
refused is asked again every ``RETRY_S`` while the outage lasts. Once the outage is over the
caches upsguard took out of write-back go back to it (``restore``), and only those: a cache
a person keeps in write-through stays so. What upsguard owes is journaled
(``CacheModeChanged.owed``), so a restarted controller still returns it (``owe``).

No host or storage step starts while a cache in its data path is still dirty,
unless the battery is at the critical floor, or the cache's ``on_timeout`` is
``continue`` and its ``destage_timeout`` has passed; both are journaled as the
risk they are (``RiskAccepted``).
"""

from __future__ import annotations

import asyncio
import logging
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

from upsguard.clock import Clock
from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.errors import UpsguardError
from upsguard.events import (
    CacheClean,
    CacheModeChanged,
    DestageProgress,
    EventSink,
    Notice,
    RiskAccepted,
)
from upsguard.models import CacheMode, CacheName, CacheState, CacheTarget, Fact
from upsguard.plugins.caches.base import CacheProvider
from upsguard.runbooks.plan import Step

log = logging.getLogger(__name__)
RATE_WINDOW_S = 60.0
RETRY_S = 30.0
"""How often a cache that refused to change mode is asked again."""
PROGRESS_EVERY_S = 30.0
"""How often a cache a step waits on is told about (``DestageProgress``): a line every
half minute shows a destage as it happens without drowning a long one in lines."""


@dataclass(frozen=True, slots=True)
class CacheStatus:
    """One target's latest state with the figures derived from its history."""

    cache: CacheName
    target: CacheTarget
    state: CacheState | None
    error: str | None
    rate_bps: float | None
    eta_s: float | None

    @property
    def clean(self) -> bool:
        """Read clean: a target that could not be read is not."""
        return self.state is not None and self.state.clean

    @property
    def cleanliness(self) -> Fact:
        if self.state is None:
            return Fact.unknown(self.error or "not read")
        return Fact(self.state.clean)


@dataclass(frozen=True, slots=True)
class ModeResult:
    cache: CacheName
    target: str
    ok: bool
    detail: str


class _History:
    def __init__(self) -> None:
        self.samples: deque[tuple[float, int]] = deque()

    def add(self, at: float, dirty: int | None) -> None:
        if dirty is None:
            return
        self.samples.append((at, dirty))
        while len(self.samples) > 2 and at - self.samples[0][0] > RATE_WINDOW_S:
            self.samples.popleft()

    def rate(self) -> float | None:
        if len(self.samples) < 2:
            return None
        (t0, d0), (t1, d1) = self.samples[0], self.samples[-1]
        return (d0 - d1) / (t1 - t0) if t1 > t0 else None


class DestageWatch:
    """All caches of a site: flip them, poll them, tell when they are clean."""

    def __init__(
        self,
        site: SiteConfig,
        providers: Mapping[CacheName, CacheProvider],
        clock: Clock,
        events: EventSink,
    ) -> None:
        self._settings = {c.name: c for c in site.caches}
        self._providers = providers
        self._clock = clock
        self._events = events
        self._targets: dict[CacheName, list[CacheTarget]] = {}
        self._history: dict[tuple[CacheName, str], _History] = {}
        self.status: dict[tuple[CacheName, str], CacheStatus] = {}
        self.flipped_at: dict[CacheName, float] = {}
        """When each cache upsguard switched to write-through got there (its drain's clock)."""
        self.owed: set[CacheName] = set()
        """Caches upsguard took out of write-back: they go back once the outage is over."""
        self._refused_at: dict[tuple[CacheName, CacheMode], float] = {}
        self._asking: set[tuple[CacheName, CacheMode]] = set()
        self._known_mode: dict[tuple[CacheName, str], CacheMode] = {}
        """Each target's mode as last read, or as upsguard last set it (caches are read only
        on battery: a restore on mains is known only from having made it)."""
        """When a cache last refused a mode: asked again for it at most every ``RETRY_S``
        (a mode it took, or the other one, is asked for at once)."""
        self._waited_on: Counter[CacheName] = Counter()
        """Caches steps wait on to be clean now: never put back in write-back under them."""
        self._lock = asyncio.Lock()
        self._polled_at = float("-inf")
        self._told: dict[CacheName, float] = {}
        self.reads = 0

    @property
    def names(self) -> list[CacheName]:
        return list(self._providers)

    async def targets(self, cache: CacheName) -> list[CacheTarget]:
        if cache not in self._targets:
            self._targets[cache] = await self._providers[cache].targets()
        return self._targets[cache]

    async def set_mode(
        self, mode: CacheMode, names: Iterable[CacheName] | None = None
    ) -> list[ModeResult]:
        """Switch every target of the named caches; one failure never stops the others."""
        chosen = list(names) if names is not None else self.names
        results = await asyncio.gather(*(self._set_cache(c, mode) for c in chosen))
        return [r for group in results for r in group]

    async def write_through(self, names: Iterable[CacheName] | None = None) -> None:
        """The outage's flip: each named cache not in write-through yet goes there (one that
        refused is asked again, at most every ``RETRY_S``)."""
        now = self._clock.monotonic()
        chosen = self.names if names is None else list(names)
        due = [
            c
            for c in chosen
            if c not in self.flipped_at and self._may_ask(c, CacheMode.WRITE_THROUGH, now)
        ]
        if due:
            await self.set_mode(CacheMode.WRITE_THROUGH, due)

    async def restore(self) -> None:
        """The outage is over: what upsguard took out of write-back goes back (one that
        refuses is asked again, at most every ``RETRY_S``), and every drain's clock stops;
        a cache a step waits on stays in write-through until that step is done with it."""
        now = self._clock.monotonic()
        for cache in [c for c in self.flipped_at if not self._waited_on[c]]:
            del self.flipped_at[cache]
        due = [
            c
            for c in sorted(self.owed)
            if not self._waited_on[c] and self._may_ask(c, CacheMode.WRITE_BACK, now)
        ]
        if due:
            await self.set_mode(CacheMode.WRITE_BACK, due)

    def _may_ask(self, cache: CacheName, mode: CacheMode, now: float) -> bool:
        """Not while the same ask is under way, nor sooner than ``RETRY_S`` after a refusal."""
        key = (cache, mode)
        return key not in self._asking and now - self._refused_at.get(key, -RETRY_S) >= RETRY_S

    def owe(self, names: Iterable[CacheName]) -> None:
        """Caches a controller before this one took out of write-back (from the journal, or
        the other controller of a pair)."""
        self.owed.update(n for n in names if n in self._providers)

    def disown(self, names: Iterable[CacheName]) -> None:
        """Caches whose debt the leader of the pair took over: returned by it, not here."""
        self.owed.difference_update(names)

    async def _set_cache(self, cache: CacheName, mode: CacheMode) -> list[ModeResult]:
        key = (cache, mode)
        self._asking.add(key)
        try:
            results = await self._set_targets(cache, mode)
        finally:
            self._asking.discard(key)
        if all(r.ok for r in results):
            self._refused_at.pop(key, None)
            if mode is CacheMode.WRITE_THROUGH:
                self.flipped_at.setdefault(cache, self._clock.monotonic())
            elif mode is CacheMode.WRITE_BACK:
                self.owed.discard(cache)
                self.flipped_at.pop(cache, None)
        else:
            self._refused_at[key] = self._clock.monotonic()
        return results

    async def _set_targets(self, cache: CacheName, mode: CacheMode) -> list[ModeResult]:
        try:
            targets = await self.targets(cache)
        except Exception as exc:  # one cache's failure (a bad key, a plugin bug) is its own
            why = _why(exc, cache)
            self._events(CacheModeChanged(self._clock.now(), cache, "*", mode, False, why))
            return [ModeResult(cache, "*", False, why)]
        if mode is CacheMode.WRITE_THROUGH and cache not in self.flipped_at:
            for key in [k for k in self._history if k[0] == cache]:
                del self._history[key]  # the drain starts now: older readings say nothing
        return list(await asyncio.gather(*(self._set_target(cache, t, mode) for t in targets)))

    def _in_write_back(self, cache: CacheName, target: CacheTarget) -> bool:
        """The target was in write-back when last read or set (or neither yet): a flip to
        write-through puts upsguard in its debt."""
        mode = self._known_mode.get((cache, target.name))
        return mode is None or mode is CacheMode.WRITE_BACK

    async def _set_target(
        self, cache: CacheName, target: CacheTarget, mode: CacheMode
    ) -> ModeResult:
        owed = mode is CacheMode.WRITE_THROUGH and self._in_write_back(cache, target)
        try:
            await self._providers[cache].set_mode(target, mode)
        except Exception as exc:
            result = ModeResult(cache, target.name, False, _why(exc, cache))
        else:
            result = ModeResult(cache, target.name, True, f"{target.name}: {mode.value}")
            self._known_mode[(cache, target.name)] = mode
            if owed:
                self.owed.add(cache)
        self._events(
            CacheModeChanged(
                self._clock.now(),
                cache,
                target.name,
                mode,
                result.ok,
                result.detail,
                owed=owed and result.ok,
            )
        )
        return result

    async def poll(self, names: Iterable[CacheName] | None = None) -> list[CacheStatus]:
        """Read every target once (concurrently) and update rates and ETAs."""
        chosen = list(names) if names is not None else self.names
        groups = await asyncio.gather(*(self._poll_cache(c) for c in chosen))
        self._polled_at = self._clock.monotonic()
        return [s for group in groups for s in group]

    async def _poll_cache(self, cache: CacheName) -> list[CacheStatus]:
        """A cache whose targets cannot be listed has one status, ``*``, that says why: with
        none at all it would be clean by default."""
        unlisted = (cache, "*")
        try:
            targets = await self.targets(cache)
        except Exception as exc:
            status = CacheStatus(cache, CacheTarget(cache, "*"), None, _why(exc, cache), None, None)
            self.status[unlisted] = status
            return [status]
        self.status.pop(unlisted, None)
        return list(await asyncio.gather(*(self._poll_target(cache, t) for t in targets)))

    async def _poll_target(self, cache: CacheName, target: CacheTarget) -> CacheStatus:
        key = (cache, target.name)
        self.reads += 1
        try:
            state: CacheState | None = await self._providers[cache].read(target)
            error = None
        except Exception as exc:
            state, error = None, _why(exc, cache)
        history = self._history.setdefault(key, _History())
        if state is not None:
            history.add(self._clock.monotonic(), state.dirty_bytes)
            self._known_mode[key] = state.mode
        rate = history.rate()
        dirty = state.dirty_bytes if state is not None else None
        eta = dirty / rate if dirty and rate and rate > 0 else (0.0 if dirty == 0 else None)
        status = CacheStatus(cache, target, state, error, rate, eta)
        self.status[key] = status
        return status

    def clean(self, cache: CacheName) -> Fact:
        """Whether every target of ``cache`` was read clean at the last poll: unknown when
        one could not be read, or none was read at all."""
        mine = [s.cleanliness for s in self.status.values() if s.cache == cache]
        return Fact.all_of(mine, f"cache {cache}: not read yet")

    def eta_s(self, names: Iterable[CacheName] | None = None) -> float:
        """The longest time the named caches' targets need to be clean (see ``eta``)."""
        return self.eta(names)[0]

    def eta(self, names: Iterable[CacheName] | None = None) -> tuple[float, bool]:
        """The longest time the named caches' targets need to be clean, and whether that
        figure is measured. Dirty data whose drain rate is not measured yet (still
        write-back, or one reading so far) counts at the cache's ``worst_case_rate``, or as
        its whole ``destage_timeout``: never as nothing, or the runtime trigger would start
        the shutdown too late."""
        chosen = set(names) if names is not None else set(self.names)
        etas = [self._eta(s) for s in self.status.values() if s.cache in chosen and not s.clean]
        return max(etas, default=(0.0, True))

    def _eta(self, status: CacheStatus) -> tuple[float, bool]:
        if status.eta_s is not None:
            return status.eta_s, True
        settings = self._settings[status.cache]
        dirty = status.state.dirty_bytes if status.state is not None else None
        if dirty is not None and settings.worst_case_rate:
            return dirty / settings.worst_case_rate, False
        return settings.destage_timeout.total_seconds(), False

    async def wait_clean(
        self,
        names: Iterable[CacheName],
        floor: Callable[[], bool] = lambda: False,
        progress: Callable[[list[CacheStatus]], None] | None = None,
    ) -> bool:
        """Wait until every named cache is clean; False when the floor or a timeout let go first.
        A cache nothing put in write-through yet goes there (a person's ``trigger --only`` of
        a host on mains): left in write-back it would never be clean."""
        chosen = frozenset(names)
        self._waited_on.update(chosen)
        try:
            return await self._wait_clean(set(chosen), floor, progress)
        finally:
            self._waited_on.subtract(chosen)

    async def _wait_clean(
        self,
        waiting: set[CacheName],
        floor: Callable[[], bool],
        progress: Callable[[list[CacheStatus]], None] | None,
    ) -> bool:
        started = self._clock.monotonic()
        warned: set[CacheName] = set()
        while True:
            round_started = self._clock.monotonic()
            await self.write_through(waiting)  # a cache that refused is asked again
            statuses = await self._fresh(waiting)
            if progress is not None:
                progress(statuses)
            for cache in sorted(waiting):
                if self.clean(cache).is_true:
                    waiting.discard(cache)
                    self._events(
                        CacheClean(self._clock.now(), cache, self._clock.monotonic() - started)
                    )
            if not waiting:
                return True
            self._tell_progress(waiting)
            if floor():
                self._accept_risk(waiting, "the battery is at the critical floor")
                return False
            expired = self._expired(waiting, started, warned)
            if expired:
                self._accept_risk(expired, "its destage timeout passed (on_timeout: continue)")
                waiting -= set(expired)
                if not waiting:
                    return False
            # poll on a fixed cadence: a slow poll must not stretch the interval
            spent = self._clock.monotonic() - round_started
            await asyncio.sleep(max(0.0, self._interval(waiting) - spent))

    def _tell_progress(self, names: Iterable[CacheName]) -> None:
        """Dirty bytes, rate and ETA of each cache a step waits on, at most once every
        ``PROGRESS_EVERY_S`` per cache however many steps wait on it."""
        now = self._clock.monotonic()
        for cache in sorted(names):
            if now - self._told.get(cache, float("-inf")) >= PROGRESS_EVERY_S:
                self._told[cache] = now
                self._events(self._progress(cache))

    def _progress(self, cache: CacheName) -> DestageProgress:
        """One cache over its targets: the dirty bytes they hold, the rate they drain at
        together and the longest ETA; a figure some target does not know is None."""
        mine = [s for s in self.status.values() if s.cache == cache]
        dirty: int | None = 0
        for status in mine:
            held = status.state.dirty_bytes if status.state is not None else None
            dirty = None if dirty is None or held is None else dirty + held
        rate: float | None = 0.0
        eta: float | None = 0.0
        for status in (s for s in mine if not s.clean):
            if rate is None or eta is None or status.rate_bps is None or status.eta_s is None:
                rate = eta = None
            else:
                rate, eta = rate + status.rate_bps, max(eta, status.eta_s)
        return DestageProgress(self._clock.now(), cache, dirty if mine else None, rate, eta)

    async def _fresh(self, names: set[CacheName]) -> list[CacheStatus]:
        """Share one poll among concurrent waiters."""
        async with self._lock:
            if self._clock.monotonic() - self._polled_at >= self._interval(names) / 2:
                await self.poll(self.names)
        return [s for s in self.status.values() if s.cache in names]

    def _interval(self, names: Iterable[CacheName]) -> float:
        return min((self._settings[n].poll_interval.total_seconds() for n in names), default=2.0)

    def _expired(
        self, names: set[CacheName], started: float, warned: set[CacheName]
    ) -> list[CacheName]:
        out = []
        now = self._clock.monotonic()
        for name in sorted(names):
            settings = self._settings[name]
            since = self.flipped_at.get(name, started)
            if now - since < settings.destage_timeout.total_seconds():
                continue
            if settings.on_timeout == "continue":
                out.append(name)
            elif name not in warned:
                warned.add(name)
                timeout = format_duration(settings.destage_timeout)
                message = f"cache {name}: still dirty after {timeout}; waiting until the floor"
                self._events(Notice(self._clock.now(), message, level="warning"))
        return out

    def _accept_risk(self, names: Iterable[CacheName], why: str) -> None:
        for name in sorted(names):
            dirty = sum(
                s.state.dirty_bytes or 0
                for s in self.status.values()
                if s.cache == name and s.state is not None
            )
            clean = self.clean(name)
            unread = "" if clean.known else f"; it could not be read ({clean.why})"
            risk = RiskAccepted(self._clock.now(), name, dirty, why + unread)
            log.error(risk.what)
            self._events(risk)


def _why(exc: Exception, cache: CacheName) -> str:
    """An error of ours says what to do; anything else is a provider's bug, logged in full."""
    if isinstance(exc, UpsguardError):
        return str(exc)
    log.error("cache %s: unexpected error", cache, exc_info=exc)
    return f"{type(exc).__name__}: {exc}"


class DestageGate:
    """The executor's view: a step waits until the caches in its data path are clean."""

    def __init__(self, watch: DestageWatch, floor: Callable[[], bool]) -> None:
        self._watch = watch
        self._floor = floor

    async def wait_clean(self, step: Step) -> None:
        await self._watch.wait_clean(step.caches, self._floor)
