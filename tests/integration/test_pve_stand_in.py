"""The PVE API stand-in itself: it refuses what PVE's published API description refuses
(and the test that sent it fails), and its Ceph flags are a real monitor's."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import proxmoxer
import pytest

from tests.peers.ceph import CephMonitor
from tests.peers.pve import PASSWORD, PveApi, assert_all_accepted


def client(api: PveApi) -> Any:
    return proxmoxer.ProxmoxAPI(
        "127.0.0.1", user="root@pam", password=PASSWORD, port=api.port, verify_ssl=str(api.cert)
    )


def test_a_request_outside_the_api_description_is_refused_and_fails_the_test(
    pve_api: PveApi,
) -> None:
    pve = client(pve_api)
    with pytest.raises(proxmoxer.ResourceException, match="400"):
        pve.cluster.ha.status("disarm-ha").post()  # resource-mode is not optional
    with pytest.raises(proxmoxer.ResourceException, match="400"):
        pve.cluster.ceph.flags.put(noout=1, nothing=1)  # no such flag
    with pytest.raises(proxmoxer.ResourceException, match="400"):
        pve.nodes("pve1").qemu(101).status.hibernate.post()  # no such path
    assert pve_api.pve.refused == [
        "POST /cluster/ha/status/disarm-ha: property is missing and it is not optional: "
        "resource-mode",
        "PUT /cluster/ceph/flags: property is not defined in schema: nothing",
        "POST /nodes/pve1/qemu/101/status/hibernate: no such path in the API description",
    ]
    assert pve_api.pve.armed == "armed"  # nothing refused was carried out
    with pytest.raises(pytest.fail.Exception, match="requests PVE's API description refuses"):
        assert_all_accepted(pve_api.pve)
    pve_api.pve.refused.clear()  # shown: the fixture would fail this test


def test_ha_disarms_and_rearms_and_cluster_writes_need_the_quorum(pve_api: PveApi) -> None:
    state = pve_api.pve
    state.ha_resources = {"vm:101": "started"}
    pve = client(pve_api)
    fencing = [e for e in pve.cluster.ha.status.current.get() if e["type"] == "fencing"]
    assert fencing[0]["armed-state"] == "armed"
    pve.cluster.ha.status("disarm-ha").post(**{"resource-mode": "ignore"})
    assert state.armed in ("disarming", "disarmed")
    state.nodes.update({"pve2": "offline", "pve3": "offline"})  # 1 of 3: no quorum
    with pytest.raises(proxmoxer.ResourceException, match="no quorum"):
        pve.cluster.ha.status("arm-ha").post()
    state.nodes["pve2"] = "online"
    pve.cluster.ha.status("arm-ha").post()
    assert state.armed == "armed"


def test_ceph_flags_are_set_and_read_at_a_real_monitor(
    pve_api: PveApi, ceph_monitor: CephMonitor, tmp_path: Path
) -> None:
    pve_api.pve.ceph = ceph_monitor
    pve = client(pve_api)
    upid = pve.cluster.ceph.flags.put(noout=1, norebalance=1)
    assert upid.startswith("UPID:pve1:") and ":cephsetflags:" in upid
    assert ceph_monitor.flags() >= {"noout", "norebalance"}
    read = {f["name"]: f["value"] for f in pve.cluster.ceph.flags.get()}
    assert (read["noout"], read["norebalance"], read["nobackfill"]) == (1, 1, 0)
    pve.cluster.ceph.flags.put(noout=0)
    assert "noout" not in ceph_monitor.flags()
