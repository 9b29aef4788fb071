"""libvirt's built-in test driver (``test:///default``) through libvirt-python: a KVM host stand-in.

The test driver is part of libvirt itself (no daemon): it keeps domains in
memory, shared by every connection to ``test:///default`` in one process, and
answers the real libvirt API (define, create, shutdown, destroy, state). What
it does not do: guest shutdowns take no time (a domain is off as soon as the
call returns) and it has no guest agent (``qemuAgentCommand`` is unsupported).

Fixtures (register ``tests.peers.libvirt`` in tests/conftest.py's ``pytest_plugins``):

* ``libvirt_domains`` (function): ``define(name, running=False, agent=False) -> str``
  defines a domain with a unique name (returned) and removes it after the test;
  ``state(name)`` reads its state as ``"running"``/``"shut off"``/...; ``uri``.

If libvirt-python is missing the fixture fails and says to run scripts/setup.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest

URI = "test:///default"
_STATE_NAMES = {1: "running", 2: "blocked", 3: "paused", 4: "shutdown", 5: "shut off"}

_AGENT = "<channel type='unix'><target type='virtio' name='org.qemu.guest_agent.0'/></channel>"


@dataclass
class LibvirtDomains:
    conn: Any
    uri: str = URI
    names: list[str] = field(default_factory=list)

    def define(self, name: str, *, running: bool = False, agent: bool = False) -> str:
        unique = f"{name}-{uuid.uuid4().hex[:8]}"
        devices = _AGENT if agent else ""
        xml = (
            f"<domain type='test'><name>{unique}</name><memory unit='MiB'>512</memory>"
            f"<os><type>hvm</type></os><devices>{devices}</devices></domain>"
        )
        domain = self.conn.defineXML(xml)
        if running:
            domain.create()
        self.names.append(unique)
        return unique

    def state(self, name: str) -> str:
        code = self.conn.lookupByName(name).state()[0]
        return _STATE_NAMES.get(code, str(code))

    def cleanup(self) -> None:
        for name in self.names:
            domain = self.conn.lookupByName(name)
            if domain.isActive():
                domain.destroy()
            domain.undefine()


@pytest.fixture
def libvirt_domains() -> Iterator[LibvirtDomains]:
    try:
        import libvirt
    except ImportError:
        pytest.fail("libvirt-python is missing: run scripts/setup (builds it against libvirt-dev)")
    libvirt.registerErrorHandler(lambda _ctx, _err: None, None)
    domains = LibvirtDomains(libvirt.open(URI))
    yield domains
    domains.cleanup()
    domains.conn.close()
