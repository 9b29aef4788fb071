"""Host steps: system and unplanned VMs first, then maintenance mode, then ShutdownHost.

vSphere shuts a host down only from maintenance mode unless forced; maintenance
mode waits for every running VM. So before asking, the step powers off vCLS agents
(retreat) and deals with VMs no resource covers, per the site file. Starting a host
is its BMC's job (``power_on_via``); vSphere only wakes hosts from standby.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING, Any

from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, StepFailed
from upsguard.models import PowerState, Target
from upsguard.plugins.platforms.vsphere.states import (
    TOOLS_RUNNING,
    host_power,
    is_off,
    mo,
    power_off_call,
    vim,
    vm_power,
)

if TYPE_CHECKING:
    from upsguard.plugins.platforms.vsphere import Site
    from upsguard.plugins.platforms.vsphere.tasks import Operations

log = logging.getLogger(__name__)

MM_TIMEOUT_CAP_S = 110  # the executor gives one call 120 s
UNPLANNED_GRACE_S = 60.0  # guest shutdown time for unplanned VMs inside a host step
HARD_OFF_S = 30.0
TASK_CHECK_S = 2.0
PLACEMENT_TTL_S = 60.0  # placement read up to a minute ago will do: VMs seldom move in an outage


class HostSteps:
    """Stopping and starting hosts, for ``Operations``."""

    def __init__(self, ops: Operations) -> None:
        self.ops = ops
        self.p = ops.p

    async def stop(self, target: Target) -> None:
        site, ref, props = await self.ops.props(target)
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
            return mo(vim.HostSystem, ref, si).ShutdownHost_Task(force=not in_mm)

        task = await site.run(f"shut down host {target.name}", call)
        self.ops.host_tasks[target] = (site, task)

    async def _stop_unplanned(self, site: Site, target: Target, res: ResourceConfig | None) -> None:
        """VMs on this host that no resource covers get the site's default: shut down, or left.

        They were not in the plan, so nothing stopped them; without this a host in
        maintenance mode would wait for them, and a forced host shutdown would cut them off.
        """
        snap = await site.inventory(self.p.now(), max_age=PLACEMENT_TTL_S)
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
                await asyncio.gather(*(site.watcher.wait(vm.ref, is_off, grace) for vm in left)),
                strict=True,
            )
            if not off
        ]
        for vm in still_on:
            await site.run(f"power off {vm.name}", power_off_call(vm.ref))
        await asyncio.gather(*(site.watcher.wait(vm.ref, is_off, HARD_OFF_S) for vm in still_on))

    async def _shutdown_or_power_off(self, site: Site, ref: str) -> None:
        assert site.watcher is not None
        props = site.watcher.state.get(ref, {})

        def call(si: Any) -> None:
            vm = mo(vim.VirtualMachine, ref, si)
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
            lambda si: mo(vim.HostSystem, ref, si).EnterMaintenanceMode_Task(timeout=limit),
        )
        assert site.watcher is not None
        deadline = asyncio.get_running_loop().time() + limit + 5
        while asyncio.get_running_loop().time() < deadline:
            if await site.watcher.wait(
                ref, lambda p: bool(p.get("runtime.inMaintenanceMode")), TASK_CHECK_S
            ):
                return
            error = await self.ops.task_error(site, task)
            if error:
                raise StepFailed(f"{target.name}: maintenance mode failed: {error}")
        raise StepFailed(f"{target.name}: not in maintenance mode after {limit}s")

    async def _retreat_system_vms(self, site: Site, target: Target) -> None:
        """vCLS agents on this host: retreat mode for its cluster, then power them off."""
        snap = await site.inventory(self.p.now(), max_age=PLACEMENT_TTL_S)
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
            await site.run(f"power off system VM {vm.name}", power_off_call(vm.ref))

    async def start(self, site: Site, ref: str, target: Target, props: dict[str, Any]) -> None:
        power = host_power(props)
        if power is PowerState.STANDBY:
            await site.run(
                f"wake {target.name} from standby",
                lambda si: mo(vim.HostSystem, ref, si).PowerUpHostFromStandBy_Task(timeoutSec=300),
            )
        elif power is not PowerState.ON:
            raise PermanentError(
                f"{target.name}: the host is off and vSphere cannot power it on: "
                "give the resource power_on_via (its BMC)"
            )
