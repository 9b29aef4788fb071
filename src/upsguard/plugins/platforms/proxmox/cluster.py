"""A Proxmox VE cluster's own state around a shutdown: its HA stack and its Ceph flags.

Both are targets of the ``proxmox`` platform (resources of kind ``cluster``), with a power
state of their own: ``ON`` is the cluster as upsguard found it, ``OFF`` is upsguard's change
in place (HA disarmed; the Ceph flags set). So a shutdown "stops" them and a startup
"starts" them again, and the executor's reading first, waiting and resuming apply as to any
target.

What upsguard changed is recorded before it acts, in a JSON file per platform in
``state_dir`` (beside the journal by default), so that the startup, in this process or a
restarted one, undoes exactly that: it re-arms HA only if upsguard disarmed it, and unsets
only the flags upsguard set (not those an operator had set before the outage). With no record,
the cluster is as upsguard found it: ``ON``, whatever it reads (an HA an operator disarmed
stays disarmed).

A state that cannot be read (no answer, no ``fencing`` entry in the HA status of a PVE
before 9.1, a flag missing from the list) is ``UNKNOWN``, never taken as either.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from upsguard.errors import PermanentError
from upsguard.models import PowerState
from upsguard.saved_state import SavedState

HA = "ha"
CEPH = "ceph_flags"
_ARMED = {"armed": PowerState.ON, "standby": PowerState.ON, "disarmed": PowerState.OFF}
"""HA's ``armed-state``: ``standby`` is armed with nothing to watch; ``disarming`` (under
way) and anything else is unknown."""


def ha_armed_state(api: Any) -> str | None:
    """HA's ``armed-state`` (``cluster/ha/status/current``, its ``fencing`` entry); None when
    the cluster has none (PVE before 9.1: no ``disarm-ha``)."""
    for entry in api.cluster.ha.status.current.get():
        if entry.get("type") == "fencing":
            state = entry.get("armed-state")
            return str(state) if state is not None else None
    return None


def ha_state(armed: str | None, record: SavedState[Any]) -> PowerState:
    """``OFF`` once HA is disarmed and upsguard recorded doing it (or finding it so)."""
    if armed is None:
        return PowerState.UNKNOWN
    if record.get(HA, None) is None:
        return PowerState.ON
    return _ARMED.get(armed, PowerState.UNKNOWN)


def disarm_ha(api: Any, record: SavedState[Any], where: str) -> None:
    """Record HA's state, then disarm it, resources ignored (``crm-command disarm-ha
    ignore``): HA then neither restarts nor migrates the guests the shutdown stops. A
    record already there (a resumed run) is kept: it says what the cluster was first."""
    armed = ha_armed_state(api)
    if armed is None:
        raise PermanentError(
            f"{where}: its HA status has no arm state: disarming HA needs PVE 9.1 or later "
            "(remove the 'ha' cluster resource, or upgrade)"
        )
    if record.get(HA, None) is None:
        record.put(HA, armed)
    if armed != "disarmed":
        api.cluster.ha.status("disarm-ha").post(**{"resource-mode": "ignore"})


def rearm_ha(api: Any, record: SavedState[Any]) -> None:
    """Re-arm HA if upsguard disarmed it, then forget the record; an HA upsguard found
    disarmed stays so."""
    before = record.get(HA, None)
    if before is not None and before != "disarmed" and ha_armed_state(api) != "armed":
        api.cluster.ha.status("arm-ha").post()
    record.drop(HA)


def ceph_flags(api: Any) -> dict[str, bool]:
    """The OSD flags as the cluster reports them (``cluster/ceph/flags``)."""
    return {str(f["name"]): bool(f.get("value")) for f in api.cluster.ceph.flags.get()}


def ceph_state(
    flags: dict[str, bool], wanted: Sequence[str], record: SavedState[Any]
) -> PowerState:
    """``OFF`` once every wanted flag reads set and upsguard recorded setting them."""
    if any(flag not in flags for flag in wanted):
        return PowerState.UNKNOWN
    if record.get(CEPH, None) is None:
        return PowerState.ON
    return PowerState.OFF if all(flags[f] for f in wanted) else PowerState.ON


def set_ceph_flags(api: Any, wanted: Sequence[str], record: SavedState[Any], where: str) -> None:
    """Record which wanted flags were set already, then set the others."""
    flags = ceph_flags(api)
    missing = [f for f in wanted if f not in flags]
    if missing:
        raise PermanentError(f"{where}: its Ceph reports no flag {', '.join(missing)}")
    if record.get(CEPH, None) is None:
        record.put(CEPH, sorted(f for f in wanted if not flags[f]))
    to_set = {f: 1 for f in wanted if not flags[f]}
    if to_set:
        api.cluster.ceph.flags.put(**to_set)


def unset_ceph_flags(api: Any, record: SavedState[Any]) -> None:
    """Unset the flags upsguard set (those set before it stay), then forget the record."""
    ours = record.get(CEPH, None) or []
    flags = ceph_flags(api)
    to_unset = {f: 0 for f in ours if flags.get(f)}
    if to_unset:
        api.cluster.ceph.flags.put(**to_unset)
    record.drop(CEPH)
