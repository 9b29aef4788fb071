"""A Wake-on-LAN network on loopback: a UDP listener that checks magic packets and "boots" hosts.

A real NIC wakes its machine when a UDP frame holds 6 bytes of 0xFF followed by
its MAC address 16 times (optionally a 4 or 6 byte SecureOn password after).
``WolNetwork`` listens where the ``wol`` platform sends (127.0.0.1 on a free
port), keeps every packet it received, rejects malformed ones, and when a
packet names a MAC it knows, starts that host: after ``boot_delay`` seconds a
TCP listener opens on the host's own loopback address and check port, which is
what the platform's reachability check waits for.

Fixtures (register ``tests.peers.wol`` in tests/conftest.py's ``pytest_plugins``):

* ``wol_network`` (function): a ``WolNetwork``; ``add_host(mac, address, boot_delay)``,
  ``woken`` (MACs that got a valid packet, in order), ``malformed`` (count),
  ``port`` and ``check_port``.
"""

from __future__ import annotations

import contextlib
import socket
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import pytest

from tests.peers.ports import free_port


def parse_magic(packet: bytes) -> str | None:
    """The MAC a magic packet wakes (``aa:bb:...``), or None when it is not one."""
    if len(packet) not in (102, 106, 108) or packet[:6] != b"\xff" * 6:
        return None
    mac = packet[6:12]
    if packet[6:102] != mac * 16:
        return None
    return ":".join(f"{b:02x}" for b in mac)


@dataclass
class _Host:
    address: str
    boot_delay: float
    server: socket.socket | None = None
    booting: bool = False  # a burst of magic packets boots it once


@dataclass
class WolNetwork:
    port: int
    check_port: int
    woken: list[str] = field(default_factory=list)
    malformed: int = 0
    _hosts: dict[str, _Host] = field(default_factory=dict)
    _sock: socket.socket | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def add_host(self, mac: str, address: str, boot_delay: float = 0.3) -> None:
        """A sleeping host at ``address`` (127.0.0.x) that answers on ``check_port`` once woken."""
        self._hosts[mac.lower().replace("-", ":")] = _Host(address, boot_delay)

    def serve(self) -> None:
        sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        sock.bind(("127.0.0.1", self.port))
        sock.settimeout(0.2)
        self._sock = sock
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self) -> None:
        while self._sock is not None:
            try:
                packet, _ = self._sock.recvfrom(2048)
            except TimeoutError:
                continue
            except OSError:
                return
            mac = parse_magic(packet)
            with self._lock:
                if mac is None:
                    self.malformed += 1
                    continue
                self.woken.append(mac)
                host = self._hosts.get(mac)
                if host is None or host.booting:
                    continue
                host.booting = True
            threading.Timer(host.boot_delay, self._boot, args=(host,)).start()

    def _boot(self, host: _Host) -> None:
        server = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        server.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        server.bind((host.address, self.check_port))
        server.listen(16)
        host.server = server

    def close(self) -> None:
        sock, self._sock = self._sock, None
        if sock is not None:
            sock.close()
        for host in self._hosts.values():
            if host.server is not None:
                with contextlib.suppress(OSError):
                    host.server.close()


@pytest.fixture
def wol_network() -> Iterator[WolNetwork]:
    network = WolNetwork(port=free_port(socket.SOCK_DGRAM), check_port=free_port())
    network.serve()
    time.sleep(0.01)
    yield network
    network.close()
