"""The full lane's grouping (tests/conftest.py): the QEMU guest's tests share one worker and
one guest, and the controller pair's tests one worker, as ``scripts/test`` runs them
(``--dist loadgroup``). Checked by asking pytest for its plan (``--setup-plan``, which sets
nothing up) with a plugin that writes down which worker was handed each test."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RECORDER = """
import os

def pytest_runtest_logstart(nodeid, location):
    worker = os.environ.get("PYTEST_XDIST_WORKER")
    if worker is not None:  # not the controller, which hears of every test too
        with open(os.environ["LANES_LOG"], "a") as log:
            log.write(worker + " " + nodeid + "\\n")
"""


def workers_by_test(tmp_path: Path, *paths: str) -> dict[str, str]:
    (tmp_path / "lanes_recorder.py").write_text(RECORDER)
    log = tmp_path / "handed.log"
    # not this worker's own xdist names: the plan's controller would pass for one of its workers
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST_XDIST_")}
    env |= {"PYTHONPATH": str(tmp_path), "LANES_LOG": str(log)}
    lane = ["-m", "", "-n", "2", "--dist", "loadgroup"]  # as scripts/test runs the full lane
    plan = ["--setup-plan", "-p", "lanes_recorder", "-p", "no:cacheprovider", "-q"]
    done = subprocess.run(
        [sys.executable, "-m", "pytest", *paths, *lane, *plan],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    handed = [line.split(" ", 1) for line in log.read_text().splitlines()]
    return {nodeid.split("@")[0]: worker for worker, nodeid in handed}


def test_the_guests_tests_and_the_pairs_tests_each_keep_to_one_worker(tmp_path: Path) -> None:
    handed = workers_by_test(
        tmp_path,
        "tests/integration/test_guest_kernel.py",
        "tests/integration/test_guest_caches.py",
        "tests/integration/test_ha_pair.py",
    )
    guest = {w for nodeid, w in handed.items() if "test_guest_" in nodeid}
    pair = {w for nodeid, w in handed.items() if "test_ha_pair" in nodeid}
    assert len(handed) > 20
    assert len(guest) == 1, f"the guest's tests went to workers {sorted(guest)}"
    assert len(pair) == 1, f"the pair's tests went to workers {sorted(pair)}"
