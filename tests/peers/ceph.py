"""Debian's Ceph (16.2) on loopback: monitors (``ceph-mon``, one or three), OSDs (``ceph-osd``
with the memstore object store) and the ``ceph`` CLI.

No mgr: the monitors keep the OSD map, so ``osd set noout`` is set and read back
(``osd dump``) at real monitors, which is what a Proxmox VE cluster's ``/cluster/ceph/flags``
does on its side, and ``ceph status`` answers without one (TEST-PEERS.md, Ceph monitors). No
cephadm and no systemd: a ``ceph.conf``, a keyring, a monmap and ``ceph-mon --mkfs`` per
monitor in a temp dir, then ``ceph-mon -i ID -f`` each on a port chosen free at run time
(msgr2 only). With three, one stopped leaves a quorum (two of three); two stopped leave none,
and the ``ceph`` CLI gets no answer.

OSDs are registered as Ceph's manual deployment does it (``ceph osd new`` with a cephx key,
then ``ceph-osd --mkfs``): from then on they are in, and down until their daemon runs
(``ceph-osd -i N -f``), which boots and is marked up in a second or two. Their store is
memstore (in memory, no disk to prepare); an OSD stopped with SIGTERM tells the monitors it
goes down, as a node's shutdown stops it.

Every ``ceph`` command runs under a timeout: commands that go to a mgr hang forever
without one, and a monitor that lost its quorum answers nothing.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_port
from tests.peers.process import end_process, spawn, wait_started

CEPH_MON = "/usr/bin/ceph-mon"
CEPH_OSD = "/usr/bin/ceph-osd"
CEPH = "/usr/bin/ceph"
AUTHTOOL = "/usr/bin/ceph-authtool"
CLI_TIMEOUT_S = 10
START_WITHIN_S = 30.0
SETTABLE = frozenset({
    "pause", "noup", "nodown", "noout", "noin", "nobackfill", "norebalance", "norecover",
    "noscrub", "nodeep-scrub", "notieragent", "nosnaptrim",
})  # fmt: skip
"""The flags ``osd set`` takes; the OSD map also carries flags of its own (``sortbitwise``)."""


class CephCliError(Exception):
    """The ``ceph`` CLI failed or did not answer within its timeout; the text says which."""


def require_ceph(osds: bool = False) -> None:
    binaries = (CEPH_MON, CEPH, "/usr/bin/monmaptool", AUTHTOOL, *([CEPH_OSD] if osds else []))
    for binary in binaries:
        if not Path(binary).exists():
            pytest.fail(
                f"{binary} is missing: apt-get install --no-install-recommends ceph-mon "
                "ceph-common ceph-osd (scripts/apt-packages.txt)"
            )


@dataclass
class CephMonitor:
    """The monitors (``a``, or ``a``, ``b``, ``c``), the OSDs registered with them (none
    unless ``add_osds``), and the admin's ``conf`` and ``keyring`` to reach them."""

    root: Path
    ports: dict[str, int]
    processes: dict[str, subprocess.Popen[bytes]] = field(default_factory=dict)
    osds: dict[int, str] = field(default_factory=dict)
    """Each OSD registered: its uuid."""
    osd_processes: dict[int, subprocess.Popen[bytes]] = field(default_factory=dict)

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

    def status(self) -> dict[str, Any]:
        """Ceph's status as PVE's ``GET /cluster/ceph/status`` answers it: pve-manager's
        ``PVE::Ceph::Tools::ceph_cluster_status`` is the monitors' ``status`` with ``health``
        replaced by ``health detail``, and, since Octopus left the monitors' list out of
        ``status``, ``monmap`` and ``mgrmap`` replaced by ``mon dump`` and ``mgr dump``."""
        status: dict[str, Any] = json.loads(self.ceph("status", "-f", "json"))
        status["health"] = json.loads(self.ceph("health", "detail", "-f", "json"))
        if "mons" not in status.get("monmap", {}):
            status["monmap"] = json.loads(self.ceph("mon", "dump", "-f", "json"))
            status["mgrmap"] = json.loads(self.ceph("mgr", "dump", "-f", "json"))
        return status

    def add_osds(self, count: int) -> list[int]:
        """Register ``count`` OSDs as Ceph's manual deployment does (``ceph osd new`` with a
        cephx key, the OSD's keyring, ``ceph-osd --mkfs``): each is in, and down until
        ``start_osds``."""
        added = []
        for _ in range(count):
            key = _run([AUTHTOOL, "--gen-print-key"]).strip()
            osd_uuid = str(uuid.uuid4())
            secret = self.root / "osd-secret.json"
            secret.write_text(json.dumps({"cephx_secret": key}))
            osd = int(self.ceph("osd", "new", osd_uuid, "-i", str(secret)))
            secret.unlink()
            data = self.root / f"osd-{osd}"
            data.mkdir()
            keyring = str(data / "keyring")
            _run([AUTHTOOL, "--create-keyring", keyring, "--name", f"osd.{osd}", "--add-key", key])
            conf = str(self.conf)
            _run([CEPH_OSD, "-c", conf, "-i", str(osd), "--mkfs", "--osd-uuid", osd_uuid])
            self.osds[osd] = osd_uuid
            added.append(osd)
        return added

    def start_osds(self, *ids: int) -> None:
        """Start the OSD daemons ``ids`` (all by default), then wait until the monitors
        have marked each one up."""
        wanted = ids or tuple(self.osds)
        for i in wanted:
            log = self.root / f"osd.{i}.out"
            self.osd_processes[i] = spawn([CEPH_OSD, "-c", str(self.conf), "-i", str(i), "-f"], log)
        for i in wanted:
            log = self.root / f"osd.{i}.out"
            up = functools.partial(self._osd_up, i)
            wait_started(self.osd_processes[i], log, up, f"osd.{i}", START_WITHIN_S, pause=0.2)

    def stop_osds(self, *ids: int) -> None:
        """Stop the OSD daemons ``ids`` (all running by default) with SIGTERM, as a node's
        shutdown does, then wait until the monitors have marked each one down (an OSD
        stopping tells them so)."""
        stopped = ids or tuple(self.osd_processes)
        for i in stopped:
            process = self.osd_processes.pop(i, None)
            if process is not None:
                end_process(process)
        deadline = time.monotonic() + START_WITHIN_S
        while any(self._osd_up(i) for i in stopped):
            if time.monotonic() > deadline:
                raise AssertionError(f"OSDs {stopped} are not marked down in time")
            time.sleep(0.2)

    def _osd_up(self, osd: int) -> bool:
        dump = json.loads(self.ceph("osd", "dump", "-f", "json"))
        return any(o.get("osd") == osd and o.get("up") == 1 for o in dump.get("osds", []))

    def start(self, *ids: str) -> None:
        """Start the monitors ``ids`` (all by default), then wait until the cluster answers
        (three monitors answer once two of them have formed a quorum)."""
        logs = {i: self.root / f"mon-{i}.out" for i in ids or self.ports}
        for i, log in logs.items():
            self.processes[i] = spawn([CEPH_MON, "-c", str(self.conf), "-i", i, "-f"], log)
        for i, log in logs.items():
            wait_started(
                self.processes[i], log, self._answers, "ceph-mon", START_WITHIN_S, pause=0.2
            )

    def stop(self, *ids: str) -> None:
        """Stop the monitors ``ids`` (all by default)."""
        for i in ids or list(self.processes):
            process = self.processes.pop(i, None)
            if process is not None:
                end_process(process)

    def wait_for_quorum(self) -> None:
        """Until the monitors running are the quorum, or, fewer than a majority running,
        until there is none. A monitor stopped makes the others elect again (some seconds):
        meanwhile they still answer reads from the old quorum, and a write waits."""
        running = sorted(self.processes)
        wanted = running if 2 * len(running) > len(self.ports) else []
        deadline = time.monotonic() + START_WITHIN_S
        while self._quorum() != wanted:
            if time.monotonic() > deadline:
                raise AssertionError(f"the Ceph quorum is not {wanted or 'gone'} in time")
            time.sleep(0.2)

    def _quorum(self) -> list[str]:
        try:
            status = json.loads(self.ceph("quorum_status", "-f", "json"))
        except (CephCliError, ValueError):
            return []
        return sorted(status.get("quorum_names", []))

    def _answers(self) -> bool:
        try:
            self.ceph("mon", "stat")
        except CephCliError:
            return False
        return True


def make_monitor(root: Path, ids: tuple[str, ...] = ("a",)) -> CephMonitor:
    """The monitors' files in ``root``: conf, keyrings, monmap, each one's store (``--mkfs``)."""
    mon = CephMonitor(root, {i: free_port() for i in ids})
    fsid = str(uuid.uuid4())
    (root / "run").mkdir()
    hosts = ",".join(f"v2:127.0.0.1:{port}" for port in mon.ports.values())
    mon.conf.write_text(
        "[global]\n"
        f"fsid = {fsid}\n"
        f"mon host = {hosts}\n"
        f"mon initial members = {', '.join(ids)}\n"
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
        "[osd]\n"
        f"osd data = {root}/osd-$id\n"
        f"keyring = {root}/osd-$id/keyring\n"
        "osd objectstore = memstore\n"
    )
    mon_keyring = root / "mon.keyring"
    tool = AUTHTOOL
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
    added = [
        arg for i, port in mon.ports.items() for arg in ("--addv", i, f"[v2:127.0.0.1:{port}]")
    ]
    _run(["/usr/bin/monmaptool", "--create", "--fsid", fsid, *added, str(monmap)])
    for i in ids:
        _run(
            [
                CEPH_MON,
                "-c",
                str(mon.conf),
                "--mkfs",
                "-i",
                i,
                "--monmap",
                str(monmap),
                "--keyring",
                str(mon_keyring),
            ]
        )
    return mon


def _run(argv: list[str]) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    if done.returncode != 0:
        pytest.fail(f"{' '.join(argv[:2])} failed: {done.stderr[-1000:]}")
    return done.stdout


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


@pytest.fixture(scope="session")
def ceph_osd_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[CephMonitor]:
    """A monitor with three OSDs registered, for the session (each test starts the OSDs it
    wants up)."""
    require_ceph(osds=True)
    ceph = make_monitor(tmp_path_factory.mktemp("ceph-osds"))
    ceph.start()
    ceph.add_osds(3)
    yield ceph
    ceph.stop_osds()
    ceph.stop()


@pytest.fixture
def ceph_osds(ceph_osd_session: CephMonitor) -> Iterator[CephMonitor]:
    """The session's monitor and its three OSDs, all down (no daemon running) and in, with
    no settable OSD flag set; the OSDs a test started are stopped after it. They are marked in
    again first: down for ``mon osd down out interval`` (10 minutes) without ``noout``, an
    OSD that has run is marked out, and a long session may leave them down that long."""
    ceph = ceph_osd_session
    for flag in ceph.flags() & SETTABLE:
        ceph.set_flag(flag, False)
    ceph.ceph("osd", "in", *(str(i) for i in ceph.osds))
    yield ceph
    ceph.stop_osds()
