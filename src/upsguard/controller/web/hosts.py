"""The names the page is served as, and the check of a request's ``Host`` against them.

A page on loopback is still reachable from a browser on the same machine through any name
that resolves to its address: a site of an attacker's whose name is made to resolve to
127.0.0.1 (DNS rebinding) is, for the browser, that site, and sends its own name as Host
and Origin. The Origin check cannot tell, since both agree; the Host can: the page answers
only to the names it is served as (``web.names``, or by default its listen address,
``localhost`` on loopback, and this machine's names).
"""

from __future__ import annotations

import asyncio
import ipaddress
import socket
from collections.abc import Iterable

from upsguard.config.web import WebConfig


def host_name(host: str) -> str:
    """The name of a ``Host`` header's value: lower case, without its port, the brackets of
    an IPv6 address, or a final dot."""
    host = host.strip().lower()
    if host.startswith("["):
        host = host[1:].split("]", 1)[0]
    elif host.count(":") == 1:
        host = host.split(":", 1)[0]
    return host.rstrip(".")


class Hosts:
    """The names the page answers to. Given in the site file, exactly those; else the listen
    address (with ``localhost`` and the loopback addresses when it listens on loopback or on
    every address) and the machine's host name at once, and its full name and addresses once
    ``start`` has looked them up (off the event loop: a lookup may wait for DNS)."""

    def __init__(self, config: WebConfig) -> None:
        self._config = config
        self._names = frozenset(_normal(config.names or _quick_defaults(config)))

    async def start(self) -> None:
        if self._config.names is None:
            found = await asyncio.to_thread(_looked_up, self._config)
            self._names = self._names | frozenset(_normal(found))

    def serves(self, host: str) -> bool:
        return host_name(host) in self._names


def _normal(names: Iterable[str]) -> Iterable[str]:
    return (host_name(name) for name in names if name)


def _quick_defaults(config: WebConfig) -> list[str]:
    names = [str(config.listen), socket.gethostname()]
    if config.listen.is_loopback or config.listen.is_unspecified:
        names += ["localhost", "127.0.0.1", "::1"]
    return names


def _looked_up(config: WebConfig) -> list[str]:
    """The machine's full name and, when the page listens on every address, the addresses
    its name resolves to."""
    names = [socket.getfqdn()]
    if config.listen.is_unspecified:
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None)
        except OSError:
            infos = []
        for info in infos:
            address = ipaddress.ip_address(str(info[4][0]).split("%")[0])
            names.append(str(address))
    return names
