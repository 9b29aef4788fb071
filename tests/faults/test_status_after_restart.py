"""A step whose command a controller before the restart started, and that is still under way,
shows in ``upsguard status`` as "under way since ... started before the restart": for a
``command`` step (its process, found running) and for an ``ssh`` step (its remote command,
sent before the restart and waited for until the step's timeout).

The device's stop is held (``tests/faults/lab.py``) while the service is killed, started
again, and asked for its status: the step is under way for as long as the test needs, by
events rather than the clock. Released, the step ends done, and its line in ``history`` says
it waited for the request made before the restart (not "already off").
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import Lab
from tests.peers.sshd import Sshd

pytestmark = [pytest.mark.nut, pytest.mark.sshd, pytest.mark.slow, pytest.mark.timeout(300)]


def lab_for(platform: str, root: Path, nut: Any, sshd: Sshd) -> tuple[Lab, dict[str, Any]]:
    """One NAS on ``platform``: this machine's shell (``command``) or this machine through
    sshd (``ssh``); the site's ``platforms`` section for it."""
    nas: dict[str, Any] = {"id": "nas1", "kind": "storage"}
    if platform == "command":
        return Lab(root, nut, [nas]), {"cmd": {"type": "command", "poll_interval": "200ms"}}
    settings = sshd.settings_dict()
    del settings["host"]
    ssh = {"type": "ssh", **settings, "timeout": "30s", "poll_interval": "200ms"}
    return Lab(root, nut, [{**nas, "platform": "dev", "host": sshd.host}]), {"dev": ssh}


@pytest.mark.parametrize("platform", ["command", "ssh"])
def test_a_step_under_way_since_before_a_restart_says_so_in_status(
    tmp_path: Path, nut_factory: Any, sshd: Sshd, platform: str
) -> None:
    nut = nut_factory({"ups1": "ups.status: OL\nbattery.charge: 100\n"}, ext="st")
    lab, platforms = lab_for(platform, tmp_path / "lab", nut, sshd)
    svc = lab.service(tmp_path, platforms=platforms)
    lab.hold("nas1")
    try:
        svc.start()
        lab.outage()
        svc.wait(lambda: lab.begun("nas1"), "the NAS's stop to begin")
        svc.kill9()
        svc.start()

        def running() -> list[dict[str, Any]]:
            run = svc.status().get("run")
            return list(run["running"]) if run else []

        (step,) = svc.wait(running, "the resumed run to run the NAS's step")
        assert step["step"] == "stop:nas1"
        assert step["under_way_since"] is not None
        assert "started before the restart" in svc.cli("status").stdout
        lab.release("nas1")
        svc.wait(lambda: svc.status()["phase"] == "down", "the resumed run to finish", 90)
        assert lab.calls().count("stop nas1") == 1
        (done,) = [line for line in svc.cli("history").stdout.splitlines() if "done  " in line]
        assert "shut down (waited for" in done
        assert "since" in done and "before the restart" in done
    finally:
        lab.release_all()
        svc.stop()
