"""The commands a person types at a terminal, or a script in a loop, answer at once: each
imports what it uses, never the service's stack. ``--help``, ``status`` and ``hold`` (to a
running service) and ``validate`` are run as processes and the modules each loaded are
checked (the time they take is ``bench/cli_start.py``'s to measure, never a test's).

Defect this reproduces (it failed before the fix): every command imported every
subcommand's modules, the service's included (its scheduler, HTTP server, metrics, the
cache and UPS plugins, rich): ``upsguard --help`` took 1.5 s and ``status`` 2 s on a busy
machine. And then (``bench/cli_start.py``): every command still imported every command's
module and asyncio, and ``status`` and ``hold`` loaded and checked the whole site file, its
pydantic models and checks, only to learn the path of the service's socket (0.34 s each).
And then ``--help`` imported asyncio, as ``cache`` and ``ups`` did at their top. And then
``status`` and ``hold`` imported pydantic, and built its models, to read the service's
answers (916 and 915 million instructions, against 498 and 476 with msgspec).
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.integration.test_service import SIMULATED_SITE
from tests.peers.service import ServiceProcess, write_site
from upsguard.cli import COMMAND_MODULES

ROOT = Path(__file__).resolve().parents[2]
#: The command, then the names of the modules it loaded, as JSON on the last line.
DRIVER = """
import json, sys
from upsguard.cli import main
try:
    code = main(sys.argv[1:])
except SystemExit as exc:
    code = exc.code
print(json.dumps(sorted(sys.modules)))
sys.exit(code)
"""
#: What none of them needs: the service (its scheduler, HTTP server and client, metrics),
#: the engine, the plugins' SDKs, the reports' and the simulator's libraries, rich.
STACK = (
    "apscheduler",
    "aiohttp",
    "prometheus_client",
    "pysnmp",
    "pyVmomi",
    "jinja2",
    "pygal",
    "rich",
    "upsguard.controller",
    "upsguard.engine",
    "upsguard.simulation",
    "upsguard.reports.render",
)


def loaded(*argv: str) -> tuple[subprocess.CompletedProcess[str], set[str]]:
    done = subprocess.run(
        [sys.executable, "-c", DRIVER, *argv],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=ROOT,
    )
    *said, modules = done.stdout.splitlines()
    done.stdout = "\n".join(said)
    return done, set(json.loads(modules))


#: What the CLI shares with the service: the override commands' requests and answers
#: (msgspec structs, errors and core types only), and the package that holds them.
SHARED = ("upsguard.controller", "upsguard.controller.commands")


def within(modules: set[str], packages: tuple[str, ...]) -> list[str]:
    return sorted(m for m in modules if any(m == p or m.startswith(f"{p}.") for p in packages))


def heavy(modules: set[str]) -> list[str]:
    return [m for m in within(modules, STACK) if m not in SHARED]


#: What ``status`` and ``hold`` to a running service need of the site file is the path of
#: its socket (``config.api_socket``), not the site's models and checks, the plugins, or
#: asyncio (the command enters the async core only when no service answers); nor pydantic,
#: as the status and the answers they read are msgspec structs.
SITE = (
    "upsguard.config.site",
    "upsguard.config.loading",
    "upsguard.config.checks",
    "upsguard.plugins",
    "asyncio",
    "pydantic",
)


def other_commands(modules: set[str], *own: str) -> list[str]:
    """The modules of the commands not typed (a command builds its own parser alone),
    ``own`` the modules the typed command imports."""
    return within(modules, tuple(f"upsguard.cli.{m}" for m in COMMAND_MODULES if m not in own))


@pytest.fixture(scope="module")
def service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServiceProcess]:
    svc = write_site(tmp_path_factory.mktemp("svc"), SIMULATED_SITE)
    svc.start()
    yield svc
    svc.stop()


def test_help_loads_no_command_s_modules() -> None:
    done, modules = loaded("--help")
    assert done.returncode == 0 and "validate" in done.stdout
    assert heavy(modules) == []
    assert "upsguard.config.site" not in modules  # not even the site file's models
    assert within(modules, ("asyncio", "pydantic")) == []  # nor what a command's run needs


def test_status_of_a_running_service_loads_only_the_client(service: ServiceProcess) -> None:
    done, modules = loaded("status", "-c", str(service.site))
    assert done.returncode == 0, done.stderr
    assert "normal" in done.stdout
    assert heavy(modules) == []
    assert within(modules, SITE) == []
    assert other_commands(modules, "service") == []


def test_hold_to_a_running_service_loads_only_the_client(service: ServiceProcess) -> None:
    done, modules = loaded("hold", "--reason", "a quick one", "-c", str(service.site))
    assert (done.returncode, done.stdout) == (0, "held: a quick one"), done.stderr
    assert heavy(modules) == []
    assert within(modules, SITE) == []
    assert other_commands(modules, "service") == []


def test_validate_loads_the_site_s_models_and_the_planner_alone() -> None:
    done, modules = loaded("validate", "-c", "config/examples/homelab.yaml")
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("config/examples/homelab.yaml: ok: site 'homelab'")
    assert heavy(modules) == []
    assert other_commands(modules, "site", "reports") == []  # reports: --durations
    # the plugins' names, not their Protocols (and asyncio with them): 0.30 s to 0.25 s
    assert within(modules, ("upsguard.plugins.registry", "asyncio")) == []
