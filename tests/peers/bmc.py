"""A fake BMC on loopback: pyghmi's own IPMI server (``pyghmi.ipmi.bmc.Bmc``) with a power state.

The server speaks real IPMI 2.0 over UDP (RMCP+ sessions, authentication), so the
``ipmi`` platform talks to it exactly as to a server's BMC. It runs in its own
process (pyghmi keeps its sessions in module globals) and records every chassis
command it receives, in order, in ``actions`` (a log file), for tests to read.

Behaviour a test can choose: the initial power state, how long the "OS" takes to
honour a soft off (ACPI shutdown), whether it ignores it (a hung OS: only a hard
off works), how long a power-on takes before the chassis reports on, and a URL
POSTed once it is on (``power_on_url``): vcsim's host-power-on, so that the
ESXi host behind this BMC boots in the simulated vCenter.

Fixtures (register ``tests.peers.bmc`` in tests/conftest.py's ``pytest_plugins``):

* ``fake_bmc_factory`` (function): ``start(**behaviour) -> FakeBmc``; stopped after the test.
* ``FakeBmc``: ``host``, ``port``, ``user``, ``password_file``, ``actions()``,
  ``settings_dict()`` (the site file's ``platforms:`` entry).

Run by hand: ``python -m tests.peers.bmc --port 6230 --password-file pw``.
"""

from __future__ import annotations

import argparse
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ports import free_port
from tests.peers.process import wait_started

USER = "admin"


@dataclass
class FakeBmc:
    host: str
    port: int
    user: str
    password_file: Path
    log: Path
    proc: subprocess.Popen[bytes] = field(repr=False)

    def actions(self) -> list[str]:
        """Chassis commands received so far: ``on``, ``off``, ``softoff``, ``reset``."""
        return [action for action, _ in self.timed_actions()]

    def timed_actions(self) -> list[tuple[str, float]]:
        """Each command with the wall-clock time (``time.time()``) the BMC received it."""
        if not self.log.exists():
            return []
        rows = [line.split() for line in self.log.read_text().splitlines() if line]
        return [(row[0], float(row[1])) for row in rows]

    def settings_dict(self, **extra: object) -> dict[str, object]:
        return {
            "type": "ipmi",
            "host": self.host,
            "port": self.port,
            "user": self.user,
            "password_file": str(self.password_file),
            **extra,
        }

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def start_fake_bmc(
    base: Path,
    *,
    power: str = "off",
    soft_off_delay: float = 0.5,
    ignore_soft_off: bool = False,
    power_on_delay: float = 0.0,
    password: str = "s3cret-bmc",
    power_on_url: str | None = None,
    ca_file: Path | None = None,
) -> FakeBmc:
    """One fake BMC process with its files in ``base`` (made here); ready when it returns."""
    base.mkdir(parents=True)
    pw = base / "password"
    pw.write_text(password + "\n")
    log, err = base / "actions.log", base / "stderr.log"
    port = free_port(socket.SOCK_DGRAM)
    argv = [sys.executable, "-m", "tests.peers.bmc", "--port", str(port)]
    argv += ["--password-file", str(pw), "--log", str(log), "--power", power]
    argv += ["--ready-file", str(base / "ready")]
    argv += ["--soft-off-delay", str(soft_off_delay), "--power-on-delay", str(power_on_delay)]
    if ignore_soft_off:
        argv.append("--ignore-soft-off")
    if power_on_url is not None:
        argv += ["--power-on-url", power_on_url]
    if ca_file is not None:
        argv += ["--ca-file", str(ca_file)]
    proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=err.open("wb"))
    bmc = FakeBmc("127.0.0.1", port, USER, pw, log, proc)
    try:
        # ready once the BMC process has bound its UDP socket and says so in the file
        wait_started(proc, err, (base / "ready").exists, "fake BMC", 15, pause=0.02)
    except BaseException:
        bmc.stop()
        raise
    return bmc


@pytest.fixture
def fake_bmc_factory(tmp_path: Path) -> Iterator[object]:
    started: list[FakeBmc] = []

    def start(*, name: str = "bmc", **behaviour: Any) -> FakeBmc:
        bmc = start_fake_bmc(tmp_path / f"{name}-{len(started)}", **behaviour)
        started.append(bmc)
        return bmc

    yield start
    for bmc in started:
        bmc.stop()


def main() -> None:
    """The BMC process: answers IPMI on 127.0.0.1 until terminated."""
    import pyghmi.ipmi.bmc as bmc

    _offer_sha1_only()
    args = _parse_args()
    password = Path(args.password_file).read_text().strip()
    log = Path(args.log) if args.log else None

    class PoweredBmc(bmc.Bmc):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__({USER: password}, port=args.port, address="127.0.0.1")
            self.powerstate = args.power
            self._lock = threading.Lock()

        def _record(self, action: str) -> None:
            if log is not None:
                with log.open("a") as handle:
                    handle.write(f"{action} {time.time():.6f}\n")

        def _set_later(self, state: str, delay: float) -> None:
            if delay <= 0:
                self._set(state)
                return
            timer = threading.Timer(delay, self._set, args=(state,))
            timer.daemon = True
            timer.start()

        def _set(self, state: str) -> None:
            was, self.powerstate = self.powerstate, state
            if state == "on" and was != "on" and args.power_on_url:
                _notify(args.power_on_url, args.ca_file)

        def get_power_state(self) -> str:
            return str(self.powerstate)

        def power_off(self) -> None:
            self._record("off")
            self.powerstate = "off"

        def power_on(self) -> None:
            self._record("on")
            self._set_later("on", args.power_on_delay)

        def power_shutdown(self) -> None:
            self._record("softoff")
            if not args.ignore_soft_off:
                self._set_later("off", args.soft_off_delay)

        def power_reset(self) -> None:
            self._record("reset")

        def power_cycle(self) -> None:
            self._record("cycle")

        def is_active(self) -> bool:
            return self.powerstate == "on"

        def cold_reset(self) -> None:
            self._record("cold_reset")

    server = PoweredBmc()
    if args.ready_file:
        Path(args.ready_file).write_text("ready\n")
    server.listen()


def _notify(url: str, ca_file: str | None) -> None:
    """Tell the simulated server behind this BMC that it has power (vcsim's host-power-on)."""
    import ssl
    import urllib.request

    context = ssl.create_default_context(cafile=ca_file) if ca_file else None
    request = urllib.request.Request(url, method="POST")
    try:
        with urllib.request.urlopen(request, context=context, timeout=10):
            pass
    except OSError as exc:
        print(f"power-on notification to {url} failed: {exc}", file=sys.stderr)


def _offer_sha1_only() -> None:
    """Make pyghmi's server refuse a SHA-256 proposal, as a SHA-1-only BMC does.

    pyghmi's server only speaks cipher suite 3 (HMAC-SHA1) but accepts any
    proposal; pyghmi's client proposes SHA-256 first and falls back to SHA-1
    only when the BMC answers with an error status (RMCP+ status 0x11, "invalid
    authentication algorithm"), which is what a real SHA-1-only BMC answers.
    """
    from pyghmi.ipmi.private import serversession

    accept = serversession.ServerSession.create_open_session_response

    def respond(self: object, request: bytearray) -> bytearray:
        if len(request) > 12 and request[12] != 1:
            return bytearray([request[0], 0x11, 0, 0]) + request[4:8] + bytearray(4)
        return bytearray(accept(self, request))

    serversession.ServerSession.create_open_session_response = respond


def _parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="fake IPMI BMC on loopback (pyghmi)")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--password-file", required=True)
    parser.add_argument("--log")
    parser.add_argument("--ready-file")
    parser.add_argument("--power", choices=("on", "off"), default="off")
    parser.add_argument("--soft-off-delay", type=float, default=0.5)
    parser.add_argument("--ignore-soft-off", action="store_true")
    parser.add_argument("--power-on-delay", type=float, default=0.0)
    parser.add_argument("--power-on-url", help="POSTed once the chassis is on (vcsim host)")
    parser.add_argument("--ca-file", help="CA bundle for --power-on-url")
    return parser.parse_args()


if __name__ == "__main__":
    main()
