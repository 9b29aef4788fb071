"""The proxmox platform through proxmoxer against the PVE API stand-in on loopback
(``tests.peers.pve``: PVE's API paths and JSON shapes, with state, each request checked
against PVE's published API description)."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers.ceph import SETTABLE, CephMonitor, make_monitor, require_ceph
from tests.peers.pve import (
    PLATFORM_LOG,
    TOKEN,
    PveApi,
    platform_lines,
    platform_said,
    settings_of,
)
from tests.runs import executor_for
from tests.sites import site_from
from upsguard.clock import SystemClock
from upsguard.config.platforms import ProxmoxSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import AuthenticationError, PermanentError
from upsguard.events import Event
from upsguard.models import (
    PlatformName,
    PowerState,
    ResourceKind,
    StepId,
    StepOutcome,
    StepState,
    StopMethod,
)
from upsguard.plugins import catalog
from upsguard.runbooks.planner import Planner


def platform(api: PveApi, tmp_path: Path, **extra: Any) -> Any:
    settings = settings_of(api, tmp_path, **extra)
    return catalog.load("platform", "proxmox")(
        PlatformName("pve"), ProxmoxSettings.model_validate(settings), SystemClock()
    )


def guest(name: str, kind: str = "vm", **extra: Any) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": f"res-{name}", "kind": kind, "platform": "pve", "vm": name, **extra}
    )


def test_shutdown_falls_back_to_stop_for_a_hung_guest(pve_api: PveApi, tmp_path: Path) -> None:
    pve = pve_api.pve

    async def scenario() -> list[bool]:
        px = platform(pve_api, tmp_path)
        [dc, hung] = [(await px.resolve(guest(n)))[0] for n in ("dc01", "hung01")]
        await px.stop(dc, StopMethod.GRACEFUL)
        await px.stop(hung, StopMethod.GRACEFUL)
        seen = [
            await px.wait_for(dc, PowerState.OFF, 5),
            await px.wait_for(hung, PowerState.OFF, 0.5),
        ]
        await px.stop(hung, StopMethod.HARD)
        seen.append(await px.wait_for(hung, PowerState.OFF, 5))
        return seen

    assert asyncio.run(scenario()) == [True, False, True]
    assert pve.guests[101].actions == ["shutdown"]
    assert pve.guests[103].actions == ["shutdown", "stop"]


def test_start_waits_for_the_guest_agent(pve_api: PveApi, tmp_path: Path) -> None:
    pve = pve_api.pve

    async def scenario() -> list[bool]:
        px = platform(pve_api, tmp_path)
        [app] = await px.resolve(guest("app01"))
        await px.start(app)
        seen = [await px.wait_for(app, PowerState.ON, 5), await px.healthy(app)]
        async with asyncio.timeout(30):  # a bound against a hang, never a measure
            while not await px.healthy(app):
                await asyncio.sleep(0.1)
        return [*seen, True]

    assert asyncio.run(scenario()) == [True, False, True]
    assert pve.guests[102].actions[0] == "start" and pve.guests[102].actions[-1] == "ping"


def test_groups_by_tag_and_name_include_containers(pve_api: PveApi, tmp_path: Path) -> None:
    px = platform(pve_api, tmp_path)
    infra = ResourceConfig.model_validate(
        {"id": "infra", "kind": "vm_group", "platform": "pve", "select": {"tag": "infra"}}
    )
    named = ResourceConfig.model_validate(
        {"id": "h", "kind": "vm_group", "platform": "pve", "select": {"name": "*01"}}
    )
    by_tag = asyncio.run(px.resolve(infra))
    assert [(t.name, t.ref) for t in by_tag] == [
        ("dc01", "pve1/qemu/101"),
        ("ct-dns", "pve1/lxc/201"),
    ]
    assert [t.name for t in asyncio.run(px.resolve(named))] == ["dc01", "app01", "hung01"]


def test_a_node_shuts_down_but_cannot_be_powered_on(pve_api: PveApi, tmp_path: Path) -> None:
    node = ResourceConfig.model_validate(
        {"id": "pve1", "kind": "host", "platform": "pve", "host": "pve1"}
    )

    async def scenario() -> bool:
        px = platform(pve_api, tmp_path)
        [target] = await px.resolve(node)
        assert target.kind is ResourceKind.HOST
        await px.stop(target, StopMethod.GRACEFUL)
        down: bool = await px.wait_for(target, PowerState.OFF, 5)
        with pytest.raises(PermanentError, match="set power_on_via"):
            await px.start(target)
        return down

    assert asyncio.run(scenario()) is True


def test_a_node_offline_is_off_only_once_it_accepted_its_shutdown(
    pve_api: PveApi, tmp_path: Path
) -> None:
    """PVE lists a node outside the cluster's membership as offline: one shut down, and a
    running one behind a broken cluster link, alike. Before its shutdown was accepted that
    is unknown, so the node step asks rather than count it down; after (here, or before a
    restart), it is the shutdown landing."""
    node = ResourceConfig.model_validate(
        {"id": "pve1", "kind": "host", "platform": "pve", "host": "pve1"}
    )
    pve_api.pve.nodes["pve1"] = "offline"  # its cluster link is down; it runs

    async def scenario() -> list[PowerState]:
        px = platform(pve_api, tmp_path)
        [target] = await px.resolve(node)
        seen = [await px.power_state(target)]
        px.shutdown_accepted(target)  # a resumed run tells it of a shutdown under way
        seen.append(await px.power_state(target))
        return seen

    assert asyncio.run(scenario()) == [PowerState.UNKNOWN, PowerState.OFF]


def test_api_token_authentication(pve_api: PveApi, tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text(TOKEN + "\n")
    px = platform(pve_api, tmp_path, token_name="upsguard", token_file=str(token))
    [dc] = asyncio.run(px.resolve(guest("101")))
    assert dc.name == "dc01"


def test_wrong_password_and_untrusted_certificate(pve_api: PveApi, tmp_path: Path) -> None:
    wrong = tmp_path / "wrong"
    wrong.write_text("nope\n")
    with pytest.raises(AuthenticationError, match="user 'root@pam' was refused"):
        asyncio.run(platform(pve_api, tmp_path, password_file=str(wrong)).open())
    with pytest.raises(PermanentError, match="TLS certificate is not trusted"):
        asyncio.run(platform(pve_api, tmp_path, ca_file=None).open())


def test_a_guest_action_under_way_is_found_among_its_nodes_active_tasks(
    pve_api: PveApi, tmp_path: Path
) -> None:
    pve = pve_api.pve

    async def scenario() -> list[str | None]:
        px = platform(pve_api, tmp_path)
        [dc, hung] = [(await px.resolve(guest(n)))[0] for n in ("dc01", "hung01")]
        await px.stop(hung, StopMethod.GRACEFUL)
        return [
            await px.in_flight(hung, PowerState.OFF),
            await px.in_flight(hung, PowerState.ON),
            await px.in_flight(dc, PowerState.OFF),
        ]

    shutdown, toward_on, idle = asyncio.run(scenario())
    upid = "UPID:pve1:000A1B2C:0123ABCD:6745A1B2:qmshutdown:103:root@pam:"
    assert (shutdown, toward_on, idle) == (f"Proxmox task {upid}", None, None)
    assert "GET nodes/pve1/tasks" in pve.calls


def test_a_resumed_shutdown_waits_for_the_guest_shutdowns_under_way(
    pve_api: PveApi, tmp_path: Path
) -> None:
    """A controller asked dc01 and hung01 to shut down, then died; the resumed run asks
    neither again: it waits for dc01's task, and powers hung01 off after its timeout."""
    pve = pve_api.pve
    pve.guests[101].shutdown_s = 1.0
    quick = {"guest_timeout": "1s"}
    site = site_from(
        tmp_path,
        {
            "site": "pve",
            "ups": [{"name": "ups1", "simulated": {}}],
            "platforms": {"pve": settings_of(pve_api, tmp_path)},
            "resources": [
                {"id": "dc01", "kind": "vm", "platform": "pve", "vm": "dc01"},
                {"id": "hung01", "kind": "vm", "platform": "pve", "vm": "hung01", **quick},
            ],
        },
    )
    events: list[Event] = []

    async def scenario() -> dict[str, tuple[StepState, str]]:
        died = platform(pve_api, tmp_path)
        for name in ("dc01", "hung01"):
            [target] = await died.resolve(guest(name))
            await died.stop(target, StopMethod.GRACEFUL)
        px = platform(pve_api, tmp_path)
        await px.open()
        plan = Planner(site).plan("shutdown")
        pve_platforms = {PlatformName("pve"): px}
        run = executor_for(plan, pve_platforms, SystemClock(), events.append, resumed=True)
        result = await run.run()
        return {str(o.step): (o.state, o.detail) for o in result.outcomes.values()}

    outcomes = asyncio.run(scenario())
    assert pve.guests[101].actions == ["shutdown"]
    assert pve.guests[103].actions == ["shutdown", "stop"]
    assert outcomes["stop:hung01"][0] is StepState.DONE
    assert "qmshutdown:103" in outcomes["stop:hung01"][1]
    assert outcomes["stop:hung01"][1].endswith("; powered off")
    assert outcomes["stop:dc01"][0] is StepState.DONE


def cluster_state(which: str) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": f"pve-{which}", "kind": "cluster", "cluster": which, "platform": "pve"}
    )


def test_ha_is_disarmed_and_rearmed_only_if_upsguard_disarmed_it(
    pve_api: PveApi, tmp_path: Path
) -> None:
    state = pve_api.pve
    state.ha_resources = {"vm:101": "started", "vm:103": "started"}

    async def scenario() -> list[PowerState]:
        px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        [ha] = await px.resolve(cluster_state("ha"))
        seen = [await px.power_state(ha)]
        await px.stop(ha, StopMethod.GRACEFUL)
        assert await px.wait_for(ha, PowerState.OFF, 5)
        seen.append(await px.power_state(ha))
        restarted = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        await restarted.start(ha)  # a restarted service finds what it recorded
        seen.append(await restarted.power_state(ha))
        return seen

    assert asyncio.run(scenario()) == [PowerState.ON, PowerState.OFF, PowerState.ON]
    assert state.armed == "armed"
    assert "POST cluster/ha/status/disarm-ha" in state.calls


def test_an_ha_an_operator_disarmed_stays_disarmed(pve_api: PveApi, tmp_path: Path) -> None:
    state = pve_api.pve
    state.ha_resources, state.armed = {"vm:101": "started"}, "disarmed"

    async def scenario() -> None:
        px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        [ha] = await px.resolve(cluster_state("ha"))
        await px.stop(ha, StopMethod.GRACEFUL)
        assert await px.power_state(ha) is PowerState.OFF
        await px.start(ha)
        assert await px.power_state(ha) is PowerState.ON

    asyncio.run(scenario())
    assert state.armed == "disarmed"
    assert not [c for c in state.calls if "arm-ha" in c]


def test_before_pve_9_1_each_ha_resource_is_ignored_and_put_back_as_it_was(
    pve_api: PveApi, tmp_path: Path
) -> None:
    """A PVE before 9.1 has no disarm-ha: each HA resource is set to ``ignored`` (their
    states recorded first), and the startup, in a restarted service too, puts back each one
    upsguard changed; one an operator had ignored before stays ignored."""
    state = pve_api.pve
    state.ha_disarm = False
    before = {"vm:101": "started", "vm:102": "stopped", "ct:200": "ignored"}
    state.ha_resources = dict(before)

    async def scenario() -> list[PowerState]:
        px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        [ha] = await px.resolve(cluster_state("ha"))
        seen = [await px.power_state(ha)]
        await px.stop(ha, StopMethod.GRACEFUL)
        assert state.ha_resources == dict.fromkeys(before, "ignored")
        seen.append(await px.power_state(ha))
        restarted = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        await restarted.start(ha)
        seen.append(await restarted.power_state(ha))
        return seen

    assert asyncio.run(scenario()) == [PowerState.ON, PowerState.OFF, PowerState.ON]
    assert state.ha_resources == before
    changed = [c.removeprefix("PUT cluster/ha/resources/") for c in state.calls if "PUT" in c]
    assert sorted(changed) == ["vm:101", "vm:101", "vm:102", "vm:102"]  # ignored, put back


def test_before_pve_9_1_an_ha_resource_that_reads_otherwise_is_not_ignored(
    pve_api: PveApi, tmp_path: Path
) -> None:
    """Unknown is never good news: once upsguard set them ignored, HA counts as out of the
    way only while every resource reads ``ignored``; one an operator set back is not."""
    state = pve_api.pve
    state.ha_disarm = False
    state.ha_resources = {"vm:101": "started", "vm:102": "started"}

    async def scenario() -> PowerState:
        px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        [ha] = await px.resolve(cluster_state("ha"))
        await px.stop(ha, StopMethod.GRACEFUL)
        state.ha_resources["vm:102"] = "started"
        seen: PowerState = await px.power_state(ha)
        return seen

    assert asyncio.run(scenario()) is PowerState.ON


def host(name: str) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": name, "kind": "host", "platform": "pve", "host": name}
    )


def diagnosed(pve_api: PveApi, tmp_path: Path, resources: list[ResourceConfig]) -> list[Any]:
    px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
    found: list[Any] = asyncio.run(px.diagnose(resources))
    return found


def test_doctor_names_each_privilege_the_token_lacks_on_its_path_and_what_it_is_for(
    pve_api: PveApi, tmp_path: Path
) -> None:
    """The token's privileges are read back from PVE for each path the plan's steps need
    them on; one held only where it does not propagate to is missing, and said with what
    it is for; nothing is changed on the cluster."""
    state = pve_api.pve
    state.ha_resources = {"vm:101": "started"}
    state.privileges = {"/": {"Sys.Audit"}, "/vms": {"VM.Audit", "VM.PowerMgmt"}}
    resources = [guest("web-01"), host("pve1"), cluster_state("ha")]
    privileges, ha = diagnosed(pve_api, tmp_path, resources)
    assert (privileges.check, privileges.verdict.value) == ("privileges", "fail")
    assert privileges.missing == ("Sys.Console on /", "Sys.PowerMgmt on /nodes")
    assert privileges.detail == (
        "root@pam lacks Sys.Console on / (disarm and re-arm HA (before PVE 9.1: an HA "
        "resource's state)); Sys.PowerMgmt on /nodes (shut nodes down)"
    )
    assert "Sys.Console Sys.PowerMgmt" in privileges.fix
    assert (ha.check, ha.verdict.value) == ("ha", "ok")
    assert [c for c in state.calls if not c.startswith("GET")] == []


def test_doctor_says_how_ha_is_put_out_of_the_way_on_each_version(
    pve_api: PveApi, tmp_path: Path
) -> None:
    state = pve_api.pve
    state.ha_resources = {"vm:101": "started", "vm:102": "stopped"}
    _, current = diagnosed(pve_api, tmp_path, [cluster_state("ha")])
    assert current.detail == "disarm-ha (PVE 9.1 or later); HA reads armed now"
    state.ha_disarm = False
    privileges, older = diagnosed(pve_api, tmp_path, [cluster_state("ha")])
    assert privileges.verdict.value == "ok"
    assert privileges.detail == "root@pam holds Sys.Audit, Sys.Console"
    assert older.detail == (
        "no disarm-ha (PVE before 9.1): each of its 2 HA resources is set to ignored, and "
        "put back at the startup"
    )


def test_ceph_flags_are_set_at_the_monitor_and_only_upsguards_are_unset(
    pve_api: PveApi, ceph_monitor: CephMonitor, tmp_path: Path
) -> None:
    pve_api.pve.ceph = ceph_monitor
    ceph_monitor.set_flag("noout", True)  # an operator's, before the outage

    async def scenario() -> list[PowerState]:
        px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        [flags] = await px.resolve(cluster_state("ceph_flags"))
        seen = [await px.power_state(flags)]
        await px.stop(flags, StopMethod.GRACEFUL)
        assert await px.wait_for(flags, PowerState.OFF, 10)
        assert ceph_monitor.flags() >= {"noout", "norebalance", "nobackfill", "norecover"}
        await px.start(flags)
        seen.append(await px.power_state(flags))
        return seen

    assert asyncio.run(scenario()) == [PowerState.ON, PowerState.ON]
    assert ceph_monitor.flags() & SETTABLE == {"noout"}


@pytest.fixture
def three_monitors(tmp_path: Path) -> Iterator[CephMonitor]:
    """Three Ceph monitors, as a three-node PVE cluster has."""
    require_ceph()
    (tmp_path / "ceph").mkdir()
    monitors = make_monitor(tmp_path / "ceph", ("a", "b", "c"))
    monitors.start()
    yield monitors
    monitors.stop()


def test_ceph_flags_with_three_monitors_hold_with_one_down_and_wait_for_the_quorum(
    pve_api: PveApi, three_monitors: CephMonitor, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The last node's monitor stopped (two of three left, a quorum): the flags are set and
    read back as with all three. Two stopped (no quorum: the ``ceph`` CLI gets no answer):
    the flags read unknown, never as set or unset, and the startup's Ceph step waits for
    the quorum, saying what it could not read, rather than fail or pretend. A monitor back
    (a quorum again): the step unsets what upsguard set."""
    caplog.set_level(logging.INFO, logger=PLATFORM_LOG)
    pve_api.pve.ceph = three_monitors
    wanted = {"noout", "norebalance", "nobackfill", "norecover"}
    state = str(tmp_path / "state")
    ceph = {"id": "pve-ceph", "kind": "cluster", "cluster": "ceph_flags", "platform": "pve"}
    site = site_from(
        tmp_path,
        {
            "site": "pve",
            "ups": [{"name": "ups1", "simulated": {}}],
            "platforms": {"pve": settings_of(pve_api, tmp_path, state_dir=state)},
            "resources": [ceph],
        },
    )

    async def scenario() -> StepOutcome:
        px = platform(pve_api, tmp_path, state_dir=state)
        [flags] = await px.resolve(cluster_state("ceph_flags"))
        three_monitors.stop("c")
        three_monitors.wait_for_quorum()  # the two left elect a leader again
        await px.stop(flags, StopMethod.GRACEFUL)
        assert await px.wait_for(flags, PowerState.OFF, 10)
        assert three_monitors.flags() >= wanted
        three_monitors.stop("b")
        three_monitors.wait_for_quorum()  # none: the monitor left answers nothing
        plan = Planner(site).plan("startup")
        restarted = {PlatformName("pve"): platform(pve_api, tmp_path, state_dir=state)}
        run = executor_for(plan, restarted, SystemClock(), lambda event: None)
        startup = asyncio.create_task(run.run())
        await platform_said(caplog, "(Ceph unknown: read the Ceph flags failed: ")
        assert not startup.done()
        said = "the Ceph flags read unknown (read the Ceph flags failed: "
        assert any(said in line for line in platform_lines(caplog))  # the step's first read
        await asyncio.to_thread(three_monitors.start, "b")
        async with asyncio.timeout(60):  # a bound against a hang, never a measure
            result = await startup
        return result.outcomes[StepId("start:pve-ceph")]

    outcome = asyncio.run(scenario())
    assert (outcome.state, outcome.detail) == (StepState.DONE, "Ceph flags of pve up")
    assert three_monitors.flags() & wanted == set()


def test_ceph_flags_that_cannot_be_read_are_unknown(pve_api: PveApi, tmp_path: Path) -> None:
    """No Ceph answering (here: none at all): neither set nor unset."""

    async def scenario() -> PowerState:
        px = platform(pve_api, tmp_path, state_dir=str(tmp_path / "state"))
        [flags] = await px.resolve(cluster_state("ceph_flags"))
        state: PowerState = await px.power_state(flags)
        return state

    assert asyncio.run(scenario()) is PowerState.UNKNOWN
