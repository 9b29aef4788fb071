"""After a real run of ``upsguard run`` (the built-in simulated UPS and platform, a command
step that really sleeps): ``upsguard report --last`` tells it, the plan learns from it, and a
service started again plans with what it learned."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.peers.service import ServiceProcess, write_site
from upsguard.config.loading import load_site
from upsguard.controller.service import Service
from upsguard.models import Direction

SITE: dict[str, Any] = {
    "site": "drill",
    "ups": [{"name": "ups1", "simulated": {}, "runtime_at": {"minutes": 20, "load_watts": 300}}],
    "platforms": {
        "sim": {"type": "simulated", "guest_shutdown": "1s", "host_shutdown": "1s"},
        "cmd": {"type": "command"},
    },
    "resources": [
        {"id": "db", "kind": "vm", "platform": "sim", "runs_on": ["h1"], "watts": 50},
        {"id": "web", "kind": "vm", "platform": "sim", "runs_on": ["h1"], "depends_on": ["db"]},
        {
            "id": "backup",
            "kind": "command",
            "platform": "cmd",
            "shutdown": "sleep 1.5",
            "estimate": {"stop": "5s"},
            "depends_on": ["h1"],
        },
        {"id": "h1", "kind": "host", "platform": "sim", "watts": 150},
    ],
    # a site that trusts one drill (the default waits for three): one run teaches the plan
    "policies": {"poll_interval": "500ms", "learning": {"min_runs": 1, "may_lower_to_pct": 0}},
}


@pytest.fixture
def service(tmp_path: Path) -> Iterator[ServiceProcess]:
    svc = write_site(tmp_path, SITE)
    yield svc
    svc.stop()


def drill(service: ServiceProcess) -> dict[str, Any]:
    service.cli("trigger", "shutdown", "--yes", "--reason", "quarterly drill")
    service.wait(lambda: service.status()["run"] is None, "the drill to finish")
    run: dict[str, Any] = json.loads(service.cli("history", "--format", "json").stdout)["runs"][0]
    return run


def test_report_last_after_a_real_run_tells_every_step_and_the_plan_learns(
    service: ServiceProcess, tmp_path: Path
) -> None:
    service.start()
    run = drill(service)
    assert run["state"] == "done"
    assert service.terminate() == 0

    html = tmp_path / "report.html"
    service.cli("report", "--last", "-o", str(html))
    text = html.read_text()
    for step in run["steps"]:
        assert f'data-step="{step["step"]}"' in text
    assert "quarterly drill" in text and "trigger shutdown" in text  # the override: who, why
    assert "<script src" not in text and "http://" not in text.replace(
        "http://www.w3.org/2000/svg", ""
    ).replace("http://pygal.org", "").replace("http://github.com/Kozea/pygal", "")

    md = service.cli("report", run["id"], "--format", "md").stdout
    assert f"# Outage report: shutdown run {run['id']}" in md
    assert "| stop:backup" in md and "| estimate |" in md  # planned with the site file's 5s
    assert "## The next outage, with the learned durations" in md

    plan = service.cli("plan", "shutdown").stdout
    assert "stop:backup" in plan and "(p90 of 1 run)" in plan
    configured = service.cli("plan", "shutdown", "--durations", "configured").stdout
    assert "(estimate)" in configured and "p90" not in configured

    battery = service.cli("battery").stdout  # the built-in simulated UPS never left the mains
    assert "no UPS of site drill has been on battery" in battery

    missing = service.cli("report", "no-such-run", check=False)
    assert missing.returncode != 0 and "no run 'no-such-run'" in missing.stderr
    assert "Traceback" not in missing.stderr


def test_a_service_started_again_plans_with_the_learned_durations(
    service: ServiceProcess,
) -> None:
    service.start()
    drill(service)
    assert service.terminate() == 0

    async def shutdown_plan_sources() -> dict[str, str]:
        svc = Service(load_site(service.site))
        try:
            await svc.open(resume=False)
            plan = svc.controller.planner.plan(Direction.SHUTDOWN)
            return {s.resource: s.estimate_source for s in plan.steps}
        finally:
            await svc.close()

    sources = asyncio.run(shutdown_plan_sources())
    assert sources == {s: "p90 of 1 run" for s in ("db", "web", "h1", "backup")}


def test_report_without_a_journal_says_so_in_one_line(service: ServiceProcess) -> None:
    result = service.cli("report", "--last", check=False)
    assert result.returncode != 0
    assert result.stderr.count("\n") == 1 and "does not exist" in result.stderr
