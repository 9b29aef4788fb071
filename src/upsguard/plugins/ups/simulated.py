"""A UPS that exists only in the simulator and the demo.

It reads from a ``PowerSupply`` (the simulator's world: mains timeline and
battery model); without one it is a UPS that is always on line.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

from upsguard.clock import Clock
from upsguard.config.ups import LOAD_CYCLE_COMMANDS, UpsConfig
from upsguard.errors import PermanentError
from upsguard.models import UpsFlag, UpsName, UpsReading

KNOWN_COMMANDS = LOAD_CYCLE_COMMANDS | {"shutdown.stayoff", "load.off.delay", "load.off"}


class PowerSupply(Protocol):
    def reading(self, ups: UpsName) -> UpsReading:
        """The UPS's state now, as a real UPS would report it: a reading with ``link=stale``
        when its data is old; raises ``UpsguardError`` when it does not answer at all."""
        ...

    def command(self, ups: UpsName, command: str, delay_s: float) -> None:
        """Carry out an instant command (a load cycle cuts the output after ``delay_s``)."""
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
        if name not in KNOWN_COMMANDS:
            raise PermanentError(f"UPS {self.name}: unknown instant command '{name}'")
        self.commands.append(name)
        if self.power is not None:
            policy = self._config.at_shutdown_end
            delay = policy.delay.total_seconds() if name == policy.command else 0.0
            self.power.command(self.name, name, delay)

    async def watch_for_changes(self, changed: Callable[[], None]) -> None:
        return None  # the simulator's polls see every change

    async def close(self) -> None:
        return None
