#!/usr/bin/env python3
"""How soon the commands a person types answer: ``upsguard --help``, ``status`` and ``hold``
(to a running service) and ``validate`` of ``config/examples/homelab.yaml``, each a fresh
process as a shell starts it, beside a bare ``python -c pass`` (the interpreter's own start).

A real service (a subprocess) on a small simulated site answers ``status`` and ``hold``.
Each command runs once to write its bytecode, then ``--runs`` times; the median wall time is
printed, and what it adds to the bare interpreter. With ``--instructions``, each command also
runs once under valgrind (callgrind) and the instructions it executed are printed: a figure
that does not grow with the machine's load, as wall times here do by two or three times, so
two commits can be compared on a busy machine. The commands read bytecode as an installed
upsguard does (the package ships it), also where the shell that starts the bench says
``PYTHONDONTWRITEBYTECODE``: without it, every run compiled upsguard's own modules anew,
a time no user waits. Target: each under 0.3 s on a quiet machine. The modules each command
loads are ``tests/integration/test_cli_start.py``'s to check.

A benchmark, not a test: it prints its figures.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

from upsguard.cli.client import ApiClient
from upsguard.errors import TemporaryError

ROOT = Path(__file__).resolve().parents[1]


def command_env(bytecode: Path) -> dict[str, str]:
    """The environment of the commands: this checkout's ``src`` first, and bytecode written
    to and read from ``bytecode`` (not the checkout)."""
    env = {name: value for name, value in os.environ.items() if name != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT / "src"), env.get("PYTHONPATH")]))
    env["PYTHONPYCACHEPREFIX"] = str(bytecode)
    return env


UPSGUARD = [sys.executable, "-m", "upsguard"]
TARGET_S = 0.3


def site(tmp: Path) -> Path:
    data = {
        "site": "bench",
        "journal": str(tmp / "journal.sqlite"),
        "service": {"socket": str(tmp / "api.sock")},
        "ups": [{"name": "ups1", "simulated": {}}],
        "platforms": {"vc": {"type": "simulated"}},
        "resources": [
            {"id": "db", "kind": "vm", "platform": "vc", "runs_on": ["esx1"]},
            {"id": "esx1", "kind": "host", "platform": "vc"},
        ],
    }
    path = tmp / "site.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def serve(
    path: Path, socket: Path, log: Path, timeout: float, env: dict[str, str]
) -> subprocess.Popen[bytes]:
    """Start the service; return once its API answers."""
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [*UPSGUARD, "run", "-c", str(path)], stdout=out, stderr=out, env=env
        )
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


def median_s(argv: list[str], runs: int, env: dict[str, str]) -> float:
    """The median wall time of ``runs`` runs of ``argv``, after one that writes its bytecode;
    one that fails ends the bench."""
    times = []
    for _ in range(1 + runs):
        started = time.perf_counter()
        done = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
        times.append(time.perf_counter() - started)
        if done.returncode != 0:
            raise SystemExit(f"{' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return statistics.median(times[1:])


def instructions(argv: list[str], env: dict[str, str]) -> int:
    """The instructions ``argv`` executes, as valgrind's callgrind counts them."""
    done = subprocess.run(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", *argv],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
    )
    counted = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode != 0 or counted is None:
        raise SystemExit(f"valgrind {' '.join(argv)} exited {done.returncode}: {done.stderr}")
    return int(counted.group(1))


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of each command (10)")
    parser.add_argument("--timeout", type=float, default=60.0, help="seconds to start serving")
    parser.add_argument(
        "--instructions", action="store_true", help="count each one's instructions (valgrind)"
    )
    args = parser.parse_args()
    if args.instructions and shutil.which("valgrind") is None:
        parser.error("--instructions needs valgrind: apt-get install valgrind")
    with tempfile.TemporaryDirectory(prefix="upsguard-cli-") as name:
        tmp = Path(name)
        path = site(tmp)
        env = command_env(tmp / "bytecode")
        proc = serve(path, tmp / "api.sock", tmp / "service.log", args.timeout, env)
        try:
            commands = {
                "python -c pass": [sys.executable, "-c", "pass"],
                "upsguard --help": [*UPSGUARD, "--help"],
                "upsguard status": [*UPSGUARD, "status", "-c", str(path)],
                "upsguard hold": [*UPSGUARD, "hold", "--reason", "bench", "-c", str(path)],
                "upsguard validate homelab.yaml": [
                    *UPSGUARD,
                    "validate",
                    "-c",
                    "config/examples/homelab.yaml",
                ],
            }
            medians = {what: median_s(argv, args.runs, env) for what, argv in commands.items()}
            counts = {
                what: instructions(argv, env) if args.instructions else None
                for what, argv in commands.items()
            }
        finally:
            proc.terminate()
            proc.wait(20)
    bare = medians["python -c pass"]
    print(f"median of {args.runs} runs each (target < {TARGET_S} s on a quiet machine)")
    for what, seconds in medians.items():
        beyond = "" if what.startswith("python") else f"  (+{seconds - bare:.3f} s over python)"
        verdict = (
            "" if what.startswith("python") else ("  met" if seconds < TARGET_S else "  NOT met")
        )
        counted = counts[what]
        count = "" if counted is None else f"  {counted / 1e6:5.0f} M instructions"
        print(f"{what:32} {seconds:.3f} s{count}{beyond}{verdict}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
