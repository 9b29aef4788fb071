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
                automatic=_automatic(step, res, platform),
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


def _automatic(step: Step, res: ResourceConfig | None, platform: PlatformBase | None) -> str:
    if step.action is Action.BARRIER or res is None:
        return step.description
    name = res.target_name
    timeout = format_duration(res.guest_timeout)
    match step.action, platform:
        case Action.GUEST_SHUTDOWN, VsphereSettings():
            return f"vSphere API: ShutdownGuest on {name}; PowerOffVM_Task after {timeout}"
        case Action.HOST_SHUTDOWN, VsphereSettings():
            mm = "EnterMaintenanceMode_Task, then " if res.maintenance_mode else ""
            return f"vSphere API: {mm}ShutdownHost_Task on {name}"
        case Action.POWER_ON, VsphereSettings():
            return f"vSphere API: PowerOnVM_Task on {name}"
        case (Action.GUEST_SHUTDOWN, ProxmoxSettings()):
            return f"Proxmox API: status/shutdown of {name}; status/stop after {timeout}"
        case (Action.GUEST_SHUTDOWN, LibvirtSettings()):
            return f"libvirt: virDomainShutdown {name}; virDomainDestroy after {timeout}"
    stop = step.id.startswith("stop:")
    if not stop and res.power_on_via:
        return f"powers {name} on through {res.power_on_via}, then waits until it answers"
    command = res.shutdown if stop else res.startup
    match platform:
        case SshSettings() if command:
            return f"ssh {platform.user}@{name} '{command}'"
        case SshSettings() if stop:
            return f"ssh {platform.user}@{name} 'poweroff'"
        case CommandSettings() if command:
            return f"runs on the upsguard machine: {command}"
    return step.description


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
            if stop:
                return (
                    f"vSphere Client (once vCenter is down: the ESXi host client): {name} > "
                    f"Power > Shut Down Guest OS; Power Off if still on after "
                    f"{format_duration(res.guest_timeout)}"
                )
            return f"vSphere Client (or the ESXi host client): {name} > Power > Power On"
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


def _own_machine_by_hand(res: ResourceConfig, stop: bool, site: SiteConfig) -> str:
    """The controller's machine, named by its id: the run book is read when upsguard is
    gone, and its address (often loopback) says nothing to the person at the rack."""
    if stop:
        command = res.shutdown or "systemctl poweroff"
        return (
            f"{res.id} runs upsguard: stop it last, after everything above, from its own "
            f"console or an SSH session to it: {command}"
        )
    cycles = [u.name for u in site.ups if u.at_shutdown_end.command == "shutdown.return"]
    back = (
        f"; it also starts by itself when UPS {', '.join(cycles)} gives power back"
        if cycles
        else ""
    )
    return _power_on_by_hand(res, site).replace(res.target_name, res.id) + back


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
            return f"wakeonlan {res.mac or '<MAC of ' + name + '>'} (or the power button)"
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


def _cache(cache: CacheConfig) -> BookCache:
    by_hand = _CACHE_BY_HAND.get(
        cache.provider, "the provider's own tool: set write-through, wait until clean"
    )
    return BookCache(
        name=cache.name,
        provider=cache.provider,
        carries=tuple(cache.carries),
        automatic=f"write-through on battery, then waits until clean (at most "
        f"{format_duration(cache.destage_timeout)}); by hand with upsguard: "
        f"upsguard cache set write-through {cache.name} --wait -c SITE.yaml",
        by_hand=by_hand,
    )
