"""The page's HTML: the login, and one page per panel (overview, plan, caches, history, runs,
events, doctor), through the Jinja2 templates of this package.

The HTML carries no status of its own: ``static/app.js`` fills the live panels from the
first server-sent message, which arrives as the stream opens, and keeps them current. The
history, the runs and the doctor are drawn here from the journal.
"""

from __future__ import annotations

import asyncio
import functools
import math
import secrets
from typing import Any

import jinja2
from aiohttp import web

from upsguard import __version__
from upsguard.config.types import format_duration
from upsguard.controller.web import data, doctor
from upsguard.controller.web.auth import (
    DEVICE_COOKIE,
    DEVICE_COOKIE_DAYS,
    LOGIN_COOKIE,
    session_cookie,
)
from upsguard.controller.web.context import WebContext, current_user
from upsguard.controller.web.history import SPANS

PAGES = {
    "/": ("overview", "Overview"),
    "/plan": ("plan", "Plan"),
    "/caches": ("caches", "Caches"),
    "/history": ("history", "History"),
    "/runs": ("runs", "Runs"),
    "/events": ("events", "Events"),
    "/doctor": ("doctor", "Doctor"),
}
FAILED_LOGIN_PAUSE_S = 0.5
RUNS_SHOWN = 100


@functools.cache
def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.PackageLoader("upsguard.controller.web", "templates"),
        autoescape=True,
        trim_blocks=True,
        lstrip_blocks=True,
        undefined=jinja2.StrictUndefined,
    )
    env.filters["duration"] = lambda s: "" if s is None else format_duration(s)
    env.globals.update(PAGES=PAGES, version=__version__)
    return env


def render(name: str, **context: Any) -> web.Response:
    html = _environment().get_template(name).render(**context)
    return web.Response(text=html, content_type="text/html")


def add_routes(app: web.Application, ctx: WebContext) -> None:
    pages = Pages(ctx)
    for path in PAGES:
        app.router.add_get(path, pages.page)
    app.router.add_get("/login", pages.login_form)
    app.router.add_get("/favicon.ico", _no_icon)
    app.router.add_post("/login", pages.login)
    app.router.add_post("/logout", pages.logout)
    app.router.add_static("/static/", data.STATIC, append_version=False)
    data.add_routes(app, ctx)


class Pages:
    def __init__(self, ctx: WebContext) -> None:
        self._ctx = ctx

    async def page(self, request: web.Request) -> web.Response:
        name, title = PAGES[request.path]
        user = current_user(request)
        svc = self._ctx.svc
        extra: dict[str, Any] = {}
        if name == "runs":
            extra["runs"] = svc.journal.read.runs(limit=RUNS_SHOWN, with_steps=False)
        elif name == "doctor":
            extra["result"] = doctor.last_result(svc.journal)
            extra["states"] = doctor.STATE_OF
        elif name == "history":
            span = request.query.get("span", "24h")
            extra["span"] = span if span in SPANS else "24h"
            extra["spans"] = list(SPANS)
        elif name == "overview":
            extra["resources"] = [r.id for r in svc.site.resources]
        return render(
            f"{name}.html.j2",
            page=name,
            title=title,
            site=svc.site.site,
            user=user,
            **extra,
        )

    # -- login and out --------------------------------------------------------------------

    async def login_form(self, request: web.Request) -> web.Response:
        return self._login_page(request, "")

    def _login_page(self, request: web.Request, error: str, status: int = 200) -> web.Response:
        # one nonce per browser: two tabs (or a stray request) must not void each other's form
        nonce = request.cookies.get(LOGIN_COOKIE) or secrets.token_urlsafe(16)
        response = render(
            "login.html.j2",
            site=self._ctx.svc.site.site,
            token=self._ctx.sessions.login_token(nonce),
            next=_next(request.query.get("next")),
            error=error,
        )
        response.set_status(status)
        response.set_cookie(
            LOGIN_COOKIE,
            nonce,
            httponly=True,
            samesite="Strict",
            secure=self._ctx.config.cookies_secure,
            path="/login",
        )
        return response

    async def login(self, request: web.Request) -> web.Response:
        form = await request.post()
        name, password = str(form.get("name", ""))[:64], str(form.get("password", ""))[:1024]
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        expected = self._ctx.sessions.login_token(nonce) if nonce else ""
        if not nonce or not secrets.compare_digest(expected, str(form.get("csrf", ""))):
            raise web.HTTPForbidden(text="the login form is stale: reload it")
        address = self._ctx.proxy.client_address(request.remote, request.headers)
        throttle = self._ctx.throttle
        wait = throttle.admit(name, address)
        if wait > 0:
            message = f"too many failed logins: try again in {math.ceil(wait)} s"
            return self._login_page(request, message, status=429)
        ok = False
        try:
            failed = throttle.failed(address)
            known = self._ctx.sessions.known_device(name, request.cookies.get(DEVICE_COOKIE))
            ok = await self._ctx.passwords.verify(
                name, password, address=address, failed_before=failed, known=known
            )
        finally:
            throttle.record(name, address, ok)
        if not ok:
            await asyncio.sleep(FAILED_LOGIN_PAUSE_S)
            return self._login_page(request, "wrong name or password", status=401)
        response = web.HTTPSeeOther(_next(str(form.get("next", "/"))))
        response.set_cookie(
            session_cookie(self._ctx.config),
            self._ctx.sessions.issue(name),
            httponly=True,
            samesite="Strict",
            secure=self._ctx.config.cookies_secure,
            path="/",
            max_age=int(self._ctx.config.session_lifetime.total_seconds()),
        )
        response.del_cookie(LOGIN_COOKIE, path="/login")
        response.set_cookie(
            DEVICE_COOKIE,
            self._ctx.sessions.device_token(name),
            httponly=True,
            samesite="Strict",
            secure=self._ctx.config.cookies_secure,
            path="/login",
            max_age=DEVICE_COOKIE_DAYS * 86400,
        )
        raise response

    async def logout(self, request: web.Request) -> web.Response:
        name = session_cookie(self._ctx.config)
        self._ctx.sessions.revoke(request.cookies.get(name))
        response = web.json_response({"logged_out": current_user(request).name})
        response.del_cookie(name, path="/", secure=self._ctx.config.cookies_secure)
        return response


async def _no_icon(request: web.Request) -> web.Response:
    """Browsers ask for an icon; the page has none (and must not send them to the login)."""
    return web.Response(status=204)


def _next(target: str | None) -> str:
    """Where to go after the login: a path of this page only, never another site."""
    if not target or not target.startswith("/") or target.startswith("//") or "\\" in target:
        return "/"
    return target if target.split("?")[0] in PAGES else "/"
