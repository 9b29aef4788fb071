"""The battery model of the simulator: Peukert-style runtime, load that changes over time.

A UPS's runtime is given at one reference load (``runtime_at``: 30 min at
400 W). At another load P the full-charge runtime is

    T(P) = T_ref * (P_ref / P) ** k

with ``k`` the Peukert exponent (1.0 = ideal; lead-acid UPS batteries sit
around 1.1-1.3; default 1.15). The state of charge falls by dt / T(P) over
each interval at load P, so when hosts go down the load falls and the
remaining runtime, ``soc * T(P)``, stretches. Recharging is linear to full
over ``recharge_s`` (UPS chargers are current-limited; 4 h to full is typical).
"""

from __future__ import annotations

from dataclasses import dataclass

IDLE_WATTS = 1.0  # keeps T(P) finite when nothing is left on the UPS


@dataclass
class Battery:
    runtime_ref_s: float
    load_ref_w: float
    peukert: float = 1.15
    soc: float = 1.0
    recharge_s: float = 4 * 3600.0

    def full_runtime_s(self, load_w: float) -> float:
        load = max(load_w, IDLE_WATTS)
        return float(self.runtime_ref_s * (self.load_ref_w / load) ** self.peukert)

    def runtime_s(self, load_w: float) -> float:
        return self.soc * self.full_runtime_s(load_w)

    def drain(self, load_w: float, seconds: float) -> float | None:
        """Discharge for ``seconds``; returns the seconds after which it ran empty, if it did."""
        full = self.full_runtime_s(load_w)
        left = self.soc * full
        if seconds >= left:
            self.soc = 0.0
            return left
        self.soc -= seconds / full
        return None

    def charge(self, seconds: float) -> None:
        self.soc = min(1.0, self.soc + seconds / self.recharge_s)

    @property
    def charge_pct(self) -> float:
        return self.soc * 100.0

    @property
    def energy_wh(self) -> float:
        """The energy left, counted at the reference load (at other loads Peukert's law
        makes it more or less)."""
        return self.soc * self.runtime_ref_s * self.load_ref_w / 3600.0
