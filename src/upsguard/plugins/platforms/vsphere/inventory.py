"""Reading the whole inventory in a constant number of round trips, and matching selectors.

One ``RetrievePropertiesEx`` over a ContainerView returns every VM, host,
cluster, folder and datacenter with just the properties upsguard needs; its
cost does not grow with the number of VMs in round trips (only in bytes).
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from pyVmomi import vim

from upsguard.config.resources import Selector
from upsguard.plugins.platforms.vsphere.reads import moid, pages, props_of, view_filter

VM_PROPS = [
    "name",
    "parent",
    "runtime.powerState",
    "runtime.host",
    "guest.toolsRunningStatus",
    "customValue",
    "config.managedBy",
    "config.template",
]
HOST_PROPS = [
    "name",
    "parent",
    "runtime.powerState",
    "runtime.connectionState",
    "runtime.inMaintenanceMode",
]
OTHER_PROPS = ["name", "parent"]
_KINDS: dict[Any, list[str]] = {
    vim.VirtualMachine: VM_PROPS,
    vim.HostSystem: HOST_PROPS,
    vim.Folder: OTHER_PROPS,
    vim.Datacenter: OTHER_PROPS,
    vim.ComputeResource: OTHER_PROPS,
}
#: vSphere Cluster Services agents: named vCLS-..., managed by ESX Agent Manager.
_VCLS_NAME = re.compile(r"^vCLS[-\s(]")
_EAM = "com.vmware.vim.eam"


@dataclass(frozen=True)
class VmInfo:
    ref: str
    name: str
    power: str
    host_ref: str | None
    tools: str
    folder: str
    attributes: dict[str, str] = field(default_factory=dict)
    system: bool = False
    template: bool = False


@dataclass(frozen=True)
class HostInfo:
    ref: str
    name: str
    power: str
    connection: str
    maintenance: bool
    cluster: str | None
    datacenter: str | None
    cluster_ref: str | None = None


@dataclass
class Snapshot:
    """Everything one read of the inventory saw, indexed by managed object id."""

    vms: dict[str, VmInfo]
    hosts: dict[str, HostInfo]
    clusters: list[str]
    datacenters: list[str]
    round_trips: int

    def host_name(self, ref: str | None) -> str | None:
        host = self.hosts.get(ref or "")
        return host.name if host else None

    def vms_named(self, name: str) -> list[VmInfo]:
        return [v for v in self.vms.values() if v.name == name and not v.template]

    def host_named(self, name: str) -> HostInfo | None:
        return next((h for h in self.hosts.values() if h.name == name), None)

    def select(self, selector: Selector, tagged: set[str] | None = None) -> list[VmInfo]:
        """VMs matching every criterion the selector gives (tags as a set of VM ids)."""
        return sorted(
            (v for v in self.vms.values() if not v.template and _matches(v, selector, tagged)),
            key=lambda v: v.name,
        )


def _matches(vm: VmInfo, sel: Selector, tagged: set[str] | None) -> bool:
    if sel.name is not None and not fnmatch.fnmatchcase(vm.name, sel.name):
        return False
    if sel.folder is not None:
        want = sel.folder.strip("/")
        if vm.folder != want and not vm.folder.startswith(want + "/"):
            return False
    if sel.attribute is not None and any(
        vm.attributes.get(key) != value for key, value in sel.attribute.items()
    ):
        return False
    return not (sel.tag is not None and (tagged is None or vm.ref not in tagged))


def read_snapshot(content: Any) -> Snapshot:
    """The whole inventory: a view, one RetrievePropertiesEx (plus pages), the field names.

    ``content`` is the endpoint's ServiceContent.
    """
    view = content.viewManager.CreateContainerView(content.rootFolder, list(_KINDS), True)
    trips = 1
    objects: list[Any] = []
    try:
        for page in pages(content.propertyCollector, view_filter(view, _KINDS)):
            objects += page
            trips += 1
    finally:
        view.Destroy()
        trips += 1
    field_names: dict[int, str] = {}
    if content.customFieldsManager is not None:
        field_names = {f.key: f.name for f in content.customFieldsManager.field or []}
        trips += 1
    return _index(objects, field_names, trips)


def _index(objects: Iterable[Any], field_names: dict[int, str], trips: int) -> Snapshot:
    props: dict[str, dict[str, Any]] = {}
    kinds: dict[str, Any] = {}
    for content in objects:
        ref = moid(content.obj)
        kinds[ref] = content.obj
        props[ref] = props_of(content)
    names = {ref: p.get("name", ref) for ref, p in props.items()}
    parents = {ref: _moid(p.get("parent")) for ref, p in props.items()}

    def ancestor(ref: str | None, kind: Any) -> str | None:
        while ref is not None:
            if isinstance(kinds.get(ref), kind):
                return ref
            ref = parents.get(ref)
        return None

    def folder_path(ref: str | None) -> str:
        parts: list[str] = []
        while ref is not None and isinstance(kinds.get(ref), vim.Folder):
            parent = parents.get(ref)
            if parent is None or isinstance(kinds.get(parent), vim.Datacenter):
                break  # the datacenter's own "vm" folder is not part of the path
            parts.append(names[ref])
            ref = parent
        return "/".join(reversed(parts))

    vms: dict[str, VmInfo] = {}
    hosts: dict[str, HostInfo] = {}
    for ref, p in props.items():
        obj = kinds[ref]
        if isinstance(obj, vim.VirtualMachine):
            vms[ref] = _vm(ref, p, folder_path(parents.get(ref)), field_names)
        elif isinstance(obj, vim.HostSystem):
            cluster = ancestor(parents.get(ref), vim.ClusterComputeResource)
            datacenter = ancestor(ref, vim.Datacenter)
            hosts[ref] = HostInfo(
                ref=ref,
                name=names[ref],
                power=str(p.get("runtime.powerState", "unknown")),
                connection=str(p.get("runtime.connectionState", "unknown")),
                maintenance=bool(p.get("runtime.inMaintenanceMode", False)),
                cluster=names[cluster] if cluster else None,
                datacenter=names[datacenter] if datacenter else None,
                cluster_ref=cluster,
            )
    clusters = sorted(
        n for r, n in names.items() if isinstance(kinds[r], vim.ClusterComputeResource)
    )
    datacenters = sorted(n for r, n in names.items() if isinstance(kinds[r], vim.Datacenter))
    return Snapshot(vms, hosts, clusters, datacenters, trips)


def _vm(ref: str, p: dict[str, Any], folder: str, field_names: dict[int, str]) -> VmInfo:
    name = str(p.get("name", ref))
    managed = p.get("config.managedBy")
    attributes = {
        field_names.get(v.key, str(v.key)): str(getattr(v, "value", ""))
        for v in p.get("customValue") or []
    }
    return VmInfo(
        ref=ref,
        name=name,
        power=str(p.get("runtime.powerState", "unknown")),
        host_ref=_moid(p.get("runtime.host")),
        tools=str(p.get("guest.toolsRunningStatus") or "guestToolsNotRunning"),
        folder=folder,
        attributes=attributes,
        system=is_system_vm(name, folder, getattr(managed, "extensionKey", None)),
        template=bool(p.get("config.template", False)),
    )


def is_system_vm(name: str, folder: str, managed_by: str | None) -> bool:
    """vCLS agents and other VMs that vSphere itself deploys and removes (ESX Agent Manager)."""
    if managed_by == _EAM:
        return True
    return bool(_VCLS_NAME.match(name)) or folder.split("/")[-1] == "vCLS"


def _moid(obj: Any) -> str | None:
    return None if obj is None else moid(obj)
