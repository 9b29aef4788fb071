"""VM steps: shut the guest down or power the VM off, power it on, judge it usable.

Calls return once vSphere accepted the request; reaching the state is the
watch's job. A VM already in the wanted state is no error (steps are
idempotent); a VM without running VMware Tools has no graceful path, which
vSphere itself says (never a cached state). A guest shutdown is no lasting task:
what shows it under way is the guest's state as VMware Tools report it.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pyVmomi import vim

from upsguard.models import PowerState, StopMethod, Target
from upsguard.plugins.platforms.vsphere.locate import Located, Locator
from upsguard.plugins.platforms.vsphere.reads import read_objects
from upsguard.plugins.platforms.vsphere.states import TOOLS_RUNNING, vm_power
from upsguard.plugins.platforms.vsphere.tasks import TaskLog

#: vSphere's names (descriptionId) of the tasks that take a VM off, and on.
VM_STOPS = ("VirtualMachine.powerOff", "VirtualMachine.shutdownGuest")
VM_STARTS = ("VirtualMachine.powerOn",)
GUEST_SHUTTING_DOWN = "shuttingDown"  # guest.guestState


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

    async def under_way(self, target: Target, state: PowerState) -> str | None:
        """A power task still running toward ``state``, or toward off a guest shutting down."""
        at = await self._locator.locate(target)
        if state is not PowerState.OFF:
            return await self._tasks.adopt(target, at.session, at.obj(), VM_STARTS)
        found = await self._tasks.adopt(target, at.session, at.obj(), VM_STOPS)
        if found is None and await guest_state(at, target.name) == GUEST_SHUTTING_DOWN:
            return "the guest's shutdown (VMware Tools report it shutting down)"
        return found

    async def healthy(self, target: Target) -> bool:
        """On, and VMware Tools running (or not installed at all)."""
        props = (await self._locator.locate(target)).watched()
        tools_absent = props.get("guest.toolsStatus") == "toolsNotInstalled"
        running = props.get("guest.toolsRunningStatus") == TOOLS_RUNNING
        return vm_power(props) is PowerState.ON and (running or tools_absent)


async def shutdown_guest(at: Located, name: str) -> None:
    """Ask the guest to shut down. Raises ``GracefulUnavailable`` without VMware Tools.
    Asked by the thousand at once: the lean path first, pyVmomi for any fault."""

    def call() -> None:
        lean = at.session.conn.lean
        if lean is not None and lean.call(at.obj(), "ShutdownGuest"):
            return
        with contextlib.suppress(vim.fault.InvalidPowerState):  # already off
            at.obj().ShutdownGuest()

    await at.session.run(f"shut down the guest of {name}", call)


async def power_off(at: Located, name: str) -> None:
    """Cut the VM's power (the task's end shows in the watch)."""

    def call() -> None:
        with contextlib.suppress(vim.fault.InvalidPowerState):  # already off
            at.obj().PowerOffVM_Task()

    await at.session.run(f"power off {name}", call)


async def guest_state(at: Located, name: str) -> str | None:
    """``guest.guestState`` now (``running``, ``shuttingDown``, ``notRunning``...)."""

    def read() -> str | None:
        collector = at.session.conn.content.propertyCollector
        found, _ = read_objects(collector, [at.obj()], {vim.VirtualMachine: ["guest.guestState"]})
        state = found.get(at.ref, {}).get("guest.guestState")
        return None if state is None else str(state)

    return await at.session.run(f"read the guest state of {name}", read)
