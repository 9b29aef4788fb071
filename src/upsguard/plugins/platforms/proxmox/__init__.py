"""The ``proxmox`` platform: Proxmox VE guests (VMs and containers) and nodes, through proxmoxer.

Resources name a guest by name or VMID (kind ``vm``), select guests by name
pattern or PVE tag (kind ``vm_group``: ``select: {name: "web-*"}`` or
``{tag: "prod"}``), or name a node (kind ``host``: shutdown only; powering a
node on needs ``power_on_via`` a BMC or Wake-on-LAN).

Graceful stop is the guest's ``status/shutdown`` (ACPI, or the QEMU guest
agent where enabled); hard stop is ``status/stop``. A started VM whose config
enables the agent is healthy once the agent answers a ping. Each guest action
runs as a task of its node (``qmshutdown``, ``vzstop``...) until the guest got
there; a resumed run finds it among the node's active tasks and waits for it.

Authentication: an API token (``user`` like ``root@pam``, ``token_name`` and
the token's secret from ``token_file``/``token_env``) or a password. TLS is
verified; a PVE host with its self-signed certificate needs ``ca_file``
(``/etc/pve/pve-root-ca.pem``). proxmoxer is blocking: calls run in a thread.

A resource of kind ``cluster`` stands for the cluster's own state (``cluster: ha``, its HA
stack; ``cluster: ceph_flags``, its OSD flags): ``proxmox.cluster`` says what stopping and
starting it means. Starting the Ceph flags is a request that lands only once Ceph is back
(its monitors in quorum, its OSDs up): the step's wait reads Ceph's status until then, and
unsets the flags when it is.
"""

from __future__ import annotations

import asyncio
import fnmatch
import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import proxmoxer
import requests

from upsguard.clock import Clock
from upsguard.config.platforms import ProxmoxSettings
from upsguard.config.resources import ResourceConfig
from upsguard.config.types import format_duration, resolve_secret
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    PermanentError,
    PlatformUnreachable,
    StepTimeout,
    TemporaryError,
    UpsguardError,
)
from upsguard.findings import Area, Finding, fail, ok
from upsguard.models import Fact, PlatformName, PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.base import AcceptedShutdowns, poll_for_state
from upsguard.plugins.platforms.proxmox import cluster, rights
from upsguard.saved_state import SavedState

__all__ = ["ProxmoxPlatform"]

log = logging.getLogger(__name__)

_GUEST_TYPES = ("qemu", "lxc")
#: The node's task types that take a guest (VM, container) off, and on.
_TOWARD: dict[PowerState, dict[str, tuple[str, ...]]] = {
    PowerState.OFF: {"qemu": ("qmshutdown", "qmstop"), "lxc": ("vzshutdown", "vzstop")},
    PowerState.ON: {"qemu": ("qmstart",), "lxc": ("vzstart",)},
}
_NODE_STATES = {"online": PowerState.ON}
"""PVE's node status. ``offline`` (outside the cluster's membership) is a node shut down, and
one running behind a broken cluster link, alike: off only once it accepted its shutdown
(``ProxmoxPlatform._node_state``); ``unknown`` (no quorum, no news) is unknown here too."""
_GUEST_STATES = {"running": PowerState.ON, "stopped": PowerState.OFF}
"""PVE's guest status; anything else (a status PVE adds later, none at all) is unknown."""


class ProxmoxPlatform:
    """One Proxmox VE cluster (any of its nodes answers for all of them)."""

    def __init__(self, name: PlatformName, settings: ProxmoxSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._api: Any = None
        self._lock = asyncio.Lock()
        state_dir = settings.state_dir or Path(".")
        self._record: SavedState[Any] = SavedState(
            state_dir / f"{name}.cluster.json",
            "what upsguard changed on the cluster (for the startup to undo)",
        )
        self._ceph_said: str | None = None
        """What was last said of the cluster's Ceph (said once, until it changes)."""
        self._nodes_shut_down = AcceptedShutdowns()
        """Nodes that accepted their shutdown: offline is that shutdown landing."""

    @property
    def _where(self) -> str:
        return f"Proxmox '{self.name}' ({self._settings.host}:{self._settings.port})"

    async def open(self) -> None:
        await self._call("connect", lambda api: None)

    async def close(self) -> None:
        self._api = None  # tickets expire by themselves; tokens need no logout

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: the privileges the steps on ``resources`` need, each read
        back as held or named missing (``rights``); and how HA will be put out of the way,
        which depends on the cluster's version."""
        login = self._settings.user or "?"
        if self._settings.token_name:
            login = f"{login}!{self._settings.token_name}"
        wanted = rights.needed(resources, self.name)
        holds = {
            path: await self._call(f"read the privileges on {path}", rights.held, path)
            for path in wanted
        }
        missing = rights.lacking(wanted, holds)
        if missing:
            privileges = " ".join(sorted({p for p, _ in missing}))
            found = [
                fail(
                    Area.PLATFORM,
                    self.name,
                    "privileges",
                    f"{login} lacks {rights.said(missing)}",
                    f"give {login} a role with {privileges} on those paths "
                    "(pveum acl modify; docs/proxmox.md)",
                    missing=tuple(f"{p} on {path}" for p, path in missing),
                )
            ]
        else:
            every = sorted({p for privileges in wanted.values() for p in privileges})
            found = [
                ok(Area.PLATFORM, self.name, "privileges", f"{login} holds {', '.join(every)}")
            ]
        if any(r.platform == self.name and r.cluster == cluster.HA for r in resources):
            found.append(await self._ha_way())
        return found

    async def _ha_way(self) -> Finding:
        """How the HA step puts HA out of the way on this cluster."""
        armed = await self._call("read the HA status", cluster.ha_armed_state)
        if armed is not None:
            detail = f"disarm-ha (PVE 9.1 or later); HA reads {armed} now"
        else:
            count = len(await self._call("read the HA resources", cluster.ha_resources))
            detail = (
                f"no disarm-ha (PVE before 9.1): each of its {count} HA resources is set to "
                "ignored, and put back at the startup"
            )
        return ok(Area.PLATFORM, self.name, "ha", detail)

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        if resource.kind is ResourceKind.CLUSTER and resource.cluster is not None:
            what = "HA" if resource.cluster == cluster.HA else "Ceph flags"
            return [
                Target(self.name, resource.kind, f"{what} of {self.name}", ref=resource.cluster)
            ]
        if resource.kind is ResourceKind.HOST:
            nodes = await self._call("list nodes", _nodes)
            if resource.target_name not in nodes:
                raise PermanentError(
                    f"resource '{resource.id}': {self._where} has no node "
                    f"'{resource.target_name}' (it has {', '.join(sorted(nodes))})"
                )
            return [
                Target(self.name, resource.kind, resource.target_name, ref=resource.target_name)
            ]
        guests = await self._call("list guests", _guests)
        if resource.kind is ResourceKind.VM_GROUP:
            return [_target(self.name, g) for g in guests if _selected(resource, g)]
        wanted = resource.target_name
        for guest in guests:
            if wanted in (str(guest.get("name")), str(guest.get("vmid"))):
                return [_target(self.name, guest)]
        raise PermanentError(
            f"resource '{resource.id}': {self._where} has no guest named or numbered '{wanted}'"
        )

    async def power_state(self, target: Target) -> PowerState:
        ref = _ref(target)
        if ref == cluster.HA:
            state: PowerState = await self._call("read HA", cluster.ha_state, self._record)
            return state
        if ref == cluster.CEPH:
            try:
                flags = await self._call("read the Ceph flags", cluster.ceph_flags)
            except TemporaryError as exc:  # the startup waits through it (its monitors' quorum)
                self._say(logging.WARNING, f"the Ceph flags read unknown ({self._why(exc)})")
                return PowerState.UNKNOWN
            self._say(logging.INFO, None)
            return cluster.ceph_state(flags, self._settings.ceph_flags, self._record)
        if "/" not in ref:
            status = (await self._call("list nodes", _nodes)).get(ref)
            return self._node_state(ref, str(status))
        current = await self._call(f"read the state of {target.name}", _current, ref)
        return _GUEST_STATES.get(str(current.get("status")), PowerState.UNKNOWN)

    async def stop(self, target: Target, method: StopMethod) -> None:
        """Guest ``shutdown`` or ``stop``; a node is shut down (there is no hard node stop);
        HA is disarmed, the Ceph flags set (either way)."""
        ref = _ref(target)
        if ref == cluster.HA:
            await self._call("disarm HA", cluster.disarm_ha, self._record)
            return
        if ref == cluster.CEPH:
            wanted = self._settings.ceph_flags
            await self._call(
                "set the Ceph flags", cluster.set_ceph_flags, wanted, self._record, self._where
            )
            return
        if "/" not in ref:
            if method is StopMethod.HARD:
                raise PermanentError(
                    f"{self._where}: node {target.name} has no hard power-off here: use its BMC"
                )
            await self._call(f"shut down node {target.name}", _node_shutdown, ref)
            self._nodes_shut_down.asked(ref)
            return
        action = "shutdown" if method is StopMethod.GRACEFUL else "stop"
        await self._call(f"{action} {target.name}", _guest_action, ref, action)

    async def start(self, target: Target) -> None:
        """A guest starts; HA is re-armed, the Ceph flags unset, each only if upsguard
        changed it. The flags go at once only if Ceph is back already; otherwise the request
        stands and ``wait_for`` unsets them when it is."""
        ref = _ref(target)
        if ref == cluster.HA:
            await self._call("re-arm HA", cluster.rearm_ha, self._record)
            return
        if ref == cluster.CEPH:
            await self._unset_once_ceph_is_back()
            return
        if "/" not in ref:
            raise PermanentError(
                f"{self._where}: node {target.name} cannot be powered on through the "
                "Proxmox API: set power_on_via (a BMC or wol)"
            )
        await self._call(f"start {target.name}", _guest_action, ref, "start")

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        """As ``Platform.wait_for``; but the Ceph flags' startup, which waits for Ceph, raises
        ``StepTimeout`` at its timeout naming what it waited for, so that the step says why."""
        interval = self._settings.poll_interval.total_seconds()
        if _ref(target) == cluster.CEPH and state is PowerState.ON:
            return await self._wait_for_ceph(timeout, interval)
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def _wait_for_ceph(self, timeout: float, interval: float) -> bool:
        """Read again every ``interval`` until the Ceph flags upsguard set are unset, which
        ``_unset_once_ceph_is_back`` does once Ceph is back, up to the step's ``timeout``."""
        deadline = self._clock.monotonic() + timeout
        while not (back := await self._unset_once_ceph_is_back()).is_true:
            left = deadline - self._clock.monotonic()
            if left <= 0:
                raise StepTimeout(
                    f"{self._where}: Ceph flags not unset after {format_duration(timeout)}: "
                    f"{back.why}"
                )
            await asyncio.sleep(min(interval, left))
        return True

    async def _unset_once_ceph_is_back(self) -> Fact:
        """Unset the flags upsguard set, if Ceph is back (``cluster.ceph_back``); true once
        they are unset (or none of them was still set). Otherwise what Ceph is waited for,
        said in the log when it changes; a reading that failed is unknown (with why), never
        back."""
        try:
            flags = await self._call(
                "read the Ceph flags", cluster.ceph_flags_to_unset, self._record
            )
            back = Fact.true()
            if flags:
                back = cluster.ceph_back(
                    await self._call("read Ceph's status", cluster.ceph_status)
                )
            if back.is_true:
                await self._call(
                    "unset the Ceph flags", cluster.unset_ceph_flags, self._record, flags
                )
        except TemporaryError as exc:
            back = Fact.unknown(f"Ceph unknown: {self._why(exc)}")
        waits = (
            None
            if back.is_true
            else f"the Ceph flags upsguard set stay until Ceph is back ({back.why})"
        )
        self._say(logging.INFO if back.known else logging.WARNING, waits)
        return back

    def _node_state(self, node: str, status: str) -> PowerState:
        read = _NODE_STATES.get(status, PowerState.UNKNOWN)
        return self._nodes_shut_down.state(node, read, quiet=status == "offline")

    def shutdown_accepted(self, target: Target) -> None:
        """``SeenWhileItAnswers``: a node's shutdown asked before a restart (or by the other
        controller) is under way: the node going offline is that shutdown landing."""
        ref = _ref(target)
        if "/" not in ref and ref not in (cluster.HA, cluster.CEPH):
            self._nodes_shut_down.accepted(ref)

    def _say(self, level: int, text: str | None) -> None:
        """Log ``text`` about the cluster's Ceph once, until it changes (a wait reads it again
        every poll); None when there is nothing to say."""
        if text is not None and text != self._ceph_said:
            log.log(level, "%s: %s", self._where, text)
        self._ceph_said = text

    def _why(self, error: UpsguardError) -> str:
        """The error's words without the platform they name, for a sentence that names it."""
        return str(error).removeprefix(f"{self._where}: ")

    async def in_flight(self, target: Target, state: PowerState) -> str | None:
        """``InFlightTasks``: the guest's task still active on its node toward ``state``
        (``/nodes/{node}/tasks?source=active``). A node's own shutdown is no API task."""
        ref = _ref(target)
        if ref.count("/") != 2:
            return None  # a node's shutdown and the cluster's state are no API task
        node, kind, vmid = ref.split("/")
        wanted = _TOWARD.get(state, {}).get(kind, ())
        active = await self._call(f"read the tasks under way on {node}", _active, node, vmid)
        for task in active:
            if task.get("type") in wanted and str(task.get("id")) == vmid:
                return f"Proxmox task {task.get('upid')}"
        return None

    async def healthy(self, target: Target) -> bool:
        """Running, and its guest agent answering where the VM's config enables one."""
        ref = _ref(target)
        if ref.count("/") != 2:
            return await self.power_state(target) is PowerState.ON
        current = await self._call(f"read the state of {target.name}", _current, ref)
        if current.get("status") != "running":
            return False
        if not current.get("agent"):
            return True
        answered: bool = await self._call(f"ping the agent of {target.name}", _agent_ping, ref)
        return answered

    async def _call(self, doing: str, fn: Any, *args: Any) -> Any:
        async with self._lock:
            try:
                if self._api is None:
                    self._api = await asyncio.to_thread(self._connect)
                return await asyncio.to_thread(fn, self._api, *args)
            except UpsguardError:
                raise
            except Exception as exc:
                translated = self._translate(exc, doing)
                if isinstance(translated, PlatformUnreachable | AuthenticationError):
                    self._api = None
                raise translated from exc

    def _connect(self) -> Any:
        settings = self._settings
        if not settings.user:
            raise ConfigError(f"platform '{self.name}': a proxmox platform needs 'user'")
        verify: bool | str = settings.verify_tls
        if settings.verify_tls and settings.ca_file is not None:
            verify = str(settings.ca_file)
        common: dict[str, Any] = {"port": settings.port, "verify_ssl": verify, "timeout": 30}
        if settings.token_name:
            secret = resolve_secret(
                f"platform '{self.name}' token", settings.token_file, settings.token_env
            )
            if secret is None:
                raise ConfigError(
                    f"platform '{self.name}': token_name needs token_file or token_env"
                )
            api = proxmoxer.ProxmoxAPI(
                settings.host,
                user=settings.user,
                token_name=settings.token_name,
                token_value=secret,
                **common,
            )
        else:
            password = resolve_secret(
                f"platform '{self.name}' password", settings.password_file, settings.password_env
            )
            if password is None:
                raise ConfigError(
                    f"platform '{self.name}': set token_name and token_file/token_env, "
                    "or password_file/password_env"
                )
            api = proxmoxer.ProxmoxAPI(
                settings.host, user=settings.user, password=password, **common
            )
        api.version.get()  # proves the credentials now, not at the first shutdown
        return api

    def _translate(self, exc: Exception, doing: str) -> UpsguardError:
        status = getattr(exc, "status_code", None)
        if isinstance(exc, proxmoxer.AuthenticationError) or status in (401, 403):
            return AuthenticationError(
                f"{self._where}: user '{self._settings.user}' was refused: check its "
                "token or password, and its permissions (docs/proxmox.md: VM.PowerMgmt, "
                "Sys.PowerMgmt, and for HA and Ceph Sys.Console, Sys.Modify)"
            )
        if isinstance(exc, requests.exceptions.SSLError):
            return PermanentError(
                f"{self._where}: its TLS certificate is not trusted: set ca_file "
                "(/etc/pve/pve-root-ca.pem on the node), or verify_tls: false at your own risk"
            )
        if isinstance(exc, requests.exceptions.RequestException):
            return PlatformUnreachable(f"{self._where}: {doing} failed: no answer")
        if isinstance(exc, proxmoxer.ResourceException):
            text = str(getattr(exc, "content", "") or exc).splitlines()[0][:200]
            return PlatformUnreachable(f"{self._where}: {doing} failed: {text}")
        return PlatformUnreachable(f"{self._where}: {doing} failed: {exc}")


def _ref(target: Target) -> str:
    if target.ref is None:
        raise PermanentError(f"target {target.name} was not resolved by a proxmox platform")
    return target.ref


def _target(platform: PlatformName, guest: dict[str, Any]) -> Target:
    ref = f"{guest['node']}/{guest['type']}/{guest['vmid']}"
    name = str(guest.get("name") or guest["vmid"])
    return Target(platform, ResourceKind.VM, name, ref=ref, host=str(guest["node"]))


def _selected(resource: ResourceConfig, guest: dict[str, Any]) -> bool:
    select = resource.select
    if select is None:
        return False
    if select.folder or select.attribute:
        raise PermanentError(
            f"resource '{resource.id}': Proxmox selects guests by name pattern or tag only"
        )
    if select.name and not fnmatch.fnmatchcase(str(guest.get("name", "")), select.name):
        return False
    tags = str(guest.get("tags") or "").replace(",", ";").split(";")
    return not (select.tag and select.tag not in tags)


def _guests(api: Any) -> list[dict[str, Any]]:
    found = api.cluster.resources.get(type="vm")
    return [g for g in found if g.get("type") in _GUEST_TYPES]


def _nodes(api: Any) -> dict[str, str]:
    return {str(n["node"]): str(n.get("status", "unknown")) for n in api.nodes.get()}


def _guest(api: Any, ref: str) -> Any:
    node, kind, vmid = ref.split("/")
    return getattr(api.nodes(node), kind)(vmid)


def _current(api: Any, ref: str) -> dict[str, Any]:
    return dict(_guest(api, ref).status.current.get())


def _active(api: Any, node: str, vmid: str) -> list[dict[str, Any]]:
    return [dict(t) for t in api.nodes(node).tasks.get(source="active", vmid=vmid)]


def _guest_action(api: Any, ref: str, action: str) -> None:
    getattr(_guest(api, ref).status, action).post()


def _node_shutdown(api: Any, node: str) -> None:
    api.nodes(node).status.post(command="shutdown")


def _agent_ping(api: Any, ref: str) -> bool:
    try:
        _guest(api, ref).agent.ping.post()
    except proxmoxer.ResourceException:
        return False  # "QEMU guest agent is not running": not up yet
    return True
