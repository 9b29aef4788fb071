"""Which vSphere privileges the plan's steps need, and which the logged-in user lacks.

vCenter answers for the session itself (``AuthorizationManager.HasPrivilegeOnEntities``
with the session's own key), on each VM and host the plan acts on: what counts is the
user's effective privilege there, propagated permissions and group memberships included.
Nothing is changed.

==============================  ============================================================
``VirtualMachine.Interact.PowerOff``  a guest shutdown (``ShutdownGuest``) and a power-off
``VirtualMachine.Interact.PowerOn``   powering VMs on in the startup
``Host.Config.Maintenance``           maintenance mode and ``ShutdownHost``, leaving it after
``Global.Settings``                   vCLS retreat mode (``system_vms: retreat``), on vCenter
``Host.Inventory.EditCluster``        HA host monitoring and DRS automation set aside and
                                      restored (``cluster_ha_drs: set_aside``), on the cluster
``Global.SetCustomField``             their values before, recorded on the cluster
``Global.ManageCustomFields``         the attribute holding that record, made once, on vCenter
==============================  ============================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from pyVmomi import vim

from upsguard.config.resources import ResourceConfig
from upsguard.models import ResourceKind
from upsguard.plugins.platforms.vsphere.session import Session

POWER_OFF = "VirtualMachine.Interact.PowerOff"
POWER_ON = "VirtualMachine.Interact.PowerOn"
MAINTENANCE = "Host.Config.Maintenance"
SETTINGS = "Global.Settings"
EDIT_CLUSTER = "Host.Inventory.EditCluster"
SET_FIELD = "Global.SetCustomField"
MANAGE_FIELDS = "Global.ManageCustomFields"

WHAT_FOR = {
    POWER_OFF: "guest shutdown and power-off",
    POWER_ON: "power-on",
    MAINTENANCE: "maintenance mode and host shutdown",
    SETTINGS: "vCLS retreat mode",
    EDIT_CLUSTER: "HA and DRS set aside for the shutdown",
    SET_FIELD: "HA and DRS values recorded on the cluster",
    MANAGE_FIELDS: "the attribute that records HA and DRS values",
}


def needed(resource: ResourceConfig, kind: ResourceKind) -> tuple[str, ...]:
    """The privileges the resource's steps need on one of its targets."""
    if kind is ResourceKind.HOST:
        return (MAINTENANCE,) if resource.stops or resource.starts else ()
    wanted = []
    if resource.stops:
        wanted.append(POWER_OFF)
    if resource.starts:
        wanted.append(POWER_ON)
    return tuple(wanted)


@dataclass(frozen=True, slots=True)
class Wanted:
    """Privileges wanted on one object (``moid`` of ``kind``, or a cluster with ``cluster``;
    no ``moid``: vCenter's root folder)."""

    name: str
    kind: ResourceKind | None
    moid: str | None
    privileges: tuple[str, ...]
    cluster: bool = False


@dataclass(frozen=True, slots=True)
class Lacking:
    name: str
    privilege: str


@dataclass(frozen=True, slots=True)
class Answer:
    user: str
    """The session's user, as vCenter names it."""
    server: str
    """What the server says it is (``about.fullName``)."""
    lacking: list[Lacking]


async def lacking(session: Session, wanted: Sequence[Wanted]) -> Answer:
    """Who is logged in, to what, and each privilege the user lacks where it is wanted."""

    def ask() -> Answer:
        content = session.conn.content
        current = content.sessionManager.currentSession
        server = str(content.about.fullName)
        entities: list[Any] = [
            content.rootFolder if w.moid is None else session.ref(_managed(w), w.moid)
            for w in wanted
        ]
        privileges = sorted({p for w in wanted for p in w.privileges})
        if not entities or not privileges:
            return Answer(str(current.userName), server, [])
        answer = content.authorizationManager.HasPrivilegeOnEntities(
            entity=entities, sessionId=current.key, privId=privileges
        )
        granted = {
            (item.entity._moId, a.privId): bool(a.isGranted)
            for item in answer
            for a in item.privAvailability
        }
        out = [
            Lacking(w.name, p)
            for w, entity in zip(wanted, entities, strict=True)
            for p in w.privileges
            if not granted.get((entity._moId, p), False)
        ]
        return Answer(str(current.userName), server, out)

    return await session.run("read the user's privileges", ask)


def _managed(wanted: Wanted) -> Any:
    if wanted.cluster:
        return vim.ClusterComputeResource
    return vim.HostSystem if wanted.kind is ResourceKind.HOST else vim.VirtualMachine
