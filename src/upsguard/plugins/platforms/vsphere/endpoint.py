"""Where and as whom to log in: vCenter, or one ESXi host once vCenter is down.

The password is read from its file or variable each time a login needs it, so
a rotated password is picked up, and it never appears in a message.
"""

from __future__ import annotations

import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from upsguard.config.platforms import VsphereSettings
from upsguard.config.types import resolve_secret
from upsguard.errors import ConfigError, PermanentError
from upsguard.net import tls_context


@dataclass(frozen=True)
class Endpoint:
    """One vSphere API endpoint. ``label`` names it in messages (``vsphere platform 'vc'``)."""

    label: str
    host: str
    port: int
    user: str
    password: Callable[[], str]
    verify_tls: bool = True
    ca_file: Path | None = None

    @property
    def address(self) -> str:
        return f"{self.host}:{self.port}"

    def ssl_context(self) -> ssl.SSLContext:
        try:
            return tls_context(self.verify_tls, self.ca_file)
        except ConfigError as exc:
            raise ConfigError(f"{self.label}: {exc}") from exc


def manager_endpoint(name: str, settings: VsphereSettings) -> Endpoint:
    """vCenter (or the one ESXi host) the site file names. Raises ``ConfigError``."""
    label = f"vsphere platform '{name}'"
    if not settings.user:
        raise ConfigError(f"{label}: 'user' is required")
    if not (settings.password_file or settings.password_env):
        raise ConfigError(f"{label}: give password_file or password_env")
    secret = _secret(label, settings.password_file, settings.password_env)
    return Endpoint(
        label,
        settings.host,
        settings.port,
        settings.user,
        secret,
        settings.verify_tls,
        settings.ca_file,
    )


def host_endpoint(name: str, settings: VsphereSettings, host_name: str) -> Endpoint:
    """An ESXi host reached directly, by ``direct_addresses`` or by its name in vCenter.

    Raises ``PermanentError`` when the site file gives no ``direct_hosts`` credentials.
    """
    access = settings.direct_hosts
    label = f"vsphere platform '{name}', ESXi host '{host_name}'"
    if access is None or not access.user:
        raise PermanentError(f"{label}: vCenter is down and no direct_hosts credentials are given")
    address = settings.direct_addresses.get(host_name, host_name)
    host, _, port = address.rpartition(":") if ":" in address else (address, "", "443")
    secret = _secret(label, access.password_file, access.password_env)
    return Endpoint(label, host, int(port), access.user, secret, access.verify_tls, access.ca_file)


def _secret(label: str, file: Path | None, env: str | None) -> Callable[[], str]:
    def read() -> str:
        return resolve_secret(f"{label} password", file, env) or ""

    return read
