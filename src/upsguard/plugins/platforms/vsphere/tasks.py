"""The last vSphere task asked of each target, and what vSphere said when one failed.

Calls return once vSphere accepted the request; when a wait then runs out, the
task tells why (a host that could not enter maintenance mode, a VM that would
not power on), and that is the step's error.
"""

from __future__ import annotations

from typing import Any

from upsguard.models import Target
from upsguard.plugins.platforms.vsphere.faults import fault_text
from upsguard.plugins.platforms.vsphere.session import Session


class TaskLog:
    """Tasks started per target (power-on, host shutdown), the last one each."""

    def __init__(self) -> None:
        self._last: dict[Target, tuple[Session, Any]] = {}

    def remember(self, target: Target, session: Session, task: Any) -> None:
        self._last[target] = (session, task)

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
