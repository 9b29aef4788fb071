"""``upsguard ups status`` against Debian's upsd and dummy-ups on loopback."""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.peers.nut import ON_LINE, NutServer
from tests.peers.ports import free_port
from tests.peers.process import Lines
from upsguard.cli import main

pytestmark = pytest.mark.nut


def _site(tmp_path: Path, port: int, password_file: Path, watch_names: bool = True) -> Path:
    def nut(name: str) -> dict[str, Any]:
        return {
            "host": "127.0.0.1",
            "port": port,
            "ups": name,
            "user": "mon",
            "password_file": str(password_file),
            "timeout": "2s",
        }

    site = {
        "site": "lab",
        "ups": [{"name": "ups-a", "nut": nut("ups1")}, {"name": "ups-b", "nut": nut("ups2")}],
        "feeds": [{"name": "hosts", "ups": ["ups-a", "ups-b"], "min_supplies": 1}],
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site))
    return path


def test_status_json_shows_every_ups_and_the_feed(
    nut_pair: NutServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path, nut_pair.port, nut_pair.password_file("mon"))
    assert main(["ups", "status", "-c", str(site), "--format", "json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert [(u["name"], u["link"], u["flags"]) for u in doc["ups"]] == [
        ("ups-a", "ok", ["OL"]),
        ("ups-b", "ok", ["OL"]),
    ]
    assert [u["load_pct"] for u in doc["ups"]] == [35.0, 60.0]
    assert doc["ups"][0]["runtime_s"] == 1800.0 and doc["ups"][0]["input_voltage"] == 230.0
    assert doc["feeds"] == [
        {
            "name": "hosts",
            "state": "online",
            "online": 2,
            "needed": 1,
            "unknown": 0,
            "members": {"ups-a": "online", "ups-b": "online"},
            "held": 0,
            "at_risk_for_s": 0.0,
            "runtime_s": None,
            "charge_pct": None,
            "depletion_pct_per_min": None,
            "low_battery": False,
            "forced_shutdown": False,
        }
    ]


def test_status_text(
    nut_pair: NutServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = _site(tmp_path, nut_pair.port, nut_pair.password_file("mon"))
    assert main(["ups", "status", "-c", str(site), "ups-b"]) == 0
    out = capsys.readouterr().out
    lines = out.splitlines()
    assert lines[0].split() == [
        "UPS", "LINK", "STATUS", "CHARGE", "RUNTIME", "OBSERVED", "DRAIN", "LOAD", "INPUT"
    ]  # fmt: skip
    assert lines[1].split() == ["ups-b", "ok", "OL", "100%", "30m", "-", "-", "60%", "230V"]
    assert "hosts" in out and "ups-a=unknown ups-b=online" in out


def test_wrong_password_is_one_line_a_ups_and_non_zero(
    nut_pair: NutServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    bad = tmp_path / "bad.pw"
    bad.write_text("hunter2\n")
    site = _site(tmp_path, nut_pair.port, bad)
    assert main(["ups", "status", "-c", str(site)]) == 1
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 2  # each UPS entry logs in on a connection of its own
    assert all("'mon'" in line and "hunter2" not in line for line in err)
    assert "ups-a" in err[0] and "ups-b" in err[1]


def test_unreachable_upsd_shows_lost_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pw = tmp_path / "pw"
    pw.write_text("x\n")
    site = _site(tmp_path, free_port(), pw)
    assert main(["ups", "status", "-c", str(site), "--format", "json"]) == 1
    captured = capsys.readouterr()
    doc = json.loads(captured.out)
    assert [u["link"] for u in doc["ups"]] == ["lost", "lost"]
    assert doc["feeds"][0]["state"] == "unknown"  # lost contact on mains: an alert, no outage
    errors = captured.err.strip().splitlines()
    assert len(errors) == 2 and all("cannot be reached" in e for e in errors)


def test_watch_redraws_when_the_ups_goes_on_battery(nut_factory: Any, tmp_path: Path) -> None:
    server: NutServer = nut_factory({"ups1": ON_LINE, "ups2": ON_LINE}, ext="dev")
    site = _site(tmp_path, server.port, server.password_file("mon"))
    entry = "import sys; from upsguard.cli import main; sys.exit(main())"
    cmd = [sys.executable, "-c", entry, "ups", "status", "-c", str(site)]
    cmd += ["--watch", "--interval", "0.3s", "--format", "json", "--polls", "100"]
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, text=True) as proc:
        assert proc.stdout is not None
        lines = Lines(proc.stdout)
        try:
            first = json.loads(lines.next("the first view"))
            server.write("ups1", ON_LINE.replace("OL", "OB DISCHRG").replace("100", "97"))
            deadline = time.monotonic() + 20
            doc = first
            while doc["ups"][0]["flags"] != ["OB", "DISCHRG"] and time.monotonic() < deadline:
                doc = json.loads(lines.next("a view on battery"))
        finally:
            proc.terminate()
    assert first["ups"][0]["flags"] == ["OL"]
    assert doc["ups"][0]["flags"] == ["OB", "DISCHRG"] and doc["ups"][0]["charge_pct"] == 97.0
    assert doc["feeds"][0]["state"] == "degraded"
    assert doc["feeds"][0]["members"] == {"ups-a": "on-battery", "ups-b": "online"}


def test_doctor_warns_of_a_ups_that_reports_no_charge(
    nut_factory: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A driver without ``battery.charge`` (NUT's genericups): the automatic startup waits for
    a charge it can read, so the doctor says so, and what to set, before an outage does."""
    no_charge = ON_LINE.replace("battery.charge: 100\n", "")
    server = nut_factory({"ups1": no_charge, "ups2": ON_LINE}, ext="dev")
    site = _site(tmp_path, server.port, server.password_file("mon"))

    code = main(["doctor", "-c", str(site), "--only", "ups", "--format", "json"])

    findings = json.loads(capsys.readouterr().out)["findings"]
    charge = [(f["subject"], f["verdict"]) for f in findings if f["check"] == "charge"]
    assert charge == [("ups-a", "warn")]
    warned = next(f for f in findings if f["check"] == "charge")
    assert "policies.startup.charge_above: 0" in warned["fix"]
    assert code == 0
