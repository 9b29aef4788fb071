"""Health checks: what must answer before a started resource counts as up.

The startup runbook starts a resource's dependents only once the resource is
healthy, not merely powered on: a NAS whose NFS port does not answer yet is
not ready for the hosts that mount it. ``wait_healthy`` polls every check of
the resource's ``health:`` block (a TCP port, an HTTP URL, a local command,
and the platform's own view such as "vSphere sees the host connected") until
all pass together, or raises ``StepTimeout`` naming what did not answer.

Waiting goes through asyncio, so the simulator's virtual clock drives it too.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import os
import socket
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass

from upsguard.clock import Clock, SystemClock
from upsguard.config.resources import HealthCheck, HttpCheck, ResourceConfig
from upsguard.config.types import format_duration, resolve_secret
from upsguard.errors import StepTimeout, UpsguardError
from upsguard.models import Target
from upsguard.net import http_request, tls_context
from upsguard.plugins import remote
from upsguard.plugins.platforms.base import Platform
from upsguard.secrecy import redact_url

__all__ = ["CheckResult", "check_command", "check_http", "check_tcp", "wait_healthy"]

#: No single probe may take longer than this, so one hung check cannot eat the deadline.
PROBE_TIMEOUT = 10.0
#: The platform's own check may call a slow API (vCenter taking a host out of maintenance).
PLATFORM_PROBE_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One probe: ``what`` names it (``tcp 10.0.0.5:2049``), ``why`` says how it failed."""

    what: str
    ok: bool
    why: str = ""


async def wait_healthy(
    resource: ResourceConfig,
    target: Target,
    platform: Platform,
    clock: Clock | None = None,
    network_probes: bool = True,
) -> None:
    """Return once every health check of ``resource`` passes in the same round.

    Without a ``health:`` block only the platform's own check runs, with the
    default timeout; so it does in a dry run (``network_probes`` False: the simulator must
    not probe the real network). Raises ``StepTimeout`` with one line naming the resource,
    how long it waited and which check did not answer (and why, when known).
    """
    check = resource.health or HealthCheck()
    if not network_probes:
        check = HealthCheck(timeout=check.timeout, interval=check.interval)
    clock = clock or SystemClock()
    timeout = check.timeout.total_seconds()
    interval = max(check.interval.total_seconds(), 0.05)
    deadline = clock.monotonic() + timeout
    failing: list[CheckResult] = []
    while True:
        failing = [r for r in await _round(check, target, platform, timeout) if not r.ok]
        if not failing:
            return
        left = deadline - clock.monotonic()
        if left <= 0:
            break
        await asyncio.sleep(min(interval, left))
    raise StepTimeout(_timeout_message(resource, check, failing))


def _timeout_message(
    resource: ResourceConfig, check: HealthCheck, failing: list[CheckResult]
) -> str:
    parts = [f"{r.what} ({r.why})" if r.why else r.what for r in failing]
    return (
        f"resource '{resource.id}' not healthy after {format_duration(check.timeout)}: "
        f"{'; '.join(parts)} did not answer"
    )


async def _round(
    check: HealthCheck, target: Target, platform: Platform, timeout: float
) -> list[CheckResult]:
    """Run every configured probe once, at the same time."""
    timeout = max(timeout, 0.1)
    probe_timeout = min(PROBE_TIMEOUT, timeout)
    probes: list[Awaitable[CheckResult]] = []
    if check.tcp:
        probes.append(check_tcp(check.tcp, probe_timeout))
    if check.http:
        probes.append(check_http(check.http, probe_timeout))
    if check.command:
        probes.append(check_command(check.command, probe_timeout, check.pass_env))
    if check.platform:
        probes.append(_check_platform(platform, target, min(PLATFORM_PROBE_TIMEOUT, timeout)))
    return list(await asyncio.gather(*probes))


async def _guard(
    what: str, probe: Callable[[], Awaitable[str | None]], timeout: float
) -> CheckResult:
    """Run ``probe``; None means it passed, a string says why it failed."""
    try:
        async with asyncio.timeout(timeout):
            why = await probe()
    except TimeoutError:
        return CheckResult(what, False, f"no answer within {timeout:g}s")
    except UpsguardError as exc:
        return CheckResult(what, False, str(exc))
    return CheckResult(what, why is None, why or "")


def _split_host_port(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ValueError(f"health tcp '{address}' is not host:port")
    return host.strip("[]"), int(port)


async def check_tcp(address: str, timeout: float = PROBE_TIMEOUT) -> CheckResult:
    """Passes when ``host:port`` accepts a TCP connection."""
    what = f"tcp {address}"

    async def probe() -> str | None:
        host, port = _split_host_port(address)
        try:
            _, writer = await asyncio.open_connection(host, port)
        except socket.gaierror as exc:
            return f"cannot resolve {host}: {exc.strerror}"
        except OSError as exc:
            return os.strerror(exc.errno) if exc.errno else str(exc)
        writer.close()
        with contextlib.suppress(OSError):
            await writer.wait_closed()
        return None

    return await _guard(what, probe, timeout)


async def check_http(check: HttpCheck | str, timeout: float = PROBE_TIMEOUT) -> CheckResult:
    """Passes when the URL answers 2xx (a redirect is not followed: see ``upsguard.net``).

    TLS is verified against ``ca_file`` or the system's CAs. Credentials are read from
    their file or variable at each probe, so a rotated password needs no restart; the
    check is named by its URL with credentials and query values hidden.
    """
    if isinstance(check, str):
        check = HttpCheck(url=check)
    what = f"http {redact_url(check.url)}"

    async def probe() -> str | None:
        headers = {"User-Agent": "upsguard"} | _auth_headers(check)
        tls = tls_context(check.verify_tls, check.ca_file)
        return await asyncio.to_thread(
            http_request, check.url, timeout=timeout, tls=tls, headers=headers
        )

    return await _guard(what, probe, timeout + 1)


def _auth_headers(check: HttpCheck) -> dict[str, str]:
    """The check's credentials as a header; ``ConfigError`` naming the file or variable."""
    if check.user is not None:
        password = resolve_secret("health check password", check.password_file, check.password_env)
        basic = base64.b64encode(f"{check.user}:{password}".encode()).decode()
        return {"Authorization": f"Basic {basic}"}
    if check.header is not None:
        value = resolve_secret(
            f"health check header {check.header}", check.value_file, check.value_env
        )
        return {check.header: value or ""}
    return {}


async def check_command(
    command: str, timeout: float = PROBE_TIMEOUT, pass_env: Sequence[str] = ()
) -> CheckResult:
    """Passes when ``command`` (run by /bin/sh on this machine) exits 0."""
    what = f"command '{command}'"

    async def probe() -> str | None:
        result = await remote.run(
            ["/bin/sh", "-c", command], ssh=None, timeout=timeout, pass_env=pass_env
        )
        return None if result.ok else f"exit {result.exit_status}: {result.first_error_line()}"

    return await _guard(what, probe, timeout + 1)


async def _check_platform(platform: Platform, target: Target, timeout: float) -> CheckResult:
    what = f"{platform.name} check of {target.name}"

    async def probe() -> str | None:
        return None if await platform.healthy(target) else "not ready yet"

    return await _guard(what, probe, timeout)
