"""STARTTLS to Debian's upsd (built with NSS: its certificate lives in an NSS database)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from tests.peers.nut import ON_LINE, NutServer, make_ca_and_server_cert
from upsguard.clock import SystemClock
from upsguard.config.ups import UpsConfig
from upsguard.errors import UpsUnreachable
from upsguard.models import UpsReading
from upsguard.plugins.ups.nut import NutSource

pytestmark = pytest.mark.nut


def _read(config: UpsConfig) -> UpsReading:
    async def scenario() -> UpsReading:
        source = NutSource(config, SystemClock())
        try:
            return await source.read()
        finally:
            await source.close()

    return asyncio.run(scenario())


@pytest.fixture
def tls_server(nut_factory: Any) -> NutServer:
    server: NutServer = nut_factory({"ups1": ON_LINE}, ext="dev", tls=True)
    return server


def test_starttls_with_verified_certificate_reads_and_logs_in(tls_server: NutServer) -> None:
    config = tls_server.ups_config(
        "ups1",
        starttls=True,
        ca_file=tls_server.ca_file,
        user="mon",
        password_file=tls_server.password_file("mon"),
        monitor="secondary",
    )
    assert _read(config).on_line


def test_starttls_refuses_a_certificate_from_another_ca(
    tls_server: NutServer, tmp_path: Path
) -> None:
    other_ca, _ = make_ca_and_server_cert(tmp_path)
    config = tls_server.ups_config("ups1", starttls=True, ca_file=other_ca)
    with pytest.raises(UpsUnreachable) as info:
        _read(config)
    assert "TLS certificate we do not trust" in str(info.value)
    assert "\n" not in str(info.value)


def test_starttls_to_a_upsd_without_tls_is_a_clear_error(nut_pair: NutServer) -> None:
    config = nut_pair.ups_config("ups1", starttls=True)
    with pytest.raises(UpsUnreachable) as info:
        _read(config)
    assert "does not offer STARTTLS" in str(info.value)
