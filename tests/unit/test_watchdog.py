"""systemd's watchdog (``WatchdogSec=`` in the unit): the power watch tells systemd it is
alive (``WATCHDOG=1`` on ``NOTIFY_SOCKET``) at least every half ``WATCHDOG_USEC``, while it
polls and while a run is under way; a power watch wedged in a poll stops telling it, so
systemd restarts the service (whose journal resumes the run). On the virtual clock, with the
test's own datagram socket standing in for systemd's.

Defect this reproduces (it failed before the fix): the unit had no watchdog and the service
never sent ``WATCHDOG=1``: a power watch stuck for good left a service that looked alive and
watched nothing.
"""

from __future__ import annotations

import asyncio
import itertools
import socket
import tempfile
from collections.abc import Awaitable, Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path

import pytest

from tests.sites import simple_site, site_from
from upsguard.clock import LoopClock, run_virtual
from upsguard.controller.service import Service
from upsguard.models import Direction

ORIGIN = datetime(2026, 12, 1, 3, 0, tzinfo=UTC)
WATCHDOG_S = 20.0
"""``WatchdogSec=`` as the test's systemd has it: a pet is due every 10 s."""


@pytest.fixture
def systemd(monkeypatch: pytest.MonkeyPatch) -> Iterator[socket.socket]:
    """systemd's notification socket: what the service sends arrives here."""
    with tempfile.TemporaryDirectory(prefix="sd") as folder:  # a short path: sun_path
        path = str(Path(folder) / "notify")
        with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as sock:
            sock.bind(path)
            sock.setblocking(False)
            monkeypatch.setenv("NOTIFY_SOCKET", path)
            monkeypatch.setenv("WATCHDOG_USEC", str(int(WATCHDOG_S * 1_000_000)))
            monkeypatch.delenv("WATCHDOG_PID", raising=False)
            yield sock


def heard(sock: socket.socket) -> list[bytes]:
    said = []
    while True:
        try:
            said.append(sock.recv(4096))
        except BlockingIOError:
            return said


Story = Callable[[Service], Awaitable[None]]


def pets_during(
    tmp_path: Path, sock: socket.socket, story: Story, poll_interval: str = "5s"
) -> list[float]:
    """The virtual times (seconds since the watch started) at which ``WATCHDOG=1`` arrived
    while the power watch polled and ``story`` was told, read each second."""
    data = simple_site(poll_interval=poll_interval)
    data["journal"] = str(tmp_path / "journal.sqlite")
    data["service"] = {"socket": str(tmp_path / "api.sock")}
    site = site_from(tmp_path, data)

    async def scenario() -> list[float]:
        clock = LoopClock(asyncio.get_running_loop(), ORIGIN)
        service = Service(site, clock)
        stop = asyncio.Event()
        pets: list[float] = []

        async def listen() -> None:
            while True:
                pets.extend(clock.monotonic() for m in heard(sock) if m == b"WATCHDOG=1")
                await asyncio.sleep(1)

        try:
            await service.open(resume=False)
            listening = asyncio.create_task(listen())
            watch = asyncio.create_task(service.watch_power(stop))
            await story(service)
            stop.set()
            await watch
            listening.cancel()
        finally:
            await service.close()
        return pets

    return run_virtual(scenario())


def gaps(pets: list[float], start: float, end: float) -> list[float]:
    """The silences between pets from ``start`` to ``end``, both ends counted."""
    inside = [start, *(p for p in pets if start <= p <= end), end]
    return [b - a for a, b in itertools.pairwise(inside)]


@pytest.mark.parametrize("poll_interval", ["5s", "1m"])
def test_the_power_watch_pets_the_watchdog_while_it_polls(
    tmp_path: Path, systemd: socket.socket, poll_interval: str
) -> None:
    """Polling every minute, it pets the watchdog while it waits for the next poll too."""

    async def idle(service: Service) -> None:
        await asyncio.sleep(120)

    pets = pets_during(tmp_path, systemd, idle, poll_interval)
    assert max(gaps(pets, 0, 120)) <= WATCHDOG_S / 2 + 1  # read each second: up to 1 s late


def test_a_wedged_power_watch_stops_petting_and_petting_resumes_once_it_moves(
    tmp_path: Path, systemd: socket.socket
) -> None:
    async def wedged(service: Service) -> None:
        """A poll that cannot go on: it waits for the controller's acts, held for 2 min."""
        await asyncio.sleep(30)
        async with service.controller.between_acts():
            await asyncio.sleep(120)
        await asyncio.sleep(30)

    pets = pets_during(tmp_path, systemd, wedged)
    # the poll due within 5 s of the wedge waits: nothing arrives until the wedge ends
    assert [p for p in pets if 30 + 5 + 1 < p < 150] == []
    assert max(gaps(pets, 0, 30)) <= WATCHDOG_S / 2 + 1
    assert max(gaps(pets, 151, 180)) <= WATCHDOG_S / 2 + 1


def test_the_watchdog_is_petted_while_a_shutdown_run_is_under_way(
    tmp_path: Path, systemd: socket.socket
) -> None:
    spans: list[tuple[float, float]] = []

    async def shutdown(service: Service) -> None:
        await asyncio.sleep(10)
        start = service.clock.monotonic()
        await service.controller.trigger(Direction.SHUTDOWN, None, "the test")
        while service.controller.busy:
            await asyncio.sleep(1)
        spans.append((start, service.clock.monotonic()))

    pets = pets_during(tmp_path, systemd, shutdown)
    ((start, end),) = spans
    assert end - start > 3 * WATCHDOG_S  # the run outlasted the watchdog several times
    assert max(gaps(pets, start, end)) <= WATCHDOG_S / 2 + 1


def test_without_a_watchdog_nothing_is_sent_but_what_systemd_asked_for(
    tmp_path: Path, systemd: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("WATCHDOG_USEC")

    async def idle(service: Service) -> None:
        await asyncio.sleep(60)

    assert pets_during(tmp_path, systemd, idle) == []


def test_a_watchdog_meant_for_another_process_is_not_petted(
    tmp_path: Path, systemd: socket.socket, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``WATCHDOG_PID`` names the process systemd watches (sd_watchdog_enabled(3)): a child
    that inherited the environment is not it."""
    monkeypatch.setenv("WATCHDOG_PID", "1")

    async def idle(service: Service) -> None:
        await asyncio.sleep(60)

    assert pets_during(tmp_path, systemd, idle) == []


def test_the_unit_asks_for_the_watchdog_the_service_pets() -> None:
    """``WatchdogSec=`` only works with the notifications of ``Type=notify`` from the main
    process; a minute leaves room for a poll waiting on a cache's flip (30 s at most)."""
    unit = (Path(__file__).resolve().parents[2] / "config" / "upsguard.service").read_text()
    settings = [line for line in unit.splitlines() if line and not line.startswith("#")]
    assert {"Type=notify", "NotifyAccess=main", "WatchdogSec=60s"} <= set(settings)
