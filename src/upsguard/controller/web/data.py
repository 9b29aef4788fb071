"""What the page's scripts and links fetch: the status and the plans as JSON, the events
with filters, the history's charts, and a run's HTML report.

Reports and charts are drawn in a worker thread on a journal connection of their own, one
at a time, so no page a person opens ever holds up the power watch.
"""

from __future__ import annotations

import asyncio
import logging
from datetime import UTC, datetime
from pathlib import Path

import msgspec
from aiohttp import web

from upsguard.config.site import SiteConfig
from upsguard.controller.status import plan_status
from upsguard.controller.web.context import WebContext
from upsguard.controller.web.history import METRICS, SPANS, ChartCache
from upsguard.errors import UpsguardError
from upsguard.journal import Journal
from upsguard.models import Direction

log = logging.getLogger(__name__)

STATIC = Path(__file__).parent / "static"
EVENTS_SEARCHED = 2000
EVENTS_SHOWN = 500
LEVELS = ("info", "warning", "error")
REPORT_CSP = "default-src 'none'; script-src 'none'; style-src 'unsafe-inline'; img-src data:"
"""A report or a chart is one self-contained file: inline CSS and SVG, nothing fetched, no
script (its charts carry none)."""


def add_routes(app: web.Application, ctx: WebContext) -> None:
    routes = Data(ctx)
    app.router.add_get("/api/status", routes.status)
    app.router.add_get("/api/plan", routes.plans)
    app.router.add_get("/api/runs/{run}/plan", routes.run_plan)
    app.router.add_get("/api/events", routes.events)
    app.router.add_get("/history/{span}/{metric}.svg", routes.chart)
    app.router.add_get("/runs/{run}/report", routes.report)


class Data:
    def __init__(self, ctx: WebContext) -> None:
        self._ctx = ctx
        self._one = asyncio.Semaphore(1)
        self._charts = ChartCache(ctx.svc.site.journal)

    async def status(self, request: web.Request) -> web.Response:
        status = msgspec.json.encode(self._ctx.svc.status())
        return web.Response(body=status, content_type="application/json")

    async def plans(self, request: web.Request) -> web.Response:
        """The site's plans with every step waiting: what the plan page shows between runs."""
        controller = self._ctx.svc.controller
        shutdown = plan_status(controller.shutdown_plan)
        startup = plan_status(controller.planner.plan(Direction.STARTUP))
        body = {
            "shutdown": msgspec.to_builtins(shutdown),
            "startup": msgspec.to_builtins(startup),
        }
        return web.json_response(body)

    async def run_plan(self, request: web.Request) -> web.Response:
        """The last run's plan as it ended (the page asks when a run it watched is over)."""
        executor = self._ctx.svc.controller.executor
        run = request.match_info["run"]
        if executor is None or executor.spec.id != run:
            raise web.HTTPNotFound(text=f"run {run} is not the service's last run")
        rows = {row.step: row for row in self._ctx.svc.journal.read.steps(run)}
        plan = plan_status(executor.plan, rows, set(executor.running))
        return web.Response(body=msgspec.json.encode(plan), content_type="application/json")

    async def events(self, request: web.Request) -> web.Response:
        """The newest events, filtered by level, kind, run and words in the text."""
        query = request.query
        level, kind, run = query.get("level", ""), query.get("kind", ""), query.get("run", "")
        words = query.get("q", "").lower()
        if level and level not in LEVELS:
            raise web.HTTPBadRequest(text=f"level is one of {', '.join(LEVELS)}")
        rows = self._ctx.svc.journal.read.events(after=-EVENTS_SEARCHED)
        kinds = sorted({r.kind for r in rows})
        chosen = [
            r.to_dict()
            for r in rows
            if (not level or r.level == level)
            and (not kind or r.kind == kind)
            and (not run or r.run == run)
            and (not words or words in r.text.lower())
        ]
        return web.json_response({"events": chosen[-EVENTS_SHOWN:], "kinds": kinds})

    async def chart(self, request: web.Request) -> web.Response:
        span, metric = request.match_info["span"], request.match_info["metric"]
        if span not in SPANS or metric not in METRICS:
            raise web.HTTPNotFound(text=f"no chart {span}/{metric}")
        svg = await asyncio.to_thread(self._charts.chart, span, metric, datetime.now(UTC))
        response = web.Response(text=svg, content_type="image/svg+xml")
        response.headers["Content-Security-Policy"] = REPORT_CSP
        return response

    async def report(self, request: web.Request) -> web.Response:
        run = request.match_info["run"]
        async with self._one:
            try:
                html = await asyncio.to_thread(_report_html, self._ctx.svc.site, run)
            except UpsguardError as exc:  # it may name the journal's path: for the log only
                log.info("web: no report of run %r: %s", run[:64], exc)
                raise web.HTTPNotFound(text="no report of that run") from None
        response = web.Response(text=html, content_type="text/html")
        response.headers["Content-Security-Policy"] = REPORT_CSP
        return response


def _report_html(site: SiteConfig, run_id: str) -> str:
    """``upsguard report RUN --format html``, without the battery model's fit (that is the
    simulation's, which the service does not load)."""
    from upsguard.journal.retrospective import pick_runs, story_from_journal
    from upsguard.reports import render

    journal = Journal(site.journal, read_only=True)
    try:
        runs = pick_runs(journal, run_id)
        title = f"Outage report: {runs[0].kind} run {runs[0].id}"
        story = story_from_journal(journal, site, runs, title=title, source="journal")
    finally:
        journal.close()
    return render.report(story, "html")
