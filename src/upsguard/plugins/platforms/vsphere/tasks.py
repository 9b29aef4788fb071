"""The last vSphere task asked of each target, what vSphere said when one failed, and the
tasks still under way on an entity.

Calls return once vSphere accepted the request; when a wait then runs out, the
task tells why (a host that could not enter maintenance mode, a VM that would
not power on), and that is the step's error. A restarted controller finds the
requests its predecessor made in the entity's ``recentTask`` (vSphere keeps the
last minutes' tasks there), named by their ``descriptionId``.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

from pyVmomi import vim

from upsguard.models import Target
from upsguard.plugins.platforms.vsphere.faults import fault_text
from upsguard.plugins.platforms.vsphere.reads import moid, read_objects
from upsguard.plugins.platforms.vsphere.session import Session

#: TaskInfo.state of a task vSphere has not finished.
UNDER_WAY = ("queued", "running")
TASK_PATHS = {vim.Task: ["info.state", "info.descriptionId"]}


class TaskLog:
    """Tasks started per target (power-on, host shutdown), the last one each."""

    def __init__(self) -> None:
        self._last: dict[Target, tuple[Session, Any]] = {}

    def remember(self, target: Target, session: Session, task: Any) -> None:
        self._last[target] = (session, task)

    async def adopt(
        self, target: Target, session: Session, obj: Any, actions: Collection[str]
    ) -> str | None:
        """The task for one of ``actions`` that vSphere still runs on ``obj`` (``target``),
        remembered as the target's last task (its failure is then the step's error); a line
        naming it, or None."""
        found = await task_under_way(session, obj, actions, target.name)
        if found is None:
            return None
        line, task = found
        self.remember(target, session, task)
        return line

    async def error_of(self, target: Target) -> str | None:
        """What vSphere said when the target's last task failed; None if it did not (yet)."""
        pending = self._last.get(target)
        if pending is None:
            return None
        return await task_error(*pending)


async def task_error(session: Session, task: Any) -> str | None:
    """The error of ``task`` as one line, once vSphere says it failed; else None."""

    def read() -> tuple[str, Any]:
        info = task.info
        return str(info.state), info.error

    state, error = await session.run("read a task", read)
    if state == "error" and error is not None:
        return fault_text(error)
    return None


async def task_under_way(
    session: Session, obj: Any, actions: Collection[str], name: str
) -> tuple[str, Any] | None:
    """The task of ``obj`` still queued or running for one of ``actions`` (descriptionIds such
    as ``HostSystem.shutdown``), from its ``recentTask``: a line naming it, and the task."""

    def read() -> tuple[str, Any] | None:
        tasks = list(obj.recentTask or [])
        if not tasks:
            return None
        infos, _ = read_objects(session.conn.content.propertyCollector, tasks, TASK_PATHS)
        for task in tasks:
            info = infos.get(moid(task), {})
            action = info.get("info.descriptionId")
            if action in actions and str(info.get("info.state")) in UNDER_WAY:
                return f"vSphere task {moid(task)} ({action})", task
        return None

    return await session.run(f"read the tasks under way on {name}", read)
