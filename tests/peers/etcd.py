"""Debian's etcd (``etcd-server``, 3.4) as a three-member cluster on loopback.

One cluster serves the whole test session (three members start in a few seconds, and a
test per cluster would spend most of its time starting them); between tests the
``etcd`` fixture brings every member back (a test may have stopped or paused some) and
deletes the test's own key prefix (``/upsguard/<site>/``, each test with its own site).

Members are named ``m1``..``m3``, each with its own data dir and two free ports chosen at
run time. A member is ready when ``etcdctl endpoint health`` answers through it: that is
a linearizable read, so it also says the cluster has a leader (TEST-PEERS.md, etcd). The
helpers act on one member's process: ``stop`` (SIGTERM, as systemd stops it), ``pause``
(SIGSTOP: the process keeps its sockets but answers nothing, the stand-in for a
partitioned machine), ``resume`` (SIGCONT) and ``start`` again on the same data dir.

``start_cluster(..., tls=mutual_tls(dir))`` serves the client port over TLS and asks every
client for a certificate signed by the CA (``--client-cert-auth``); the peer port stays
plain (it is loopback, and the store under test never sees it).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from tests.peers.ports import free_port
from tests.peers.process import end_process
from tests.peers.tls import MutualTls

ETCD = "/usr/bin/etcd"
ETCDCTL = "/usr/bin/etcdctl"
MEMBERS = 3
START_WITHIN_S = 30.0


def require_etcd() -> None:
    for binary in (ETCD, ETCDCTL):
        if not Path(binary).exists():
            pytest.fail(f"{binary} is missing: run scripts/setup --tests (installs etcd-server)")


@dataclass
class Member:
    name: str
    client_port: int
    peer_port: int
    data_dir: Path
    log: Path
    process: subprocess.Popen[bytes] | None = None
    paused: bool = False
    scheme: str = "http"

    @property
    def client_url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self.client_port}"

    @property
    def peer_url(self) -> str:
        return f"http://127.0.0.1:{self.peer_port}"

    @property
    def running(self) -> bool:
        return self.process is not None and self.process.poll() is None


@dataclass
class EtcdCluster:
    """Three members on loopback; ``endpoints`` in the site file's form (client URLs)."""

    root: Path
    members: list[Member] = field(default_factory=list)
    flags: tuple[str, ...] = ()
    """More flags for every member (``--auth-token-ttl 1``)."""
    tls: MutualTls | None = None
    """The client port's certificates; clients must show one the CA signed."""

    @property
    def endpoints(self) -> list[str]:
        return [m.client_url for m in self.members]

    @property
    def initial_cluster(self) -> str:
        return ",".join(f"{m.name}={m.peer_url}" for m in self.members)

    def member(self, index: int) -> Member:
        return self.members[index]

    # -- life of one member --------------------------------------------------------------

    def start(self, index: int) -> None:
        """Start a member (again, on its own data dir); returns at once: see ``wait_ready``."""
        member = self.members[index]
        if member.running:
            return
        member.data_dir.mkdir(parents=True, exist_ok=True)
        command = [
            ETCD,
            "--name",
            member.name,
            "--data-dir",
            str(member.data_dir),
            "--listen-client-urls",
            member.client_url,
            "--advertise-client-urls",
            member.client_url,
            "--listen-peer-urls",
            member.peer_url,
            "--initial-advertise-peer-urls",
            member.peer_url,
            "--initial-cluster",
            self.initial_cluster,
            "--initial-cluster-state",
            "new",
            "--initial-cluster-token",
            f"upsguard-tests-{os.getpid()}",
            "--logger",
            "zap",
            "--log-outputs",
            "stderr",
            *self._tls_flags(),
            *self.flags,
        ]
        with member.log.open("ab") as log:
            member.process = subprocess.Popen(
                command, stdout=log, stderr=subprocess.STDOUT, cwd=self.root
            )
        member.paused = False

    def _tls_flags(self) -> list[str]:
        if self.tls is None:
            return []
        return [
            "--cert-file",
            str(self.tls.server_cert),
            "--key-file",
            str(self.tls.server_key),
            "--trusted-ca-file",
            str(self.tls.ca),
            "--client-cert-auth",
        ]

    def stop(self, index: int) -> None:
        """SIGTERM, as a machine shutting down stops it; waits for the process to end."""
        member = self.members[index]
        if member.process is None:
            return
        if member.paused:
            self.resume(index)
        end_process(member.process, within=15)
        member.process = None

    def pause(self, index: int) -> None:
        """SIGSTOP: its sockets stay open and nothing answers (a partitioned machine)."""
        member = self.members[index]
        assert member.process is not None and member.running, f"{member.name} is not running"
        member.process.send_signal(signal.SIGSTOP)
        member.paused = True

    def resume(self, index: int) -> None:
        member = self.members[index]
        if member.process is not None and member.paused:
            member.process.send_signal(signal.SIGCONT)
        member.paused = False

    def restart(self, index: int) -> None:
        self.stop(index)
        self.start(index)
        self.wait_ready([index])

    # -- readiness and reset --------------------------------------------------------------

    def etcdctl(self, *args: str, endpoints: list[str] | None = None) -> subprocess.Popen[str]:
        env = {**os.environ, "ETCDCTL_API": "3"}
        tls = self.tls
        credentials = (
            []
            if tls is None
            else [
                "--cacert",
                str(tls.ca),
                "--cert",
                str(tls.client_cert),
                "--key",
                str(tls.client_key),
            ]
        )
        return subprocess.Popen(
            [ETCDCTL, "--endpoints", ",".join(endpoints or self.endpoints), *credentials, *args],
            env=env,
            stdin=subprocess.PIPE,  # what a command reads (a password), via communicate
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )

    def answers(self, index: int) -> bool:
        """A linearizable read through this member succeeds: it runs and the cluster leads."""
        check = self.etcdctl(
            "--command-timeout",
            "2s",
            "endpoint",
            "health",
            endpoints=[self.member(index).client_url],
        )
        try:
            check.communicate(timeout=5)
        except subprocess.TimeoutExpired:
            check.kill()
            check.communicate()
            return False
        return check.returncode == 0

    def wait_ready(self, indexes: list[int] | None = None, within: float = START_WITHIN_S) -> None:
        chosen = list(range(len(self.members))) if indexes is None else indexes
        deadline = time.monotonic() + within
        waiting = set(chosen)
        while waiting and time.monotonic() < deadline:
            for index in sorted(waiting):
                member = self.members[index]
                if not member.running:
                    pytest.fail(f"etcd {member.name} exited at start: {self.tail(index)}")
                if self.answers(index):
                    waiting.discard(index)
            if waiting:
                time.sleep(0.1)
        if waiting:
            names = ", ".join(self.members[i].name for i in sorted(waiting))
            pytest.fail(f"etcd {names} not ready within {within:g}s: {self.tail(min(waiting))}")

    def tail(self, index: int) -> str:
        log = self.members[index].log
        return log.read_text(errors="replace")[-2000:] if log.exists() else "(no log)"

    def heal(self) -> None:
        """Every member running and answering again (after a test stopped or paused some)."""
        broken = []
        for index, member in enumerate(self.members):
            if member.paused:
                self.resume(index)
            if not member.running:
                self.start(index)
            broken.append(index)
        self.wait_ready(broken)

    def delete_prefix(self, prefix: str) -> None:
        done = self.etcdctl("--command-timeout", "5s", "del", "--prefix", prefix)
        out, _ = done.communicate(timeout=15)
        assert done.returncode == 0, f"etcdctl del --prefix {prefix}: {out}"

    def close(self) -> None:
        for index in range(len(self.members)):
            self.stop(index)


def start_cluster(
    root: Path,
    members: int = MEMBERS,
    flags: tuple[str, ...] = (),
    tls: MutualTls | None = None,
) -> EtcdCluster:
    """Ports are chosen free at run time; one taken by another process between the choice
    and the member's bind (the kernel hands ports out again, to a test's outgoing
    connections too) is chosen anew, twice at most."""
    require_etcd()
    root.mkdir(parents=True, exist_ok=True)
    scheme = "http" if tls is None else "https"
    for attempt in range(BIND_ATTEMPTS):
        cluster = EtcdCluster(root, flags=flags, tls=tls)
        for n in range(1, members + 1):
            name = f"m{n}"
            data, log = root / f"{name}.data", root / f"{name}.log"
            shutil.rmtree(data, ignore_errors=True)
            member = Member(name, free_port(), free_port(), data, log, scheme=scheme)
            cluster.members.append(member)
        try:
            for index in range(members):
                cluster.start(index)
            cluster.wait_ready()
        except pytest.fail.Exception as exc:
            cluster.close()
            if "address already in use" not in str(exc) or attempt == BIND_ATTEMPTS - 1:
                raise
            continue
        except BaseException:
            cluster.close()
            raise
        return cluster
    raise AssertionError("unreachable")


ROOT_PASSWORD = "root-pw"


def start_guarded(
    root: Path, token: str, user: str, password: str, prefix: str, flags: tuple[str, ...] = ()
) -> EtcdCluster:
    """One member with etcd's authentication on (``token``: its ``--auth-token``; ``flags``:
    more of them): ``user`` may read and write under ``prefix`` only, through a role of the
    same name; etcd's root user (``ROOT_PASSWORD``) changes users and roles."""
    cluster = start_cluster(root, members=1, flags=("--auth-token", token, *flags))
    for args in (
        ["user", "add", f"root:{ROOT_PASSWORD}"],
        ["user", "add", f"{user}:{password}"],
        ["role", "add", user],
        ["role", "grant-permission", user, "--prefix=true", "readwrite", prefix],
        ["user", "grant-role", user, user],
        ["auth", "enable"],
    ):
        done = cluster.etcdctl(*args)
        out, _ = done.communicate(timeout=15)
        if done.returncode != 0:
            cluster.close()
            raise AssertionError(f"etcdctl {args[0]} {args[1]}: {out}")
    return cluster


def jwt_token(directory: Path) -> str:
    """An ``--auth-token`` for JWT tokens, as etcd recommends for production: each token
    carries the revision of the users and roles it was issued at, and etcd refuses it
    once they change ("revision of auth store is old")."""
    key, public = directory / "jwt.key", directory / "jwt.pub"
    for args in (
        ["genpkey", "-algorithm", "RSA", "-pkeyopt", "rsa_keygen_bits:2048", "-out", key],
        ["pkey", "-in", key, "-pubout", "-out", public],
    ):
        subprocess.run(["openssl", *map(str, args)], check=True, capture_output=True)
    return f"jwt,pub-key={public},priv-key={key},sign-method=RS256,ttl=1h"


def as_root(cluster: EtcdCluster, *args: str, typed: str | None = None) -> None:
    """``etcdctl`` as etcd's root user (auth is on); ``typed``: its standard input."""
    done = cluster.etcdctl("--user", f"root:{ROOT_PASSWORD}", *args)
    out, _ = done.communicate(input=typed, timeout=15)
    assert done.returncode == 0, out


BIND_ATTEMPTS = 3


@pytest.fixture(scope="session")
def etcd_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EtcdCluster]:
    """The session's three-member cluster, started when a test first needs it."""
    cluster = start_cluster(tmp_path_factory.mktemp("etcd"))
    yield cluster
    cluster.close()
    shutil.rmtree(cluster.root, ignore_errors=True)


@dataclass(frozen=True)
class EtcdSite:
    """One test's view of the cluster: its own site name, hence its own key prefix."""

    cluster: EtcdCluster
    site: str

    @property
    def prefix(self) -> str:
        return f"/upsguard/{self.site}/"

    @property
    def endpoints(self) -> list[str]:
        return self.cluster.endpoints


@pytest.fixture
def etcd(etcd_cluster: EtcdCluster, request: pytest.FixtureRequest) -> Iterator[EtcdSite]:
    """The session's cluster with every member up, and a site name no other test uses;
    the site's keys are deleted after the test."""
    etcd_cluster.heal()
    site = EtcdSite(etcd_cluster, f"t{abs(hash(request.node.nodeid)) % 10**10}")
    etcd_cluster.delete_prefix(site.prefix)
    yield site
    etcd_cluster.heal()
    etcd_cluster.delete_prefix(site.prefix)
