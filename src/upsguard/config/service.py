"""The ``service:`` section: how ``upsguard run`` talks to people and to other programs."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Literal

from pydantic import Field

from upsguard.config.base import Model
from upsguard.config.types import Duration, LocalPath, LongDuration, PassEnv, WebhookUrl

NotifyOn = Literal["phase", "step_failed", "run", "risk", "override", "alert"]


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
        description="which events are sent",
    )


class ServiceConfig(Model):
    socket: LocalPath = Field(
        Path("/run/upsguard/upsguard.sock"), description="the local API (HTTP + JSON)"
    )
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
