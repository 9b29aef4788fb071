"""vSphere HA and DRS of a cluster: set aside before its hosts stop, put back at the startup.

vSphere's own order for a cluster shutdown: HA host monitoring disabled and DRS in manual
mode before any host goes, so that no VM is restarted or migrated onto a host about to
stop. The first host step of a cluster reads ``dasConfig.hostMonitoring`` and
``drsConfig.defaultVmBehavior``, records them on the cluster itself (a custom attribute,
``RECORD``: data, JSON), then sets ``disabled`` and ``manual``. The record lives in vCenter,
so a restarted controller, or the other one of a pair, finds it; a record already there
(an earlier attempt of the same shutdown) is kept, never overwritten with what upsguard set.
At the startup, once vCenter answers and a host or VM is back, every cluster holding a
record gets its values back and the record is cleared.

Unknown is never good news: a value that could not be read (or that vCenter leaves empty)
is neither recorded nor changed, and never taken for ``disabled``/``manual``; a restore
finding no record changes nothing and says so. Failing here never stops the host step: a
cluster whose HA fights the shutdown is better than a site that does not shut down.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
from dataclasses import dataclass
from typing import Any

from pyVmomi import vim

from upsguard.errors import UpsguardError
from upsguard.plugins.platforms.vsphere.faults import fault_text
from upsguard.plugins.platforms.vsphere.reads import moid
from upsguard.plugins.platforms.vsphere.session import Session

log = logging.getLogger(__name__)

#: The custom attribute on a cluster holding the values upsguard changed.
RECORD = "upsguard.ha-drs-before-shutdown"
HOST_MONITORING = "hostMonitoring"  # ClusterDasConfigInfo: enabled | disabled
VM_BEHAVIOR = (
    "defaultVmBehavior"  # ClusterDrsConfigInfo: fullyAutomated | partiallyAutomated | manual
)
FOR_SHUTDOWN = {HOST_MONITORING: "disabled", VM_BEHAVIOR: "manual"}
TASK_POLL_S = 0.2
TASK_LIMIT_S = 60.0
ClusterSpec: Any = vim.cluster.ConfigSpecEx
DasSpec: Any = vim.cluster.DasConfigInfo
DrsSpec: Any = vim.cluster.DrsConfigInfo


@dataclass(frozen=True)
class Seen:
    """One cluster as read: its HA/DRS values (those vCenter gave) and its record, if any."""

    ref: str
    name: str
    values: dict[str, str]
    record: dict[str, str] | None


class ClusterGuard:
    """Sets aside and restores HA host monitoring and DRS automation, one cluster at a time."""

    def __init__(self) -> None:
        self._lock = asyncio.Lock()  # host steps of one cluster run at once: one reads first
        self._restore_due = True  # a restarted controller may find records of its predecessor
        self._settled: set[str] = set()
        """The clusters set aside (or found with nothing to set aside) since the last
        restore: their other hosts' steps read nothing again, and say nothing again."""

    async def set_aside(self, session: Session, ref: str, name: str) -> None:
        """Before a host of cluster ``ref`` stops: record, then disable and set to manual;
        once per cluster until the next restore. A cluster that could not be read is tried
        again by its next host."""
        async with self._lock:
            if ref in self._settled:
                return
            try:
                seen = await session.run(f"read cluster {name}", lambda: _read(session, ref))
            except UpsguardError as exc:
                log.warning("cluster %s: HA and DRS unknown (%s): left as they are", name, exc)
                return
            record = seen.record
            if record is None:
                record = dict(seen.values)
                if not record:
                    log.warning("cluster %s: HA and DRS read empty: left as they are", name)
                    self._settled.add(ref)
                    return
                try:
                    await session.run(
                        f"record HA and DRS on cluster {name}",
                        lambda: _write_record(session, ref, json.dumps(record, sort_keys=True)),
                    )
                except UpsguardError as exc:  # nothing recorded: nothing to restore from
                    log.warning(
                        "cluster %s: not recorded (%s): HA and DRS left as they are", name, exc
                    )
                    return
            self._restore_due = True
            wanted = {k: FOR_SHUTDOWN[k] for k in record if seen.values.get(k) != FOR_SHUTDOWN[k]}
            if wanted and not await _reconfigure(session, ref, name, wanted):
                return  # its next host tries again
            self._settled.add(ref)
            log.info(
                "cluster %s: HA host monitoring and DRS set aside for the shutdown "
                "(recorded on the cluster: %s)",
                name,
                _said(record),
            )

    async def restore(self, session: Session) -> None:
        """At the startup (vCenter answering): each cluster's recorded values back, once."""
        if not self._restore_due:
            return
        async with self._lock:
            if not self._restore_due:
                return
            seen = await session.run("read the clusters", lambda: _read_all(session))
            recorded = [c for c in seen if c.record]
            if not recorded:
                log.info("no HA or DRS values recorded on any cluster: nothing restored")
            left = False
            for cluster in recorded:
                record = cluster.record or {}
                wanted = {k: v for k, v in record.items() if cluster.values.get(k) != v}
                if wanted and not await _reconfigure(session, cluster.ref, cluster.name, wanted):
                    left = True  # its record stays: the next host or VM back tries again
                    continue
                await session.run(
                    f"clear the record on cluster {cluster.name}",
                    functools.partial(_write_record, session, cluster.ref, ""),
                )
                log.info("cluster %s: HA and DRS restored (%s)", cluster.name, _said(record))
            self._restore_due = left
            self._settled.clear()


def _said(values: dict[str, str]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(values.items()))


async def _reconfigure(session: Session, ref: str, name: str, wanted: dict[str, str]) -> bool:
    """``ReconfigureComputeResource_Task`` with only ``wanted`` changed, waited for; whether
    it succeeded. Never raises: a failure is logged, and the step goes on."""
    spec = ClusterSpec()
    if HOST_MONITORING in wanted:
        spec.dasConfig = DasSpec(hostMonitoring=wanted[HOST_MONITORING])
    if VM_BEHAVIOR in wanted:
        spec.drsConfig = DrsSpec(defaultVmBehavior=wanted[VM_BEHAVIOR])
    cluster = session.ref(vim.ClusterComputeResource, ref)
    try:
        task = await session.run(
            f"reconfigure cluster {name}",
            lambda: cluster.ReconfigureComputeResource_Task(spec=spec, modify=True),
        )
        loop = asyncio.get_running_loop()
        deadline = loop.time() + TASK_LIMIT_S
        while loop.time() < deadline:
            state, error = await session.run(
                "read a task", lambda: (str(task.info.state), task.info.error)
            )
            if state == "success":
                return True
            if state == "error":
                log.warning("cluster %s: not reconfigured: %s", name, fault_text(error))
                return False
            await asyncio.sleep(TASK_POLL_S)
        log.warning("cluster %s: reconfiguring did not finish in %.0fs", name, TASK_LIMIT_S)
    except UpsguardError as exc:
        log.warning("cluster %s: not reconfigured: %s", name, exc)
    return False


def _record_key(session: Session) -> int | None:
    fields = session.conn.content.customFieldsManager.field or []
    return next((f.key for f in fields if f.name == RECORD), None)


def _seen(session: Session, cluster: Any, key: int | None) -> Seen:
    config = cluster.configurationEx
    values = {
        HOST_MONITORING: getattr(config.dasConfig, HOST_MONITORING, None),
        VM_BEHAVIOR: getattr(config.drsConfig, VM_BEHAVIOR, None),
    }
    text = next((v.value for v in cluster.customValue or [] if v.key == key), "")
    return Seen(
        moid(cluster),
        str(cluster.name),
        {k: str(v) for k, v in values.items() if v},
        json.loads(text) if text else None,
    )


def _read(session: Session, ref: str) -> Seen:
    return _seen(session, session.ref(vim.ClusterComputeResource, ref), _record_key(session))


def _read_all(session: Session) -> list[Seen]:
    content = session.conn.content
    key = _record_key(session)
    if key is None:
        return []  # the attribute was never made: nothing was ever recorded here
    view = content.viewManager.CreateContainerView(
        content.rootFolder, [vim.ClusterComputeResource], True
    )
    try:
        return [_seen(session, c, key) for c in view.view]
    finally:
        view.Destroy()


def _write_record(session: Session, ref: str, text: str) -> None:
    fields = session.conn.content.customFieldsManager
    key = _record_key(session)
    if key is None:
        key = fields.AddCustomFieldDef(name=RECORD, moType=vim.ClusterComputeResource).key
    cluster = session.ref(vim.ClusterComputeResource, ref)
    fields.SetField(entity=cluster, key=key, value=text)
