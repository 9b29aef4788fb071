"""The page's controls: hold, release, trigger (the whole site or ``only`` some resources)
and abort, for operators.

Each is read, carried out and answered by ``controller.commands``, as the local API's are:
the same rules (a hold needs a reason; a trigger, a release or an abort without one is
journaled as asked for by its operator), the same JSON answers, the same error statuses.
What the page adds is its own: the operator's role is checked before the body is read,
the caller is ``NAME (web)``, and the body must say ``confirm: true`` (the page asks for a
confirmation, and a reason, before it sends one), so a script cannot skip the question.
"""

from __future__ import annotations

import logging
from typing import Any

import msgspec
from aiohttp import web

from upsguard.controller import commands
from upsguard.controller.web.context import WebContext, current_user
from upsguard.errors import BadRequest, UpsguardError

log = logging.getLogger(__name__)


def add_routes(app: web.Application, ctx: WebContext) -> None:
    controls = Controls(ctx)
    for command in commands.COMMANDS:
        app.router.add_post(f"/api/{command}", controls.act)


class Controls:
    def __init__(self, ctx: WebContext) -> None:
        self._ctx = ctx

    async def act(self, request: web.Request) -> web.Response:
        """One command, from an operator (or 403), confirmed."""
        user = current_user(request)
        if not user.may_act:
            raise web.HTTPForbidden(text=f"{user.name} is a viewer: only an operator may act")
        command = request.path.removeprefix("/api/")
        try:
            body = _confirmed(await request.read(), request.remote)
            order = commands.parse(command, body, f"{user.name} (web)")
            answer = await self._ctx.svc.overrides.apply(order)
        except UpsguardError as exc:
            status, refusal = commands.refusal(exc)
            return web.json_response(refusal, status=status)
        return web.json_response(msgspec.to_builtins(answer))


def _confirmed(raw: bytes, remote: str | None) -> dict[str, Any]:
    """The body, a JSON object that says ``confirm: true``."""
    try:
        body = commands.json_object(raw)
    except BadRequest as exc:
        log.debug("web: refused a body from %s: %s", remote, exc)
        raise
    if body.get("confirm") is not True:
        raise BadRequest("not confirmed: nothing done")
    return body
