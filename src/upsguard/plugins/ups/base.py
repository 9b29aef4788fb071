"""The ``UpsSource`` protocol: one UPS, read on demand, and told of its news when it can."""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol, runtime_checkable

from upsguard.clock import Clock
from upsguard.config.ups import UpsConfig
from upsguard.models import UpsName, UpsReading


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

    async def watch_for_news(self, news: Callable[[], None]) -> None:
        """Call ``news`` whenever the UPS announces a change on its own (an SNMP trap), so
        that the controller polls at once instead of at its next poll; runs until cancelled.

        ``news`` only asks for a poll: the poll reads the UPS as always. A source without
        such a channel (or with it switched off in the site file) returns at once. Raises an
        ``UpsguardError`` when the channel cannot be opened (a trap port in use); polling goes
        on regardless. Never blocks the event loop.
        """
        ...

    async def close(self) -> None:
        """Release connections; reading again afterwards reconnects."""
        ...


class UpsSourceFactory(Protocol):
    def __call__(self, config: UpsConfig, clock: Clock) -> UpsSource: ...
