"""The ``wol`` platform: Wake-on-LAN for machines without a BMC, then a reachability check.

It can only wake: a machine woken this way is shut down through its own
platform (``ssh``, ``command``). A resource names it as ``power_on_via: wol``
(or a ``platforms:`` key of type ``wol``) and gives its ``mac``. Whether the
machine is up is judged by its ``check_port`` (22 by default) accepting a TCP
connection on the resource's host: a sleeping machine answers nothing.

Magic packets are UDP datagrams, which can be lost: ``start`` sends three. They are sent
to a broadcast address, which wakes only machines on a network this machine is on: a
directed broadcast to another network leaves through a gateway, and routers drop those
(unless told not to). ``diagnose`` says so.
"""

from __future__ import annotations

import asyncio
import ipaddress
import re
import socket
import struct
from collections.abc import Sequence
from pathlib import Path

from upsguard.clock import Clock
from upsguard.config.platforms import WolSettings
from upsguard.config.resources import MAC_ADDRESS, ResourceConfig
from upsguard.errors import PermanentError, PlatformUnreachable
from upsguard.findings import Area, Finding, fail, ok, warn
from upsguard.models import PlatformName, PowerState, StopMethod, Target
from upsguard.plugins.platforms.base import poll_for_state, port_state

__all__ = ["WolPlatform", "gateway_for", "magic_packet"]

_REPEATS = 3
_CONNECT_TIMEOUT = 2.0
ROUTES = Path("/proc/net/route")
"""The kernel's main routing table (Linux), read to tell a LAN from a gateway."""
_RTF_UP, _RTF_GATEWAY = 0x1, 0x2


def magic_packet(mac: str) -> bytes:
    """Six 0xFF bytes, then the MAC sixteen times."""
    raw = bytes.fromhex(re.sub(r"[:-]", "", mac))
    return b"\xff" * 6 + raw * 16


class WolPlatform:
    """Sends magic packets to one broadcast address and port."""

    def __init__(
        self, name: PlatformName, settings: WolSettings, clock: Clock, *, routes: Path = ROUTES
    ) -> None:
        """``routes``: the routing table ``diagnose`` reads (``/proc/net/route``)."""
        self.name = name
        self._settings = settings
        self._clock = clock
        self._routes = routes
        self._addresses: dict[str, str] = {}

    async def open(self) -> None:
        return None

    async def close(self) -> None:
        return None

    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        """The machine with ``resource.mac``; ``PermanentError`` when it is missing or malformed."""
        mac = resource.mac
        if mac is None or not MAC_ADDRESS.match(mac):
            shown = f"'{mac}'" if mac else "no 'mac'"
            raise PermanentError(
                f"resource '{resource.id}': Wake-on-LAN needs its MAC address, and it has "
                f"{shown}: set mac like 'aa:bb:cc:dd:ee:ff'"
            )
        target = Target(self.name, resource.kind, resource.target_name, ref=mac.lower())
        self._addresses[target.name] = resource.host or str(resource.id)
        return [target]

    async def power_state(self, target: Target) -> PowerState:
        """ON when the machine's check port accepts a connection, else UNKNOWN (a machine
        that is off and one out of reach look alike); a power-on is sent for anything not ON."""
        return await port_state(self._address(target), self._settings.check_port, _CONNECT_TIMEOUT)

    async def stop(self, target: Target, method: StopMethod) -> None:
        raise PermanentError(
            f"platform '{self.name}' (Wake-on-LAN) can only wake {target.name}: "
            "stop it through its own platform (ssh, command)"
        )

    async def start(self, target: Target) -> None:
        """Send the magic packet (three times: UDP may drop one)."""
        packet = magic_packet(self._mac(target))
        destination = (self._settings.broadcast, self._settings.port)
        try:
            await asyncio.to_thread(_send, packet, destination)
        except OSError as exc:
            raise PlatformUnreachable(
                f"platform '{self.name}': cannot send the Wake-on-LAN packet to "
                f"{destination[0]}:{destination[1]}: {exc.strerror or exc}"
            ) from exc

    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        interval = self._settings.poll_interval.total_seconds()
        return await poll_for_state(self, target, state, timeout, interval, self._clock)

    async def healthy(self, target: Target) -> bool:
        return await self.power_state(target) is PowerState.ON

    async def diagnose(self, resources: Sequence[ResourceConfig]) -> list[Finding]:
        """``PlatformDiagnosis``: each machine has a MAC address, and the packets have a path
        to a network this machine is on: not through a gateway (read in the routing table),
        and the kernel has a route to the broadcast address (asked with a UDP connect, which
        sends nothing; no machine is woken)."""
        found: list[Finding] = []
        macs: list[str] = []
        for res in resources:
            try:
                macs += [f"{res.id} {t.ref}" for t in await self.resolve(res)]
            except PermanentError as exc:
                fix = "set the resource's mac (as 'ip link' shows it on that machine)"
                found.append(fail(Area.RESOURCE, res.id, "mac", str(exc), fix))
        return [*found, await self._path(macs)]

    async def _path(self, macs: list[str]) -> Finding:
        destination = (self._settings.broadcast, self._settings.port)
        where = f"{destination[0]}:{destination[1]}"
        fix = (
            "set broadcast to the broadcast address of the machines' network, on a network "
            "this machine is on (ip -br addr)"
        )
        try:
            table = await asyncio.to_thread(self._routes.read_text, encoding="ascii")
            gateway = gateway_for(destination[0], table)
        except (OSError, ValueError) as exc:
            why = getattr(exc, "strerror", None) or exc
            return warn(
                Area.PLATFORM,
                self.name,
                "path",
                f"cannot tell whether packets to {where} reach the machines' network: "
                f"{self._routes}: {why}",
                fix,
            )
        if gateway is not None:
            return warn(
                Area.PLATFORM,
                self.name,
                "path",
                f"packets to {where} leave through the gateway {gateway}: a router does not "
                "pass a directed broadcast on to its network (unless set to), so no machine "
                "there wakes",
                f"{fix}, or wake them from a machine on their network",
            )
        try:
            await asyncio.to_thread(_route, destination)
        except OSError as exc:
            return fail(
                Area.PLATFORM,
                self.name,
                "path",
                f"no route for Wake-on-LAN packets to {where}: {exc.strerror or exc}",
                fix,
            )
        woken = f": {', '.join(macs)}" if macs else ""
        return ok(
            Area.PLATFORM,
            self.name,
            "path",
            f"packets to {where} go out on a network of this machine{woken}",
        )

    def _mac(self, target: Target) -> str:
        if target.ref is None:
            raise PermanentError(f"target {target.name} was not resolved by platform {self.name}")
        return target.ref

    def _address(self, target: Target) -> str:
        address = self._addresses.get(target.name)
        if address is None:
            raise PermanentError(f"target {target.name} was not resolved by platform {self.name}")
        return address


def gateway_for(address: str, table: str) -> str | None:
    """The gateway through which the main routing table (``/proc/net/route``'s text) sends
    ``address``, by the longest prefix that holds it (the lowest metric among equals); None
    when a network this machine is on holds it, or when no gateway ever takes it (the
    limited broadcast 255.255.255.255, loopback). Raises ``ValueError`` for an address or a
    table that cannot be read as such."""
    target = ipaddress.IPv4Address(address)
    if target.is_loopback or target == ipaddress.IPv4Address("255.255.255.255"):
        return None
    best: tuple[tuple[int, int], str | None] | None = None
    for line in table.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 8:
            continue
        destination, gateway, mask = (_address(fields[i]) for i in (1, 2, 7))
        flags, metric = int(fields[3], 16), int(fields[6])
        if not flags & _RTF_UP or int(target) & int(mask) != int(destination):
            continue
        rank = (bin(int(mask)).count("1"), -metric)
        if best is None or rank > best[0]:
            best = (rank, str(gateway) if flags & _RTF_GATEWAY else None)
    return best[1] if best is not None else None


def _address(field: str) -> ipaddress.IPv4Address:
    """An address of ``/proc/net/route``: hexadecimal, in the machine's own byte order."""
    return ipaddress.IPv4Address(socket.inet_ntoa(struct.pack("=I", int(field, 16))))


def _route(destination: tuple[str, int]) -> None:
    """Raises OSError when the kernel has no route to ``destination``; sends nothing."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        sock.connect(destination)


def _send(packet: bytes, destination: tuple[str, int]) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_BROADCAST, 1)
        for _ in range(_REPEATS):
            sock.sendto(packet, destination)
