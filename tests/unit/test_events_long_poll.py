"""``GET /events?after=<last>&wait=N`` on an idle service waits for the next journaled event.

A client (``upsguard events --follow``, the coming web page) long-polls for what is new;
an answer with no events makes it ask again at once. The service talks to itself all the
time (a reading every poll), and none of that is a journaled event: the long-poll must not
answer until a line is added to the journal's event stream, then answer with that line.
The service here is real, in this process, with its API on a unix socket; nothing waits
on the wall clock: polls are made on demand and the long-poll's ``wait`` is never reached.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from pathlib import Path
from typing import Any

import aiohttp

from upsguard.config.site import SiteConfig
from upsguard.controller.service import Service
from upsguard.events import Notice


def site(tmp_path: Path) -> SiteConfig:
    return SiteConfig.model_validate(
        {
            "site": "idle",
            "journal": str(tmp_path / "journal.sqlite"),
            "service": {"socket": str(tmp_path / "upsguard.sock")},
            "ups": [{"name": "ups1", "simulated": {}}],
            "resources": [{"id": "core-sw", "kind": "switch"}],
            "policies": {"poll_interval": "1h"},  # polls only when the test asks
        }
    )


async def until(check: Callable[[], bool], what: str) -> None:
    for _ in range(2000):
        if check():
            return
        await asyncio.sleep(0.005)
    raise AssertionError(f"gave up waiting for {what}")


def test_an_idle_long_poll_waits_for_the_next_journaled_event(tmp_path: Path) -> None:
    config = site(tmp_path)

    async def scenario() -> None:
        service = Service(config)
        stop = asyncio.Event()
        await service.open()
        serving = asyncio.create_task(service.serve(stop))
        connector = aiohttp.UnixConnector(path=str(config.service.socket))
        try:
            async with aiohttp.ClientSession(connector=connector) as client:

                async def get(target: str) -> Any:
                    async with client.get(f"http://localhost{target}") as response:
                        assert response.status == 200, await response.text()
                        return await response.json()

                await until(config.service.socket.exists, "the API socket")
                await until(lambda: service.ticks >= 1, "the first poll")
                last = (await get("/events?after=0"))["last"]

                waiting = asyncio.create_task(get(f"/events?after={last}&wait=60"))
                for _ in range(3):  # readings, and nothing the journal tells as an event
                    await service.poll_now()
                    assert (await get("/status"))["phase"] == "normal"
                    await asyncio.sleep(0)
                    assert not waiting.done(), f"answered with nothing new: {waiting.result()}"

                service.bus(Notice(service.clock.now(), "the test's own notice"))
                answer = await asyncio.wait_for(waiting, 30)
                assert [e["text"] for e in answer["events"]] == ["the test's own notice"]
                assert answer["last"] == answer["events"][0]["id"] > last
        finally:
            stop.set()
            await serving
            await service.close()

    asyncio.run(scenario())
