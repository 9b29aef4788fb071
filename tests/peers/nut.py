"""Debian's NUT on loopback: ``/lib/nut/dummy-ups`` drivers playing data files, ``/lib/nut/upsd``.

Everything lives in a temp dir (``NUT_CONFPATH``, ``NUT_STATEPATH``, ``NUT_ALTPIDPATH``),
runs as root with ``-u root`` and listens on a free port. Facts relied on (TEST-PEERS.md):
a ``.seq`` file loops forever, a ``.dev`` file plays once and is re-read when its mtime
changes (in whole seconds); a change shows through upsd within one ``pollinterval``;
a killed driver gives ``ERR DRIVER-NOT-CONNECTED`` at once.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_port
from upsguard.config.ups import UpsConfig

NUT_BIN = Path("/lib/nut")
USERS = {
    "mon": ("mon-secret", "upsmon secondary"),
    "admin": ("admin-secret", "actions = SET FSD\n  instcmds = ALL\n  upsmon primary"),
    "upsguard": ("upsguard-secret", "actions = SET\n  instcmds = ALL\n  upsmon secondary"),
}
POLL_INTERVAL = 1


def require_nut() -> None:
    for binary in ("dummy-ups", "upsd"):
        if not (NUT_BIN / binary).exists():
            pytest.fail(f"{NUT_BIN / binary} is missing: run scripts/setup (installs nut-server)")


@dataclass
class NutServer:
    """One upsd with its dummy-ups drivers, each playing ``<root>/<name>.<ext>``."""

    root: Path
    port: int
    files: dict[str, Path]
    drivers: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    upsd: subprocess.Popen[bytes] | None = None
    ca_file: Path | None = None
    fake_drivers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """UPSes served by ``tests.peers.nut_driver`` (with these instant commands), not dummy-ups."""

    @property
    def env(self) -> dict[str, str]:
        return {
            **os.environ,
            "NUT_CONFPATH": str(self.root),
            "NUT_STATEPATH": str(self.root),
            "NUT_ALTPIDPATH": str(self.root),
        }

    def password_file(self, user: str) -> Path:
        return self.root / f"{user}.pw"

    def write(self, name: str, text: str) -> None:
        """Replace a UPS's data file atomically with an mtime a second later (dummy-ups compares
        whole seconds)."""
        path = self.files[name]
        old = path.stat().st_mtime if path.exists() else time.time()
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        stamp = max(time.time(), old + 1.0)
        os.utime(tmp, (stamp, stamp))
        tmp.replace(path)

    def start_driver(self, name: str) -> None:
        self.start_drivers([name])

    def start_drivers(self, names: list[str]) -> None:
        """Start the drivers all at once, then wait for each one's socket."""
        for name in names:
            log = (self.root / f"driver-{name}.log").open("ab")
            self.drivers[name] = subprocess.Popen(
                self._driver_argv(name),
                env=self.env,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=self.root,
            )
        for name in names:
            _wait_for(
                lambda n=name: (self.root / f"dummy-ups-{n}").exists(), f"driver {name} socket"
            )

    def _driver_argv(self, name: str) -> list[str]:
        if name not in self.fake_drivers:
            return [str(NUT_BIN / "dummy-ups"), "-a", name, "-u", "root", "-F"]
        argv = [sys.executable, str(Path(__file__).with_name("nut_driver.py"))]
        argv += ["--socket", str(self.root / f"dummy-ups-{name}"), "--data", str(self.files[name])]
        argv += ["--log", str(self.commands_file(name)), "--test-seconds", "2"]
        for command in self.fake_drivers[name]:
            argv += ["--command", command]
        return argv

    def commands_file(self, name: str) -> Path:
        return self.root / f"commands-{name}.log"

    def commands_received(self, name: str) -> list[str]:
        """What a stand-in driver (``fake_drivers``) was told, in order."""
        path = self.commands_file(name)
        return path.read_text().splitlines() if path.exists() else []

    def kill_driver(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.drivers.pop(name)
        proc.send_signal(sig)
        proc.wait(10)
        (self.root / f"dummy-ups-{name}").unlink(missing_ok=True)

    def start_upsd(self) -> None:
        log = (self.root / "upsd.log").open("ab")
        self.upsd = subprocess.Popen(
            [str(NUT_BIN / "upsd"), "-u", "root", "-F"],
            env=self.env,
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=self.root,
        )
        _wait_for(self._listening, "upsd listening")

    def kill_upsd(self) -> None:
        assert self.upsd is not None
        self.upsd.kill()
        self.upsd.wait(10)
        self.upsd = None

    def _listening(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), 0.2):
                return True
        except OSError:
            return False

    def get(self, name: str, var: str) -> str:
        """``upsc NAME VAR`` over the protocol: the value, or upsd's ``ERR ...`` line."""
        with socket.create_connection(("127.0.0.1", self.port), 2) as sock:
            sock.sendall(f"GET VAR {name} {var}\n".encode())
            line = sock.makefile("rb").readline().decode().strip()
        if line.startswith("VAR "):
            return line.split('"')[1]
        return line

    def wait_ready(self, *names: str, timeout: float = 20.0) -> None:
        for name in names or tuple(self.files):
            _wait_for(
                lambda n=name: (
                    self.get(n, "ups.status") not in ("WAIT", "")
                    and not (self.get(n, "ups.status").startswith("ERR"))
                ),
                f"UPS {name} ready",
                timeout,
            )

    def ups_config(
        self,
        name: str,
        site_name: str | None = None,
        entry: dict[str, Any] | None = None,
        **nut: Any,
    ) -> UpsConfig:
        """A site-file UPS entry for ``name`` on this upsd (``entry``: more keys of the entry)."""
        settings: dict[str, Any] = {"host": "127.0.0.1", "port": self.port, "ups": name}
        settings.update(nut)
        return UpsConfig.model_validate(
            {"name": site_name or name, "nut": settings, **(entry or {})}
        )

    def stop(self) -> None:
        for proc in [*self.drivers.values(), *([self.upsd] if self.upsd else [])]:
            if proc.poll() is None:
                proc.terminate()
        for proc in [*self.drivers.values(), *([self.upsd] if self.upsd else [])]:
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
        self.drivers.clear()
        self.upsd = None


def _wait_for(check: Any, what: str, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return
        time.sleep(0.1)
    raise AssertionError(f"NUT peer: {what} not reached within {timeout:g}s")


def start_nut(
    root: Path,
    upses: dict[str, str],
    ext: str = "seq",
    maxage: int = 5,
    timeout: float = 20.0,
    tls: bool = False,
    fake_drivers: dict[str, tuple[str, ...]] | None = None,
) -> NutServer:
    """Write the configuration, start one driver per UPS, then upsd; wait until all answer.
    ``fake_drivers``: UPSes played by ``tests.peers.nut_driver`` with those instant commands
    (dummy-ups offers only ``load.off``)."""
    require_nut()
    root.mkdir(parents=True, exist_ok=True)
    port = free_port()
    files = {name: root / f"{name}.{ext}" for name in upses}
    server = NutServer(root=root, port=port, files=files, fake_drivers=dict(fake_drivers or {}))
    sections = [f"pollinterval = {POLL_INTERVAL}\nmaxretry = 3\n"]
    for name, text in upses.items():
        server.write(name, text)
        sections.append(
            f'[{name}]\n  driver = dummy-ups\n  port = {files[name]}\n  desc = "test {name}"\n'
        )
    (root / "ups.conf").write_text("\n".join(sections))
    upsd_conf = f"LISTEN 127.0.0.1 {port}\nMAXAGE {maxage}\n"
    if tls:
        server.ca_file = make_nss_db(root)
        upsd_conf += f'CERTPATH {root / "nss"}\nCERTIDENT "upsd" "{NSS_DB_PASSWORD}"\n'
    (root / "upsd.conf").write_text(upsd_conf)
    users = []
    for user, (password, rights) in USERS.items():
        users.append(f"[{user}]\n  password = {password}\n  {rights}\n")
        server.password_file(user).write_text(password + "\n")
    (root / "upsd.users").write_text("\n".join(users))
    (root / "nut.conf").write_text("MODE=standalone\n")
    for path in (root / "upsd.users", root / "upsd.conf", root / "ups.conf"):
        path.chmod(0o600)
    try:
        server.start_drivers(list(upses))
        server.start_upsd()
        server.wait_ready(timeout=timeout)
    except BaseException:
        server.stop()
        raise
    return server


NSS_DB_PASSWORD = "nss-db-pass"


def make_ca_and_server_cert(root: Path) -> tuple[Path, bytes]:
    """A throw-away CA (PEM, for the client) and a server certificate for 127.0.0.1 with an IP
    subjectAltName, with its key, as PKCS#12 (for NSS)."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import rsa
    from cryptography.hazmat.primitives.serialization import pkcs12
    from cryptography.x509.oid import NameOID

    now = datetime.datetime.now(datetime.UTC)

    def named(cn: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])

    def builder(subject: str, issuer: x509.Name, key: rsa.RSAPrivateKey) -> x509.CertificateBuilder:
        return (
            x509.CertificateBuilder()
            .subject_name(named(subject))
            .issuer_name(issuer)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=1))
        )

    ca_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ca = (
        builder("upsguard test CA", named("upsguard test CA"), ca_key)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(ca_key, hashes.SHA256())
    )
    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    san = x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))])
    cert = builder("127.0.0.1", ca.subject, key).add_extension(san, critical=False)
    signed = cert.sign(ca_key, hashes.SHA256())
    ca_file = root / "ca.pem"
    ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    p12 = pkcs12.serialize_key_and_certificates(
        b"upsd", key, signed, [ca], serialization.BestAvailableEncryption(b"p12-pass")
    )
    return ca_file, p12


def make_nss_db(root: Path) -> Path:
    """upsd (Debian builds it with NSS) reads its certificate from an NSS database."""
    for tool in ("certutil", "pk12util"):
        if shutil.which(tool) is None:
            pytest.fail(f"{tool} is missing: run scripts/setup (installs libnss3-tools)")
    ca_file, p12 = make_ca_and_server_cert(root)
    db = root / "nss"
    db.mkdir()
    (root / "nss.pw").write_text(NSS_DB_PASSWORD + "\n")
    (root / "p12.pw").write_text("p12-pass\n")
    (root / "server.p12").write_bytes(p12)
    nss_pw, p12_pw = str(root / "nss.pw"), str(root / "p12.pw")
    for command in (
        ["certutil", "-N", "-d", f"sql:{db}", "-f", nss_pw],
        ["pk12util", "-i", str(root / "server.p12"), "-d", f"sql:{db}", "-w", p12_pw, "-k", nss_pw],
    ):
        subprocess.run(command, check=True, capture_output=True)
    return ca_file


ON_LINE = """\
ups.status: OL
battery.charge: 100
battery.runtime: 1800
ups.load: 35
input.voltage: 230.0
ups.delay.shutdown: 20
ups.delay.start: 30
"""


@pytest.fixture
def nut_factory(tmp_path: Path) -> Iterator[Any]:
    """Start NUT servers for one test: ``nut_factory({"ups1": text, ...}, ext="dev")``."""
    servers: list[NutServer] = []

    def start(
        upses: dict[str, str],
        ext: str = "seq",
        maxage: int = 5,
        tls: bool = False,
        fake_drivers: dict[str, tuple[str, ...]] | None = None,
    ) -> NutServer:
        root = tmp_path / f"nut{len(servers)}"
        server = start_nut(root, upses, ext, maxage, tls=tls, fake_drivers=fake_drivers)
        servers.append(server)
        return server

    yield start
    for server in servers:
        server.stop()


@pytest.fixture(scope="module")
def nut_pair(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NutServer]:
    """Two on-line UPSes on one upsd, shared by a module's read-only tests."""
    server = start_nut(
        tmp_path_factory.mktemp("nut-pair"),
        {"ups1": ON_LINE, "ups2": ON_LINE.replace("35", "60")},
        ext="dev",
    )
    yield server
    server.stop()
