"""Which VM runs the vCenter we are logged in to, when its guest says so.

vCenter does not name its own VM. What can be seen is what VMware Tools report of each
guest: its host name and addresses. The VM whose guest calls itself by vCenter's name
(the address upsguard logs in to, or vCenter's own ``VirtualCenter.FQDN`` and
``VirtualCenter.InstanceName`` settings), or holds one of the addresses those names resolve
to, is vCenter's. Only one such VM counts: none, or more than one, is "not known" (a person
says which), never a guess by the VM's name. An ESXi host reached directly has no vCenter.
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from typing import Any

from pyVmomi import vim, vmodl

from upsguard.plugins.platforms.vsphere.reads import props_of, retrieve, view_filter
from upsguard.plugins.platforms.vsphere.session import Session

GUEST_PROPS = ["name", "config.template", "guest.hostName", "guest.ipAddress", "guest.net"]
#: vCenter's settings that hold the name it calls itself by.
OWN_NAME_SETTINGS = ("VirtualCenter.FQDN", "VirtualCenter.InstanceName")


async def manager_vm(session: Session, address: str) -> str | None:
    """The name of the VM that runs the vCenter of ``session`` (logged in to ``address``),
    or None when it is not a vCenter or no single VM can be told to be it."""
    return await session.run("find vCenter's own VM", lambda: _find(session.conn.content, address))


def _find(content: Any, address: str) -> str | None:
    if content.about.apiType != "VirtualCenter":
        return None
    names = {address.lower().rstrip("."), *_own_names(content)}
    addresses = _addresses(names)
    view = content.viewManager.CreateContainerView(content.rootFolder, [vim.VirtualMachine], True)
    try:
        found = retrieve(
            content.propertyCollector, view_filter(view, {vim.VirtualMachine: GUEST_PROPS})
        )
    finally:
        view.Destroy()
    matches = [
        str(p["name"])
        for p in map(props_of, found)
        if not p.get("config.template") and is_the_guest_of(p, names, addresses)
    ]
    return matches[0] if len(matches) == 1 else None


def is_the_guest_of(props: dict[str, Any], names: set[str], addresses: set[str]) -> bool:
    """Whether a VM's guest (as VMware Tools report it) calls itself one of ``names`` or
    holds one of ``addresses``."""
    host_name = str(props.get("guest.hostName") or "").lower().rstrip(".")
    if host_name and host_name in names:
        return True
    held = {str(props.get("guest.ipAddress") or "")}
    for nic in props.get("guest.net") or []:
        held.update(str(ip) for ip in nic.ipAddress or [])
    return bool({_normal(ip) for ip in held if ip} & addresses)


def _own_names(content: Any) -> set[str]:
    names: set[str] = set()
    for key in OWN_NAME_SETTINGS:
        try:
            options = content.setting.QueryOptions(key) or []
        except vmodl.MethodFault:  # not set on this vCenter
            continue
        names.update(str(o.value).lower().rstrip(".") for o in options if o.value)
    return names


def _addresses(names: Iterable[str]) -> set[str]:
    """The addresses the names are, or resolve to (a name that does not resolve adds none)."""
    found: set[str] = set()
    for name in names:
        try:
            infos = socket.getaddrinfo(name, None, proto=socket.IPPROTO_TCP)
        except (OSError, UnicodeError):
            continue
        found.update(_normal(str(info[4][0])) for info in infos)
    return found


def _normal(ip: str) -> str:
    try:
        return str(ipaddress.ip_address(ip.split("%")[0]))
    except ValueError:
        return ip
