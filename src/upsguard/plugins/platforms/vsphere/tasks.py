"""What the platform does to its targets: find them, stop and start VMs, wait, judge health.

Calls return once vSphere accepted the request; reaching the state is
``wait_for``'s job, answered from the shared watch. A task that vSphere
refused is remembered, and a wait that runs out reports what vSphere said.
Host steps are in ``hosts``.
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any

from upsguard.config.resources import ResourceConfig
from upsguard.errors import (
    GracefulUnavailable,
    PermanentError,
    PlatformUnreachable,
    StepFailed,
    UpsguardError,
)
from upsguard.models import PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.vsphere.connection import fault_text
from upsguard.plugins.platforms.vsphere.hosts import HostSteps
from upsguard.plugins.platforms.vsphere.reads import invoke
from upsguard.plugins.platforms.vsphere.states import (
    TOOLS_RUNNING,
    host_power,
    mo,
    power_of,
    vim,
    vm_power,
)
from upsguard.plugins.platforms.vsphere.tags import tagged_vm_ids

if TYPE_CHECKING:
    from upsguard.plugins.platforms.vsphere import Site, VspherePlatform

log = logging.getLogger(__name__)


class Operations:
    """The Platform methods' bodies, given where each target lives (vCenter or its host)."""

    def __init__(self, platform: VspherePlatform) -> None:
        self.p = platform
        self.host_tasks: dict[Target, tuple[Site, Any]] = {}  # the last task per target
        self.hosts = HostSteps(self)
        self._leaving_mm: set[Target] = set()

    # --- where a target is -----------------------------------------------------------------

    async def locate(self, target: Target) -> tuple[Site, str]:
        if not await self.p.goes_direct(target):
            site = self.p.manager
            if target.ref is not None:
                return site, target.ref
            return site, await self._ref_by_name(site, target)
        host_name = target.name if target.kind is ResourceKind.HOST else target.host
        if host_name is None:
            raise PermanentError(f"{target.name}: its ESXi host is not known, cannot go direct")
        site = self.p.direct_site(host_name)
        if site.watcher is None:
            await site.open()
        return site, await self._ref_by_name(site, target)

    async def _ref_by_name(self, site: Site, target: Target) -> str:
        for fresh in (False, True):
            snap = await site.inventory(self.p.now(), fresh=fresh)
            if target.kind is ResourceKind.HOST:
                host = snap.host_named(target.name) or (
                    next(iter(snap.hosts.values())) if len(snap.hosts) == 1 else None
                )
                if host is not None:
                    return host.ref
            else:
                found = snap.vms_named(target.name)
                if found:
                    return found[0].ref
        raise PermanentError(f"{target.name}: not found at {site.conn.endpoint.address}")

    async def props(self, target: Target) -> tuple[Site, str, dict[str, Any]]:
        site, ref = await self.locate(target)
        assert site.watcher is not None
        return site, ref, site.watcher.state.get(ref, {})

    # --- Platform methods ------------------------------------------------------------------

    async def power_state(self, target: Target) -> PowerState:
        """Read now, never from the watch alone: a stale "off" would skip a VM that is on.

        Checks of many targets at once share one read (see ``Fresh``).
        """
        site, ref = await self.locate(target)
        assert site.fresh is not None
        kind = "HostSystem" if target.kind is ResourceKind.HOST else "VirtualMachine"
        return power_of(target, await site.fresh.props(ref, kind))

    async def stop(self, target: Target, method: StopMethod) -> None:
        if target.kind is ResourceKind.HOST:
            await self.hosts.stop(target)
        elif method is StopMethod.GRACEFUL:
            await self._shutdown_guest(target)
        else:
            await self._power_off(target)
        res = self.p.resource_of(target)
        if res is not None and res.serves_platform == self.p.name:
            self.p.manager_down = self.p.settings.direct_hosts is not None
            log.info("%s: vCenter's own VM is stopping; later steps go to ESXi hosts", target.name)

    def _manager_started(self, target: Target) -> None:
        res = self.p.resource_of(target)
        if res is not None and res.serves_platform == self.p.name:
            self.p.manager_down = False  # usable again once it answers

    async def _shutdown_guest(self, target: Target) -> None:
        """vSphere itself says whether the VM is off or has no Tools (never a cached state)."""
        site, ref = await self.locate(target)

        def call(si: Any) -> str:
            try:
                invoke(mo(vim.VirtualMachine, ref, si), "ShutdownGuest")
            except vim.fault.ToolsUnavailable:
                return "no tools"
            except vim.fault.InvalidPowerState:
                return "off"
            return "ok"

        if await site.run(f"shut down the guest of {target.name}", call) == "no tools":
            raise GracefulUnavailable("VMware Tools are not running")

    async def _power_off(self, target: Target) -> None:
        site, ref = await self.locate(target)

        def call(si: Any) -> None:
            with contextlib.suppress(vim.fault.InvalidPowerState):
                mo(vim.VirtualMachine, ref, si).PowerOffVM_Task()

        await site.run(f"power off {target.name}", call)

    async def start(self, target: Target) -> None:
        site, ref, props = await self.props(target)
        if target.kind is ResourceKind.HOST:
            await self.hosts.start(site, ref, target, props)
            return

        def call(si: Any) -> Any:
            try:
                return mo(vim.VirtualMachine, ref, si).PowerOnVM_Task()
            except vim.fault.InvalidPowerState:
                return None

        task = await site.run(f"power on {target.name}", call)
        if task is not None:
            self.host_tasks[target] = (site, task)
        self._manager_started(target)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        site, ref = await self.locate(target)
        assert site.watcher is not None
        if target.kind is ResourceKind.HOST:
            reached = await site.watcher.wait(ref, lambda p: host_power(p) is state, timeout)
        else:
            reached = await site.watcher.wait(ref, lambda p: vm_power(p) is state, timeout)
        if not reached:
            try:
                await self._raise_task_error(target)
            except PlatformUnreachable:
                if target.kind is ResourceKind.HOST and state is PowerState.OFF:
                    log.info("%s: no longer answers after its shutdown: off", target.name)
                    return True
                raise
        return reached

    async def healthy(self, target: Target) -> bool:
        site, ref, props = await self.props(target)
        if target.kind is ResourceKind.VM:
            tools_absent = props.get("guest.toolsStatus") == "toolsNotInstalled"
            running = props.get("guest.toolsRunningStatus") == TOOLS_RUNNING
            return vm_power(props) is PowerState.ON and (running or tools_absent)
        if host_power(props) is not PowerState.ON:
            return False
        if props.get("runtime.inMaintenanceMode"):
            if target not in self._leaving_mm:
                self._leaving_mm.add(target)
                try:
                    await site.run(
                        f"take {target.name} out of maintenance mode",
                        lambda si: mo(vim.HostSystem, ref, si).ExitMaintenanceMode_Task(timeout=0),
                    )
                except UpsguardError:
                    self._leaving_mm.discard(target)  # asked again on the next health round
                    raise
            return False
        self._leaving_mm.discard(target)
        return True

    def tagged_vms(self, res: ResourceConfig) -> set[str]:
        assert res.select is not None and res.select.tag is not None
        return tagged_vm_ids(self.p.manager.conn, res.id, res.select.tag)

    # --- hosts -----------------------------------------------------------------------------

    async def _raise_task_error(self, target: Target) -> None:
        pending = self.host_tasks.get(target)
        if pending is None:
            return
        site, task = pending
        error = await self.task_error(site, task)
        if error:
            raise StepFailed(f"{target.name}: {error}")

    async def task_error(self, site: Site, task: Any) -> str | None:
        def read(si: Any) -> tuple[str, Any]:
            info = task.info
            return str(info.state), info.error

        state, error = await site.run("read a task", read)
        if state == "error" and error is not None:
            return fault_text(error)
        return None
