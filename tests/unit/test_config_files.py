"""The files a site names: found wherever the site file names one."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from pydantic import BaseModel

from tests.sites import EXAMPLES, simple_site, site_from
from upsguard.config import SiteConfig
from upsguard.config.files import FILE_FIELDS, SECRET_FIELDS, NamedFile, named_files
from upsguard.config.loading import load_site


def every_field(value: object, loc: tuple[str | int, ...] = ()) -> Iterator[NamedFile]:
    """What ``named_files`` finds, read from every field of every model, list and dict."""
    items: list[tuple[str | int, object]]
    if isinstance(value, BaseModel):
        items = [(name, getattr(value, name)) for name in type(value).model_fields]
    elif isinstance(value, list):
        items = list(enumerate(value))
    elif isinstance(value, dict):
        items = [(str(key), item) for key, item in value.items()]
    else:
        return
    for key, child in items:
        if isinstance(child, Path) and key in FILE_FIELDS:
            yield NamedFile((*loc, key), child, key in SECRET_FIELDS)
        else:
            yield from every_field(child, (*loc, key))


def health_checks_with_files(tmp_path: Path) -> SiteConfig:
    data = simple_site()
    http = {"url": "https://db.lab/ok", "header": "X-Key", "value_file": str(tmp_path / "key")}
    data["resources"][0]["health"] = {"http": {**http, "ca_file": str(tmp_path / "ca.pem")}}
    data["resources"][1]["health"] = {
        "http": {"url": "https://app.lab/", "user": "u", "password_file": str(tmp_path / "pw")}
    }
    return site_from(tmp_path, data)


@pytest.mark.parametrize("example", ["homelab.yaml", "cluster.yaml", "health"])
def test_named_files_are_those_a_walk_of_every_field_finds(tmp_path: Path, example: str) -> None:
    if example == "health":
        site = health_checks_with_files(tmp_path)
    else:
        site = load_site(EXAMPLES / example)
    found = named_files(site)
    assert found == list(every_field(site))
    assert found  # each of these sites names files
