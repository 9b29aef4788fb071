"""The alerts people read, through Apprise to a real SMTP server and an ntfy-style endpoint on
loopback: each alert of the set says what happened and what upsguard does next; each kind is
rate-limited per UPS or feed (on a fake clock); a channel that fails is logged once, without
its secret, and never keeps the others from their alerts."""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.peers.alerts import PASSWORD, TOKEN, NtfyPeer, SmtpPeer
from tests.peers.ports import free_port
from upsguard import selftest
from upsguard.config.policies import PoliciesConfig
from upsguard.config.service import NotifySettings
from upsguard.controller.alerts import Alert, AlertKind, RateLimit
from upsguard.controller.notify import Notifier
from upsguard.decisions import Outlook
from upsguard.events import (
    BatteryTestFinished,
    CacheModeChanged,
    ContactBack,
    ContactLost,
    Event,
    OnBattery,
    PowerRestored,
    ReadingTaken,
    RedundancyBack,
    RedundancyLost,
    RiskAccepted,
    RunFinished,
    RunStarted,
    UpsFlagChanged,
)
from upsguard.models import CacheMode, RunId, UpsFlag, UpsName, UpsReading
from upsguard.runs import RunKind, RunOrigin, RunOutcome, RunSpec

AT = datetime(2026, 3, 1, 2, 0, tzinfo=UTC)
UPS = UpsName("ups1")
POLICIES = PoliciesConfig.model_validate(
    {
        "on_battery": {"after": "10s"},
        "shutdown": {"when_any": ["low_battery", "runtime < plan + 5m"]},
        "startup": {"online_for": "10m", "charge_above": 50},
    },
)
SHUTDOWN = RunSpec(RunId("r1"), RunKind.SHUTDOWN, RunOrigin.POLICY, "runtime < plan + 5m", AT)


@dataclass
class FakeClock:
    """The notifier's clock: monotonic seconds a test moves on by hand."""

    t: float = 0.0

    def now(self) -> datetime:
        return AT + timedelta(seconds=self.t)

    def monotonic(self) -> float:
        return self.t


def url_file(tmp_path: Path, name: str, url: str) -> str:
    path = tmp_path / f"{name}.url"
    path.write_text(url + "\n")
    path.chmod(0o600)
    return str(path)


def notifier(
    tmp_path: Path, channels: dict[str, str], clock: FakeClock | None = None, **more: Any
) -> Notifier:
    """A notifier with one Apprise channel per ``name: url`` (each URL in its own file)."""
    apprise = [{"name": n, "url_file": url_file(tmp_path, n, u)} for n, u in channels.items()]
    settings = NotifySettings.model_validate({"apprise": apprise, **more})
    return Notifier(settings, "hq", clock=clock or FakeClock(), policies=POLICIES)


def tell(n: Notifier, *events: Event) -> None:
    """Each event observed, then every send awaited (as the service's drain does)."""

    async def go() -> None:
        for event in events:
            n.observe(event)
        await n.drain(timeout=60)

    asyncio.run(go())


# What each alert of the set says: (event, words of the subject, words of the body).
ALERTS: list[tuple[Event, list[str], list[str]]] = [
    (
        OnBattery(
            AT,
            "ups1",
            "ups1 on-battery",
            Outlook(
                1380.0,
                condition="runtime < plan + 5m",
                metric="runtime",
                limit=720.0,
                fires_in_s=660.0,
            ),
        ),
        ["feed ups1 on battery"],
        [
            "23 min left",
            "The shutdown starts at 12 min left (in about 11 min), unless the mains return",
            "write-through after 10s on battery",
        ],
    ),
    (
        OnBattery(AT, "ups2", "ups2 on-battery", Outlook(None)),
        ["feed ups2 on battery"],
        ["runtime left unknown", "When the shutdown starts is unknown"],
    ),
    (
        PowerRestored(AT, "ups1", 300.0),
        ["feed ups1 on mains again"],
        ["after 5 min on battery", "the startup runbook starts once the mains have stayed 10m"],
    ),
    (
        UpsFlagChanged(
            AT,
            UPS,
            UpsFlag.LB,
            True,
            Outlook(80.0, due_now=True, condition="low_battery", fires_in_s=0.0),
        ),
        ["UPS ups1 low battery"],
        ["reports low battery (LB)", "The shutdown starts now (low_battery)"],
    ),
    (
        UpsFlagChanged(AT, UPS, UpsFlag.RB, True),
        ["UPS ups1: battery needs replacing"],
        ["(RB)", "replace the battery"],
    ),
    (
        BatteryTestFinished(AT, UPS, "quick", AT, selftest.TestState.FAILED, "Replace battery"),
        ["UPS ups1: battery needs replacing"],
        ["failed its quick battery test (Replace battery)", "replace the battery"],
    ),
    (
        UpsFlagChanged(AT, UPS, UpsFlag.OVER, True),
        ["UPS ups1: overload"],
        ["reports overload (OVER)", "lower the load"],
    ),
    (
        UpsFlagChanged(AT, UPS, UpsFlag.BYPASS, True),
        ["UPS ups1: bypass"],
        ["reports bypass (BYPASS)", "a mains failure now cuts it at once"],
    ),
    (
        UpsFlagChanged(AT, UPS, UpsFlag.OVER, False),
        ["UPS ups1: overload cleared"],
        ["no longer reports overload", "Nothing to do"],
    ),
    (
        ContactLost(AT, UPS, "127.0.0.1:3493: connection refused"),
        ["UPS ups1 cannot be read"],
        ["connection refused", "it counts as on mains, as last read", "asked again every"],
    ),
    (
        ContactLost(AT, UPS, "upsd timed out", was_on_battery=True),
        ["UPS ups1 cannot be read"],
        ["its countdown goes on from its last known runtime"],
    ),
    (
        ContactLost(AT, UPS, "its data is stale", stale=True),
        ["UPS ups1 data stale"],
        ["driver stopped updating"],
    ),
    (ContactBack(AT, UPS), ["UPS ups1 answers again"], ["Its readings count again"]),
    (
        RedundancyLost(AT, "dual", (("ups-a", "on-battery"), ("ups-b", "online")), 1, 1),
        ["feed dual lost its redundancy"],
        ["ups-a on-battery, ups-b online", "1 of 2 UPSes on mains", "if 1 more UPS go off mains"],
    ),
    (
        RedundancyBack(AT, "dual", (("ups-a", "online"), ("ups-b", "online"))),
        ["feed dual redundant again"],
        ["ups-a online, ups-b online"],
    ),
    (
        RunStarted(AT, SHUTDOWN, 12),
        ["shutdown runbook started"],
        ["12 steps", "runtime < plan + 5m", "upsguard abort stops it"],
    ),
    (
        RunFinished(AT, SHUTDOWN, RunOutcome.DONE),
        ["shutdown runbook done"],
        ["The site stays down until the mains return", "the startup runbook starts"],
    ),
    (
        RunFinished(AT, SHUTDOWN, RunOutcome.FAILED, "1 step failed: stop esx01"),
        ["shutdown runbook FAILED"],
        ["1 step failed: stop esx01", "upsguard history shows run r1"],
    ),
    (
        CacheModeChanged(AT, "flash", "esx01", CacheMode.WRITE_BACK, False, "fvp: refused"),
        ["cache flash/esx01 left in write-through"],
        ["did not go back to write-back after the outage: fvp: refused", "asks again every 30 s"],
    ),
    (
        RiskAccepted(AT, "flash", 2 * 1024**3, "the critical floor"),
        ["RISK: cache flash still dirty"],
        ["still dirty", "may be lost"],
    ),
]


@pytest.mark.parametrize(
    ("event", "subject", "body"), ALERTS, ids=[f"{i}-{a[0].kind}" for i, a in enumerate(ALERTS)]
)
def test_each_alert_reaches_mail_and_ntfy_saying_what_happened_and_what_comes_next(
    tmp_path: Path,
    smtp_peer: SmtpPeer,
    ntfy_peer: NtfyPeer,
    event: Event,
    subject: list[str],
    body: list[str],
) -> None:
    smtp_peer.received.clear()
    smtp_peer.logins.clear()
    ntfy_peer.received.clear()
    n = notifier(tmp_path, {"mail": smtp_peer.url(), "phone": ntfy_peer.url()})
    tell(n, event)
    assert smtp_peer.logins == [True]
    (mail,) = smtp_peer.received
    (post,) = ntfy_peer.received
    text = " ".join(SmtpPeer.text(mail).split())
    for words in subject:
        assert words in str(mail["Subject"]) and words in post["title"]
    for words in body:
        assert words in text and words in " ".join(post["message"].split())
    assert str(mail["Subject"]).startswith("upsguard hq: ")
    assert "Next: " in text and "site hq" in text
    assert post["topic"] == "ups-alerts"


def test_events_that_are_no_alert_send_nothing(tmp_path: Path, ntfy_peer: NtfyPeer) -> None:
    ntfy_peer.received.clear()
    n = notifier(tmp_path, {"phone": ntfy_peer.url()})
    reading = UpsReading(UPS, AT)
    tell(n, ReadingTaken(AT, reading), UpsFlagChanged(AT, UPS, UpsFlag.CHRG, True))
    assert ntfy_peer.received == []


def test_a_channel_gets_only_alerts_as_loud_as_its_min_level(
    tmp_path: Path, ntfy_peer: NtfyPeer
) -> None:
    ntfy_peer.received.clear()
    path = url_file(tmp_path, "pager", ntfy_peer.url("pager"))
    settings = NotifySettings.model_validate(
        {"apprise": [{"name": "pager", "url_file": path, "min_level": "error"}]}
    )
    n = Notifier(settings, "hq", clock=FakeClock(), policies=POLICIES)
    tell(n, ContactBack(AT, UPS), UpsFlagChanged(AT, UPS, UpsFlag.RB, True), ALERTS[3][0])
    assert [p["title"] for p in ntfy_peer.received] == ["upsguard hq: UPS ups1 low battery"]


def test_a_flapping_ups_sends_one_pair_then_counts_what_was_held_back(
    tmp_path: Path, ntfy_peer: NtfyPeer
) -> None:
    """On and off battery every 30 s for 10 minutes: one pair; at the 10th minute the next on
    battery goes out, saying how many were held back."""
    ntfy_peer.received.clear()
    clock = FakeClock()
    n = notifier(tmp_path, {"phone": ntfy_peer.url()}, clock, alert_every="10m")
    for _ in range(10):  # 0 s to 570 s: off at :00, back at :30
        tell(n, OnBattery(clock.now(), "ups1", "ups1 on-battery"))
        clock.t += 30
        tell(n, PowerRestored(clock.now(), "ups1", 30.0))
        clock.t += 30
    assert [p["title"] for p in ntfy_peer.received] == [
        "upsguard hq: feed ups1 on battery",
        "upsguard hq: feed ups1 on mains again",
    ]
    tell(n, OnBattery(clock.now(), "ups1", "ups1 on-battery"))  # at 600 s: the window is over
    latest = ntfy_peer.received[-1]
    assert latest["title"] == "upsguard hq: feed ups1 on battery"
    assert "(9 more such alerts held back before this one)" in latest["message"]
    # another UPS is counted on its own
    tell(n, OnBattery(clock.now(), "ups2", "ups2 on-battery"))
    assert ntfy_peer.received[-1]["title"] == "upsguard hq: feed ups2 on battery"


def test_a_state_held_back_that_contradicts_the_last_alert_goes_out_when_its_time_comes() -> None:
    """Sent: on battery, then on mains. Held back: on battery again, and it stays so. A person
    who last read "on mains" hears "on battery" once the window is over, at the next event."""
    limit = RateLimit(600)
    on = Alert(AlertKind.ON_BATTERY, "ups1", "warning", "on battery", "w", "n", AT, "hq")
    off = Alert(AlertKind.ON_MAINS, "ups1", "info", "on mains", "w", "n", AT, "hq")
    assert limit.admit(on, 0) == on and limit.admit(off, 10) == off
    assert limit.admit(on, 20) is None and limit.admit(off, 30) is None
    assert limit.admit(on, 40) is None
    assert limit.due(599) == []  # not yet
    assert limit.due(600) == [replace(on, held_back=1)]
    assert limit.due(700) == []  # told: nothing more to say
    # back on mains, then nothing held back contradicts what was last sent: nothing due
    assert limit.admit(off, 1300) is not None and limit.due(2000) == []


def test_a_failing_channel_logs_one_line_without_its_secret_and_the_others_go_on(
    tmp_path: Path, ntfy_peer: NtfyPeer, caplog: pytest.LogCaptureFixture
) -> None:
    ntfy_peer.received.clear()
    closed = SmtpPeer().url(port=free_port())  # nothing listens there
    n = notifier(tmp_path, {"mail": closed, "phone": ntfy_peer.url()})
    with caplog.at_level(logging.DEBUG):
        tell(n, ContactLost(AT, UPS, "refused"), ContactBack(AT, UPS), ALERTS[4][0])
    assert len(ntfy_peer.received) == 3 and ntfy_peer.auth[-1] == f"Bearer {TOKEN}"
    ours = [r for r in caplog.records if r.name.startswith("upsguard")]
    assert [r.getMessage() for r in ours if r.levelno >= logging.WARNING] == [
        "apprise channel mail: not delivered to mailto://… (Apprise's own log line says why) "
        "(said once until it delivers again)"
    ]
    everything = "\n".join(r.getMessage() for r in caplog.records)
    assert PASSWORD not in everything and TOKEN not in everything
    (mail, phone) = n.channels.channels
    assert (mail.failed, mail.sent, phone.sent) == (3, 0, 3)


def test_doctor_checks_each_channel_url_and_names_the_channel_never_the_url(
    tmp_path: Path, smtp_peer: SmtpPeer
) -> None:
    good = url_file(tmp_path, "mail", smtp_peer.url())
    bad = url_file(tmp_path, "chat", f"nosuchservice://{PASSWORD}@example.org/room")
    settings = NotifySettings.model_validate(
        {
            "apprise": [
                {"name": "mail", "url_file": good},
                {"name": "chat", "url_file": bad},
                {"name": "gone", "url_file": str(tmp_path / "missing.url")},
            ]
        }
    )
    found = asyncio.run(Notifier(settings, "hq").check())
    said = [(f.subject, f.check, f.verdict.value, f.detail) for f in found]
    assert said[0] == ("mail", "url", "ok", "read and understood (mailto://…)")
    assert said[1][:3] == ("chat", "url", "fail") and "nosuchservice://…" in said[1][3]
    assert said[2][:3] == ("gone", "url", "fail") and "missing.url" in said[2][3]
    assert all(PASSWORD not in f.detail + f.fix for f in found)
