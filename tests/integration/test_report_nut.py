"""``upsguard report --last`` after a whole outage played by NUT (``dummy-ups`` and the real
``upsd``) through ``upsguard run``: the mains fail, the site shuts down, the power comes
back, the site starts again, and the report tells it all on one timeline.

The site file asks for a load cycle at the end of the shutdown (``shutdown.return``);
``dummy-ups`` offers ``load.off`` alone, so upsd answers ``ERR CMD-NOT-SUPPORTED``: the
report must show that command failed, with upsd's answer, where a person reads it.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.peers.nut import NutServer
from tests.peers.service import ServiceProcess, write_site

pytestmark = [pytest.mark.nut, pytest.mark.timeout(180)]

ONLINE = "ups.status: OL\nbattery.charge: 100\nbattery.runtime: 1800\nups.load: 30\n"
OUTAGE = (
    "ups.status: OB DISCHRG\nbattery.charge: 90\nbattery.runtime: 1200\nups.load: 30\n"
    "TIMER 12\n"
    "ups.status: OL CHRG\nbattery.charge: 90\nbattery.runtime: 1500\n"
)
"""On battery for 12 s (the shutdown takes a few), then on line for good."""


@pytest.fixture
def nut(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory({"ups1": ONLINE}, ext="dev")
    return server


def site(tmp_path: Path, nut: NutServer) -> ServiceProcess:
    password = tmp_path / "nut.pw"
    shutil.copy(nut.password_file("upsguard"), password)
    password.chmod(0o600)
    entry = {"host": "127.0.0.1", "port": nut.port, "ups": "ups1"}
    return write_site(
        tmp_path,
        {
            "site": "lab",
            "ups": [
                {
                    "name": "ups1",
                    "nut": {**entry, "user": "upsguard", "password_file": str(password)},
                    "at_shutdown_end": {"command": "shutdown.return"},
                }
            ],
            "platforms": {
                "sim": {
                    "type": "simulated",
                    "guest_shutdown": "1s",
                    "host_shutdown": "1s",
                    "power_on": "1s",
                    "host_power_on": "1s",
                }
            },
            "resources": [
                {"id": "db", "kind": "vm", "platform": "sim", "runs_on": ["h1"]},
                {"id": "h1", "kind": "host", "platform": "sim"},
            ],
            "policies": {
                "poll_interval": "500ms",
                "on_battery": {"after": "1s"},
                "shutdown": {"when_any": ["low_battery", "on_battery_for > 2s"]},
                "power_returns": {"online_for": "2s"},
                "startup": {"online_for": "2s", "charge_above": 50},
            },
        },
    )


def test_report_last_tells_the_outage_whole_and_the_command_upsd_refused(
    tmp_path: Path, nut: NutServer
) -> None:
    svc = site(tmp_path, nut)
    try:
        svc.start()
        svc.wait(lambda: svc.status()["ups"][0].get("status") == "OL", "the first reading")
        nut.write("ups1", OUTAGE)
        svc.wait(lambda: svc.status()["phase"] == "down", "the site to be down", 60)
        svc.wait(lambda: svc.status()["phase"] == "normal", "the site to be back", 90)
    finally:
        svc.stop()

    text = svc.cli("report", "--last", "--format", "md").stdout
    assert "- **Mains failed:** " in text and "- **Mains back:** 20" in text
    runs = text.split("## Runs", 1)[1].split("\n## ", 1)[0]
    kinds = [line.split(" | ")[1] for line in runs.splitlines() if line.startswith("| ")][2:]
    assert kinds == ["shutdown", "startup"]

    commands = text.split("## UPS commands", 1)[1].split("\n## ", 1)[0]
    (row,) = [line for line in commands.splitlines() if "shutdown.return" in line]
    assert "| ups1 | shutdown.return | **FAILED**: " in row and "CMD-NOT-SUPPORTED" in row

    timeline = text.split("## What happened, in order", 1)[1].split("\n## ", 1)[0]
    lines = [line for line in timeline.splitlines() if line.startswith("- ")]

    def first(words: str) -> int:
        return next(i for i, line in enumerate(lines) if words in line)

    assert (
        first("**MAINS FAILED**")
        < first("shutdown run")
        < first("**UPS COMMAND FAILED**: UPS ups1: shutdown.return")
        < first("**MAINS BACK**")
        < first("startup run")
    )
