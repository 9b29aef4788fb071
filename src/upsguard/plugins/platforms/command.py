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

A shutdown or startup command runs in a session of its own, so it outlives the service
(``RunsProcesses``): the step journals its process as it starts, the command's own session
writes its exit status and output to files in ``state_dir``, and a restarted service waits
for the process it finds still running (same PID, same start time) and judges the step by
that exit status; it never starts the command again while the first runs. Without the exit
status (its session was killed too), the ``status`` command judges; without either, the step
fails, saying why: unknown is not done.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import re
import shutil
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from upsguard.clock import Clock
from upsguard.config.platforms import CommandSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError, TemporaryError, UpsguardError
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import CommandProcess, PlatformName, PowerState, StopMethod, Target
from upsguard.plugins import processes, remote
from upsguard.plugins.platforms.base import ProcessListener, ResourceTargets, poll_for_state
from upsguard.secrecy import child_env

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
        self._processes: dict[str, _Tracked] = {}
        """The last shutdown or startup process of each resource not judged yet: started
        here and left running by a cancelled call, or adopted after a restart."""

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
        await self.request(target, PowerState.OFF, f"stop-{res.id}", _nobody)

    async def start(self, target: Target) -> None:
        res = self._targets.resource(target)
        await self.request(target, PowerState.ON, f"start-{res.id}", _nobody)

    async def request(
        self, target: Target, wanted: PowerState, label: str, started: ProcessListener
    ) -> None:
        """``RunsProcesses``: the resource's shutdown (``OFF``) or startup (``ON``) command,
        run to its end, unless one for it still runs (then that one is waited for) or one of
        this very step ended while no controller watched (then its exit status judges)."""
        res = self._targets.resource(target)
        what = _what(wanted)
        command = res.shutdown if wanted is PowerState.OFF else res.startup
        if command is None:
            raise PermanentError(f"resource '{res.id}' has no '{what}' command")
        earlier = self._processes.get(str(res.id))
        exit_file = self._exit_file(label)
        if earlier is not None and earlier.wanted is wanted:
            if processes.running(earlier.process):
                await self._outlast(res, earlier, self._settings.timeout.total_seconds())
            if processes.running(earlier.process):
                raise PermanentError(
                    f"resource '{res.id}': its {what} command {_named(earlier)} still runs "
                    f"after {self._settings.timeout}; not started again while it runs"
                )
            if earlier.process.exit_file == str(exit_file):  # this step's own, ended
                status = processes.exit_status(earlier.process)
                if status is not None and status != processes.NOT_STARTED:
                    self._judge(res, earlier, status, missing_ok=False)
                    return
                if status is None and res.status is None:
                    self._judge(res, earlier, None, missing_ok=False)  # raises: unknown
            del self._processes[str(res.id)]
        await self._run_tracked(res, command, wanted, exit_file, started)

    def adopt(self, target: Target, wanted: PowerState, process: CommandProcess) -> None:
        """``RunsProcesses``: a process journaled before the restart is this resource's."""
        res = self._targets.resource(target)
        if str(res.id) not in self._processes:
            self._processes[str(res.id)] = _Tracked(process, wanted, adopted=True)

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        """``InFlightTasks``: the resource's command toward ``state`` still running."""
        res = self._targets.resource(target)
        earlier = self._processes.get(str(res.id))
        if earlier is None or earlier.wanted is not state:
            return None
        if not processes.running(earlier.process):
            return None
        return f"its {_what(state)} command {_named(earlier)}"

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        """Poll ``status`` until it says ``state``; without one, the last command's result.
        A command of this resource toward ``state`` still running is waited for first (up to
        ``timeout`` after it started, across restarts) and judged by its exit status."""
        res = self._targets.resource(target)
        earlier = self._processes.get(str(res.id))
        if earlier is not None and earlier.wanted is state:
            left = timeout - (self._clock.now() - earlier.process.started).total_seconds()
            await self._outlast(res, earlier, left)
            if processes.running(earlier.process):
                return False
            del self._processes[str(res.id)]
            self._judge(res, earlier, processes.exit_status(earlier.process), missing_ok=True)
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

    def _exit_file(self, label: str) -> Path:
        folder = self._settings.state_dir or Path("/var/lib/upsguard/commands")
        return folder / f"{re.sub(r'[^A-Za-z0-9._-]', '_', label)}.exit"

    async def _run_tracked(
        self,
        res: ResourceConfig,
        command: str,
        wanted: PowerState,
        exit_file: Path,
        started: ProcessListener,
    ) -> None:
        """Start ``command`` in a session of its own, let ``started`` journal its process, let
        it run, and judge it by the exit status its session writes. Cancelled (a stop signal,
        an allowance run out), the command is left running: it is journaled, and whoever asks
        next waits for it. Past the platform's ``timeout`` it is killed, as any command."""
        try:
            exit_file.parent.mkdir(parents=True, exist_ok=True)
            exit_file.unlink(missing_ok=True)
            output = exit_file.with_suffix(".out").open("wb")
        except OSError as exc:
            log.warning(
                "%s: cannot keep its command's exit status in %s (%s): it runs untracked, and "
                "a restart while it runs would run it again",
                res.id,
                exit_file.parent,
                exc.strerror or exc,
            )
            await self._run_untracked(res, command, wanted)
            return
        argv = [self._settings.shell, "-c", command]
        with output:
            try:
                proc = await asyncio.create_subprocess_exec(
                    "/bin/sh",
                    "-c",
                    processes.WRAPPER,
                    str(exit_file),
                    *argv,
                    stdin=asyncio.subprocess.PIPE,
                    stdout=output,
                    stderr=output,
                    env=child_env(self._settings.pass_env),
                    start_new_session=True,  # a signal meant for the service must not kill it
                )
            except OSError as exc:
                raise PermanentError(f"resource '{res.id}': cannot run /bin/sh: {exc}") from exc
        tracked = _Tracked(_identity(proc.pid, exit_file, self._clock.now()), wanted)
        self._processes[str(res.id)] = tracked
        assert proc.stdin is not None
        try:
            started(tracked.process)  # journaled before it runs
            proc.stdin.write(b"go\n")
        finally:
            proc.stdin.close()
        try:
            async with asyncio.timeout(self._settings.timeout.total_seconds()):
                await proc.wait()
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            del self._processes[str(res.id)]
            raise TemporaryError(
                f"resource '{res.id}': {_what(wanted)} command: no answer within "
                f"{self._settings.timeout}"
            ) from exc
        del self._processes[str(res.id)]
        self._judge(res, tracked, processes.exit_status(tracked.process), missing_ok=False)

    async def _run_untracked(self, res: ResourceConfig, command: str, wanted: PowerState) -> None:
        """The exit status cannot be kept on disk (the journal's directory read-only or
        full): the journal is a record, not a precondition, so the command still runs, as
        a child of this service judged by its exit code."""
        try:
            proc = await asyncio.create_subprocess_exec(
                self._settings.shell,
                "-c",
                command,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=asyncio.subprocess.PIPE,
                stderr=asyncio.subprocess.STDOUT,
                env=child_env(self._settings.pass_env),
                start_new_session=True,
            )
        except OSError as exc:
            raise PermanentError(f"resource '{res.id}': cannot run its command: {exc}") from exc
        try:
            async with asyncio.timeout(self._settings.timeout.total_seconds()):
                printed, _ = await proc.communicate()
        except TimeoutError as exc:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            raise TemporaryError(
                f"resource '{res.id}': {_what(wanted)} command: no answer within "
                f"{self._settings.timeout}"
            ) from exc
        result = remote.CommandResult(proc.returncode or 0, printed.decode(errors="replace"), "")
        if result.exit_status == 0:
            log.info("%s: %s command done", res.id, _what(wanted))
            self._known[str(res.id)] = wanted
            return
        raise PermanentError(
            f"resource '{res.id}': {_what(wanted)} command exited {result.exit_status}: "
            f"{result.first_error_line()}"
        )

    async def _outlast(self, res: ResourceConfig, tracked: _Tracked, timeout: float) -> None:
        """Wait, polling ``/proc``, until ``tracked`` ends or ``timeout`` has passed."""
        interval = self._settings.poll_interval.total_seconds()
        deadline = self._clock.monotonic() + max(timeout, 0.0)
        while processes.running(tracked.process) and self._clock.monotonic() < deadline:
            await asyncio.sleep(interval)

    def _judge(
        self,
        res: ResourceConfig,
        tracked: _Tracked,
        status: int | str | None,
        *,
        missing_ok: bool,
    ) -> None:
        """An ended command by what its session wrote: 0 is done; another status fails the
        step with the command's first line of output. No exit status (its session was killed
        too) is not done: the ``status`` command judges when there is one (``missing_ok``),
        else the step fails saying so."""
        what = _what(tracked.wanted)
        if status == 0:
            log.info("%s: %s command done", res.id, what)
            self._known[str(res.id)] = tracked.wanted
            return
        if isinstance(status, int):
            output = _output(tracked.process)
            raise PermanentError(
                f"resource '{res.id}': {what} command exited {status}: {output.first_error_line()}"
            )
        if missing_ok and res.status is not None:
            return
        raise PermanentError(
            f"resource '{res.id}': its {what} command {_named(tracked)} ended without leaving "
            f"its exit status ({tracked.process.exit_file})"
            + ("" if res.status is not None else " and it has no 'status' command to read")
            + f": not known to be {tracked.wanted.value}; not run again"
        )

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


@dataclass(frozen=True, slots=True)
class _Tracked:
    process: CommandProcess
    wanted: PowerState
    adopted: bool = False
    """Started by a controller before this one (from the journal)."""


def _nobody(process: CommandProcess) -> None:
    """The listener of a request no step journals (``upsguard`` acting directly)."""


def _what(state: PowerState) -> str:
    return "shutdown" if state is PowerState.OFF else "startup"


def _named(tracked: _Tracked) -> str:
    since = tracked.process.started.astimezone().strftime("%H:%M:%S")
    before = ", started before the restart" if tracked.adopted else ""
    return f"(pid {tracked.process.pid}, since {since}{before})"


def _identity(pid: int, exit_file: Path, started: datetime) -> CommandProcess:
    """The process just started, by PID and start time; its session is its own (its PID)."""
    found = processes.identify(pid)
    start_ticks, session = found if found is not None else (0, pid)
    return CommandProcess(pid, start_ticks, session, str(exit_file), started)


def _output(process: CommandProcess) -> remote.CommandResult:
    """What an ended command printed (its output file beside its exit status)."""
    try:
        text = Path(process.exit_file).with_suffix(".out").read_text(errors="replace")
    except OSError:
        text = ""
    status = processes.exit_status(process)
    return remote.CommandResult(status if isinstance(status, int) else 255, text, "")


def _runnable(program: str) -> bool:
    if "/" in program:
        return os.access(program, os.X_OK)
    return shutil.which(program) is not None
