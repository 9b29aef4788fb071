"""The shipped JSON Schema matches the models; the public surface is what it says."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import upsguard
from upsguard import config
from upsguard.cli.site import schema_text

ROOT = Path(__file__).resolve().parents[2]


def test_committed_schema_is_current() -> None:
    committed = (ROOT / "config" / "site.schema.json").read_text(encoding="utf-8")
    assert committed == schema_text(), "run: upsguard schema -o config/site.schema.json"


def test_schema_describes_the_sections() -> None:
    schema = json.loads(schema_text())
    assert schema["title"] == "upsguard site file"
    assert {"site", "ups", "feeds", "platforms", "caches", "resources", "policies"} <= set(
        schema["properties"]
    )


def test_public_names() -> None:
    assert upsguard.__all__ == ["__version__"]
    for name in config.__all__:
        assert hasattr(config, name), name


def test_version_flag() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "upsguard", "--version"], capture_output=True, text=True, check=False
    )
    assert done.stdout.strip() == f"upsguard {upsguard.__version__}"
