"""A UPS that exists only in the simulator and the demo.

It reads from a ``PowerSupply`` (the simulator's world: mains timeline and
battery model); without one it is a UPS that is always on line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from upsguard.clock import Clock
from upsguard.config.ups import UpsConfig
from upsguard.errors import PermanentError
from upsguard.models import UpsFlag, UpsName, UpsReading


class PowerSupply(Protocol):
    def reading(self, ups: UpsName) -> UpsReading:
        """The UPS's state now, as a real UPS would report it: a reading with ``link=stale``
        when its data is old; raises ``UpsguardError`` when it does not answer at all."""
        ...


class SimulatedUps:
    def __init__(self, config: UpsConfig, clock: Clock, power: PowerSupply | None = None) -> None:
        self.name = config.name
        self._config = config
        self._clock = clock
        self.power = power
        self.commands: list[str] = []

    async def read(self) -> UpsReading:
        if self.power is not None:
            return self.power.reading(self.name)
        charge = self._config.simulated.start_charge if self._config.simulated else 100.0
        return UpsReading(
            ups=self.name,
            at=self._clock.now(),
            flags=frozenset({UpsFlag.OL}),
            charge_pct=charge,
        )

    async def command(self, name: str) -> None:
        if name not in ("shutdown.return", "shutdown.stayoff", "load.off.delay", "load.off"):
            raise PermanentError(f"UPS {self.name}: unknown instant command '{name}'")
        self.commands.append(name)

    async def watch_for_news(self, news: Callable[[], None]) -> None:
        return None  # the simulator's polls see every change

    async def close(self) -> None:
        return None
