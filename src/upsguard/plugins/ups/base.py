"""The ``UpsSource`` protocol: one UPS, read on demand, and told of its changes when it can."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Protocol, runtime_checkable

from upsguard.clock import Clock
from upsguard.config.ups import UpsConfig
from upsguard.findings import Finding
from upsguard.models import UpsName, UpsReading
from upsguard.selftest import TestResult


@runtime_checkable
class UpsSource(Protocol):
    """Reads one UPS. Instances are cheap; connections may be shared inside a module."""

    name: UpsName

    async def read(self) -> UpsReading:
        """Return a fresh reading of this UPS.

        A server that answers but says its data is old (NUT ``DATA-STALE``,
        ``DRIVER-NOT-CONNECTED``) gives a reading with ``link=stale``, not an
        exception. Raises ``UpsUnreachable`` when nothing answers in time or the
        answer cannot be parsed; ``AuthenticationError`` when the credentials
        are refused. Never blocks the event loop.
        """
        ...

    async def command(self, name: str) -> None:
        """Send an instant command to the UPS (``shutdown.return``, ``load.off.delay``).

        Raises ``PermanentError`` when the UPS or the source does not support it,
        ``UpsUnreachable`` when the server does not answer.
        """
        ...

    async def watch_for_changes(self, changed: Callable[[], None]) -> None:
        """Call ``changed`` whenever the UPS announces a change on its own (an SNMP trap), so
        that the controller polls at once instead of at its next poll; runs until cancelled.

        ``changed`` only asks for a poll: the poll reads the UPS as always. A source without
        such a channel (or with it switched off in the site file) returns at once. Raises an
        ``UpsguardError`` when the channel cannot be opened (a trap port in use); polling goes
        on regardless. Never blocks the event loop.
        """
        ...

    async def close(self) -> None:
        """Release connections; reading again afterwards reconnects."""
        ...


@runtime_checkable
class UpsDiagnosis(Protocol):
    """A source that can check what the plan needs of its UPS, without acting on it: an
    optional capability, asked by ``upsguard doctor`` and the service's scheduled checks.
    """

    async def diagnose(self, commands: Sequence[str]) -> list[Finding]:
        """Check the login in the role the site file configures (and TLS where it asks for
        it), how fresh the UPS's data is, that the UPS offers ``commands`` (NUT-style
        instant command names: what the plan ends with, the battery tests) and that the
        user may send them.

        Never sends one of those commands, never changes a setting the UPS acts on. Each
        problem is a ``warn`` or ``fail`` finding (``Area.UPS``, subject: the UPS's name)
        with its fix; an error it did not expect propagates, and the doctor makes it a
        ``fail``. Returns within the source's own timeouts; never blocks the event loop.
        """
        ...


@runtime_checkable
class BatteryTests(Protocol):
    """A source whose UPS reports how its battery tests came out: an optional capability,
    used by the service's scheduled battery tests. The tests themselves are started and
    stopped with ``command`` (``test.battery.start.quick``, ``.deep``, ``test.battery.stop``).
    """

    async def battery_test_result(self) -> TestResult:
        """What the UPS says of its last battery test, or of the one under way. Raises
        ``UpsUnreachable`` when it does not answer (or its data is stale)."""
        ...


class UpsSourceFactory(Protocol):
    def __call__(self, config: UpsConfig, clock: Clock) -> UpsSource: ...
