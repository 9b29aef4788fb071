"""NutSource against a raw TCP server on loopback that is not upsd: garbage, huge lines, silence.

Whatever it does, a read ends with one clear ``UpsUnreachable`` line within the configured
timeout (pytest-timeout catches a hang) and buffers at most ``MAX_ANSWER_BYTES``.
"""

from __future__ import annotations

import asyncio
import socket
import socketserver
import threading
import time
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime

import pytest

from upsguard.clock import SystemClock
from upsguard.config.ups import UpsConfig
from upsguard.errors import UpsUnreachable
from upsguard.models import LinkState
from upsguard.plugins.ups.nut import MAX_ANSWER_BYTES, NutSource, served_upses
from upsguard.policies.watch import UpsWatch

pytestmark = [pytest.mark.nut, pytest.mark.timeout(60)]
HUGE_TOTAL = 64 * MAX_ANSWER_BYTES


class BadServer(socketserver.ThreadingTCPServer):
    daemon_threads = True
    allow_reuse_address = True

    def __init__(self, mode: str) -> None:
        self.mode = mode
        self.sent = 0
        self.connections = 0
        self.stop = threading.Event()
        super().__init__(("127.0.0.1", 0), BadHandler)


class BadHandler(socketserver.BaseRequestHandler):
    server: BadServer

    def handle(self) -> None:
        self.server.connections += 1
        sock: socket.socket = self.request
        sock.settimeout(0.2)
        mode = self.server.mode
        if mode == "close":
            return
        try:
            self._serve(sock, mode)
        except OSError:
            return

    def _serve(self, sock: socket.socket, mode: str) -> None:
        while not self.server.stop.is_set():
            try:
                request = sock.recv(4096)
            except TimeoutError:
                continue
            if not request:
                return
            if mode == "garbage":
                sock.sendall(b"\x00\xffHELLO THIS IS NOT NUT\r\n")
            elif mode == "words":
                sock.sendall(b"HELLO, I AM NOT NUT\n")
            elif mode == "escaped":
                name = request.split()[-1].strip(b'"')
                sock.sendall(
                    b"BEGIN LIST VAR " + name + b"\n"
                    b"VAR " + name + b' ups.status "OL"\n'
                    b"VAR " + name + b' ups.model "Smart-UPS \\"1500\\" \\\\ rack"\n'
                    b"END LIST VAR " + name + b"\n"
                )
            elif mode == "bad-list":
                name = request.split()[-1].strip(b'"')
                sock.sendall(
                    b"BEGIN LIST VAR " + name + b"\nnonsense\nEND LIST VAR " + name + b"\n"
                )
            elif mode == "huge":
                chunk = b"A" * 65536
                while self.server.sent < HUGE_TOTAL and not self.server.stop.is_set():
                    sock.sendall(chunk)
                    self.server.sent += len(chunk)
            elif mode == "trickle":
                while not self.server.stop.is_set():
                    sock.sendall(b"B")
                    time.sleep(0.05)
            # "silent": read and never answer


@pytest.fixture
def bad_server(request: pytest.FixtureRequest) -> Iterator[BadServer]:
    server = BadServer(request.param)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server
    server.stop.set()
    server.shutdown()
    server.server_close()


def _config(server: BadServer) -> UpsConfig:
    port = server.server_address[1]
    return UpsConfig.model_validate(
        {"name": "rack-b", "nut": {"port": port, "ups": "ups1", "timeout": "1s"}}
    )


async def _read_twice(config: UpsConfig) -> list[BaseException]:
    source = NutSource(config, SystemClock())
    errors: list[BaseException] = []
    for _ in range(2):
        try:
            await source.read()
        except UpsUnreachable as exc:
            errors.append(exc)
        await asyncio.sleep(0.6)  # past the first backoff
    await source.close()
    return errors


@pytest.mark.parametrize(
    ("bad_server", "words"),
    [
        ("garbage", "bytes that are not NUT"),
        ("words", "not NUT: 'HELLO, I AM NOT NUT'"),
        ("bad-list", "not NUT"),
        ("silent", "did not answer within 1s"),
        ("trickle", "did not answer within 1s"),
        ("huge", f"longer than {MAX_ANSWER_BYTES} bytes"),
        ("close", "closed the connection"),
    ],
    indirect=["bad_server"],
)
def test_bad_server_gives_one_clear_line(bad_server: BadServer, words: str) -> None:
    errors = asyncio.run(_read_twice(_config(bad_server)))
    assert len(errors) == 2
    for error in errors:
        text = str(error)
        assert text.startswith("UPS rack-b: upsd 127.0.0.1:") and words in text, text
        assert "\n" not in text
    if bad_server.mode == "huge":
        # We stopped reading after the cap: the server could not push its 64 MiB.
        assert bad_server.sent < HUGE_TOTAL / 4


@pytest.mark.parametrize(
    ("bad_server", "words"),
    [
        ("words", "not NUT: 'HELLO, I AM NOT NUT'"),
        ("silent", "did not answer within 1s"),
        ("close", "closed the connection"),
    ],
    indirect=["bad_server"],
)
def test_listing_the_upses_of_a_bad_server_gives_one_clear_line(
    bad_server: BadServer, words: str
) -> None:
    """What ``upsguard init`` asks of upsd (``LIST UPS``) fails as a read does."""
    port = bad_server.server_address[1]
    with pytest.raises(UpsUnreachable) as caught:
        asyncio.run(served_upses("127.0.0.1", port, 1.0))
    text = str(caught.value)
    assert text.startswith(f"upsd 127.0.0.1:{port} ") and words in text and "\n" not in text


@pytest.mark.parametrize("bad_server", ["escaped"], indirect=True)
def test_quoted_values_are_unescaped(bad_server: BadServer) -> None:
    async def scenario() -> Mapping[str, str]:
        source = NutSource(_config(bad_server), SystemClock())
        reading = await source.read()
        await source.close()
        return reading.raw

    raw = asyncio.run(scenario())
    assert raw == {"ups.status": "OL", "ups.model": 'Smart-UPS "1500" \\ rack'}


@pytest.mark.parametrize("bad_server", ["garbage"], indirect=True)
def test_watch_turns_a_bad_server_into_lost(bad_server: BadServer) -> None:
    async def scenario() -> LinkState:
        clock = SystemClock()
        watch = UpsWatch(NutSource(_config(bad_server), clock), clock)
        reading = await watch.poll()
        await watch.source.close()
        return reading.link

    assert asyncio.run(scenario()) is LinkState.LOST


@pytest.mark.parametrize("bad_server", ["close"], indirect=True)
def test_failing_server_is_retried_with_backoff(bad_server: BadServer) -> None:
    async def scenario() -> list[str]:
        source = NutSource(_config(bad_server), SystemClock())
        errors = []
        for _ in range(20):  # 2 s of polls every 0.1 s
            try:
                await source.read()
            except UpsUnreachable as exc:
                errors.append(str(exc))
            await asyncio.sleep(0.1)
        await source.close()
        return errors

    errors = asyncio.run(scenario())
    assert len(errors) == 20
    # Tries at 0 s, then after 0.5 s and 1 s more: 3 connections, not 20.
    assert bad_server.connections <= 4
    assert len(set(errors)) == 1  # waiting out the backoff is the same error, not a new one


class SetClock:
    """A clock that moves only when the test says so."""

    def __init__(self) -> None:
        self.at = 1000.0

    def now(self) -> datetime:
        return datetime.fromtimestamp(self.at, UTC)

    def monotonic(self) -> float:
        return self.at


@pytest.mark.parametrize("bad_server", ["close"], indirect=True)
def test_backoff_is_counted_on_the_injected_clock(bad_server: BadServer) -> None:
    async def read(source: NutSource) -> str:
        with pytest.raises(UpsUnreachable) as info:
            await source.read()
        return f"{bad_server.connections} {info.value.retry_after:.1f}"

    async def scenario() -> list[str]:
        clock = SetClock()
        source = NutSource(_config(bad_server), clock)
        seen = [await read(source)]  # tries: the first connection
        clock.at += 0.4
        seen.append(await read(source))  # still waiting: no connection
        clock.at += 0.1
        seen.append(await read(source))  # 0.5 s after the first failure: tries again
        clock.at += 0.9
        seen.append(await read(source))  # the wait doubled to 1 s
        clock.at += 0.1
        seen.append(await read(source))
        await source.close()
        return seen

    seen = asyncio.run(scenario())
    assert [line.split(" ", 1)[0] for line in seen] == ["1", "1", "2", "2", "3"]
    assert seen[1].endswith(" 0.1") and seen[3].endswith(" 0.1")  # retry after 0.1 s more
