"""kill -9 in the middle of a shutdown: the next start reads the journal, checks the real
machines and finishes the run, with no step done twice. The machines are real IPMI BMCs
(pyghmi's BMC server, tests/peers/bmc.py) whose power state outlives the service."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.peers.service import ServiceProcess, write_site


def site_with_bmcs(tmp_path: Path, bmcs: dict[str, Any]) -> ServiceProcess:
    platforms = {
        f"bmc-{name}": bmc.settings_dict(poll_interval="300ms") for name, bmc in bmcs.items()
    }
    return write_site(
        tmp_path,
        {
            "site": "resume",
            "ups": [{"name": "ups1", "simulated": {}}],
            "platforms": platforms,
            "resources": [
                {"id": "h1", "kind": "host", "platform": "bmc-h1", "depends_on": ["h2"]},
                {"id": "h2", "kind": "host", "platform": "bmc-h2", "depends_on": ["h3"]},
                {"id": "h3", "kind": "host", "platform": "bmc-h3"},
            ],
            "policies": {"poll_interval": "500ms"},
        },
    )


def test_kill_9_mid_shutdown_then_restart_finishes_the_run(
    tmp_path: Path, fake_bmc_factory: Any
) -> None:
    bmcs = {
        name: fake_bmc_factory(power="on", soft_off_delay=3.0, name=name)
        for name in ("h1", "h2", "h3")
    }
    svc = site_with_bmcs(tmp_path, bmcs)
    try:
        svc.start()
        svc.cli("trigger", "shutdown", "--yes", "--reason", "resume test")

        def h2_running() -> bool:
            run = svc.status()["run"] or {}
            return [s["step"] for s in run.get("running", [])] == ["stop:h2"]

        svc.wait(h2_running, "stop:h2 to be under way")
        svc.wait(lambda: bmcs["h2"].actions() == ["softoff"], "h2's soft off to reach its BMC")
        svc.kill9()
        assert bmcs["h3"].actions() == []  # not reached yet

        svc.start()
        st = svc.status()
        run_id = st["service"]["resumed"]
        assert run_id and run_id.startswith("shutdown-")
        svc.wait(lambda: svc.status()["phase"] == "down", "the resumed run to finish", 90)

        # each machine got exactly the graceful requests it needed, never a hard power-off
        assert bmcs["h1"].actions() == ["softoff"]  # done before the kill: not repeated
        assert bmcs["h2"].actions() in (["softoff"], ["softoff", "softoff"])
        assert bmcs["h3"].actions() == ["softoff"]
        journal = svc.read_journal()
        run = journal.read.run(run_id)
        assert run is not None and (run.state, run.resumed) == ("done", 1)
        steps = [(s.step, s.attempt, s.state) for s in run.steps]
        assert steps[0] == ("stop:h1", 1, "done")
        assert steps[1] == ("stop:h2", 1, "abandoned")
        assert steps[2:] == [("stop:h2", 2, "done"), ("stop:h3", 1, "done")]
        assert any("resuming shutdown run" in e.text for e in journal.read.events(after=0))
        journal.close()
        assert svc.terminate() == 0
    finally:
        svc.stop()
