"""Where a target lives now: which session reaches it, and its managed object id there.

A target is reached through vCenter, or through its ESXi host directly: vCenter's
own VM, steps planned direct, and everything once vCenter is down: stopped by
us, or not answering, at login after an outage or mid-run (a call left unanswered
for ``vcenter_silent_after``). One that does not answer is asked again aside every
few seconds; the steps go on through the hosts meanwhile. Its id
comes with the target when vCenter resolved it; otherwise it is found by name in
the session's inventory, read again once when the name is not there. VM steps,
host steps and the resolution of resources all find things here.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from pyVmomi import vim

from upsguard.clock import Clock
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, PlatformUnreachable, UpsguardError
from upsguard.models import PlatformName, PowerState, ResourceKind, Target
from upsguard.plugins.platforms.vsphere.inventory import HostInfo, Snapshot, VmInfo
from upsguard.plugins.platforms.vsphere.reads import Props
from upsguard.plugins.platforms.vsphere.session import Session
from upsguard.plugins.platforms.vsphere.states import vm_power

log = logging.getLogger(__name__)

RECONNECT_S = 5.0  # while vCenter does not answer, how often to try it again
PLACEMENT_TTL_S = 60.0  # placement read up to a minute ago will do: VMs seldom move in an outage


class Resolved:
    """Which resource each resolved target stands for (the executor hands over targets only)."""

    def __init__(self) -> None:
        self._resources: dict[tuple[ResourceKind, str], ResourceConfig] = {}

    def add(self, target: Target, resource: ResourceConfig) -> None:
        self._resources[(target.kind, target.name)] = resource

    def resource_of(self, target: Target) -> ResourceConfig | None:
        return self._resources.get((target.kind, target.name))

    def planned_vm_names(self) -> set[str]:
        """VMs some resource resolved to (the rest are unplanned)."""
        return {name for kind, name in self._resources if kind is ResourceKind.VM}


@dataclass(frozen=True)
class Located:
    """A target found: the session that reaches it and its managed object id there."""

    session: Session
    ref: str
    kind: ResourceKind

    def obj(self) -> Any:
        """The target as a pyVmomi managed object (no request is made)."""
        managed = vim.HostSystem if self.kind is ResourceKind.HOST else vim.VirtualMachine
        return self.session.ref(managed, self.ref)

    def watched(self) -> Props:
        """Its power and Tools state as the session's watch last saw them."""
        return self.session.watcher.state.get(self.ref, {})


class Locator:
    """The sessions of one platform (vCenter and ESXi hosts), and which one reaches a target."""

    def __init__(
        self,
        platform: PlatformName,
        manager: Session,
        direct_session: Callable[[str], Session],
        can_go_direct: bool,
        resolved: Resolved,
        clock: Clock,
    ) -> None:
        self.manager = manager
        self.can_go_direct = can_go_direct  # the site file gives direct_hosts credentials
        self._platform = platform
        self._make_direct = direct_session
        self._direct: dict[str, Session] = {}
        self._resolved = resolved
        self._clock = clock
        self._manager_down = False  # we stopped vCenter's own VM: it stays down for this run
        self._silent = False  # vCenter did not answer (at login, or mid-run): asked again aside
        self._last_try = float("-inf")
        self._probe: asyncio.Task[None] | None = None

    def now(self) -> float:
        """Seconds on the injected clock (the inventory cache and reconnects use it)."""
        return self._clock.monotonic()

    def sessions(self) -> list[Session]:
        return [self.manager, *self._direct.values()]

    # --- vCenter, or the ESXi hosts ----------------------------------------------------------

    async def open(self) -> None:
        """Log in to vCenter; when it does not answer and hosts can be reached, go to them."""
        try:
            await self.manager.open()
        except PlatformUnreachable as exc:
            if not self.can_go_direct:
                raise
            log.warning("%s; working with the ESXi hosts directly until it answers", exc)
            self._silent = True
            self._last_try = self.now()

    def manager_silent(self) -> None:
        """vCenter left a call unanswered for ``vcenter_silent_after`` (it hangs, or is gone):
        the steps left go to the ESXi hosts, and vCenter is asked again aside."""
        if not self.can_go_direct or self._silent:
            return
        self._silent = True
        self._last_try = self.now()
        log.warning(
            "%s does not answer; the steps left go to the ESXi hosts directly until it does",
            self.manager.label,
        )

    async def manager_usable(self) -> bool:
        """False while vCenter is down: stopped by us, or not answering. One that does not
        answer is asked again every few seconds, aside: a step never waits for that."""
        if self._manager_down:
            return False
        asking = self._probe is not None and not self._probe.done()
        if self._silent and not asking and self.now() - self._last_try >= RECONNECT_S:
            self._last_try = self.now()
            self._probe = asyncio.create_task(self._ask_again())
        return not self._silent

    async def _ask_again(self) -> None:
        """Log in to vCenter again (or, logged in, read the session): once it answers, the
        steps after go through it again."""
        try:
            if self.manager.is_open:
                await self.manager.run(
                    "read the session",
                    lambda: self.manager.conn.content.sessionManager.currentSession,
                )
            else:
                await self.manager.open()
        except PlatformUnreachable:
            return
        except UpsguardError as exc:  # it answers, but refuses: still not usable
            log.warning("%s: %s", self.manager.label, exc)
            return
        log.info("%s: vCenter answers again", self.manager.label)
        self._silent = False

    def stop_asking(self) -> None:
        """Closing: no more asking vCenter aside."""
        if self._probe is not None:
            self._probe.cancel()

    def manager_stopping(self) -> None:
        """vCenter's own VM is being stopped: later steps go to the ESXi hosts."""
        self._manager_down = self.can_go_direct

    def manager_starting(self) -> None:
        """vCenter's own VM is being started: use vCenter again once it answers."""
        self._manager_down = False

    def serves_this_platform(self, target: Target) -> bool:
        """The target is vCenter's own VM (``serves_platform`` names this platform)."""
        res = self._resolved.resource_of(target)
        return res is not None and res.serves_platform == self._platform

    def direct_session(self, host_name: str) -> Session:
        """The session to one ESXi host (made on first use). Raises ``PermanentError``
        when the site file gives no credentials for the hosts."""
        if host_name not in self._direct:
            self._direct[host_name] = self._make_direct(host_name)
        return self._direct[host_name]

    async def goes_direct(self, target: Target) -> bool:
        """Through the ESXi host: vCenter's own VM, steps planned direct, while vCenter is down."""
        if not self.can_go_direct:
            return False
        if target.direct or self.serves_this_platform(target):
            return True
        return not await self.manager_usable()

    # --- targets -------------------------------------------------------------------------------

    async def locate(self, target: Target) -> Located:
        """The session that reaches ``target`` now, and its id there."""
        if not await self.goes_direct(target):
            ref = target.ref or await self.find(self.manager, target)
            return Located(self.manager, ref, target.kind)
        host_name = target.name if target.kind is ResourceKind.HOST else target.host
        if host_name is None:
            raise PermanentError(f"{target.name}: its ESXi host is not known, cannot go direct")
        session = self.direct_session(host_name)
        if not session.is_open:
            await session.open()
        return Located(session, await self.find(session, target), target.kind)

    async def find(self, session: Session, target: Target) -> str:
        """``target``'s id by its name in the session's inventory (read again on a miss)."""
        for fresh in (False, True):
            snap = await session.inventory(self.now(), fresh=fresh)
            if target.kind is ResourceKind.HOST:
                host = host_in(snap, target.name)
                if host is not None:
                    return host.ref
            else:
                found = snap.vms_named(target.name)
                if found:
                    return found[0].ref
        raise PermanentError(f"{target.name}: not found at {session.conn.endpoint.address}")

    async def running_vms_on(
        self, session: Session, host_name: str
    ) -> tuple[HostInfo | None, list[VmInfo]]:
        """The host and the VMs running on it (none when the host is not in the inventory):
        placement from a recent inventory read, power from the watch."""
        snap = await session.inventory(self.now(), max_age=PLACEMENT_TTL_S)
        host = host_in(snap, host_name)
        if host is None:
            return None, []
        state = session.watcher.state
        running = [
            vm
            for vm in snap.vms.values()
            if vm.host_ref == host.ref and vm_power(state.get(vm.ref, {})) is PowerState.ON
        ]
        return host, running


def host_in(snap: Snapshot, name: str) -> HostInfo | None:
    """The host named ``name``; an ESXi host reached directly is its inventory's only host,
    whatever vCenter calls it."""
    host = snap.host_named(name)
    if host is None and len(snap.hosts) == 1:
        host = next(iter(snap.hosts.values()))
    return host
