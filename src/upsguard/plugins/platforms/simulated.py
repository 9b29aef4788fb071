"""A platform that exists only in the simulator and the demo.

Targets change power state after the delays of its settings (or of a
scenario's per-resource behaviour); a platform may hang for a while (``Hang``): it then
answers no request until the hang is over. Power states live in a ``Fleet`` that
several simulated platforms can share, so a host powered on through its
simulated BMC is seen on by its simulated vCenter; the fleet's ``listener``
hears every change, so the simulator's battery model sees the load follow, and its
``on_request`` hears every request the moment the platform accepts it (what the outage
invariants count).

A request is accepted at once, like vSphere's tasks, unless the behaviour gives it a
``request_s``: then it runs that long first, like a command platform's ``ssh host
poweroff`` run to its end, and a request cancelled before it ends never lands. The
platform lists its requests under way (``InFlightTasks``), as vSphere and Proxmox do.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta

from upsguard.clock import Clock
from upsguard.config.platforms import SimulatedPlatformSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import GracefulUnavailable, PermanentError
from upsguard.models import PlatformName, PowerState, ResourceId, ResourceKind, StopMethod, Target

PowerListener = Callable[[ResourceId, float, PowerState], None]


@dataclass(frozen=True, slots=True)
class Request:
    """A request a simulated platform accepted: what it will do to which target."""

    platform: PlatformName
    target: Target
    resource: ResourceId
    method: StopMethod | None
    """How it stops the target; None for a power-on."""

    @property
    def wanted(self) -> PowerState:
        return PowerState.ON if self.method is None else PowerState.OFF


RequestListener = Callable[[Request], None]


@dataclass(frozen=True, slots=True)
class Behaviour:
    """How one resource misbehaves in a scenario."""

    stop_s: float | None = None
    start_s: float | None = None
    hang: bool = False  # the guest never finishes a graceful shutdown
    fail: str | None = None  # "stop" | "start": the platform refuses
    why: str = "scenario"  # said with the refusal
    no_tools: bool = False
    request_s: float = 0.0
    """How long a request runs before the platform accepts it (a command run to its end)."""


_AS_CONFIGURED = Behaviour()


@dataclass(frozen=True, slots=True)
class Hang:
    """A span of the clock's ``monotonic`` time in which the platform answers no request
    (a vCenter whose API hangs); ``end_s`` None: it never answers again."""

    start_s: float
    end_s: float | None = None


class Fleet:
    """The power state of every simulated target, shared by the simulated platforms."""

    def __init__(
        self,
        listener: PowerListener | None = None,
        behaviour: dict[ResourceId, Behaviour] | None = None,
    ) -> None:
        self.listener = listener
        self.on_request: RequestListener | None = None
        self.behaviour = behaviour or {}
        self.state: dict[str, PowerState] = {}
        self.owner: dict[str, tuple[ResourceId, float]] = {}
        self.names: dict[ResourceId, list[str]] = {}
        """Each resource's targets, in the order ``owner`` came to know them: a UPS that cuts
        thousands of resources looks each up here, not in every target's owner."""
        self.changed: dict[str, list[asyncio.Future[None]]] = {}  # waiters per target
        self.pending: dict[str, tuple[float, PowerState]] = {}  # target -> (when, new state)
        self.due: dict[float, tuple[asyncio.TimerHandle, list[str]]] = {}
        """One loop timer per moment changes land, not per target: 200 VMs asked to stop
        together all turn off together, and 5,000 timers would each cost a heap push."""

    def going_to(self, name: str) -> PowerState | None:
        """The state a target is on its way to: a request accepted that has not landed yet."""
        pending = self.pending.get(name)
        return pending[1] if pending is not None else None


class SimulatedPlatform:
    def __init__(
        self,
        name: PlatformName,
        settings: SimulatedPlatformSettings,
        clock: Clock,
        fleet: Fleet | None = None,
        hang: Hang | None = None,
    ) -> None:
        self.name = name
        self.hang = hang
        """When the platform answers no request; a scenario (or a test) may change it."""
        self._s = settings
        self._clock = clock
        fleet = fleet or Fleet()
        self.fleet = fleet
        self._behaviour = fleet.behaviour
        self._state = fleet.state
        self._owner = fleet.owner
        self._names = fleet.names
        self._changed = fleet.changed
        self._pending = fleet.pending
        self._due = fleet.due

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        for handle, _ in self._due.values():
            handle.cancel()

    async def _answer(self) -> None:
        """Return when the platform answers: at once, or once its hang is over (never, for
        a hang without an end; the caller's own timeout ends the wait)."""
        hang = self.hang
        now = self._clock.monotonic()
        if hang is None or now < hang.start_s:
            return
        if hang.end_s is None:
            await asyncio.get_running_loop().create_future()
        elif now < hang.end_s:
            await asyncio.sleep(hang.end_s - now)

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        await self._answer()
        names = self._member_names(resource)
        kind = ResourceKind.VM if resource.kind is ResourceKind.VM_GROUP else resource.kind
        host = resource.runs_on[0] if resource.runs_on else None
        targets = [Target(self.name, kind, n, host=host, direct=direct) for n in names]
        for target in targets:
            if target.name not in self._owner:
                self._owner[target.name] = (resource.id, 1.0 / len(targets))
                self._names.setdefault(resource.id, []).append(target.name)
            self._state.setdefault(target.name, PowerState.ON)
        return targets

    def _member_names(self, resource: ResourceConfig) -> list[str]:
        if resource.kind is not ResourceKind.VM_GROUP:
            return [resource.target_name]
        count = resource.count if resource.count is not None else 1
        return [f"{resource.id}-{i:02d}" for i in range(1, count + 1)]

    async def power_state(self, target: Target) -> PowerState:
        await self._answer()
        return self._state.get(target.name, PowerState.ON)

    async def stop(self, target: Target, method: StopMethod) -> None:
        await self._answer()
        rid, _ = self._owner[target.name]
        act = self._behaviour.get(rid, _AS_CONFIGURED)
        if act.fail == "stop":
            raise PermanentError(f"{target.name}: the platform refused the shutdown ({act.why})")
        graceful_vm = method is StopMethod.GRACEFUL and target.kind is ResourceKind.VM
        if graceful_vm and (act.no_tools or not self._s.tools_running):
            raise GracefulUnavailable(f"{target.name}: VMware Tools not running")
        await self._run_request(act)
        self._accepted(Request(self.name, target, rid, method))
        if method is StopMethod.HARD:
            self._schedule(target.name, PowerState.OFF, self._s.hard_power_off.total_seconds())
            return
        if act.hang:
            return
        delay = act.stop_s if act.stop_s is not None else self._stop_delay(target.kind)
        self._schedule(target.name, PowerState.OFF, delay)

    async def _run_request(self, act: Behaviour) -> None:
        if act.request_s > 0:
            await asyncio.sleep(act.request_s)

    def _accepted(self, request: Request) -> None:
        if self.fleet.on_request is not None:
            self.fleet.on_request(request)

    def _stop_delay(self, kind: ResourceKind) -> float:
        if kind is ResourceKind.VM:
            return self._s.guest_shutdown.total_seconds()
        if kind is ResourceKind.HOST:
            return self._s.host_shutdown.total_seconds()
        return self._s.device_shutdown.total_seconds()

    async def start(self, target: Target) -> None:
        await self._answer()
        rid, _ = self._owner[target.name]
        act = self._behaviour.get(rid, _AS_CONFIGURED)
        if act.fail == "start":
            raise PermanentError(f"{target.name}: the platform refused the power-on ({act.why})")
        await self._run_request(act)
        self._accepted(Request(self.name, target, rid, None))
        on: timedelta = (
            self._s.host_power_on if target.kind is ResourceKind.HOST else self._s.power_on
        )
        delay = act.start_s if act.start_s is not None else on.total_seconds()
        self._schedule(target.name, PowerState.ON, delay)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        if self.hang is not None:  # waiting is asking too: a hung platform answers late
            try:
                async with asyncio.timeout_at(deadline):
                    await self._answer()
            except TimeoutError:
                return False
        while self._state.get(target.name, PowerState.ON) is not state:
            changed = loop.create_future()
            self._changed.setdefault(target.name, []).append(changed)
            if self._lands_by(target.name, state, deadline):
                await changed  # the change already scheduled wakes us: no timer needed
                continue
            try:
                async with asyncio.timeout_at(deadline):
                    await changed
            except TimeoutError:
                return False
        return True

    def _lands_by(self, name: str, state: PowerState, deadline: float) -> bool:
        pending = self._pending.get(name)
        return pending is not None and pending[1] is state and pending[0] <= deadline

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        """A request accepted before and not landed yet that takes ``target`` to ``state``."""
        await self._answer()
        pending = self._pending.get(target.name)
        if pending is None or pending[1] is not state:
            return None
        verb = "power-on" if state is PowerState.ON else "shutdown"
        return f"the {verb} of {target.name}"

    async def healthy(self, target: Target) -> bool:
        await self._answer()
        return self._state.get(target.name, PowerState.ON) is PowerState.ON

    def power_lost(self, resource: ResourceId) -> None:
        """The UPS feeding this resource ran empty or cut its output: everything of it is
        off, now, and what was on its way is lost with the power."""
        for name in self._names_of(resource):
            self._set(name, PowerState.OFF)

    def boot(self, resource: ResourceId, after_s: float) -> None:
        """Power came back to a machine whose firmware powers it on with the mains: it is on
        after ``after_s`` (no request of upsguard's: nothing is counted)."""
        for name in self._names_of(resource):
            self._schedule(name, PowerState.ON, after_s)

    def _names_of(self, resource: ResourceId) -> list[str]:
        return list(self._names.get(resource, ()))

    def _schedule(self, name: str, state: PowerState, delay: float) -> None:
        if self._pending.pop(name, None) is not None:
            self._wake(name)  # a waiter counting on the replaced change looks again
        loop = asyncio.get_running_loop()
        when = loop.time() + max(delay, 0.0)
        self._pending[name] = (when, state)
        if when not in self._due:
            self._due[when] = (loop.call_at(when, self._land, when), [])
        self._due[when][1].append(name)

    def _land(self, when: float) -> None:
        _, names = self._due.pop(when)
        for name in names:
            pending = self._pending.get(name)
            if pending is not None and pending[0] == when:
                self._set(name, pending[1])

    def _set(self, name: str, state: PowerState) -> None:
        self._pending.pop(name, None)
        previous = self._state.get(name, PowerState.ON)
        self._state[name] = state
        listener = self.fleet.listener
        if previous is not state and listener is not None and name in self._owner:
            rid, share = self._owner[name]
            listener(rid, share, state)
        self._wake(name)

    def _wake(self, name: str) -> None:
        for changed in self._changed.pop(name, ()):
            if not changed.done():
                changed.set_result(None)
