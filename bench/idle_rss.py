#!/usr/bin/env python3
"""Memory of an idle ``upsguard run``: its resident set once it serves, and after some polls.

A real service (a subprocess, as systemd starts it) on a small site: a simulated UPS, a
simulated vCenter with two hosts and four VMs, a simulated cache. The figure is taken once
the API socket answers, and again after ``--polls`` polls asked for through the API
(``POST /poll``), so nothing here waits on a timer. Reads ``VmRSS`` and ``VmHWM`` (the
peak) from ``/proc``, in MiB, and names the packages whose compiled modules the service
has loaded (``/proc/PID/maps``): a library imported that the idle service does not need
shows there.

Target: under 70 MiB once serving. A benchmark, not a test: it prints its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from upsguard.cli.client import ApiClient
from upsguard.errors import TemporaryError

CLI = [sys.executable, "-c", "import sys; from upsguard.cli import main; sys.exit(main())"]
TARGET_MIB = 70


def site(tmp: Path) -> Path:
    data = {
        "site": "idle",
        "journal": str(tmp / "journal.sqlite"),
        "service": {"socket": str(tmp / "api.sock")},
        "ups": [
            {"name": "ups1", "simulated": {}, "runtime_at": {"minutes": 20, "load_watts": 400}}
        ],
        "platforms": {"vc": {"type": "simulated"}},
        "caches": [{"name": "flash", "provider": "simulated", "carries": ["db"]}],
        "resources": [
            {"id": "db", "kind": "vm", "platform": "vc", "runs_on": ["esx1"]},
            {
                "id": "app",
                "kind": "vm",
                "platform": "vc",
                "runs_on": ["esx1"],
                "depends_on": ["db"],
            },
            {
                "id": "web",
                "kind": "vm",
                "platform": "vc",
                "runs_on": ["esx2"],
                "depends_on": ["app"],
            },
            {"id": "dc", "kind": "vm", "platform": "vc", "runs_on": ["esx2"]},
            {"id": "esx1", "kind": "host", "platform": "vc"},
            {"id": "esx2", "kind": "host", "platform": "vc"},
        ],
    }
    path = tmp / "site.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def memory_mib(pid: int) -> dict[str, float]:
    """``VmRSS`` and ``VmHWM`` of ``pid``, in MiB."""
    found = {}
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM"):
            found[key] = int(value.split()[0]) / 1024
    return found


def shared_objects(pid: int) -> list[str]:
    """The packages whose compiled modules the process has mapped (site-packages only)."""
    names = set()
    for line in Path(f"/proc/{pid}/maps").read_text().splitlines():
        path = line.split()[-1] if line.count("/") else ""
        if "site-packages/" in path and path.endswith(".so"):
            top = path.split("site-packages/", 1)[1].split("/", 1)[0]
            names.add(top.split(".", 1)[0])  # _cffi_backend.cpython-311-...so: _cffi_backend
    return sorted(names)


def serve_and_wait(path: Path, socket: Path, log: Path, timeout: float) -> subprocess.Popen[bytes]:
    """Start the service; return once its API answers."""
    with log.open("wb") as out:
        proc = subprocess.Popen([*CLI, "run", "-c", str(path)], stdout=out, stderr=out)
    client = ApiClient(socket)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"upsguard run exited {proc.returncode}:\n{log.read_text()}")
        with contextlib.suppress(TemporaryError):
            if socket.exists() and client.running():
                return proc
        time.sleep(0.05)
    proc.kill()
    raise SystemExit(f"upsguard run did not answer within {timeout:.0f} s:\n{log.read_text()}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--polls", type=int, default=20, help="polls asked for after serving")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to start serving")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="upsguard-idle-") as name:
        tmp = Path(name)
        socket = tmp / "api.sock"
        proc = serve_and_wait(site(tmp), socket, tmp / "service.log", args.timeout)
        try:
            serving = memory_mib(proc.pid)
            client = ApiClient(socket)
            for _ in range(args.polls):
                client.post("/poll", {})
            polled = memory_mib(proc.pid)
            status = client.get("/status")
            libraries = shared_objects(proc.pid)
        finally:
            proc.terminate()
            proc.wait(20)
    polls = status["service"]["polls"]
    verdict = "met" if serving["VmRSS"] < TARGET_MIB else "NOT met"
    print(f"idle upsguard run, {status['phase']}, {polls} polls")
    print(f"RSS once serving: {serving['VmRSS']:.1f} MiB (target < {TARGET_MIB} MiB: {verdict})")
    print(
        f"RSS after {args.polls} more polls: {polled['VmRSS']:.1f} MiB, "
        f"peak {polled['VmHWM']:.1f} MiB"
    )
    print(f"compiled modules mapped from: {', '.join(libraries) or 'none'}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
