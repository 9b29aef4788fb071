"""NutSource and UpsWatch against Debian's real upsd and dummy-ups on loopback."""

from __future__ import annotations

import asyncio
import itertools
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from tests.peers.nut import ON_LINE, NutPool, NutServer
from upsguard.clock import SystemClock
from upsguard.errors import AuthenticationError, PermanentError
from upsguard.models import LinkState, UpsFlag, UpsReading
from upsguard.plugins.ups.nut import NutSource
from upsguard.plugins.ups.nut_client import NutClient
from upsguard.policies.watch import UpsWatch

pytestmark = pytest.mark.nut
T = TypeVar("T")

OUTAGE_SEQ = """\
ups.status: OL
battery.charge: 100
battery.runtime: 1800
ups.load: 40
input.voltage: 230
TIMER 2
ups.status: OB DISCHRG
battery.charge: 80
battery.runtime: 900
input.voltage: 0
TIMER 2
ups.status: OB DISCHRG
battery.charge: 60
battery.runtime: 600
TIMER 2
ups.status: OB LB
battery.charge: 30
battery.runtime: 200
TIMER 2
"""
CYCLE: list[tuple[str, float | None]] = [
    ("OL", 100.0),
    ("DISCHRG OB", 80.0),
    ("DISCHRG OB", 60.0),
    ("LB OB", 30.0),
]


def _state(reading: UpsReading) -> tuple[str, float | None]:
    return " ".join(sorted(f.value for f in reading.flags)), reading.charge_pct


async def _poll_until(
    poll: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float = 20.0
) -> T:
    deadline = time.monotonic() + timeout
    while True:
        value = await poll()
        if done(value) or time.monotonic() > deadline:
            return value
        await asyncio.sleep(0.2)


def test_outage_sequence_is_read_in_order(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": OUTAGE_SEQ})

    async def scenario() -> tuple[list[tuple[str, float | None]], UpsWatch]:
        watch = UpsWatch(NutSource(server.ups_config("ups1"), SystemClock()), SystemClock())
        seen: list[tuple[str, float | None]] = []
        deadline = time.monotonic() + 30
        # Two full cycles of states, read every 0.25 s while the driver moves every 2 s.
        while len(seen) < 2 * len(CYCLE) + 1 and time.monotonic() < deadline:
            reading = await watch.poll()
            assert reading.link is LinkState.OK
            if not seen or seen[-1] != _state(reading):
                seen.append(_state(reading))
            await asyncio.sleep(0.25)
        await watch.source.close()
        return seen, watch

    seen, watch = asyncio.run(scenario())
    assert len(seen) >= 2 * len(CYCLE) + 1, seen
    start = CYCLE.index(seen[0])
    expected = [CYCLE[(start + i) % len(CYCLE)] for i in range(len(seen))]
    assert seen == expected
    assert watch.last is not None and watch.last.input_voltage is not None


def test_watch_sees_observed_depletion_faster_than_the_ups_says(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": OUTAGE_SEQ})

    async def scenario() -> UpsWatch:
        source = NutSource(server.ups_config("ups1"), SystemClock())
        watch = UpsWatch(source, SystemClock(), min_span_s=2.0)
        await _poll_until(watch.poll, lambda r: r.on_line)  # a whole outage from its start
        await _poll_until(watch.poll, lambda r: r.charge_pct == 30.0)
        await watch.source.close()
        return watch

    watch = asyncio.run(scenario())
    # The script drops 70 % of charge in about 6 s: far faster than the 200 s the UPS claims.
    assert watch.depletion_pct_per_min is not None and watch.depletion_pct_per_min > 100
    assert watch.observed_runtime_s is not None and watch.observed_runtime_s < 200
    assert watch.runtime_s() == watch.observed_runtime_s


def test_killed_driver_reads_stale_then_recovers(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev")

    async def scenario() -> tuple[UpsReading, UpsReading, UpsReading]:
        clock = SystemClock()
        watch = UpsWatch(NutSource(server.ups_config("ups1"), clock), clock)
        first = await watch.poll()
        server.kill_driver("ups1")
        stale = await _poll_until(watch.poll, lambda r: r.link is LinkState.STALE)
        server.start_driver("ups1")
        back = await _poll_until(watch.poll, lambda r: r.link is LinkState.OK, timeout=30)
        await watch.source.close()
        return first, stale, back

    first, stale, back = asyncio.run(scenario())
    assert first.on_line
    assert stale.link is LinkState.STALE and not stale.on_line
    assert stale.charge_pct == 100.0  # the last known values, kept for the policy layer
    assert back.on_line


def test_upsd_killed_reads_lost_with_age_then_recovers(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev")

    async def scenario() -> tuple[UpsReading, UpsReading, UpsReading, str | None]:
        clock = SystemClock()
        watch = UpsWatch(NutSource(server.ups_config("ups1"), clock), clock)
        await watch.poll()
        server.kill_upsd()
        lost = await _poll_until(watch.poll, lambda r: r.link is LinkState.LOST)
        await asyncio.sleep(1.0)
        later = await watch.poll()
        error = watch.last_error
        server.start_upsd()
        back = await _poll_until(watch.poll, lambda r: r.link is LinkState.OK, timeout=30)
        await watch.source.close()
        return lost, later, back, error

    lost, later, back, error = asyncio.run(scenario())
    assert lost.link is LinkState.LOST and not lost.on_line
    assert lost.charge_pct == 100.0 and lost.runtime_s == 1800.0
    assert later.age_s > lost.age_s >= 0
    assert error is not None and "upsd 127.0.0.1" in error and "\n" not in error
    assert back.on_line and back.link is LinkState.OK


def test_wrong_password_is_one_clear_line(nut_pair: NutServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.pw"
    bad.write_text("not-the-password\n")
    config = nut_pair.ups_config("ups1", "rack-a", user="mon", password_file=bad)

    async def scenario() -> None:
        source = NutSource(config, SystemClock())
        try:
            await source.read()
        finally:
            await source.close()

    with pytest.raises(AuthenticationError) as info:
        asyncio.run(scenario())
    message = str(info.value)
    assert "\n" not in message
    assert "rack-a" in message and "'mon'" in message and "ACCESS-DENIED" in message
    assert "not-the-password" not in message


def test_right_password_from_environment_reads(
    nut_pair: NutServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("UPSGUARD_TEST_NUT_PW", "mon-secret")
    config = nut_pair.ups_config("ups1", user="mon", password_env="UPSGUARD_TEST_NUT_PW")

    async def scenario() -> UpsReading:
        source = NutSource(config, SystemClock())
        try:
            return await source.read()
        finally:
            await source.close()

    assert asyncio.run(scenario()).on_line


def test_each_source_keeps_one_connection_until_closed(nut_pair: NutServer) -> None:
    """Like upsmon's one connection per MONITOR line: reads reuse it, close() ends it."""

    async def scenario() -> tuple[list[UpsReading], int, int]:
        clock = SystemClock()
        sources = [NutSource(nut_pair.ups_config(n), clock) for n in ("ups1", "ups2")]
        readings: list[UpsReading] = []
        for _ in range(3):
            readings += await asyncio.gather(*(s.read() for s in sources))
        while_reading = nut_pair.connections()
        for source in sources:
            await source.close()
        return readings, while_reading, nut_pair.connections()

    readings, while_reading, after_close = asyncio.run(scenario())
    assert [r.ups for r in readings[:2]] == ["ups1", "ups2"]
    assert [r.load_pct for r in readings[:2]] == [35.0, 60.0]
    assert all(r.on_line for r in readings)
    assert (while_reading, after_close) == (2, 0)


def test_secondary_monitor_sees_fsd_set_by_primary(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev")
    config = server.ups_config(
        "ups1", user="mon", password_file=server.password_file("mon"), monitor="secondary"
    )

    async def scenario() -> tuple[UpsReading, UpsReading]:
        source = NutSource(config, SystemClock())
        before = await source.read()
        primary = await NutClient.connect("127.0.0.1", server.port, 5.0)
        await primary.authenticate("admin", "admin-secret")
        await primary.login("ups1", primary=True)
        await primary.simple("FSD", "ups1")
        await primary.close()
        after = await _poll_until(source.read, lambda r: UpsFlag.FSD in r.flags)
        await source.close()
        return before, after

    before, after = asyncio.run(scenario())
    assert not before.forced_shutdown
    assert after.forced_shutdown


def test_instant_command_sets_the_delay_first(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev")
    config = server.ups_config(
        "ups1",
        entry={"at_shutdown_end": {"command": "load.off", "delay": "90s"}},
        user="admin",
        password_file=server.password_file("admin"),
    )

    async def scenario() -> None:
        source = NutSource(config, SystemClock())
        await source.command("load.off")
        with pytest.raises(PermanentError, match=r"shutdown\.return"):
            await source.command("shutdown.return")
        await source.close()

    asyncio.run(scenario())
    deadline = time.monotonic() + 10
    while server.get("ups1", "ups.delay.shutdown") != "90" and time.monotonic() < deadline:
        time.sleep(0.2)  # upsd answers OK to SET before the driver has applied it
    assert server.get("ups1", "ups.delay.shutdown") == "90"


def test_frozen_driver_is_stale(nut_factory: Any) -> None:
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev", maxage=3)

    async def scenario() -> UpsReading:
        source = NutSource(server.ups_config("ups1"), SystemClock())
        server.signal_driver("ups1", signal.SIGSTOP)
        try:
            return await _poll_until(source.read, lambda r: r.link is LinkState.STALE)
        finally:
            server.signal_driver("ups1", signal.SIGCONT)
            await source.close()

    stale = asyncio.run(scenario())
    assert stale.link is LinkState.STALE and stale.raw.get("nut.error") == "DATA-STALE"


def test_primary_monitor_logs_in_and_reads(nut_pair: NutServer) -> None:
    config = nut_pair.ups_config(
        "ups2", user="admin", password_file=nut_pair.password_file("admin"), monitor="primary"
    )

    async def scenario() -> tuple[UpsReading, list[str]]:
        source = NutSource(config, SystemClock())
        reading = await source.read()
        lister = await NutClient.connect("127.0.0.1", nut_pair.port, 5.0)
        clients = await lister.list_items("CLIENT", "ups2")
        await source.close()
        await lister.close()
        return reading, clients

    reading, clients = asyncio.run(scenario())
    assert reading.on_line and clients == ["127.0.0.1"]


def test_an_unreachable_upsd_is_one_error_however_often_it_is_polled(nut_factory: Any) -> None:
    """The log and the notifier hear of a lost upsd once, not once a poll: the backoff's
    "next try in N s" must not make each poll's error look new."""
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev")

    async def scenario() -> list[str | None]:
        clock = SystemClock()
        watch = UpsWatch(NutSource(server.ups_config("ups1"), clock), clock)
        await watch.poll()
        server.kill_upsd()
        errors = []
        for _ in range(12):
            await watch.poll()
            errors.append(watch.last_error)
            await asyncio.sleep(0.1)
        await watch.source.close()
        return errors

    errors = asyncio.run(scenario())
    changes = [b for a, b in itertools.pairwise(errors) if a != b]
    assert len(changes) <= 1  # the connection closed, then refused: two facts, no more
    assert all(e is not None and "next try" not in e for e in errors)


def test_a_server_whose_upsd_a_test_killed_is_never_handed_to_another_test(
    nut_pool: NutPool,
) -> None:
    """Started again, such a server looked well and went back to the session's pool; its
    dummy-ups, still holding the killed upsd's socket, aborted at a later write, in the middle
    of the next test that took it (``ERR DRIVER-NOT-CONNECTED``; the driver's log: "bit out
    of range 0 - FD_SETSIZE")."""
    first = nut_pool.take({"ups1": ON_LINE}, "dev", 5, False, {})
    first.kill_upsd()
    first.start_upsd()
    nut_pool.give_back(first)
    second = nut_pool.take({"ups1": ON_LINE}, "dev", 5, False, {})
    nut_pool.give_back(second)
    assert second is not first
    assert not first.alive()  # stopped, not left running
