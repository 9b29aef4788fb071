"""The vsphere platform against upsguard-vcsim (govmomi's simulator with the project's extension).

Each test starts its own simulator on a free loopback port, talks HTTPS with a verified
certificate, and checks the result at the simulator: power states it reports, and the order
of events it recorded in collectors created before acting.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest
from pyVmomi import vim

from tests.peers.ports import free_port
from tests.peers.vcsim import (
    LAB_ARGS,
    LAB_VMS,
    LIMITED_PASSWORD,
    LIMITED_USER,
    EventRecorder,
    Vcsim,
    VmSpec,
    create_vm,
    grant,
    host_names,
    start_vcsim,
    tag_vms,
    wait_for_tools,
    wait_task,
)
from upsguard.clock import SystemClock
from upsguard.config.platforms import VsphereSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import (
    AuthenticationError,
    GracefulUnavailable,
    PermanentError,
    PlatformUnreachable,
    StepFailed,
)
from upsguard.models import PlatformName, PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.vsphere import VspherePlatform

pytestmark = pytest.mark.vcsim
T = TypeVar("T")


def settings(sim: Vcsim, password_file: Path, **extra: Any) -> VsphereSettings:
    password_file.write_text(sim.password + "\n")
    values: dict[str, Any] = {
        "type": "vsphere",
        "host": sim.host,
        "port": sim.port,
        "user": sim.user,
        "password_file": password_file,
        "ca_file": sim.tls.ca_file,
        **extra,
    }
    return VsphereSettings.model_validate(values)


def res(rid: str, kind: str, **fields: Any) -> ResourceConfig:
    return ResourceConfig.model_validate({"id": rid, "kind": kind, "platform": "vc", **fields})


def run_with(platform: VspherePlatform, body: Callable[[VspherePlatform], Awaitable[T]]) -> T:
    async def main() -> T:
        await platform.open()
        try:
            return await body(platform)
        finally:
            await platform.close()

    return asyncio.run(main())


def make(sim: Vcsim, tmp_path: Path, **extra: Any) -> VspherePlatform:
    return VspherePlatform(
        PlatformName("vc"), settings(sim, tmp_path / "pw", **extra), SystemClock()
    )


async def until_healthy(p: VspherePlatform, target: Target, attempts: int = 200) -> bool:
    for _ in range(attempts):
        if await p.healthy(target):
            return True
        await asyncio.sleep(0.1)
    return False


# --- connecting ---------------------------------------------------------------------------


def test_wrong_password_is_one_line_naming_the_user(lab: Vcsim, tmp_path: Path) -> None:
    conf = settings(lab, tmp_path / "pw")
    (tmp_path / "pw").write_text("not-the-password\n")
    platform = VspherePlatform(PlatformName("vc"), conf, SystemClock())
    with pytest.raises(AuthenticationError) as err:
        asyncio.run(platform.open())
    message = str(err.value)
    assert "\n" not in message
    assert lab.user in message and "refused" in message
    assert "not-the-password" not in message


def test_unreachable_vcenter_is_one_line_naming_the_address(lab: Vcsim, tmp_path: Path) -> None:
    closed = free_port()
    conf = settings(lab, tmp_path / "pw", port=closed)
    platform = VspherePlatform(PlatformName("vc"), conf, SystemClock())
    with pytest.raises(PlatformUnreachable) as err:
        asyncio.run(platform.open())
    assert "\n" not in str(err.value)
    assert f"127.0.0.1:{closed}" in str(err.value)


def test_certificate_is_verified_by_default(lab: Vcsim, tmp_path: Path) -> None:
    conf = settings(lab, tmp_path / "pw", ca_file=None)
    platform = VspherePlatform(PlatformName("vc"), conf, SystemClock())
    with pytest.raises(PermanentError) as err:
        asyncio.run(platform.open())
    assert "not trusted" in str(err.value) and "ca_file" in str(err.value)


def test_verify_tls_false_connects_and_warns(
    lab: Vcsim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    platform = make(lab, tmp_path, ca_file=None, verify_tls=False)
    snap = run_with(platform, lambda p: p.inventory())
    assert "dc01" in {vm.name for vm in snap.vms.values()}
    assert "verify_tls is false" in caplog.text


# --- resolving resources ------------------------------------------------------------------


def test_resolve_fills_in_the_host_and_flags_system_vms(lab: Vcsim, tmp_path: Path) -> None:
    """A vCLS VM named on its own is flagged; a group never includes one (hosts handle them)."""

    async def body(p: VspherePlatform) -> tuple[list[Target], list[Target], list[Target]]:
        vm = await p.resolve(res("sql", "vm", vm="sql01"))
        vcls = await p.resolve(res("agent", "vm", vm="vCLS-DC0_C0-1"))
        assert await p.resolve(res("agents", "vm_group", select={"name": "vCLS-*"})) == []
        host = await p.resolve(res("DC0_C0_H2", "host"))
        return vm, vcls, host

    vm, vcls, host = run_with(make(lab, tmp_path), body)
    assert [(t.name, t.host, t.system) for t in vm] == [("sql01", "DC0_C0_H1", False)]
    assert [t.system for t in vcls] == [True]
    assert host[0].kind is ResourceKind.HOST and host[0].ref


@pytest.mark.parametrize(
    ("select", "members"),
    [
        ({"name": "web-*"}, ["web-01", "web-02"]),
        ({"folder": "Prod"}, ["app-01", "sql01", "web-01", "web-02"]),
        ({"folder": "Prod/Web"}, ["web-01", "web-02"]),
        ({"attribute": {"tier": "db"}}, ["sql01"]),
        ({"folder": "Prod", "attribute": {"tier": "web"}, "name": "*-02"}, ["web-02"]),
    ],
)
def test_vm_group_selectors(
    lab: Vcsim, tmp_path: Path, select: dict[str, Any], members: list[str]
) -> None:
    group = res("group", "vm_group", select=select)
    targets = run_with(make(lab, tmp_path), lambda p: p.resolve(group))
    assert [t.name for t in targets] == members


def test_tag_selector_reads_the_tagging_api(lab: Vcsim, tmp_path: Path) -> None:
    tag_vms(lab, "tier", "app", ["app-01", "stray-01"])
    tag_vms(lab, "owner", "app", ["web-01"])  # same tag name, another category

    async def body(p: VspherePlatform) -> tuple[list[str], list[str]]:
        tier = await p.resolve(res("g", "vm_group", select={"tag": "tier:app"}))
        anywhere = await p.resolve(res("h", "vm_group", select={"tag": "app"}))
        return [t.name for t in tier], [t.name for t in anywhere]

    assert run_with(make(lab, tmp_path), body) == (
        ["app-01", "stray-01"],
        ["app-01", "stray-01", "web-01"],
    )
    with pytest.raises(PermanentError, match="resource 'g': no vSphere tag 'tier:db'"):
        run_with(
            make(lab, tmp_path),
            lambda p: p.resolve(res("g", "vm_group", select={"tag": "tier:db"})),
        )


@pytest.mark.parametrize(
    ("resource", "words"),
    [
        (res("ghost", "vm"), ["'ghost'", "no VM named 'ghost'"]),
        (res("g", "vm_group", select={"attribute": {"owner": "x"}}), ["'g'", "'owner'"]),
        (res("g", "vm_group", select={"folder": "Nope"}), ["'g'", "folder 'Nope'"]),
        (res("esx99", "host"), ["'esx99'", "no host named"]),
    ],
)
def test_bad_resources_name_the_resource(
    lab: Vcsim, tmp_path: Path, resource: ResourceConfig, words: list[str]
) -> None:
    with pytest.raises(PermanentError) as err:
        run_with(make(lab, tmp_path), lambda p: p.resolve(resource))
    for word in words:
        assert word in str(err.value)


# --- stopping VMs -------------------------------------------------------------------------


def test_guest_shutdown_then_fallback_for_a_guest_that_hangs(lab: Vcsim, tmp_path: Path) -> None:
    create_vm(lab, VmSpec("stuck-01", "DC0_C0_H1", guest_shutdown="hang"))
    events = EventRecorder(lab, "VmGuestShutdownEvent", "VmPoweredOffEvent")

    async def body(p: VspherePlatform) -> tuple[bool, bool, bool]:
        (web,) = await p.resolve(res("web", "vm", vm="web-01"))
        (stuck,) = await p.resolve(res("stuck", "vm", vm="stuck-01"))
        await p.stop(web, StopMethod.GRACEFUL)
        await p.stop(stuck, StopMethod.GRACEFUL)
        web_off = await p.wait_for(web, PowerState.OFF, 10)
        stuck_off = await p.wait_for(stuck, PowerState.OFF, 1.0)
        await p.stop(stuck, StopMethod.HARD)
        return web_off, stuck_off, await p.wait_for(stuck, PowerState.OFF, 10)

    web_off, stuck_off_gracefully, stuck_off_at_last = run_with(make(lab, tmp_path), body)
    assert web_off and not stuck_off_gracefully and stuck_off_at_last
    assert events.names("VmGuestShutdownEvent") == ["web-01", "stuck-01"]
    assert sorted(events.names("VmPoweredOffEvent")) == ["stuck-01", "web-01"]
    assert lab.vm("stuck-01").runtime.powerState == "poweredOff"


def test_vm_without_tools_has_no_graceful_path(lab: Vcsim, tmp_path: Path) -> None:
    events = EventRecorder(lab, "VmGuestShutdownEvent")

    async def body(p: VspherePlatform) -> None:
        (app,) = await p.resolve(res("app", "vm", vm="app-01"))
        await p.stop(app, StopMethod.GRACEFUL)

    with pytest.raises(GracefulUnavailable, match="VMware Tools are not running"):
        run_with(make(lab, tmp_path), body)
    assert events.names("VmGuestShutdownEvent") == []
    assert lab.vm("app-01").runtime.powerState == "poweredOn"


@pytest.mark.parametrize("watch", ["updates", "poll"])
def test_many_waiters_share_one_watch(lab: Vcsim, tmp_path: Path, watch: str) -> None:
    """Waiting for every VM at once adds no request per VM: the one watch answers them all."""
    names = [f"bulk-{i:02d}" for i in range(12)]
    for name in names:
        create_vm(lab, VmSpec(name, "DC0_C0_H0", guest_shutdown="300"))

    async def body(p: VspherePlatform) -> tuple[list[bool], int, int]:
        group = await p.resolve(res("bulk", "vm_group", select={"name": "bulk-*"}))
        await asyncio.gather(*(p.stop(t, StopMethod.GRACEFUL) for t in group))
        before = p.manager.conn.round_trips
        done = await asyncio.gather(*(p.wait_for(t, PowerState.OFF, 20) for t in group))
        return list(done), p.manager.conn.round_trips - before, len(group)

    platform = make(lab, tmp_path, watch=watch, poll_interval="100ms")
    done, requests_while_waiting, count = run_with(platform, body)
    assert count == len(names) and all(done)
    assert requests_while_waiting == 0


def test_a_stale_watch_never_makes_a_vm_that_is_on_look_off(lab: Vcsim, tmp_path: Path) -> None:
    """The watch reads seldom here (every 10 minutes while idle) and saw the VM off; it is
    powered on behind upsguard's back: the check before stopping still sees it on, and the
    guest is shut down instead of the VM being called already off."""
    create_vm(lab, VmSpec("late-01", "DC0_C0_H0", power_on=False))
    events = EventRecorder(lab, "VmGuestShutdownEvent")

    async def body(p: VspherePlatform) -> tuple[PowerState, PowerState]:
        (vm,) = await p.resolve(res("late", "vm", vm="late-01"))
        watched = await p.power_state(vm)
        wait_task(lab.vm("late-01").PowerOnVM_Task())
        wait_for_tools(lab)
        now = await p.power_state(vm)
        await p.stop(vm, StopMethod.GRACEFUL)
        return watched, now

    platform = make(lab, tmp_path, watch="poll", poll_interval="60s")
    before, after = run_with(platform, body)
    assert (before, after) == (PowerState.OFF, PowerState.ON)
    assert events.names("VmGuestShutdownEvent") == ["late-01"]


# --- hosts --------------------------------------------------------------------------------


def test_host_shutdown_waits_for_maintenance_mode_and_ignores_vcls(
    lab: Vcsim, tmp_path: Path
) -> None:
    events = EventRecorder(
        lab, "EnteredMaintenanceModeEvent", "HostShutdownEvent", "VmPoweredOffEvent"
    )

    async def body(p: VspherePlatform) -> bool:
        vms = await p.resolve(res("h0-vms", "vm_group", select={"name": "*"}))
        on_h0 = [t for t in vms if t.host == "DC0_C0_H0"]
        for vm in on_h0:
            await p.stop(vm, StopMethod.GRACEFUL)
        (host,) = await p.resolve(res("DC0_C0_H0", "host", maintenance_mode=True))
        await p.stop(host, StopMethod.GRACEFUL)
        return await p.wait_for(host, PowerState.OFF, 20)

    assert run_with(make(lab, tmp_path), body)
    seen = events.read()
    assert seen[-2:] == [
        ("EnteredMaintenanceModeEvent", "DC0_C0_H0"),
        ("HostShutdownEvent", "DC0_C0_H0"),
    ]
    assert {name for kind, name in seen if kind == "VmPoweredOffEvent"} == {
        "dc01",
        "web-01",
        "vCLS-DC0_C0-1",
    }
    assert lab.host_system("DC0_C0_H1").runtime.powerState == "poweredOn"


def test_a_maintenance_mode_task_under_way_is_waited_for_not_asked_again(
    vcsim_factory: Any, tmp_path: Path
) -> None:
    """A controller that died had asked DC0_C0_H0 into maintenance mode (vcsim takes 5 s):
    the host step of the next one waits for that task, and reports the host's shutdown task
    as under way while it runs."""
    sim: Vcsim = vcsim_factory(*LAB_ARGS, "-method-delay", "EnterMaintenanceMode:5000")
    for spec in LAB_VMS:
        create_vm(sim, spec)
    events = EventRecorder(sim, "EnteredMaintenanceModeEvent", "HostShutdownEvent")
    h0 = sim.host_system("DC0_C0_H0")

    async def body(p: VspherePlatform) -> bool:
        vms = await p.resolve(res("h0-vms", "vm_group", select={"name": "*"}))
        h0.EnterMaintenanceMode_Task(timeout=0)  # the controller that died
        for vm in [t for t in vms if t.host == "DC0_C0_H0"]:
            await p.stop(vm, StopMethod.GRACEFUL)
        (host,) = await p.resolve(res("DC0_C0_H0", "host", maintenance_mode=True))
        assert await p.in_flight(host, PowerState.OFF) is None
        await p.stop(host, StopMethod.GRACEFUL)
        return await p.wait_for(host, PowerState.OFF, 20)

    assert run_with(make(sim, tmp_path), body)
    asked = [t.info.descriptionId for t in h0.recentTask]
    assert asked.count("HostSystem.enterMaintenanceMode") == 1
    assert asked.count("HostSystem.shutdown") == 1
    assert events.read() == [
        ("EnteredMaintenanceModeEvent", "DC0_C0_H0"),
        ("HostShutdownEvent", "DC0_C0_H0"),
    ]


def test_a_power_task_under_way_is_found_toward_its_state(
    vcsim_factory: Any, tmp_path: Path
) -> None:
    """A power-off task that takes vcsim 5 s: under way toward off, not toward on; then none."""
    sim: Vcsim = vcsim_factory(*LAB_ARGS, "-method-delay", "PowerOff:5000")
    create_vm(sim, VmSpec("app-01", "DC0_C0_H2", tools=False))

    async def body(p: VspherePlatform) -> list[str | None]:
        (vm,) = await p.resolve(res("app-01", "vm"))
        await p.stop(vm, StopMethod.HARD)
        found = [await p.in_flight(vm, PowerState.OFF), await p.in_flight(vm, PowerState.ON)]
        assert await p.wait_for(vm, PowerState.OFF, 20)
        return [*found, await p.in_flight(vm, PowerState.OFF)]

    toward_off, toward_on, after = run_with(make(sim, tmp_path), body)
    assert toward_off is not None and toward_off.endswith("(VirtualMachine.powerOff)")
    assert (toward_on, after) == (None, None)


@pytest.mark.parametrize("policy", ["shutdown", "ignore"])
def test_unplanned_vms_get_the_default_policy_in_the_host_step(
    lab: Vcsim, tmp_path: Path, policy: str
) -> None:
    """stray-01 (Tools) and app-01 (no Tools) run on DC0_C0_H2, and no resource covers them."""
    events = EventRecorder(
        lab, "VmGuestShutdownEvent", "VmPoweredOffEvent", "EnteredMaintenanceModeEvent"
    )
    host_res = res("DC0_C0_H2", "host", maintenance_mode=True, guest_timeout="2s")

    async def body(p: VspherePlatform) -> str:
        (host,) = await p.resolve(host_res)
        try:
            await p.stop(host, StopMethod.GRACEFUL)
        except StepFailed as exc:
            return str(exc)
        return "off" if await p.wait_for(host, PowerState.OFF, 20) else "on"

    outcome = run_with(make(lab, tmp_path, unplanned_vms=policy), body)
    seen = events.read()
    if policy == "ignore":  # left running, they keep the host out of maintenance mode
        assert "maintenance mode failed" in outcome and seen == []
        return
    assert outcome == "off"
    assert [n for k, n in seen if k == "VmGuestShutdownEvent"] == ["stray-01"]  # app-01: no Tools
    assert {n for k, n in seen if k == "VmPoweredOffEvent"} == {"stray-01", "app-01"}
    assert seen[-1] == ("EnteredMaintenanceModeEvent", "DC0_C0_H2")


def test_maintenance_mode_that_cannot_finish_reports_vsphere(lab: Vcsim, tmp_path: Path) -> None:
    async def body(p: VspherePlatform) -> None:
        (host,) = await p.resolve(
            res("DC0_C0_H2", "host", maintenance_mode=True, guest_timeout="1s")
        )
        await p.stop(host, StopMethod.GRACEFUL)

    with pytest.raises(StepFailed) as err:
        run_with(make(lab, tmp_path, unplanned_vms="ignore"), body)
    assert "DC0_C0_H2: maintenance mode failed" in str(err.value)
    assert "Timedout" in str(err.value)
    assert lab.host_system("DC0_C0_H2").runtime.powerState == "poweredOn"


def test_power_up_after_the_outage(lab: Vcsim, tmp_path: Path) -> None:
    """Host shut down, powered on by the BMC stand-in, out of maintenance; then its VM starts."""
    events = EventRecorder(
        lab, "HostConnectedEvent", "ExitMaintenanceModeEvent", "VmPoweredOnEvent"
    )

    async def body(p: VspherePlatform) -> tuple[bool, bool, bool]:
        (vm,) = await p.resolve(res("app", "vm", vm="stray-01"))
        (nt,) = await p.resolve(res("app2", "vm", vm="app-01"))
        for t in (vm, nt):
            await p.stop(t, StopMethod.HARD)
            await p.wait_for(t, PowerState.OFF, 10)
        (host,) = await p.resolve(res("DC0_C0_H2", "host", maintenance_mode=True))
        await p.stop(host, StopMethod.GRACEFUL)
        await p.wait_for(host, PowerState.OFF, 20)
        with pytest.raises(PermanentError, match="power_on_via"):
            await p.start(host)
        await asyncio.to_thread(lab.power_on_host, "DC0_C0_H2")
        host_on = await p.wait_for(host, PowerState.ON, 20) and await until_healthy(p, host)
        await p.start(vm)
        vm_on = await p.wait_for(vm, PowerState.ON, 20) and await until_healthy(p, vm)
        await p.start(nt)
        await p.wait_for(nt, PowerState.ON, 20)
        return host_on, vm_on, await p.healthy(nt)

    host_on, vm_on, without_tools_healthy = run_with(make(lab, tmp_path), body)
    assert host_on and vm_on and without_tools_healthy
    assert events.read() == [
        ("HostConnectedEvent", "DC0_C0_H2"),
        ("ExitMaintenanceModeEvent", "DC0_C0_H2"),
        ("VmPoweredOnEvent", "stray-01"),
        ("VmPoweredOnEvent", "app-01"),
    ]
    assert lab.vm("stray-01").guest.toolsRunningStatus == "guestToolsRunning"


# --- sessions and hand-over ---------------------------------------------------------------


@pytest.mark.parametrize("watch", ["updates", "poll"])
def test_expired_session_is_renewed(lab: Vcsim, tmp_path: Path, watch: str) -> None:
    async def body(p: VspherePlatform) -> bool:
        (web,) = await p.resolve(res("web", "vm", vm="web-02"))
        session_manager = p.manager.conn.content.sessionManager
        await asyncio.to_thread(session_manager.Logout)  # as if it timed out
        await p.stop(web, StopMethod.GRACEFUL)
        return await p.wait_for(web, PowerState.OFF, 20)

    assert run_with(make(lab, tmp_path, watch=watch, poll_interval="100ms"), body)
    assert lab.vm("web-02").runtime.powerState == "poweredOff"


def test_vcenter_restart_drops_the_connection_and_is_reconnected(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path
) -> None:
    """vCenter restarts mid-run: its sessions are gone and connections reset; calls go on."""
    first = vcsim_factory(*LAB_ARGS)
    create_vm(first, VmSpec("before", "DC0_C0_H0"))
    holder: list[Vcsim] = []

    async def body(p: VspherePlatform) -> tuple[list[Target], bool]:
        await p.resolve(res("before", "vm"))
        await asyncio.to_thread(first.stop)
        second = await asyncio.to_thread(start_vcsim, first.tls, *LAB_ARGS, port=first.port)
        holder.append(second)
        await asyncio.to_thread(create_vm, second, VmSpec("after", "DC0_C0_H1"))
        (after,) = await p.resolve(res("after", "vm"))  # an old snapshot would not know it
        await p.stop(after, StopMethod.HARD)
        return [after], await p.wait_for(after, PowerState.OFF, 20)

    try:
        targets, off = run_with(make(first, tmp_path), body)
    finally:
        for sim in holder:
            sim.stop()
    assert targets[0].host == "DC0_C0_H1" and off


def test_after_vcenter_stops_later_steps_go_to_the_esxi_host(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path
) -> None:
    """vCenter's VM runs on DC0_C0_H0; a second simulator in ESX mode plays that host."""
    vc = vcsim_factory("-cluster", "1", "-host", "2", "-standalone-host", "0", "-vm", "0")
    esx = vcsim_factory("-vm", "0", esx=True)
    create_vm(vc, VmSpec("vcsa", "DC0_C0_H0"))
    esx_host = host_names(esx)[0]
    create_vm(esx, VmSpec("vcsa", esx_host))
    vc_events = EventRecorder(vc, "VmGuestShutdownEvent", "HostShutdownEvent")
    esx_events = EventRecorder(esx, "VmGuestShutdownEvent", "HostShutdownEvent")
    pw = tmp_path / "esx-pw"
    pw.write_text(esx.password)
    platform = make(
        vc,
        tmp_path,
        direct_hosts={"user": esx.user, "password_file": pw, "ca_file": esx.tls.ca_file},
        direct_addresses={"DC0_C0_H0": f"127.0.0.1:{esx.port}"},
    )

    async def body(p: VspherePlatform) -> tuple[bool, bool]:
        (vcsa,) = await p.resolve(res("vcenter", "vm", vm="vcsa", serves_platform="vc"))
        await p.stop(vcsa, StopMethod.GRACEFUL)
        vcsa_off = await p.wait_for(vcsa, PowerState.OFF, 20)
        (host,) = await p.resolve(res("DC0_C0_H0", "host"), direct=True)
        await p.stop(host, StopMethod.GRACEFUL)
        return vcsa_off, await p.wait_for(host, PowerState.OFF, 20)

    assert run_with(platform, body) == (True, True)
    assert esx_events.read() == [("VmGuestShutdownEvent", "vcsa"), ("HostShutdownEvent", esx_host)]
    assert vc_events.read() == []


def test_after_the_outage_vcenter_is_started_through_its_host(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """vCenter does not answer yet: its VM (and any other) is found and started on the host."""
    esx = vcsim_factory("-vm", "0", esx=True)
    esx_host = host_names(esx)[0]
    create_vm(esx, VmSpec("vcsa", esx_host, power_on=False))
    create_vm(esx, VmSpec("dns01", esx_host, power_on=False))
    pw = tmp_path / "esx-pw"
    pw.write_text(esx.password)
    down_vcenter = VsphereSettings.model_validate(
        {
            "type": "vsphere",
            "host": "127.0.0.1",
            "port": free_port(),
            "user": "administrator@vsphere.local",
            "password_file": pw,
            "direct_hosts": {"user": esx.user, "password_file": pw, "ca_file": esx.tls.ca_file},
            "direct_addresses": {esx_host: f"127.0.0.1:{esx.port}"},
        }
    )
    platform = VspherePlatform(PlatformName("vc"), down_vcenter, SystemClock())

    async def body(p: VspherePlatform) -> tuple[bool, bool]:
        (vcsa,) = await p.resolve(res("vcenter", "vm", vm="vcsa", serves_platform="vc"))
        (dns,) = await p.resolve(res("dns", "vm", vm="dns01"))
        for target in (vcsa, dns):
            await p.start(target)
        return (
            await p.wait_for(vcsa, PowerState.ON, 20) and await until_healthy(p, vcsa),
            await p.wait_for(dns, PowerState.ON, 20),
        )

    assert run_with(platform, body) == (True, True)
    assert "working with the ESXi hosts directly" in caplog.text
    assert esx.vm("vcsa").runtime.powerState == "poweredOn"


# --- HA and DRS of a cluster ---------------------------------------------------------------


def ha_drs(sim: Vcsim) -> tuple[str, str]:
    """The cluster's HA host monitoring and DRS automation, as vcsim has them."""
    config = sim.all(vim.ClusterComputeResource)[0].configurationEx
    return config.dasConfig.hostMonitoring, config.drsConfig.defaultVmBehavior


def enable_ha_drs(sim: Vcsim) -> None:
    """HA host monitoring on and DRS fully automated (vcsim leaves both unset)."""
    cluster = sim.all(vim.ClusterComputeResource)[0]
    spec = vim.cluster.ConfigSpecEx(
        dasConfig=vim.cluster.DasConfigInfo(hostMonitoring="enabled"),
        drsConfig=vim.cluster.DrsConfigInfo(defaultVmBehavior="fullyAutomated"),
    )
    wait_task(cluster.ReconfigureComputeResource_Task(spec=spec, modify=True))
    assert ha_drs(sim) == ("enabled", "fullyAutomated")


def test_ha_and_drs_are_set_aside_before_a_host_stops_and_restored_at_the_startup(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The first host step disables HA host monitoring and sets DRS to manual; a controller
    started afresh for the startup finds the values recorded on the cluster and puts them back."""
    caplog.set_level(logging.INFO)
    sim = vcsim_factory(*LAB_ARGS)
    enable_ha_drs(sim)
    host = res("DC0_C0_H2", "host", maintenance_mode=True)

    async def shutdown(p: VspherePlatform) -> bool:
        (target,) = await p.resolve(host)
        await p.stop(target, StopMethod.GRACEFUL)
        return await p.wait_for(target, PowerState.OFF, 20)

    assert run_with(make(sim, tmp_path), shutdown)
    assert ha_drs(sim) == ("disabled", "manual")
    sim.power_on_host("DC0_C0_H2")

    async def startup(p: VspherePlatform) -> bool:
        (target,) = await p.resolve(host)
        return await p.wait_for(target, PowerState.ON, 20) and await until_healthy(p, target)

    assert run_with(make(sim, tmp_path), startup)
    assert ha_drs(sim) == ("enabled", "fullyAutomated")
    assert "HA and DRS restored" in caplog.text


def test_a_cluster_is_set_aside_once_for_all_its_hosts(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """Each host step of a cluster comes to its HA and DRS first; the first sets them aside
    and the others find it done: the cluster is read, changed and said once, not once per
    host (fifty lines in a log for a fifty-host cluster)."""
    caplog.set_level(logging.INFO)
    sim = vcsim_factory(*LAB_ARGS)
    enable_ha_drs(sim)
    hosts = [res(name, "host", maintenance_mode=True) for name in ("DC0_C0_H1", "DC0_C0_H2")]

    async def shutdown(p: VspherePlatform) -> bool:
        targets = [t for h in hosts for t in await p.resolve(h)]
        for target in targets:
            await p.stop(target, StopMethod.GRACEFUL)
        return all([await p.wait_for(t, PowerState.OFF, 20) for t in targets])

    assert run_with(make(sim, tmp_path), shutdown)
    assert ha_drs(sim) == ("disabled", "manual")
    assert caplog.text.count("HA host monitoring and DRS set aside for the shutdown") == 1


def test_a_restore_with_nothing_recorded_changes_nothing_and_says_so(
    lab: Vcsim, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    cluster = lab.all(vim.ClusterComputeResource)[0]
    spec = vim.cluster.ConfigSpecEx(
        dasConfig=vim.cluster.DasConfigInfo(hostMonitoring="disabled"),
        drsConfig=vim.cluster.DrsConfigInfo(defaultVmBehavior="partiallyAutomated"),
    )
    wait_task(cluster.ReconfigureComputeResource_Task(spec=spec, modify=True))

    async def startup(p: VspherePlatform) -> bool:
        (target,) = await p.resolve(res("DC0_C0_H0", "host"))
        return await until_healthy(p, target)

    assert run_with(make(lab, tmp_path), startup)
    assert ha_drs(lab) == ("disabled", "partiallyAutomated")
    assert "no HA or DRS values recorded on any cluster: nothing restored" in caplog.text


def test_the_rights_check_names_what_setting_ha_and_drs_aside_needs(
    vcsim_factory: Callable[..., Vcsim], tmp_path: Path
) -> None:
    sim = vcsim_factory(*LAB_ARGS, "-user", f"{LIMITED_USER}:{LIMITED_PASSWORD}")
    grant(sim, LIMITED_USER, "hosts-only", ["Host.Config.Maintenance", "Global.Settings"])
    conf = settings(sim, tmp_path / "pw").model_copy(update={"user": LIMITED_USER})
    (tmp_path / "pw").write_text(LIMITED_PASSWORD)
    platform = VspherePlatform(PlatformName("vc"), conf, SystemClock())
    found = run_with(platform, lambda p: p.diagnose([res("DC0_C0_H0", "host")]))
    assert found[-1].missing == (
        "Global.ManageCustomFields",
        "Global.SetCustomField",
        "Host.Inventory.EditCluster",
    )
    assert "Host.Inventory.EditCluster (HA and DRS set aside for the shutdown) on DC0_C0" in (
        found[-1].detail
    )
