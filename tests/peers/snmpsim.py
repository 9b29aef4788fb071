"""snmpsim (PyPI) on loopback, serving the UPS-MIB and PowerNet data of tests/fixtures/snmp/.

Each ``*.snmprec`` is one agent: its stem is the v1/v2c community and the SNMPv3 context.
Values change when a file is replaced with a newer mtime (snmpsim compares whole seconds on
every request), which ``SnmpSim.set`` does, or by an SNMP SET on the records marked
``:writecache`` (the control objects), which ``SnmpSim.get`` reads back. One SNMPv3 user with
SHA auth and AES privacy, and a fixed engine id (``ENGINE_ID``), so that a test can send traps
as the UPS's own engine would.

One snmpsim per session (per xdist worker), reset before each test that asks for it:

* the data files are put back as tests/fixtures/snmp has them (with a newer mtime, so that
  snmpsim reads them again);
* a SET keeps its value in the writecache module's memory, where nothing but a restart clears
  it. The module is told to keep that cache in a shelve file (``writecache:file:...``), which
  grows with every SET, also one of the value a record already held or one the record refused:
  a file that is not empty means the test wrote through SNMP, and snmpsim starts again;
* so does an snmpsim that a test stopped, or whose data directory it changed.
"""

from __future__ import annotations

import asyncio
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_port
from tests.peers.process import spawn
from upsguard.config.ups import UpsConfig

FIXTURES = Path(__file__).resolve().parent.parent / "fixtures" / "snmp"
FIXTURE_FILES = {p.name for p in FIXTURES.glob("*.snmprec")}
V3_USER = "upsguard"
V3_AUTH_KEY = "auth-key-4-tests"
V3_PRIV_KEY = "priv-key-4-tests"
ENGINE_ID = "80001f8880757073677561726431"  # RFC 3411 text format: enterprise 8072, "upsguard1"


def _responder() -> str:
    found = shutil.which("snmpsim-command-responder")
    if found is None:
        pytest.fail("snmpsim-command-responder is missing: run scripts/setup (installs snmpsim)")
    return found


def _oid_key(line: str) -> tuple[int, ...]:
    return tuple(int(part) for part in line.split("|", 1)[0].split("."))


@dataclass
class SnmpSim:
    root: Path
    port: int
    proc: subprocess.Popen[bytes]

    @property
    def data(self) -> Path:
        return self.root / "data"

    @property
    def writecache(self) -> Path:
        """Where the writecache module keeps the values SET through SNMP (a dbm.dumb shelve:
        ``.dat`` and ``.dir`` files beside this name)."""
        return self.root / "writecache.db"

    def written(self) -> bool:
        """Whether any SET reached a writable record since this snmpsim started."""
        return any(p.stat().st_size > 0 for p in self.root.glob(self.writecache.name + "*"))

    def set(self, agent: str, values: dict[str, tuple[int | str, Any]]) -> None:
        """Set ``OID -> (tag, value)`` in one agent's data (adds missing OIDs), atomically; a
        tag may name a variation module (``"2:writecache"``)."""
        path = self.data / f"{agent}.snmprec"
        records = {
            line.split("|", 1)[0]: line for line in path.read_text().splitlines() if line.strip()
        }
        for oid, (tag, value) in values.items():
            records[oid] = f"{oid}|{tag}|{value}"
        text = "\n".join(sorted(records.values(), key=_oid_key)) + "\n"
        old = path.stat().st_mtime
        tmp = path.with_suffix(".tmp")
        tmp.write_text(text)
        stamp = max(time.time(), old + 1.0)
        os.utime(tmp, (stamp, stamp))
        tmp.replace(path)

    def community_file(self, community: str) -> Path:
        path = self.root / f"{community}.community"
        path.write_text(community + "\n")
        return path

    def ups_config(self, agent: str, **snmp: Any) -> UpsConfig:
        """The agent read with v2c, its community (the data file's stem) from a file. The
        timeout is generous: on a busy machine snmpsim (pure Python) can take seconds to
        answer, and a test of what the agent received must not fail on that; tests of a
        timeout set their own."""
        community = snmp.pop("community", agent)
        settings: dict[str, Any] = {
            "host": "127.0.0.1",
            "port": self.port,
            "community_file": self.community_file(community),
            "mib": "powernet" if agent == "powernet" else "ups-mib",
            "timeout": "5s",
            "retries": 1,
        }
        settings.update(snmp)
        return UpsConfig.model_validate({"name": f"snmp-{agent}", "snmp": settings})

    def v3_config(self, agent: str, **snmp: Any) -> UpsConfig:
        for name, key in (("auth", V3_AUTH_KEY), ("priv", V3_PRIV_KEY)):
            (self.root / f"{name}.key").write_text(key + "\n")
        settings: dict[str, Any] = {
            "version": "3",
            "community_file": None,
            "user": V3_USER,
            "auth_protocol": "sha",
            "auth_key_file": self.root / "auth.key",
            "priv_protocol": "aes",
            "priv_key_file": self.root / "priv.key",
            "context": agent,
        }
        settings.update(snmp)
        return self.ups_config(agent, **settings)

    def get(self, agent: str, *oids: str) -> dict[str, int | str]:
        """INTEGER or TimeTicks values (OBJECT IDENTIFIERs dotted) of ``agent`` as the agent
        answers them now (v2c)."""
        from pysnmp.hlapi.v3arch.asyncio import (
            CommunityData,
            ContextData,
            ObjectIdentity,
            ObjectType,
            SnmpEngine,
            UdpTransportTarget,
            get_cmd,
        )

        async def read() -> dict[str, int | str]:
            engine = SnmpEngine()
            try:
                target = await UdpTransportTarget.create(("127.0.0.1", self.port), 5, 1)
                error, status, _, binds = await get_cmd(
                    engine,
                    CommunityData(agent),
                    target,
                    ContextData(),
                    *(ObjectType(ObjectIdentity(oid)) for oid in oids),
                )
                assert not error and not status, f"GET {oids}: {error or status}"
                return {oid: _plain(value) for oid, (_, value) in zip(oids, binds, strict=True)}
            finally:
                engine.close_dispatcher()

        return asyncio.run(read())

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


def udp_bound(port: int) -> bool:
    """Whether something on this machine listens on UDP ``port`` (read from the kernel)."""
    for line in Path("/proc/net/udp").read_text().splitlines()[1:]:
        local = line.split()[1]
        if int(local.split(":")[1], 16) == port:
            return True
    return False


def restore_data(data: Path) -> None:
    """Put every data file back as tests/fixtures/snmp has it, replacing those that differ
    atomically with a newer mtime (snmpsim reads a file again when its mtime changes)."""
    for source in sorted(FIXTURES.glob("*.snmprec")):
        target = data / source.name
        if target.exists() and target.read_bytes() == source.read_bytes():
            continue
        old = target.stat().st_mtime if target.exists() else 0.0
        tmp = target.with_suffix(".tmp")
        shutil.copyfile(source, tmp)
        stamp = max(time.time(), old + 1.0)
        os.utime(tmp, (stamp, stamp))
        tmp.replace(target)


def read_only(agent: str) -> str:
    """An agent's records with its control objects read-only (no ``writecache``): what a
    card answers to a community or user without write access."""
    text = (FIXTURES / f"{agent}.snmprec").read_text()
    return re.sub(r"\|(\d+):writecache\|value=", r"|\1|", text)


def start_snmpsim(root: Path, agents: dict[str, str] | None = None) -> SnmpSim:
    """snmpsim serving the fixtures, and ``agents`` (community -> records) beside them:
    snmpsim reads its data directory once, at start."""
    responder = _responder()
    data = root / "data"
    data.mkdir(parents=True, exist_ok=True)
    restore_data(data)
    for community, records in (agents or {}).items():
        (data / f"{community}.snmprec").write_text(records)
    for old in root.glob("writecache.db*"):
        old.unlink()
    port = free_port(kind=2)  # SOCK_DGRAM
    proc = spawn(
        [
            responder,
            f"--v3-engine-id={ENGINE_ID}",
            f"--data-dir={data}",
            f"--variation-module-options=writecache:file:{root / 'writecache.db'}",
            f"--cache-dir={root / 'cache'}",
            f"--agent-udpv4-endpoint=127.0.0.1:{port}",
            f"--v3-user={V3_USER}",
            f"--v3-auth-key={V3_AUTH_KEY}",
            "--v3-auth-proto=SHA",
            f"--v3-priv-key={V3_PRIV_KEY}",
            "--v3-priv-proto=AES",
            "--logging-method=stderr",
            "--log-level=error",
        ],
        root / "snmpsim.log",
        env={**os.environ, "SNMPSIM_ALLOW_ROOT": "true"},
    )
    sim = SnmpSim(root=root, port=port, proc=proc)
    deadline = time.monotonic() + 20
    while not udp_bound(port):
        if proc.poll() is not None or time.monotonic() > deadline:
            sim.stop()
            raise AssertionError(
                f"snmpsim did not start: {(root / 'snmpsim.log').read_text()[-2000:]}"
            )
        time.sleep(0.1)
    return sim


def reset(sim: SnmpSim) -> SnmpSim:
    """``sim`` as it started (see the module's docstring): the same process with its data
    files put back, or a new one where only a restart can undo what a test did."""
    files = {p.name for p in sim.data.glob("*.snmprec")}
    if sim.proc.poll() is None and not sim.written() and files == FIXTURE_FILES:
        restore_data(sim.data)
        return sim
    sim.stop()
    for extra in sim.data.iterdir():
        extra.unlink()
    return start_snmpsim(sim.root)


@pytest.fixture(scope="session")
def snmpsim_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[list[SnmpSim]]:
    """The session's snmpsim, in a list so that a reset can put a new one in its place."""
    running = [start_snmpsim(tmp_path_factory.mktemp("snmpsim"))]
    yield running
    running[0].stop()


@pytest.fixture
def snmpsim(snmpsim_server: list[SnmpSim]) -> SnmpSim:
    """The session's snmpsim, reset: tests may change its files, SET its records or stop it."""
    snmpsim_server[0] = reset(snmpsim_server[0])
    return snmpsim_server[0]


def _plain(value: Any) -> int | str:
    """An INTEGER or TimeTicks as a number; an OBJECT IDENTIFIER, which has no number, dotted."""
    try:
        return int(value)
    except TypeError:
        return str(value)
