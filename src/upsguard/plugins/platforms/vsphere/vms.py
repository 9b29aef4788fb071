"""VM steps: shut the guest down or power the VM off, power it on, judge it usable.

Calls return once vSphere accepted the request; reaching the state is the
watch's job. A VM already in the wanted state is no error (steps are
idempotent); a VM without running VMware Tools has no graceful path, which
vSphere itself says (never a cached state).
"""

from __future__ import annotations

import contextlib
from typing import Any

from pyVmomi import vim

from upsguard.models import PowerState, StopMethod, Target
from upsguard.plugins.platforms.vsphere.locate import Located, Locator
from upsguard.plugins.platforms.vsphere.states import TOOLS_RUNNING, vm_power
from upsguard.plugins.platforms.vsphere.tasks import TaskLog


class VmSteps:
    """Stopping, starting and checking VMs, wherever they are reached."""

    def __init__(self, locator: Locator, tasks: TaskLog) -> None:
        self._locator = locator
        self._tasks = tasks

    async def stop(self, target: Target, method: StopMethod) -> None:
        """Raises ``GracefulUnavailable`` for a graceful stop without running VMware Tools."""
        at = await self._locator.locate(target)
        if method is StopMethod.GRACEFUL:
            await shutdown_guest(at, target.name)
        else:
            await power_off(at, target.name)

    async def start(self, target: Target) -> None:
        at = await self._locator.locate(target)

        def call() -> Any:
            try:
                return at.obj().PowerOnVM_Task()
            except vim.fault.InvalidPowerState:  # already on
                return None

        task = await at.session.run(f"power on {target.name}", call)
        if task is not None:
            self._tasks.remember(target, at.session, task)

    async def healthy(self, target: Target) -> bool:
        """On, and VMware Tools running (or not installed at all)."""
        props = (await self._locator.locate(target)).watched()
        tools_absent = props.get("guest.toolsStatus") == "toolsNotInstalled"
        running = props.get("guest.toolsRunningStatus") == TOOLS_RUNNING
        return vm_power(props) is PowerState.ON and (running or tools_absent)


async def shutdown_guest(at: Located, name: str) -> None:
    """Ask the guest to shut down. Raises ``GracefulUnavailable`` without VMware Tools."""

    def call() -> None:
        with contextlib.suppress(vim.fault.InvalidPowerState):  # already off
            at.obj().ShutdownGuest()

    await at.session.run(f"shut down the guest of {name}", call)


async def power_off(at: Located, name: str) -> None:
    """Cut the VM's power (the task's end shows in the watch)."""

    def call() -> None:
        with contextlib.suppress(vim.fault.InvalidPowerState):  # already off
            at.obj().PowerOffVM_Task()

    await at.session.run(f"power off {name}", call)
