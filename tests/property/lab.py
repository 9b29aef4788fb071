"""A site on the virtual clock, for the outage invariants.

The world is the simulator's own: mains and batteries per UPS (``PowerWorld``, which also
carries out the UPS's instant commands: a load cycle cuts the output and brings it back),
simulated platforms sharing one fleet of power states, simulated caches. Most platforms list
their requests under way, as vSphere does (``LabPlatform``); the NAS's (``dev``) sends
commands to the device, as ``ssh`` steps do (``LabCommandPlatform``): nothing lists them
once sent, so a restarted process knows of one only from its journal, and when it went out.
In it runs the real service (``controller.service.Service``: journal, resume, overrides, the
outage controller, executor and ledger that ``upsguard run`` uses) as a *process* that the
test can kill (``kill -9``: it says nothing more, its journal rows stay as they were), stop
(SIGTERM) and start again from its journal. The machine running upsguard is a resource of
the site: asking it to stop stops the service (systemd does, on ``poweroff``), and once it
is off nothing acts until the UPS cycles its power and it boots again.

Every request a platform accepts is checked the moment it is made (``Request``): its order
against what depends on it, the caches in its data path, whether it acts twice (a command
sent again by a new process only once the step's own timeout has passed since the first),
and the path back before the controller's own machine stops. The world can also stop
answering, as the real one does: a cache that cannot be read, a platform whose reads come
back unknown or fail. Unknown is never good news: a host or storage stop passes its cache
gate only on a cache read clean (or the risk recorded), a step is done only when its targets
are off, and a UPS's command cuts nothing that is not off but what it named at the critical
floor. What breaks a rule is kept in ``violations``; the state machine asserts it is empty
after every step.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import functools
import logging
import weakref
from collections.abc import Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from upsguard.clock import LoopClock, VirtualTimeLoop
from upsguard.config.caches import SimulatedCacheSettings
from upsguard.config.loading import check_site
from upsguard.config.platforms import SimulatedPlatformSettings
from upsguard.config.scenario import Scenario, parse_scenario
from upsguard.config.site import SiteConfig
from upsguard.config.source import parse_yaml
from upsguard.controller.service import Service, StoreBuilder
from upsguard.engine.outage_controller import REPLAN_WITHIN_S
from upsguard.errors import (
    LeadershipLost,
    PermanentError,
    PlatformUnreachable,
    RunBusy,
    TemporaryError,
    UpsUnreachable,
)
from upsguard.events import (
    CacheClean,
    Event,
    EventSink,
    Notice,
    RiskAccepted,
    RunStarted,
    StepFinished,
    UpsCommandSent,
)
from upsguard.models import (
    CacheMode,
    CacheName,
    CacheState,
    CacheTarget,
    Direction,
    LinkState,
    PlatformName,
    PowerState,
    ResourceId,
    StepState,
    StopMethod,
    Target,
    UpsName,
)
from upsguard.plugins.caches.simulated import SimulatedCache
from upsguard.plugins.platforms.base import SentListener, poll_for_state
from upsguard.plugins.platforms.simulated import Behaviour, Fleet, Request, SimulatedPlatform
from upsguard.plugins.registry import SitePlugins
from upsguard.plugins.ups.simulated import SimulatedUps
from upsguard.runbooks.plan import Plan
from upsguard.runbooks.planner import Planner
from upsguard.runs import RunKind, RunOutcome
from upsguard.simulation.simulator import ORIGIN
from upsguard.simulation.world import RETURN_DELAY_S, PowerWorld

T = TypeVar("T")

LAB = "lab:"
"""The names of the test's own tasks."""
ANSWER_WITHIN_S = 600.0
"""A person's command (trigger, abort, a restart) answers within this much virtual time."""
RESTART_S = 2.0
"""How long systemd takes to start the service again (``RestartSec``); run ids are made of
the clock, so a new process never starts at the instant the old one died."""
SIGTERM_AFTER_S = 1.0
"""How soon ``systemctl poweroff`` stops the service once the controller asked for it."""

SITE = """
site: lab
journal: {journal}
ups:
  - {{name: ua, simulated: {{}}, runtime_at: {{minutes: 30, load_watts: 600}}, other_load_watts: 20,
     at_shutdown_end: {{command: shutdown.return, delay: 2m}}}}
  - {{name: ub, simulated: {{}}, runtime_at: {{minutes: 25, load_watts: 600}},
     at_shutdown_end: {{command: shutdown.return, delay: 2m}}}}
feeds:
  - {{name: main, ups: [ua, ub], min_supplies: 1, powers: [h1, h2, nas, sw, mgmt]}}
  - {{name: lab, ups: [ub], powers: [h3]}}
platforms:
  vc: {{type: simulated, guest_shutdown: 30s, host_shutdown: 1m, power_on: 20s,
        host_power_on: 1m, max_parallel: 4}}
  dev: {{type: simulated, device_shutdown: 40s, power_on: 30s}}
  own: {{type: simulated, host_shutdown: 30s, host_power_on: 1m}}
caches:
  - {{name: flash, provider: simulated, carries: [db], dirty: 2GiB, destage_rate: 20MiB/s,
     destage_timeout: 5m, poll_interval: 5s}}
resources:
  - {{id: db, kind: vm, platform: vc, runs_on: [h1], watts: 40, guest_timeout: 10m}}
  - {{id: app, kind: vm, platform: vc, runs_on: [h2], watts: 40, depends_on: [db]}}
  - {{id: web, kind: vm_group, platform: vc, select: {{name: "web-*"}}, count: 2, runs_on: [h2],
     watts: 30, depends_on: [app], shed: true}}
  - {{id: lab1, kind: vm, platform: vc, runs_on: [h3], watts: 20}}
  - {{id: h1, kind: host, platform: vc, watts: 100, depends_on: [nas]}}
  - {{id: h2, kind: host, platform: vc, watts: 100, depends_on: [nas]}}
  - {{id: h3, kind: host, platform: vc, watts: 80}}
  - {{id: nas, kind: storage, platform: dev, watts: 50, depends_on: [sw]}}
  - {{id: mgmt, kind: host, platform: own, runs_upsguard: true, watts: 10, depends_on: [sw],
     estimate: {{stop: 1m}}}}
  - {{id: sw, kind: switch, watts: 20}}
policies:
  poll_interval: 5s
  on_battery: {{after: 10s}}
  shedding: {{when_any: ["on_battery_for > 3m"]}}
  shutdown: {{when_any: [low_battery, fsd, "runtime < plan + 5m"]}}
  power_returns: {{before_point_of_no_return: cancel, online_for: 30s}}
  startup: {{online_for: 2m, charge_above: 30}}
  required_margin: 5m
  critical_floor: {{charge_below: 10}}
"""

SCENARIO = """
name: the lab
recharge: 1h
"""
RECHARGE_S = 3600.0
SENDS_COMMANDS = frozenset({PlatformName("dev")})
"""The site's platforms whose requests are commands sent to the device (the NAS's, as an
``ssh`` platform's are): nothing lists them once sent (``LabCommandPlatform``)."""
JOURNAL_TICK_S = 0.001
"""The journal keeps times to the millisecond: when a command went out, read back from it,
may be this much early."""


@dataclass(frozen=True, slots=True)
class Seen:
    """A request a platform accepted, and which controller process made it."""

    at_s: float
    process: int
    request: Request
    sent_s: float | None = None
    """When its command went out, for a platform that sends commands (a command run to its
    end is accepted later); None for the others, and for a hard power-off."""


class GatedBus:
    """One process's event bus: once the process is killed, nothing it says is heard."""

    def __init__(self, inner: EventSink, heard: Callable[[Event], None]) -> None:
        self._inner = inner
        self._heard = heard
        self.open = True

    def __call__(self, event: Event) -> None:
        if self.open:
            self._inner(event)
            self._heard(event)

    def subscribe(self, listener: Callable[[Event], None]) -> None:
        """What the service subscribes once it is open (a pair's writer) hears the bus."""
        self._inner.subscribe(listener)  # type: ignore[attr-defined]  # the service's EventBus


PROCESS: contextvars.ContextVar[int] = contextvars.ContextVar("lab_process", default=0)
"""The controller process a task belongs to (0: the test's own): every task a process
starts inherits it, so that a kill ends that process's tasks and no other's, and a request
a platform accepts is counted against the process that made it."""


class Life:
    """Whether a controller process still lives. A killed one reaches nothing more: its
    calls to the world's platforms, caches, UPSes and store never come back (as after
    ``kill -9``, whatever its tasks would have done next). A paused one (SIGSTOP) reaches
    nothing until it is woken."""

    def __init__(self, number: int = 0) -> None:
        self.number = number
        self.alive = True
        self.awake = asyncio.Event()
        self.awake.set()
        self.may_act: Callable[[], bool] = lambda: True
        """What a request re-checks right before it is made (the pair's term)."""

    async def check(self) -> bool:
        """Wait while paused, for ever once killed; True when this call waited for a wake."""
        if not self.alive:
            await asyncio.get_running_loop().create_future()
        if self.awake.is_set():
            return False
        await self.awake.wait()
        if not self.alive:
            await asyncio.get_running_loop().create_future()
        return True

    async def before_request(self) -> None:
        """A request of a process that was paused: its tasks ran up to here while it slept,
        which a stopped process does only once woken, and then it checks its term first
        (``StepRunner._fence``) before it asks. The check made before the pause is stale."""
        if await self.check() and not self.may_act():
            raise LeadershipLost("not asked: this controller's term ended while it was paused")


UNKNOWN_READS = "unknown"
"""A platform's reads answer, but say nothing usable (garbage, a status it does not know)."""
FAILING_READS = "fail"
"""A platform's reads fail (no answer, a broken path): its requests still get through."""
READ_POLL_S = 5.0


class LentPlatform:
    """A world's platform lent to one controller process: it outlives the process, so
    opening and closing it is nothing. Its reads may go wrong (``reads``: ``UNKNOWN_READS``
    or ``FAILING_READS``, set by the test per platform): then a wait reads the state, as a
    platform without pushed changes does, and never sees what it waits for. How its
    requests are made, and whether they can be seen once made, is its kind's
    (``LabPlatform``, ``LabCommandPlatform``)."""

    def __init__(
        self, inner: SimulatedPlatform, life: Life, reads: dict[PlatformName, str], clock: Any
    ) -> None:
        self._inner = inner
        self._life = life
        self._reads = reads
        self._clock = clock
        self.name = inner.name

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def resolve(self, resource: Any, *, direct: bool = False) -> list[Target]:
        await self._life.check()
        return await self._inner.resolve(resource, direct=direct)

    async def power_state(self, target: Target) -> PowerState:
        await self._life.check()
        reads = self._reads.get(self.name)
        if reads == FAILING_READS:
            raise PlatformUnreachable(f"platform {self.name}: no answer (injected)")
        if reads == UNKNOWN_READS:
            return PowerState.UNKNOWN
        return await self._inner.power_state(target)

    async def stop(self, target: Target, method: StopMethod) -> None:
        await self._life.before_request()
        await self._inner.stop(target, method)

    async def start(self, target: Target) -> None:
        await self._life.before_request()
        await self._inner.start(target)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        await self._life.check()
        if self.name in self._reads:
            return await self._poll(target, state, timeout)
        return await self._inner.wait_for(target, state, timeout)

    async def _poll(self, target: Target, state: PowerState, timeout: float) -> bool:
        """What a platform that cannot push changes does; a read that fails is no answer."""
        deadline = self._clock.monotonic() + timeout
        while True:
            try:
                return await poll_for_state(
                    self,
                    target,
                    state,
                    deadline - self._clock.monotonic(),
                    READ_POLL_S,
                    self._clock,
                )
            except TemporaryError:
                if self._clock.monotonic() >= deadline:
                    return False
                await asyncio.sleep(READ_POLL_S)

    async def healthy(self, target: Target) -> bool:
        await self._life.check()
        return await self._inner.healthy(target)


class LabPlatform(LentPlatform):
    """A platform whose requests run as tasks it lists (``InFlightTasks``), as vSphere's do:
    a resumed step finds the request a process before it made, and waits for it."""

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        await self._life.check()
        return await self._inner.in_flight(target, state)


class LabCommandPlatform(LentPlatform):
    """A platform whose requests are commands sent to the device itself, as ``ssh`` steps
    are (``SendsCommands``): once sent, nothing lists them (no ``in_flight``), so a resumed
    step knows of one only from the journal, and when it went out. ``sent`` tells the lab
    that moment too (the rule on asking twice counts from it, as the engine does); the
    command then runs as the world's platform runs a request (its ``request_s`` first, a
    command run to its end). Its hard power-off is the world platform's own."""

    def __init__(
        self,
        inner: SimulatedPlatform,
        life: Life,
        reads: dict[PlatformName, str],
        clock: Any,
        sent: Callable[[Target], None],
    ) -> None:
        super().__init__(inner, life, reads, clock)
        self._sent = sent

    async def send_command(
        self, target: Target, wanted: PowerState, sent: SentListener, *, request: str
    ) -> None:
        await self._life.before_request()
        sent()
        self._sent(target)
        if wanted is PowerState.OFF:
            await self._inner.stop(target, StopMethod.GRACEFUL)
        else:
            await self._inner.start(target)


@dataclass
class WorldCache:
    """A cache of the world, and the faults the test injects into it: a provider that refuses
    to change the mode (with the provider's own kind of error), or takes ``flip_s`` to."""

    inner: SimulatedCache
    refuse: bool = False
    flip_s: float = 0.0
    unreadable: bool = False
    """Its host does not answer: neither its targets nor a reading can be had."""


class LabCache:
    """A world's cache lent to one controller process."""

    def __init__(self, cache: WorldCache, life: Life) -> None:
        self._cache = cache
        self._life = life
        self.name = cache.inner.name

    async def targets(self) -> list[CacheTarget]:
        await self._life.check()
        self._answers()
        return await self._cache.inner.targets()

    async def read(self, target: CacheTarget) -> CacheState:
        await self._life.check()
        self._answers()
        return await self._cache.inner.read(target)

    def _answers(self) -> None:
        if self._cache.unreadable:
            raise TemporaryError(f"cache {self.name}: cannot connect (injected)")

    async def set_mode(self, target: CacheTarget, mode: CacheMode) -> None:
        await self._life.check()
        if self._cache.refuse:
            raise PermanentError(f"cache {target.name}: the provider refused {mode} (injected)")
        if self._cache.flip_s:
            await asyncio.sleep(self._cache.flip_s)
        await self._cache.inner.set_mode(target, mode)

    async def flush(self, target: CacheTarget) -> None:
        await self._life.check()
        await self._cache.inner.flush(target)

    async def close(self) -> None:
        return None


class LabUps(SimulatedUps):
    """A world's UPS as one controller process reads and commands it, through the seat's
    own link to it (``Seat.cut``: no answer, as an upsd out of reach)."""

    def __init__(
        self, config: Any, clock: Any, world: PowerWorld, life: Life, cut: set[UpsName]
    ) -> None:
        super().__init__(config, clock, world)
        self._life = life
        self._cut = cut

    async def read(self) -> Any:
        await self._life.check()
        self._reach()
        return await super().read()

    async def command(self, name: str) -> None:
        await self._life.before_request()
        self._reach()
        await super().command(name)

    def _reach(self) -> None:
        if self.name in self._cut:
            raise UpsUnreachable(f"UPS {self.name}: no answer (this controller's link cut)")


@dataclass
class Seat:
    """A controller's place in the world: its site file and journal, the machine it runs
    on, its own links to the UPSes, and the process running there now (None: down)."""

    name: str
    site: SiteConfig
    site_path: Path
    own: ResourceId
    cut: set[UpsName] = field(default_factory=set)
    """The UPSes this controller cannot reach (its path to upsd is down)."""
    process: Process | None = None

    @property
    def serving(self) -> Process | None:
        """The process once it serves (journal resumed, API up): what a person's CLI and
        the checks of what it says can reach."""
        return self.process if self.process is not None and self.process.opened else None


@dataclass
class Process:
    """One ``upsguard run``: its service, its watch, and the gate a kill closes."""

    number: int
    seat: Seat
    service: Service
    bus: GatedBus
    life: Life
    stop: asyncio.Event
    tasks: list[asyncio.Task[None]] = field(default_factory=list)
    opened: bool = False
    """Its journal resumed and its API up: before, a person's CLI finds no service."""


class OutageLab:
    """The world and the controllers in it: one seat (``upsguard run`` on the site's own
    machine), or more (``seats``: each a name and its site file, the first one's resources
    being the world's; the pair lab's two controllers)."""

    sends_commands: frozenset[PlatformName] = SENDS_COMMANDS
    """The platforms lent as ``LabCommandPlatform``; the others list their tasks."""

    def __init__(
        self,
        tmp: Path,
        site_text: str | None = None,
        seats: Sequence[tuple[str, str]] | None = None,
    ) -> None:
        self.loop = VirtualTimeLoop()
        asyncio.set_event_loop(self.loop)
        self._owners: weakref.WeakKeyDictionary[asyncio.Task[Any], int] = (
            weakref.WeakKeyDictionary()
        )
        self.loop.set_task_factory(self._task)
        self.clock = LoopClock(self.loop, ORIGIN)
        texts = list(seats) if seats is not None else [("lab", site_text or SITE)]
        self.seats = [self._seat(tmp, name, text) for name, text in texts]
        world = self.seats[0]
        self.site_path = world.site_path
        _, self.shutdown, self.startup, scenario = _prepared(texts[0][1])
        self.site = world.site
        protected = {s.resource for s in self.shutdown.steps}
        self.power = PowerWorld(self.site, scenario, self.clock, protected)
        self.fleet = Fleet(self._power_changed, {})
        self.fleet.on_request = self._requested
        self.platforms = {
            PlatformName(name): SimulatedPlatform(
                PlatformName(name), self._simulated(name), self.clock, self.fleet
            )
            for name in sorted({r.platform for r in self.site.resources if r.platform})
        }
        self.caches = {
            c.name: WorldCache(SimulatedCache(c, self.clock))
            for c in self.site.caches
            if isinstance(c, SimulatedCacheSettings)
        }
        self.reads: dict[PlatformName, str] = {}
        """Platforms whose reads go wrong, and how (``UNKNOWN_READS``, ``FAILING_READS``)."""
        self._reads_back_at: dict[PlatformName, float] = {}
        """When each platform's reads came right again."""
        self.power.power_cut = self._power_cut
        self.power.power_back = self._power_back
        self.own = world.own
        self.machines = {seat.own for seat in self.seats}
        """The controllers' own machines: each goes down last, by its own steps."""
        self._count = 0
        self.violations: list[str] = []
        self.seen: list[Seen] = []
        self.events: list[tuple[int, float, Event]] = []
        """What each process said: its number, when, the event."""
        self.starts: list[float] = []
        self._before = _before_steps(self.shutdown.steps)
        self._needs = _before_steps(self.startup.steps)
        self._gates = {s.resource: s.caches for s in self.shutdown.steps if s.caches}
        self._resource_of = {
            s.id: s.resource for p in (self.shutdown, self.startup) for s in p.steps
        }
        self._risk_since: dict[CacheName, float] = {}
        self._clean_since: dict[CacheName, float] = {}
        self._shutdown_steps = {s.id for s in self.shutdown.steps}
        self._cut_at: dict[ResourceId, float] = {}
        """When each resource last lost its power to a UPS going dark."""
        self._timeout_s = {
            (s.resource, wanted): s.settings.timeout_s
            for plan, wanted in ((self.shutdown, PowerState.OFF), (self.startup, PowerState.ON))
            for s in plan.steps
            if s.settings is not None
        }
        """Each step's own timeout, per resource and the state it asks for: the time a
        resumed step waits for a command sent before the restart (``StepRunner``'s
        ``_stop``, ``_start``)."""
        self._sent_at: dict[tuple[int, str], float] = {}
        """When each process's command to a target last went out (``LabCommandPlatform``)."""
        self._reached_at: dict[tuple[ResourceId, PowerState], float] = {}
        """When a target of each resource last came to be off, or on (a command sent before
        it did may be sent again at once)."""
        self._known_dead: set[UpsName] = set()
        """The UPSes whose output was off at the last cut or return: the next cut's cause is
        the one that went off since."""
        self._declared_cuts: dict[UpsName, tuple[float, set[str]]] = {}
        """Per UPS, when its last command was sent and what it said it cuts not known off."""
        self._told: dict[tuple[str, UpsName], tuple[float, int]] = {}
        """Per run and UPS, when its end command was sent, and by which process."""
        self._run_started_at = 0.0
        self._excused: set[ResourceId] = set()
        self._due: dict[str, float] = {}
        self._tracebacks = _Tracebacks(self.violations)
        logging.getLogger("upsguard").addHandler(self._tracebacks)
        self.run(self._resolve_all())
        for seat in self.seats:
            self.run(self.start(seat))

    def _seat(self, tmp: Path, name: str, text: str) -> Seat:
        journal = tmp / f"{name}.sqlite"
        site_path = tmp / f"{name}.yaml"
        site_path.write_text(text.format(journal=journal))
        site = _prepared(text)[0].model_copy(update={"journal": journal})
        own = next(r.id for r in site.resources if r.runs_upsguard)
        return Seat(name, site, site_path, own)

    def _task(
        self,
        loop: asyncio.AbstractEventLoop,
        coro: Any,
        context: contextvars.Context | None = None,
    ) -> asyncio.Task[Any]:
        """Every task, noted with the process it belongs to (its creator's)."""
        task: asyncio.Task[Any] = asyncio.Task(coro, loop=loop, context=context)
        self._owners[task] = (context or contextvars.copy_context()).get(PROCESS, 0)
        return task

    # -- driving -------------------------------------------------------------------------

    def run(
        self,
        coro: Coroutine[Any, Any, T],
        within_s: float = ANSWER_WITHIN_S,
        process: Process | None = None,
    ) -> T:
        """Run ``coro`` on the virtual clock; one that takes longer than ``within_s`` of it is
        stuck (a person's command that never answers), which the run reports. ``process``:
        the controller process it is a command to (alone, the one process there is): what
        it starts belongs to that process, and a kill ends it."""
        process = process or (self.seats[0].process if len(self.seats) == 1 else None)
        return self.loop.run_until_complete(
            self._lab_task(_answers(coro, within_s), process=process)
        )

    def _lab_task(
        self, coro: Coroutine[Any, Any, T], process: Process | None = None
    ) -> asyncio.Task[T]:
        """The test's own doing (never a controller's: a kill leaves it alone); the tasks it
        starts belong to ``process``, when it is a command to one."""
        context = contextvars.copy_context()
        context.run(PROCESS.set, process.number if process is not None else 0)
        name = f"{LAB} {getattr(coro, '__name__', '')}"
        return self.loop.create_task(coro, name=name, context=context)

    def change(self, world_change: Callable[[], object]) -> None:
        """A change of the world, made on the loop (the platforms schedule what follows)."""

        async def now() -> None:
            world_change()

        self.run(now())

    def wait(self, seconds: float) -> None:
        self.run(asyncio.sleep(seconds), within_s=seconds + 1)

    @property
    def now(self) -> float:
        return self.clock.monotonic()

    @property
    def process(self) -> Process | None:
        """The process of the first seat (the only one, alone)."""
        return self.seats[0].process

    @property
    def serving(self) -> Process | None:
        """The first seat's process once it serves (journal resumed, API up): what a
        person's CLI and the checks of what it says can reach."""
        return self.seats[0].serving

    def close(self) -> None:
        for seat in self.seats:
            if seat.process is not None:
                self.run(self._end(seat.process, killed=True))
        logging.getLogger("upsguard").removeHandler(self._tracebacks)
        tasks = asyncio.all_tasks(self.loop)
        for task in tasks:
            task.cancel()
        self.loop.run_until_complete(asyncio.gather(*tasks, return_exceptions=True))
        self.loop.close()
        asyncio.set_event_loop(None)

    # -- the controller processes ------------------------------------------------------------

    def _service(self, seat: Seat, life: Life) -> Service:
        return Service(
            seat.site,
            self.clock,
            plugins=lambda s, c: self._plugins(s, c, life, seat),
            site_path=seat.site_path,
            store=self._store(seat, life),
        )

    def _store(self, seat: Seat, life: Life) -> StoreBuilder:
        """What builds the seat's coordination store: none, alone."""
        return lambda site: None

    async def start(self, seat: Seat | None = None) -> None:
        """``upsguard run`` starts: it opens its journal and resumes what it finds there."""
        seat = seat or self.seats[0]
        if seat.process is not None:
            return
        self._count += 1
        number = self._count
        life = Life(number)
        context = contextvars.copy_context()
        context.run(PROCESS.set, number)
        service = context.run(self._service, seat, life)
        bus = GatedBus(service.bus, lambda event: self._heard(number, event))
        service.bus = bus  # type: ignore[assignment]  # the gate forwards to the real bus
        seat.process = process = Process(number, seat, service, bus, life, asyncio.Event())
        self.starts.append(self.now)
        opening = self.loop.create_task(self._open(process), name="open", context=context)
        await opening

    async def _open(self, process: Process) -> None:
        await process.service.open()
        process.tasks = process.service.watch(process.stop)
        process.opened = True

    async def kill(self, seat: Seat | None = None) -> None:
        """``kill -9``: nothing more is heard of the process, its journal stays as it was."""
        seat = seat or self.seats[0]
        if seat.process is not None:
            await self._end(seat.process, killed=True)

    async def sigterm(self, seat: Seat | None = None) -> None:
        """SIGTERM: the service stops as ``upsguard run`` does, its run left interrupted."""
        seat = seat or self.seats[0]
        if seat.process is not None:
            await self._end(seat.process, killed=False)

    async def reload(self, good: bool, seat: Seat | None = None) -> None:
        """The site file changes and the service is told (SIGHUP): a good change moves the
        required margin by a minute; a bad one breaks a resource (then the good file is put
        back, as a person would before the next start)."""
        seat = seat or self.seats[0]
        if seat.process is None:
            return
        text = seat.site_path.read_text()
        if good:
            margin = (
                "required_margin: 6m" if "required_margin: 5m" in text else "required_margin: 5m"
            )
            changed = text.replace("required_margin: 6m", "@").replace("required_margin: 5m", "@")
            seat.site_path.write_text(changed.replace("@", margin))
            heard = len(self.events)
            await seat.process.service.reload()
            refused = [
                e.message
                for _, _, e in self.events[heard:]
                if isinstance(e, Notice) and e.level == "error"
            ]
            if refused:
                self.violations.append(f"a good site file was refused: {refused[0]}")
            return
        seat.site_path.write_text(text.replace("kind: vm,", "kind: vmm,", 1))
        await seat.process.service.reload()
        seat.site_path.write_text(text)

    async def restart(self, killed: bool, seat: Seat | None = None) -> None:
        seat = seat or self.seats[0]
        await (self.kill(seat) if killed else self.sigterm(seat))
        await asyncio.sleep(RESTART_S)
        if self._own_on(seat):
            await self.start(seat)

    async def _end(self, process: Process, killed: bool) -> None:
        seat = process.seat
        if seat.process is not process:
            return
        process.stop.set()
        # killed (or stopped while it starts): at once, nothing it says is heard, nothing it
        # does reaches the world
        if killed or not process.opened:
            seat.process = None
            process.bus.open = False
            process.life.alive = False
            process.life.awake.set()  # a paused process killed: its calls hang for ever
            tasks = [
                t
                for t in asyncio.all_tasks()
                if not t.get_name().startswith(LAB)
                and self._owners.get(t, 0) in (0, process.number)
            ]
            for task in tasks:
                task.cancel()
            await asyncio.gather(*tasks, return_exceptions=True)
            process.service.journal.close()
            process.service.lock.release()
            return
        # SIGTERM, as serve() stops: the run is interrupted first, then the rest
        await process.service.controller.interrupt()
        for task in process.tasks:
            task.cancel()
        await asyncio.gather(*process.tasks, return_exceptions=True)
        await process.service.close()
        seat.process = None

    def _plugins(self, site: SiteConfig, clock: Any, life: Life, seat: Seat) -> SitePlugins:
        return SitePlugins(
            sources={u.name: LabUps(u, clock, self.power, life, seat.cut) for u in site.ups},
            platforms={name: self._lent(p, life, clock) for name, p in self.platforms.items()},
            caches={name: LabCache(c, life) for name, c in self.caches.items()},
        )

    def _lent(self, platform: SimulatedPlatform, life: Life, clock: Any) -> LentPlatform:
        """The world's platform as a process uses it: one that sends commands, or lists its
        tasks."""
        if platform.name in self.sends_commands:
            return LabCommandPlatform(platform, life, self.reads, clock, self._command_sent)
        return LabPlatform(platform, life, self.reads, clock)

    def _command_sent(self, target: Target) -> None:
        self._sent_at[(PROCESS.get(), target.name)] = self.now

    # -- the world -----------------------------------------------------------------------------

    def _simulated(self, name: str) -> SimulatedPlatformSettings:
        settings = self.site.platform(name)
        assert isinstance(settings, SimulatedPlatformSettings)
        return settings

    async def _resolve_all(self) -> None:
        """Every target exists in the fleet from the start (the world has its machines)."""
        for res in self.site.resources:
            if res.platform in self.platforms:
                await self.platforms[PlatformName(res.platform)].resolve(res)

    def platform_of(self, resource: ResourceId) -> SimulatedPlatform:
        res = self.site.resource_index()[resource]
        return self.platforms[PlatformName(res.platform or "")]

    def targets_of(self, resource: ResourceId) -> list[str]:
        return self.fleet.names.get(resource, [])

    def state(self, target: str) -> PowerState:
        return self.fleet.state.get(target, PowerState.ON)

    def all_in(self, resource: ResourceId, state: PowerState) -> bool:
        return all(self.state(t) is state for t in self.targets_of(resource))

    def _own_on(self, seat: Seat | None = None) -> bool:
        return self.all_in((seat or self.seats[0]).own, PowerState.ON)

    def set_reads(self, platform: PlatformName, reads: str | None) -> None:
        """The platform's reads go wrong (``UNKNOWN_READS``, ``FAILING_READS``), or come right
        (None)."""
        if reads is not None:
            self.reads[platform] = reads
        elif self.reads.pop(platform, None) is not None:
            self._reads_back_at[platform] = self.now

    def _blind(self, platform: PlatformName) -> bool:
        """The platform's reads are wrong, or were within what a step may take to ask after
        its read (a person's command's bound covers it)."""
        back_at = self._reads_back_at.get(platform)
        return platform in self.reads or (
            back_at is not None and self.now - back_at <= ANSWER_WITHIN_S
        )

    def behave(self, resource: ResourceId, behaviour: Behaviour) -> None:
        self.fleet.behaviour[resource] = behaviour

    def _power_changed(self, rid: ResourceId, fraction: float, state: PowerState) -> None:
        self.power.power_changed(rid, fraction, state)
        self._reached_at[(rid, state)] = self.now
        for seat in self.seats:
            if rid != seat.own:
                continue
            if state is PowerState.OFF and seat.process is not None:  # no SIGTERM: power went
                self._lab_task(self.kill(seat))
            elif state is PowerState.ON and seat.process is None:
                self._lab_task(self._boot(seat))

    async def _boot(self, seat: Seat) -> None:
        await asyncio.sleep(RESTART_S)
        if self._own_on(seat):
            await self.start(seat)

    def _power_cut(self, resources: tuple[ResourceId, ...]) -> None:
        self._check_cut(resources)
        platform = next(iter(self.platforms.values()))
        for rid in resources:
            platform.power_lost(rid)
            self._cut_at[rid] = self.now

    def _power_back(self, resources: tuple[ResourceId, ...]) -> None:
        self._known_dead = set(self.power.dead)
        for rid in resources:
            platform = self.platform_of(rid)
            platform.boot(rid, self._simulated(platform.name).host_power_on.total_seconds())

    def will_cycle(self, ups: UpsName) -> bool:
        """The UPS was told a load cycle since its output last came back: it will power its
        outlets again by itself."""
        return self.power.cycling(ups)

    # -- the invariants after each step --------------------------------------------------------

    def missed_shutdown(self) -> str | None:
        """On battery with runtime below the plan plus margin, a shutdown is running or done,
        unless a hold above the floor is in force. A feed gets two polls to be seen (the
        controller reads every poll, and the check may fall between a reading and its
        decision) after its debounce, and the time a run may wait for fresh inventory from a
        platform that does not answer (``REPLAN_WITHIN_S``, not at the floor)."""
        controllers = [
            seat.serving.service.controller
            for seat in self.seats
            if seat.serving is not None and seat.serving.service.controller.view is not None
        ]
        if not controllers:
            self._due.clear()
            return None
        engines = [c.engine for c in controllers]
        if any(e.held is not None and not e.at_floor for e in engines):
            self._due.clear()
            return None
        at_floor = any(e.at_floor for e in engines)
        policies = self.site.policies
        poll = policies.poll_interval.total_seconds()
        debounce = policies.on_battery.after.total_seconds() + poll
        margin = policies.required_margin.total_seconds()
        due: dict[str, tuple[Any, float]] = {}
        for controller in controllers:
            plan = controller.plan_seconds()
            view = controller.view
            assert view is not None
            for f in view.at_risk:
                if (
                    f.name not in due
                    and f.runtime_s is not None
                    and f.at_risk_for_s >= debounce
                    and f.runtime_s < plan[f.name].total_s + margin
                ):
                    due[f.name] = (f, plan[f.name].total_s)
        # the allowance runs from when the feed is due and no shutdown covers it (a person's
        # abort ends the cover: the controller gets its polls to start one again)
        uncovered = [
            name for name in due if not any(_shutdown_covers(c, name) for c in controllers)
        ]
        self._due = {name: self._due.get(name, self.now) for name in uncovered}
        for name, since in self._due.items():
            allowed = 2 * poll + (0.0 if at_floor else REPLAN_WITHIN_S) + self._takeover_s()
            if self.now - since >= allowed:
                feed, plan_s = due[name]
                return (
                    f"T+{self.now:.0f}s: feed {name} on battery with {feed.runtime_s:.0f}s of "
                    f"runtime, below plan {plan_s:.0f}s + margin {margin:.0f}s, "
                    f"since T+{since:.0f}s, and no shutdown runs or ran for it"
                )
        return None

    def _takeover_s(self) -> float:
        """How much longer than one controller a shutdown may take to start: none, alone."""
        return 0.0

    def story_differs(self) -> str | None:
        """What the journal, ``status`` and the controller say is the same story, and
        ``status`` shows nothing unread as ok."""
        for seat in self.seats:
            if seat.serving is None:
                continue
            differs = self._story_differs(seat.serving.service)
            if differs is not None:
                return differs if len(self.seats) == 1 else f"{seat.name}: {differs}"
        return None

    def _follows(self, service: Service) -> bool:
        """Its ledger holds another's runs, not its journal's (a pair's standby): never,
        alone."""
        return False

    def _story_differs(self, service: Service) -> str | None:
        controller = service.controller
        phase = controller.engine.phase
        journaled = service.journal.read.last_phase()
        if journaled is not None and journaled is not phase:
            return f"the journal says phase {journaled}, the controller {phase}"
        status = service.status()
        if status.phase is not phase:
            return f"status says phase {status.phase}, the controller {phase}"
        running = {
            r.id
            for r in service.journal.read.runs(limit=10, with_steps=False)
            if r.state == "running"
        }
        active = controller.ledger.active
        ledger = {active.spec.id} if active is not None else set()
        if running != ledger and not self._follows(service):
            return f"the journal has running runs {sorted(running)}, the ledger {sorted(ledger)}"
        shown = {status.run.id} if status.run is not None else set()
        if shown - ledger:
            return f"status shows run {sorted(shown)}, the ledger {sorted(ledger)}"
        return _unread_shown_as_ok(status, controller)

    # -- the end: the mains come back for good -------------------------------------------------

    def settle(self) -> list[str]:
        """A person clears every fault and the mains come back for good: within a bound worked
        out from the policies, the plans and the battery, the site must be ``normal`` with
        everything up and every cache in write-back. A failure the controller recorded (a
        startup that failed, a site a person shut down) asks the person to start the site
        once, as the CLI tells them to."""
        self.change(self._clear_faults)
        self.run(self._release())
        for person_started in (False, True):
            deadline = self.now + self._bound()
            while self.now < deadline and self.not_back():
                self.wait(self.site.policies.poll_interval.total_seconds())
            if not self.not_back() or person_started or self.violations:
                break
            person = self._persons_controller()
            if person is None:
                break
            self.run(self._person_starts_the_site(person), within_s=self._bound(), process=person)
        return self.not_back() + self.violations

    def not_back(self) -> list[str]:
        """What is not as it was before the outage."""
        out = []
        for seat in self.seats:
            who = "the controller" if len(self.seats) == 1 else f"controller {seat.name}"
            if seat.serving is None:
                why = "" if self._own_on(seat) else f" ({seat.own} is off)"
                out.append(f"{who} is not running{why}")
                continue
            phase = seat.serving.service.controller.engine.phase
            if phase.value != "normal":
                out.append(f"phase {phase}" if len(self.seats) == 1 else f"{who}: phase {phase}")
        for res in self.site.resources:
            if res.starts and not self.all_in(res.id, PowerState.ON):
                off = [t for t in self.targets_of(res.id) if self.state(t) is not PowerState.ON]
                out.append(f"{res.id} not up ({', '.join(off)})")
        for name, cache in self.caches.items():
            mode = cache.inner.mode
            if mode is not CacheMode.WRITE_BACK:
                out.append(f"cache {name} in {mode}")
        return out

    def _clear_faults(self) -> None:
        self.fleet.behaviour.clear()
        for name in list(self.reads):
            self.set_reads(name, None)
        for platform in self.platforms.values():
            platform.hang = None
        for cache in self.caches.values():
            cache.refuse = False
            cache.unreadable = False
        self.power.set_link(None, LinkState.OK)
        self.power.set_self_test(None, False)
        self.power.set_fsd(None, False)
        self.power.set_mains(None, True)

    async def _release(self) -> None:
        for seat in self.seats:
            if seat.serving is not None and seat.serving.service.controller.engine.held:
                seat.serving.service.overrides.release("lab", "the outage is over")

    def _persons_controller(self) -> Process | None:
        """The controller a person tells to start the site: the one that may act."""
        serving = [seat.serving for seat in self.seats if seat.serving is not None]
        acting = [p for p in serving if p.service.controller.may_act]
        chosen = acting or serving
        return chosen[0] if chosen else None

    async def _person_starts_the_site(self, process: Process) -> None:
        overrides = process.service.overrides
        controller = process.service.controller
        await controller.wait_idle()
        with contextlib.suppress(RunBusy):  # the policy's own startup began meanwhile
            await overrides.trigger("lab", "startup", [], "start the site after the outage")

    def _bound(self) -> float:
        """How long the site may take to be back, from now, summing what must happen one
        after the other (a generous sum: each part may overlap the next)."""
        policies = self.site.policies
        poll = policies.poll_interval.total_seconds()
        own = self.site.resource_index()[self.own]
        ups = self.site.ups[0].at_shutdown_end.delay.total_seconds()
        boot = self._simulated(own.platform or "").host_power_on.total_seconds()
        down = any(seat.process is None for seat in self.seats)
        dead = ups + RETURN_DELAY_S + boot + 2 * RESTART_S if down else 0.0
        lowest = min(b.charge_pct for b in self.power.batteries.values())
        charge = max(0.0, policies.startup.charge_above + 1 - lowest) / 100 * RECHARGE_S
        landing = max(self._simulated(p).host_shutdown.total_seconds() for p in self.platforms)
        # a shutdown under way on mains waits for its caches to be clean, however long
        destage = sum(
            c.inner.dirty_bytes() / settings.destage_rate
            for settings in self.site.caches
            if isinstance(settings, SimulatedCacheSettings)
            for c in [self.caches[settings.name]]
        )
        return (
            dead
            + destage
            + policies.power_returns.online_for.total_seconds()
            + max(policies.startup.online_for.total_seconds(), charge)
            + landing
            + self.startup.estimate_s
            + 4 * poll
            + 60.0
        )

    # -- what the rules check -----------------------------------------------------------------

    def _heard(self, process: int, event: Event) -> None:
        self.events.append((process, self.now, event))
        if isinstance(event, RiskAccepted):
            self._risk_since[CacheName(event.cache)] = self.now
        elif isinstance(event, CacheClean):
            self._clean_since[CacheName(event.cache)] = self.now
        elif isinstance(event, RunStarted):
            self._run_started_at = self.now
        elif isinstance(event, UpsCommandSent) and event.ok:
            self._declared_cuts[UpsName(event.ups)] = (self.now, set(event.cuts_not_known_off))
            self._check_told_once(process, event)
        elif isinstance(event, StepFinished):
            if event.state in (StepState.FAILED, StepState.SKIPPED):
                assert event.resource is not None
                self._excused.add(event.resource)
            elif event.state is StepState.DONE and event.step in self._shutdown_steps:
                self._check_done(event)

    def _requested(self, request: Request) -> None:
        process = PROCESS.get()
        sent_s = None
        if request.method is not StopMethod.HARD:
            sent_s = self._sent_at.pop((process, request.target.name), None)
        seen = Seen(self.now, process, request, sent_s)
        if process == 0:
            self.violations.append(f"{_said(seen)} with no controller running")
        self._check_twice(seen)
        if request.method is None:
            self._check_startup_order(seen)
            self._excused.discard(request.resource)
        else:
            self._check_shutdown_order(seen)
            self._check_caches(seen)
            for seat in self.seats:
                if request.resource != seat.own:
                    continue
                if seat is self.seat_of(process):
                    self._check_path_back(seen)
                self.loop.call_later(SIGTERM_AFTER_S, self._poweroff_stops_service, seat)
        self._check_request(seen)
        self.seen.append(seen)

    def _check_request(self, seen: Seen) -> None:
        """More rules a request must keep (the pair's): none, alone."""

    def seat_of(self, process: int) -> Seat | None:
        return next((s for s in self.seats if s.process and s.process.number == process), None)

    def _poweroff_stops_service(self, seat: Seat) -> None:
        self._lab_task(self.sigterm(seat))

    def _check_twice(self, seen: Seen) -> None:
        """No step acts twice on its target: a request while the same one is under way, or
        on a target already there. A guest shutdown asked again by a new process (after a
        crash) is the one exception: harmless, and waiting instead would cost battery."""
        request = seen.request
        target = request.target.name
        wanted = request.wanted
        going = self.fleet.going_to(target)
        there = going is None and self.state(target) is wanted
        previous = next((s for s in reversed(self.seen) if s.request.target.name == target), None)
        under_way = going is wanted and previous is not None and previous.request == request
        # a new process that could not see the guest go down (its read of the state did not
        # answer) may ask again: harmless, whether the guest is still going or gone
        resent_guest = (
            request.method is StopMethod.GRACEFUL
            and request.target.kind.value == "vm"
            and previous is not None
            and previous.request == request
            and previous.process != seen.process
        )
        if resent_guest or (previous is not None and self._may_ask_again(previous, seen)):
            return
        if previous is not None and self._resent(previous, seen):
            return
        # a controller that could not read the target asks: the platform refuses what is
        # there (its request may land after the reads came right: a hang, a retry)
        blind = self._blind(request.target.platform)
        if there and not blind:
            self.violations.append(f"{_said(seen)}: {target} is {wanted} already")
        elif under_way and previous is not None:
            self.violations.append(
                f"{_said(seen)}: asked twice (first at T+{previous.at_s:.0f}s by process "
                f"{previous.process})"
            )

    def _check_told_once(self, process: int, event: UpsCommandSent) -> None:
        """A UPS is sent a run's end command once, across kills and restarts (the journal
        keeps which were told)."""
        if event.run is None:
            return
        key = (event.run, UpsName(event.ups))
        earlier = self._told.get(key)
        if earlier is not None and not self._may_tell_again(process, event.run, key[1]):
            self.violations.append(
                f"T+{self.now:.0f}s: UPS {event.ups} sent {event.command} a second time in run "
                f"{event.run} (first at T+{earlier[0]:.0f}s by process {earlier[1]})"
            )
        self._told[key] = (self.now, process)

    def _may_tell_again(self, process: int, run: str, ups: UpsName) -> bool:
        """A second end command to a UPS the rule allows (the pair's, without the store):
        none, alone."""
        return False

    def _resent(self, previous: Seen, seen: Seen) -> bool:
        """A command sent again by a new process, to a target it has not taken to its state
        since: allowed once the step's own timeout has passed since the first went out (it
        may never have reached the device), a violation before. True when it is judged here;
        False when it is no such command (the other rules judge it)."""
        request = seen.request
        if (
            seen.sent_s is None
            or previous.sent_s is None
            or previous.request != request
            or previous.process == seen.process
            or self._reached_at.get((request.resource, request.wanted), -1.0) >= previous.sent_s
        ):
            return False
        timeout = self._timeout_s[(request.resource, request.wanted)]
        after = seen.sent_s - previous.sent_s
        if after < timeout - JOURNAL_TICK_S:
            self.violations.append(
                f"{_said(seen)}: sent again {after:.0f}s after the first (T+{previous.sent_s:.0f}s "
                f"by process {previous.process}), within the step's timeout of {timeout:.0f}s"
            )
        return True

    def _may_ask_again(self, previous: Seen, seen: Seen) -> bool:
        """A second request to a target the rule allows besides a guest's (the pair's, when
        nothing could fence the two): none, alone."""
        return False

    def _check_shutdown_order(self, seen: Seen) -> None:
        """Nothing stops before what depends on it has stopped (or its failure is recorded)."""
        for rid in self._before.get(seen.request.resource, ()):
            if rid in self._excused or self.all_in(rid, PowerState.OFF):
                continue
            self.violations.append(f"{_said(seen)} while {rid}, which needs it, is still on")

    def _check_startup_order(self, seen: Seen) -> None:
        """Nothing starts before what it depends on is up. A need that its UPS cut during
        this run, after its step found it up (a battery emptied by a self-test under the
        startup), went down under the controller, not by its order."""
        for rid in self._needs.get(seen.request.resource, ()):
            cut_in_this_run = self._cut_at.get(rid, -1.0) >= self._run_started_at
            if not self.all_in(rid, PowerState.ON) and not cut_in_this_run:
                self.violations.append(f"{_said(seen)} while {rid}, which it needs, is not up")

    def _check_caches(self, seen: Seen) -> None:
        """No host or storage stops while a cache in its data path is dirty, or was not read
        clean, unless that risk was recorded in this run."""
        for cache in self._gates.get(seen.request.resource, ()):
            dirty = self.caches[cache].inner.dirty_bytes()
            accepted = self._risk_since.get(cache, -1.0) >= self._run_started_at
            read_clean = self._clean_since.get(cache, -1.0) >= self._run_started_at
            if accepted:
                continue
            if dirty:
                self.violations.append(f"{_said(seen)} while cache {cache} holds {dirty} B dirty")
            elif not read_clean:
                self.violations.append(f"{_said(seen)} while cache {cache} was not read clean")

    def _check_done(self, event: StepFinished) -> None:
        """A shutdown step is done only when its targets are off (seen off, or its command
        succeeded), never because they could not be read. A group's member step and the
        controller's own machine (off only once its poweroff lands) are left out."""
        resource = event.resource
        res = self.site.resource_index().get(resource) if resource is not None else None
        if res is None or event.member or res.id in self.machines or res.kind.value == "vm_group":
            return
        on = [t for t in self.targets_of(res.id) if self.state(t) is not PowerState.OFF]
        if on:
            self.violations.append(
                f"T+{self.now:.0f}s: step {event.step} done ({event.detail}) while "
                f"{', '.join(on)} {'is' if len(on) == 1 else 'are'} not off"
            )

    def _check_cut(self, resources: tuple[ResourceId, ...]) -> None:
        """A UPS's command cuts nothing that is not off, but what it named as such when sent
        at the critical floor. A resource started since the command was sent (the mains came
        back meanwhile) is the load cycle's own business, not the command's choice."""
        newly = {u for u in self.power.dead if u not in self._known_dead}
        self._known_dead = set(self.power.dead)
        by_command = {u for u in newly if self.power.dead[u] == "switched off by a command"}
        if not by_command:
            return
        commanded = [
            (ups, at, declared)
            for ups, (at, declared) in self._declared_cuts.items()
            if self.power.dead.get(ups) == "switched off by a command"
        ]
        declared = {r for _, _, names in commanded for r in names}
        sent_at = min(at for _, at, _ in commanded)
        for rid in resources:
            res = self.site.resource_index().get(rid)
            if res is None or not res.stops or rid in self.machines or rid in declared:
                continue
            on = [t for t in self.targets_of(rid) if self.state(t) is PowerState.ON]
            started = any(
                s.at_s >= sent_at and s.request.resource == rid and s.request.method is None
                for s in self.seen
            )
            if on and not started:
                self.violations.append(
                    f"T+{self.now:.0f}s: UPS {', '.join(u for u, _, _ in commanded)} cut "
                    f"{rid} ({', '.join(on)} on), not known off and not named at the floor"
                )

    def _check_path_back(self, seen: Seen) -> None:
        """The controller's own machine stops only once its UPSes will bring power back."""
        for ups in self.power.ups_of(seen.request.resource):
            if not self.will_cycle(ups):
                self.violations.append(
                    f"{_said(seen)}: nothing brings power back (UPS {ups} got no load cycle)"
                )


class _Tracebacks(logging.Handler):
    """Any traceback logged by upsguard is a bug the run found."""

    def __init__(self, violations: list[str]) -> None:
        super().__init__(logging.ERROR)
        self._violations = violations

    def emit(self, record: logging.LogRecord) -> None:
        if record.exc_info:
            self._violations.append(f"traceback logged: {record.getMessage()}")


class Stuck(AssertionError):
    """Something the test waited for never ended on the virtual clock."""


@functools.cache
def _prepared(site_text: str) -> tuple[SiteConfig, Plan, Plan, Scenario]:
    """The site (its journal aside), its plans and the scenario, read once per site text
    rather than once per story: thousands of stories share them, and none changes them. The
    site is checked as the service checks it, so that its reloads are not refused."""
    site = check_site(parse_yaml(site_text.format(journal="lab.sqlite"), "lab.yaml"))
    planner = Planner(site)
    shutdown, startup = planner.plan(Direction.SHUTDOWN), planner.plan(Direction.STARTUP)
    return site, shutdown, startup, parse_scenario(SCENARIO, site, "lab-scenario.yaml")


async def _answers(coro: Coroutine[Any, Any, T], within_s: float) -> T:
    task = asyncio.get_running_loop().create_task(coro, name=f"{LAB} answer")
    done, _ = await asyncio.wait([task], timeout=within_s)
    if not done:
        stacks = []
        for other in asyncio.all_tasks():
            frames = other.get_stack(limit=3)
            where = " <- ".join(f"{f.f_code.co_name}:{f.f_lineno}" for f in reversed(frames))
            stacks.append(f"  {other.get_name()}: {where}")
        task.cancel()
        raise Stuck(f"no answer within {within_s:.0f}s of virtual time:\n" + "\n".join(stacks))
    return task.result()


def _shutdown_covers(controller: Any, feed: str) -> bool:
    """A shutdown of this outage (newer than the last startup of the feed's resources) that
    covers the feed is running, or ran to its end."""
    for record in controller.ledger.newest_first():
        spec = record.spec
        if spec.kind is RunKind.STARTUP:
            starts = spec.only or [r.id for r in controller.site.resources]
            powered = {f.name for r in starts for f in controller.site.feeds_powering(r)}
            if feed in powered:  # it powered the feed's resources up again
                return False
            continue
        covers = spec.feeds is None or feed in spec.feeds
        ended_well = record.outcome in (RunOutcome.DONE, RunOutcome.FAILED)
        if spec.kind is RunKind.SHUTDOWN and covers and (record.active or ended_well):
            return True
    return False


def _before_steps(steps: Any) -> dict[ResourceId, set[ResourceId]]:
    """Per resource, the resources whose steps its own step waits for."""
    resource = {s.id: s.resource for s in steps}
    out: dict[ResourceId, set[ResourceId]] = {}
    for step in steps:
        out.setdefault(step.resource, set()).update(resource[w] for w in step.waits_for)
    return out


def _unread_shown_as_ok(status: Any, controller: Any) -> str | None:
    """``status`` never says ok for what was not read: a UPS whose last reading is not live
    is not ``online``, and a feed with such a member is not ``online`` (``degraded``, a
    warning, says a member is off line; a member held through a short blip says ``held``,
    and the feed may stay as it was)."""
    unread = {
        str(name)
        for name, watch in controller.watches.items()
        if watch.last is None or watch.last.link is not LinkState.OK
    }
    for feed in status.feeds:
        for ups, word in feed.members.items():
            if ups in unread and word == "online":
                return f"status says UPS {ups} is online, and it cannot be read"
        blind = [u for u, word in feed.members.items() if u in unread and word != "held"]
        if blind and feed.state == "online":
            return f"status says feed {feed.name} online while {', '.join(blind)} unread"
    return None


def _said(seen: Seen) -> str:
    what = "start" if seen.request.method is None else f"{seen.request.method} stop"
    return f"T+{seen.at_s:.0f}s process {seen.process}: {what} of {seen.request.target.name}"


__all__ = ["Life", "OutageLab", "Process", "Seat", "Seen"]
