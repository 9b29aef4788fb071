"""The ``UpsSource`` protocol: one UPS, read on demand."""

from __future__ import annotations

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

    async def close(self) -> None:
        """Release connections; reading again afterwards reconnects."""
        ...


class UpsSourceFactory(Protocol):
    def __call__(self, config: UpsConfig, clock: Clock) -> UpsSource: ...
