"""The shared command runner against a real sshd on loopback: commands, errors, host keys."""

from __future__ import annotations

import asyncio
import shlex
from pathlib import Path

import pytest

from tests.peers.sshd import Sshd
from upsguard.errors import AuthenticationError, PermanentError, PlatformUnreachable
from upsguard.plugins.remote import Runner, SshEndpoint, run

pytestmark = pytest.mark.sshd


def test_runs_a_command_over_ssh_with_input_and_exit_status(sshd: Sshd) -> None:
    result = asyncio.run(
        run(["sh", "-c", "cat; echo err >&2; exit 3"], ssh=sshd.target(), timeout=10, input="hi\n")
    )
    assert (result.exit_status, result.stdout, result.stderr) == (3, "hi\n", "err\n")


def test_arguments_with_spaces_reach_the_remote_side_intact(sshd: Sshd) -> None:
    result = asyncio.run(run(["printf", "%s|", "a b", "c'd"], ssh=sshd.target(), timeout=10))
    assert result.stdout == "a b|c'd|"


def test_host_key_mismatch_is_refused_with_a_clear_error(sshd: Sshd) -> None:
    target = sshd.target(known_hosts=sshd.wrong_known_hosts)
    with pytest.raises(PermanentError, match=r"host key does not match .*known_hosts.wrong"):
        asyncio.run(run(["true"], ssh=target, timeout=10))


def test_unknown_host_is_refused(sshd: Sshd) -> None:
    target = sshd.target(known_hosts=sshd.empty_known_hosts)
    with pytest.raises(PermanentError, match=r"not in .*known_hosts.empty"):
        asyncio.run(run(["true"], ssh=target, timeout=10))


def test_refused_key_is_an_authentication_error(sshd: Sshd, tmp_path: Path) -> None:
    import subprocess

    stranger = tmp_path / "id_stranger"
    subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(stranger)], check=True)
    target = SshEndpoint(sshd.host, sshd.port, sshd.user, stranger, sshd.known_hosts)
    with pytest.raises(AuthenticationError, match="refused key"):
        asyncio.run(run(["true"], ssh=target, timeout=10))


def test_nobody_listening_is_unreachable(sshd: Sshd) -> None:
    from tests.peers.ports import free_port

    target = SshEndpoint("127.0.0.1", free_port(), sshd.user, sshd.key_file, sshd.known_hosts)
    with pytest.raises(PlatformUnreachable, match="cannot connect"):
        asyncio.run(run(["true"], ssh=target, timeout=5))


def test_background_command_reports_output_while_running(sshd: Sshd, tmp_path: Path) -> None:
    """The command goes on once the test has seen its first line (a file it waits for), not
    half a second later: a busy machine read both lines at once and found it ended."""
    go = tmp_path / "go"
    until = f"until [ -e {shlex.quote(str(go))} ] || [ $n -ge 600 ]"  # 30 s at most
    wait = f"n=0; {until}; do n=$((n + 1)); sleep 0.05; done"

    async def scenario() -> tuple[list[str], int]:
        runner = Runner(sshd.target())
        try:
            job = await runner.start(["sh", "-c", f"echo first; {wait}; echo second"])
            async with asyncio.timeout(30):  # a bound against a hang, never a measure
                while "first" not in job.stdout:
                    await asyncio.sleep(0.05)
            assert job.running
            go.touch()
            result = await job.wait(30)
            return result.stdout.splitlines(), result.exit_status
        finally:
            await runner.close()

    assert asyncio.run(scenario()) == (["first", "second"], 0)


def test_file_read_and_write_over_ssh(sshd: Sshd, tmp_path: Path) -> None:
    attr = tmp_path / "writeback_percent"
    attr.write_text("10\n")

    async def scenario() -> str:
        runner = Runner(sshd.target())
        try:
            await runner.write_text(attr, "0", timeout=10)
            return await runner.read_text(attr, timeout=10)
        finally:
            await runner.close()

    assert asyncio.run(scenario()) == "0\n"


def test_several_files_are_written_in_one_go_and_the_failing_one_is_named(
    sshd: Sshd, tmp_path: Path
) -> None:
    """A bcache flip writes three knobs in one command; a write that fails stops it and says
    which file and why, in one line."""
    first, second = tmp_path / "writeback_percent", tmp_path / "writeback_delay"
    missing = tmp_path / "gone" / "writeback_running"

    async def scenario() -> None:
        runner = Runner(sshd.target())
        try:
            await runner.write_texts([(first, "0"), (second, "it's 0")], timeout=10)
            await runner.write_texts([(first, "10"), (missing, "1"), (second, "30")], timeout=10)
        finally:
            await runner.close()

    with pytest.raises(PermanentError) as caught:
        asyncio.run(scenario())
    assert (first.read_text(), second.read_text()) == ("10\n", "it's 0\n")  # stopped at the gap
    message = str(caught.value)
    assert f"cannot write '1' to {missing}: " in message and "\n" not in message
