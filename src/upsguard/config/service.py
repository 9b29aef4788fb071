"""The ``service:`` section: how ``upsguard run`` talks to people and to other programs."""

from __future__ import annotations

from datetime import timedelta
from typing import Literal

from pydantic import Field, model_validator

from upsguard.config.api_socket import DEFAULT_SOCKET
from upsguard.config.base import Model
from upsguard.config.types import Duration, LocalPath, LongDuration, PassEnv, WebhookUrl

NotifyOn = Literal["phase", "step_failed", "run", "risk", "override", "alert"]
AlertLevel = Literal["info", "warning", "error"]
"""How loud an alert is; a channel's ``min_level`` keeps the quieter ones away."""

ALERT_EVERY = timedelta(minutes=10)
"""The default ``notify.alert_every``: each kind of alert, per UPS or feed, at most once this
often (a UPS flapping on and off battery sends one pair, then a count with the next)."""


class WebhookSettings(Model):
    """POST a JSON body to this URL for each notification.

    A redirect is not followed (the token would go along to wherever it points); the URL is
    logged as its origin alone, since a chat webhook's path is a secret.
    """

    url: WebhookUrl
    timeout: Duration = timedelta(seconds=10)
    verify_tls: bool = True
    ca_file: LocalPath | None = Field(
        None, description="CA bundle that signs the webhook server's certificate"
    )
    bearer_token_file: LocalPath | None = Field(
        None, description="sent as 'Authorization: Bearer ...'; the token is never logged"
    )


class AppriseChannel(Model):
    """One Apprise channel (email, ntfy, Telegram, Matrix, Slack...: one URL each) that
    gets the alerts people read.

    The URL holds the channel's token or password, so it is never written in the site file:
    it is read from ``url_file`` (or the variable ``url_env``) at send time, and logged as
    its scheme alone (``mailtos://…``).
    """

    name: str | None = Field(
        None, min_length=1, max_length=60, description="what logs and doctor call it"
    )
    url_file: LocalPath | None = Field(None, description="a file holding the Apprise URL")
    url_env: str | None = Field(None, description="an environment variable holding the Apprise URL")
    min_level: AlertLevel = Field(
        "info", description="send alerts this loud and louder (info, warning, error)"
    )
    timeout: Duration = Field(
        timedelta(seconds=30), description="the longest one send may take; then it failed"
    )

    @model_validator(mode="before")
    @classmethod
    def _no_inline_url(cls, data: object) -> object:
        if isinstance(data, dict) and "url" in data:
            raise ValueError(
                "inline 'url' is not accepted (an Apprise URL holds the channel's token or "
                "password): put it in a file (url_file) or an environment variable (url_env)"
            )
        return data

    @model_validator(mode="after")
    def _one_place_for_the_url(self) -> AppriseChannel:
        if (self.url_file is None) == (self.url_env is None):
            raise ValueError("give one of url_file, url_env (the URL holds a secret)")
        return self


class NotifySettings(Model):
    """Who hears about phase changes and failed steps."""

    command: list[str] | None = Field(
        None,
        description="argv of a hook; the event comes as JSON on stdin and UPSGUARD_* variables",
    )
    command_timeout: Duration = timedelta(seconds=30)
    pass_env: PassEnv = Field(default_factory=list)
    webhook: WebhookSettings | None = None
    on: list[NotifyOn] = Field(
        default_factory=lambda: list[NotifyOn](
            ["phase", "step_failed", "risk", "override", "alert"]
        ),
        description="which events the command and the webhook get",
    )
    apprise: list[AppriseChannel] = Field(
        default_factory=list,
        description="channels that get the alerts people read (docs/operations.md)",
    )
    alert_every: Duration = Field(
        ALERT_EVERY,
        description="each kind of alert, per UPS or feed, at most once this often; the next "
        "one counts those held back",
    )

    @model_validator(mode="after")
    def _channel_names_unique(self) -> NotifySettings:
        names = [c.name for c in self.apprise if c.name is not None]
        twice = sorted({n for n in names if names.count(n) > 1})
        if twice:
            raise ValueError(f"apprise: channel name {twice[0]} is given twice")
        return self

    def channel_names(self) -> list[str]:
        """Each Apprise channel's name: its own, or ``apprise N`` (1-based) without one."""
        return [c.name or f"apprise {i}" for i, c in enumerate(self.apprise, 1)]


class ServiceConfig(Model):
    socket: LocalPath = Field(DEFAULT_SOCKET, description="the local API (HTTP + JSON)")
    socket_group: str | None = Field(
        None,
        description="group that may use the API (socket mode 0660) and read the journal (0640)",
    )
    metrics_port: int | None = Field(
        None, ge=1, le=65535, description="Prometheus metrics on this TCP port; none = off"
    )
    metrics_address: str = "127.0.0.1"
    readings_every: Duration = Field(
        timedelta(minutes=1),
        description="while normal, journal one reading per UPS this often (all while on battery)",
    )
    keep_readings: LongDuration = Field(
        timedelta(days=90), description="older readings are pruned from the journal"
    )
    notify: NotifySettings = NotifySettings()
