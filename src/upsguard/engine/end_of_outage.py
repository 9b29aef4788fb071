"""The end of an outage shutdown: what the UPSes are told, and the site's way back.

Once a shutdown on battery has stopped everything, each UPS is told what its entry's
``at_shutdown_end`` says. NUT's answer to the power race is a load cycle
(``shutdown.return``): the UPS cuts its output after a delay and brings it back by itself,
whether the mains returned meanwhile or not, so the machines that power on with the mains
boot again.

The machine running upsguard goes down last, and only when something will bring it back:

- the mains are there (they came back past the point of no return, or a person shut the
  site down on mains): upsguard does not stop its own machine; it stays up and starts the
  site again (or waits for ``upsguard trigger startup``);
- on battery, every UPS powering it took a load cycle whose cut is still ahead: it stops,
  and boots when the UPS powers its outlets again. A cycle whose cut fell due is spent: a
  controller resuming the run after it (the machine was cut and booted) does not count on
  it;
- otherwise (no load cycle configured, the UPS refused it, or cutting that UPS would take
  down what still runs) it stays up while the battery lasts: a machine that loses its power
  hard boots when the UPS comes back, while one halted on a UPS that never cycles would
  never start again.

A UPS is told only when cutting its output harms nothing that is not known off: every feed
it belongs to either keeps enough other UPSes, or powers nothing but what the run is known to
have stopped (steps done: seen off, or their command succeeded). A step that failed or was
skipped leaves its resource not known off, and its UPS is not told, with one exception: at
the battery's last moment (the critical floor), the UPS is told all the same, after an error
naming what it cuts. The batteries drop those resources in moments either way, and the load
cycle is what brings them, and the site, back.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, Collection, Mapping
from datetime import datetime

from upsguard.clock import Clock
from upsguard.config.resources import ResourceConfig
from upsguard.config.site import FeedConfig, SiteConfig
from upsguard.errors import LeadershipLost
from upsguard.events import EventSink, Notice, UpsCommandSent
from upsguard.models import ResourceId, RunId, UpsName
from upsguard.plugins.ups.base import UpsSource
from upsguard.policies.phases import PowerView
from upsguard.policies.power import feed_name
from upsguard.runs import RunSpec

log = logging.getLogger(__name__)


class EndOfOutage:
    def __init__(
        self,
        site: SiteConfig,
        sources: Mapping[UpsName, UpsSource],
        clock: Clock,
        events: EventSink,
        before_command: Callable[[RunSpec, UpsName], Awaitable[bool]] | None = None,
    ) -> None:
        """``before_command``: awaited right before each command goes out (a pair's fence,
        which marks it in the shared ledger); False: not sent, this controller no longer
        acts (``own_machine`` raises ``LeadershipLost``; the end of a run says nothing more)."""
        self._site = site
        self._before_command = before_command
        self._sources = sources
        self._clock = clock
        self._events = events
        self._configs = {u.name: u for u in site.ups}
        self._feeds = {feed_name(f, i): f for i, f in enumerate(site.effective_feeds())}
        self._peer = site.ha.peer_machine if site.ha is not None else None
        self._told: dict[RunId, dict[UpsName, datetime | None]] = {}
        """The UPSes each run told (or will not tell), and when the load cycle of each cuts
        its output, to bring it back after; None: nothing of it brings power back."""
        self._withheld: set[tuple[RunId, UpsName]] = set()
        """UPSes not told yet because they would cut what is not known off (said once)."""
        own = next((r for r in site.resources if r.runs_upsguard), None)
        self._own_ups = (
            {u for f in site.feeds_powering(own.id) for u in f.ups} if own is not None else set()
        )

    async def tell_ups(
        self,
        spec: RunSpec,
        stopped: Collection[ResourceId],
        view: PowerView | None,
        *,
        last_moment: bool = False,
    ) -> None:
        """Once a whole shutdown ended on battery: tell the UPSes of its feeds (those whose
        every feed the run covered, and whose cut harms nothing not known off in
        ``stopped``; at the ``last_moment``, whatever it harms)."""
        if view is None or not view.on_battery:
            return
        try:
            await self._tell(spec, self._run_ups(spec), stopped, last_moment)
        except LeadershipLost as exc:  # the controller leading now tells them
            log.info("%s", exc)

    def told_before(self, run: RunId, upses: Mapping[UpsName, datetime]) -> None:
        """UPSes a controller before this one told at the end of ``run``, and when (its
        journal says so, or the pair's ledger): each counts as told, as its command left it,
        and is not sent a second one (a second load cycle would restart the UPS's delay, or
        cut what came back meanwhile)."""
        told = self._told.setdefault(run, {})
        for ups, at in upses.items():
            told[ups] = self._cycle_due(ups, at)

    def all_told(self, spec: RunSpec, told: Collection[UpsName]) -> bool:
        """Every UPS of ``spec``'s feeds with an end command is in ``told`` (there is one)."""
        commanded = self._commanded(spec)
        return bool(commanded) and commanded <= set(told)

    def untold(self, spec: RunSpec) -> list[UpsName]:
        """The UPSes of ``spec``'s feeds with an end command that were not told yet."""
        return sorted(self._commanded(spec) - self._told.get(spec.id, {}).keys())

    def _commanded(self, spec: RunSpec) -> set[UpsName]:
        """The UPSes of ``spec``'s feeds with an end command."""
        return {u for u in self._run_ups(spec) if self._configs[u].at_shutdown_end.command}

    def _cycle_due(self, ups: UpsName, told_at: datetime) -> datetime | None:
        """When the load cycle ``ups`` took at ``told_at`` cuts its output (it brings the
        power back after); None: its end command brings no power back."""
        config = self._configs.get(ups)
        if config is None or not config.at_shutdown_end.brings_power_back:
            return None
        return told_at + config.at_shutdown_end.delay

    async def own_machine(
        self,
        spec: RunSpec,
        own: ResourceConfig,
        stopped: Collection[ResourceId],
        view: PowerView | None,
    ) -> str | None:
        """Just before the step that stops upsguard's own machine: None when it may stop
        (every UPS powering it took a load cycle, its cut still ahead), else why it stays
        up (its step ends skipped with this)."""
        feeds = self._site.feeds_powering(own.id)
        if self.mains_there(own.id, view):
            why = f"the mains are there: upsguard stays up on {own.id} to start the site again"
            self._events(Notice(self._clock.now(), why))
            return why
        needed = {u for f in feeds for u in f.ups}
        told = await self._tell(spec, self._run_ups(spec) | needed, stopped)
        now = self._clock.now()
        missing: list[UpsName] = []
        spent: dict[datetime, list[UpsName]] = {}
        for ups in sorted(needed):
            due = told.get(ups)
            if due is None:
                missing.append(ups)
            elif due <= now:
                spent.setdefault(due, []).append(ups)
        if not missing and not spent:
            self._say_unguarded(own, stopped)
            return None
        gone = [f"no load cycle from UPS {', '.join(missing)}"] if missing else []
        gone += [
            f"the load cycle of UPS {', '.join(upses)} was due at {due.astimezone():%H:%M:%S} "
            "and is spent"
            for due, upses in sorted(spent.items())
        ]
        why = (
            f"nothing would bring power back to {own.id} ({'; '.join(gone)}): upsguard stays "
            "up while the battery lasts"
        )
        self._events(Notice(now, why, level="error"))
        return why

    def mains_there(self, machine: ResourceId, view: PowerView | None) -> bool:
        """Every feed powering ``machine`` is read on mains now (``mains_seen``): a
        controller's machine stays up. Power not read yet (no ``view``) is not the mains
        there, nor is a UPS out of contact since it was on mains: no outage, but no sign of
        the mains either (a pair's standby cut from upsd read it so while the leader read
        the UPS on battery)."""
        if view is None:
            return False
        feeds = self._site.feeds_powering(machine)
        seen = {f.name for f in view.feeds if f.mains_seen}
        return {name for name, feed in self._feeds.items() if feed in feeds} <= seen

    def _say_unguarded(self, own: ResourceConfig, stopped: Collection[ResourceId]) -> None:
        """What upsguard leaves running when it stops itself (its feed went, another feed
        holds): said before, as the alert it is; nothing will shut those down."""
        left = [
            r
            for r in self._site.resources
            if r.stops and not self._controllers_machine(r) and r.id not in stopped
        ]
        hardware = sorted(r.id for r in left if r.kind.is_hardware)
        if left:
            named = ", ".join(hardware) or ", ".join(sorted(r.id for r in left))
            message = (
                f"upsguard stops its own machine {own.id} while {named} run on: from now on "
                "nothing guards them (see validate's warning on its feed)"
            )
            self._events(Notice(self._clock.now(), message, level="error"))

    def _run_ups(self, spec: RunSpec) -> set[UpsName]:
        """The UPSes whose every feed the run covers."""
        covered = set(self._feeds) if spec.feeds is None else set(spec.feeds)
        return {
            u
            for u in self._configs
            if all(name in covered for name, f in self._feeds.items() if u in f.ups)
        }

    async def _tell(
        self,
        spec: RunSpec,
        upses: set[UpsName],
        stopped: Collection[ResourceId],
        last_moment: bool = False,
    ) -> dict[UpsName, datetime | None]:
        """Send each UPS its end command, once per run; when the load cycle of each that
        took one cuts its output. A UPS not told because it would cut what is not known off
        is asked about again later (once more is known off, or at the last moment)."""
        told = self._told.setdefault(spec.id, {})
        for ups in sorted(upses - told.keys()):
            answer = await self._tell_one(spec, ups, stopped, upses, last_moment)
            if answer is not None:
                told[ups] = self._cycle_due(ups, self._clock.now()) if answer else None
        return told

    async def _tell_one(
        self,
        spec: RunSpec,
        ups: UpsName,
        stopped: Collection[ResourceId],
        cut: set[UpsName],
        last_moment: bool,
    ) -> bool | None:
        """Whether ``ups`` took its end command (False: it will not); None when it was not
        told for now (it would cut what is not known off)."""
        config = self._configs.get(ups)
        source = self._sources.get(ups)
        command = config.at_shutdown_end.command if config is not None else None
        if command is None or source is None:
            return False
        if (
            ups in self._own_ups
            and config is not None
            and not config.at_shutdown_end.brings_power_back
        ):
            message = (
                f"UPS {ups}: {command} not sent: it powers the machine running upsguard and "
                "would cut it for good (a load cycle, shutdown.return, brings power back)"
            )
            self._events(Notice(self._clock.now(), message, level="warning"))
            return False
        harmed = self._still_running(ups, cut, set(stopped))
        if harmed and not last_moment:
            if (spec.id, ups) not in self._withheld:
                self._withheld.add((spec.id, ups))
                message = (
                    f"UPS {ups}: {command} not sent: it would cut {', '.join(harmed)}, not "
                    "known off; sent at the critical floor if they are still not"
                )
                self._events(Notice(self._clock.now(), message, level="warning"))
            return None
        if self._before_command is not None and not await self._before_command(spec, ups):
            raise LeadershipLost(f"UPS {ups}: {command} not sent: another controller leads")
        if harmed:
            message = (
                f"UPS {ups}: the battery is at the critical floor: {command} sent although "
                f"it cuts {', '.join(harmed)}, not known off (the battery would drop them in "
                "moments; the load cycle brings them back)"
            )
            self._events(Notice(self._clock.now(), message, level="error"))
        try:
            await source.command(command)
        except Exception as exc:  # the run is over; report, never crash
            detail = str(exc) if str(exc) else type(exc).__name__
            self._events(
                UpsCommandSent(
                    self._clock.now(), ups, command, False, detail, spec.id, tuple(harmed)
                )
            )
            return False
        self._events(
            UpsCommandSent(self._clock.now(), ups, command, True, "", spec.id, tuple(harmed))
        )
        return True

    def _still_running(
        self, ups: UpsName, cut: set[UpsName], stopped: set[ResourceId]
    ) -> list[ResourceId]:
        """What cutting ``ups`` (with the others in ``cut``) would take down that is not
        known off."""
        out: list[ResourceId] = []
        for feed in self._feeds.values():
            if ups not in feed.ups or len(set(feed.ups) - cut) >= feed.min_supplies:
                continue
            out += [r for r in self._powered_by(feed) if r not in stopped and r not in out]
        return sorted(out)

    def _powered_by(self, feed: FeedConfig) -> list[ResourceId]:
        """Everything the feed powers that upsguard would stop: its resources and the VMs
        on them, but the controllers' own machines (this one's, and its pair's), which go
        down last, after the UPS was told (their steps wait for that)."""
        return [
            r.id
            for r in self._site.resources
            if r.stops
            and not self._controllers_machine(r)
            and feed in self._site.feeds_powering(r.id)
        ]

    def _controllers_machine(self, resource: ResourceConfig) -> bool:
        """This controller's machine, or its pair's: they go down last, by their own steps."""
        return resource.runs_upsguard or resource.id == self._peer
