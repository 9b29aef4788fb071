"""A stop signal interrupts steps (neither failed nor done); resume re-checks them in order,
and never stops the controller's own machine a second time."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import ONLINE, Lab
from tests.peers.nut_driver import DRIVER_COMMANDS

pytestmark = [pytest.mark.nut, pytest.mark.timeout(240)]


def test_sigterm_during_a_step_interrupts_it_and_the_next_start_resumes_in_order(
    lab: Lab, tmp_path: Path
) -> None:
    svc = lab.service(tmp_path)
    lab.hold("db")
    try:
        svc.start()
        lab.outage()
        svc.wait(lambda: lab.begun("db"), "db's stop to begin")
        assert svc.terminate(group=True) == 0  # systemctl stop: SIGTERM to the whole unit
        calls = lab.calls()
        assert "stop h1" not in calls and "stop nas1" not in calls  # nothing went on
        journal = svc.read_journal()
        (run,) = journal.read.runs()
        steps = {s.step: s.state for s in run.steps}
        journal.close()
        assert run.state == "interrupted"
        assert steps == {"stop:web": "done", "stop:db": "interrupted"}
        lab.release("db")
        svc.start()
        lab.wait_all_off(svc)
        svc.wait(lambda: svc.status()["phase"] == "down", "the run to finish")
    finally:
        svc.stop()
    assert lab.order_violations() == []
    assert lab.stopped() == ["web", "db", "h1", "nas1"]
    journal = svc.read_journal()
    (run,) = journal.read.runs()
    journal.close()
    assert (run.state, run.resumed) == ("done", 1)


@pytest.fixture
def own_lab(tmp_path: Path, nut_factory: Any) -> Iterator[Lab]:
    """The lab with the controller's own machine, on a UPS whose driver offers the load
    cycle that brings it back (dummy-ups offers only ``load.off``): without one upsguard
    never halts its own machine."""
    nut = nut_factory({"ups1": ONLINE}, ext="dev", fake_drivers={"ups1": DRIVER_COMMANDS})
    lab = Lab(tmp_path / "lab", nut)
    lab.resources.append(
        {"id": "mgmt", "kind": "host", "runs_upsguard": True, "estimate": {"stop": "20s"}}
    )
    yield lab
    lab.release_all()


def load_cycle(lab: Lab) -> dict[str, Any]:
    admin = {"user": "admin", "password_file": str(lab.nut.password_file("admin"))}
    ups = lab.ups("ups1", at_shutdown_end={"command": "shutdown.return", "delay": "90s"})
    ups["nut"].update(admin)
    return ups


def test_the_ups_command_goes_out_before_the_controllers_own_machine_stops(
    own_lab: Lab, tmp_path: Path
) -> None:
    lab = own_lab
    svc = lab.service(tmp_path, ups=[load_cycle(lab)])
    try:
        svc.start()
        lab.outage()
        svc.wait(lambda: lab.is_off("mgmt"), "the controller's own machine to stop")
        events = [e["text"] for e in svc.api().get("/events?after=0")["events"]]
    finally:
        svc.stop()
    sent = next(i for i, t in enumerate(events) if "UPS ups1: sent shutdown.return" in t)
    own = next(i for i, t in enumerate(events) if "start stop:mgmt" in t)
    assert sent < own, events
    assert lab.stopped()[-1] == "mgmt"
    assert lab.nut.commands_received("ups1") == ["shutdown.return"]  # as the UPS saw it


def test_a_delay_shorter_than_the_own_machines_stop_is_refused(
    own_lab: Lab, tmp_path: Path
) -> None:
    lab = own_lab
    lab.resources[-1]["estimate"] = {"stop": "2m"}  # the UPS's 30 s delay cannot cover it
    ups = lab.ups("ups1", at_shutdown_end={"command": "shutdown.return", "delay": "30s"})
    svc = lab.service(tmp_path, ups=[ups])
    result = svc.cli("validate", check=False)
    assert result.returncode == 2
    assert "at_shutdown_end.delay" in result.stderr and "mgmt" in result.stderr


def test_sigterm_while_the_own_machine_stops_does_not_stop_it_again_at_the_next_boot(
    own_lab: Lab, tmp_path: Path
) -> None:
    lab = own_lab
    svc = lab.service(tmp_path, ups=[load_cycle(lab)])
    lab.hold("mgmt")
    try:
        svc.start()
        lab.outage()
        svc.wait(lambda: lab.begun("mgmt"), "the own machine's stop to begin")
        assert svc.terminate(group=True) == 0  # the poweroff stops the service
        lab.release("mgmt")
        svc.start()  # the next boot
        journal = svc.read_journal()
        svc.wait(lambda: journal.read.runs()[0].state == "done", "the run to be closed as done")
        assert journal.read.runs()[0].detail.startswith("finished by the controller's own poweroff")
        journal.close()
        st = svc.status()
        assert st["run"] is None
    finally:
        svc.stop()
    assert lab.calls().count("stop mgmt") == 1
