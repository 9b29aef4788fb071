"""What the PVE token (or user) needs for the steps of a plan, and what it holds.

The privileges are those pve-docs' API description asks for on each path upsguard uses
(``tests/fixtures/pve/apidata.json`` keeps them; docs/proxmox.md tables them). What a token
holds is read from ``GET /access/permissions?path=...``, which every user and token may ask of
itself, for the path each privilege is checked on: PVE answers with what is in force there,
propagated from the paths above included, and a token with privilege separation gets only
what both it and its user hold.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any

from upsguard.config.resources import ResourceConfig
from upsguard.models import ResourceKind
from upsguard.plugins.platforms.proxmox import cluster

WHAT_FOR = {
    "VM.Audit": "list guests, read their state and tasks",
    "VM.PowerMgmt": "guest shutdown, stop, start",
    "Sys.Audit": "node list, cluster status, HA status, the Ceph flags and status",
    "Sys.PowerMgmt": "shut nodes down",
    "Sys.Console": "disarm and re-arm HA (before PVE 9.1: an HA resource's state)",
    "Sys.Modify": "set and unset the Ceph flags",
}


def needed(resources: Iterable[ResourceConfig], platform: str) -> dict[str, set[str]]:
    """The privileges the steps on ``resources`` of ``platform`` need, by the path each is
    checked on."""
    wanted: dict[str, set[str]] = {}

    def add(path: str, *privileges: str) -> None:
        wanted.setdefault(path, set()).update(privileges)

    for res in resources:
        if res.platform != platform:
            continue
        add("/", "Sys.Audit")
        if res.kind is ResourceKind.HOST:
            add("/nodes", "Sys.PowerMgmt")
        elif res.kind is ResourceKind.CLUSTER:
            add("/", "Sys.Console" if res.cluster == cluster.HA else "Sys.Modify")
        else:
            add("/vms", "VM.Audit", "VM.PowerMgmt")
    return wanted


def held(api: Any, path: str) -> set[str]:
    """The privileges in force for this login on ``path``."""
    answer = api.access.permissions.get(path=path) or {}
    return set(answer.get(path) or {})


def lacking(wanted: dict[str, set[str]], holds: dict[str, set[str]]) -> list[tuple[str, str]]:
    """Each privilege wanted and not held, with its path."""
    return [
        (privilege, path)
        for path, privileges in sorted(wanted.items())
        for privilege in sorted(privileges - holds.get(path, set()))
    ]


def said(missing: Sequence[tuple[str, str]]) -> str:
    """The missing privileges on their paths, with what each is for."""
    return "; ".join(f"{p} on {path} ({WHAT_FOR[p]})" for p, path in missing)
