"""The page's own listener: an aiohttp application on the ``web:`` address, beside (never
instead of) the local API's unix socket.

Every request passes two guards before its route:

- ``_measured``: counts it in the service's Prometheus metrics (route and status) and
  sets the headers that keep the page to itself: a Content-Security-Policy of ``'self'``
  (no script, style, font or image from anywhere else, nothing framed), no referrer, no
  sniffing, no caching of what a person sees, no software versions (``Server: upsguard``),
  and over TLS, HTTPS only from then on (``Strict-Transport-Security``);
- ``_guarded``: refuses a ``Host`` the page is not served as (421: DNS rebinding, see
  ``hosts``); finds who asks (the trusted proxy's header, with the proxy's secret, else the
  session cookie); a stranger is sent to the login page (HTML) or gets 401 (JSON). A
  change (any POST but the login itself) needs the session's CSRF token in
  ``X-CSRF-Token`` and, when the browser says where it comes from, this page's own origin:
  403 otherwise.

Connections are bounded before any of this (``listener``): a ceiling counting the live
streams, none while descriptors are short, a deadline for a request's head.

The page is for people watching: when it cannot start (the port is taken, the TLS files
cannot be read) the service says so as an alert and goes on watching the power.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import ssl
import time
from collections.abc import Awaitable, Callable
from typing import Any
from urllib.parse import urlsplit

from aiohttp import web

from upsguard.config.web import WebConfig
from upsguard.controller.web import auth, controls, pages
from upsguard.controller.web.context import WebContext, WebServed, set_user
from upsguard.controller.web.hosts import Hosts
from upsguard.controller.web.listener import HEAD_TIMEOUT_S, MAX_CONNECTIONS, Door
from upsguard.controller.web.live import STREAM_LIMITS, LiveFeed, StreamLimits
from upsguard.errors import PermanentError

log = logging.getLogger(__name__)

MAX_BODY = 16 * 1024
PUBLIC = frozenset({"/login", "/favicon.ico"})
"""Paths a stranger may ask for: exactly these (a route added one day under ``/login...`` is
not public by its name), and what is under ``PUBLIC_UNDER``."""
PUBLIC_UNDER = "/static/"
CSP = (
    "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
    "connect-src 'self'; font-src 'self'; frame-ancestors 'none'; form-action 'self'; "
    "base-uri 'none'"
)
HSTS_MAX_AGE_S = 365 * 24 * 3600
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


class WebServer:
    def __init__(
        self,
        svc: WebServed,
        config: WebConfig,
        max_connections: int = MAX_CONNECTIONS,
        monotonic: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
        streams: StreamLimits = STREAM_LIMITS,
    ) -> None:
        """``max_connections``: the listener's ceiling, ``streams``: how the live streams are
        shared out (tests make them small); ``monotonic``: the clock of the login throttle,
        ``wall``: the clock of sessions' expiry (a test's fake ones). PermanentError naming
        the file when a key or secret the site file names cannot be read."""
        self.svc = svc
        self.max_connections = max_connections
        self.config = config
        self.roster = auth.Roster(config.users)
        keys = auth.Keys.for_config(config)
        self.sessions = auth.Sessions(config, keys, self.roster, clock=wall)
        self.proxy = auth.Proxy.for_config(config)
        self._cookie = auth.session_cookie(config)
        self.hosts = Hosts(config)
        self.feed = LiveFeed(
            svc.status,
            lambda after: svc.journal.read.events(after=after),
            lambda: svc.changed,
            svc.metrics.web_clients.set,
            asker=self.user_of,
            limits=streams,
        )
        self.context = WebContext(
            svc,
            config,
            self.sessions,
            auth.PasswordCheck(config, roster=self.roster),
            auth.LoginThrottle(monotonic),
            self.proxy,
        )
        self._runner: web.AppRunner | None = None
        self._listener: asyncio.Server | None = None
        self.door: Door | None = None
        self._feeding: asyncio.Task[None] | None = None
        self.url = ""

    def application(self) -> web.Application:
        app = web.Application(middlewares=[self._measured, self._guarded], client_max_size=MAX_BODY)
        app.on_response_prepare.append(_protect)
        if self.config.tls is not None:
            app.on_response_prepare.append(_https_only)
        pages.add_routes(app, self.context)
        controls.add_routes(app, self.context)
        app.router.add_get("/api/stream", self.feed.stream)
        return app

    async def start(self) -> None:
        tls = self._tls()
        args: dict[str, Any] = {"access_log": None, "keepalive_timeout": HEAD_TIMEOUT_S}
        runner = web.AppRunner(self.application(), shutdown_timeout=2.0, **args)
        await runner.setup()
        assert runner.server is not None, "setup made the server"
        door = Door(runner.server, self.max_connections, **args)
        host = str(self.config.listen)
        try:
            self._listener = await door.listen(host, self.config.port, tls)
        except OSError as exc:
            await runner.cleanup()
            raise PermanentError(f"web page on {host} port {self.config.port}: {exc}") from exc
        self._runner = runner
        self.door = door
        scheme = "https" if tls else "http"
        shown = f"[{host}]" if ":" in host else host
        self.url = f"{scheme}://{shown}:{self.config.port}/"
        self._feeding = asyncio.create_task(self.feed.run(), name="web live feed")
        log.info("web page on %s", self.url)
        await self.hosts.start()
        await self.context.passwords.start()  # a login before it is made waits for it

    def apply(self, config: WebConfig | None) -> None:
        """A reloaded site file's users and roles, at once: a user taken out is out (their
        session, their password), a role changed is the new one at the next request. A file
        without ``web:`` lets nobody in until the next start stops the page. The address,
        port, TLS, proxy and session settings stay those of the start."""
        self.roster.replace(config.users if config is not None else [])

    def _tls(self) -> ssl.SSLContext | None:
        tls = self.config.tls
        if tls is None:
            return None
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        try:
            context.load_cert_chain(tls.certificate_file, tls.key_file)
        except (OSError, ssl.SSLError) as exc:
            why = getattr(exc, "strerror", None) or getattr(exc, "reason", None) or exc
            raise PermanentError(
                f"web.tls: cannot load {tls.certificate_file} with its key: {why}"
            ) from exc
        return context

    async def stop(self) -> None:
        self.feed.close()
        if self._feeding is not None:
            self._feeding.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._feeding
        if self._listener is not None:
            self._listener.close()
        if self._runner is not None:
            await self._runner.cleanup()
            self._runner = None
        if self._listener is not None:
            await self._listener.wait_closed()
            self._listener = None

    # -- who asks ----------------------------------------------------------------------

    def user_of(self, request: web.Request) -> auth.User | None:
        name = self.proxy.user_name(request.remote, request.headers)
        if name:
            return self.sessions.proxied(name)
        return self.sessions.user(request.cookies.get(self._cookie))

    @web.middleware
    async def _guarded(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        if not self.hosts.serves(request.host):
            log.debug("web: a request for another host name from %s, refused", request.remote)
            raise web.HTTPMisdirectedRequest(text="not a name of this page")
        if request.path in PUBLIC or request.path.startswith(PUBLIC_UNDER):
            if request.method == "POST" and not _same_origin(request):
                raise web.HTTPForbidden(text="a change must come from this page itself")
            return await handler(request)
        user = self.user_of(request)
        if user is None:
            if request.path.startswith("/api/"):
                raise web.HTTPUnauthorized(text="log in first")
            raise web.HTTPSeeOther(f"/login?next={request.path}")
        if request.method == "POST":
            if not _same_origin(request):
                raise web.HTTPForbidden(text="a change must come from this page itself")
            if not auth.csrf_ok(user, request.headers.get(auth.CSRF_HEADER)):
                raise web.HTTPForbidden(text="the CSRF token is missing or wrong: reload the page")
        set_user(request, user)
        return await handler(request)

    @web.middleware
    async def _measured(self, request: web.Request, handler: Handler) -> web.StreamResponse:
        started = time.perf_counter()
        status = 500
        try:
            response = await handler(request)
            status = response.status
        except web.HTTPException as exc:
            status = exc.status
            raise
        finally:
            route = request.match_info.route.resource
            name = route.canonical if route is not None else "unmatched"
            self.svc.metrics.web_request(name, status, time.perf_counter() - started)
        return response


async def _protect(request: web.Request, response: web.StreamResponse) -> None:
    response.headers.setdefault("Content-Security-Policy", CSP)
    response.headers.setdefault("X-Content-Type-Options", "nosniff")
    response.headers.setdefault("Referrer-Policy", "same-origin")  # Origin stays set on POSTs
    response.headers.setdefault("X-Frame-Options", "DENY")
    response.headers.setdefault("Cache-Control", "no-store")
    response.headers["Server"] = "upsguard"  # not aiohttp's and Python's versions


async def _https_only(request: web.Request, response: web.StreamResponse) -> None:
    """A page served over TLS is to be asked for over TLS only, for a year."""
    response.headers["Strict-Transport-Security"] = f"max-age={HSTS_MAX_AGE_S}"


def _same_origin(request: web.Request) -> bool:
    """A browser names where a POST comes from (Origin); when it does, it must be here."""
    origin = request.headers.get("Origin")
    if origin is None or origin == "null":
        return origin is None
    return urlsplit(origin).netloc == request.host
