"""Health checks of a started resource, against real listeners on loopback."""

from __future__ import annotations

import asyncio
import functools
import http.server
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest

from tests.peers.ports import free_port
from upsguard.config.resources import ResourceConfig
from upsguard.engine.health import wait_healthy
from upsguard.errors import StepTimeout
from upsguard.models import PlatformName, PowerState, ResourceKind, StopMethod, Target


def aio(fn: Callable[..., Coroutine[Any, Any, None]]) -> Callable[..., None]:
    """Run an async test on a fresh event loop (the project uses no asyncio pytest plugin)."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> None:
        asyncio.run(fn(*args, **kwargs))

    return wrapper


class ReadyAfter:
    """A platform whose own check passes after ``n`` calls (a host vSphere sees connected)."""

    name = PlatformName("bmc")

    def __init__(self, n: int) -> None:
        self.calls = 0
        self.n = n

    async def healthy(self, target: Target) -> bool:
        self.calls += 1
        return self.calls >= self.n

    async def open(self) -> None: ...
    async def close(self) -> None: ...
    async def resolve(self, resource: ResourceConfig, *, direct: bool = False) -> list[Target]:
        return []

    async def power_state(self, target: Target) -> PowerState:
        return PowerState.ON

    async def stop(self, target: Target, method: StopMethod) -> None: ...
    async def start(self, target: Target) -> None: ...
    async def wait_for(self, target: Target, state: PowerState, timeout: float) -> bool:
        return True


TARGET = Target(PlatformName("bmc"), ResourceKind.STORAGE, "nas01")


def resource(**health: Any) -> ResourceConfig:
    health.setdefault("timeout", "2s")
    health.setdefault("interval", "0.05s")
    return ResourceConfig.model_validate(
        {"id": "nas01", "kind": "storage", "platform": "ssh", "health": health}
    )


class _Status(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        code = 200 if self.path == "/ok" else 503
        self.send_response(code)
        self.end_headers()

    def log_message(self, *args: Any) -> None: ...


@pytest.fixture
def http_url() -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


async def _listen_later(port: int, delay: float) -> asyncio.Server:
    await asyncio.sleep(delay)
    return await asyncio.start_server(lambda r, w: w.close(), "127.0.0.1", port)


@aio
async def test_waits_until_the_port_opens() -> None:
    port = free_port()
    opener = asyncio.create_task(_listen_later(port, 0.3))
    await wait_healthy(resource(tcp=f"127.0.0.1:{port}", platform=False), TARGET, ReadyAfter(1))
    server = await opener
    server.close()


@aio
async def test_port_that_never_opens_times_out_naming_resource_and_port() -> None:
    port = free_port()
    res = resource(tcp=f"127.0.0.1:{port}", platform=False, timeout="0.5s")
    with pytest.raises(StepTimeout) as err:
        await wait_healthy(res, TARGET, ReadyAfter(1))
    message = str(err.value)
    assert "nas01" in message and f"tcp 127.0.0.1:{port}" in message
    assert "refused" in message.lower()
    assert "\n" not in message


@aio
async def test_http_must_answer_2xx(http_url: str) -> None:
    await wait_healthy(resource(http=f"{http_url}/ok", platform=False), TARGET, ReadyAfter(1))
    with pytest.raises(StepTimeout, match="HTTP 503"):
        await wait_healthy(
            resource(http=f"{http_url}/down", platform=False, timeout="0.3s"),
            TARGET,
            ReadyAfter(1),
        )


@aio
async def test_command_must_exit_zero(tmp_path: Any) -> None:
    flag = tmp_path / "ready"
    res = resource(command=f"test -e {flag}", platform=False)

    async def create_later() -> None:
        await asyncio.sleep(0.3)
        flag.write_text("")

    maker = asyncio.create_task(create_later())
    await wait_healthy(res, TARGET, ReadyAfter(1))
    await maker
    with pytest.raises(StepTimeout, match="exit 1"):
        await wait_healthy(
            resource(command="exit 1", platform=False, timeout="0.2s"), TARGET, ReadyAfter(1)
        )


@aio
async def test_platform_check_and_port_must_pass_together(http_url: str) -> None:
    platform = ReadyAfter(4)
    await wait_healthy(resource(http=f"{http_url}/ok"), TARGET, platform)
    assert platform.calls == 4


@aio
async def test_platform_never_ready_is_named() -> None:
    with pytest.raises(StepTimeout, match=r"bmc check of nas01 \(not ready yet\)"):
        await wait_healthy(resource(timeout="0.2s"), TARGET, ReadyAfter(10_000))


@aio
async def test_without_health_block_only_the_platform_is_asked() -> None:
    res = ResourceConfig.model_validate({"id": "nas01", "kind": "storage", "platform": "ssh"})
    platform = ReadyAfter(1)
    await asyncio.wait_for(wait_healthy(res, TARGET, platform), 30)
    assert platform.calls == 1


@aio
async def test_unknown_host_name_says_it_cannot_be_resolved() -> None:
    res = resource(tcp="no-such-host.invalid:2049", platform=False, timeout="0.1s")
    with pytest.raises(StepTimeout, match=r"cannot resolve no-such-host\.invalid"):
        await wait_healthy(res, TARGET, ReadyAfter(1))
