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

The flags are unset at the startup only once Ceph is back as Proxmox's startup order wants it
(pve-docs, pveceph "Shutdown"): its monitors in quorum and every OSD that is in up
(``ceph_back``). Unset before, with an OSD still booting, ``noout`` would let Ceph mark it out
and move its data about, which the flags were set to prevent.

HA is disarmed with ``disarm-ha`` (PVE 9.1 and later). A PVE before 9.1 has no such command
and no ``fencing`` entry in its HA status: there each HA resource is set to ``ignored``, as
the Proxmox forum's shutdown guides did before it, and its state recorded first; the startup
puts back each one upsguard changed. HA is out of the way only while every resource reads
``ignored``.

A state that cannot be read (no answer, an arm state it does not know, a flag missing from
the list) is ``UNKNOWN``, never taken as either; a Ceph status that cannot be read (no answer,
a field missing or of another type) is unknown, never back.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from upsguard.errors import PermanentError, PlatformUnreachable
from upsguard.models import Fact, PowerState
from upsguard.saved_state import SavedState

HA = "ha"
HA_RESOURCES = "ha_resources"
"""Before PVE 9.1: the record of each HA resource's state before upsguard ignored it."""
CEPH = "ceph_flags"
IGNORED = "ignored"
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


def ha_resources(api: Any) -> dict[str, str]:
    """Each HA resource (``vm:101``) and its requested state (``cluster/ha/resources``)."""
    return {str(r["sid"]): str(r.get("state", "started")) for r in api.cluster.ha.resources.get()}


def ha_state(api: Any, record: SavedState[Any]) -> PowerState:
    """``OFF`` once HA is out of the way and upsguard recorded doing it (or finding it so):
    disarmed, or before PVE 9.1 every resource ignored."""
    armed = ha_armed_state(api)
    if armed is None:
        if record.get(HA_RESOURCES, None) is None:
            return PowerState.ON
        ignored = all(state == IGNORED for state in ha_resources(api).values())
        return PowerState.OFF if ignored else PowerState.ON
    if record.get(HA, None) is None:
        return PowerState.ON
    return _ARMED.get(armed, PowerState.UNKNOWN)


def disarm_ha(api: Any, record: SavedState[Any]) -> None:
    """Record HA's state, then disarm it, resources ignored (``crm-command disarm-ha
    ignore``), or before PVE 9.1 set each resource to ``ignored``: HA then neither restarts
    nor migrates the guests the shutdown stops. A record already there (a resumed run) is
    kept: it says what the cluster was first."""
    armed = ha_armed_state(api)
    if armed is None:
        resources = ha_resources(api)
        record.put(HA_RESOURCES, {**resources, **(record.get(HA_RESOURCES, None) or {})})
        for sid, state in resources.items():
            if state != IGNORED:
                api.cluster.ha.resources(sid).put(state=IGNORED)
        return
    if record.get(HA, None) is None:
        record.put(HA, armed)
    if armed != "disarmed":
        api.cluster.ha.status("disarm-ha").post(**{"resource-mode": "ignore"})


def rearm_ha(api: Any, record: SavedState[Any]) -> None:
    """Re-arm HA if upsguard disarmed it, or put back each resource upsguard set to
    ``ignored``, then forget the record; what upsguard found so stays so."""
    before = record.get(HA, None)
    if before is not None and before != "disarmed" and ha_armed_state(api) != "armed":
        api.cluster.ha.status("arm-ha").post()
    record.drop(HA)
    states: dict[str, str] = record.get(HA_RESOURCES, None) or {}
    now = ha_resources(api) if states else {}
    for sid, state in states.items():
        if state != IGNORED and now.get(sid) == IGNORED:
            api.cluster.ha.resources(sid).put(state=state)
    record.drop(HA_RESOURCES)


def ceph_flags(api: Any) -> dict[str, bool]:
    """The OSD flags as the cluster reports them (``cluster/ceph/flags``). A flag whose
    ``value`` is missing or not a boolean (PVE sends 0 or 1) is left out: unknown, as a
    flag missing from the list is, never taken as unset."""
    return {
        str(f["name"]): bool(f["value"])
        for f in api.cluster.ceph.flags.get()
        if f.get("value") in (0, 1)  # True and False too
    }


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
        raise PermanentError(
            f"{where}: its Ceph reports no flag (or none readable) {', '.join(missing)}"
        )
    if record.get(CEPH, None) is None:
        record.put(CEPH, sorted(f for f in wanted if not flags[f]))
    to_set = {f: 1 for f in wanted if not flags[f]}
    if to_set:
        api.cluster.ceph.flags.put(**to_set)


def ceph_flags_to_unset(api: Any, record: SavedState[Any]) -> list[str]:
    """The flags upsguard set that still read set (those set before it are not upsguard's).
    Raises ``PlatformUnreachable`` when one of them is missing from the list: unknown, never
    taken as unset."""
    flags = ceph_flags(api)
    ours: list[str] = record.get(CEPH, None) or []
    missing = [f for f in ours if f not in flags]
    if missing:
        raise PlatformUnreachable(f"the Ceph flags read have no {', '.join(missing)}")
    return [f for f in ours if flags[f]]


def unset_ceph_flags(api: Any, record: SavedState[Any], flags: Sequence[str]) -> None:
    """Unset ``flags`` (``ceph_flags_to_unset``), then forget the record: the cluster is as
    upsguard found it again."""
    if flags:
        api.cluster.ceph.flags.put(**dict.fromkeys(flags, 0))
    record.drop(CEPH)


def ceph_status(api: Any) -> Any:
    """Ceph's own status as PVE relays it (``cluster/ceph/status``: ``ceph status``, its health
    with details, the monitor map of ``mon dump``): upsguard reaches the cluster through the PVE
    API only, and this is where it shows the monitors' quorum and the OSDs up."""
    return api.cluster.ceph.status.get()


def ceph_back(status: Any) -> Fact:
    """Whether Ceph is back for its flags to be unset: a majority of its monitors in quorum,
    and every OSD that is in up. A field missing, or not of its type, is unknown.

    The status counts OSDs only: as many up as in is needed, and not enough, since an OSD up
    may be out while another in is down. So Ceph's own ``OSD_DOWN`` check (an OSD in its CRUSH
    map, in and down) must be absent too; one never started holds no data, and the counts
    see it. No OSD in at all leaves nothing to be marked out or to move: nothing to wait for.
    """
    mons, quorum = _read(status, "monmap.mons"), _read(status, "quorum_names")
    counts = [_read(status, f"osdmap.{n}") for n in ("num_osds", "num_up_osds", "num_in_osds")]
    checks = _read(status, "health.checks")
    unread = _unread(mons, quorum, counts, checks)
    if unread:
        return Fact.unknown(f"Ceph's status unknown: {unread}")
    names = {str(m["name"]) for m in mons}
    voting = names & set(quorum)
    if 2 * len(voting) <= len(names):
        return Fact.false(f"Ceph: {len(voting)} of {len(names)} monitors in quorum")
    _, up, in_ = counts
    if up < in_:
        return Fact.false(f"Ceph: {up} of {in_} OSDs up")
    if "OSD_DOWN" in checks:
        said = _read(checks, "OSD_DOWN.summary.message")
        return Fact.false(f"Ceph: {said if isinstance(said, str) else 'OSD_DOWN'}")
    return Fact.true(
        f"Ceph: {len(voting)} of {len(names)} monitors in quorum, every OSD in up ({in_})"
    )


def _read(data: Any, path: str) -> Any:
    """The value at ``path`` (``osdmap.num_up_osds``) of nested objects; None when absent: the
    status is another program's data, any part of which may be missing or of another type."""
    for key in path.split("."):
        data = data.get(key) if isinstance(data, dict) else None
    return data


def _unread(mons: Any, quorum: Any, counts: list[Any], checks: Any) -> str | None:
    """What of Ceph's status could not be read (its path, and what it held instead); None when
    each field holds what Ceph puts there."""
    named = isinstance(mons, list) and all(isinstance(_read(m, "name"), str) for m in mons)
    if not named or not mons:
        return "no monmap.mons" if mons is None else f"monmap.mons reads {mons!r:.80}"
    if not isinstance(quorum, list) or not all(isinstance(q, str) for q in quorum):
        return "no quorum_names" if quorum is None else f"quorum_names reads {quorum!r:.80}"
    for name, count in zip(("num_osds", "num_up_osds", "num_in_osds"), counts, strict=True):
        if count is None:
            return f"no osdmap.{name}"
        if not isinstance(count, int) or isinstance(count, bool) or count < 0:
            return f"osdmap.{name} reads {count!r:.80}"
    total, up, in_ = counts
    if up > total or in_ > total:
        return f"osdmap counts {up} OSDs up and {in_} in of {total}"
    if not isinstance(checks, dict):
        return "no health.checks" if checks is None else f"health.checks reads {checks!r:.80}"
    return None
