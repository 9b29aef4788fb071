"""The ``ssh`` platform: NAS units, storage arrays and switches shut down by a command over SSH.

A resource gives its address (``host``) and ``shutdown`` command (``poweroff``,
``/sbin/shutdown -h now``, a switch CLI's own). The host key must be in
``known_hosts``: an unknown or changed key is refused, never accepted silently.

Whether the device is down: with a ``status`` command (run over SSH, exit 0 =
up), the device is down once it exits non-zero (one ended by a signal, or with no exit
status at all, says nothing: unknown); without one, its SSH port
accepting connections says it is up. A device that does not answer at all is
``unknown`` (off looks like that, and so does a broken path, a DNS server
already stopped, or a wrong address), except once it accepted its shutdown
command: then it going quiet is that shutdown landing, and it reads ``off``
(``SeenWhileItAnswers``). So a step is done only when the device was seen
down after its shutdown, never because it could not be reached. ``startup`` (optional) is
for devices that are reachable but idle (bring a service or ports back up);
powering a device on belongs to a BMC or Wake-on-LAN via ``power_on_via``.

Command lines: a plain line (``shutdown -h now``) is sent as it is, so that a
switch CLI without a POSIX shell understands it; a line using shell syntax
(``;``, ``|``, ``&``, ``>``, ``$``) is run as ``sh -c LINE``. A device that
drops the connection while running ``shutdown`` has accepted it.

Sent once, a command cannot be seen from here: it runs on the device after the connection,
or the controller, is gone. The step journals the moment each ``shutdown`` or ``startup``
goes out (``SendsCommands``), and a restarted controller sends no second one before the
step's own timeout has passed since the first (``engine.actions``). A resource with
``ssh: {once: true}`` runs them under ``flock`` on the device, so that a copy sent again
while the first still runs there (a command slower than the step's timeout) is refused
beside it rather than run twice: the wrapper takes ``~/.upsguard-RESOURCE-ACTION.lock``
without waiting, and on refusal exits ``ONCE_REFUSED`` saying ``ONCE_MARK``; the platform
then treats the first copy as the request under way. The lock file also keeps the request
(run and step) its last copy ran for: a copy for the same request is refused even once the
first has ended, as when a restarted controller read the device up just before the first
copy finished; the next outage's run is another request, and runs. The lock file lives in
the SSH user's home, not ``/run/lock``: the home is there and writable on every device that
lets the user log in (appliances often have no ``/run/lock``, or keep it for root), and
nobody else may create files in it, whereas any user of the device can plant a file of that
name in the shared ``/run/lock`` and so keep the shutdown from ever running. A ``flock`` lock
ends with the processes holding it (the command and what it left running), so a file left
behind by a reboot holds nothing (the request it names is an old run's). A device without
``flock``, or whose home cannot take the file, runs the command unguarded: the lock is a
guard, never a reason not to shut down.
"""

from __future__ import annotations

import logging
import re
import shlex
from collections.abc import Sequence

from upsguard.clock import Clock
from upsguard.config.platforms import SshSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import (
    AuthenticationError,
    PermanentError,
    PlatformUnreachable,
    TemporaryError,
    UpsguardError,
)
from upsguard.findings import Area, Finding, fail, ok, warn
from upsguard.models import PlatformName, PowerState, StopMethod, Target
from upsguard.plugins import remote
from upsguard.plugins.platforms.base import (
    AcceptedShutdowns,
    ResourceTargets,
    SentListener,
    poll_for_state,
    port_state,
)

__all__ = ["ONCE_MARK", "ONCE_REFUSED", "SshPlatform", "command_argv", "once_argv"]

log = logging.getLogger(__name__)

_SHELL_SYNTAX = set(";|&<>$`(){}*?~\n")


def command_argv(line: str) -> list[str]:
    """The argv for a site-file command line; see the module docstring."""
    if _SHELL_SYNTAX & set(line):
        return ["sh", "-c", line]
    return shlex.split(line)


ONCE_REFUSED = 75
"""The exit status of a refused ``once`` copy: the first still runs, or ran for the same
request (EX_TEMPFAIL)."""
ONCE_MARK = (
    "upsguard: a copy of this command still runs on this device, or ran for this request; "
    "not started again"
)
"""The line the refusal prints on stderr: with ``ONCE_REFUSED`` it tells a refusal from a
command that happens to exit 75 (a token of the wrapper's own, as ``remote.EXIT_MARK`` is)."""

_ONCE = (
    'lock="$HOME/.upsguard-$0.lock"\n'
    'if command -v flock >/dev/null 2>&1 && (: >>"$lock") 2>/dev/null; then\n'
    '  exec 9>>"$lock"\n'
    f'  refuse() {{ echo "{ONCE_MARK}" >&2; exit {ONCE_REFUSED}; }}\n'
    "  flock -n 9 || refuse\n"
    '  read -r ran <"$lock"\n'
    '  [ -n "$2" ] && [ "$ran" = "$2" ] && refuse\n'
    '  printf "%s\\n" "$2" >"$lock"\n'
    "fi\n"
    'exec sh -c "$1"'
)
"""The ``once`` wrapper: ``sh -c _ONCE NAME LINE REQUEST`` (see the module docstring). The
lock's descriptor is passed on to the command, so it is held as long as the command runs;
the lock file keeps the request its last copy ran for, so that the same request's copy sent
again as the first ends (a restarted controller read the device up a moment before) is
refused too. The line itself runs as ``sh -c LINE``, as the device's login shell would."""


_ONCE_PROBE = 'command -v flock >/dev/null 2>&1 && test -w "$HOME"'
"""What ``once`` needs on the device, read without changing anything (``doctor``)."""


def once_argv(name: str, line: str, request: str) -> list[str]:
    """``line`` run under the device's ``flock``, its lock named after ``name``, for
    ``request`` (see ``_ONCE``)."""
    safe = re.sub(r"[^A-Za-z0-9._-]", "_", name)
    return ["sh", "-c", _ONCE, safe, line, request]


class SshPlatform:
    """One SSH user and key; each resource's ``host`` is a device reached with them."""

    def __init__(self, name: PlatformName, settings: SshSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._targets = ResourceTargets(name)
        self._runners: dict[str, remote.Runner] = {}
        self._shut_down = AcceptedShutdowns()
        """Devices that accepted their shutdown command: silence from them is ``OFF``."""

    async def open(self) -> None:
        return None  # connections are opened per device, on first use

    async def close(self) -> None:
        runners, self._runners = self._runners, {}
        for runner in runners.values():
            await runner.close()

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return [self._targets.target(resource)]

    async def power_state(self, target: Target) -> PowerState:
        """ON while it answers (its ``status`` exits 0, or its SSH port accepts); OFF when its
        ``status`` exits non-zero; no answer (nor an exit status) is UNKNOWN, or OFF once it
        accepted its shutdown (see the module's docstring)."""
        res = self._targets.resource(target)
        if res.status is None:
            timeout = min(self._settings.timeout.total_seconds(), 5.0)
            state = await port_state(target.name, self._settings.port, timeout)
        else:
            try:
                result = await self._run(target, res.status)
            except TemporaryError:  # no answer, connection lost
                await self._drop(target.name)
                state = PowerState.UNKNOWN
            else:
                state = _status_state(result)
        return self._shut_down.state(target.name, state, quiet=state is not PowerState.ON)

    def shutdown_accepted(self, target: Target) -> None:
        """``SeenWhileItAnswers``: the device took its shutdown command (before a restart)."""
        self._shut_down.accepted(target.name)

    async def stop(self, target: Target, method: StopMethod) -> None:
        """Run ``shutdown`` on the device; return once it accepted the command."""
        res = self._targets.resource(target)
        if method is StopMethod.HARD:
            raise PermanentError(
                f"resource '{res.id}': SSH has no hard power-off for {target.name}; "
                "it did not go down after its shutdown command"
            )
        await self.send_command(target, PowerState.OFF, _nobody, request="")

    async def start(self, target: Target) -> None:
        """Run ``startup`` on a reachable device; power-on itself needs ``power_on_via``."""
        await self.send_command(target, PowerState.ON, _nobody, request="")

    async def send_command(
        self, target: Target, wanted: PowerState, sent: SentListener, *, request: str
    ) -> None:
        """``SendsCommands``: run the resource's ``shutdown`` (``OFF``) or ``startup`` (``ON``)
        on the device, ``sent`` hearing the moment it goes out. A ``once`` copy refused
        (the first still runs, or ran for ``request``) is that request under way."""
        res = self._targets.resource(target)
        if wanted is PowerState.OFF:
            await self._shutdown(target, res, sent, request)
            return
        if res.startup is None:
            raise PermanentError(
                f"resource '{res.id}': SSH cannot power {target.name} on: "
                "set power_on_via (a BMC or wol) or a 'startup' command"
            )
        self._shut_down.forget(target.name)
        result = await self._send(target, res, "startup", res.startup, sent, request)
        if not result.ok and not _refused(result):
            raise PermanentError(
                f"resource '{res.id}': startup command on {target.name} exited "
                f"{result.exit_status}: {result.first_error_line()}"
            )

    async def _shutdown(
        self, target: Target, res: ResourceConfig, sent: SentListener, request: str
    ) -> None:
        if res.shutdown is None:
            raise PermanentError(f"resource '{res.id}' has no 'shutdown' command")
        try:
            result = await self._send(target, res, "shutdown", res.shutdown, sent, request)
        except PlatformUnreachable as exc:
            if "connection lost" not in str(exc):  # remote's words for a drop after connecting
                raise
            log.info("%s dropped the SSH connection during shutdown: going down", target.name)
            await self._drop(target.name)
            self._shut_down.asked(target.name)
            return
        if _refused(result):
            log.info("%s: its shutdown command still runs there from before", target.name)
        elif not result.ok and not _dropped(result):
            raise PermanentError(
                f"resource '{res.id}': shutdown command on {target.name} exited "
                f"{result.exit_status}: {result.first_error_line()}"
            )
        self._shut_down.asked(target.name)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        interval = self._settings.poll_interval.total_seconds()
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def healthy(self, target: Target) -> bool:
        return await self.power_state(target) is PowerState.ON

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: each device's host key is known and the key logs in; with
        ``once``, that the device has ``flock`` and a home the lock file can go in (a probe
        that reads only; whether its shutdown command would work only the device knows)."""
        found = []
        for res in resources:
            if res.platform != self.name:
                continue
            endpoint = self._endpoint(res.target_name)
            where = f"{endpoint.user}@{endpoint.host}:{endpoint.port}"
            try:
                await remote.check_login(endpoint, timeout=self._settings.timeout.total_seconds())
            except UpsguardError as exc:
                found.append(fail(Area.RESOURCE, res.id, "ssh", str(exc), _fix(exc, endpoint)))
                continue
            known = self._settings.known_hosts or "~/.ssh/known_hosts"
            found.append(
                ok(Area.RESOURCE, res.id, "ssh", f"{where}: host key in {known}, key accepted")
            )
            if res.ssh is not None and res.ssh.once:
                found.append(await self._once_finding(res, where))
        return found

    async def _once_finding(self, res: ResourceConfig, where: str) -> Finding:
        """Whether ``once`` can guard the resource's commands on its device."""
        timeout = self._settings.timeout.total_seconds()
        endpoint = self._endpoint(res.target_name)
        try:
            result = await remote.run(["sh", "-c", _ONCE_PROBE], ssh=endpoint, timeout=timeout)
        except UpsguardError as exc:
            return fail(Area.RESOURCE, res.id, "once", str(exc), _fix(exc, endpoint))
        if result.ok:
            return ok(Area.RESOURCE, res.id, "once", f"{where}: flock there, lock file in ~")
        return warn(
            Area.RESOURCE,
            res.id,
            "once",
            f"{where}: no flock, or a home the lock file cannot go in: its commands would run "
            "unguarded (a copy sent again after a restart may run beside the first)",
            "install flock (util-linux) on the device, or give the SSH user a writable home",
            missing=("flock",),
        )

    def _endpoint(self, host: str) -> remote.SshEndpoint:
        return remote.SshEndpoint(
            host=host,
            port=self._settings.port,
            user=self._settings.user,
            key_file=self._settings.key_file,
            known_hosts=self._settings.known_hosts,
        )

    async def _run(self, target: Target, line: str) -> remote.CommandResult:
        timeout = self._settings.timeout.total_seconds()
        return await self._runner(target).run(command_argv(line), timeout=timeout)

    async def _send(
        self,
        target: Target,
        res: ResourceConfig,
        what: str,
        line: str,
        sent: SentListener,
        request: str,
    ) -> remote.CommandResult:
        """Run a shutdown or startup ``line`` (under ``flock`` with ``once``), ``sent`` hearing
        it go out once the connection is open."""
        once = res.ssh is not None and res.ssh.once
        argv = once_argv(f"{res.id}-{what}", line, request) if once else command_argv(line)
        runner = self._runner(target)
        await runner.open()
        sent()
        return await runner.run(argv, timeout=self._settings.timeout.total_seconds())

    def _runner(self, target: Target) -> remote.Runner:
        runner = self._runners.get(target.name)
        if runner is None:
            endpoint = self._endpoint(target.name)
            timeout = self._settings.timeout.total_seconds()
            runner = self._runners[target.name] = remote.Runner(endpoint, connect_timeout=timeout)
        return runner

    async def _drop(self, host: str) -> None:
        runner = self._runners.pop(host, None)
        if runner is not None:
            await runner.close()


def _fix(exc: UpsguardError, at: remote.SshEndpoint) -> str:
    if isinstance(exc, remote.HostKeyUnknown):
        return (
            f"verify the host's key, then add it to known_hosts "
            f"(ssh-keyscan -p {at.port} {at.host} >> {at.known_hosts or '~/.ssh/known_hosts'})"
        )
    if isinstance(exc, remote.KeyFileUnreadable):
        return (
            f"make the key (ssh-keygen -t ed25519 -N '' -f {at.key_file}) and add its .pub to "
            f"{at.user}'s authorized_keys on {at.host}, or set key_file to one this user can read"
        )
    if isinstance(exc, AuthenticationError):
        return f"add the public key of {at.key_file or 'the key'} to {at.user}'s authorized_keys"
    if isinstance(exc, PermanentError):
        return "check key_file (an OpenSSH private key without a passphrase)"
    return "check the device's address and that its SSH server runs and is reachable"


def _nobody() -> None:
    """The listener of a request no step journals (``upsguard`` acting directly)."""


def _refused(result: remote.CommandResult) -> bool:
    """A ``once`` copy refused: its first copy still runs on the device, or ran for the same
    request (see ``ONCE_MARK``)."""
    return result.exit_status == ONCE_REFUSED and ONCE_MARK in result.stderr.splitlines()


def _status_state(result: remote.CommandResult) -> PowerState:
    """Exit 0 is up, another exit status is down; a status command that ended without one
    (killed by a signal, its session closed first) said nothing of the device: unknown."""
    if result.ok:
        return PowerState.ON
    if result.exit_status < 0 or _dropped(result):
        return PowerState.UNKNOWN
    return PowerState.OFF


def _dropped(result: remote.CommandResult) -> bool:
    """Exit 255 with no output: the channel closed without a status, as ``poweroff`` does."""
    return result.exit_status == 255 and not (result.stdout.strip() or result.stderr.strip())
