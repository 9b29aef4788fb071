"""Prometheus metrics: phase, readings, run steps and their durations, cache dirty bytes.

Gauges are read from the outage controller at scrape time (a custom collector), so
they are never stale; step durations are a histogram fed by the events.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from datetime import datetime
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from upsguard.engine.outage_controller import OutageController
from upsguard.events import (
    Event,
    OverrideApplied,
    RunFinished,
    RunStarted,
    StepFinished,
    StepStarted,
)
from upsguard.models import Direction, LinkState, Phase, RunId

log = logging.getLogger(__name__)


class Metrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.controller: OutageController | None = None
        self.steps = Histogram(
            "upsguard_step_duration_seconds",
            "How long runbook steps took, by action and outcome",
            ["direction", "action", "state"],
            buckets=(1, 5, 15, 30, 60, 120, 300, 600, 1800),
            registry=self.registry,
        )
        self.runs = Counter(
            "upsguard_runs",
            "Runbook runs finished, by kind and outcome",
            ["kind", "outcome"],
            registry=self.registry,
        )
        self.overrides = Counter(
            "upsguard_overrides",
            "Manual acts (hold, release, trigger, abort), by action",
            ["action"],
            registry=self.registry,
        )
        self.web_requests = Counter(
            "upsguard_web_requests",
            "Requests to the web page, by route and HTTP status",
            ["route", "status"],
            registry=self.registry,
        )
        self.web_seconds = Histogram(
            "upsguard_web_request_duration_seconds",
            "How long the web page took to answer, by route (a live stream: how long it was open)",
            ["route"],
            buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 5, 60, 3600),
            registry=self.registry,
        )
        self.web_clients = Gauge(
            "upsguard_web_sse_clients",
            "Browsers following the live status (server-sent events)",
            registry=self.registry,
        )
        self._started: dict[tuple[str, str], tuple[datetime, str]] = {}
        self._directions: dict[RunId, Direction] = {}
        self._server: Any = None
        self._thread: threading.Thread | None = None

    def attach(self, loop: OutageController) -> None:
        """Figures from ``loop`` from now on (again after a reload: one collector reads the
        controller in force, or every figure would be listed twice)."""
        if self.controller is None:
            self.registry.register(_LoopCollector(self))
        self.controller = loop

    def observe(self, event: Event) -> None:
        if isinstance(event, RunStarted):
            self._directions[event.run] = event.direction
        elif isinstance(event, StepStarted):
            self._started[(event.run, event.step)] = (event.at, event.action)
        elif isinstance(event, StepFinished):
            began = self._started.pop((event.run, event.step), None)
            direction = self._directions.get(event.run)
            if began is not None and direction is not None:
                seconds = (event.at - began[0]).total_seconds()
                self.steps.labels(direction.value, began[1], event.state.value).observe(seconds)
        elif isinstance(event, RunFinished):
            self._directions.pop(event.run, None)
            self.runs.labels(event.spec.kind.value, event.outcome.value).inc()
        elif isinstance(event, OverrideApplied):
            self.overrides.labels(event.action.split(" ", 1)[0]).inc()

    def web_request(self, route: str, status: int, seconds: float) -> None:
        self.web_requests.labels(route, str(status)).inc()
        self.web_seconds.labels(route).observe(seconds)

    def serve(self, address: str, port: int) -> None:
        self._server, self._thread = start_http_server(port, address, registry=self.registry)
        log.info("metrics on http://%s:%d/metrics", address, port)

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server = None


class _LoopCollector(Collector):
    def __init__(self, metrics: Metrics) -> None:
        self._m = metrics

    def collect(self) -> Iterator[GaugeMetricFamily]:
        loop = self._m.controller
        if loop is None:
            return
        yield from _phase(loop)
        yield from _readings(loop)
        yield from _run(loop)
        yield from _caches(loop)


def _phase(loop: OutageController) -> Iterator[GaugeMetricFamily]:
    phase = GaugeMetricFamily("upsguard_phase", "1 for the phase the site is in", labels=["phase"])
    for p in Phase:
        phase.add_metric([p.value], 1.0 if loop.phase is p else 0.0)
    yield phase
    held = GaugeMetricFamily("upsguard_held", "1 while a manual hold defers automatic actions")
    held.add_metric([], 1.0 if loop.held else 0.0)
    feeds = GaugeMetricFamily(
        "upsguard_feed_at_risk",
        "1 while too few of a feed's UPSes supply from mains",
        labels=["feed"],
    )
    for feed in loop.view.feeds if loop.view is not None else ():
        feeds.add_metric([feed.name], 1.0 if feed.at_risk else 0.0)
    yield feeds
    yield held


def _readings(loop: OutageController) -> Iterator[GaugeMetricFamily]:
    charge = GaugeMetricFamily("upsguard_ups_charge_percent", "Battery charge", labels=["ups"])
    runtime = GaugeMetricFamily(
        "upsguard_ups_runtime_seconds",
        "Runtime left: the smaller of the UPS's estimate and the observed depletion",
        labels=["ups"],
    )
    on_battery = GaugeMetricFamily("upsguard_ups_on_battery", "1 while on battery", labels=["ups"])
    link = GaugeMetricFamily("upsguard_ups_link_ok", "1 while the UPS answers", labels=["ups"])
    for name, watch in loop.watches.items():
        last = watch.last
        if last is None:
            continue
        if last.charge_pct is not None:
            charge.add_metric([name], last.charge_pct)
        left = watch.runtime_s()
        if left is not None:
            runtime.add_metric([name], left)
        on_battery.add_metric([name], 1.0 if last.on_battery else 0.0)
        link.add_metric([name], 1.0 if last.link is LinkState.OK else 0.0)
    yield from (charge, runtime, on_battery, link)


def _run(loop: OutageController) -> Iterator[GaugeMetricFamily]:
    running = GaugeMetricFamily("upsguard_run_steps_running", "Steps running now")
    done = GaugeMetricFamily("upsguard_run_steps_finished", "Steps finished in the current run")
    progress = loop.progress()
    running.add_metric([], float(len(progress.running)) if progress else 0.0)
    done.add_metric([], float(len(progress.finished)) if progress else 0.0)
    yield from (running, done)


def _caches(loop: OutageController) -> Iterator[GaugeMetricFamily]:
    dirty = GaugeMetricFamily(
        "upsguard_cache_dirty_bytes", "Dirty data not yet destaged", labels=["cache", "target"]
    )
    for status in loop.caches.status.values():
        if status.state is not None and status.state.dirty_bytes is not None:
            dirty.add_metric([status.cache, status.target.name], float(status.state.dirty_bytes))
    yield dirty
