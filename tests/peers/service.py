"""``upsguard run`` as a real process, with its site file, socket, journal and log, for a test."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec
import pytest
import yaml

from tests.peers.process import spawn
from upsguard.cli.client import ApiClient
from upsguard.errors import TemporaryError
from upsguard.journal import Journal
from upsguard.status import SiteStatus

CLI = [sys.executable, "-c", "import sys; from upsguard.cli import main; sys.exit(main())"]


@dataclass
class ServiceProcess:
    """One ``upsguard run`` with its site file, socket and log, for a test.

    The service is started in a process group of its own, so a test can signal the whole
    group the way ``systemctl stop`` signals the unit's cgroup.
    """

    site: Path
    socket: Path
    journal: Path
    log: Path
    proc: subprocess.Popen[bytes] | None = None
    env: dict[str, str] = field(default_factory=dict)
    prefix: list[str] = field(default_factory=list)

    def spawn(self) -> subprocess.Popen[bytes]:
        self.proc = spawn(
            [*self.prefix, *CLI, "run", "-c", str(self.site)],
            self.log,
            env={**os.environ, **self.env},
            start_new_session=True,
        )
        return self.proc

    def start(self, timeout: float = 30.0) -> None:
        proc = self.spawn()
        client = ApiClient(self.socket)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if proc.poll() is not None:
                pytest.fail(f"upsguard run exited {proc.returncode}:\n{self.log.read_text()}")
            try:
                if self.socket.exists() and client.running():
                    return
            except TemporaryError:  # the socket is there, the service not answering yet
                pass
            time.sleep(0.1)
        pytest.fail(f"upsguard run did not answer within {timeout}s:\n{self.log.read_text()}")

    def cli(
        self, *args: str, check: bool = True, stdin: str = ""
    ) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            [*CLI, *args, "-c", str(self.site)],
            capture_output=True,
            text=True,
            timeout=120,
            input=stdin,
            env={**os.environ, **self.env},
        )
        if check and result.returncode != 0:
            pytest.fail(f"upsguard {' '.join(args)} exited {result.returncode}: {result.stderr}")
        return result

    def api(self) -> ApiClient:
        return ApiClient(self.socket)

    def status(self) -> dict[str, Any]:
        """The service's status, checked against the status model on every call."""
        answer = dict(self.api().get("/status"))
        msgspec.convert(answer, SiteStatus)
        return answer

    def wait(self, check: Callable[[], Any], what: str, timeout: float = 60.0) -> Any:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            value = check()
            if value:
                return value
            time.sleep(0.1)
        pytest.fail(f"timed out waiting for {what}:\n{self.log.read_text()[-4000:]}")

    def terminate(self, group: bool = False) -> int:
        """SIGTERM to the service (or to its whole process group, as systemd's default
        ``KillMode=control-group`` does); its exit code."""
        assert self.proc is not None
        if group:
            os.killpg(self.proc.pid, signal.SIGTERM)
        else:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout=30)

    def kill9(self) -> None:
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(timeout=10)

    def resume_to_the_end(self, timeout: float = 120.0) -> None:
        """Start again after a kill: the service must say it resumed a run, and finish it."""
        self.start()
        assert self.status()["service"]["resumed"]
        self.wait(lambda: self.status()["phase"] == "down", "the resumed run to finish", timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=10)

    def read_journal(self) -> Journal:
        return Journal(self.journal)


def write_site(tmp: Path, site: dict[str, Any], name: str = "site.yaml") -> ServiceProcess:
    tmp.mkdir(parents=True, exist_ok=True)
    socket = tmp / "run" / "upsguard.sock"
    journal = tmp / "journal.sqlite"
    site = {"journal": str(journal), **site}
    site["service"] = {"socket": str(socket), **site.get("service", {})}
    path = tmp / name
    path.write_text(yaml.safe_dump(site, sort_keys=False))
    return ServiceProcess(path, socket, Path(site["journal"]), tmp / "service.log")
