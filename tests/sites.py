"""Small site files built in code for the unit tests (no peers needed)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from upsguard.config import SiteConfig
from upsguard.config.loading import load_site

EXAMPLES = Path(__file__).resolve().parent.parent / "config" / "examples"


def write_site(tmp_path: Path, text: str, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


def site_from(tmp_path: Path, data: dict[str, Any]) -> SiteConfig:
    return load_site(write_site(tmp_path, yaml.safe_dump(data, sort_keys=False)))


def simple_site(**policies: object) -> dict[str, Any]:
    """One UPS, one simulated platform, two hosts, a NAS, a switch and a few VMs (as a site
    file's YAML reads, so ``Any``: tests change it freely before ``site_from``)."""
    return {
        "site": "test",
        "ups": [
            {"name": "ups1", "simulated": {}, "runtime_at": {"minutes": 30, "load_watts": 400}}
        ],
        "platforms": {
            "vc": {"type": "simulated", "guest_shutdown": "40s", "host_shutdown": "2m"},
            "dev": {"type": "simulated", "device_shutdown": "1m"},
        },
        "resources": [
            {"id": "db", "kind": "vm", "platform": "vc", "runs_on": ["h1"], "watts": 40},
            {
                "id": "app",
                "kind": "vm",
                "platform": "vc",
                "runs_on": ["h2"],
                "watts": 40,
                "depends_on": ["db"],
            },
            {
                "id": "web",
                "kind": "vm_group",
                "platform": "vc",
                "select": {"name": "web-*"},
                "count": 4,
                "runs_on": ["h2"],
                "watts": 60,
                "depends_on": ["app"],
                "shed": True,
            },
            {"id": "h1", "kind": "host", "platform": "vc", "watts": 100, "depends_on": ["nas"]},
            {"id": "h2", "kind": "host", "platform": "vc", "watts": 100, "depends_on": ["nas"]},
            {"id": "nas", "kind": "storage", "platform": "dev", "watts": 50, "depends_on": ["sw"]},
            {"id": "sw", "kind": "switch", "watts": 20},
        ],
        "policies": {"poll_interval": "5s", **policies},
    }
