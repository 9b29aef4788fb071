"""Health checks of a started resource, against real listeners on loopback."""

from __future__ import annotations

import asyncio
import base64
import functools
import http.server
import ssl
import threading
from collections.abc import Callable, Coroutine, Iterator
from typing import Any

import pytest
from pydantic import ValidationError

from tests.peers.ports import free_port
from tests.peers.tls import self_signed
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


PASSWORD = "Hq4-health-SECRET"
BASIC = "Basic " + base64.b64encode(f"monitor:{PASSWORD}".encode()).decode()


class _Status(http.server.BaseHTTPRequestHandler):
    """``/ok`` answers 200, ``/basic`` and ``/key`` 200 with the right credentials (else
    401), ``/moved`` redirects to another host; anything else is 503."""

    def do_GET(self) -> None:
        path = self.path.partition("?")[0]
        code = 503
        if path == "/ok":
            code = 200
        elif path == "/basic":
            code = 200 if self.headers.get("Authorization") == BASIC else 401
        elif path == "/key":
            code = 200 if self.headers.get("X-Api-Key") == PASSWORD else 401
        elif path == "/moved":
            code = 302
        self.send_response(code)
        if code == 302:
            self.send_header("Location", "http://sso.example.invalid/login?next=x")
        self.end_headers()

    def log_message(self, *args: Any) -> None: ...


def _serve(tls: ssl.SSLContext | None = None) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Status)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"{'https' if tls else 'http'}://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


@pytest.fixture
def http_url() -> Iterator[str]:
    yield from _serve()


@pytest.fixture
def https_url(tmp_path: Any) -> Iterator[tuple[str, Any]]:
    """An HTTPS server with a self-signed certificate, and that certificate (its CA)."""
    cert, key = self_signed(tmp_path / "tls", "nas01", "nas01")
    tls = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    tls.load_cert_chain(cert, key)
    for url in _serve(tls):
        yield url, cert


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


@aio
async def test_http_logs_in_with_a_password_from_a_file(http_url: str, tmp_path: Any) -> None:
    pw = tmp_path / "nas.pw"
    pw.write_text(PASSWORD + "\n")
    check = {"url": f"{http_url}/basic", "user": "monitor", "password_file": str(pw)}
    await wait_healthy(resource(http=check, platform=False), TARGET, ReadyAfter(1))
    with pytest.raises(StepTimeout, match="HTTP 401"):
        await wait_healthy(
            resource(http=f"{http_url}/basic", platform=False, timeout="0.2s"),
            TARGET,
            ReadyAfter(1),
        )


@aio
async def test_http_sends_a_header_from_a_variable(
    http_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("NAS_API_KEY", PASSWORD)
    check = {"url": f"{http_url}/key", "header": "X-Api-Key", "value_env": "NAS_API_KEY"}
    await wait_healthy(resource(http=check, platform=False), TARGET, ReadyAfter(1))
    monkeypatch.delenv("NAS_API_KEY")
    res = resource(http=check, platform=False, timeout="0.2s")
    with pytest.raises(StepTimeout, match="environment variable NAS_API_KEY is not set") as err:
        await wait_healthy(res, TARGET, ReadyAfter(1))
    assert PASSWORD not in str(err.value)


@aio
async def test_a_failing_url_is_named_without_its_query_values(http_url: str) -> None:
    res = resource(http=f"{http_url}/down?token={PASSWORD}&v=1", platform=False, timeout="0.2s")
    with pytest.raises(StepTimeout) as err:
        await wait_healthy(res, TARGET, ReadyAfter(1))
    message = str(err.value)
    assert f"http {http_url}/down?token=***&v=*** (HTTP 503)" in message
    assert PASSWORD not in message


@aio
async def test_a_redirect_is_not_followed_and_names_its_origin_alone(http_url: str) -> None:
    res = resource(http=f"{http_url}/moved", platform=False, timeout="0.2s")
    with pytest.raises(StepTimeout) as err:
        await wait_healthy(res, TARGET, ReadyAfter(1))
    message = str(err.value)
    assert "HTTP 302, redirected to http://sso.example.invalid (not followed)" in message
    assert "next=" not in message


@aio
async def test_https_is_verified_against_ca_file(https_url: tuple[str, Any]) -> None:
    url, ca = https_url
    await wait_healthy(
        resource(http={"url": f"{url}/ok", "ca_file": str(ca)}, platform=False),
        TARGET,
        ReadyAfter(1),
    )
    with pytest.raises(StepTimeout, match=r"TLS certificate not trusted .*: set ca_file"):
        await wait_healthy(
            resource(http=f"{url}/ok", platform=False, timeout="0.2s"), TARGET, ReadyAfter(1)
        )


@pytest.mark.parametrize(
    ("check", "says"),
    [
        ({"user": "monitor"}, "needs both user and password_file"),
        ({"password_env": "X"}, "needs both user and password_file"),
        ({"header": "X-Api-Key"}, "needs both header (its name) and value_file"),
        ({"header": "Bad: name", "value_env": "X"}, "not a header name"),
        (
            {"user": "m", "password_env": "X", "header": "H", "value_env": "Y"},
            "a header, not both",
        ),
        ({"password": PASSWORD}, "inline 'password' is not accepted"),
    ],
)
def test_http_credentials_are_given_one_way(check: dict[str, Any], says: str) -> None:
    with pytest.raises(ValidationError) as err:
        resource(http={"url": "https://nas01/ready", **check})
    (problem,) = err.value.errors()
    assert says in problem["msg"] and PASSWORD not in problem["msg"]


@aio
async def test_an_unreadable_password_file_is_the_checks_reason(http_url: str) -> None:
    check = {"url": f"{http_url}/basic", "user": "m", "password_file": "/nonexistent"}
    res = resource(http=check, platform=False, timeout="0.2s")
    with pytest.raises(StepTimeout, match=r"health check password: .*/nonexistent"):
        await wait_healthy(res, TARGET, ReadyAfter(1))
