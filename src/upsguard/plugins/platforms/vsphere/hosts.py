"""Host steps: the cluster's HA and DRS set aside, system and unplanned VMs, then maintenance
mode, then ShutdownHost.

vSphere shuts a host down only from maintenance mode unless forced; maintenance
mode waits for every running VM. So before asking, the step powers off vCLS agents
(retreat) and deals with VMs no resource covers, per the site file. Starting a host
is its BMC's job (``power_on_via``); vSphere only wakes hosts from standby. Once a
started host is back, it is taken out of maintenance mode. A maintenance-mode task
already under way (asked before a restart) is waited for, not asked again.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

from pyVmomi import vim

from upsguard.config.resources import ResourceConfig
from upsguard.errors import GracefulUnavailable, PermanentError, StepFailed, UpsguardError
from upsguard.models import PowerState, ResourceKind, Target
from upsguard.plugins.platforms.base import AcceptedShutdowns
from upsguard.plugins.platforms.vsphere.cluster import ClusterGuard
from upsguard.plugins.platforms.vsphere.locate import Located, Locator, Resolved
from upsguard.plugins.platforms.vsphere.states import (
    TOOLS_RUNNING,
    host_lost,
    host_power,
    is_off,
)
from upsguard.plugins.platforms.vsphere.tasks import TaskLog, task_error, task_under_way
from upsguard.plugins.platforms.vsphere.vms import power_off, shutdown_guest

log = logging.getLogger(__name__)
OptionValue: Any = vim.option.OptionValue  # pyVmomi's stubs leave it untyped

MM_TIMEOUT_CAP_S = 110  # the executor gives one call 120 s
UNPLANNED_GRACE_S = 60.0  # guest shutdown time for unplanned VMs inside a host step
HARD_OFF_S = 30.0
TASK_CHECK_S = 2.0
#: vSphere's names (descriptionId) of the tasks that take a host down, and up.
HOST_STOPS = ("HostSystem.shutdown", "HostSystem.powerDownHostToStandBy")
HOST_STARTS = ("HostSystem.powerUpHostFromStandBy",)
ENTER_MAINTENANCE = ("HostSystem.enterMaintenanceMode",)


class HostSteps:
    """Stopping, starting and checking hosts, wherever they are reached."""

    def __init__(
        self,
        locator: Locator,
        tasks: TaskLog,
        resolved: Resolved,
        *,
        retreat_system_vms: bool,
        stop_unplanned_vms: bool,
        clusters: ClusterGuard | None = None,
    ) -> None:
        self._locator = locator
        self._tasks = tasks
        self._resolved = resolved  # which VMs are planned: the host step stops the others
        self._retreat = retreat_system_vms
        self._stop_unplanned_vms = stop_unplanned_vms
        self._leaving_mm: set[Target] = set()
        self._clusters = clusters  # HA and DRS set aside before the host steps (or None)
        self._shut_down = AcceptedShutdowns()

    def power(self, target: Target, props: dict[str, Any]) -> PowerState:
        """The host's state; vCenter losing it reads off only once it accepted its shutdown
        (here, or before a restart: ``accepted``)."""
        return self._shut_down.state(target.name, host_power(props), quiet=host_lost(props))

    def accepted(self, target: Target) -> None:
        """``target`` accepted a shutdown (asked before a restart, or by the other
        controller): from now on vCenter losing it is that shutdown landing."""
        self._shut_down.accepted(target.name)

    async def stop(self, target: Target, res: ResourceConfig | None) -> None:
        at = await self._locator.locate(target)
        if self.power(target, at.watched()) is PowerState.OFF:
            return
        if self._clusters is not None:
            await self._set_aside_cluster(at, target)
        if self._retreat:
            await self._retreat_system_vms(at, target)
        await self._stop_unplanned(at, target, res)
        in_mm = bool(at.watched().get("runtime.inMaintenanceMode"))
        if res is not None and res.maintenance_mode and not in_mm:
            await self._enter_maintenance(at, target, res)
            in_mm = True
        task = await at.session.run(
            f"shut down host {target.name}", lambda: at.obj().ShutdownHost_Task(force=not in_mm)
        )
        self._shut_down.asked(target.name)
        self._tasks.remember(target, at.session, task)

    async def start(self, target: Target) -> None:
        at = await self._locator.locate(target)
        self._shut_down.forget(target.name)
        power = self.power(target, at.watched())
        if power is PowerState.STANDBY:
            await at.session.run(
                f"wake {target.name} from standby",
                lambda: at.obj().PowerUpHostFromStandBy_Task(timeoutSec=300),
            )
        elif power is not PowerState.ON:
            raise PermanentError(
                f"{target.name}: the host is off and vSphere cannot power it on: "
                "give the resource power_on_via (its BMC)"
            )

    async def under_way(self, target: Target, state: PowerState) -> str | None:
        """A shutdown (or standby) task still running toward off, a wake-up toward on."""
        at = await self._locator.locate(target)
        actions = HOST_STOPS if state is PowerState.OFF else HOST_STARTS
        return await self._tasks.adopt(target, at.session, at.obj(), actions)

    async def healthy(self, target: Target) -> bool:
        """On and connected, and out of maintenance mode (asked for here, once)."""
        at = await self._locator.locate(target)
        props = at.watched()
        if self.power(target, props) is not PowerState.ON:
            return False
        if not props.get("runtime.inMaintenanceMode"):
            self._leaving_mm.discard(target)
            return True
        if target not in self._leaving_mm:
            self._leaving_mm.add(target)
            try:
                await at.session.run(
                    f"take {target.name} out of maintenance mode",
                    lambda: at.obj().ExitMaintenanceMode_Task(timeout=0),
                )
            except UpsguardError:
                self._leaving_mm.discard(target)  # asked again on the next health round
                raise
        return False

    # --- before the shutdown ---------------------------------------------------------------

    async def _stop_unplanned(
        self, at: Located, target: Target, res: ResourceConfig | None
    ) -> None:
        """VMs on this host that no resource covers get the site's default: shut down, or left.

        They were not in the plan, so nothing stopped them; without this a host in
        maintenance mode would wait for them, and a forced host shutdown would cut them off.
        """
        _, running = await self._locator.running_vms_on(at.session, target.name)
        planned = self._resolved.planned_vm_names()
        left = [vm for vm in running if not vm.system and vm.name not in planned]
        if not left:
            return
        names = ", ".join(sorted(v.name for v in left))
        if not self._stop_unplanned_vms:
            log.warning("%s: VMs no resource covers are left running: %s", target.name, names)
            return
        log.warning("%s: shutting down VMs no resource covers: %s", target.name, names)
        grace = min(res.guest_timeout.total_seconds() if res else 300.0, UNPLANNED_GRACE_S)
        vms = [(vm.name, Located(at.session, vm.ref, ResourceKind.VM)) for vm in left]
        await asyncio.gather(*(_shutdown_or_power_off(vm, name) for name, vm in vms))
        watcher = at.session.watcher
        off = await asyncio.gather(*(watcher.wait(vm.ref, is_off, grace) for _, vm in vms))
        still_on = [(name, vm) for (name, vm), done in zip(vms, off, strict=True) if not done]
        for name, vm in still_on:
            await power_off(vm, name)
        await asyncio.gather(*(watcher.wait(vm.ref, is_off, HARD_OFF_S) for _, vm in still_on))

    async def _enter_maintenance(self, at: Located, target: Target, res: ResourceConfig) -> None:
        limit = int(min(res.guest_timeout.total_seconds(), MM_TIMEOUT_CAP_S))
        found = await task_under_way(at.session, at.obj(), ENTER_MAINTENANCE, target.name)
        if found is not None:
            log.info("%s: %s is under way already: waiting for it", target.name, found[0])
            task = found[1]
        else:
            task = await at.session.run(
                f"put {target.name} in maintenance mode",
                lambda: at.obj().EnterMaintenanceMode_Task(timeout=limit),
            )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + limit + 5
        while loop.time() < deadline:
            if await at.session.watcher.wait(
                at.ref, lambda p: bool(p.get("runtime.inMaintenanceMode")), TASK_CHECK_S
            ):
                return
            error = await task_error(at.session, task)
            if error:
                raise StepFailed(f"{target.name}: maintenance mode failed: {error}")
        raise StepFailed(f"{target.name}: not in maintenance mode after {limit}s")

    async def _set_aside_cluster(self, at: Located, target: Target) -> None:
        """HA host monitoring off and DRS manual on the host's cluster (see ``cluster``);
        only vCenter can: a host reached directly leaves them as they are."""
        if self._clusters is None:
            return
        if at.session is not self._locator.manager:
            log.warning(
                "%s: reached directly: its cluster's HA and DRS left as they are", target.name
            )
            return
        host, _ = await self._locator.running_vms_on(at.session, target.name)
        if host is not None and host.cluster_ref:
            await self._clusters.set_aside(
                at.session, host.cluster_ref, host.cluster or host.cluster_ref
            )

    async def _retreat_system_vms(self, at: Located, target: Target) -> None:
        """vCLS agents on this host: retreat mode for its cluster, then power them off."""
        host, running = await self._locator.running_vms_on(at.session, target.name)
        agents = [vm for vm in running if vm.system]
        if not agents:
            return
        if host is not None and host.cluster_ref and at.session is self._locator.manager:
            key = f"config.vcls.clusters.{host.cluster_ref}.enabled"
            retreat = [OptionValue(key=key, value="false")]
            try:
                await at.session.run(
                    "set vCLS retreat mode",
                    lambda: at.session.conn.content.setting.UpdateOptions(changedValue=retreat),
                )
            except PermanentError as exc:
                log.warning("%s: retreat mode not set: %s", target.name, exc)
        for vm in agents:
            await power_off(Located(at.session, vm.ref, ResourceKind.VM), f"system VM {vm.name}")


async def _shutdown_or_power_off(vm: Located, name: str) -> None:
    """A guest shutdown when the watch saw Tools running, else (or when vSphere says there
    are none after all) a power-off."""
    if vm.watched().get("guest.toolsRunningStatus") == TOOLS_RUNNING:
        try:
            await shutdown_guest(vm, name)
            return
        except GracefulUnavailable:
            pass
    await power_off(vm, name)
