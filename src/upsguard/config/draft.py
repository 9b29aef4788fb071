"""A first site file, drafted from what ``upsguard init`` found: commented, valid, and honest
about what only a person knows.

What the inventory tells is written as entries: each host, each VM on the host it runs on
(``runs_on``), vCenter's own VM (``serves_platform``) when vCenter could tell which it is,
each UPS upsd serves, one feed per UPS, and the policies at their defaults. What it cannot
tell is a ``# TODO:`` comment where it belongs: which VM needs which, the caches, the
storage and switches, the machine upsguard runs on, how hosts are powered back on. vCLS
VMs are left out: vSphere deploys and removes them itself, and the platform's
``system_vms: retreat`` takes them out of a host's way.

It takes plain data (no SDK type), so that it can be tested without vCenter or upsd, and
writes YAML through ruamel.yaml, whose comments survive in the file.
"""

from __future__ import annotations

import io
import ipaddress
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.comments import CommentedMap, CommentedSeq

#: The key of the vCenter platform in the drafted file.
PLATFORM = "vcenter"
#: The policies as ``PoliciesConfig()`` has them, written out (a test keeps them equal).
POLICIES: dict[str, Any] = {
    "poll_interval": "1s",
    "on_battery": {"after": "10s", "then": ["caches_write_through"]},
    "shutdown": {"when_any": ["low_battery", "fsd", "runtime < plan + 5m"]},
    "power_returns": {
        "before_point_of_no_return": "cancel",
        "after": "finish",
        "online_for": "30s",
    },
    "startup": {"online_for": "10m", "charge_above": 50},
    "required_margin": "5m",
    "critical_floor": {"charge_below": 10, "runtime_below": "90s"},
}


@dataclass(frozen=True)
class FoundHost:
    name: str
    cluster: str | None = None


@dataclass(frozen=True)
class FoundVm:
    name: str
    host: str | None
    power: str = "poweredOn"
    system: bool = False


@dataclass(frozen=True)
class FoundVcenter:
    """Where vCenter was read, how, and what it holds."""

    host: str
    port: int
    user: str
    password_file: Path
    verify_tls: bool = True
    ca_file: Path | None = None
    hosts: Sequence[FoundHost] = ()
    vms: Sequence[FoundVm] = ()
    manager_vm: str | None = None


@dataclass(frozen=True)
class FoundNut:
    """An upsd and the UPSes it serves (name -> description)."""

    host: str
    port: int
    upses: dict[str, str] = field(default_factory=dict)


def draft_site(vcenter: FoundVcenter, nut: FoundNut) -> str:
    """The site file's text."""
    ids = _Ids()
    hosts = {h.name: ids.take(h.name) for h in sorted(vcenter.hosts, key=lambda h: h.name)}
    doc = CommentedMap()
    doc["site"] = _site_name(vcenter.host)
    doc.yaml_set_start_comment(
        f"Drafted by 'upsguard init' from vCenter {vcenter.host} and upsd {nut.host}:{nut.port}.\n"
        "What they could tell is written below; what only a person knows is a TODO.\n"
        "Check it with 'upsguard validate -c FILE' and 'upsguard plan shutdown -c FILE'."
    )
    doc.yaml_add_eol_comment("a short name, used in logs and the journal", "site")
    doc["ups"] = _upses(nut)
    doc.yaml_set_comment_before_after_key(
        "ups",
        before=(
            f"\nThe UPSes upsd at {nut.host}:{nut.port} serves.\n"
            "TODO: for each, user and password_file with monitor: secondary, so that a forced\n"
            "shutdown from upsd's primary reaches upsguard (and starttls: true when upsd is on\n"
            "another machine); runtime_at, the battery's runtime at a load, from its chart;\n"
            "at_shutdown_end: {command: shutdown.return, delay: 3m}, so that power comes back\n"
            "by itself once everything is down (docs/ups.md)."
        ),
    )
    doc["feeds"] = _feeds(nut, list(hosts.values()))
    doc.yaml_set_comment_before_after_key(
        "feeds",
        before=(
            "\nOne feed per UPS, each taken to power every host: when any one UPS runs low,\n"
            "everything it may power is shut down. That is the safe default while nobody has\n"
            "said which machine hangs on which UPS; it may shut down more than it must.\n"
            "TODO: list in 'powers' only what each UPS powers; hosts with two power supplies\n"
            "on two UPSes go in one feed with both UPSes and min_supplies: 1."
        ),
    )
    doc["platforms"] = CommentedMap({PLATFORM: _platform(vcenter)})
    doc.yaml_set_comment_before_after_key("platforms", before="")
    doc["resources"] = _resources(vcenter, hosts, ids)
    doc.yaml_set_comment_before_after_key("resources", before="")
    doc["policies"] = _policies()
    doc.yaml_set_comment_before_after_key(
        "policies",
        before=(
            "\nTODO: storage the hosts need (a NAS, a SAN) in resources, e.g. {id: nas01, kind:\n"
            'storage, platform: ssh, host: nas01, shutdown: "poweroff"}, named in the depends_on\n'
            "of the hosts whose datastores are on it.\n"
            "TODO: switches in resources, e.g. {id: core-sw, kind: switch}: they stay up and go\n"
            "down with the UPS.\n"
            "TODO: the machine upsguard runs on, with runs_upsguard: true (it stops last), e.g.\n"
            '{id: mgmt, kind: host, platform: ssh, host: 127.0.0.1, shutdown: "systemctl\n'
            'poweroff", runs_upsguard: true}, or runs_upsguard: true on its VM above.\n'
            "TODO: caches: each write-back cache in the data path (host flash, a RAID\n"
            "controller, bcache, ...) and the VMs it carries, so that it is flipped to\n"
            "write-through and emptied before its host stops (docs/caches.md).\n\n"
            "The policies at their defaults: debounce, then shut down on low battery, a forced\n"
            "shutdown from upsd, or when the runtime left comes within 5 minutes of the plan."
        ),
    )
    return _dump(doc)


def _site_name(host: str) -> str:
    try:
        ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return host.split(".")[0] or "site"
    return "site"


class _Ids:
    """Resource ids, unique in the file: a name met again gets ``-2``, ``-3``..."""

    def __init__(self) -> None:
        self._taken: set[str] = set()

    def take(self, name: str) -> str:
        candidate, n = name, 1
        while candidate in self._taken:
            n += 1
            candidate = f"{name}-{n}"
        self._taken.add(candidate)
        return candidate


def _flow(items: Iterable[tuple[str, Any]]) -> CommentedMap:
    entry = CommentedMap(items)
    entry.fa.set_flow_style()
    return entry


def _upses(nut: FoundNut) -> CommentedSeq:
    upses = CommentedSeq()
    for i, (name, description) in enumerate(sorted(nut.upses.items())):
        source = _flow([("host", nut.host), ("port", nut.port), ("ups", name)])
        upses.append(CommentedMap([("name", name), ("nut", source)]))
        if description:
            upses[i].yaml_add_eol_comment(description.replace("\n", " "), "name")
    return upses


def _feeds(nut: FoundNut, hosts: list[str]) -> CommentedSeq:
    feeds = CommentedSeq()
    for name in sorted(nut.upses):
        feeds.append(_flow([("name", name), ("ups", [name]), ("powers", list(hosts))]))
    return feeds


def _platform(vc: FoundVcenter) -> CommentedMap:
    settings = CommentedMap([("type", "vsphere"), ("host", vc.host)])
    if vc.port != 443:
        settings["port"] = vc.port
    settings["user"] = vc.user
    settings["password_file"] = str(vc.password_file)
    if vc.ca_file is not None:
        settings["ca_file"] = str(vc.ca_file)
    if not vc.verify_tls:
        settings["verify_tls"] = False
        settings.yaml_add_eol_comment(
            "TODO: its certificate was not checked (--insecure): give ca_file instead",
            "verify_tls",
        )
    settings["system_vms"] = "retreat"
    system = sorted(v.name for v in vc.vms if v.system)
    settings.yaml_add_eol_comment(
        "vCLS VMs are not in the plan: a host's step puts its cluster in retreat mode"
        + (f" (found: {', '.join(system)})" if system else ""),
        "system_vms",
    )
    settings["unplanned_vms"] = "shutdown"
    settings.yaml_add_eol_comment(
        "a VM no resource covers is shut down before its host, never left running", "unplanned_vms"
    )
    if vc.manager_vm is not None:
        settings.yaml_set_comment_before_after_key(
            "system_vms",
            before=(
                "TODO: direct_hosts: {user: root, password_file: /etc/upsguard/esxi.pw}: once\n"
                f"vCenter's own VM ({vc.manager_vm}) is down, the hosts are reached directly"
            ),
            indent=4,
        )
    return settings


def _resources(vc: FoundVcenter, hosts: dict[str, str], ids: _Ids) -> CommentedSeq:
    resources = CommentedSeq()
    planned = [v for v in vc.vms if not v.system]
    counts: dict[str, int] = {}
    for vm in planned:
        counts[vm.name] = counts.get(vm.name, 0) + 1
    notes: list[tuple[int, str]] = []  # (index, comment before it)
    by_host: dict[str | None, list[FoundVm]] = {}
    for vm in planned:
        by_host.setdefault(vm.host if vm.host in hosts else None, []).append(vm)
    order = [h for h in sorted(hosts) if h in by_host] + ([None] if None in by_host else [])
    for host in order:
        cluster = next((h.cluster for h in vc.hosts if h.name == host), None)
        where = (
            f"VMs on {host}" + (f" (cluster {cluster})" if cluster else "")
            if host is not None
            else "VMs whose host vCenter did not say: TODO: runs_on"
        )
        if not resources:
            where = (
                "TODO: depends_on between VMs (a database before the applications that use\n"
                "it, the directory before everything): a VM here depends on nothing yet;\n"
                "shed: true for those that may stop early to stretch the battery; watts.\n\n"
            ) + where
        notes.append((len(resources), where))
        for vm in sorted(by_host[host], key=lambda v: v.name):
            resources.append(_vm_entry(vm, ids.take(vm.name), hosts, vc.manager_vm))
            if counts[vm.name] > 1:
                resources.yaml_add_eol_comment(
                    f"TODO: {counts[vm.name]} VMs are named {vm.name}: rename all but one",
                    len(resources) - 1,
                )
            elif vm.power != "poweredOn":
                resources.yaml_add_eol_comment(
                    "was off when read: not started after an outage", len(resources) - 1
                )
            elif vm.name == vc.manager_vm:
                resources.yaml_add_eol_comment(
                    "vCenter itself: it stops after every VM and host it manages",
                    len(resources) - 1,
                )
    notes.append(
        (
            len(resources),
            "Hosts: each stops once its VMs are down.\n"
            "TODO: power_on_via: a BMC platform (ipmi, redfish) or wol, so that the startup\n"
            "can power each host on; depends_on: the storage its datastores are on.",
        )
    )
    for host in sorted(hosts):
        entry = [("id", hosts[host]), ("kind", "host"), ("platform", PLATFORM)]
        if hosts[host] != host:
            entry.append(("host", host))
        resources.append(_flow(entry))
    for index, text in notes:
        resources.yaml_set_comment_before_after_key(index, before=text, indent=2)
    return resources


def _vm_entry(vm: FoundVm, rid: str, hosts: dict[str, str], manager: str | None) -> CommentedMap:
    entry: list[tuple[str, Any]] = [("id", rid), ("kind", "vm"), ("platform", PLATFORM)]
    if rid != vm.name:
        entry.append(("vm", vm.name))
    if vm.host in hosts:
        entry.append(("runs_on", [hosts[vm.host]]))
    if vm.name == manager:
        entry += [("serves_platform", PLATFORM), ("guest_timeout", "10m")]
    if vm.power != "poweredOn":
        entry.append(("start", False))
    return _flow(entry)


def _policies() -> CommentedMap:
    policies = CommentedMap()
    for key, value in POLICIES.items():
        policies[key] = _flow(value.items()) if isinstance(value, dict) else value
    return policies


def _dump(doc: CommentedMap) -> str:
    yaml = YAML()
    yaml.width = 4096  # one entry per line, as the examples write them
    yaml.indent(mapping=2, sequence=4, offset=2)
    out = io.StringIO()
    yaml.dump(doc, out)
    return out.getvalue()
