"""The alerts people read: what each is, and how often each is sent.

An ``Alert`` says what happened and what upsguard will do next, and when
(``controller.alert_text`` writes them from the events). ``RateLimit`` keeps each kind of alert
about one UPS, feed, cache or run to one per ``notify.alert_every``
(``config.service.ALERT_EVERY`` by default): a UPS flapping on and off battery sends one pair,
and the next alert of each kind counts those held back. When the last alert held back of a
pair tells a state other than the last one sent (on battery, while the last sent said on
mains), it is sent once its time comes: what a person last read is never the opposite of the
truth for longer than that.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, replace
from datetime import datetime

from upsguard.config.service import AlertLevel


class AlertKind(enum.StrEnum):
    """What an alert is about; ``family`` pairs a state with its end (on battery, on mains)."""

    ON_BATTERY = "on_battery"
    ON_MAINS = "on_mains"
    LOW_BATTERY = "low_battery"
    LOW_BATTERY_CLEARED = "low_battery_cleared"
    REPLACE_BATTERY = "replace_battery"
    REPLACE_BATTERY_CLEARED = "replace_battery_cleared"
    OVERLOAD = "overload"
    OVERLOAD_CLEARED = "overload_cleared"
    BYPASS = "bypass"
    BYPASS_CLEARED = "bypass_cleared"
    CONTACT_LOST = "contact_lost"
    STALE_DATA = "stale_data"
    CONTACT_BACK = "contact_back"
    REDUNDANCY_LOST = "redundancy_lost"
    REDUNDANCY_BACK = "redundancy_back"
    RUN_STARTED = "run_started"
    RUN_ENDED = "run_ended"
    RUN_FAILED = "run_failed"
    CACHE_WRITE_THROUGH = "cache_write_through"
    CACHE_WRITE_BACK = "cache_write_back"
    RISK = "risk"

    @property
    def family(self) -> str:
        """The state this kind tells the start or the end of (its pair shares it)."""
        return _FAMILY.get(self, self.value)


_FAMILY = {
    AlertKind.ON_BATTERY: "power",
    AlertKind.ON_MAINS: "power",
    AlertKind.LOW_BATTERY: "LB",
    AlertKind.LOW_BATTERY_CLEARED: "LB",
    AlertKind.REPLACE_BATTERY: "RB",
    AlertKind.REPLACE_BATTERY_CLEARED: "RB",
    AlertKind.OVERLOAD: "OVER",
    AlertKind.OVERLOAD_CLEARED: "OVER",
    AlertKind.BYPASS: "BYPASS",
    AlertKind.BYPASS_CLEARED: "BYPASS",
    AlertKind.CONTACT_LOST: "contact",
    AlertKind.STALE_DATA: "contact",
    AlertKind.CONTACT_BACK: "contact",
    AlertKind.REDUNDANCY_LOST: "redundancy",
    AlertKind.REDUNDANCY_BACK: "redundancy",
    AlertKind.CACHE_WRITE_THROUGH: "cache",
    AlertKind.CACHE_WRITE_BACK: "cache",
}

LEVELS: dict[AlertKind, AlertLevel] = {
    AlertKind.ON_BATTERY: "warning",
    AlertKind.LOW_BATTERY: "error",
    AlertKind.REPLACE_BATTERY: "warning",
    AlertKind.OVERLOAD: "warning",
    AlertKind.BYPASS: "warning",
    AlertKind.CONTACT_LOST: "warning",
    AlertKind.STALE_DATA: "warning",
    AlertKind.REDUNDANCY_LOST: "warning",
    AlertKind.RUN_STARTED: "warning",
    AlertKind.RUN_FAILED: "error",
    AlertKind.CACHE_WRITE_THROUGH: "warning",
    AlertKind.RISK: "error",
}
"""How loud each kind is (the others are ``info``); a channel's ``min_level`` filters on it.
A run that ended other than done is a warning."""

_GOOD = {
    AlertKind.ON_MAINS,
    AlertKind.LOW_BATTERY_CLEARED,
    AlertKind.REPLACE_BATTERY_CLEARED,
    AlertKind.OVERLOAD_CLEARED,
    AlertKind.BYPASS_CLEARED,
    AlertKind.CONTACT_BACK,
    AlertKind.REDUNDANCY_BACK,
    AlertKind.RUN_ENDED,
    AlertKind.CACHE_WRITE_BACK,
}


@dataclass(frozen=True, slots=True)
class Alert:
    """One alert as people read it: a headline, what happened, what upsguard does next."""

    kind: AlertKind
    subject: str
    """The UPS, feed, cache or run it is about (what the rate limit counts per)."""
    level: AlertLevel
    headline: str
    what: str
    next: str
    at: datetime
    site: str
    held_back: int = 0
    """Alerts of this kind about this subject held back since the last one sent."""

    @property
    def good_news(self) -> bool:
        """A state that ended well (on mains, contact back, a run done): told as a success."""
        return self.level == "info" and self.kind in _GOOD

    @property
    def title(self) -> str:
        return f"upsguard {self.site}: {self.headline}"

    @property
    def body(self) -> str:
        lines = [self.what, "", f"Next: {self.next}"]
        if self.held_back:
            n = self.held_back
            lines += ["", f"({n} more such alert{'s' if n > 1 else ''} held back before this one)"]
        stamp = self.at.strftime("%Y-%m-%d %H:%M:%S %Z").strip()
        lines += ["", f"upsguard, site {self.site}, {stamp}"]
        return "\n".join(lines)


class RateLimit:
    """Each kind of alert about one subject at most once per ``every_s`` (see the module's
    docstring). Times are the clock's monotonic seconds, passed in: a test's fake clock and
    the service's real one drive it alike."""

    def __init__(self, every_s: float) -> None:
        self.every_s = every_s
        self._sent_at: dict[tuple[AlertKind, str], float] = {}
        self._held: dict[tuple[AlertKind, str], list[Alert]] = {}
        self._told: dict[tuple[str, str], AlertKind] = {}
        """Per family and subject: the kind of the last alert sent."""
        self._latest: dict[tuple[str, str], AlertKind] = {}
        """Per family and subject: the kind of the last alert seen, sent or held."""

    def admit(self, alert: Alert, now: float) -> Alert | None:
        """The alert to send now, with the count of those held back before it; None when it
        is held back."""
        key = (alert.kind, alert.subject)
        self._latest[(alert.kind.family, alert.subject)] = alert.kind
        last = self._sent_at.get(key)
        if last is not None and now - last < self.every_s:
            self._held.setdefault(key, []).append(alert)
            return None
        return self._send(key, alert, now)

    def due(self, now: float) -> list[Alert]:
        """Held-back alerts whose time has come and that tell a state other than the one a
        person last read (the last seen of their pair, and not the last sent)."""
        out = []
        for key in list(self._held):
            kind, subject = key
            last = self._sent_at.get(key, now)
            if now - last < self.every_s:
                continue
            family = (kind.family, subject)
            if self._latest.get(family) is kind and self._told.get(family) is not kind:
                out.append(self._send(key, self._held[key][-1], now, held_before=1))
        return out

    def _send(
        self, key: tuple[AlertKind, str], alert: Alert, now: float, held_before: int = 0
    ) -> Alert:
        held = len(self._held.pop(key, [])) - held_before
        self._sent_at[key] = now
        self._told[(alert.kind.family, alert.subject)] = alert.kind
        return replace(alert, held_back=held) if held > 0 else alert
