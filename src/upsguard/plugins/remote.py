"""Run a command here or on another machine over SSH, with the host key checked.

Plugins that drive command-line tools (cache providers, the ssh platform)
share this one runner so that they all report the same clear errors:

* the host key does not match ``known_hosts`` (or the host is not listed):
  ``PermanentError``, never a silent connect;
* the host does not answer: ``PlatformUnreachable`` (retry later);
* the key is refused: ``AuthenticationError``; the key file is not there or cannot be read:
  ``KeyFileUnreadable``;
* the program is missing: ``PermanentError``; it ran too long: ``TemporaryError``.

A ``Runner`` keeps one SSH connection per endpoint open between calls (a
destage watch polls every few seconds); ``run()`` is the one-shot form.
A non-zero exit status is a result, not an error: the caller decides. A local command
gets ``secrecy.child_env``: the basics and the variables its settings pass on, never the
secrets in the service's own environment.

asyncssh is imported by the functions that speak SSH, on first use: with the cryptography
it loads it takes some 16 MiB, which a service of local commands and simulated plugins
never needs (``bench/idle_rss.py``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import shlex
import signal
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path, PurePath
from typing import TYPE_CHECKING, Any, Protocol

from upsguard.errors import (
    AuthenticationError,
    HostKeyUnknown,
    KeyFileUnreadable,
    PermanentError,
    PlatformUnreachable,
    TemporaryError,
)
from upsguard.secrecy import child_env

if TYPE_CHECKING:
    import asyncssh

__all__ = [
    "Background",
    "CommandResult",
    "Detached",
    "HostKeyUnknown",
    "KeyFileUnreadable",
    "Runner",
    "SshEndpoint",
    "SshTarget",
    "check_login",
    "program_of",
    "run",
    "where",
]


class SshTarget(Protocol):
    """Where to run: the cache settings' ``ssh:`` block, or an ``SshEndpoint``."""

    @property
    def host(self) -> str: ...
    @property
    def port(self) -> int: ...
    @property
    def user(self) -> str: ...
    @property
    def key_file(self) -> Path | None: ...
    @property
    def known_hosts(self) -> Path | None: ...


@dataclass(frozen=True, slots=True)
class SshEndpoint:
    """An ``SshTarget`` built from parts (the ssh platform: host from the resource)."""

    host: str
    port: int = 22
    user: str = "root"
    key_file: Path | None = None
    known_hosts: Path | None = None


@dataclass(frozen=True, slots=True)
class CommandResult:
    exit_status: int
    stdout: str
    stderr: str

    @property
    def ok(self) -> bool:
        return self.exit_status == 0

    def first_error_line(self) -> str:
        """The line a person wants to see when the command failed."""
        for text in (self.stderr, self.stdout):
            for line in text.splitlines():
                if line.strip():
                    return line.strip()
        return f"exit status {self.exit_status}"


EXIT_MARK = "upsguard: exit status"


@dataclass(frozen=True, slots=True)
class Detached:
    """Output of a detached command; ``exit_status`` is None while it still runs."""

    lines: list[str]
    exit_status: int | None

    @property
    def running(self) -> bool:
        return self.exit_status is None


def describe(argv: Sequence[str], ssh: SshTarget | None) -> str:
    """``storcli64 /c0 show J`` or ``root@nas01:22: storcli64 ...`` for messages."""
    command = shlex.join(argv)
    return command if ssh is None else f"{_where(ssh)}: {command}"


def _where(ssh: SshTarget) -> str:
    return f"{ssh.user}@{ssh.host}:{ssh.port}"


def where(ssh: SshTarget | None) -> str:
    """``root@nas01:22``, or ``this machine``: where a runner's commands run."""
    return "this machine" if ssh is None else _where(ssh)


def program_of(line: str) -> str | None:
    """The program a command line starts, when the line is that simple (``a; b`` is not)."""
    try:
        words = shlex.split(line)
    except ValueError:
        return None
    if not words or any(c in line for c in ";|&$`()<>") or "=" in words[0]:
        return None
    return words[0]


class Background:
    """A command left running (``lvchange`` flushing, ``casadm`` switching mode).

    Its output is collected as it comes so that a provider can report
    progress (``Flushing 1234 blocks``) while the command still runs.
    """

    def __init__(self, argv: Sequence[str], ssh: SshTarget | None) -> None:
        self.argv = list(argv)
        self.ssh = ssh
        self.stdout = ""
        self.stderr = ""
        self.exit_status: int | None = None
        self._task: asyncio.Task[None] | None = None
        self._kill: Any = None

    @property
    def running(self) -> bool:
        return self._task is not None and not self._task.done()

    def output_lines(self) -> list[str]:
        return (self.stdout + self.stderr).splitlines()

    async def wait(self, timeout: float | None = None) -> CommandResult:
        """The result once the command ended; ``TemporaryError`` if it is still running."""
        assert self._task is not None
        try:
            await asyncio.wait_for(asyncio.shield(self._task), timeout)
        except TimeoutError as exc:
            raise TemporaryError(
                f"{describe(self.argv, self.ssh)}: still running after {timeout:g}s"
            ) from exc
        return CommandResult(self.exit_status or 0, self.stdout, self.stderr)

    async def cancel(self) -> None:
        """Stop the command (SIGTERM) and its reader. Never raises."""
        with contextlib.suppress(Exception):
            if self._kill is not None:
                self._kill()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(BaseException):
                await self._task


class Runner:
    """Runs commands locally (``ssh=None``) or on one SSH endpoint, reusing the connection."""

    def __init__(
        self,
        ssh: SshTarget | None = None,
        *,
        connect_timeout: float = 10.0,
        pass_env: Sequence[str] = (),
    ) -> None:
        self.ssh = ssh
        self.connect_timeout = connect_timeout
        self.pass_env = tuple(pass_env)
        self._conn: asyncssh.SSHClientConnection | None = None
        self._lock = asyncio.Lock()

    async def open(self) -> None:
        """Open the SSH connection now (nothing to open for local commands), so that a caller
        knows the command it sends next goes out. Raises as ``connect`` does."""
        if self.ssh is not None:
            await self._connection()

    async def run(
        self, argv: Sequence[str], *, timeout: float, input: str | None = None
    ) -> CommandResult:
        """Run ``argv`` to its end; raises only when it could not run or ran too long."""
        if not argv:
            raise ValueError("empty command")
        try:
            async with asyncio.timeout(timeout):
                if self.ssh is None:
                    return await _run_local(argv, input, self.pass_env)
                return await self._run_ssh(argv, input)
        except TimeoutError as exc:
            raise TemporaryError(
                f"{describe(argv, self.ssh)}: no answer within {timeout:g}s"
            ) from exc

    async def start(self, argv: Sequence[str]) -> Background:
        """Start ``argv`` and return at once; its output collects on the ``Background``."""
        job = Background(argv, self.ssh)
        if self.ssh is None:
            proc = await _spawn_local(argv, self.pass_env)
            job._kill = functools.partial(_signal_group, proc, signal.SIGTERM)
            job._task = asyncio.create_task(_collect_local(job, proc))
        else:
            import asyncssh

            conn = await self._connection()
            sproc = await conn.create_process(shlex.join(argv), stdin=asyncssh.DEVNULL)
            job._kill = sproc.terminate
            job._task = asyncio.create_task(_collect_ssh(job, sproc))
        return job

    async def start_detached(self, argv: Sequence[str], log: str, *, timeout: float) -> None:
        """Start ``argv`` so that it outlives this process and its SSH session.

        For tools that block until a flush ends (``lvchange``, ``casadm -Q``): the
        controller may restart, or ``upsguard cache set`` exit, while they work. Output
        goes to ``log`` on the machine that runs it, ended by ``upsguard: exit status N``;
        ``read_detached`` reads it back.
        """
        inner = f'{shlex.join(argv)}; echo "{EXIT_MARK} $?"'
        quoted = shlex.quote(log)
        outer = f": > {quoted}; nohup sh -c {shlex.quote(inner)} >> {quoted} 2>&1 < /dev/null &"
        result = await self.run(["sh", "-c", outer], timeout=timeout)
        if not result.ok:
            raise PermanentError(f"{describe(argv, self.ssh)}: {result.first_error_line()}")

    async def read_detached(self, log: str, *, timeout: float) -> Detached | None:
        """What a detached command printed so far, and its exit status once it ended."""
        try:
            text = await self.read_text(log, timeout=timeout)
        except PermanentError:
            return None
        lines = text.splitlines()
        status: int | None = None
        if lines and lines[-1].startswith(EXIT_MARK):
            status = int(lines.pop()[len(EXIT_MARK) :].strip() or 255)
        return Detached(lines, status)

    async def read_text(self, path: PurePath | str, *, timeout: float) -> str:
        """A small file's text (sysfs attributes); ``PermanentError`` when it is not there."""
        if self.ssh is None:
            try:
                return await asyncio.to_thread(Path(path).read_text)
            except FileNotFoundError as exc:
                raise PermanentError(f"{path}: no such file") from exc
            except OSError as exc:
                raise TemporaryError(f"{path}: {exc.strerror}") from exc
        result = await self.run(["cat", "--", str(path)], timeout=timeout)
        if not result.ok:
            raise PermanentError(
                f"{describe(['cat', str(path)], self.ssh)}: {result.first_error_line()}"
            )
        return result.stdout

    async def read_texts(self, paths: Sequence[PurePath | str], *, timeout: float) -> list[str]:
        """Several small files in one go (one thread hop here, one command over SSH).

        Each file's text comes back without its trailing newline; a missing file
        raises ``PermanentError`` naming it.
        """
        if self.ssh is None:
            try:
                return await asyncio.to_thread(_read_all, [Path(p) for p in paths])
            except FileNotFoundError as exc:
                raise PermanentError(f"{exc.filename}: no such file") from exc
            except OSError as exc:
                raise TemporaryError(f"{exc.filename}: {exc.strerror}") from exc
        script = 'for f; do cat -- "$f" || exit 1; printf "\\n%s\\n" "$0"; done'
        result = await self.run(["sh", "-c", script, _FILE_END, *map(str, paths)], timeout=timeout)
        if not result.ok:
            raise PermanentError(f"{_where(self.ssh)}: {result.first_error_line()}")
        parts = result.stdout.split(f"\n{_FILE_END}\n")
        return [part.rstrip("\n") for part in parts[: len(paths)]]

    async def write_text(self, path: PurePath | str, text: str, *, timeout: float) -> None:
        """Write a sysfs attribute: one ``write()``, as ``echo VALUE > FILE`` would."""
        if self.ssh is None:
            try:
                await asyncio.to_thread(_write_once, Path(path), text)
            except OSError as exc:
                raise PermanentError(f"cannot write '{text}' to {path}: {exc.strerror}") from exc
            return
        await self.write_texts([(path, text)], timeout=timeout)

    async def write_texts(
        self, values: Sequence[tuple[PurePath | str, str]], *, timeout: float
    ) -> None:
        """Write several sysfs attributes in order, in one go (one command over SSH: a flip
        that sets three knobs costs one round trip, not three); stops at the first that fails,
        naming it."""
        if self.ssh is None:
            for path, text in values:
                await self.write_text(path, text, timeout=timeout)
            return
        script = "; ".join(
            f"printf '%s\\n' {shlex.quote(text)} > {shlex.quote(str(path))} || "
            f"{{ echo {shlex.quote(f'cannot write {text!r} to {path}')} >&2; exit 1; }}"
            for path, text in values
        )
        result = await self.run(["sh", "-c", script], timeout=timeout)
        if not result.ok:  # the shell's own error first, then which write it was
            lines = [line.strip() for line in result.stderr.splitlines() if line.strip()]
            what = lines[-1] if lines else f"exit status {result.exit_status}"
            detail = f": {lines[0]}" if len(lines) > 1 else ""
            raise PermanentError(f"{_where(self.ssh)}: {what}{detail}")

    async def close(self) -> None:
        """Close the SSH connection. Never raises."""
        conn, self._conn = self._conn, None
        if conn is not None:
            with contextlib.suppress(Exception):
                conn.close()
                await conn.wait_closed()

    async def _run_ssh(self, argv: Sequence[str], input: str | None) -> CommandResult:
        import asyncssh

        conn = await self._connection()
        try:
            done = await conn.run(shlex.join(argv), input=input, check=False)
        except (OSError, asyncssh.Error) as exc:
            await self.close()
            raise PlatformUnreachable(
                f"{_where(self.ssh_or_fail)}: connection lost: {exc}"
            ) from exc
        status = done.exit_status if done.exit_status is not None else 255
        return CommandResult(status, _text(done.stdout), _text(done.stderr))

    @property
    def ssh_or_fail(self) -> SshTarget:
        assert self.ssh is not None
        return self.ssh

    async def _connection(self) -> asyncssh.SSHClientConnection:
        async with self._lock:
            if self._conn is None or self._conn.is_closed():
                self._conn = await connect(self.ssh_or_fail, timeout=self.connect_timeout)
            return self._conn


async def run(
    argv: Sequence[str],
    *,
    ssh: SshTarget | None,
    timeout: float,
    input: str | None = None,
    pass_env: Sequence[str] = (),
) -> CommandResult:
    """Run one command once, here or over SSH; see ``Runner.run``."""
    runner = Runner(ssh, connect_timeout=timeout, pass_env=pass_env)
    try:
        return await runner.run(argv, timeout=timeout, input=input)
    finally:
        await runner.close()


async def connect(ssh: SshTarget, *, timeout: float) -> asyncssh.SSHClientConnection:
    """Open an SSH connection whose host key ``known_hosts`` vouches for, or raise clearly."""
    import asyncssh

    known = str(ssh.known_hosts) if ssh.known_hosts is not None else ()
    keys = [str(ssh.key_file)] if ssh.key_file is not None else ()
    where = _where(ssh)
    if ssh.key_file is not None:
        _check_key_file(ssh, where)
    try:
        return await asyncssh.connect(
            ssh.host,
            port=ssh.port,
            username=ssh.user,
            known_hosts=known,
            client_keys=keys,
            agent_path=None,
            password=None,
            kbdint_auth=False,
            connect_timeout=timeout,
        )
    except asyncssh.HostKeyNotVerifiable as exc:
        raise HostKeyUnknown(_host_key_message(ssh)) from exc
    except asyncssh.KeyImportError as exc:
        raise PermanentError(
            f"{where}: cannot read the private key {ssh.key_file}: {exc}: check ssh.key_file "
            "(an OpenSSH private key without a passphrase)"
        ) from exc
    except asyncssh.PermissionDenied as exc:
        key = ssh.key_file or "the default keys in ~/.ssh"
        raise AuthenticationError(
            f"{where}: the server refused key {key}: add its public key to "
            f"{ssh.user}'s authorized_keys or set ssh.key_file"
        ) from exc
    except TimeoutError as exc:
        raise PlatformUnreachable(f"{where}: no SSH answer within {timeout:g}s") from exc
    except OSError as exc:
        reason = exc.strerror or str(exc)
        raise PlatformUnreachable(f"{where}: cannot connect: {reason}") from exc
    except asyncssh.Error as exc:
        raise PlatformUnreachable(f"{where}: SSH failed: {exc.reason}") from exc


def _check_key_file(ssh: SshTarget, where: str) -> None:
    """A key file that is not there, or that this user may not read, is said as such: asyncssh
    raises the ``OSError`` of reading it where it would raise one of connecting. Raises
    ``KeyFileUnreadable``."""
    try:
        with open(ssh.key_file or "", "rb"):
            pass
    except OSError as exc:
        raise KeyFileUnreadable(
            f"{where}: cannot read the private key {ssh.key_file}: {exc.strerror or exc}"
        ) from exc


async def check_login(ssh: SshTarget, *, timeout: float) -> None:
    """Connect and log in, then leave: the host key and the key are checked, nothing runs.
    Raises as ``connect`` does."""
    conn = await connect(ssh, timeout=timeout)
    conn.close()
    with contextlib.suppress(Exception):
        await conn.wait_closed()


def _host_key_message(ssh: SshTarget) -> str:
    """Say whether the key changed or the host is simply not listed: two different fixes."""
    import asyncssh

    path = ssh.known_hosts or Path("~/.ssh/known_hosts").expanduser()
    where = _where(ssh)
    listed = False
    with contextlib.suppress(Exception):
        trusted = asyncssh.read_known_hosts(str(path)).match(ssh.host, "", ssh.port)
        listed = bool(trusted[0] or trusted[2])
    if listed:
        return (
            f"{where}: host key does not match {path}: refusing to connect "
            "(the host was reinstalled, or someone is in the middle); verify the key "
            "and update known_hosts"
        )
    return (
        f"{where}: host is not in {path}: refusing to connect to an unknown host; "
        f"add its key (ssh-keyscan -p {ssh.port} {ssh.host}, after verifying it)"
    )


def _text(value: str | bytes | None) -> str:
    if value is None:
        return ""
    return value.decode(errors="replace") if isinstance(value, bytes) else value


_FILE_END = "--upsguard-end-of-file--"


def _read_all(paths: list[Path]) -> list[str]:
    return [path.read_text().rstrip("\n") for path in paths]


def _write_once(path: Path, text: str) -> None:
    with path.open("w") as handle:
        handle.write(text + "\n")


async def _spawn_local(argv: Sequence[str], pass_env: Sequence[str]) -> asyncio.subprocess.Process:
    try:
        # a session of its own: a signal meant for the service (systemctl stop signals the
        # whole unit) must not kill a step's command halfway; the service decides
        return await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.PIPE,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            env=child_env(pass_env),
            start_new_session=True,
        )
    except FileNotFoundError as exc:
        raise PermanentError(
            f"{argv[0]}: program not found: install it or set its path in the site file"
        ) from exc
    except PermissionError as exc:
        raise PermanentError(f"{argv[0]}: not executable") from exc


def _signal_group(proc: asyncio.subprocess.Process, sig: int) -> None:
    """Signal the command and everything it started (its own session: see ``_spawn_local``);
    a grandchild left behind would hold the pipes open, and the wait for it forever."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(proc.pid, sig)


async def _run_local(
    argv: Sequence[str], input: str | None, pass_env: Sequence[str]
) -> CommandResult:
    proc = await _spawn_local(argv, pass_env)
    try:
        out, err = await proc.communicate(input.encode() if input is not None else None)
    except asyncio.CancelledError:
        _signal_group(proc, signal.SIGKILL)
        with contextlib.suppress(Exception):
            await proc.wait()
        raise
    status = proc.returncode if proc.returncode is not None else 255
    return CommandResult(status, _text(out), _text(err))


async def _collect_local(job: Background, proc: asyncio.subprocess.Process) -> None:
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    proc.stdin.close()

    async def pump(stream: asyncio.StreamReader, attr: str) -> None:
        while line := await stream.readline():
            setattr(job, attr, getattr(job, attr) + _text(line))

    try:
        await asyncio.gather(pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"))
        job.exit_status = await proc.wait()
    except asyncio.CancelledError:
        _signal_group(proc, signal.SIGKILL)
        raise


async def _collect_ssh(job: Background, proc: asyncssh.SSHClientProcess[Any]) -> None:
    import asyncssh

    async def pump(stream: Any, attr: str) -> None:
        while line := await stream.readline():
            setattr(job, attr, getattr(job, attr) + _text(line))

    try:
        await asyncio.gather(pump(proc.stdout, "stdout"), pump(proc.stderr, "stderr"))
        await proc.wait_closed()
        job.exit_status = proc.exit_status if proc.exit_status is not None else 255
    except asyncio.CancelledError:
        proc.close()
        raise
    except (OSError, asyncssh.Error) as exc:
        job.stderr += f"\nconnection lost: {exc}"
        job.exit_status = 255
