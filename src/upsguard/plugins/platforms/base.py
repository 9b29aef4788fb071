"""The ``Platform`` protocol: what stops and starts resources."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol, runtime_checkable

from upsguard.clock import Clock
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, UpsguardError
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import CommandProcess, PlatformName, PowerState, StopMethod, Target


@runtime_checkable
class Platform(Protocol):
    """One endpoint (a vCenter, a BMC, an SSH user) that powers targets off and on.

    Every method may raise ``PlatformUnreachable`` (worth retrying) or
    ``AuthenticationError``; the executor owns retries, timeouts and fallbacks,
    so methods do one thing each and return promptly.
    """

    name: PlatformName

    async def open(self) -> None:
        """Connect and log in. Raises ``AuthenticationError``, ``PlatformUnreachable``."""
        ...

    async def close(self) -> None:
        """Log out and release connections. Never raises."""
        ...

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        """The targets a resource stands for: one for a VM or host, the members of a VM group.

        ``direct`` asks for targets reachable without the platform's manager
        (ESXi hosts once vCenter is down). Raises ``PermanentError`` naming the
        resource when it does not exist on the platform or its selector is bad.
        """
        ...

    async def power_state(self, target: Target) -> PowerState:
        """The target's power state now."""
        ...

    async def stop(self, target: Target, method: StopMethod) -> None:
        """Ask the target to stop; return once the request is accepted, not when it is off.

        Raises ``GracefulUnavailable`` when ``method`` is graceful and no graceful
        path exists (no VMware Tools, no agent): the executor then falls back.
        """
        ...

    async def start(self, target: Target) -> None:
        """Ask the target to power on; return once the request is accepted."""
        ...

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        """Wait until the target reaches ``state``; False when ``timeout`` seconds pass first.

        Implementations share one watch over all waiting targets where the API
        allows it (vSphere's PropertyCollector) instead of polling each.
        """
        ...

    async def healthy(self, target: Target) -> bool:
        """The platform's own view that a started target is usable (Tools up, host connected)."""
        ...


class PlatformFactory(Protocol):
    def __call__(self, name: PlatformName, settings: Any, clock: Clock) -> Platform: ...


async def poll_for_state(
    platform: Platform,
    target: Target,
    state: PowerState,
    timeout: float,
    interval: float,
    clock: Clock,
) -> bool:
    """``wait_for`` for APIs that cannot push changes: read the state every ``interval``."""
    deadline = clock.monotonic() + timeout
    while True:
        if await platform.power_state(target) is state:
            return True
        left = deadline - clock.monotonic()
        if left <= 0:
            return False
        await asyncio.sleep(min(interval, left))


async def port_state(host: str, port: int, timeout: float) -> PowerState:
    """ON when ``host`` accepts a TCP connection on ``port`` within ``timeout``, else UNKNOWN:
    a refused or unanswered connection, or a name that does not resolve, is what a machine
    that is off looks like, and also one behind a broken path or DNS server."""
    try:
        async with asyncio.timeout(timeout):
            _, writer = await asyncio.open_connection(host, port)
    except (OSError, TimeoutError):
        return PowerState.UNKNOWN
    writer.close()
    with contextlib.suppress(OSError):
        await writer.wait_closed()
    return PowerState.ON


class ResourceTargets:
    """For platforms that act per resource (its commands, its status check): one target per
    resource, keyed by the resource's id, since two devices may share an address."""

    def __init__(self, platform: PlatformName) -> None:
        self._platform = platform
        self._by_id: dict[str, ResourceConfig] = {}

    def target(self, resource: ResourceConfig) -> Target:
        self._by_id[str(resource.id)] = resource
        return Target(self._platform, resource.kind, resource.target_name, ref=str(resource.id))

    def resource(self, target: Target) -> ResourceConfig:
        res = self._by_id.get(target.ref or "")
        if res is None:
            raise PermanentError(
                f"target {target.name} was not resolved by platform {self._platform}"
            )
        return res


@runtime_checkable
class InFlightTasks(Protocol):
    """A platform whose requests run as tasks it can list (vSphere, Proxmox): an optional
    capability, used when a run is resumed.

    A step cut short by a crash may have left its request under way: a host whose shutdown
    task runs still reads powered on, so reading the state alone would ask it again. The
    resumed step asks this first and waits for what it finds instead.
    """

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        """What the platform is still doing that takes ``target`` to ``state`` (a shutdown or
        power-off toward ``OFF``, a power-on toward ``ON``), as one line naming the task;
        None when nothing is under way. Finished and failed tasks are not under way.
        Raises ``PlatformUnreachable``."""
        ...


ProcessListener = Callable[[CommandProcess], None]


@runtime_checkable
class RunsProcesses(Protocol):
    """A platform whose requests are commands it runs here, each in a session of its own
    (``command``): an optional capability. Such a command outlives the controller, and its
    exit status would die with it: so the step hears each process as it starts (and the
    journal keeps it), the command's own session writes its exit status to a file, and a
    restarted controller hands the processes back (``adopt``) instead of starting them
    again. While a process for a target runs, the platform starts no other for it."""

    async def request(
        self, target: Target, wanted: PowerState, label: str, started: ProcessListener
    ) -> None:
        """Run the command that takes ``target`` to ``wanted`` (``OFF``: its shutdown, ``ON``:
        its startup) to its end, as ``stop``/``start`` do; ``label`` names its exit-status
        file (a run and a step). ``started`` hears the process before the command runs. A
        process for the target still running (adopted, or one a cancelled call left) is
        waited for and judged instead. Raises as ``stop``/``start`` do."""
        ...

    def adopt(self, target: Target, wanted: PowerState, process: CommandProcess) -> None:
        """A process started for ``target`` before a restart (from the journal): while it runs
        it is the request under way (``in_flight``, ``wait_for``), and once it ended its exit
        status judges the step."""
        ...


SentListener = Callable[[], None]


@runtime_checkable
class SendsCommands(Protocol):
    """A platform whose requests are commands run on the target itself (``ssh``): an optional
    capability. Once sent, such a command cannot be seen from here: it may run on after the
    connection, or the controller, is gone, and nothing lists it. So the step hears the
    moment each command is sent (the journal keeps it, and when), and a resumed run sends no
    second one before the step's own timeout has passed since the first (``engine.actions``).
    """

    async def send_command(
        self, target: Target, wanted: PowerState, sent: SentListener, *, request: str
    ) -> None:
        """Run the command that takes ``target`` to ``wanted`` (``OFF``: its shutdown, ``ON``:
        its startup), as ``stop``/``start`` do. ``sent`` hears the moment the command goes
        out, once the connection is open: a device that could not be reached was sent
        nothing. ``request``: the run and step asking (the same after a restart), or empty
        for a person acting directly. A copy of the same command still running on the
        device, or one started there for the same request (where the platform can tell), is
        that request under way: it returns as if accepted, starting none. Raises as
        ``stop``/``start`` do."""
        ...


@runtime_checkable
class SeenWhileItAnswers(Protocol):
    """A platform that sees a target only while the target itself answers (SSH): an optional
    capability. Silence reads ``UNKNOWN`` (the device may be off, or the path to it, or its
    DNS server, down), except once a shutdown the target accepted is under way: then a
    target that stops answering has gone down, and silence reads ``OFF``. The platform
    remembers the shutdowns it sent; a resumed run tells it of those accepted before the
    restart."""

    def shutdown_accepted(self, target: Target) -> None:
        """``target`` accepted a shutdown (before a restart): from now on silence is ``OFF``,
        until it is seen up again or asked to start."""
        ...


class AcceptedShutdowns:
    """What a ``SeenWhileItAnswers`` platform remembers: the targets that accepted their
    shutdown, and whether each has gone quiet since. Quiet (no answer, or its manager lost
    it) after an accepted shutdown is that shutdown landing: off. Seen up again after going
    quiet, the target came back, and quiet is unknown again."""

    def __init__(self) -> None:
        self._went_quiet: dict[str, bool] = {}

    def asked(self, name: str) -> None:
        """This platform's shutdown of ``name`` was accepted just now."""
        self._went_quiet[name] = False

    def accepted(self, name: str) -> None:
        """A shutdown of ``name`` accepted before a restart (or by the other controller)."""
        self._went_quiet.setdefault(name, False)

    def forget(self, name: str) -> None:
        """``name`` is asked to start: quiet is unknown again."""
        self._went_quiet.pop(name, None)

    def state(self, name: str, read: PowerState, quiet: bool) -> PowerState:
        """``name`` read as ``read``; ``quiet``: it did not answer, or its manager lost it
        (which alone says nothing: ``read`` is then ``UNKNOWN``)."""
        went_quiet = self._went_quiet.get(name)
        if went_quiet is None:
            return read
        if quiet:
            self._went_quiet[name] = True
            return PowerState.OFF
        if read is PowerState.ON and went_quiet:
            del self._went_quiet[name]
        return read


@runtime_checkable
class InventorySource(Protocol):
    """A platform that can list everything it manages (vSphere): an optional capability.

    ``inventory_report`` returns plain data: ``{"vms": [{"name", "ref", "host", "power",
    "system", ...}], "hosts": [...], ...}``. Raises ``PlatformUnreachable`` when the
    platform does not answer.
    """

    async def inventory_report(self) -> dict[str, Any]: ...


@runtime_checkable
class ManagerVmSource(Protocol):
    """A platform whose manager may run as one of its own VMs (vCenter): an optional
    capability, asked by ``upsguard init`` to mark that VM ``serves_platform``."""

    async def manager_vm(self) -> str | None:
        """The name of the VM that runs this platform's manager, when the platform can tell
        it for sure; None when it cannot (no VM is known to be it, or several could be).
        Never a guess. Raises ``PlatformUnreachable`` when the platform does not answer."""
        ...


@runtime_checkable
class PlatformDiagnosis(Protocol):
    """A platform that can check, without acting, what the plan's steps need of it: an
    optional capability, asked by ``upsguard doctor`` and the service's scheduled checks.
    Platforms without it are checked by ``open`` alone.
    """

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """Check the login and the rights the steps on ``resources`` need (the resources of
        the site file that name this platform as ``platform`` or ``power_on_via``): vSphere
        privileges, an SSH host key and login, a BMC that answers, a path for Wake-on-LAN
        packets. Say which right is missing (``Finding.missing``).

        Never stops, starts or changes anything. Each problem is a ``warn`` or ``fail``
        finding (``Area.PLATFORM`` with the platform's name, or ``Area.RESOURCE`` with the
        resource's id) with its fix; an error it did not expect propagates, and the doctor
        makes it a ``fail``. Whether each resource resolves, and its state, the doctor reads
        through ``resolve`` and ``power_state`` itself.
        """
        ...


async def bmc_answers(
    platform: Platform, resources: Sequence[ResourceConfig], fix: str
) -> list[Finding]:
    """A BMC's (or any power-on platform's) check: the machine of each resource it powers
    resolves, and its power state reads; ``fix`` is what to do when it does not answer."""
    states: list[str] = []
    for res in resources:
        try:
            for target in await platform.resolve(res):
                states.append(f"{res.id} {(await platform.power_state(target)).value}")
        except UpsguardError as exc:
            return [fail(Area.PLATFORM, platform.name, "answers", str(exc), fix)]
    if not states:
        return []
    return [ok(Area.PLATFORM, platform.name, "answers", "power state read: " + ", ".join(states))]
