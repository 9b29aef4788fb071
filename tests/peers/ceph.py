"""Debian's Ceph monitor (``ceph-mon``, 16.2) alone on loopback, and the ``ceph`` CLI against it.

No OSD and no mgr: a monitor alone keeps the OSD map, so ``osd set noout`` is set and read
back (``osd dump``) at a real monitor, which is what a Proxmox VE cluster's
``/cluster/ceph/flags`` does on its side (TEST-PEERS.md, Ceph monitors). No cephadm and no
systemd: a ``ceph.conf``, a keyring, a monmap and ``ceph-mon --mkfs`` in a temp dir, then
``ceph-mon -i a -f`` on a port chosen free at run time (msgr2 only).

Every ``ceph`` command runs under a timeout: commands that go to a mgr hang forever
without one, and a monitor that lost its quorum answers nothing.
"""

from __future__ import annotations

import json
import subprocess
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.peers.ports import free_port
from tests.peers.process import end_process, spawn, wait_started

CEPH_MON = "/usr/bin/ceph-mon"
CEPH = "/usr/bin/ceph"
CLI_TIMEOUT_S = 10
START_WITHIN_S = 30.0
SETTABLE = frozenset({
    "pause", "noup", "nodown", "noout", "noin", "nobackfill", "norebalance", "norecover",
    "noscrub", "nodeep-scrub", "notieragent", "nosnaptrim",
})  # fmt: skip
"""The flags ``osd set`` takes; the OSD map also carries flags of its own (``sortbitwise``)."""


class CephCliError(Exception):
    """The ``ceph`` CLI failed or did not answer within its timeout; the text says which."""


def require_ceph() -> None:
    for binary in (CEPH_MON, CEPH, "/usr/bin/monmaptool", "/usr/bin/ceph-authtool"):
        if not Path(binary).exists():
            pytest.fail(
                f"{binary} is missing: apt-get install --no-install-recommends ceph-mon "
                "ceph-common (scripts/apt-packages.txt)"
            )


@dataclass
class CephMonitor:
    """One monitor ``a`` and the admin's ``conf`` and ``keyring`` to reach it."""

    root: Path
    port: int
    process: subprocess.Popen[bytes] | None = None

    @property
    def conf(self) -> Path:
        return self.root / "ceph.conf"

    @property
    def keyring(self) -> Path:
        return self.root / "admin.keyring"

    def ceph(self, *args: str) -> str:
        """``ceph ARGS`` as client.admin, under a timeout; its stdout. Raises ``CephCliError``."""
        argv = [CEPH, "-c", str(self.conf), "-k", str(self.keyring), *args]
        try:
            done = subprocess.run(
                argv, capture_output=True, text=True, timeout=CLI_TIMEOUT_S, check=False
            )
        except subprocess.TimeoutExpired as exc:
            raise CephCliError(f"ceph {' '.join(args)}: no answer in {CLI_TIMEOUT_S}s") from exc
        if done.returncode != 0:
            raise CephCliError(f"ceph {' '.join(args)}: {done.stderr.strip()[-300:]}")
        return done.stdout

    def flags(self) -> set[str]:
        """The OSD map's flags as the monitor keeps them."""
        dump = json.loads(self.ceph("osd", "dump", "-f", "json"))
        return {f for f in str(dump.get("flags", "")).split(",") if f}

    def set_flag(self, flag: str, value: bool) -> None:
        self.ceph("osd", "set" if value else "unset", flag)

    def start(self) -> None:
        log = self.root / "mon.out"
        self.process = spawn([CEPH_MON, "-c", str(self.conf), "-i", "a", "-f"], log)
        wait_started(self.process, log, self._answers, "ceph-mon", START_WITHIN_S, pause=0.2)

    def stop(self) -> None:
        if self.process is not None:
            end_process(self.process)
            self.process = None

    def _answers(self) -> bool:
        try:
            self.ceph("mon", "stat")
        except CephCliError:
            return False
        return True


def make_monitor(root: Path) -> CephMonitor:
    """A monitor's files in ``root``: conf, keyrings, monmap, its store (``--mkfs``)."""
    port = free_port()
    mon = CephMonitor(root, port)
    fsid = str(uuid.uuid4())
    (root / "run").mkdir()
    mon.conf.write_text(
        "[global]\n"
        f"fsid = {fsid}\n"
        f"mon host = v2:127.0.0.1:{port}\n"
        "mon initial members = a\n"
        "auth cluster required = cephx\nauth service required = cephx\n"
        "auth client required = cephx\n"
        f"keyring = {mon.keyring}\n"
        "ms bind msgr1 = false\n"
        f"run dir = {root}/run\n"
        f"admin socket = {root}/run/$name.asok\n"
        f"log file = {root}/$name.log\n"
        "mon data avail warn = 2\nmon data avail crit = 1\n"
        "[mon]\n"
        f"mon data = {root}/mon-$id\n"
    )
    mon_keyring = root / "mon.keyring"
    tool = "/usr/bin/ceph-authtool"
    _run(
        [
            tool,
            "--create-keyring",
            str(mon_keyring),
            "--gen-key",
            "-n",
            "mon.",
            "--cap",
            "mon",
            "allow *",
        ]
    )
    _run(
        [
            tool,
            "--create-keyring",
            str(mon.keyring),
            "--gen-key",
            "-n",
            "client.admin",
            "--cap",
            "mon",
            "allow *",
            "--cap",
            "osd",
            "allow *",
            "--cap",
            "mgr",
            "allow *",
        ]
    )
    _run([tool, str(mon_keyring), "--import-keyring", str(mon.keyring)])
    monmap = root / "monmap"
    _run(
        [
            "/usr/bin/monmaptool",
            "--create",
            "--fsid",
            fsid,
            "--addv",
            "a",
            f"[v2:127.0.0.1:{port}]",
            str(monmap),
        ]
    )
    _run(
        [
            CEPH_MON,
            "-c",
            str(mon.conf),
            "--mkfs",
            "-i",
            "a",
            "--monmap",
            str(monmap),
            "--keyring",
            str(mon_keyring),
        ]
    )
    return mon


def _run(argv: list[str]) -> None:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(argv[:2])} failed: {done.stderr[-1000:]}")


@pytest.fixture(scope="session")
def ceph_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CephMonitor]:
    """One monitor for the session (it starts in under a second, but its store takes a mkfs)."""
    require_ceph()
    mon = make_monitor(tmp_path_factory.mktemp("ceph"))
    mon.start()
    yield mon
    mon.stop()


@pytest.fixture
def ceph_monitor(ceph_session: CephMonitor) -> CephMonitor:
    """The session's monitor with no settable OSD flag set (a test may have left some)."""
    for flag in ceph_session.flags() & SETTABLE:
        ceph_session.set_flag(flag, False)
    return ceph_session
