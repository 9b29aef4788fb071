"""The printable run book: what a person follows when the controller is gone."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from upsguard.config import load_site
from upsguard.reports.runbook import RunBook, build_runbook
from upsguard.runbooks.planner import Planner

HOMELAB = Path(__file__).parents[2] / "config" / "examples" / "homelab.yaml"
CLUSTER = HOMELAB.with_name("cluster.yaml")


def book_of_homelab() -> RunBook:
    site = load_site(HOMELAB)
    return build_runbook(site, Planner(site), datetime(2026, 1, 1, tzinfo=UTC))


def test_the_triggers_read_as_the_site_file_says_them() -> None:
    """They printed "Condition(text='low_battery', flag='low_battery', metric=None, ...)"."""
    triggers = book_of_homelab().triggers
    assert "shutdown when any of: low_battery, fsd, runtime < plan + 5m, depletion > 8 %/min" in (
        triggers
    )


def test_the_controllers_machine_is_told_by_name_and_how_it_comes_back() -> None:
    """Its steps read "ssh root@127.0.0.1 'systemctl poweroff'" and "power 127.0.0.1 on":
    loopback, as seen by a controller that is gone."""
    book = book_of_homelab()
    stop = next(s for s in book.shutdown if s.resource == "mgmt")
    start = next(s for s in book.startup if s.resource == "mgmt")
    assert stop.by_hand.startswith("mgmt runs upsguard: stop it last")
    assert "127.0.0.1" not in stop.by_hand and "127.0.0.1" not in start.by_hand
    assert start.by_hand.endswith("it also starts by itself when UPS cp1500 gives power back")


def test_the_startup_never_asks_to_check_that_vms_are_off() -> None:
    """Its barrier read "check that every VM is off before going on" in the startup table."""
    site = load_site(CLUSTER)
    book = build_runbook(site, Planner(site), datetime(2026, 1, 1, tzinfo=UTC))
    (up,) = [s for s in book.startup if s.id == "start:vcenter:vms-of-unknown-placement"]
    for text in (up.what, up.automatic, up.by_hand):
        assert " off" not in text and "down" not in text
    assert up.by_hand == (
        "check that every host it waits for is up (connected) before going on: VMs of "
        "unknown placement may run on any of them"
    )
    (down,) = [s for s in book.shutdown if s.id == "stop:vcenter:vms-of-unknown-placement"]
    assert down.by_hand == "check that every VM it waits for is off before going on"
