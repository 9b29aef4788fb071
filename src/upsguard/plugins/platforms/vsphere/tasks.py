"""What the platform does to VMs and hosts: guest shutdown, power-off, maintenance, host shutdown.

Calls return once vSphere accepted the request; reaching the state is
``wait_for``'s job, answered from the shared watch. A host task that vSphere
refused is remembered, and a wait that runs out reports what vSphere said.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from pyVmomi import vim as _vim

from upsguard.config.resources import ResourceConfig
from upsguard.errors import GracefulUnavailable, PermanentError, PlatformUnreachable, StepFailed
from upsguard.models import PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.vsphere.connection import fault_text
from upsguard.plugins.platforms.vsphere.tags import tagged_vm_ids

if TYPE_CHECKING:
    from upsguard.plugins.platforms.vsphere import Site, VspherePlatform

log = logging.getLogger(__name__)
vim: Any = _vim  # untyped in pyVmomi

TOOLS_RUNNING = "guestToolsRunning"
MM_TIMEOUT_CAP_S = 110  # the executor gives one call 120 s
UNPLANNED_GRACE_S = 60.0  # guest shutdown time for unplanned VMs inside a host step
HARD_OFF_S = 30.0
TASK_CHECK_S = 2.0


def vm_power(props: dict[str, Any]) -> PowerState:
    return {
        "poweredOn": PowerState.ON,
        "poweredOff": PowerState.OFF,
        "suspended": PowerState.OFF,
    }.get(str(props.get("runtime.powerState")), PowerState.UNKNOWN)


def host_power(props: dict[str, Any]) -> PowerState:
    power = str(props.get("runtime.powerState"))
    connection = str(props.get("runtime.connectionState"))
    if power == "standBy":
        return PowerState.STANDBY
    if power == "poweredOff" or connection == "notResponding":
        return PowerState.OFF
    if power == "poweredOn" and connection == "connected":
        return PowerState.ON
    return PowerState.UNKNOWN


def _power(target: Target, props: dict[str, Any]) -> PowerState:
    return host_power(props) if target.kind is ResourceKind.HOST else vm_power(props)


def _mo(kind: Any, ref: str, si: Any) -> Any:
    return kind(ref, si._stub)


class Operations:
    """The Platform methods' bodies, given where each target lives (vCenter or its host)."""

    def __init__(self, platform: VspherePlatform) -> None:
        self.p = platform
        self._host_tasks: dict[Target, tuple[Site, Any]] = {}
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
            snap = await site.inventory(self.p._clock.monotonic(), fresh=fresh)
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
        _, _, props = await self.props(target)
        return _power(target, props)

    async def stop(self, target: Target, method: StopMethod) -> None:
        if target.kind is ResourceKind.HOST:
            await self._stop_host(target)
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
        site, ref, props = await self.props(target)
        if vm_power(props) is PowerState.OFF:
            return
        if props.get("guest.toolsRunningStatus") != TOOLS_RUNNING:
            raise GracefulUnavailable("VMware Tools are not running")

        def call(si: Any) -> str:
            try:
                _mo(vim.VirtualMachine, ref, si).ShutdownGuest()
            except vim.fault.ToolsUnavailable:
                return "no tools"
            except vim.fault.InvalidPowerState:
                return "off"
            return "ok"

        if await site.run(f"shut down the guest of {target.name}", call) == "no tools":
            raise GracefulUnavailable("VMware Tools are not running")

    async def _power_off(self, target: Target) -> None:
        site, ref, props = await self.props(target)
        if vm_power(props) is PowerState.OFF:
            return

        def call(si: Any) -> None:
            with contextlib.suppress(vim.fault.InvalidPowerState):
                _mo(vim.VirtualMachine, ref, si).PowerOffVM_Task()

        await site.run(f"power off {target.name}", call)

    async def start(self, target: Target) -> None:
        site, ref, props = await self.props(target)
        if target.kind is ResourceKind.HOST:
            await self._start_host(site, ref, target, props)
            return

        def call(si: Any) -> Any:
            try:
                return _mo(vim.VirtualMachine, ref, si).PowerOnVM_Task()
            except vim.fault.InvalidPowerState:
                return None

        task = await site.run(f"power on {target.name}", call)
        if task is not None:
            self._host_tasks[target] = (site, task)
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
                await site.run(
                    f"take {target.name} out of maintenance mode",
                    lambda si: _mo(vim.HostSystem, ref, si).ExitMaintenanceMode_Task(timeout=0),
                )
            return False
        self._leaving_mm.discard(target)
        return True

    def tagged_vms(self, res: ResourceConfig) -> set[str]:
        assert res.select is not None and res.select.tag is not None
        return tagged_vm_ids(self.p.manager.conn, res.id, res.select.tag)

    # --- hosts -----------------------------------------------------------------------------

    async def _stop_host(self, target: Target) -> None:
        site, ref, props = await self.props(target)
        if host_power(props) is PowerState.OFF:
            return
        res = self.p.resource_of(target)
        if self.p.settings.system_vms == "retreat":
            await self._retreat_system_vms(site, target)
        await self._stop_unplanned(site, target, res)
        in_mm = bool(props.get("runtime.inMaintenanceMode"))
        if res is not None and res.maintenance_mode and not in_mm:
            await self._enter_maintenance(site, ref, target, res)
            in_mm = True

        def call(si: Any) -> Any:
            return _mo(vim.HostSystem, ref, si).ShutdownHost_Task(force=not in_mm)

        task = await site.run(f"shut down host {target.name}", call)
        self._host_tasks[target] = (site, task)

    async def _stop_unplanned(self, site: Site, target: Target, res: ResourceConfig | None) -> None:
        """VMs on this host that no resource covers get the site's default: shut down, or left.

        They were not in the plan, so nothing stopped them; without this a host in
        maintenance mode would wait for them, and a forced host shutdown would cut them off.
        """
        snap = await site.inventory(self.p._clock.monotonic())
        host = snap.host_named(target.name) or (
            next(iter(snap.hosts.values())) if len(snap.hosts) == 1 else None
        )
        assert site.watcher is not None
        state = site.watcher.state
        planned = self.p.planned_vm_names()
        left = [
            vm
            for vm in snap.vms.values()
            if host is not None
            and vm.host_ref == host.ref
            and not vm.system
            and vm.name not in planned
            and vm_power(state.get(vm.ref, {})) is PowerState.ON
        ]
        if not left:
            return
        names = ", ".join(sorted(v.name for v in left))
        if self.p.settings.unplanned_vms == "ignore":
            log.warning("%s: VMs no resource covers are left running: %s", target.name, names)
            return
        log.warning("%s: shutting down VMs no resource covers: %s", target.name, names)
        grace = min(res.guest_timeout.total_seconds() if res else 300.0, UNPLANNED_GRACE_S)
        await asyncio.gather(*(self._shutdown_or_power_off(site, vm.ref) for vm in left))
        still_on = [
            vm
            for vm, off in zip(
                left,
                await asyncio.gather(*(site.watcher.wait(vm.ref, _is_off, grace) for vm in left)),
                strict=True,
            )
            if not off
        ]
        for vm in still_on:
            await site.run(f"power off {vm.name}", _power_off_call(vm.ref))
        await asyncio.gather(*(site.watcher.wait(vm.ref, _is_off, HARD_OFF_S) for vm in still_on))

    async def _shutdown_or_power_off(self, site: Site, ref: str) -> None:
        assert site.watcher is not None
        props = site.watcher.state.get(ref, {})

        def call(si: Any) -> None:
            vm = _mo(vim.VirtualMachine, ref, si)
            try:
                if props.get("guest.toolsRunningStatus") == TOOLS_RUNNING:
                    vm.ShutdownGuest()
                else:
                    vm.PowerOffVM_Task()
            except vim.fault.ToolsUnavailable:
                vm.PowerOffVM_Task()
            except vim.fault.InvalidPowerState:
                pass

        await site.run(f"stop unplanned VM {ref}", call)

    async def _enter_maintenance(
        self, site: Site, ref: str, target: Target, res: ResourceConfig
    ) -> None:
        limit = int(min(res.guest_timeout.total_seconds(), MM_TIMEOUT_CAP_S))
        task = await site.run(
            f"put {target.name} in maintenance mode",
            lambda si: _mo(vim.HostSystem, ref, si).EnterMaintenanceMode_Task(timeout=limit),
        )
        assert site.watcher is not None
        deadline = asyncio.get_running_loop().time() + limit + 5
        while asyncio.get_running_loop().time() < deadline:
            if await site.watcher.wait(
                ref, lambda p: bool(p.get("runtime.inMaintenanceMode")), TASK_CHECK_S
            ):
                return
            error = await self._task_error(site, task)
            if error:
                raise StepFailed(f"{target.name}: maintenance mode failed: {error}")
        raise StepFailed(f"{target.name}: not in maintenance mode after {limit}s")

    async def _retreat_system_vms(self, site: Site, target: Target) -> None:
        """vCLS agents on this host: retreat mode for its cluster, then power them off."""
        snap = await site.inventory(self.p._clock.monotonic())
        host = snap.host_named(target.name)
        assert site.watcher is not None
        state = site.watcher.state
        agents = [
            v
            for v in snap.vms.values()
            if v.system
            and host
            and v.host_ref == host.ref
            and vm_power(state.get(v.ref, {})) is PowerState.ON
        ]
        if not agents:
            return
        if host is not None and host.cluster_ref and site is self.p.manager:
            key = f"config.vcls.clusters.{host.cluster_ref}.enabled"
            try:
                await site.run(
                    "set vCLS retreat mode",
                    lambda si: si.content.setting.UpdateOptions(
                        changedValue=[vim.option.OptionValue(key=key, value="false")]
                    ),
                )
            except PermanentError as exc:
                log.warning("%s: retreat mode not set: %s", target.name, exc)
        for vm in agents:
            await site.run(f"power off system VM {vm.name}", _power_off_call(vm.ref))

    async def _start_host(
        self, site: Site, ref: str, target: Target, props: dict[str, Any]
    ) -> None:
        power = host_power(props)
        if power is PowerState.STANDBY:
            await site.run(
                f"wake {target.name} from standby",
                lambda si: _mo(vim.HostSystem, ref, si).PowerUpHostFromStandBy_Task(timeoutSec=300),
            )
        elif power is not PowerState.ON:
            raise PermanentError(
                f"{target.name}: the host is off and vSphere cannot power it on: "
                "give the resource power_on_via (its BMC)"
            )

    async def _raise_task_error(self, target: Target) -> None:
        pending = self._host_tasks.get(target)
        if pending is None:
            return
        site, task = pending
        error = await self._task_error(site, task)
        if error:
            raise StepFailed(f"{target.name}: {error}")

    async def _task_error(self, site: Site, task: Any) -> str | None:
        def read(si: Any) -> tuple[str, Any]:
            info = task.info
            return str(info.state), info.error

        state, error = await site.run("read a task", read)
        if state == "error" and error is not None:
            return fault_text(error)
        return None


def _is_off(props: dict[str, Any]) -> bool:
    return vm_power(props) is PowerState.OFF


def _power_off_call(ref: str) -> Callable[[Any], Any]:
    return lambda si: _mo(vim.VirtualMachine, ref, si).PowerOffVM_Task()
