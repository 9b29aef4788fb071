"""Apprise channels: the alerts people read, by email, ntfy, Telegram, Matrix, Slack...

The only module that imports Apprise. Apprise is synchronous, so each send runs in a worker
thread, bounded by the channel's ``timeout``: a slow mail server never delays a step nor the
power watch (the thread of a send past its time is left to end on its own; the send counts as
failed). Each channel is sent to on its own: one that fails never holds up the others.

The URL holds the channel's token or password. It is read from its file (or variable) at
send time, so that a changed file is used at the next alert, and it is never logged, nor
shown by doctor: a channel is named by its ``name`` and at most its URL's scheme
(``mailtos://…``). A failing channel is logged once per failing streak, and once when it
delivers again. Apprise's own log lines below INFO carry the URL and its request headers
(a bearer token): while channels are set, its logger (``apprise``) is kept at INFO or above,
whatever the service's level; its warnings (why a send failed) name no secret.
"""

from __future__ import annotations

import asyncio
import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass

import apprise

from upsguard.config.service import AlertLevel, AppriseChannel
from upsguard.config.types import resolve_secret
from upsguard.controller.alerts import Alert
from upsguard.errors import ConfigError, UpsguardError
from upsguard.findings import Area, Finding, fail, ok

log = logging.getLogger(__name__)

_RANK: dict[AlertLevel, int] = {"info": 0, "warning": 1, "error": 2}
_TYPES: dict[AlertLevel, apprise.NotifyType] = {
    "info": apprise.NotifyType.INFO,
    "warning": apprise.NotifyType.WARNING,
    "error": apprise.NotifyType.FAILURE,
}
_SCHEME = re.compile(r"^([a-z][a-z0-9+.-]{0,30})://", re.IGNORECASE)


@dataclass
class Channel:
    """One channel and how its sends went."""

    name: str
    settings: AppriseChannel
    failing: bool = False
    sent: int = 0
    failed: int = 0

    def takes(self, level: AlertLevel) -> bool:
        return _RANK[level] >= _RANK[self.settings.min_level]


class AppriseChannels:
    def __init__(self, settings: Sequence[AppriseChannel], names: Sequence[str]) -> None:
        """``names``: each channel's name (``NotifySettings.channel_names``)."""
        self.channels = [Channel(n, s) for n, s in zip(names, settings, strict=True)]
        if self.channels:
            _quiet_apprise()

    def __bool__(self) -> bool:
        return bool(self.channels)

    async def send(self, alert: Alert) -> None:
        """To every channel that takes an alert this loud, at once; each failure is logged
        (once per failing streak), never raised."""
        kind = apprise.NotifyType.SUCCESS if alert.good_news else _TYPES[alert.level]
        sends = [
            self._send(c, alert.title, alert.body, kind)
            for c in self.channels
            if c.takes(alert.level)
        ]
        await asyncio.gather(*sends)

    async def _send(
        self, channel: Channel, title: str, body: str, kind: apprise.NotifyType
    ) -> None:
        why = await deliver(channel.settings, title, body, kind)
        if why is None:
            channel.sent += 1
            if channel.failing:
                log.warning("apprise channel %s delivers again", channel.name)
            channel.failing = False
            return
        channel.failed += 1
        if not channel.failing:
            log.warning(
                "apprise channel %s: %s (said once until it delivers again)", channel.name, why
            )
        channel.failing = True

    def check(self) -> list[Finding]:
        """Each channel's URL read and understood by Apprise; nothing is sent (doctor)."""
        return [_understood(c) for c in self.channels]

    async def test(self, site: str) -> list[Finding]:
        """One test message through each channel, each answer awaited (``doctor --notify``)."""
        title = f"upsguard {site}: test"
        body = f"upsguard doctor: a test notification from site {site}"
        answers = await asyncio.gather(
            *(deliver(c.settings, title, body, apprise.NotifyType.INFO) for c in self.channels)
        )
        return [_tested(c, why) for c, why in zip(self.channels, answers, strict=True)]


async def deliver(
    channel: AppriseChannel, title: str, body: str, kind: apprise.NotifyType
) -> str | None:
    """Send one message through the channel, in a worker thread, within its timeout; None
    when Apprise says it was delivered, else why not (never the URL)."""
    timeout = channel.timeout.total_seconds()
    try:
        url = _url(channel)
        async with asyncio.timeout(timeout):
            return await asyncio.to_thread(_notify, url, title, body, kind)
    except UpsguardError as exc:  # the URL's file or variable cannot be read
        return str(exc)
    except TimeoutError:
        return f"no answer within {timeout:.0f} s"
    except Exception as exc:  # a broken channel must not disturb the run
        return f"not sent ({type(exc).__name__})"


def _url(channel: AppriseChannel) -> str:
    url = resolve_secret("apprise url_file", channel.url_file, channel.url_env)
    if not url:
        where = channel.url_file if channel.url_file is not None else f"${channel.url_env}"
        raise ConfigError(f"apprise URL: {where} is empty")
    return url


def _notify(url: str, title: str, body: str, kind: apprise.NotifyType) -> str | None:
    """In a worker thread: one Apprise object for this one URL, sent through."""
    sender = _apprise()
    if not sender.add(url):
        return f"Apprise does not understand the URL ({scheme_of(url)})"
    if sender.notify(body=body, title=title, notify_type=kind):
        return None
    return f"not delivered to {scheme_of(url)} (Apprise's own log line says why)"


def _quiet_apprise() -> None:
    """Apprise's TRACE and DEBUG lines hold URLs and tokens: never let them through."""
    chatty = logging.getLogger("apprise")
    if chatty.level < logging.INFO:
        chatty.setLevel(logging.INFO)


def _apprise() -> apprise.Apprise:
    asset = apprise.AppriseAsset(app_id="upsguard", app_desc="upsguard alerts")
    return apprise.Apprise(asset=asset)


def scheme_of(url: str) -> str:
    """``mailtos://…``: all of a URL that may be shown (its scheme)."""
    found = _SCHEME.match(url.strip())
    return f"{found.group(1).lower()}://…" if found else "a URL without a scheme"


def _understood(channel: Channel) -> Finding:
    try:
        url = _url(channel.settings)
    except UpsguardError as exc:
        fix = "create the file (readable by upsguard's user) with the channel's Apprise URL"
        return fail(Area.NOTIFY, channel.name, "url", str(exc), fix)
    if not _apprise().add(url):
        why = f"Apprise does not understand the URL ({scheme_of(url)})"
        fix = "check the URL against Apprise's documentation of that service"
        return fail(Area.NOTIFY, channel.name, "url", why, fix)
    return ok(Area.NOTIFY, channel.name, "url", f"read and understood ({scheme_of(url)})")


def _tested(channel: Channel, why: str | None) -> Finding:
    if why is None:
        return ok(Area.NOTIFY, channel.name, "send", "a test message was delivered")
    fix = "check the URL's file, the service it names and the network from here"
    return fail(Area.NOTIFY, channel.name, "send", why, fix)
