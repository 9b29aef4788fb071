"""Whether a Proxmox VE cluster's Ceph is back for its flags to be unset, read from
``GET /cluster/ceph/status``: real answers of Ceph 16.2 (``tests/fixtures/pve/ceph_status.json``
says where they came from), and each of them broken in the ways a reading can be."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from upsguard.errors import PlatformUnreachable
from upsguard.models import PowerState
from upsguard.plugins.platforms.proxmox.cluster import (
    CEPH,
    ceph_back,
    ceph_flags,
    ceph_flags_to_unset,
    ceph_state,
)
from upsguard.saved_state import SavedState

STATUSES: dict[str, Any] = json.loads(
    (Path(__file__).parent.parent / "fixtures" / "pve" / "ceph_status.json").read_text()
)["statuses"]


def status(name: str) -> Any:
    return copy.deepcopy(STATUSES[name])


def test_every_osd_in_up_with_the_monitors_in_quorum_is_back() -> None:
    back = ceph_back(status("all_up"))
    assert back.is_true
    assert back.why == "Ceph: 1 of 1 monitors in quorum, every OSD in up (3)"


def test_an_osd_in_and_down_is_not_back() -> None:
    back = ceph_back(status("one_down"))
    assert (back.is_false, back.why) == (True, "Ceph: 2 of 3 OSDs up")


def test_an_osd_down_hidden_by_one_up_and_out_is_not_back() -> None:
    """As many OSDs up as in, yet one in is down (another, up, was marked out): the counts
    alone would say every OSD in is up; Ceph's own OSD_DOWN check says otherwise."""
    read = status("one_down_one_up_out")
    assert (read["osdmap"]["num_up_osds"], read["osdmap"]["num_in_osds"]) == (2, 2)
    back = ceph_back(read)
    assert (back.is_false, back.why) == (True, "Ceph: 1 osds down")


def test_no_osd_in_has_none_to_wait_for() -> None:
    """No OSD in (none at all, or every one out): nothing can be marked out, or move."""
    read = status("all_up")
    read["osdmap"].update(num_osds=0, num_up_osds=0, num_in_osds=0)
    assert ceph_back(read).is_true


def test_monitors_without_a_majority_in_quorum_are_not_back() -> None:
    read = status("all_up")
    mon = read["monmap"]["mons"][0]
    read["monmap"]["mons"] += [{**mon, "name": "b"}, {**mon, "name": "c"}]
    back = ceph_back(read)
    assert (back.is_false, back.why) == (True, "Ceph: 1 of 3 monitors in quorum")
    read["quorum_names"] = ["a", "c"]
    assert ceph_back(read).is_true
    read["quorum_names"] = []
    assert ceph_back(read).why == "Ceph: 0 of 3 monitors in quorum"


def drop(read: Any, path: str) -> Any:
    *parents, last = path.split(".")
    for key in parents:
        read = read[key]
    del read[last]
    return read


@pytest.mark.parametrize(
    ("dropped", "named"),
    [
        ("monmap.mons", "monmap.mons"),
        ("monmap", "monmap.mons"),
        ("quorum_names", "quorum_names"),
        ("osdmap.num_osds", "osdmap.num_osds"),
        ("osdmap.num_up_osds", "osdmap.num_up_osds"),
        ("osdmap.num_in_osds", "osdmap.num_in_osds"),
        ("osdmap", "osdmap.num_osds"),
        ("health.checks", "health.checks"),
        ("health", "health.checks"),
    ],
)
def test_a_field_missing_is_unknown_never_back(dropped: str, named: str) -> None:
    read = status("all_up")
    drop(read, dropped)
    back = ceph_back(read)
    assert not back.known
    assert back.why == f"Ceph's status unknown: no {named}"


@pytest.mark.parametrize(
    ("where", "garbage"),
    [
        ("osdmap.num_up_osds", "3"),
        ("osdmap.num_up_osds", True),
        ("osdmap.num_up_osds", -1),
        ("osdmap.num_in_osds", None),
        ("osdmap.num_up_osds", 4),  # more up than there are
        ("quorum_names", "a"),
        ("monmap.mons", []),
        ("monmap.mons", [{"rank": 0}]),
        ("health.checks", ["OSD_DOWN"]),
    ],
)
def test_garbage_in_a_field_is_unknown_never_back(where: str, garbage: Any) -> None:
    read = status("all_up")
    *parents, last = where.split(".")
    inner = read
    for key in parents:
        inner = inner[key]
    inner[last] = garbage
    back = ceph_back(read)
    assert not back.known, back.why
    assert back.why.startswith("Ceph's status unknown: ")


@pytest.mark.parametrize("answer", [None, "", [], {}, {"errors": b"<html>"}, 42])
def test_an_answer_that_is_no_status_is_unknown(answer: Any) -> None:
    back = ceph_back(answer)
    assert not back.known
    assert back.why.startswith("Ceph's status unknown: ")


class _Flags:
    """``cluster/ceph/flags`` answering ``answer``."""

    def __init__(self, answer: list[dict[str, Any]]) -> None:
        self.cluster = SimpleNamespace(
            ceph=SimpleNamespace(flags=SimpleNamespace(get=lambda: answer))
        )


@pytest.mark.parametrize(
    "noout", [{"name": "noout"}, {"name": "noout", "value": "yes"}], ids=["no-value", "garbage"]
)
def test_a_flag_listed_without_a_value_it_can_read_is_unknown_never_unset(
    tmp_path: Path, noout: dict[str, Any]
) -> None:
    """A flag whose value is missing (or not 0 or 1) may be set: the shutdown does not take
    it for set by an operator, nor the startup for unset already (which would leave noout
    set and forget it)."""
    api = _Flags([noout, {"name": "norebalance", "value": 1}])
    record: SavedState[Any] = SavedState(tmp_path / "pve.cluster.json", "the test's record")
    assert ceph_state(ceph_flags(api), ["noout", "norebalance"], record) is PowerState.UNKNOWN
    record.put(CEPH, ["noout", "norebalance"])
    with pytest.raises(PlatformUnreachable, match="noout"):
        ceph_flags_to_unset(api, record)
