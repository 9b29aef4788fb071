"""The ``redfish`` platform: a BMC's Redfish API (sushy), TLS verified unless told not to.

``ComputerSystem.Reset`` does the work: ``GracefulShutdown`` for a graceful
stop, ``ForceOff`` for a hard one, ``On`` to start. A BMC may serve several
systems (a blade chassis): ``system_id`` picks one, otherwise the resource's
host name is matched against the systems' ids and names, and a BMC with a
single system needs neither.

sushy is blocking: every call runs in a worker thread, one at a time per BMC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import sushy
from sushy import exceptions as sushy_errors

from upsguard.clock import Clock
from upsguard.config.platforms import RedfishSettings
from upsguard.config.resources import ResourceConfig
from upsguard.config.types import resolve_secret
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    GracefulUnavailable,
    PermanentError,
    PlatformUnreachable,
    UpsguardError,
)
from upsguard.findings import Finding
from upsguard.models import PlatformName, PowerState, StopMethod, Target
from upsguard.plugins.platforms.base import bmc_answers, poll_for_state
from upsguard.secrecy import redact_url

__all__ = ["RedfishPlatform"]

_STATES = {
    sushy.PowerState.ON: PowerState.ON,
    sushy.PowerState.POWERING_OFF: PowerState.ON,  # not off until it says Off
    sushy.PowerState.OFF: PowerState.OFF,
    sushy.PowerState.POWERING_ON: PowerState.UNKNOWN,  # neither off nor usable yet
    sushy.PowerState.PAUSED: PowerState.STANDBY,
}


def base_url(host: str) -> str:
    """``10.0.0.5`` or ``https://bmc.lab:8443/`` -> ``https://10.0.0.5`` / ``https://bmc.lab:8443``."""
    url = host if "://" in host else f"https://{host}"
    return url.rstrip("/").removesuffix("/redfish/v1")


class RedfishPlatform:
    """One BMC's Redfish service, logged in with its user and password."""

    def __init__(self, name: PlatformName, settings: RedfishSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._root: Any = None
        self._lock = asyncio.Lock()

    @property
    def _where(self) -> str:
        return f"Redfish BMC '{self.name}' ({redact_url(base_url(self._settings.host))})"

    async def open(self) -> None:
        await self._call("connect", lambda root: None)

    async def close(self) -> None:
        """Log out of the Redfish session, if one was opened (else basic auth was used)."""
        root, self._root = self._root, None
        if root is not None:
            await asyncio.to_thread(_logout, root)

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        """The system behind the BMC that stands for ``resource``."""
        path = await self._call("list systems", self._pick_system, resource.target_name)
        return [Target(self.name, resource.kind, resource.target_name, ref=path)]

    async def power_state(self, target: Target) -> PowerState:
        state = await self._call("read the power state", _power_state, _ref(target))
        return _STATES.get(state, PowerState.UNKNOWN)

    async def stop(self, target: Target, method: StopMethod) -> None:
        """``GracefulShutdown`` or ``ForceOff``; graceful is refused when the BMC lacks it."""
        wanted = (
            sushy.ResetType.GRACEFUL_SHUTDOWN
            if method is StopMethod.GRACEFUL
            else sushy.ResetType.FORCE_OFF
        )
        allowed = await self._call("read reset types", _reset_types, _ref(target))
        if wanted not in allowed and method is StopMethod.GRACEFUL:
            raise GracefulUnavailable(
                f"{self._where}: system {target.name} offers no GracefulShutdown"
            )
        await self._call(f"reset {wanted.value}", _reset, _ref(target), wanted)

    async def start(self, target: Target) -> None:
        """``On`` (or ``ForceOn`` where only that exists); nothing when it is on already."""
        if await self.power_state(target) is PowerState.ON:
            return
        allowed = await self._call("read reset types", _reset_types, _ref(target))
        wanted = sushy.ResetType.ON
        if wanted not in allowed and sushy.ResetType.FORCE_ON in allowed:
            wanted = sushy.ResetType.FORCE_ON
        await self._call(f"reset {wanted.value}", _reset, _ref(target), wanted)

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        interval = self._settings.poll_interval.total_seconds()
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: the BMC answers for each machine it powers (its state read)."""
        return await bmc_answers(
            self,
            resources,
            "check the BMC's address, that its Redfish service is on, and the network to it",
        )

    async def healthy(self, target: Target) -> bool:
        """The BMC knows the system has power; the OS is the health check's business."""
        return await self.power_state(target) is PowerState.ON

    def _pick_system(self, root: Any, wanted: str) -> str:
        """The Systems member path for ``wanted`` (runs in the worker thread)."""
        collection = root.get_system_collection()
        paths = list(collection.members_identities)
        if self._settings.system_id is not None:
            path = f"{collection.path.rstrip('/')}/{self._settings.system_id}"
            root.get_system(path)  # raises ResourceNotFoundError when absent
            return path
        if len(paths) == 1:
            return str(paths[0])
        names: list[str] = []
        for path in paths:
            system = root.get_system(path)
            if wanted in (system.identity, system.name):
                return str(path)
            names.append(str(system.name or system.identity))
        raise PermanentError(
            f"{self._where}: no system named '{wanted}' (it has {', '.join(sorted(names))}): "
            "set the resource's host or the platform's system_id"
        )

    async def _call(self, doing: str, fn: Any, *args: Any) -> Any:
        async with self._lock:
            try:
                if self._root is None:
                    self._root = await asyncio.to_thread(self._connect)
                return await asyncio.to_thread(fn, self._root, *args)
            except UpsguardError:
                raise
            except sushy_errors.SushyError as exc:
                if isinstance(exc, sushy_errors.ConnectionError):
                    self._root = None
                raise self._translate(exc, doing) from exc

    def _connect(self) -> Any:
        settings = self._settings
        password = resolve_secret(
            f"platform '{self.name}' password", settings.password_file, settings.password_env
        )
        if password is None or not settings.user:
            raise ConfigError(
                f"platform '{self.name}': a redfish platform needs 'user' and "
                "'password_file' or 'password_env'"
            )
        verify: bool | str = settings.verify_tls
        if settings.verify_tls and settings.ca_file is not None:
            verify = str(settings.ca_file)
        root = sushy.Sushy(
            f"{base_url(settings.host)}/redfish/v1/",
            username=settings.user,
            password=password,
            verify=verify,
            server_side_retries=1,
            server_side_retries_delay=1,
            connect_timeout=10,
            read_timeout=30,
        )
        root.get_system_collection()  # proves the credentials now, not at the first reset
        return root

    def _translate(self, exc: Exception, doing: str) -> UpsguardError:
        text = str(exc)
        if isinstance(exc, sushy_errors.AccessError):
            return AuthenticationError(
                f"{self._where}: user '{self._settings.user}' was refused: "
                "check the user and its password file or variable"
            )
        if "CERTIFICATE_VERIFY_FAILED" in text:
            return PermanentError(
                f"{self._where}: its TLS certificate is not trusted: set ca_file to the CA "
                "that signed it (or verify_tls: false, at your own risk)"
            )
        if isinstance(exc, sushy_errors.ResourceNotFoundError):
            return PermanentError(f"{self._where}: {doing}: not found ({_first_line(text)})")
        if isinstance(exc, sushy_errors.HTTPError):
            return PlatformUnreachable(f"{self._where}: {doing} failed: {_first_line(text)}")
        return PlatformUnreachable(f"{self._where}: {doing} failed: no answer")


def _ref(target: Target) -> str:
    if target.ref is None:
        raise PermanentError(f"target {target.name} was not resolved by a redfish platform")
    return target.ref


def _first_line(text: str) -> str:
    return text.splitlines()[0][:200] if text else "unknown error"


def _power_state(root: Any, path: str) -> Any:
    return root.get_system(path).power_state


def _reset_types(root: Any, path: str) -> set[Any]:
    return set(root.get_system(path).get_allowed_reset_system_values())


def _reset(root: Any, path: str, reset_type: Any) -> None:
    root.get_system(path).reset_system(reset_type)


def _logout(root: Any) -> None:
    try:
        root.close()
    except Exception:  # closing is best effort: the BMC may already be gone
        return
