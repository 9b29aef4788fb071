"""An ``ssh`` step whose command still runs on the device when the service dies is not sent
again before the step's own timeout since the first (and with ``once``, not run twice).

The remote command outlives a ``kill -9`` of the service (and a ``SIGTERM`` to the whole
unit): sshd leaves it running once the connection is gone. The service journals the moment
it sent it; the restarted one waits for the device to read down, up to the step's timeout
since then, before it would send a second. With ``ssh: {once: true}`` the step's timeout is
shorter than the command, so the restarted service does send again while the first copy
still runs: ``flock`` on the device refuses the second copy beside the first. Either way
the command STARTED exactly once and the step ends done.

The device script logs ``begin PID`` when it starts and ``end PID`` when it ends, seconds
apart; each trial kills the service once the ``begin`` line is there (by events, not by the
clock). ``UPSGUARD_SSH_RESUME_TRIALS`` sets how many trials (2 by default).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import ONLINE, shutdown_cut_and_resumed, the_only_run
from tests.peers.nut import NutServer
from tests.peers.service import ServiceProcess, write_site
from tests.peers.sshd import Sshd, lock_of_its_own

pytestmark = [pytest.mark.nut, pytest.mark.sshd, pytest.mark.slow, pytest.mark.timeout(600)]

TRIALS = int(os.environ.get("UPSGUARD_SSH_RESUME_TRIALS", "2"))

SLOW_STOP = """\
#!/bin/sh
# slow-stop SECONDS: logs when it begins and ends, then the device reads down
dir=$(dirname "$0")
echo "begin $$" >> "$dir/runs.log"
sleep "$1"
echo "end $$" >> "$dir/runs.log"
touch "$dir/down"
"""


def lab_site(root: Path, nut: NutServer, sshd: Sshd, once: bool, rid: str) -> ServiceProcess:
    """One NAS on the ``ssh`` platform (this machine through sshd) whose shutdown takes some
    seconds; its ``status`` reads it down once the command ended. With ``once`` the step's
    timeout (4 s) is shorter than the command (6 s); without, it is a minute (3 s)."""
    bin_dir = root / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    script = bin_dir / "slow-stop"
    script.write_text(SLOW_STOP)
    script.chmod(0o755)
    resource: dict[str, Any] = {
        "id": rid,
        "kind": "storage",
        "platform": "dev",
        "host": sshd.host,
        "shutdown": f"{script} {6 if once else 3}",
        "status": f"test ! -e {bin_dir / 'down'}",
        "guest_timeout": "4s" if once else "60s",
        "fallback": "fail",
    }
    if once:
        resource["ssh"] = {"once": True}
    settings = sshd.settings_dict()
    del settings["host"]
    return write_site(
        root,
        {
            "site": "sshresume",
            "ups": [
                {"name": "ups1", "nut": {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}}
            ],
            "platforms": {
                "dev": {"type": "ssh", **settings, "timeout": "30s", "poll_interval": "200ms"}
            },
            "resources": [resource],
            "policies": {
                "poll_interval": "200ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery", "fsd"]},
            },
        },
    )


def runs_log(root: Path) -> list[str]:
    log = root / "bin" / "runs.log"
    return log.read_text().splitlines() if log.exists() else []


def trial(root: Path, nut: NutServer, sshd: Sshd, kill: str, once: bool) -> list[str]:
    """One outage whose shutdown step is cut by ``kill``; the problems found."""
    rid = lock_of_its_own()
    svc = lab_site(root, nut, sshd, once, rid)
    try:
        shutdown_cut_and_resumed(svc, nut, kill, lambda: runs_log(root))
    finally:
        svc.stop()
        for lock in Path.home().glob(f".upsguard-{rid}-*.lock"):
            lock.unlink()
    lines = runs_log(root)
    begun = len([line for line in lines if line.startswith("begin ")])
    found = [f"the command began {begun} times"] if begun != 1 else []
    run, states = the_only_run(svc)
    if set(states.values()) != {"done"} or run != "done":
        found.append(f"run {run}, steps {states}")
    return found


@pytest.mark.parametrize("once", [False, True], ids=["plain", "once"])
@pytest.mark.parametrize("kill", ["kill9", "sigterm"])
def test_an_ssh_command_running_at_a_restart_is_not_sent_again_within_the_step_timeout(
    tmp_path: Path, nut_factory: Any, sshd: Sshd, kill: str, once: bool
) -> None:
    nut: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    failures = {
        index: found
        for index in range(TRIALS)
        if (found := trial(tmp_path / f"trial{index}", nut, sshd, kill, once))
    }
    assert failures == {}
