"""The ``command`` platform: anything else, stopped and started by commands run here.

A resource gives ``shutdown`` and/or ``startup`` (shell command lines run by
the platform's ``shell`` on the machine running upsguard: a vendor CLI, an
API call with curl) and, optionally, ``status``: a command that exits 0 while
the thing is up. With ``status`` the platform reads the real state and waits
on it; without it, the state is what the last command that exited 0 made it
(unknown before any), which is all a fire-and-forget command can tell.
The commands get none of the service's environment but the basics and ``pass_env``.

A command that exits non-zero is a ``PermanentError`` naming the resource
and showing the command's first line of output. There is no hard power-off:
a command can only do what it does.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Sequence

from upsguard.clock import Clock
from upsguard.config.platforms import CommandSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, UpsguardError
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import PlatformName, PowerState, StopMethod, Target
from upsguard.plugins import remote
from upsguard.plugins.platforms.base import ResourceTargets, poll_for_state

__all__ = ["CommandPlatform"]

log = logging.getLogger(__name__)


class CommandPlatform:
    """Runs each resource's own shutdown, startup and status commands locally."""

    def __init__(self, name: PlatformName, settings: CommandSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._targets = ResourceTargets(name)
        self._known: dict[str, PowerState] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return [self._targets.target(resource)]

    async def power_state(self, target: Target) -> PowerState:
        """From ``status`` (exit 0 = on) when given, else what the last command achieved."""
        res = self._targets.resource(target)
        if res.status is None:
            return self._known.get(str(res.id), PowerState.UNKNOWN)
        result = await self._run(res.status, res)
        return PowerState.ON if result.ok else PowerState.OFF

    async def stop(self, target: Target, method: StopMethod) -> None:
        """Run ``shutdown`` to its end; there is no hard variant to fall back to."""
        res = self._targets.resource(target)
        if method is StopMethod.HARD:
            raise PermanentError(
                f"resource '{res.id}': a command resource has no hard power-off; "
                "its shutdown command did not bring it down in time"
            )
        await self._act(res, target, res.shutdown, "shutdown", PowerState.OFF)

    async def start(self, target: Target) -> None:
        res = self._targets.resource(target)
        await self._act(res, target, res.startup, "startup", PowerState.ON)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        """Poll ``status`` until it says ``state``; without one, the last command's result."""
        res = self._targets.resource(target)
        if res.status is None:
            return self._known.get(str(res.id)) is state
        interval = self._settings.poll_interval.total_seconds()
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def healthy(self, target: Target) -> bool:
        res = self._targets.resource(target)
        if res.status is None:  # healthy when its startup command succeeded, not by default
            return self._known.get(str(res.id)) is PowerState.ON
        return await self.power_state(target) is PowerState.ON

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: the shell and the program each command line starts are
        there and executable (nothing runs: a command may act)."""
        found: list[Finding] = []
        for res in resources:
            if res.platform != self.name:
                continue
            lines = [c for c in (res.shutdown, res.startup, res.status) if c]
            lacking = sorted(
                {
                    p
                    for p in [self._settings.shell, *map(remote.program_of, lines)]
                    if p and not _runnable(p)
                }
            )
            if lacking:
                found.append(
                    fail(
                        Area.RESOURCE,
                        res.id,
                        "programs",
                        f"not found or not executable: {', '.join(lacking)}",
                        "install them, or give their full path in the command line",
                        missing=tuple(lacking),
                    )
                )
            else:
                found.append(
                    ok(Area.RESOURCE, res.id, "programs", "its commands' programs are there")
                )
        return found

    async def _act(
        self,
        res: ResourceConfig,
        target: Target,
        command: str | None,
        what: str,
        reaches: PowerState,
    ) -> None:
        if command is None:
            raise PermanentError(f"resource '{res.id}' has no '{what}' command")
        result = await self._run(command, res)
        if not result.ok:
            raise PermanentError(
                f"resource '{res.id}': {what} command exited {result.exit_status}: "
                f"{result.first_error_line()}"
            )
        log.info("%s: %s command done", res.id, what)
        self._known[str(res.id)] = reaches

    async def _run(self, command: str, res: ResourceConfig) -> remote.CommandResult:
        timeout = self._settings.timeout.total_seconds()
        try:
            return await remote.run(
                [self._settings.shell, "-c", command],
                ssh=None,
                timeout=timeout,
                pass_env=self._settings.pass_env,
            )
        except UpsguardError as exc:
            raise type(exc)(f"resource '{res.id}': {exc}") from exc


def _runnable(program: str) -> bool:
    if "/" in program:
        return os.access(program, os.X_OK)
    return shutil.which(program) is not None
