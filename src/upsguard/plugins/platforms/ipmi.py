"""The ``ipmi`` platform: one server's BMC over IPMI 2.0 (pyghmi).

A BMC powers exactly one machine, so every resource using this platform (a
host's ``power_on_via``, a storage head) is that machine. After an outage no
vCenter can power hosts on: the BMC can. Graceful stop is the chassis "soft
off" (an ACPI power-button press the OS turns into a clean shutdown); hard
stop cuts power at once. The executor decides when to fall back from one to
the other; this module only does what it is asked.

pyghmi is blocking: every call runs in a worker thread, one at a time per BMC.
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

from pyghmi.ipmi import command as ipmi_command

from upsguard.clock import Clock
from upsguard.config.platforms import IpmiSettings
from upsguard.config.resources import ResourceConfig
from upsguard.config.types import resolve_secret
from upsguard.errors import (
    AuthenticationError,
    ConfigError,
    PlatformUnreachable,
    UpsguardError,
)
from upsguard.findings import Finding
from upsguard.models import PlatformName, PowerState, StopMethod, Target
from upsguard.plugins.platforms.base import bmc_answers, poll_for_state

__all__ = ["IpmiPlatform"]

_STATES = {"on": PowerState.ON, "off": PowerState.OFF}
_AUTH_WORDS = ("password", "unauthorized", "privilege", "authentication")


class IpmiPlatform:
    """One BMC reached over IPMI LAN (RMCP+), with its user and password."""

    def __init__(self, name: PlatformName, settings: IpmiSettings, clock: Clock) -> None:
        self.name = name
        self._settings = settings
        self._clock = clock
        self._command: Any = None
        self._lock = asyncio.Lock()

    @property
    def _where(self) -> str:
        return f"BMC '{self.name}' ({self._settings.host}:{self._settings.port})"

    async def open(self) -> None:
        async with self._lock:
            await self._session()

    async def close(self) -> None:
        command, self._command = self._command, None
        if command is not None:
            await asyncio.to_thread(_logout, command)

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        """The one machine behind the BMC, named after the resource."""
        ref = f"{self._settings.host}:{self._settings.port}"
        return [Target(self.name, resource.kind, resource.target_name, ref=ref)]

    async def power_state(self, target: Target) -> PowerState:
        reply = await self._call("read the power state", "get_power")
        return _STATES.get(str(reply.get("powerstate")), PowerState.UNKNOWN)

    async def stop(self, target: Target, method: StopMethod) -> None:
        """Soft off (ACPI shutdown) when graceful, power off at once when hard."""
        if method is StopMethod.GRACEFUL:
            await self._call("soft off", "set_power", "softoff")
        else:
            await self._call("power off", "set_power", "off")

    async def start(self, target: Target) -> None:
        await self._call("power on", "set_power", "on")

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        interval = self._settings.poll_interval.total_seconds()
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: the BMC answers for each machine it powers (its state read)."""
        return await bmc_answers(
            self,
            resources,
            "check the BMC's address and port, that IPMI over LAN is on, and the network to it",
        )

    async def healthy(self, target: Target) -> bool:
        """A BMC only knows the chassis has power; the OS is the health check's business."""
        return await self.power_state(target) is PowerState.ON

    async def _call(self, doing: str, method: str, *args: Any) -> Any:
        async with self._lock:
            command = await self._session()
            try:
                reply = await asyncio.to_thread(getattr(command, method), *args)
            except Exception as exc:
                self._command = None
                raise self._translate(exc, doing) from exc
        if isinstance(reply, dict) and "error" in reply:
            raise PlatformUnreachable(f"{self._where}: {doing} failed: {reply['error']}")
        return reply

    async def _session(self) -> Any:
        """The logged-in session, made on first use and after any failure."""
        if self._command is not None:
            return self._command
        settings = self._settings
        password = resolve_secret(
            f"platform '{self.name}' password", settings.password_file, settings.password_env
        )
        if password is None or not settings.user:
            raise ConfigError(
                f"platform '{self.name}': an ipmi platform needs 'user' and "
                "'password_file' or 'password_env'"
            )
        try:
            self._command = await asyncio.to_thread(
                _login, settings.host, settings.port, settings.user, password
            )
        except Exception as exc:
            raise self._translate(exc, "log in") from exc
        return self._command

    def _translate(self, exc: Exception, doing: str) -> UpsguardError:
        if isinstance(exc, UpsguardError):
            return exc
        text = str(exc)
        if any(word in text.lower() for word in _AUTH_WORDS):
            return AuthenticationError(
                f"{self._where}: user '{self._settings.user}' was refused ({text}): "
                "check the user and its password file or variable"
            )
        if text in ("", "None"):
            text = "no answer (is IPMI over LAN enabled, and the address right?)"
        return PlatformUnreachable(f"{self._where}: {doing} failed: {text}")


def _login(host: str, port: int, user: str, password: str) -> Any:
    return ipmi_command.Command(bmc=host, userid=user, password=password, port=port, keepalive=True)


def _logout(command: Any) -> None:
    try:
        command.ipmi_session.logout()
    except Exception:  # closing is best effort: the BMC may already be gone
        return
