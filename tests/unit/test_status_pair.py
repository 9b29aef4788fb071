"""``upsguard status`` for a controller of a pair: role, leader, lease age, fencing token,
and the shared ledger as the standby last read it."""

from __future__ import annotations

from datetime import UTC, datetime

import msgspec

from upsguard.cli.views import status_text
from upsguard.models import Phase
from upsguard.status import PairStatus, ServiceState, SiteStatus

AT = datetime(2026, 11, 25, 3, 0, tzinfo=UTC)


def status(pair: PairStatus | None) -> str:
    site = SiteStatus(
        site="hq",
        at=AT,
        service=ServiceState(running=True, journal="/j", pid=7, since=AT),
        phase=Phase.SHUTTING_DOWN,
        ha=pair,
    )
    return status_text(msgspec.json.decode(msgspec.json.encode(site), type=SiteStatus))


def test_the_leader_shows_its_term_and_the_age_of_its_lease() -> None:
    text = status(
        PairStatus(
            me="ctl-a",
            role="leader",
            leader="ctl-a",
            token=41,
            lease_age_s=0.6,
            lease_ttl_s=5.0,
            detail="won the lease (term 41)",
        )
    )
    assert "pair: ctl-a leads, term 41, lease renewed 0.6s ago (ttl 5s)" in text


def test_the_standby_shows_who_leads_and_the_run_it_follows() -> None:
    text = status(
        PairStatus(
            me="ctl-b",
            role="standby",
            leader="ctl-a",
            token=41,
            lease_ttl_s=5.0,
            shared_run="shutdown-1",
            shared_steps_done=3,
            seen_age_s=0.2,
        )
    )
    assert "pair: ctl-b is STANDBY; ctl-a leads, term 41" in text
    assert "shared ledger (read 0.2s ago): run shutdown-1, 3 step(s) done" in text


def test_a_silent_store_and_finishing_alone_are_said() -> None:
    text = status(
        PairStatus(
            me="ctl-a",
            role="finishing_alone",
            token=41,
            lease_ttl_s=5.0,
            store_silent_s=8.2,
            alone="ctl-a: the store silent for 8.0s",
        )
    )
    assert "pair: ctl-a FINISHES ALONE (without etcd), term 41" in text
    assert "etcd silent for 8.2s" in text


def test_a_single_controller_shows_no_pair() -> None:
    assert "pair:" not in status(None)
