"""Resources of the site file to targets: a VM or host by name, the members of a VM group.

Names are looked up in a recent inventory read (ids stay put), read again once
when the name is not there; a selector wants a fresher read, since it may match
VMs made since. While vCenter is down, the ESXi hosts in ``direct_addresses``
are asked instead.
"""

from __future__ import annotations

import asyncio
from dataclasses import replace

from upsguard.config.resources import ResourceConfig
from upsguard.errors import PermanentError
from upsguard.models import PlatformName, ResourceKind, Target
from upsguard.plugins.platforms.vsphere.inventory import Snapshot, VmInfo
from upsguard.plugins.platforms.vsphere.locate import Locator, Resolved
from upsguard.plugins.platforms.vsphere.session import SNAPSHOT_TTL_S
from upsguard.plugins.platforms.vsphere.states import TOOLS_RUNNING
from upsguard.plugins.platforms.vsphere.tags import tagged_vm_ids

NAMED_TTL_S = 60.0  # a read this recent finds a VM or host by name


class Resolver:
    """Finds the targets of a resource on one platform, and records them in ``resolved``."""

    def __init__(
        self,
        platform: PlatformName,
        locator: Locator,
        resolved: Resolved,
        direct_hosts: list[str],
    ) -> None:
        self._platform = platform
        self._locator = locator
        self._resolved = resolved
        self._direct_hosts = direct_hosts  # ESXi hosts to ask while vCenter is down

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        """Raises ``PermanentError`` naming the resource when it matches nothing it should."""
        locator = self._locator
        serves = resource.serves_platform == self._platform
        if locator.can_go_direct and ((direct and serves) or not await locator.manager_usable()):
            targets = await self._resolve_direct(resource)
        else:
            tagged = await self._tagged(resource)
            by_name = resource.kind in (ResourceKind.VM, ResourceKind.HOST)
            max_age = NAMED_TTL_S if by_name else SNAPSHOT_TTL_S
            snap = await locator.manager.inventory(locator.now(), max_age=max_age)
            try:
                targets = self._resolve_in(snap, resource, tagged)
            except PermanentError:  # perhaps made since the last read: look once more
                snap = await locator.manager.inventory(locator.now(), fresh=True)
                targets = self._resolve_in(snap, resource, tagged)
        if direct:
            targets = [replace(t, direct=True) for t in targets]
        for target in targets:
            self._resolved.add(target, resource)
        return targets

    async def _tagged(self, res: ResourceConfig) -> set[str] | None:
        """Ids of the VMs carrying the selector's tag (tags live in the REST API), or None."""
        if res.select is None or res.select.tag is None:
            return None
        endpoint = self._locator.manager.conn.endpoint
        return await asyncio.to_thread(tagged_vm_ids, endpoint, res.id, res.select.tag)

    def _resolve_in(
        self, snap: Snapshot, res: ResourceConfig, tagged: set[str] | None = None
    ) -> list[Target]:
        what = f"resource '{res.id}'"
        where = f"vsphere platform '{self._platform}'"
        if res.kind is ResourceKind.VM:
            found = snap.vms_named(res.target_name)
            if not found:
                raise PermanentError(f"{what}: no VM named '{res.target_name}' on {where}")
            if len(found) > 1:
                refs = ", ".join(v.ref for v in found)
                raise PermanentError(
                    f"{what}: {len(found)} VMs are named '{res.target_name}' ({refs}): "
                    "rename them or use a vm_group selector"
                )
            return [self._vm_target(snap, found[0])]
        if res.kind is ResourceKind.VM_GROUP:
            assert res.select is not None
            self._check_selector(snap, res)
            # vCLS and other system VMs belong to vSphere: host steps deal with them
            members = [vm for vm in snap.select(res.select, tagged) if not vm.system]
            return [self._vm_target(snap, vm) for vm in members]
        if res.kind is ResourceKind.HOST:
            host = snap.host_named(res.target_name)
            if host is None:
                raise PermanentError(f"{what}: no host named '{res.target_name}' on {where}")
            return [Target(self._platform, ResourceKind.HOST, host.name, ref=host.ref)]
        raise PermanentError(f"{what}: a vsphere platform powers VMs and hosts, not {res.kind}")

    def _check_selector(self, snap: Snapshot, res: ResourceConfig) -> None:
        sel = res.select
        assert sel is not None
        if sel.attribute:
            known = {k for vm in snap.vms.values() for k in vm.attributes}
            missing = sorted(set(sel.attribute) - known)
            if missing:
                raise PermanentError(
                    f"resource '{res.id}': no VM has the custom attribute "
                    f"{', '.join(repr(m) for m in missing)}: check the selector"
                )
        if sel.folder:
            want = sel.folder.strip("/")
            folders = {v.folder for v in snap.vms.values()}
            if not any(f == want or f.startswith(want + "/") for f in folders):
                raise PermanentError(
                    f"resource '{res.id}': no VM folder '{want}' "
                    f"on vsphere platform '{self._platform}'"
                )

    def _vm_target(self, snap: Snapshot, vm: VmInfo) -> Target:
        return Target(
            self._platform,
            ResourceKind.VM,
            vm.name,
            ref=vm.ref,
            host=snap.host_name(vm.host_ref),
            system=vm.system,
            graceful=vm.tools == TOOLS_RUNNING if vm.power == "poweredOn" else None,
        )

    async def _resolve_direct(self, res: ResourceConfig) -> list[Target]:
        """Targets read from the ESXi hosts named in direct_addresses (vCenter is gone)."""
        targets: list[Target] = []
        for host_name in self._direct_hosts:
            session = self._locator.direct_session(host_name)
            snap = await session.inventory(self._locator.now())
            if res.kind is ResourceKind.HOST and res.target_name == host_name:
                return [Target(self._platform, ResourceKind.HOST, host_name)]
            if res.kind is ResourceKind.VM:
                targets += [
                    Target(self._platform, ResourceKind.VM, v.name, host=host_name, system=v.system)
                    for v in snap.vms_named(res.target_name)
                ]
        if not targets:
            raise PermanentError(
                f"resource '{res.id}': not found on any ESXi host in direct_addresses"
            )
        return targets
