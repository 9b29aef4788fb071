"""vSphere (vCenter or one ESXi host) through pyvmomi: stop and start VMs and hosts.

The platform reads the inventory in one request, watches power and Tools
state of everything through one PropertyCollector, and runs pyvmomi's
blocking calls in a thread pool of its own. Once the VM that runs vCenter
itself has been stopped, every later call goes to the ESXi hosts directly
(``direct_hosts`` in the site file), each with its own watch.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from typing import Any, TypeVar

from upsguard.clock import Clock
from upsguard.config.platforms import VsphereSettings
from upsguard.config.resources import ResourceConfig
from upsguard.config.types import resolve_secret
from upsguard.errors import ConfigError, PermanentError, PlatformUnreachable
from upsguard.models import PlatformName, PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.vsphere.connection import Connection, Endpoint
from upsguard.plugins.platforms.vsphere.inventory import Snapshot, VmInfo, read_snapshot
from upsguard.plugins.platforms.vsphere.states import TOOLS_RUNNING
from upsguard.plugins.platforms.vsphere.tasks import Operations
from upsguard.plugins.platforms.vsphere.waiter import Fresh, Watcher

__all__ = ["VspherePlatform"]

log = logging.getLogger(__name__)
T = TypeVar("T")
SNAPSHOT_TTL_S = 5.0
NAMED_TTL_S = 60.0  # a read this recent finds a VM or host by name (ids stay put)
RECONNECT_S = 5.0  # while vCenter does not answer, how often to try it again
WORKERS_MAX = 16  # threads for pyVmomi's blocking calls; each call returns within milliseconds


class Site:
    """One endpoint (vCenter, or an ESXi host reached directly) with its session and watch."""

    def __init__(
        self, endpoint: Endpoint, pool: ThreadPoolExecutor, poll_s: float | None = None
    ) -> None:
        # a kept-alive connection for every worker thread, the watch and the fresh reads:
        # pyVmomi closes what is returned beyond its pool, and a new TLS handshake is dear
        self.conn = Connection(endpoint, WORKERS_MAX + 4)
        self.pool = pool
        self.poll_s = poll_s
        self.watcher: Watcher | None = None
        self.fresh: Fresh | None = None
        self.snapshot: Snapshot | None = None
        self.snapshot_at = float("-inf")
        self._reading = asyncio.Lock()  # concurrent callers share one read

    async def run(self, what: str, fn: Callable[[Any], T]) -> T:
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self.pool, self.conn.call, what, fn)

    async def open(self) -> None:
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self.conn.login)
        if self.watcher is None:
            self.watcher = Watcher(self.conn, loop, self.poll_s)
            self.fresh = Fresh(self.watcher, self.run)
            await loop.run_in_executor(self.pool, self.watcher.start)

    async def inventory(
        self, now: float, fresh: bool = False, max_age: float = SNAPSHOT_TTL_S
    ) -> Snapshot:
        """The inventory, read again when older than ``max_age`` seconds or when ``fresh``."""
        async with self._reading:
            stale = self.snapshot is None or now - self.snapshot_at > max_age
            if stale or (fresh and self.snapshot_at < now):
                self.snapshot = await self.run("read the inventory", read_snapshot)
                self.snapshot_at = now
            assert self.snapshot is not None
            return self.snapshot

    async def close(self) -> None:
        if self.watcher is not None:
            self.watcher.stop()
            self.watcher = None
            self.fresh = None
        loop = asyncio.get_running_loop()
        await loop.run_in_executor(self.pool, self.conn.close)


class VspherePlatform:
    """The ``Platform`` for a vCenter (or a single ESXi host) named in the site file."""

    def __init__(self, name: PlatformName, settings: VsphereSettings, clock: Clock) -> None:
        self.name = name
        self.settings = settings
        self._clock = clock
        workers = min(settings.max_parallel, WORKERS_MAX) + 2
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix=f"vsphere-{name}")
        self._poll_s = settings.poll_interval.total_seconds() if settings.watch == "poll" else None
        self.manager = Site(self._endpoint(), self._pool, self._poll_s)
        self._direct: dict[str, Site] = {}
        self._resources: dict[tuple[ResourceKind, str], ResourceConfig] = {}
        self.manager_down = False  # we stopped vCenter's own VM: it stays down for this run
        self._unreachable_since: float | None = None  # vCenter did not answer (after an outage)
        self._last_try = float("-inf")
        self._ops = Operations(self)

    # --- connections -----------------------------------------------------------------------

    def _endpoint(self) -> Endpoint:
        s = self.settings
        label = f"vsphere platform '{self.name}'"
        if not s.user:
            raise ConfigError(f"{label}: 'user' is required")
        if not (s.password_file or s.password_env):
            raise ConfigError(f"{label}: give password_file or password_env")
        secret = self._secret(label, s.password_file, s.password_env)
        return Endpoint(label, s.host, s.port, s.user, secret, s.verify_tls, s.ca_file)

    @staticmethod
    def _secret(label: str, file: Any, env: str | None) -> Callable[[], str]:
        def read() -> str:
            return resolve_secret(f"{label} password", file, env) or ""

        return read

    def direct_site(self, host_name: str) -> Site:
        """The session to one ESXi host, used once vCenter is down (made on first use)."""
        if host_name not in self._direct:
            access = self.settings.direct_hosts
            label = f"vsphere platform '{self.name}', ESXi host '{host_name}'"
            if access is None or not access.user:
                raise PermanentError(
                    f"{label}: vCenter is down and no direct_hosts credentials are given"
                )
            address = self.settings.direct_addresses.get(host_name, host_name)
            host, _, port = address.rpartition(":") if ":" in address else (address, "", "443")
            secret = self._secret(label, access.password_file, access.password_env)
            endpoint = Endpoint(
                label, host, int(port), access.user, secret, access.verify_tls, access.ca_file
            )
            self._direct[host_name] = Site(endpoint, self._pool, self._poll_s)
        return self._direct[host_name]

    async def open(self) -> None:
        if not self.settings.verify_tls:
            log.warning(
                "vsphere platform '%s': verify_tls is false: the certificate of %s is not checked",
                self.name,
                self.settings.host,
            )
        try:
            await self.manager.open()
        except PlatformUnreachable as exc:
            if self.settings.direct_hosts is None:
                raise
            log.warning("%s; working with the ESXi hosts directly until it answers", exc)
            self._unreachable_since = self._last_try = self.now()

    async def manager_usable(self) -> bool:
        """False while vCenter is down: stopped by us, or not answering (retried every 5 s)."""
        if self.manager_down:
            return False
        if self._unreachable_since is None:
            return True
        now = self.now()
        if now - self._last_try >= RECONNECT_S:
            self._last_try = now
            try:
                await self.manager.open()
            except PlatformUnreachable:
                return False
            log.info("vsphere platform '%s': vCenter answers again", self.name)
            self._unreachable_since = None
        return self._unreachable_since is None

    async def close(self) -> None:
        for site in [self.manager, *self._direct.values()]:
            try:
                await site.close()
            except Exception as exc:  # close never raises
                log.debug("closing %s failed: %s", site.conn.endpoint.label, exc)
        self._pool.shutdown(wait=False, cancel_futures=True)

    async def inventory(self, fresh: bool = True) -> Snapshot:
        """What vCenter sees now (for ``upsguard inventory`` and live plans)."""
        return await self.manager.inventory(self.now(), fresh=fresh)

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

    # --- resources to targets --------------------------------------------------------------

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        can_go_direct = self.settings.direct_hosts is not None
        serves = resource.serves_platform == self.name
        if can_go_direct and ((direct and serves) or not await self.manager_usable()):
            targets = await self._resolve_direct(resource)
        else:
            tagged = await self._tagged(resource)
            # a VM or host named by the site file keeps its id (a miss reads again below);
            # a selector may match VMs made since, so a group wants a recent read
            by_name = resource.kind in (ResourceKind.VM, ResourceKind.HOST)
            max_age = NAMED_TTL_S if by_name else SNAPSHOT_TTL_S
            snap = await self.manager.inventory(self.now(), max_age=max_age)
            try:
                targets = self._resolve_in(snap, resource, tagged)
            except PermanentError:  # perhaps made since the last read: look once more
                snap = await self.manager.inventory(self.now(), fresh=True)
                targets = self._resolve_in(snap, resource, tagged)
        if direct:
            targets = [replace(t, direct=True) for t in targets]
        for target in targets:
            self._resources[(target.kind, target.name)] = resource
        return targets

    async def _tagged(self, res: ResourceConfig) -> set[str] | None:
        """Ids of the VMs carrying the selector's tag (tags live in the REST API), or None."""
        if res.select is None or res.select.tag is None:
            return None
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._pool, self._ops.tagged_vms, res)

    def _resolve_in(
        self, snap: Snapshot, res: ResourceConfig, tagged: set[str] | None = None
    ) -> list[Target]:
        what = f"resource '{res.id}'"
        if res.kind is ResourceKind.VM:
            found = snap.vms_named(res.target_name)
            if not found:
                raise PermanentError(
                    f"{what}: no VM named '{res.target_name}' on vsphere platform '{self.name}'"
                )
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
                raise PermanentError(
                    f"{what}: no host named '{res.target_name}' on vsphere platform '{self.name}'"
                )
            return [Target(self.name, ResourceKind.HOST, host.name, ref=host.ref)]
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
                    f"resource '{res.id}': no VM folder '{want}' on vsphere platform '{self.name}'"
                )

    def _vm_target(self, snap: Snapshot, vm: VmInfo) -> Target:
        return Target(
            self.name,
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
        for host_name in self.settings.direct_addresses:
            site = self.direct_site(host_name)
            snap = await site.inventory(self.now())
            if res.kind is ResourceKind.HOST and res.target_name == host_name:
                return [Target(self.name, ResourceKind.HOST, host_name)]
            if res.kind is ResourceKind.VM:
                targets += [
                    Target(self.name, ResourceKind.VM, v.name, host=host_name, system=v.system)
                    for v in snap.vms_named(res.target_name)
                ]
        if not targets:
            raise PermanentError(
                f"resource '{res.id}': not found on any ESXi host in direct_addresses"
            )
        return targets

    def now(self) -> float:
        """Seconds on the injected clock (the inventory cache and reconnects use it)."""
        return self._clock.monotonic()

    def planned_vm_names(self) -> set[str]:
        """VMs some resource resolved to on this platform (the rest are unplanned)."""
        return {name for kind, name in self._resources if kind is ResourceKind.VM}

    def resource_of(self, target: Target) -> ResourceConfig | None:
        return self._resources.get((target.kind, target.name))

    async def goes_direct(self, target: Target) -> bool:
        """Through the ESXi host: vCenter's own VM, steps planned direct, while vCenter is down."""
        if self.settings.direct_hosts is None:
            return False
        res = self.resource_of(target)
        if target.direct or (res is not None and res.serves_platform == self.name):
            return True
        return not await self.manager_usable()

    # --- the Platform protocol, delegated to the operations --------------------------------

    async def power_state(self, target: Target) -> PowerState:
        return await self._ops.power_state(target)

    async def stop(self, target: Target, method: StopMethod) -> None:
        await self._ops.stop(target, method)

    async def start(self, target: Target) -> None:
        await self._ops.start(target)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        return await self._ops.wait_for(target, state, timeout)

    async def healthy(self, target: Target) -> bool:
        return await self._ops.healthy(target)
