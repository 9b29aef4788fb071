"""The service's guard over its long-running loops: every loop is alive, or the process
ends (and systemd starts it again). A loop that fails or ends says so once and stops the
service; one cancelled because the service stops is no failure."""

from __future__ import annotations

import asyncio

from upsguard.controller.supervision import Supervisor


def guarded(loop_body: str) -> tuple[bool, str | None, list[str]]:
    """Run one guarded loop that ends as ``loop_body`` says; what the guard made of it."""

    async def main() -> tuple[bool, str | None, list[str]]:
        stop = asyncio.Event()
        said: list[str] = []
        supervisor = Supervisor(stop, said.append)

        async def loop() -> None:
            if loop_body == "leaked cancellation":  # a library's cancellation, not asked for
                raise asyncio.CancelledError
            await asyncio.Event().wait()

        task = supervisor.start(loop(), "leadership")
        await asyncio.sleep(0)
        if loop_body == "service stops":
            stop.set()
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        return stop.is_set(), supervisor.failed, said

    return asyncio.run(main())


def test_a_loop_ended_by_a_cancellation_nobody_asked_for_stops_the_service() -> None:
    """The leadership loop, ended by a cancellation that leaked out of the store's client,
    died unheard: the guard took any cancellation for the service stopping. The pair's
    standby then never campaigned again nor went on alone, and nothing said so."""
    stopped, failed, said = guarded("leaked cancellation")
    assert stopped
    assert failed == "leadership failed: ended by a cancellation nothing asked for"
    assert said == [f"{failed}: the service stops (systemd starts it again)"]


def test_a_loop_cancelled_because_the_service_stops_is_no_failure() -> None:
    stopped, failed, said = guarded("service stops")
    assert stopped and failed is None and said == []
