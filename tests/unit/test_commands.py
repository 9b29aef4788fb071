"""The override commands are one set of rules, whoever asks: the local API (the CLI's way
in), the web page and the CLI acting without a service check a request alike, answer it
alike and read the journal's history alike.

Defects these reproduce (each failed before ``controller.commands``):

- a release, trigger or abort with no reason was done through the API and refused by the
  page (``give a reason``), and a reason that was not a string was refused by the API
  (``'reason' must be a string``) but taken by the page as no reason at all;
- ``only: [" "]`` was an unknown resource to the API and the whole site to the page: a
  trigger of one blank name started a shutdown of everything;
- a direction that was not a string was refused by the API as such, and by the page as
  ``trigger: '5' is neither shutdown nor startup``;
- the page answered a request it could not read in plain text, and an override it refused
  in JSON;
- ``upsguard history --format json`` listed the cache operations when the service answered
  and none when it did not (the history was built twice, and one had drifted).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import aiohttp
import pytest
import yaml

from tests.unit.test_web_server import PASSWORDS, Browser, browsers, page, site, site_dict
from upsguard.cli import main
from upsguard.controller.api import ApiServer
from upsguard.controller.service import Service
from upsguard.events import CacheModeChanged
from upsguard.models import CacheMode

Answer = tuple[int, Any]


@contextlib.asynccontextmanager
async def api(service: Service, path: Path) -> AsyncIterator[aiohttp.ClientSession]:
    """The service's local API on ``path``, and a client of it."""
    server = ApiServer(service, path, None)
    await server.start()
    try:
        async with aiohttp.ClientSession(connector=aiohttp.UnixConnector(str(path))) as client:
            yield client
    finally:
        await server.stop()


async def to_api(client: aiohttp.ClientSession, command: str, body: dict[str, Any]) -> Answer:
    async with client.post(f"http://localhost/{command}", json=body) as answer:
        return answer.status, json.loads(await answer.text())


async def to_page(browser: Browser, command: str, body: dict[str, Any]) -> Answer:
    status, text = await browser.send(
        f"/api/{command}", json.dumps({**body, "confirm": True}).encode()
    )
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


WHY: dict[str, Any] = {"reason": "a drill"}

#: Bodies a script may send; each is answered alike by the API and the page.
REQUESTS: dict[str, tuple[str, dict[str, Any]]] = {
    "hold with no reason": ("hold", {}),
    "hold with a reason that is not text": ("hold", {"reason": 5}),
    "release with no reason": ("release", {}),
    "trigger of one blank name": ("trigger", {"direction": "shutdown", "only": [" "], **WHY}),
    "trigger with a direction that is not text": ("trigger", {"direction": 5, **WHY}),
    "trigger of an unknown resource": ("trigger", {"direction": "shutdown", "only": ["x"], **WHY}),
    "abort with no reason": ("abort", {}),
}


@pytest.mark.parametrize("case", REQUESTS)
def test_the_api_and_the_page_answer_the_same_override_alike(tmp_path: Path, case: str) -> None:
    command, body = REQUESTS[case]

    async def scenario() -> tuple[Answer, Answer]:
        async with (
            page(site(tmp_path)) as (service, _, client),
            browsers(client, "127.0.0.2") as [browser],
            api(service, tmp_path / "api.sock") as local,
        ):
            assert await browser.login("ana", PASSWORDS["ana"]) == 303
            from_page = await to_page(browser, command, body)
            service.overrides.release("test", "between the two")
            return await to_api(local, command, body), from_page

    (status, from_api), (page_status, from_page) = asyncio.run(scenario())
    assert page_status == status
    if status >= 400:
        assert from_page == from_api  # the same words, and JSON from both
    else:  # who acted differs (the caller's account, or "ana (web)"); what was done does not
        assert from_page.keys() == from_api.keys()


def test_a_blank_name_in_only_never_widens_a_trigger_to_the_whole_site(tmp_path: Path) -> None:
    async def scenario() -> Answer:
        async with (
            page(site(tmp_path)) as (service, _, client),
            browsers(client, "127.0.0.2") as [browser],
        ):
            assert await browser.login("ana", PASSWORDS["ana"]) == 303
            answer = await to_page(browser, "trigger", REQUESTS["trigger of one blank name"][1])
            assert service.controller.executor is None, "a run was started"
            return answer

    status, answer = asyncio.run(scenario())
    assert status == 400 and answer["error"].startswith("unknown resource")


def test_history_lists_the_same_things_with_and_without_the_service(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Its JSON is the same from the service and from the journal (the journal's left out
    the cache operations), and its text shows them (it showed none: a person could not tell
    when a cache was flipped, nor that a flip failed)."""
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(site_dict(tmp_path, port=1)))

    async def scenario() -> Any:
        service = Service(site(tmp_path, port=1), log_events=False)
        await service.open()
        try:
            at = datetime(2026, 1, 1, tzinfo=UTC)
            service.bus(CacheModeChanged(at, "flash", "esx01", CacheMode.WRITE_THROUGH, True))
            refused = CacheModeChanged(at, "flash", "esx02", CacheMode.WRITE_THROUGH, False, "busy")
            service.bus(refused)
            async with (
                api(service, tmp_path / "api.sock") as local,
                local.get("http://localhost/history?limit=5") as answer,
            ):
                return json.loads(await answer.text())
        finally:
            await service.close()

    from_api = asyncio.run(scenario())
    missing = tmp_path / "no-service.sock"
    assert main(["history", "-c", str(path), "--socket", str(missing), "--format", "json"]) == 0
    from_journal = json.loads(capsys.readouterr().out)
    assert [op["target"] for op in from_api["cache_ops"]] == ["esx02", "esx01"]
    assert from_journal == from_api
    assert main(["history", "-c", str(path), "--socket", str(missing)]) == 0
    out = capsys.readouterr().out
    ops = out[out.index("cache operations:") :].splitlines()[1:]
    assert [line.split("  ", 2)[-1] for line in ops] == [
        "flash/esx01 -> write-through",
        "flash/esx02 -> write-through FAILED: busy",
    ]
