"""Debian's NUT on loopback: ``/lib/nut/dummy-ups`` drivers playing data files, ``/lib/nut/upsd``.

Everything lives in a temp dir (``NUT_CONFPATH``, ``NUT_STATEPATH``, ``NUT_ALTPIDPATH``),
runs as root with ``-u root`` and listens on a free port. Facts relied on (TEST-PEERS.md):
a ``.seq`` file loops forever, a ``.dev`` file plays once and is re-read when its mtime
changes (in whole seconds); a change shows through upsd within one ``pollinterval``;
a killed driver gives ``ERR DRIVER-NOT-CONNECTED`` at once.

A server takes about 3 s to start (a second for the drivers' sockets, two more until upsd
serves their data) and almost no CPU. The session keeps the servers its tests started in a
pool (``NutPool``) and hands one to the next test that asks for the same UPS names, file kind,
``MAXAGE`` and TLS, reset to that test's data files, which takes about a second. The reset
is checked, not assumed: upsd must serve exactly the new files' variables (beside the ones
the driver adds itself), with no FSD and no client still connected, or the server is stopped
and a new one started. Where nothing can be checked or put back, a test always gets a new
server: ``.seq`` files and scripts with ``TIMER`` lines (a driver sleeping in a TIMER ignores
a changed file), stand-in drivers (``fake_drivers``: they log the commands they were sent),
and a server a test killed or stopped a process of, or set FSD on (upsd keeps FSD until it
restarts).
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
from tests.peers.process import spawn, wait_started
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
    #: per UPS, the variables its driver serves beside those of its data file
    own: dict[str, frozenset[str]] = field(default_factory=dict)
    fake_drivers: dict[str, tuple[str, ...]] = field(default_factory=dict)
    """UPSes served by ``tests.peers.nut_driver`` (with these instant commands), not dummy-ups."""
    signalled: bool = False
    """A test killed or stopped upsd or a driver (and maybe started it again): never handed to
    another test. Started again, it looks well, but a dummy-ups that outlived its upsd aborts at
    a later write (NUT 2.8.0: "bit out of range 0 - FD_SETSIZE"), in the middle of that test."""

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
            self.drivers[name] = spawn(
                self._driver_argv(name),
                self.root / f"driver-{name}.log",
                env=self.env,
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

    def signal_driver(self, name: str, sig: int) -> None:
        self.signalled = True
        self.drivers[name].send_signal(sig)

    def kill_driver(self, name: str, sig: int = signal.SIGKILL) -> None:
        self.signal_driver(name, sig)
        self.drivers.pop(name).wait(10)
        (self.root / f"dummy-ups-{name}").unlink(missing_ok=True)

    def start_upsd(self) -> None:
        """Start upsd and wait until it listens on ``port`` itself: another process on the
        port (one that took it first) would answer a bare connect as well."""
        log = self.root / "upsd.log"
        self.upsd = spawn(
            [str(NUT_BIN / "upsd"), "-u", "root", "-F"], log, env=self.env, cwd=self.root
        )
        wait_started(self.upsd, log, self._upsd_listens, "upsd", within=20)

    def kill_upsd(self) -> None:
        self.signalled = True
        assert self.upsd is not None
        self.upsd.kill()
        self.upsd.wait(10)
        self.upsd = None

    def _upsd_listens(self) -> bool:
        """Whether the socket listening on ``port`` is one of upsd's (from /proc)."""
        assert self.upsd is not None
        listening = {
            fields[9]
            for fields in (line.split() for line in _tcp_table())
            if int(fields[1].split(":")[1], 16) == self.port and fields[3] == "0A"
        }
        try:
            fds = list(Path(f"/proc/{self.upsd.pid}/fd").iterdir())
            owned = {os.readlink(fd) for fd in fds}
        except OSError:
            return False
        return any(f"socket:[{inode}]" in owned for inode in listening)

    def get(self, name: str, var: str) -> str:
        """``upsc NAME VAR`` over the protocol: the value, or upsd's ``ERR ...`` line."""
        with socket.create_connection(("127.0.0.1", self.port), 2) as sock:
            sock.sendall(f"GET VAR {name} {var}\n".encode())
            line = sock.makefile("rb").readline().decode().strip()
        if line.startswith("VAR "):
            return line.split('"')[1]
        return line

    def variables(self, name: str) -> dict[str, str]:
        """``LIST VAR NAME``: every variable upsd serves for the UPS (none on an error)."""
        found: dict[str, str] = {}
        with socket.create_connection(("127.0.0.1", self.port), 2) as sock:
            sock.sendall(f"LIST VAR {name}\n".encode())
            for raw in sock.makefile("rb"):
                line = raw.decode().strip()
                if line.startswith("VAR "):
                    _, _, var, quoted = line.split(" ", 3)
                    found[var] = quoted[1:-1].replace('\\"', '"').replace("\\\\", "\\")
                elif not line.startswith("BEGIN "):
                    return found  # END LIST VAR, or ERR ...
        return found

    def connections(self) -> int:
        """TCP connections established to upsd now (from /proc/net/tcp)."""
        count = 0
        for line in _tcp_table():
            fields = line.split()
            if int(fields[2].split(":")[1], 16) == self.port and fields[3] == "01":
                count += 1
        return count

    def serves(self, name: str, text: str) -> bool:
        """Whether upsd serves what the data file ``text`` sets, and nothing left over."""
        want, now = data_of(text), self.variables(name)
        if want is None or "FSD" in now.get("ups.status", "").split():
            return False
        extra = set(now) - set(want)
        return extra == self.own.get(name, extra) and all(now.get(k) == v for k, v in want.items())

    def alive(self) -> bool:
        """Whether upsd and every driver run (not killed, not stopped with SIGSTOP)."""
        procs = [self.upsd, *self.drivers.values()]
        return len(self.drivers) == len(self.files) and all(
            proc is not None and proc.poll() is None and _process_state(proc.pid) != "T"
            for proc in procs
        )

    def put_back(self, upses: dict[str, str], within: float = 5.0) -> bool:
        """Play ``upses`` as a new server would: True once upsd serves exactly their
        variables and no client is connected, False if that is not so within ``within`` s."""
        if not self.alive() or set(upses) != set(self.files):
            return False
        if any(data_of(text) is None for text in upses.values()):
            return False
        for name, text in upses.items():
            if self.files[name].read_text() != text or not self.serves(name, text):
                self.write(name, text)
        deadline = time.monotonic() + within
        while time.monotonic() < deadline:
            if self.connections() == 0 and all(self.serves(n, t) for n, t in upses.items()):
                return True
            time.sleep(0.1)
        return False

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


def data_of(text: str) -> dict[str, str] | None:
    """The variables a dummy-ups data file sets, or None for a script (it has TIMER lines)."""
    found: dict[str, str] = {}
    for line in text.splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("TIMER"):
            return None
        var, _, value = line.partition(":")
        found[var.strip()] = value.strip()
    return found


def _tcp_table() -> list[str]:
    """The lines of /proc/net/tcp below its heading: local address, state, inode, ..."""
    return Path("/proc/net/tcp").read_text().splitlines()[1:]


def _process_state(pid: int) -> str:
    """The state letter of ``/proc/PID/stat`` (``T``: stopped), or ``X`` when it is gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return "X"


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
    (dummy-ups offers only ``load.off``). A port another process took between its choice
    and upsd's bind (the kernel hands ports out again, to other workers' peers too) is chosen
    anew, twice at most."""
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
    upsd_tls = ""
    if tls:
        server.ca_file = make_nss_db(root)
        upsd_tls = f'CERTPATH {root / "nss"}\nCERTIDENT "upsd" "{NSS_DB_PASSWORD}"\n'

    def listen_on(port: int) -> None:
        server.port = port
        (root / "upsd.conf").write_text(f"LISTEN 127.0.0.1 {port}\nMAXAGE {maxage}\n{upsd_tls}")

    listen_on(port)
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
        for attempt in range(BIND_ATTEMPTS):
            try:
                server.start_upsd()
                break
            except pytest.fail.Exception as exc:
                if "not listening on" not in str(exc) or attempt == BIND_ATTEMPTS - 1:
                    raise
            listen_on(free_port())
        server.wait_ready(timeout=timeout)
    except BaseException:
        server.stop()
        raise
    return server


BIND_ATTEMPTS = 3
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


class NutPool:
    """The session's NUT servers (per xdist worker), each used by one test at a time; see the
    module's docstring for when a server is reset and when a new one starts instead."""

    def __init__(self, base: Path) -> None:
        self.base = base
        self.idle: dict[tuple[str, int, bool, tuple[str, ...]], list[NutServer]] = {}
        self.keys: dict[int, tuple[str, int, bool, tuple[str, ...]]] = {}
        self.started = 0

    def take(
        self,
        upses: dict[str, str],
        ext: str,
        maxage: int,
        tls: bool,
        fake_drivers: dict[str, tuple[str, ...]],
    ) -> NutServer:
        key = (ext, maxage, tls, tuple(sorted(upses)))
        idle = self.idle.get(key, []) if ext == "dev" and not fake_drivers else []
        while idle:
            server = idle.pop()
            if server.put_back(upses):
                return server
            self._forget(server)
        self.started += 1
        root = self.base / f"nut{self.started}"
        server = start_nut(root, upses, ext, maxage, tls=tls, fake_drivers=fake_drivers)
        for name, text in upses.items():
            want = data_of(text)
            if want is not None:
                server.own[name] = frozenset(set(server.variables(name)) - set(want))
        self.keys[id(server)] = key
        return server

    def give_back(self, server: NutServer) -> None:
        if server.alive() and not server.fake_drivers and not server.signalled:
            self.idle.setdefault(self.keys[id(server)], []).append(server)
        else:
            self._forget(server)

    def _forget(self, server: NutServer) -> None:
        server.stop()
        del self.keys[id(server)]

    def close(self) -> None:
        for servers in self.idle.values():
            for server in servers:
                server.stop()


@pytest.fixture(scope="session")
def nut_pool(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NutPool]:
    pool = NutPool(tmp_path_factory.mktemp("nut"))
    yield pool
    pool.close()


@pytest.fixture
def nut_factory(nut_pool: NutPool) -> Iterator[Any]:
    """NUT servers for one test: ``nut_factory({"ups1": text, ...}, ext="dev")``, reset from
    the session's pool or started anew (module docstring); given back after the test."""
    taken: list[NutServer] = []

    def start(
        upses: dict[str, str],
        ext: str = "seq",
        maxage: int = 5,
        tls: bool = False,
        fake_drivers: dict[str, tuple[str, ...]] | None = None,
    ) -> NutServer:
        server = nut_pool.take(upses, ext, maxage, tls, fake_drivers or {})
        taken.append(server)
        return server

    yield start
    for server in taken:
        nut_pool.give_back(server)


@pytest.fixture
def nut_pair(nut_factory: Any) -> NutServer:
    """Two on-line UPSes on one upsd (loads 35 % and 60 %), from the session's pool."""
    server: NutServer = nut_factory(
        {"ups1": ON_LINE, "ups2": ON_LINE.replace("35", "60")}, ext="dev"
    )
    return server
