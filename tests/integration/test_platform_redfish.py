"""The redfish platform against sushy-tools' Redfish emulator on loopback, over verified TLS.

The emulator's fake driver applies a reset 1 to 11 seconds after it is accepted,
as real hardware does; waits here allow 30 seconds.
"""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.peers.redfish import RedfishBmc
from upsguard.clock import SystemClock
from upsguard.config.platforms import RedfishSettings
from upsguard.config.resources import ResourceConfig
from upsguard.errors import AuthenticationError, PermanentError
from upsguard.models import PlatformName, PowerState, StopMethod
from upsguard.plugins import catalog

pytestmark = pytest.mark.timeout(120)


def platform(bmc: RedfishBmc, **extra: Any) -> Any:
    settings = RedfishSettings.model_validate(bmc.settings_dict(poll_interval="0.2s", **extra))
    return catalog.load("platform", "redfish")(PlatformName("idrac"), settings, SystemClock())


def host(name: str) -> ResourceConfig:
    return ResourceConfig.model_validate(
        {"id": f"res-{name}", "kind": "host", "platform": "idrac", "host": name}
    )


async def cycle(bmc: RedfishBmc, name: str, steps: list[Any]) -> list[bool]:
    """Run (action, expected state) steps on one system; True where the state was reached."""
    redfish = platform(bmc)
    await redfish.open()
    [target] = await redfish.resolve(host(name))
    reached = []
    for action, state in steps:
        await (redfish.start(target) if action == "start" else redfish.stop(target, action))
        reached.append(await redfish.wait_for(target, state, 30))
    await redfish.close()
    return reached


def test_power_on_and_graceful_shutdown_reach_the_bmc(redfish_bmc: RedfishBmc) -> None:
    async def both() -> list[list[bool]]:
        return list(
            await asyncio.gather(
                cycle(redfish_bmc, "srv-off", [("start", PowerState.ON)]),
                cycle(redfish_bmc, "srv-on", [(StopMethod.GRACEFUL, PowerState.OFF)]),
            )
        )

    assert asyncio.run(both()) == [[True], [True]]
    assert redfish_bmc.power_state("srv-off") == "On"
    assert redfish_bmc.power_state("srv-on") == "Off"


def test_hard_stop_is_force_off(redfish_bmc: RedfishBmc) -> None:
    steps = [("start", PowerState.ON), (StopMethod.HARD, PowerState.OFF)]
    assert asyncio.run(cycle(redfish_bmc, "srv-spare", steps)) == [True, True]
    assert redfish_bmc.power_state("srv-spare") == "Off"


def test_system_id_picks_the_system(redfish_bmc: RedfishBmc) -> None:
    import uuid

    system_id = str(uuid.uuid5(uuid.NAMESPACE_DNS, "srv-spare"))
    redfish = platform(redfish_bmc, system_id=system_id)
    [target] = asyncio.run(redfish.resolve(host("anything")))
    assert target.ref is not None and target.ref.endswith(system_id)


def test_unknown_system_lists_the_ones_there(redfish_bmc: RedfishBmc) -> None:
    with pytest.raises(PermanentError, match=r"no system named 'srv-x' \(it has srv-off, srv-on"):
        asyncio.run(platform(redfish_bmc).resolve(host("srv-x")))


def test_wrong_password_is_refused_without_the_secret(
    redfish_bmc: RedfishBmc, tmp_path: Any
) -> None:
    wrong = tmp_path / "pw"
    wrong.write_text("guessed-wrong\n")
    with pytest.raises(AuthenticationError) as err:
        asyncio.run(platform(redfish_bmc, password_file=str(wrong)).open())
    assert "idrac" in str(err.value) and "guessed-wrong" not in str(err.value)


def test_tls_is_verified_by_default(redfish_bmc: RedfishBmc) -> None:
    with pytest.raises(PermanentError, match="TLS certificate is not trusted: set ca_file"):
        asyncio.run(platform(redfish_bmc, ca_file=None).open())
