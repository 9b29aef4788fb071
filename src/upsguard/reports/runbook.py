"""The printable run book: the shutdown and startup order, what upsguard does at each step,
what a person does by hand when upsguard itself is down, and who to call.

It is made from the same plans the service runs, so the paper and the controller agree on
the order. A resource's ``manual:`` text replaces the derived instructions; its
``contact:`` names someone from the site's ``contacts:`` (or is printed as given).
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from upsguard.config.caches import CacheConfig
from upsguard.config.platforms import (
    CommandSettings,
    IpmiSettings,
    LibvirtSettings,
    PlatformBase,
    ProxmoxSettings,
    RedfishSettings,
    SshSettings,
    VsphereSettings,
    WolSettings,
)
from upsguard.config.resources import ResourceConfig
from upsguard.config.site import Contact, SiteConfig
from upsguard.config.types import format_duration
from upsguard.config.ups import UpsConfig
from upsguard.models import Direction, ResourceKind
from upsguard.runbooks.plan import Action, Plan, Step
from upsguard.runbooks.planner import Planner


@dataclass(frozen=True, slots=True)
class BookStep:
    number: int
    id: str
    resource: str
    what: str
    waits_for: tuple[str, ...]
    automatic: str
    """The command or API action upsguard carries out."""
    by_hand: str
    """What a person does when upsguard is down."""
    contact: str
    estimate: str
    critical: bool
    point_of_no_return: bool
    caches: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class BookCache:
    name: str
    provider: str
    carries: tuple[str, ...]
    automatic: str
    by_hand: str
    back: str
    """How a person puts it back to write-back after the outage."""


@dataclass(frozen=True, slots=True)
class RunBook:
    site: str
    made: datetime
    contacts: tuple[Contact, ...]
    ups: tuple[str, ...]
    triggers: tuple[str, ...]
    caches: tuple[BookCache, ...]
    shutdown: tuple[BookStep, ...]
    startup: tuple[BookStep, ...]
    shutdown_estimate: str
    startup_estimate: str
    notes: tuple[str, ...]


def build_runbook(site: SiteConfig, planner: Planner, made: datetime) -> RunBook:
    shutdown = planner.plan(Direction.SHUTDOWN)
    startup = planner.plan(Direction.STARTUP)
    contacts = {c.name: c for c in site.contacts}
    return RunBook(
        site=site.site,
        made=made,
        contacts=tuple(site.contacts),
        ups=tuple(_ups_line(site, i) for i in range(len(site.ups))),
        triggers=tuple(_triggers(site)),
        caches=tuple(_cache(c) for c in site.caches),
        shutdown=tuple(_steps(site, shutdown, contacts)),
        startup=tuple(_steps(site, startup, contacts)),
        shutdown_estimate=_estimate(shutdown),
        startup_estimate=_estimate(startup),
        notes=(*shutdown.notes, *startup.notes),
    )


def _estimate(plan: Plan) -> str:
    return (
        f"about {format_duration(plan.estimate_s)} "
        f"(critical path {format_duration(plan.critical_path_s)})"
    )


def _ups_line(site: SiteConfig, index: int) -> str:
    ups = site.ups[index]
    if ups.nut is not None:
        where = f"NUT: upsc {ups.nut.ups}@{ups.nut.host}:{ups.nut.port}"
    elif ups.snmp is not None:
        where = f"SNMP ({ups.snmp.mib}) at {ups.snmp.host}:{ups.snmp.port}"
    else:
        where = "simulated"
    model = ""
    if ups.runtime_at is not None:
        model = (
            f"; lasts about {format_duration(ups.runtime_at.minutes * 60)} at "
            f"{ups.runtime_at.load_watts:.0f} W"
        )
    return f"{ups.name}: {where}{model}"


def _triggers(site: SiteConfig) -> list[str]:
    policies = site.policies
    out = [
        "on battery: caches go write-through at once, so they are clean before any host or "
        "storage goes down",
        "shutdown when any of: " + ", ".join(str(c) for c in policies.shutdown.when_any),
        f"required margin: {format_duration(policies.required_margin)} of battery left when "
        "everything is down",
    ]
    return out


def _steps(site: SiteConfig, plan: Plan, contacts: dict[str, Contact]) -> list[BookStep]:
    index = site.resource_index()
    critical = set(plan.critical_path)
    out = []
    for number, step in enumerate(plan.steps, 1):
        res = index.get(step.resource)
        platform = site.platform(res.platform) if res is not None and res.platform else None
        out.append(
            BookStep(
                number=number,
                id=step.id,
                resource=step.resource,
                what=step.description,
                waits_for=step.waits_for,
                automatic=_automatic(step, res, platform, site),
                by_hand=_by_hand(step, res, platform, site),
                contact=_contact(res, contacts),
                estimate=format_duration(step.estimate_s),
                critical=step.id in critical,
                point_of_no_return=step.is_point_of_no_return
                and plan.direction is Direction.SHUTDOWN,
                caches=step.caches,
            )
        )
    return out


def _contact(res: ResourceConfig | None, contacts: dict[str, Contact]) -> str:
    if res is None or res.contact is None:
        return ""
    person = contacts.get(res.contact)
    if person is None:
        return res.contact
    reach = ", ".join(x for x in (person.phone, person.email) if x)
    return f"{person.name} ({reach})" if reach else person.name


# -- what upsguard does, and what a person does instead -----------------------------------------


def _automatic(
    step: Step, res: ResourceConfig | None, platform: PlatformBase | None, site: SiteConfig
) -> str:
    if step.action is Action.BARRIER or res is None:
        return step.description
    name = res.target_name
    vms = _vms(step, res)
    timeout = format_duration(res.guest_timeout)
    match step.action, platform:
        case Action.GUEST_SHUTDOWN, VsphereSettings():
            return f"vSphere API: ShutdownGuest on {vms}; PowerOffVM_Task after {timeout}"
        case Action.HOST_SHUTDOWN, VsphereSettings():
            mm = "EnterMaintenanceMode_Task, then " if res.maintenance_mode else ""
            return f"vSphere API: {mm}ShutdownHost_Task on {name}"
        case Action.POWER_ON, VsphereSettings():
            return f"vSphere API: PowerOnVM_Task on {vms}"
        case (Action.GUEST_SHUTDOWN, ProxmoxSettings()):
            return f"Proxmox API: status/shutdown of {vms}; status/stop after {timeout}"
        case (Action.GUEST_SHUTDOWN, LibvirtSettings()):
            return f"libvirt: virDomainShutdown {vms}; virDomainDestroy after {timeout}"
    stop = step.id.startswith("stop:")
    if not stop and res.power_on_via:
        then = "then waits until it answers"
        if isinstance(platform, VsphereSettings) and res.kind is ResourceKind.HOST:
            then = (
                "waits until it is connected, then ExitMaintenanceMode_Task if it is in "
                "maintenance mode"
            )
        return f"powers {name} on {_power_on_automatic(res, site)}, {then}"
    command = res.shutdown if stop else res.startup
    match platform:
        case SshSettings() if command:
            return f"ssh {platform.user}@{name} '{command}'"
        case SshSettings() if stop:
            return f"ssh {platform.user}@{name} 'poweroff'"
        case CommandSettings() if command:
            return f"runs on the upsguard machine: {command}"
    return step.description


def _power_on_automatic(res: ResourceConfig, site: SiteConfig) -> str:
    """How ``power_on_via`` powers it on, with the address or MAC it uses."""
    via_name = res.power_on_via or ""
    match site.platform(via_name):
        case WolSettings() as wol:
            mac = res.mac or "no MAC given"
            return f"by Wake-on-LAN to {mac} ({via_name}: {wol.broadcast} port {wol.port})"
        case IpmiSettings() as ipmi:
            return f"through {via_name} (IPMI chassis power on at {ipmi.host})"
        case RedfishSettings() as redfish:
            return f"through {via_name} (Redfish Reset On at {redfish.host})"
    return f"through {via_name}"


MAX_VMS_NAMED = 6


def _vms(step: Step, res: ResourceConfig) -> str:
    """The VMs a step acts on: named where the plan knows them (live inventory, the site
    file); a group the plan was made without inventory for is told by its selector, and
    that which VMs it covers is read when the plan runs."""
    if step.targets:
        names = [t.name for t in step.targets]
        more = len(names) - MAX_VMS_NAMED
        return ", ".join(names[:MAX_VMS_NAMED]) + (f" and {more} more" if more > 0 else "")
    if res.kind is ResourceKind.VM_GROUP:
        criteria = ", ".join(
            f"{k} {v}"
            for k, v in (res.select.model_dump(exclude_none=True) if res.select else {}).items()
        )
        return (
            f"each VM of group {res.id} ({criteria}; which ones is read from live inventory "
            "when the plan runs: upsguard inventory lists them)"
        )
    return res.target_name


def _by_hand(
    step: Step, res: ResourceConfig | None, platform: PlatformBase | None, site: SiteConfig
) -> str:
    if res is None:  # a barrier
        if step.id.startswith("stop:"):
            return "check that every VM it waits for is off before going on"
        return (
            "check that every host it waits for is up (connected) before going on: VMs of "
            "unknown placement may run on any of them"
        )
    if res.manual:
        return res.manual
    stop = step.id.startswith("stop:")
    if res.runs_upsguard:
        return _own_machine_by_hand(res, stop, site)
    name = res.target_name
    vsphere_vm = isinstance(platform, VsphereSettings) and not res.kind.is_hardware
    if not stop and res.power_on_via and not vsphere_vm:
        back = _power_on_by_hand(res, site)
        if isinstance(platform, VsphereSettings):
            back += (
                f"; then take it out of maintenance mode: ESXi host client https://{name}/ui > "
                f"Exit maintenance mode, or ssh root@{name} 'esxcli system maintenanceMode "
                "set -e false'"
            )
        return back
    match platform:
        case VsphereSettings() if res.kind is ResourceKind.HOST:
            if stop:
                return (
                    f"ESXi host client https://{name}/ui (or vSphere Client): enter maintenance "
                    f"mode, then Shut down; or ssh root@{name} 'esxcli system maintenanceMode "
                    "set -e true; esxcli system shutdown poweroff -r ups'"
                )
            return _power_on_by_hand(res, site)
        case VsphereSettings():
            where = _vsphere_client(step, res, site)
            if stop:
                return (
                    f"{where}: {_vms(step, res)} > Power > Shut Down Guest OS; Power Off if "
                    f"still on after {format_duration(res.guest_timeout)}"
                )
            return f"{where}: {_vms(step, res)} > Power > Power On"
        case ProxmoxSettings():
            return f"on the Proxmox node: qm {'shutdown' if stop else 'start'} <vmid of {name}>"
        case LibvirtSettings():
            return f"virsh -c {platform.uri} {'shutdown' if stop else 'start'} {name}"
        case SshSettings():
            command = res.shutdown if stop else res.startup
            if command:
                return f"ssh {platform.user}@{name} '{command}'"
            return f"log in to {name} and shut it down" if stop else f"power {name} on"
        case CommandSettings():
            command = res.shutdown if stop else res.startup
            return f"run: {command}" if command else "nothing to run"
    if not stop:
        return _power_on_by_hand(res, site)
    return f"shut {res.kind} {name} down from its own console or front panel"


def _vsphere_client(step: Step, res: ResourceConfig, site: SiteConfig) -> str:
    """Where a person acts on a VM: vCenter's client, or, for a step planned directly on
    the host (vCenter is down by then), the ESXi host client of the host it runs on."""
    if not step.direct:
        return "vSphere Client (once vCenter is down: the ESXi host client)"
    index = site.resource_index()
    hosts = sorted({t.host for t in step.targets if t.host})
    hosts = hosts or [index[h].target_name for h in res.runs_on if h in index]
    if hosts:
        clients = " or ".join(f"https://{h}/ui" for h in hosts)
        return f"vCenter is down: ESXi host client {clients}"
    candidates = ", ".join(h.target_name for h in site.hosts_of_platform(res.platform or ""))
    return (
        "vCenter is down: the ESXi host client of the host it runs on (not known to the site "
        f"file: one of {candidates or 'its hosts'})"
    )


def _own_machine_by_hand(res: ResourceConfig, stop: bool, site: SiteConfig) -> str:
    """The controller's machine, named by its id: the run book is read when upsguard is
    gone, and its address (often loopback) says nothing to the person at the rack. Before
    it stops, each UPS is told what upsguard would tell it (``at_shutdown_end``): without
    it, a UPS that is not cut brings nothing back when the mains return."""
    if stop:
        command = res.shutdown or "systemctl poweroff"
        told = [_tell_ups(ups, res) for ups in site.ups if ups.at_shutdown_end.command]
        first = f" First {'; '.join(told)}; then," if told else ""
        return (
            f"{res.id} runs upsguard: stop it last, after everything above.{first} from its "
            f"own console or an SSH session to it: {command}"
        )
    cycles = [u.name for u in site.ups if u.at_shutdown_end.command == "shutdown.return"]
    back = (
        f"; it also starts by itself when UPS {', '.join(cycles)} gives power back"
        if cycles
        else ""
    )
    return _power_on_by_hand(res, site).replace(res.target_name, res.id) + back


def _tell_ups(ups: UpsConfig, own: ResourceConfig) -> str:
    """The UPS command of the shutdown's end, as a person sends it (on the controller's
    machine when upsd runs there: its loopback address means nothing elsewhere)."""
    end = ups.at_shutdown_end
    why = " to give power back when the mains return" if end.brings_power_back else ""
    delay = round(end.delay.total_seconds())
    if ups.nut is not None:
        nut = ups.nut
        at, where = f"{nut.ups}@{nut.host}:{nut.port}", ""
        if nut.on_this_machine:
            at, where = (
                nut.ups if nut.port == 3493 else f"{nut.ups}@localhost:{nut.port}",
                (f", on {own.id}"),
            )
        user = f" -u {nut.user}" if nut.user else ""
        return (
            f"tell UPS {ups.name}{why}{where}: upsc {at} ups.delay.shutdown should read {delay} "
            f"(upsrw -s ups.delay.shutdown={delay}{user} {at}), then upscmd{user} {at} "
            f"{end.command}"
        )
    if ups.snmp is not None:
        return (
            f"tell UPS {ups.name} (SNMP, {ups.snmp.mib} at {ups.snmp.host}): on its web page "
            f"or front panel{why}, {end.command} after {format_duration(end.delay)}"
        )
    return f"tell UPS {ups.name}{why}: {end.command}"


def _power_on_by_hand(res: ResourceConfig, site: SiteConfig) -> str:
    name = res.target_name
    via = site.platform(res.power_on_via) if res.power_on_via else None
    match via:
        case IpmiSettings():
            user = f" -U {via.user}" if via.user else ""
            return (
                f"ipmitool -I lanplus -H {via.host}{user} -a chassis power on (or the power button)"
            )
        case RedfishSettings():
            return f"BMC web page {via.host}: Power On (or the power button of {name})"
        case WolSettings():
            port = f" -p {via.port}" if via.port != 9 else ""
            mac = res.mac or "<MAC of " + name + ">"
            return f"wakeonlan -i {via.broadcast}{port} {mac} (or the power button)"
    return f"press the power button of {name}"


_CACHE_BY_HAND = {
    "bcache": "echo writethrough > /sys/block/<bcacheN>/bcache/cache_mode, writeback_percent 0, "
    "writeback_delay 0; wait until /sys/block/<bcacheN>/bcache/dirty_data reads 0",
    "lvmcache": "lvchange --cachepolicy cleaner <vg>/<lv> (note the policy first: lvs -o "
    "cache_policy); wait until dmsetup status <vg-lv> shows 0 dirty",
    "writecache": "dmsetup reload <vg-lv> with 'cleaner' added to its table, dmsetup resume "
    "<vg-lv>, dmsetup message <vg-lv> 0 cleaner; wait until nothing is cached",
    "opencas": "casadm -Q -i <cache id> -c wt -f yes (flushes, then switches)",
    "storcli": "storcli64 /c0/v<N> set wrcache=WT; storcli64 /c0 flushcache",
    "fvp": "FVP management console: set the VMs' policy to write-through",
}


_CACHE_BACK = {
    "bcache": "echo writeback > /sys/block/<bcacheN>/bcache/cache_mode, and writeback_percent, "
    "writeback_delay back to what they read before (bcache's defaults: 10 and 30)",
    "lvmcache": "lvchange --cachepolicy <the policy noted> <vg>/<lv>",
    "writecache": "dmsetup reload <vg-lv> with its table as before (without 'cleaner'), then "
    "dmsetup resume <vg-lv>",
    "opencas": "casadm -Q -i <cache id> -c wb",
    "storcli": "storcli64 /c0/v<N> set wrcache=WB",
    "fvp": "FVP management console: set the VMs' policy back to write-back",
}


def _cache(cache: CacheConfig) -> BookCache:
    by_hand = _CACHE_BY_HAND.get(
        cache.provider, "the provider's own tool: set write-through, wait until clean"
    )
    back = _CACHE_BACK.get(cache.provider, "the provider's own tool: set write-back again")
    return BookCache(
        name=cache.name,
        provider=cache.provider,
        carries=tuple(cache.carries),
        automatic=f"write-through on battery, then waits until clean (at most "
        f"{format_duration(cache.destage_timeout)}); by hand with upsguard: "
        f"upsguard cache set write-through {cache.name} --wait -c SITE.yaml",
        by_hand=by_hand,
        back=f"once power is back and the hosts are up: {back}",
    )
