"""The power watch survives every other failure: a UPS entry without a source, a broken UPS
beside a good one, an exception between the phase change and the run, a stepped clock, a
plugin name that does not exist. Each through the real service process and a real upsd."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from tests.faults.lab import Lab, polls_pass
from tests.peers.ports import free_port
from tests.peers.service import write_site
from upsguard.events import PhaseChanged
from upsguard.journal import Journal
from upsguard.models import Phase

pytestmark = [pytest.mark.nut, pytest.mark.timeout(240)]


def test_a_ups_entry_without_a_source_is_a_config_error_not_a_fake_ups(
    lab: Lab, tmp_path: Path
) -> None:
    svc = lab.service(tmp_path)
    text = svc.site.read_text()
    site = yaml.safe_load(text)
    for entry, says in (
        ({"name": "ups1", "nut": None}, "'nut:' is empty"),  # the nut: body commented out
        ({"name": "ups1"}, "simulated: {}"),  # no source at all
    ):
        site["ups"] = [entry]
        svc.site.write_text(yaml.safe_dump(site))
        for command in ("validate", "run"):
            result = svc.cli(command, check=False)
            assert result.returncode == 2, result.stderr
            (line,) = result.stderr.strip().splitlines()
            assert line.startswith("upsguard: ups[0]: ") and says in line


def test_one_broken_ups_does_not_blind_the_watch_of_the_others(lab: Lab, tmp_path: Path) -> None:
    broken = lab.ups("ups2", nut_name="ups2typo")
    svc = lab.service(tmp_path, ups=[lab.ups("ups1"), broken])
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "ups1 read")
        lab.outage()
        lab.wait_all_off(svc)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        st = svc.status()
        ups2 = st["ups"][1]
        assert "ups2typo" in ups2["error"] and ups2.get("link") != "ok"
    finally:
        svc.stop()


def test_a_failing_cache_flip_is_that_caches_failure_and_the_shutdown_goes_on(
    lab: Lab, tmp_path: Path
) -> None:
    key = tmp_path / "broken_key"
    key.write_text("-----BEGIN OPENSSH PRIVATE KEY-----\nnot a key\n")
    cache = {
        "name": "flash",
        "provider": "bcache",
        "ssh": {"host": "127.0.0.1", "port": free_port(), "key_file": str(key)},
        "carries": ["db"],
        "destage_timeout": "2s",
    }
    svc = lab.service(tmp_path, caches=[cache])
    try:
        svc.start()
        lab.outage()  # OB LB at 5 %: below the critical floor, so dirty caches are not waited on
        lab.wait_all_off(svc)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
        events = svc.cli("events", "-n", "200").stdout
        assert "cache flash/* -> write-through FAILED" in events
        assert "Traceback" not in svc.log.read_text()
    finally:
        svc.stop()


def test_a_site_left_shutting_down_without_a_run_starts_its_shutdown(
    lab: Lab, tmp_path: Path
) -> None:
    """What a restart found after an exception had stopped the run from starting: the
    journal says shutting_down, and no run exists. Decisions are level-triggered."""
    svc = lab.service(tmp_path)
    journal = Journal(svc.journal)
    from datetime import UTC, datetime

    now = datetime.now(UTC)
    journal.write.record(PhaseChanged(now, Phase.NORMAL, Phase.ON_BATTERY, "on battery"))
    journal.write.record(PhaseChanged(now, Phase.ON_BATTERY, Phase.SHUTTING_DOWN, "low_battery"))
    journal.close()
    lab.outage()
    try:
        svc.start()
        lab.wait_all_off(svc)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
    finally:
        svc.stop()


def test_a_wall_clock_stepped_back_does_not_pause_the_watch(lab: Lab, tmp_path: Path) -> None:
    libfaketime = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
    if not libfaketime.exists():
        pytest.fail(f"{libfaketime} is missing: run scripts/setup --tests (installs faketime)")
    offset = tmp_path / "faketime"
    offset.write_text("+0\n")
    svc = lab.service(tmp_path)
    svc.env = {
        "LD_PRELOAD": str(libfaketime),
        "FAKETIME_TIMESTAMP_FILE": str(offset),
        "FAKETIME_NO_CACHE": "1",
        "DONT_FAKE_MONOTONIC": "1",
    }
    try:
        svc.start()
        polls_pass(svc, 2)
        offset.write_text("-1h\n")  # the wall clock goes back an hour
        polls_pass(svc, 2)
        lab.outage()
        lab.wait_all_off(svc)
        assert lab.stopped() == ["web", "db", "h1", "nas1"]
    finally:
        svc.stop()


def test_a_plugin_name_that_does_not_exist_fails_validate_as_it_would_fail_run(
    lab: Lab, tmp_path: Path
) -> None:
    svc = lab.service(tmp_path, platforms={"cmd": {"type": "comand"}})
    for command in ("validate", "run"):
        result = svc.cli(command, check=False)
        assert result.returncode == 2, (command, result.stderr)
        assert "platforms.cmd.type" in result.stderr and "'command'" in result.stderr
        assert "site.yaml:" in result.stderr and "Traceback" not in result.stderr


def test_two_services_on_one_journal_refuse_the_second(lab: Lab, tmp_path: Path) -> None:
    first = lab.service(tmp_path)
    second_dir = tmp_path / "second"
    second_dir.mkdir()
    second = write_site(second_dir, {**lab.site(), "journal": str(first.journal)})
    try:
        first.start()
        result = second.cli("run", check=False)
        assert result.returncode == 1
        (line,) = result.stderr.strip().splitlines()
        assert first.proc is not None
        assert str(first.journal) in line and f"pid {first.proc.pid}" in line
        assert first.status()["phase"] == "normal"
    finally:
        first.stop()
