"""The end of a simulated shutdown, measured, and the verdict of a dry run.

What a person wants to know of a shutdown on battery is how close it came: the battery's
charge and energy when the last protected resource went down, and the *margin*, the runtime
left at the load the shutdown began with. That is the load the runtime trigger
(``runtime < plan + required_margin``) counts with, so the margin says how much longer the
shutdown could have taken; it is the figure compared with ``policies.required_margin``.
The runtime at the load left afterwards (a switch, a modem) is reported beside it, for what
it is: how long what stays on lasts, not a margin.

When the mains return during a shutdown, the battery is measured when they returned, where
the danger ended (unless they fail again before the shutdown ends). The shutdown still
finishes when it had crossed its point of no return (or the site file says
``before_point_of_no_return: finish``); the verdict says which it was.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, replace

from upsguard.config.site import SiteConfig
from upsguard.config.types import format_duration
from upsguard.models import RunId, UpsName
from upsguard.policies.power import feed_name
from upsguard.runs import RunSpec
from upsguard.simulation.world import PowerWorld


@dataclass(frozen=True, slots=True)
class EndOfShutdown:
    """One UPS's battery at the end of a shutdown's danger (the worst UPS of the run)."""

    finished_at_s: float
    """When the shutdown's last step finished."""
    at_s: float
    """When the figures were taken: the finish, or the return of the mains before it."""
    mains_back: bool
    ups: UpsName
    charge_pct: float
    energy_wh: float
    """The energy left, at the battery's reference load (its ``runtime_at``)."""
    protected_w: float
    """The UPS's load when the shutdown began."""
    margin_s: float
    """The runtime left at ``protected_w``."""
    left_w: float
    runtime_left_s: float
    """The runtime left at the load left (``left_w``) after the shutdown."""
    point_of_no_return_at_s: float | None = None
    """When the shutdown's first host or storage step started (None: none did)."""
    needed_from_point_of_no_return_s: float = 0.0
    """What the plan needs from its first host or storage step to its end."""

    @property
    def mains_back_past_point_of_no_return(self) -> bool:
        """The mains returned once the shutdown had crossed its point of no return."""
        crossed = self.point_of_no_return_at_s
        return self.mains_back and crossed is not None and crossed <= self.at_s

    def needless(self, required_s: float) -> bool:
        """The mains returned before anything past the guests had to stop: past the point of
        no return, and the battery then still held what the steps from there on need, and
        the margin (at the load the shutdown began with). In hindsight, the host and storage
        steps could have waited for the mains."""
        needed = self.needed_from_point_of_no_return_s + required_s
        return self.mains_back_past_point_of_no_return and self.margin_s >= needed


@dataclass
class _Run:
    ups: tuple[UpsName, ...]
    loads: dict[UpsName, float]
    mains_back: dict[UpsName, EndOfShutdown]
    crossed_at: float | None = None
    """When it crossed its point of no return."""
    needed_from_crossing_s: float = 0.0
    """What its plan needs from its point of no return to its end."""


class ShutdownWatch:
    """Follows the shutdown runs of a dry run and measures the battery at the end of each."""

    def __init__(self, site: SiteConfig, world: PowerWorld) -> None:
        self._world = world
        self._feeds = {feed_name(f, i): tuple(f.ups) for i, f in enumerate(site.effective_feeds())}
        self._all = tuple(u.name for u in site.ups)
        self._runs: dict[RunId, _Run] = {}
        self.ends: list[EndOfShutdown] = []

    def started(self, spec: RunSpec) -> None:
        names = self._all if spec.feeds is None else _ups_of(spec.feeds, self._feeds)
        on_battery = tuple(n for n in names if self._on_battery(n))
        loads = {n: self._world.load[n] for n in on_battery}
        self._runs[spec.id] = _Run(on_battery, loads, {})

    def mains_back(self, names: Iterable[UpsName], now: float) -> None:
        """The mains return to some UPSes: for the shutdowns under way, their danger ends."""
        back = set(names)
        for run in self._runs.values():
            for name in run.ups:
                if name in back and name not in run.mains_back:
                    run.mains_back[name] = self._measure(run, name, now, now, mains_back=True)

    def mains_lost(self, names: Iterable[UpsName]) -> None:
        """The mains fail again: for the shutdowns under way, the danger is back, and their
        end is measured when they finish (or the mains return once more)."""
        lost = set(names)
        for run in self._runs.values():
            for name in lost & run.mains_back.keys():
                del run.mains_back[name]

    def point_of_no_return(self, run: RunId, now: float, needed_s: float) -> None:
        """A shutdown's first host or storage step started; its plan needs ``needed_s`` from
        there to its end."""
        found = self._runs.get(run)
        if found is not None and found.crossed_at is None:
            found.crossed_at = now
            found.needed_from_crossing_s = needed_s

    def dropped(self, spec: RunSpec) -> None:
        """A shutdown cancelled, abandoned or interrupted: it has no end to measure."""
        self._runs.pop(spec.id, None)

    def finished(self, spec: RunSpec, now: float) -> EndOfShutdown | None:
        """A shutdown ended done or failed: the battery of its worst UPS, kept in ``ends``."""
        run = self._runs.pop(spec.id, None)
        if run is None or not run.ups:
            return None
        ends = [
            replace(
                run.mains_back[n] if n in run.mains_back else self._measure(run, n, now, now),
                finished_at_s=now,
                point_of_no_return_at_s=run.crossed_at,
                needed_from_point_of_no_return_s=run.needed_from_crossing_s,
            )
            for n in run.ups
        ]
        worst = min(ends, key=lambda e: e.margin_s)
        self.ends.append(worst)
        return worst

    def _on_battery(self, name: UpsName) -> bool:
        return not self._world.mains[name] or self._world.self_test[name]

    def _measure(
        self, run: _Run, name: UpsName, finished: float, at: float, *, mains_back: bool = False
    ) -> EndOfShutdown:
        world = self._world
        battery = world.batteries[name]
        dead = name in world.dead
        protected = run.loads[name]
        left = world.load[name]
        return EndOfShutdown(
            finished_at_s=finished,
            at_s=at,
            mains_back=mains_back,
            ups=name,
            charge_pct=0.0 if dead else battery.charge_pct,
            energy_wh=0.0 if dead else battery.energy_wh,
            protected_w=protected,
            margin_s=world.runtime_at_s(name, protected),
            left_w=left,
            runtime_left_s=world.runtime_at_s(name, left),
        )


def _ups_of(feeds: Iterable[str], known: Mapping[str, tuple[UpsName, ...]]) -> tuple[UpsName, ...]:
    return tuple(dict.fromkeys(u for f in feeds for u in known.get(f, ())))


def describe_end(end: EndOfShutdown, required_s: float) -> str:
    """The verdict's words for a finished shutdown."""
    battery = (
        f"{end.charge_pct:.0f} % charge, {end.energy_wh:.0f} Wh left in {end.ups}: "
        f"{format_duration(end.margin_s)} of runtime at the {end.protected_w:.0f} W "
        f"the shutdown began with (required {format_duration(required_s)})"
    )
    finished = f"shutdown finishes at T+{format_duration(end.finished_at_s)}"
    if end.mains_back:
        back = f"mains returned at T+{format_duration(end.at_s)}, {_crossed(end)}"
        said = f"{finished}; {back}, with {battery}"
        if end.needless(required_s):
            needed = format_duration(end.needed_from_point_of_no_return_s)
            said += (
                "; a needless shutdown: the mains returned before anything past the guests had "
                f"to stop ({format_duration(end.margin_s)} of runtime left then, the steps from "
                f"the point of no return need {needed} and the margin "
                f"{format_duration(required_s)})"
            )
        return said
    return (
        f"{finished} with {battery}; {format_duration(end.runtime_left_s)} at the load left "
        f"({end.left_w:.0f} W)"
    )


def _crossed(end: EndOfShutdown) -> str:
    """Where the mains found the shutdown: past its point of no return, or before it."""
    crossed = end.point_of_no_return_at_s
    if end.mains_back_past_point_of_no_return and crossed is not None:
        return f"past the point of no return (T+{format_duration(crossed)})"
    if crossed is None:
        return "before the point of no return"
    return f"before the point of no return (crossed at T+{format_duration(crossed)})"
