"""The ``libvirt`` platform: KVM (or any libvirt) guests on one host, through libvirt-python.

A resource of kind ``vm`` names a domain; a ``vm_group`` selects domains by
name pattern (``select: {name: "web-*"}``; libvirt has no folders or tags).
Graceful stop is ``virDomainShutdown`` (ACPI or the guest agent, as libvirt
chooses); a driver or guest that cannot do it gives ``GracefulUnavailable`` and
the executor falls back to ``destroy`` (hard power-off). A started guest is
healthy once it runs and, where its domain has a QEMU guest agent channel,
once the agent answers a ping.

libvirt-python is blocking: every call runs in a worker thread.
"""

from __future__ import annotations

import asyncio
import fnmatch
from typing import Any

import libvirt

from upsguard.clock import Clock
from upsguard.config.platforms import LibvirtSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import (
    AuthenticationError,
    GracefulUnavailable,
    PermanentError,
    PlatformUnreachable,
    UpsguardError,
)
from upsguard.models import PlatformName, PowerState, ResourceKind, StopMethod, Target
from upsguard.plugins.platforms.base import poll_for_state

__all__ = ["LibvirtPlatform"]

# libvirt prints every error on stderr unless told otherwise; errors are translated here.
libvirt.registerErrorHandler(lambda _ctx, _err: None, None)

_STATES = {
    libvirt.VIR_DOMAIN_RUNNING: PowerState.ON,
    libvirt.VIR_DOMAIN_BLOCKED: PowerState.ON,
    libvirt.VIR_DOMAIN_PAUSED: PowerState.ON,
    libvirt.VIR_DOMAIN_SHUTDOWN: PowerState.ON,  # shutting down: not off yet
    libvirt.VIR_DOMAIN_SHUTOFF: PowerState.OFF,
    libvirt.VIR_DOMAIN_CRASHED: PowerState.OFF,
    libvirt.VIR_DOMAIN_PMSUSPENDED: PowerState.STANDBY,
}
_NO_GRACEFUL = {
    libvirt.VIR_ERR_NO_SUPPORT,
    libvirt.VIR_ERR_OPERATION_UNSUPPORTED,
    libvirt.VIR_ERR_AGENT_UNRESPONSIVE,
    libvirt.VIR_ERR_ARGUMENT_UNSUPPORTED,
}
_AGENT_CHANNEL = "org.qemu.guest_agent.0"
_AGENT_TIMEOUT_S = 5


class LibvirtPlatform:
    """One libvirt connection (``qemu:///system``, ``qemu+ssh://root@kvm1/system``)."""

    def __init__(self, name: PlatformName, settings: LibvirtSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._conn: Any = None
        self._lock = asyncio.Lock()

    @property
    def _where(self) -> str:
        return f"libvirt '{self.name}' ({self._settings.uri})"

    async def open(self) -> None:
        await self._call("connect", lambda conn: None)

    async def close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            await asyncio.to_thread(_close, conn)

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        """One domain for a ``vm``; every domain whose name matches for a ``vm_group``."""
        if resource.kind is ResourceKind.VM_GROUP:
            return await self._resolve_group(resource)
        found = await self._call(f"find domain {resource.target_name}", _uuid_of, resource)
        if found is None:
            raise PermanentError(
                f"resource '{resource.id}': {self._where} has no domain named "
                f"'{resource.target_name}'"
            )
        return [Target(self.name, resource.kind, resource.target_name, ref=found)]

    async def _resolve_group(self, resource: ResourceConfig) -> list[Target]:
        select = resource.select
        if select is None or select.name is None or select.folder or select.tag or select.attribute:
            raise PermanentError(
                f"resource '{resource.id}': libvirt selects domains by name pattern only "
                "(select: {name: 'web-*'})"
            )
        domains = await self._call("list domains", _all_domains)
        return [
            Target(self.name, ResourceKind.VM, name, ref=ident)
            for name, ident in sorted(domains)
            if fnmatch.fnmatchcase(name, select.name)
        ]

    async def power_state(self, target: Target) -> PowerState:
        code = await self._call(f"read the state of {target.name}", _state, _ref(target))
        return _STATES.get(code, PowerState.UNKNOWN)

    async def stop(self, target: Target, method: StopMethod) -> None:
        """``shutdown`` (graceful) or ``destroy`` (hard power-off); nothing when it is off."""
        if await self.power_state(target) is PowerState.OFF:
            return
        if method is StopMethod.HARD:
            await self._call(f"destroy {target.name}", _destroy, _ref(target))
            return
        refused = await self._call(f"shut down {target.name}", _shutdown, _ref(target))
        if refused is not None:
            raise GracefulUnavailable(
                f"{self._where}: {target.name} cannot be shut down gracefully ({refused})"
            )

    async def start(self, target: Target) -> None:
        if await self.power_state(target) is PowerState.ON:
            return
        await self._call(f"start {target.name}", _create, _ref(target))

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        interval = self._settings.poll_interval.total_seconds()
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def healthy(self, target: Target) -> bool:
        """Running, and its guest agent answering where the domain has one."""
        if await self.power_state(target) is not PowerState.ON:
            return False
        answer: bool = await self._call(f"ping the agent of {target.name}", _agent_ok, _ref(target))
        return answer

    async def _call(self, doing: str, fn: Any, *args: Any) -> Any:
        async with self._lock:
            try:
                if self._conn is None:
                    self._conn = await asyncio.to_thread(libvirt.open, self._settings.uri)
                return await asyncio.to_thread(fn, self._conn, *args)
            except libvirt.libvirtError as exc:
                raise self._translate(exc, doing) from exc

    def _translate(self, exc: Any, doing: str) -> UpsguardError:
        code = exc.get_error_code()
        text = _message(exc)
        if code == libvirt.VIR_ERR_AUTH_FAILED:
            return AuthenticationError(f"{self._where}: {doing}: access refused ({text})")
        if code in (libvirt.VIR_ERR_NO_DOMAIN, libvirt.VIR_ERR_INVALID_ARG):
            return PermanentError(f"{self._where}: {doing}: {text}")
        if code in (libvirt.VIR_ERR_SYSTEM_ERROR, libvirt.VIR_ERR_RPC):
            self._conn = None  # the connection is gone: open a new one next time
        return PlatformUnreachable(f"{self._where}: {doing} failed: {text}")


def _message(exc: Any) -> str:
    return str(exc.get_error_message() or exc).splitlines()[0]


def _ref(target: Target) -> str:
    if target.ref is None:
        raise PermanentError(f"target {target.name} was not resolved by a libvirt platform")
    return target.ref


def _uuid_of(conn: Any, resource: ResourceConfig) -> str | None:
    try:
        return str(conn.lookupByName(resource.target_name).UUIDString())
    except libvirt.libvirtError as exc:
        if exc.get_error_code() == libvirt.VIR_ERR_NO_DOMAIN:
            return None
        raise


def _all_domains(conn: Any) -> list[tuple[str, str]]:
    return [(d.name(), d.UUIDString()) for d in conn.listAllDomains()]


def _state(conn: Any, ident: str) -> int:
    return int(conn.lookupByUUIDString(ident).state()[0])


def _shutdown(conn: Any, ident: str) -> str | None:
    """Ask for a guest shutdown; the reason when the driver or guest cannot do one."""
    try:
        conn.lookupByUUIDString(ident).shutdown()
    except libvirt.libvirtError as exc:
        if exc.get_error_code() in _NO_GRACEFUL:
            return _message(exc)
        raise
    return None


def _destroy(conn: Any, ident: str) -> None:
    conn.lookupByUUIDString(ident).destroy()


def _create(conn: Any, ident: str) -> None:
    conn.lookupByUUIDString(ident).create()


def _agent_ok(conn: Any, ident: str) -> bool:
    """True when the domain has no agent channel, or its agent answers ``guest-ping``."""
    domain = conn.lookupByUUIDString(ident)
    if _AGENT_CHANNEL not in domain.XMLDesc(0):
        return True
    import libvirt_qemu

    try:
        libvirt_qemu.qemuAgentCommand(domain, '{"execute":"guest-ping"}', _AGENT_TIMEOUT_S, 0)
    except libvirt.libvirtError as exc:
        # A driver without agent support (the test driver) cannot tell: running is enough.
        return bool(exc.get_error_code() == libvirt.VIR_ERR_NO_SUPPORT)
    return True


def _close(conn: Any) -> None:
    try:
        conn.close()
    except libvirt.libvirtError:
        return
