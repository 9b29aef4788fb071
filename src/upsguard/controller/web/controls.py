"""The page's controls: hold, release, trigger (the whole site or ``only`` some resources)
and abort, for operators.

Each goes through ``controller.overrides`` like the CLI's, so it is an ``OverrideApplied``
event journaled with who (``NAME (web)``) and why. The page asks for a confirmation and a
reason; the server insists on both as well (``confirm: true``, a reason that is not
empty), so a script cannot skip them either. Reasons and names are cleaned as the local
API cleans them: they are journaled and shown on terminals.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from aiohttp import web

from upsguard.controller.api import MAX_NAME, MAX_REASON, MAX_ROWS, clean_text
from upsguard.controller.web.context import WebContext, current_user
from upsguard.errors import TemporaryError, UpsguardError

log = logging.getLogger(__name__)


def add_routes(app: web.Application, ctx: WebContext) -> None:
    controls = Controls(ctx)
    app.router.add_post("/api/hold", controls.hold)
    app.router.add_post("/api/release", controls.release)
    app.router.add_post("/api/trigger", controls.trigger)
    app.router.add_post("/api/abort", controls.abort)


class Controls:
    def __init__(self, ctx: WebContext) -> None:
        self._ctx = ctx

    async def hold(self, request: web.Request) -> web.Response:
        who, body = await _operator(request)
        overrides = self._ctx.svc.overrides
        return _answer(lambda: overrides.hold(who, _reason(body)))

    async def release(self, request: web.Request) -> web.Response:
        who, body = await _operator(request)
        overrides = self._ctx.svc.overrides
        return _answer(lambda: overrides.release(who, _reason(body)))

    async def trigger(self, request: web.Request) -> web.Response:
        who, body = await _operator(request)
        direction = clean_text(str(body.get("direction", "")), MAX_NAME)
        only = _names(body.get("only"))
        try:
            answer = await self._ctx.svc.overrides.trigger(who, direction, only, _reason(body))
        except UpsguardError as exc:
            return _refused(exc)
        return web.json_response(answer)

    async def abort(self, request: web.Request) -> web.Response:
        who, body = await _operator(request)
        try:
            answer = await self._ctx.svc.overrides.abort(who, _reason(body))
        except UpsguardError as exc:
            return _refused(exc)
        return web.json_response(answer)


async def _operator(request: web.Request) -> tuple[str, dict[str, Any]]:
    """Who acts (an operator, or 403) and the body, confirmed (or 400)."""
    user = current_user(request)
    if not user.may_act:
        raise web.HTTPForbidden(text=f"{user.name} is a viewer: only an operator may act")
    try:
        body = json.loads(await request.read() or b"{}")
    except RecursionError:
        log.debug("web: a body nested too deeply from %s, refused", request.remote)
        raise web.HTTPBadRequest(text="the body is JSON nested too deeply") from None
    except ValueError:
        raise web.HTTPBadRequest(text="the body is not JSON") from None
    if not isinstance(body, dict):
        raise web.HTTPBadRequest(text="the body must be a JSON object")
    if body.get("confirm") is not True:
        raise web.HTTPBadRequest(text="not confirmed: nothing done")
    return f"{user.name} (web)", body


def _reason(body: dict[str, Any]) -> str:
    value = body.get("reason")
    reason = clean_text(value, MAX_REASON) if isinstance(value, str) else ""
    if not reason:
        raise web.HTTPBadRequest(text="give a reason: it is journaled with your name")
    return reason


def _names(value: object) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        raise web.HTTPBadRequest(text="'only' must be a list of resource ids")
    if len(value) > MAX_ROWS:
        raise web.HTTPBadRequest(text=f"'only' names more than {MAX_ROWS} resources")
    return [clean_text(v, MAX_NAME) for v in value if v.strip()]


def _answer(act: Any) -> web.Response:
    try:
        return web.json_response(act())
    except UpsguardError as exc:
        return _refused(exc)


def _refused(exc: UpsguardError) -> web.Response:
    status = 409 if isinstance(exc, TemporaryError) else 400
    return web.json_response({"error": str(exc)}, status=status)
