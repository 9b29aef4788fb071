"""What every route of the page shares: the service it shows, the ``web:`` settings, the
session keeper and the login guards, and who is asking."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Protocol

from aiohttp import web

from upsguard.config.site import SiteConfig
from upsguard.config.web import WebConfig
from upsguard.controller.api import Served
from upsguard.controller.metrics import Metrics
from upsguard.controller.web.auth import LoginThrottle, PasswordCheck, Proxy, Sessions, User


class WebServed(Served, Protocol):
    """What the page needs of the running service (``controller.service.Service``): what
    the local API needs, and the site file and the metrics; named here so that the service
    may import the page and not the other way round."""

    @property
    def site(self) -> SiteConfig: ...
    @property
    def metrics(self) -> Metrics: ...
    @property
    def changed(self) -> asyncio.Event:
        """Set at the service's next event (a reading, a step): the status may differ."""
        ...


@dataclass(frozen=True)
class WebContext:
    svc: WebServed
    config: WebConfig
    sessions: Sessions
    passwords: PasswordCheck
    throttle: LoginThrottle
    proxy: Proxy


_USER = web.RequestKey("upsguard.user", User)


def set_user(request: web.Request, user: User) -> None:
    request[_USER] = user


def current_user(request: web.Request) -> User:
    """Who asks; set by the guard before any route that is not public runs."""
    return request[_USER]
