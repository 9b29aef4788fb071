"""Notifications: a command hook and a webhook hear phase changes, failed steps and risks;
Apprise channels get the alerts people read (``controller.alert_text``), each kind at most
once per ``notify.alert_every`` per UPS, feed, cache or run (``controller.alerts``).

All of them run in the background: a slow webhook never delays a shutdown step, and
a failing one is logged, never raised. The hook gets the event as JSON on
stdin and as ``UPSGUARD_*`` environment variables, in an environment of its own
(``secrecy.child_env``: none of the service's secrets). No secret is ever logged:
the webhook's bearer token is read from its file at send time, its URL is logged
as its origin alone (a chat webhook's path is its token), and a redirect is not
followed (it would take the token to another host).
"""

from __future__ import annotations

import asyncio
import json
import logging
from datetime import UTC, datetime
from typing import Any

from upsguard.clock import Clock, SystemClock
from upsguard.config.policies import PoliciesConfig
from upsguard.config.service import NotifySettings, WebhookSettings
from upsguard.config.types import resolve_secret
from upsguard.controller.alert_text import AlertWriter
from upsguard.controller.alerts import Alert, RateLimit
from upsguard.controller.apprise_channels import AppriseChannels
from upsguard.errors import UpsguardError
from upsguard.events import (
    BatteryTestFinished,
    CheckupDone,
    Event,
    LeadershipChanged,
    OnBattery,
    OverrideApplied,
    PhaseChanged,
    PowerRestored,
    RiskAccepted,
    RunFinished,
    RunStarted,
    StepFinished,
    describe,
    level,
)
from upsguard.findings import Area, Finding, fail, ok, warn
from upsguard.journal.rows import iso
from upsguard.models import StepState
from upsguard.net import http_request, tls_context
from upsguard.secrecy import child_env, redact_url

log = logging.getLogger(__name__)


def topic(event: Event) -> str | None:
    """Which ``notify.on`` entry an event belongs to, if any."""
    if isinstance(event, PhaseChanged | OnBattery | PowerRestored):
        return "phase"
    if isinstance(event, StepFinished) and event.state is StepState.FAILED:
        return "step_failed"
    if isinstance(event, RunStarted | RunFinished):
        return "run"
    if isinstance(event, RiskAccepted):
        return "risk"
    if isinstance(event, OverrideApplied):
        return "override"
    if level(event) != "info":  # a UPS out of reach, a cache that did not flip, the journal
        return "alert"
    return None


def payload(event: Event, site: str) -> dict[str, Any]:
    body: dict[str, Any] = {
        "site": site,
        "event": event.kind,
        "at": iso(event.at),
        "text": (describe(event) or event.kind).strip(),
    }
    if isinstance(event, PhaseChanged):
        body.update(old=event.old.value, new=event.new.value, reason=event.reason)
    elif isinstance(event, StepFinished):
        body.update(run=event.run, step=event.step, state=event.state.value, detail=event.detail)
    elif isinstance(event, RunStarted | RunFinished):
        body.update(run=event.run, direction=event.direction)
    elif isinstance(event, CheckupDone):
        body.update(
            broke=[_finding(f) for f in event.broke], mended=[_finding(f) for f in event.mended]
        )
    elif isinstance(event, LeadershipChanged):
        body.update(
            me=event.me,
            role=event.role,
            leader=event.leader,
            token=event.token,
            detail=event.detail,
        )
    elif isinstance(event, BatteryTestFinished):
        body.update(ups=event.ups, test=event.test, state=event.state.value, result=event.text)
    return body


def _finding(finding: Finding) -> dict[str, str]:
    return {
        "area": finding.area.value,
        "subject": finding.subject,
        "check": finding.check,
        "verdict": finding.verdict.value,
        "detail": finding.detail,
        "fix": finding.fix,
    }


class Notifier:
    def __init__(
        self,
        settings: NotifySettings,
        site: str,
        *,
        clock: Clock | None = None,
        policies: PoliciesConfig | None = None,
    ) -> None:
        """``clock``: what the alerts' rate limit counts on (the service's); ``policies``:
        the site's, for the alerts to say what upsguard does next."""
        self._s = settings
        self._site = site
        self._clock: Clock = clock or SystemClock()
        self._tasks: set[asyncio.Task[None]] = set()
        self.sent = 0
        self.failed = 0
        self.channels = AppriseChannels(settings.apprise, settings.channel_names())
        self._writer = AlertWriter(site, policies)
        self.limit = RateLimit(settings.alert_every.total_seconds())

    def use(self, settings: NotifySettings, policies: PoliciesConfig | None) -> None:
        """A reloaded site file's settings, from the next event on. What the rate limit
        remembers stays (a reload is no reason to tell a flapping UPS again); sends in
        flight finish with the settings they began with."""
        self._s = settings
        self.channels = AppriseChannels(settings.apprise, settings.channel_names())
        self._writer = AlertWriter(self._site, policies)
        self.limit.every_s = settings.alert_every.total_seconds()

    @property
    def enabled(self) -> bool:
        return bool(self._s.command) or self._s.webhook is not None

    def observe(self, event: Event) -> None:
        if self.channels:
            self._alert(event)
        kind = topic(event)
        if not self.enabled or kind is None or kind not in self._s.on:
            return
        body = payload(event, self._site)
        if self._s.command:
            self._spawn(self._command(self._s.command, body))
        if self._s.webhook is not None:
            self._spawn(self._webhook(self._s.webhook, body))

    def _alert(self, event: Event) -> None:
        """The event's alert, unless its kind was sent about the same subject lately; and
        any alert held back whose time has come (see ``controller.alerts``)."""
        try:
            now = self._clock.monotonic()
        except RuntimeError:  # no loop (a direct CLI act outside asyncio): nothing to send on
            return
        alert = self._writer.alert(event)
        due = self.limit.due(now)
        if alert is not None:
            admitted = self.limit.admit(alert, now)
            due += [admitted] if admitted is not None else []
        for each in due:
            self._spawn(self._send_alert(each))

    async def _send_alert(self, alert: Alert) -> None:
        await self.channels.send(alert)

    def _spawn(self, coro: Any) -> None:
        try:
            task = asyncio.get_running_loop().create_task(coro)
        except RuntimeError:  # no loop (a direct CLI act outside asyncio): nothing to send on
            coro.close()
            return
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _command(self, argv: list[str], body: dict[str, Any]) -> None:
        self._count(await self._send_command(argv, body))

    async def _webhook(self, hook: WebhookSettings, body: dict[str, Any]) -> None:
        self._count(await self._send_webhook(hook, body))

    def _count(self, failed: str | None) -> None:
        if failed is None:
            self.sent += 1
        else:
            self._failed(failed)

    async def _send_command(self, argv: list[str], body: dict[str, Any]) -> str | None:
        """Run the hook with ``body``; None when it exited 0, else what went wrong."""
        env = child_env(
            self._s.pass_env,
            {
                "UPSGUARD_SITE": self._site,
                "UPSGUARD_EVENT": str(body["event"]),
                "UPSGUARD_MESSAGE": str(body["text"]),
                "UPSGUARD_PHASE": str(body.get("new", "")),
            },
        )
        timeout = self._s.command_timeout.total_seconds()
        try:
            proc = await asyncio.create_subprocess_exec(
                *argv,
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.DEVNULL,
                stderr=asyncio.subprocess.PIPE,
                env=env,
                start_new_session=True,
            )
        except OSError as exc:
            return f"notify command {argv[0]}: {exc}"
        try:
            async with asyncio.timeout(timeout):
                _, err = await proc.communicate(json.dumps(body).encode() + b"\n")
        except TimeoutError:
            proc.kill()
            await proc.wait()
            return f"notify command {argv[0]}: no exit within {timeout:.0f} s; killed"
        if proc.returncode != 0:
            tail = err.decode(errors="replace").strip()[-200:]
            return f"notify command {argv[0]}: exit {proc.returncode}: {tail}"
        return None

    async def _send_webhook(self, hook: WebhookSettings, body: dict[str, Any]) -> str | None:
        """POST ``body``; None when the webhook took it, else why not (its origin alone)."""
        try:
            why = await asyncio.to_thread(_post, hook, body)
        except UpsguardError as exc:  # the token file cannot be read, the ca_file is bad
            why = str(exc)
        except Exception as exc:  # a dead webhook must not disturb the run
            why = f"not sent ({type(exc).__name__})"
        if why is None:
            return None
        return f"webhook {redact_url(hook.url, origin_only=True)}: {why}"

    async def test(self) -> list[Finding]:
        """Send one test message through the hook, the webhook and each Apprise channel, and
        wait for each answer (``upsguard doctor --notify``): what an outage would send, proven
        now."""
        body = {
            "site": self._site,
            "event": "Test",
            "at": iso(datetime.now(UTC)),
            "text": f"upsguard doctor: a test notification from site {self._site}",
        }
        found: list[Finding] = []
        if self._s.command:
            why = await self._send_command(self._s.command, body)
            found.append(_sent("command", why, "run the hook by hand with the JSON on stdin"))
        if self._s.webhook is not None:
            hook = self._s.webhook
            why = await self._send_webhook(hook, body)
            fix = "check the URL, the token file and the server (a 3xx: give the final URL)"
            found.append(_sent(f"webhook {redact_url(hook.url, origin_only=True)}", why, fix))
        if self.channels:
            found += await self.channels.test(self._site)
        if not found:
            found.append(
                warn(
                    Area.NOTIFY,
                    "notify",
                    "send",
                    "no hook, no webhook and no Apprise channel: nobody hears of an outage "
                    "from upsguard",
                    "set service.notify.apprise (docs/operations.md), command or webhook",
                )
            )
        return found

    async def check(self) -> list[Finding]:
        """Each Apprise channel's URL read and understood; nothing sent (``doctor``)."""
        return await asyncio.to_thread(self.channels.check)

    def _failed(self, message: str) -> None:
        self.failed += 1
        log.warning(message)

    async def drain(self, timeout: float = 10.0) -> None:
        """Give notifications in flight a moment to go out before the process ends."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)


def _sent(channel: str, why: str | None, fix: str) -> Finding:
    if why is None:
        return ok(Area.NOTIFY, channel, "send", "a test message was taken")
    return fail(Area.NOTIFY, channel, "send", why, fix)


def _post(hook: WebhookSettings, body: dict[str, Any]) -> str | None:
    """POST ``body``; None when the webhook took it, else why not (``http_request``)."""
    headers = {"Content-Type": "application/json", "User-Agent": "upsguard"}
    token = resolve_secret("webhook bearer_token_file", hook.bearer_token_file, None)
    if token is not None:
        headers["Authorization"] = f"Bearer {token}"
    return http_request(
        hook.url,
        method="POST",
        body=json.dumps(body).encode(),
        headers=headers,
        timeout=hook.timeout.total_seconds(),
        tls=tls_context(hook.verify_tls, hook.ca_file),
    )
