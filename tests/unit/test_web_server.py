"""The web page's listener and routes against a hostile client, without a browser: a real
service in this process (simulated UPS and platforms), its page through aiohttp's test
client, or on a real socket on 127.0.0.1 where the listener itself is what is tested.

Nothing waits on the wall clock: a test that needs time to pass for the page passes it on
the ``now`` the page's guards are given.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import re
import socket
import threading
from collections.abc import AsyncIterator, Callable, Coroutine
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml
from aiohttp.test_utils import TestClient, TestServer
from yarl import URL

from upsguard.config.site import SiteConfig
from upsguard.controller.service import Service
from upsguard.controller.web.auth import (
    MAX_DELAY_S,
    SECRET_HEADER,
    SESSION_COOKIE,
    PasswordCheck,
    hash_password,
)
from upsguard.controller.web.live import STREAMS_PER_USER, StreamLimits
from upsguard.controller.web.server import WebServer
from upsguard.events import RunStarted
from upsguard.models import RunId
from upsguard.runs import RunKind, RunOrigin, RunSpec

Client = TestClient[Any, Any]
PASSWORDS = {"ana": "ana's long passphrase", "noc": "noc's passphrase", "vic": "vic's passphrase"}
HASHES = {name: hash_password(pw) for name, pw in PASSWORDS.items()}
ROLES = {"ana": "operator", "noc": "viewer", "vic": "viewer"}
SECRET = "the proxy's own secret, long enough"


def users(roles: dict[str, str] | None = None) -> list[dict[str, str]]:
    return [
        {"name": name, "role": role, "password_hash": HASHES[name]}
        for name, role in (roles or ROLES).items()
    ]


def site_dict(tmp_path: Path, **web: Any) -> dict[str, Any]:
    return {
        "site": "web-unit",
        "journal": str(tmp_path / "journal.sqlite"),
        "service": {"socket": str(tmp_path / "upsguard.sock")},
        "ups": [{"name": "ups1", "simulated": {}}],
        "resources": [{"id": "core-sw", "kind": "switch"}],
        "policies": {"poll_interval": "1h"},
        "web": {"port": 1, "users": users(), **web},
    }


def site(tmp_path: Path, **web: Any) -> SiteConfig:
    return SiteConfig.model_validate(site_dict(tmp_path, **web))


@contextlib.asynccontextmanager
async def opened(config: SiteConfig) -> AsyncIterator[Service]:
    service = Service(config, log_events=False)
    await service.open()
    try:
        yield service
    finally:
        await service.close()


@dataclass
class FakeClock:
    """The login throttle's monotonic clock: time passes when the test says so."""

    now: float = 1000.0

    def __call__(self) -> float:
        return self.now


@contextlib.asynccontextmanager
async def page(
    config: SiteConfig, clock: FakeClock | None = None, **options: Any
) -> AsyncIterator[tuple[Service, WebServer, Client]]:
    """The page's application behind aiohttp's test server, with its service; ``options``:
    the server's (its wall clock, its stream limits)."""
    assert config.web is not None
    async with opened(config) as service:
        server = WebServer(service, config.web, monotonic=clock or FakeClock(), **options)
        client: Client = TestClient(TestServer(server.application()))
        await client.start_server()
        try:
            yield service, server, client
        finally:
            server.feed.close()  # the live streams a failed test left open end
            await client.close()


def run(scenario: Callable[[], Coroutine[Any, Any, None]]) -> None:
    asyncio.run(scenario())


# -- the listener -------------------------------------------------------------------------


async def connect(port: int) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", port)


async def exchange(port: int, request: bytes) -> bytes:
    """Send ``request`` on a new connection and read until the server closes it."""
    reader, writer = await connect(port)
    try:
        writer.write(request)
        return await asyncio.wait_for(reader.read(), 30)
    finally:
        writer.close()


def get(path: str) -> bytes:
    return f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n".encode()


@contextlib.asynccontextmanager
async def listening(tmp_path: Path, max_connections: int) -> AsyncIterator[WebServer]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = site(tmp_path, port=port)
    assert config.web is not None
    async with opened(config) as service:
        server = WebServer(service, config.web, max_connections=max_connections)
        await server.start()
        try:
            yield server
        finally:
            await server.stop()


def test_past_its_ceiling_the_listener_closes_new_connections_before_reading_them(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with listening(tmp_path, max_connections=4) as server:
            port = server.config.port
            idle = [await connect(port) for _ in range(4)]  # connected, never a byte sent
            door = server.door
            assert door is not None
            for _ in range(100):
                if door.open == 4:
                    break
                await asyncio.sleep(0.01)
            assert door.open == 4
            assert await exchange(port, get("/login")) == b""  # closed without an answer
            assert door.refused == 1
            for _, writer in idle:
                writer.close()
            for _ in range(100):
                if door.open == 0:
                    break
                await asyncio.sleep(0.01)
            answer = await exchange(port, get("/login"))
            assert answer.startswith(b"HTTP/1.1 200 "), answer[:200]

    run(scenario)


def test_http_a_stranger_gets_wrong_is_a_400_and_no_traceback_in_the_log(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with listening(tmp_path, max_connections=8) as server:
            port = server.config.port
            garbage = await exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nBad Header\r\n\r\n")
            assert re.match(rb"HTTP/1.\d 400 ", garbage), garbage[:200]
            huge = await exchange(port, b"GET /" + b"a" * 20_000 + b" HTTP/1.1\r\n\r\n")
            assert re.match(rb"HTTP/1.\d 4\d\d ", huge), huge[:200]
            answer = await exchange(port, get("/login"))
            assert answer.startswith(b"HTTP/1.1 200 ")

    caplog.set_level(logging.DEBUG, logger="aiohttp")
    run(scenario)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]


# -- logging in ---------------------------------------------------------------------------


class Browser:
    """One browser on its own loopback address (127.0.0.N: the page sees N's address), with
    its cookies; ``forwarded`` is the client address a trusted proxy would name."""

    def __init__(
        self,
        client: Client | str,
        address: str = "127.0.0.1",
        forwarded: str = "",
        proxy_secret: str = "",
    ) -> None:
        """``proxy_secret``: what the proxy sends with ``forwarded``, when it is the proxy."""
        self.base = URL(client) if isinstance(client, str) else client.make_url("")
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(local_addr=(address, 0), limit=0),
            cookie_jar=aiohttp.CookieJar(unsafe=True),  # cookies for a numeric host
        )
        self.headers = {"X-Forwarded-For": forwarded} if forwarded else {}
        self.streams: list[aiohttp.ClientResponse] = []
        if proxy_secret:
            self.headers[SECRET_HEADER] = proxy_secret

    async def close(self) -> None:
        for stream in self.streams:
            stream.close()
        await self.session.close()

    async def login(self, name: str, password: str) -> int:
        """The login form, filled: the status of its POST (303 in, 401 wrong, 429 wait)."""
        async with self.session.get(self.base.join(URL("/login"))) as form:
            token = re.search(r'name="csrf" value="([^"]+)"', await form.text())
        assert token is not None
        data = {"name": name, "password": password, "csrf": token.group(1), "next": "/"}
        async with self.session.post(
            self.base.join(URL("/login")), data=data, headers=self.headers, allow_redirects=False
        ) as answer:
            return answer.status

    def cookie(self, name: str) -> str:
        return next((c.value for c in self.session.cookie_jar if c.key == name), "")

    async def stream(self) -> aiohttp.ClientResponse:
        """A live stream, open (its status read, when it is 200) until the browser closes."""
        answer = await self.session.get(self.base.join(URL("/api/stream")))
        self.streams.append(answer)
        if answer.status == 200:
            while b"event: status" not in await answer.content.readuntil(b"\n\n"):
                pass
        return answer

    async def refused(self) -> tuple[int, str]:
        """A live stream that should be refused: its status and text (a stream opened:
        200, and no text)."""
        answer = await self.stream()
        return answer.status, "" if answer.status == 200 else await answer.text()

    async def status_of(self, path: str) -> int:
        async with self.session.get(self.base.join(URL(path)), allow_redirects=False) as answer:
            return answer.status

    async def act(self, path: str, body: dict[str, Any]) -> int:
        """A control as the page sends it, with the CSRF token the page carries."""
        return (await self.send(path, json.dumps(body).encode()))[0]

    async def send(
        self, path: str, body: bytes, headers: dict[str, str] | None = None
    ) -> tuple[int, str]:
        """A POST of ``body`` with the page's CSRF token (and ``headers``): its status and
        text."""
        async with self.session.get(self.base.join(URL("/"))) as overview:
            token = re.search(r'name="csrf-token" content="([^"]+)"', await overview.text())
        assert token is not None
        headers = {
            "X-CSRF-Token": token.group(1),
            "Content-Type": "application/json",
            **(headers or {}),
        }
        url = self.base.join(URL(path))
        async with self.session.post(url, data=body, headers=headers) as answer:
            return answer.status, await answer.text()


@contextlib.asynccontextmanager
async def browsers(client: Client, *addresses: str) -> AsyncIterator[list[Browser]]:
    opened = [Browser(client, address) for address in addresses or ("127.0.0.1",)]
    try:
        yield opened
    finally:
        for browser in opened:
            await browser.close()


async def guesses(browser: Browser, clock: FakeClock, count: int) -> list[int]:
    """``count`` wrong passwords for ana, each once the wait of the one before is over."""
    statuses = []
    for _ in range(count):
        statuses.append(await browser.login("ana", "guess"))
        clock.now += MAX_DELAY_S
    clock.now -= MAX_DELAY_S  # the last one's wait is still on
    return statuses


def test_parallel_wrong_passwords_for_one_name_are_checked_once(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with page(site(tmp_path)) as (_, _, client), browsers(client, "127.0.0.2") as [b]:
            tries = [b.login("ana", f"guess {i}") for i in range(12)]
            statuses = sorted(await asyncio.gather(*tries))
            assert statuses == [401] + [429] * 11

    run(scenario)


def test_failures_from_one_address_never_refuse_the_right_password_from_another(
    tmp_path: Path,
) -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with (
            page(site(tmp_path), clock) as (_, _, client),
            browsers(client, "127.0.0.2", "127.0.0.3") as [mallory, ana],
        ):
            assert await guesses(mallory, clock, 3) == [401] * 3
            assert await mallory.login("noc", PASSWORDS["noc"]) == 429  # the address waits
            assert await ana.login("ana", PASSWORDS["ana"]) == 303

    run(scenario)


def proxied(tmp_path: Path, **web: Any) -> SiteConfig:
    """A site whose page sits behind a proxy on 127.0.0.1 that sends ``SECRET``."""
    secret = tmp_path / "proxy.secret"
    secret.write_text(SECRET + "\n")
    secret.chmod(0o600)
    return site(tmp_path, proxy={"trusted": ["127.0.0.1"], "secret_file": str(secret)}, **web)


def test_behind_a_trusted_proxy_each_forwarded_client_waits_for_its_own_failures(
    tmp_path: Path,
) -> None:
    clock = FakeClock()

    async def scenario() -> None:
        async with page(proxied(tmp_path), clock) as (_, _, client):
            mallory = Browser(client, "127.0.0.1", "192.0.2.66", SECRET)
            ana = Browser(client, "127.0.0.1", "10.1.1.1, 192.0.2.7", SECRET)
            stranger = Browser(client, "127.0.0.9", forwarded="192.0.2.7")  # not the proxy
            local = Browser(client, "127.0.0.1", forwarded="192.0.2.7")  # without its secret
            try:
                assert await guesses(mallory, clock, 3) == [401] * 3
                assert await guesses(local, clock, 3) == [401] * 3  # counted on 127.0.0.1
                assert await ana.login("ana", PASSWORDS["ana"]) == 303
                assert await mallory.login("ana", PASSWORDS["ana"]) == 429
                assert await stranger.login("noc", "guess") == 401
                assert await stranger.login("noc", PASSWORDS["noc"]) == 429  # its own address
            finally:
                for browser in (mallory, ana, stranger, local):
                    await browser.close()

    run(scenario)


def test_a_local_process_naming_a_user_without_the_proxy_secret_is_a_stranger(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with page(proxied(tmp_path)) as (_, _, client):
            claims = {"X-Remote-User": "ana"}
            answer = await client.get("/api/status", headers=claims)
            assert (answer.status, await answer.text()) == (401, "log in first")
            for wrong in ("", "guess", SECRET[:-1], SECRET + "x"):
                answer = await client.get("/api/status", headers={**claims, SECRET_HEADER: wrong})
                assert answer.status == 401, wrong
            answer = await client.get("/api/status", headers={**claims, SECRET_HEADER: SECRET})
            assert answer.status == 200

    run(scenario)


def test_a_host_name_the_page_is_not_served_as_is_refused(tmp_path: Path) -> None:
    """DNS rebinding: a site of the attacker's whose name now resolves to the page's address
    sends the page's own Host and Origin back to it."""

    async def scenario() -> None:
        config = proxied(tmp_path, names=["ups.example.org", "127.0.0.1"])
        async with page(config) as (_, _, client), browsers(client, "127.0.0.1") as [b]:
            assert await b.login("ana", PASSWORDS["ana"]) == 303
            evil = {"Host": "evil.example:8080", "Origin": "http://evil.example:8080"}
            hold = json.dumps({"reason": "rebound", "confirm": True}).encode()
            assert await b.send("/api/hold", hold, evil) == (421, "not a name of this page")
            proxy = {**evil, SECRET_HEADER: SECRET, "X-Remote-User": "ana"}
            assert (await client.get("/api/status", headers=proxy)).status == 421
            assert (await client.get("/login", headers={"Host": "evil.example"})).status == 421
            for name in ("ups.example.org", "UPS.example.org:443", "127.0.0.1:8080"):
                answer = await client.get("/login", headers={"Host": name})
                assert answer.status == 200, name

    run(scenario)


# -- a reload -----------------------------------------------------------------------------


def test_a_reload_takes_users_out_and_roles_away_at_once(tmp_path: Path) -> None:
    """SIGHUP's reload: a viewer taken out of the file is out (their cookie and their
    password), an operator made a viewer may no longer act."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site_dict(tmp_path, port=port)))
    config = site(tmp_path, port=port)

    async def scenario() -> None:
        service = Service(config, log_events=False, site_path=path)
        await service.open()
        stop = asyncio.Event()
        serving = asyncio.create_task(service.serve(stop))
        ana = noc = None
        try:
            base = f"http://127.0.0.1:{port}"
            for _ in range(1000):
                with contextlib.suppress(OSError):
                    (await connect(port))[1].close()
                    break
                await asyncio.sleep(0.01)
            ana, noc = Browser(base), Browser(base)
            assert await ana.login("ana", PASSWORDS["ana"]) == 303
            assert await noc.login("noc", PASSWORDS["noc"]) == 303
            assert await noc.status_of("/api/status") == 200
            hold = {"reason": "before the reload", "confirm": True}
            assert await ana.act("/api/hold", hold) == 200
            assert await ana.act("/api/release", hold) == 200

            path.write_text(yaml.safe_dump(site_dict(tmp_path, port=port, users=users(
                {"ana": "viewer"}))))  # fmt: skip
            await service.reload()
            assert await noc.status_of("/api/status") == 401
            again = Browser(base)
            try:
                assert await again.login("noc", PASSWORDS["noc"]) == 401
            finally:
                await again.close()
            assert await ana.act("/api/hold", hold) == 403
            assert service.status().held is None
        finally:
            for browser in (ana, noc):
                if browser is not None:
                    await browser.close()
            stop.set()
            await serving
            await service.close()

    run(scenario)


def test_a_cookie_kept_after_logout_is_refused(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with page(site(tmp_path)) as (_, _, client), browsers(client, "127.0.0.2") as [b]:
            assert await b.login("ana", PASSWORDS["ana"]) == 303
            kept = b.cookie(SESSION_COOKIE)
            assert await b.act("/logout", {}) == 200
            assert b.cookie(SESSION_COOKIE) == ""
            b.session.cookie_jar.update_cookies({SESSION_COOKIE: kept})
            assert await b.status_of("/api/status") == 401

    run(scenario)


def test_a_body_nested_too_deeply_is_a_400_and_one_quiet_line(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    async def scenario() -> None:
        async with page(site(tmp_path)) as (_, _, client), browsers(client, "127.0.0.2") as [b]:
            assert await b.login("ana", PASSWORDS["ana"]) == 303
            status, text = await b.send("/api/hold", b"[" * 5000)
            assert (status, json.loads(text)) == (
                400,
                {"error": "the body is JSON nested too deeply"},
            )

    caplog.set_level(logging.DEBUG)
    run(scenario)
    assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.WARNING]
    nested = [r for r in caplog.records if "nested too deeply" in r.getMessage()]
    assert len(nested) == 1 and nested[0].levelno == logging.DEBUG


def test_a_proxy_secret_that_cannot_be_read_is_an_alert_and_the_service_watches_on(
    tmp_path: Path,
) -> None:
    config = proxied(tmp_path)
    (tmp_path / "proxy.secret").unlink()

    async def scenario() -> None:
        service = Service(config, log_events=False)
        await service.open()
        stop = asyncio.Event()
        serving = asyncio.create_task(service.serve(stop))
        try:
            said = f"no web page: web.proxy.secret_file {tmp_path / 'proxy.secret'}: No such file"
            for _ in range(1000):
                texts = [e.text for e in service.journal.read.events(after=-50)]
                if any(said in text for text in texts):
                    break
                await asyncio.sleep(0.01)
            assert any(said in text for text in texts), texts
            assert not serving.done()
        finally:
            stop.set()
            await serving
            await service.close()

    run(scenario)


def test_a_viewer_sees_the_program_a_step_runs_not_its_arguments_nor_the_journals_path(
    tmp_path: Path,
) -> None:
    command = "PDU_TOKEN=s3cret /opt/pdu/bin/pductl --user admin --password hunter2"
    pdu = {"id": "pdu", "kind": "command", "platform": "command", "shutdown": command}
    data = site_dict(tmp_path)
    data["resources"].append(pdu)
    config = SiteConfig.model_validate(data)

    async def scenario() -> None:
        async with page(config) as (_, _, client), browsers(client, "127.0.0.2") as [b]:
            assert await b.login("noc", PASSWORDS["noc"]) == 303
            async with b.session.get(b.base.join(URL("/api/plan"))) as answer:
                plan = await answer.text()
            assert answer.status == 200
            (step,) = [s for s in json.loads(plan)["shutdown"]["steps"] if s["resource"] == "pdu"]
            assert step["description"] == "shut down command pdu with 'pductl' via command"
            assert "hunter2" not in plan and "s3cret" not in plan and "/opt/pdu" not in plan
            async with b.session.get(b.base.join(URL("/runs/no-such-run/report"))) as answer:
                assert (answer.status, await answer.text()) == (404, "no report of that run")

    run(scenario)


# -- the live streams ---------------------------------------------------------------------


def test_one_viewer_cannot_take_every_live_stream_nor_the_operators_slots(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with (
            page(site(tmp_path)) as (_, _, client),
            browsers(client, "127.0.0.2") as [noc],
        ):
            assert await noc.login("noc", PASSWORDS["noc"]) == 303
            opened = [await noc.stream() for _ in range(STREAMS_PER_USER)]
            assert [s.status for s in opened] == [200] * STREAMS_PER_USER
            says = f"noc has {STREAMS_PER_USER} live pages open already: close one"
            assert await noc.refused() == (429, says)

    run(scenario)


def test_the_live_streams_viewers_may_not_take_are_kept_for_operators(tmp_path: Path) -> None:
    limits = StreamLimits(total=5, per_user=3, kept_for_operators=2)

    async def scenario() -> None:
        async with (
            page(site(tmp_path), streams=limits) as (_, _, client),
            browsers(client, "127.0.0.2", "127.0.0.3", "127.0.0.4") as [noc, vic, ana],
        ):
            for browser, name in ((noc, "noc"), (vic, "vic"), (ana, "ana")):
                assert await browser.login(name, PASSWORDS[name]) == 303
            opened = [await noc.stream(), await noc.stream(), await vic.stream()]
            assert [s.status for s in opened] == [200] * 3
            says = "the live pages left are kept for operators: try again later"
            assert await vic.refused() == (503, says)
            opened += [await ana.stream(), await ana.stream()]
            assert [s.status for s in opened] == [200] * 5
            assert await ana.refused() == (503, "5 live pages are open already")

    run(scenario)


async def next_status(stream: aiohttp.ClientResponse) -> bytes | None:
    """The next status message the stream sends; None: it ended instead."""
    while True:
        chunk = await asyncio.wait_for(stream.content.readuntil(b"\n\n"), 30)
        if not chunk:
            return None
        if b"event: status" in chunk:
            return chunk


def test_a_live_stream_ends_at_its_next_refresh_once_its_session_is_over(tmp_path: Path) -> None:
    """Logged out, or past the session's lifetime: the stream of that session ends when the
    status is next published; the browser's reconnection then gets the login page."""
    wall = FakeClock(now=1_000_000.0)

    async def scenario() -> None:
        async with (
            page(site(tmp_path, session_lifetime="1h"), wall=wall) as (_, server, client),
            browsers(client, "127.0.0.2", "127.0.0.3") as [ana, noc],
        ):
            assert await ana.login("ana", PASSWORDS["ana"]) == 303
            assert await noc.login("noc", PASSWORDS["noc"]) == 303
            streams = [await ana.stream(), await noc.stream()]
            assert await ana.act("/logout", {}) == 200
            server.feed.publish()
            assert await next_status(streams[0]) is None  # ana's ended
            assert await next_status(streams[1]) is not None
            wall.now += 3600 + 1  # noc's session is past its hour
            server.feed.publish()
            assert await next_status(streams[1]) is None
            assert server.feed.clients == 0

    run(scenario)


# -- headers ------------------------------------------------------------------------------


def test_a_report_runs_no_script_and_the_page_names_no_server_version(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with page(site(tmp_path)) as (service, _, client), browsers(client) as [b]:
            at = datetime(2026, 1, 1, tzinfo=UTC)
            spec = RunSpec(RunId("r1"), RunKind.SHUTDOWN, RunOrigin.POLICY, "low battery", at)
            service.journal.write.record(RunStarted(at, spec, 0))
            assert await b.login("noc", PASSWORDS["noc"]) == 303
            async with b.session.get(b.base.join(URL("/runs/r1/report"))) as answer:
                html = await answer.text()
                assert answer.status == 200 and "<svg" in html
                assert "<script" not in html  # pygal's settings, inert without its library
                policy = answer.headers["Content-Security-Policy"]
                assert "sha256" not in policy and "script-src 'none'" in policy
                assert answer.headers["Server"] == "upsguard"
                assert "Strict-Transport-Security" not in answer.headers  # plain HTTP
            async with b.session.get(b.base.join(URL("/login"))) as answer:
                assert answer.headers["Server"] == "upsguard"

    run(scenario)


def test_a_page_served_over_tls_tells_browsers_to_keep_to_https(tmp_path: Path) -> None:
    tls = {"certificate_file": str(tmp_path / "c.pem"), "key_file": str(tmp_path / "k.pem")}

    async def scenario() -> None:
        async with page(site(tmp_path, tls=tls)) as (_, _, client):
            answer = await client.get("/login")  # the test server itself speaks plain HTTP
            assert answer.headers["Strict-Transport-Security"] == "max-age=31536000"

    run(scenario)


# -- paths and cookies ----------------------------------------------------------------------


def test_only_the_login_itself_is_public_not_every_path_that_begins_like_it(
    tmp_path: Path,
) -> None:
    async def scenario() -> None:
        async with page(site(tmp_path)) as (_, _, client):
            for path in ("/login-admin", "/loginx", "/favicon.ico.bak"):
                answer = await client.get(path, allow_redirects=False)
                assert (answer.status, answer.headers.get("Location")) == (
                    303,
                    f"/login?next={path}",
                ), path
            for path in ("/login", "/favicon.ico", "/static/app.js"):
                assert (await client.get(path, allow_redirects=False)).status in (200, 204), path

    run(scenario)


def test_with_secure_cookies_the_session_cookie_is_a_host_only_one(tmp_path: Path) -> None:
    """``__Host-``: the browser keeps it only if it is Secure, for Path=/, with no Domain, so
    no other host of the domain can set one for the page."""

    async def scenario() -> None:
        async with page(site(tmp_path, secure_cookies=True)) as (_, _, client):
            form = await client.get("/login")
            token = re.search(r'name="csrf" value="([^"]+)"', await form.text())
            assert token is not None
            nonce = form.cookies["upsguard_login"].value
            data = {"name": "ana", "password": PASSWORDS["ana"], "csrf": token.group(1)}
            answer = await client.post(
                "/login",
                data=data,
                cookies={"upsguard_login": nonce},
                allow_redirects=False,
            )
            assert answer.status == 303
            cookies = {c.key: c for c in answer.cookies.values() if c.key != "upsguard_login"}
            device = cookies.pop("upsguard_device")  # this browser logged in before: /login only
            assert device["secure"] and device["httponly"] and device["path"] == "/login"
            (cookie,) = cookies.values()
            assert cookie.key == "__Host-upsguard_session"
            assert cookie["secure"] and cookie["path"] == "/" and not cookie["domain"]
            session = {"__Host-upsguard_session": cookie.value}
            assert (await client.get("/api/status", cookies=session)).status == 200
            plain = {"upsguard_session": cookie.value}
            assert (await client.get("/api/status", cookies=plain)).status == 401

    run(scenario)


def test_a_browser_that_logged_in_before_is_not_queued_behind_fresh_addresses_guesses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The first guess of each fresh address is checked in the lane of addresses with no
    failures, one at a time: behind a spray of fresh addresses, an operator's right password
    waited up to 10.5 s (bench/web.py). A browser that logged in before carries a device
    cookie for that name (signed by the page, as OWASP's device cookies): its logins are
    checked in a lane of their own."""
    entered, held = threading.Event(), threading.Event()
    verify = PasswordCheck._verify

    def held_guess(check: PasswordCheck, stored: str, password: str) -> bool:
        if password == "a guess":
            entered.set()
            held.wait(timeout=60)
        return verify(check, stored, password)

    monkeypatch.setattr(PasswordCheck, "_verify", held_guess)

    async def scenario() -> None:
        async with (
            page(site(tmp_path)) as (_, _, client),
            browsers(client, "127.0.0.3", "127.0.0.4") as [ana, fresh],
        ):
            assert await ana.login("ana", PASSWORDS["ana"]) == 303
            guess = asyncio.create_task(fresh.login("ana", "a guess"))
            assert await asyncio.to_thread(entered.wait, 30), "the guess was never checked"
            try:
                assert await asyncio.wait_for(ana.login("ana", PASSWORDS["ana"]), 30) == 303
            finally:
                held.set()
            assert await guess == 401

    run(scenario)
