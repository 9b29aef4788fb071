"""A real OpenSSH server (Debian's openssh-server) on loopback, for SSH cache and platform tests.

Fixtures (register ``tests.peers.sshd`` in tests/conftest.py's ``pytest_plugins``):

* ``sshd`` (session): an ``Sshd`` running ``/usr/sbin/sshd -D`` on 127.0.0.1 on a free port,
  with a throwaway ed25519 host key and a throwaway user key for the current user.
  Useful attributes: ``host``, ``port``, ``user``, ``key_file`` (client private key),
  ``known_hosts`` (a file vouching for the server's real host key), ``wrong_known_hosts``
  (the same host listed with another key: must be refused), ``empty_known_hosts`` (the host
  is not listed), ``target()`` (an ``SshEndpoint`` for ``upsguard.plugins.remote``),
  ``settings_dict()`` (the site file's ``ssh:`` block).
* ``ssh_target`` (function): ``sshd.target()``.

The server runs commands through the login shell of the current user (root in CI), with
``PATH`` taken from ``/etc/environment`` defaults; tests pass absolute paths.
If /usr/sbin/sshd is missing the fixture fails and says to run scripts/setup.
"""

from __future__ import annotations

import os
import pwd
import socket
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peers.ports import free_port
from tests.peers.process import spawn, wait_started
from upsguard.plugins.remote import SshEndpoint

SSHD = Path("/usr/sbin/sshd")


@dataclass
class Sshd:
    host: str
    port: int
    user: str
    key_file: Path
    known_hosts: Path
    wrong_known_hosts: Path
    empty_known_hosts: Path
    log_file: Path

    def target(self, known_hosts: Path | None = None) -> SshEndpoint:
        return SshEndpoint(
            host=self.host,
            port=self.port,
            user=self.user,
            key_file=self.key_file,
            known_hosts=known_hosts or self.known_hosts,
        )

    def settings_dict(self, known_hosts: Path | None = None) -> dict[str, object]:
        return {
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "key_file": str(self.key_file),
            "known_hosts": str(known_hosts or self.known_hosts),
        }


def lock_of_its_own() -> str:
    """A resource id whose ``once`` lock (``~/.upsguard-<id>-shutdown.lock`` on the device,
    this machine's home) no other test shares. Named after ``tmp_path`` it was shared: the
    same test's paths end alike on two workers, and one test's clean-up unlinked the lock
    the other's first copy held, so its second copy took a new one and ran too."""
    return f"nas-{uuid.uuid4().hex[:12]}"


def _keygen(path: Path) -> None:
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "upsguard-test", "-f", str(path)],
        check=True,
    )


def _greets(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=0.5) as sock:
            return sock.recv(64).startswith(b"SSH-")
    except OSError:
        return False


@pytest.fixture(scope="session")
def sshd(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Sshd]:
    if not SSHD.exists():
        pytest.fail("/usr/sbin/sshd is missing: run scripts/setup (installs openssh-server)")
    base = tmp_path_factory.mktemp("sshd")
    host_key, other_key, user_key = base / "host_key", base / "other_host_key", base / "id_user"
    for key in (host_key, other_key, user_key):
        _keygen(key)
    user = pwd.getpwuid(os.getuid()).pw_name
    port = free_port()
    authorized = base / "authorized_keys"
    authorized.write_text(user_key.with_suffix(".pub").read_text())
    authorized.chmod(0o600)
    config = base / "sshd_config"
    log = base / "sshd.log"
    config.write_text(
        "\n".join(
            [
                "ListenAddress 127.0.0.1",
                f"Port {port}",
                f"HostKey {host_key}",
                f"PidFile {base / 'sshd.pid'}",
                f"AuthorizedKeysFile {authorized}",
                "PermitRootLogin prohibit-password",
                "PasswordAuthentication no",
                "KbdInteractiveAuthentication no",
                "UsePAM no",
                "StrictModes no",
                "MaxSessions 64",
                "MaxStartups 64:30:128",
                "LogLevel ERROR",
                "",
            ]
        )
    )
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # privilege separation directory
    proc = spawn([str(SSHD), "-D", "-e", "-f", str(config)], log)
    try:
        wait_started(proc, log, lambda: _greets(port), f"sshd on 127.0.0.1:{port}", 10)
        entry = f"[127.0.0.1]:{port}"
        pub = host_key.with_suffix(".pub").read_text().split()
        other = other_key.with_suffix(".pub").read_text().split()
        known = base / "known_hosts"
        known.write_text(f"{entry} {pub[0]} {pub[1]}\n")
        wrong = base / "known_hosts.wrong"
        wrong.write_text(f"{entry} {other[0]} {other[1]}\n")
        empty = base / "known_hosts.empty"
        empty.write_text("")
        yield Sshd("127.0.0.1", port, user, user_key, known, wrong, empty, log)
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@pytest.fixture
def ssh_target(sshd: Sshd) -> SshEndpoint:
    return sshd.target()
