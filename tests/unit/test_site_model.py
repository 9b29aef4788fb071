"""Lookups on a loaded site follow copies made with an update."""

from __future__ import annotations

from pathlib import Path

from tests.sites import simple_site, site_from
from upsguard.models import ResourceId


def test_model_copy_rebuilds_the_resource_index(tmp_path: Path) -> None:
    site = site_from(tmp_path, simple_site())
    assert site.resource("db").watts == 40  # fills the cached index
    changed = [r.model_copy(update={"watts": 99.0}) for r in site.resources]
    copy = site.model_copy(update={"resources": changed})
    assert copy.resource("db").watts == 99
    assert site.resource("db").watts == 40


def test_feeds_default_to_each_ups_powering_everything(tmp_path: Path) -> None:
    data = simple_site()
    data["ups"].append({"name": "ups2", "simulated": {}})
    site = site_from(tmp_path, data)
    assert [f.ups for f in site.feeds_of(ResourceId("db"))] == [["ups1"], ["ups2"]]
