"""The printable run book: what a person follows when the controller is gone."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

from upsguard.config import load_site
from upsguard.models import PlatformName, ResourceId, ResourceKind, Target
from upsguard.reports import render
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


def book_of_cluster() -> RunBook:
    site = load_site(CLUSTER)
    return build_runbook(site, Planner(site), datetime(2026, 1, 1, tzinfo=UTC))


def test_a_started_vsphere_host_is_taken_out_of_maintenance_mode_by_hand_too() -> None:
    """The startup never said to leave maintenance mode, which upsguard does itself."""
    (esx02,) = [s for s in book_of_cluster().startup if s.resource == "esx02"]
    assert "ExitMaintenanceMode_Task" in esx02.automatic
    assert esx02.by_hand.endswith(
        "then take it out of maintenance mode: ESXi host client https://esx02.hq.example/ui "
        "> Exit maintenance mode, or ssh root@esx02.hq.example 'esxcli system "
        "maintenanceMode set -e false'"
    )


def test_the_controllers_machine_stops_after_the_ups_is_told_to_give_power_back() -> None:
    """Nothing said to send shutdown.return before powering off the controller by hand."""
    (own,) = [s for s in book_of_homelab().shutdown if s.resource == "mgmt"]
    assert own.by_hand.startswith(
        "mgmt runs upsguard: stop it last, after everything above. First tell UPS cp1500 to "
        "give power back when the mains return, on mgmt: upsc cp1500 ups.delay.shutdown "
        "should read 120 (upsrw -s ups.delay.shutdown=120 -u upsguard cp1500), then upscmd "
        "-u upsguard cp1500 shutdown.return; then, from its own console"
    )
    (cluster_own,) = [s for s in book_of_cluster().shutdown if s.resource == "mgmt01"]
    assert "UPS ups-a (SNMP, ups-mib at 10.0.0.5): on its web page or front panel" in (
        cluster_own.by_hand
    )


def test_each_cache_says_how_to_put_it_back_after_the_outage() -> None:
    (cache,) = book_of_homelab().caches
    assert cache.back == (
        "once power is back and the hosts are up: echo writeback > "
        "/sys/block/<bcacheN>/bcache/cache_mode, and writeback_percent, writeback_delay back "
        "to what they read before (bcache's defaults: 10 and 30)"
    )


def test_group_steps_name_their_vms_or_say_they_are_chosen_at_run_time() -> None:
    """They said "ShutdownGuest on web": no VM is called web."""
    (web,) = [s for s in book_of_cluster().shutdown if s.resource == "web"]
    assert web.automatic == (
        "vSphere API: ShutdownGuest on each VM of group web (name web-*, folder Prod/Web; "
        "which ones is read from live inventory when the plan runs: upsguard inventory lists "
        "them); PowerOffVM_Task after 5m"
    )
    assert web.by_hand.startswith(
        "vSphere Client (once vCenter is down: the ESXi host client): each VM of group web "
        "(name web-*, folder Prod/Web; which ones is read from live inventory"
    )
    site = load_site(CLUSTER)
    vm = ResourceKind.VM
    found = {
        ResourceId("web"): [
            Target(PlatformName("vcenter"), vm, "web-01", host="esx02.hq.example"),
            Target(PlatformName("vcenter"), vm, "web-02", host="esx03.hq.example"),
        ]
    }
    live = build_runbook(site, Planner(site, found), datetime(2026, 1, 1, tzinfo=UTC))
    named = [s for s in live.shutdown if s.resource == "web"]
    assert [s.automatic.split(";")[0] for s in named] == [
        "vSphere API: ShutdownGuest on web-01",
        "vSphere API: ShutdownGuest on web-02",
    ]


def test_a_woken_machine_shows_its_mac_and_an_ipmi_one_its_ipmitool_line() -> None:
    """A MAC the site file knows was not printed; nas01 (ssh, powered on over IPMI) read only
    "power nas01.hq.example on"."""
    (esxi01,) = [s for s in book_of_homelab().startup if s.resource == "esxi01"]
    assert "00:25:90:aa:10:01" in esxi01.automatic
    assert esxi01.by_hand.startswith("wakeonlan -i 192.168.1.255 00:25:90:aa:10:01")
    (nas01,) = [s for s in book_of_cluster().startup if s.resource == "nas01"]
    assert nas01.by_hand == (
        "ipmitool -I lanplus -H 10.0.1.30 -U upsguard -a chassis power on (or the power button)"
    )


def test_a_step_directly_on_the_host_names_the_esxi_host_to_log_in_to() -> None:
    book = book_of_cluster()
    (dc01,) = [s for s in book.shutdown if s.resource == "dc01"]
    assert dc01.by_hand.startswith(
        "vCenter is down: ESXi host client https://esx01.hq.example/ui: dc01 > Power > Shut "
        "Down Guest OS"
    )
    (up,) = [s for s in book.startup if s.resource == "dc01"]
    assert up.by_hand.startswith("vCenter is down: ESXi host client https://esx01.hq.example/ui")


def test_the_printed_book_says_how_to_put_the_caches_back() -> None:
    book = book_of_homelab()
    for form in ("md", "html"):
        text = render.runbook(book, form)
        assert "after the outage" in text and "writeback_delay back to what they read" in text
