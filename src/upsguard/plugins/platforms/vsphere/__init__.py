"""vSphere (vCenter or one ESXi host) through pyVmomi: stop and start VMs and hosts.

The platform reads the inventory in one request, watches power and Tools
state of everything through one PropertyCollector, and runs pyVmomi's
blocking calls in thread pools of its own (one for vCenter, one for the hosts).
Once the VM that runs vCenter itself has been stopped, or vCenter left a call
unanswered for ``vcenter_silent_after``, every later call goes to the ESXi hosts
directly (``direct_hosts`` in the site file), each with its own session and watch.

Inside, outermost first (an import-linter contract keeps it so)::

    VspherePlatform (here)   the Platform protocol; which step a target takes
    resolve, hosts, rights   resources to targets; host steps; privileges the steps need
    cluster                  HA and DRS set aside before host steps, restored after
    own_vm                   which VM runs vCenter itself
    vms                      VM steps
    locate, tasks            which session reaches a target; tasks and their errors
    session                  one endpoint: calls in threads, watch, inventory
    watch, inventory, tags   property watch and fresh reads; the inventory; tags
    connection, reads        pyVmomi's session stub; PropertyCollector reads
    lean, faults             cheaper reads of scalars; pyVmomi's errors as upsguard's
    endpoint, states         where to log in; property values as power states
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from upsguard.clock import Clock
from upsguard.config.platforms import VsphereSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import PlatformUnreachable, StepFailed, UpsguardError
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import PlatformName, PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.vsphere.cluster import ClusterGuard
from upsguard.plugins.platforms.vsphere.endpoint import (
    Endpoint,
    host_endpoint,
    manager_endpoint,
)
from upsguard.plugins.platforms.vsphere.hosts import HostSteps
from upsguard.plugins.platforms.vsphere.inventory import Snapshot
from upsguard.plugins.platforms.vsphere.locate import Locator, Resolved
from upsguard.plugins.platforms.vsphere.own_vm import manager_vm
from upsguard.plugins.platforms.vsphere.resolve import Resolver
from upsguard.plugins.platforms.vsphere.rights import (
    EDIT_CLUSTER,
    MANAGE_FIELDS,
    SET_FIELD,
    SETTINGS,
    WHAT_FOR,
    Wanted,
    lacking,
    needed,
)
from upsguard.plugins.platforms.vsphere.session import Session
from upsguard.plugins.platforms.vsphere.states import vm_power
from upsguard.plugins.platforms.vsphere.tasks import TaskLog
from upsguard.plugins.platforms.vsphere.vms import VmSteps

__all__ = ["VspherePlatform"]

log = logging.getLogger(__name__)
WORKERS_MAX = 16  # threads for pyVmomi's blocking calls; each call returns within milliseconds


class VspherePlatform:
    """The ``Platform`` for a vCenter (or a single ESXi host) named in the site file."""

    def __init__(self, name: PlatformName, settings: VsphereSettings, clock: Clock) -> None:
        self.name = name
        self.settings = settings
        workers = min(settings.max_parallel, WORKERS_MAX) + 2
        # vCenter's calls have threads of their own: calls stuck on a vCenter that hangs must
        # not hold up those to the ESXi hosts the steps then go to
        self._manager_pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"vsphere-{name}"
        )
        self._pool = ThreadPoolExecutor(
            max_workers=workers, thread_name_prefix=f"vsphere-{name}-hosts"
        )
        poll_s = settings.poll_interval.total_seconds() if settings.watch == "poll" else None

        def session(endpoint: Endpoint) -> Session:
            return Session(endpoint, self._pool, workers, poll_s)

        def silent() -> None:
            self._locator.manager_silent()

        manager = Session(
            manager_endpoint(name, settings),
            self._manager_pool,
            workers,
            poll_s,
            silent_after=settings.vcenter_silent_after.total_seconds()
            if settings.direct_hosts is not None
            else None,
            on_silent=silent,
        )
        self._resolved = Resolved()
        self._locator = Locator(
            name,
            manager,
            lambda host: session(host_endpoint(name, settings, host)),
            settings.direct_hosts is not None,
            self._resolved,
            clock,
        )
        self._resolver = Resolver(
            name, self._locator, self._resolved, list(settings.direct_addresses)
        )
        self._tasks = TaskLog()
        self._clusters = ClusterGuard() if settings.cluster_ha_drs == "set_aside" else None
        self._vms = VmSteps(self._locator, self._tasks)
        self._hosts = HostSteps(
            self._locator,
            self._tasks,
            self._resolved,
            retreat_system_vms=settings.system_vms == "retreat",
            stop_unplanned_vms=settings.unplanned_vms == "shutdown",
            clusters=self._clusters,
        )

    @property
    def manager(self) -> Session:
        """The session with vCenter (or the one ESXi host) the site file names."""
        return self._locator.manager

    async def open(self) -> None:
        if not self.settings.verify_tls:
            log.warning(
                "vsphere platform '%s': verify_tls is false: the certificate of %s is not checked",
                self.name,
                self.settings.host,
            )
        await self._locator.open()

    async def close(self) -> None:
        self._locator.stop_asking()
        for session in self._locator.sessions():
            try:
                await session.close()
            except Exception as exc:  # close never raises
                log.debug("closing %s failed: %s", session.label, exc)
        for pool in (self._manager_pool, self._pool):
            pool.shutdown(wait=False, cancel_futures=True)

    async def inventory(self, fresh: bool = True) -> Snapshot:
        """What vCenter sees now (for ``upsguard inventory`` and live plans)."""
        return await self.manager.inventory(self._locator.now(), fresh=fresh)

    async def inventory_report(self) -> dict[str, Any]:
        """The inventory as plain data for ``upsguard inventory``: no pyvmomi types leak out."""
        snap = await self.inventory()
        return {
            "platform": self.name,
            "address": f"{self.settings.host}:{self.settings.port}",
            "datacenters": snap.datacenters,
            "clusters": snap.clusters,
            "hosts": [
                {
                    "name": h.name,
                    "ref": h.ref,
                    "power": h.power,
                    "connection": h.connection,
                    "maintenance": h.maintenance,
                    "cluster": h.cluster,
                    "datacenter": h.datacenter,
                }
                for h in sorted(snap.hosts.values(), key=lambda h: h.name)
            ],
            "vms": [
                {
                    "name": v.name,
                    "ref": v.ref,
                    "power": v.power,
                    "tools": v.tools,
                    "host": snap.host_name(v.host_ref),
                    "folder": v.folder,
                    "attributes": v.attributes,
                    "system": v.system,
                }
                for v in sorted(snap.vms.values(), key=lambda v: v.name)
                if not v.template
            ],
            "round_trips": snap.round_trips,
        }

    async def manager_vm(self) -> str | None:
        """``ManagerVmSource``: the VM whose guest is this vCenter (see ``own_vm``)."""
        return await manager_vm(self.manager, self.settings.host)

    # --- the Platform protocol ---------------------------------------------------------------

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return await self._resolver.resolve(resource, direct=direct)

    async def power_state(self, target: Target) -> PowerState:
        """Read now, never from the watch alone: a stale "off" would skip a VM that is on.

        Checks of many targets at once share one read (see ``Fresh``).
        """
        at = await self._locator.locate(target)
        props = await at.session.fresh.props(at.obj())
        return self._power(target, props)

    def _power(self, target: Target, props: dict[str, Any]) -> PowerState:
        if target.kind is ResourceKind.HOST:
            return self._hosts.power(target, props)
        return vm_power(props)

    def shutdown_accepted(self, target: Target) -> None:
        """``SeenWhileItAnswers``: a host's shutdown asked before a restart (or by the other
        controller) is under way: vCenter losing the host is that shutdown landing."""
        if target.kind is ResourceKind.HOST:
            self._hosts.accepted(target)

    async def stop(self, target: Target, method: StopMethod) -> None:
        if target.kind is ResourceKind.HOST:
            await self._hosts.stop(target, self._resolved.resource_of(target))
        else:
            await self._vms.stop(target, method)
        if self._locator.serves_this_platform(target):
            self._locator.manager_stopping()
            log.info("%s: vCenter's own VM is stopping; later steps go to ESXi hosts", target.name)

    async def start(self, target: Target) -> None:
        if target.kind is ResourceKind.HOST:
            await self._hosts.start(target)
            return
        await self._vms.start(target)
        if self._locator.serves_this_platform(target):
            self._locator.manager_starting()  # usable again once it answers

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        """From the session's watch; when it runs out, a failed task is the step's error."""
        at = await self._locator.locate(target)
        if await at.session.watcher.wait(
            at.ref, lambda p: self._power(target, p) is state, timeout
        ):
            return True
        try:
            error = await self._tasks.error_of(target)
        except PlatformUnreachable:
            if target.kind is ResourceKind.HOST and state is PowerState.OFF:
                log.info("%s: no longer answers after its shutdown: off", target.name)
                return True
            raise
        if error:
            raise StepFailed(f"{target.name}: {error}")
        return False

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        """``InFlightTasks``: the target's task still running toward ``state`` (from its
        ``recentTask``), which a failure of then makes the step's error."""
        if target.kind is ResourceKind.HOST:
            return await self._hosts.under_way(target, state)
        return await self._vms.under_way(target, state)

    async def healthy(self, target: Target) -> bool:
        """Up as its kind counts it; the first target up while vCenter answers also puts back
        the HA and DRS values recorded on the clusters (``cluster``)."""
        if target.kind is ResourceKind.HOST:
            up = await self._hosts.healthy(target)
        else:
            up = await self._vms.healthy(target)
        if up and self._clusters is not None and await self._locator.manager_usable():
            try:
                await self._clusters.restore(self.manager)
            except UpsguardError as exc:  # asked again with the next target up
                log.warning("HA and DRS not restored yet: %s", exc)
        return up

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: who is logged in to what, and the privileges the steps on
        ``resources`` need on each of their VMs and hosts (``rights``)."""
        wanted: list[Wanted] = []
        for res in resources:
            if res.platform != self.name:
                continue
            try:
                targets = await self.resolve(res)
            except UpsguardError:
                continue  # the doctor itself reports what does not resolve
            wanted += [
                Wanted(t.name, t.kind, t.ref, needed(res, t.kind))
                for t in targets
                if t.ref is not None and needed(res, t.kind)
            ]
        hosts = any(w.kind is ResourceKind.HOST for w in wanted)
        if hosts and self.settings.system_vms == "retreat":
            wanted.append(Wanted("vCenter", None, None, (SETTINGS,)))
        if hosts and self._clusters is not None:
            wanted += await self._clusters_wanted(wanted)
        answer = await lacking(self.manager, wanted)
        where = f"{self.settings.host}:{self.settings.port}"
        found = [ok(Area.PLATFORM, self.name, "login", f"{where}: {answer.user}, {answer.server}")]
        privileges = sorted({p for w in wanted for p in w.privileges})
        if not answer.lacking:
            found.append(
                ok(
                    Area.PLATFORM,
                    self.name,
                    "privileges",
                    f"{answer.user} holds {', '.join(privileges) or 'what it needs'} on the "
                    f"{len(wanted)} objects the plan acts on",
                )
            )
            return found
        by_privilege: dict[str, list[str]] = {}
        for item in answer.lacking:
            by_privilege.setdefault(item.privilege, []).append(item.name)
        said = "; ".join(
            f"{p} ({WHAT_FOR[p]}) on {_some(names)}" for p, names in sorted(by_privilege.items())
        )
        found.append(
            fail(
                Area.PLATFORM,
                self.name,
                "privileges",
                f"{answer.user} lacks {said}",
                f"give {answer.user} a role with {', '.join(sorted(by_privilege))} on those "
                "objects or a parent of theirs (propagated)",
                missing=tuple(sorted(by_privilege)),
            )
        )
        return found

    async def _clusters_wanted(self, wanted: list[Wanted]) -> list[Wanted]:
        """What setting HA and DRS aside needs: on each cluster of the hosts, and on vCenter."""
        snap = await self.inventory(fresh=False)
        clusters = {
            host.cluster_ref: host.cluster or host.cluster_ref
            for w in wanted
            if w.kind is ResourceKind.HOST
            and w.moid is not None
            and (host := snap.hosts.get(w.moid)) is not None
            and host.cluster_ref
        }
        if not clusters:
            return []
        return [
            *(
                Wanted(name, None, ref, (EDIT_CLUSTER, SET_FIELD), cluster=True)
                for ref, name in sorted(clusters.items())
            ),
            Wanted("vCenter", None, None, (MANAGE_FIELDS,)),
        ]


def _some(names: list[str], shown: int = 3) -> str:
    more = len(names) - shown
    return ", ".join(names[:shown]) + (f" and {more} more" if more > 0 else "")
