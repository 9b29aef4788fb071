"""What every route of the page shares: the service it shows, the ``web:`` settings, the
session keeper and the login guards, and who is asking."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from upsguard.config.site import SiteConfig
from upsguard.config.web import WebConfig
from upsguard.controller.journal import Journal
from upsguard.controller.metrics import Metrics
from upsguard.controller.overrides import Overrides
from upsguard.controller.web.auth import LoginThrottle, PasswordCheck, Sessions, User
from upsguard.engine.outage_controller import OutageController
from upsguard.status import SiteStatus


class WebServed(Protocol):
    """What the page needs of the running service (``controller.service.Service``); named
    here so that the service may import the page and not the other way round."""

    @property
    def site(self) -> SiteConfig: ...
    @property
    def journal(self) -> Journal: ...
    @property
    def changed(self) -> asyncio.Event: ...  # set at the next event, then replaced
    @property
    def overrides(self) -> Overrides: ...
    @property
    def controller(self) -> OutageController: ...
    @property
    def metrics(self) -> Metrics: ...
    def status(self) -> SiteStatus: ...


@dataclass(frozen=True)
class WebContext:
    svc: WebServed
    config: WebConfig
    sessions: Sessions
    passwords: PasswordCheck
    throttle: LoginThrottle


_USER = "upsguard.user"


def set_user(request: web.Request, user: User) -> None:
    request[_USER] = user


def current_user(request: web.Request) -> User:
    """Who asks; set by the guard before any route that is not public runs."""
    user: User = request[_USER]
    return user
