"""``upsguard cache status|set|wait``: what the command line shows and how it ends.

The caches are ``command`` caches around the fake vendor CLI of tests/fixtures/caches/bin,
whose dirty data drains over wall time, and an lvmcache whose tools are missing. The same
commands against the real kernel's caches are in tests/integration/test_guest_caches.py.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.fixtures.caches.tools import FakeTools
from upsguard.cli import main

MiB = 1024 * 1024


@pytest.fixture
def site(tmp_path: Path) -> tuple[Path, FakeTools]:
    tools = FakeTools(
        tmp_path / "bin",
        {
            "ssd0": {"dirty": 200 * MiB, "rate": 100 * MiB, "accepting": True},
            "nvram": {"dirty": 40 * MiB, "rate": 20 * MiB, "accepting": True},
            "slow": {"dirty": 900 * MiB, "rate": 1 * MiB, "accepting": True},
        },
    )
    cli = tools.path("fakecache")

    def command_cache(name: str, target: str) -> dict[str, object]:
        return {
            "name": name,
            "provider": "command",
            "targets": [target],
            "poll_interval": "200ms",
            "read_mode": f"{cli} mode {{target}}",
            "set_write_through": f"{cli} set {{target}} wt",
            "set_write_back": f"{cli} set {{target}} wb",
            "read_dirty_bytes": f"{cli} dirty {{target}}",
        }

    config = {
        "site": "lab",
        "ups": [{"name": "ups1", "nut": {"host": "127.0.0.1", "ups": "ups1"}}],
        "caches": [
            {**command_cache("nas-ssd", "ssd0"), "destage_timeout": "1m"},
            command_cache("array-nvram", "nvram"),
            command_cache("old-array", "slow"),
            {
                "name": "gone",
                "provider": "lvmcache",
                "targets": ["vg9/missing"],
                "dmsetup_command": "/nonexistent/dmsetup",
                "lvs_command": "/nonexistent/lvs",
                "lvchange_command": "/nonexistent/lvchange",
            },
            {
                "name": "undiscovered",
                "provider": "lvmcache",
                "targets": [],
                "dmsetup_command": "/nonexistent/dmsetup",
                "lvs_command": "/nonexistent/lvs",
                "lvchange_command": "/nonexistent/lvchange",
            },
        ],
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, tools


def test_status_shows_each_cache_and_names_the_one_that_fails(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = site
    code = main(["cache", "status", "-c", str(path), "--sample", "0", "--format", "json"])
    rows = {r["cache"]: r for r in json.loads(capsys.readouterr().out)}
    assert code == 1  # one cache could not be read
    assert rows["nas-ssd"]["mode"] == "write-back" and rows["nas-ssd"]["dirty_bytes"] > 0
    assert rows["array-nvram"]["mode"] == "write-back" and not rows["array-nvram"]["clean"]
    assert rows["gone"]["error"] == (
        "/nonexistent/dmsetup: program not found: install it or set its path in the site file"
    )


def test_status_table_measures_the_rate(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = site
    assert main(["cache", "set", "write-through", "array-nvram", "-c", str(path)]) == 0
    capsys.readouterr()
    assert main(["cache", "status", "array-nvram", "-c", str(path), "--sample", "500ms"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:7] == ["CACHE", "TARGET", "MODE", "DIRTY", "RATE", "ETA", "CLEAN"]
    assert row.startswith("array-nvram") and "write-through" in row and "MiB/s" in row


def test_set_write_through_wait_shows_progress_and_returns_when_clean(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = site
    code = main(
        ["cache", "set", "write-through", "nas-ssd", "array-nvram", "--wait", "-c", str(path)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "nas-ssd/ssd0: ok: ssd0: write-through" in out
    assert out.rstrip().endswith("clean: nas-ssd, array-nvram")
    progress = err.splitlines()
    assert progress[0].startswith("[") and "MiB dirty" in progress[0] and "ETA" in progress[0]
    assert progress[-1].startswith(f"[{'#' * 30}] 0 B dirty") and "2/2 clean" in progress[-1]


def test_one_failing_cache_does_not_stop_the_others(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    path, tools = site
    code = main(["cache", "set", "write-through", "array-nvram", "gone", "-c", str(path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "array-nvram/nvram: ok" in out
    assert "gone/vg9/missing: FAILED: /nonexistent/dmsetup: program not found" in out
    assert tools.device("nvram")["accepting"] is False


def test_wait_times_out_with_a_non_zero_exit_naming_what_is_dirty(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = site
    assert main(["cache", "set", "write-through", "old-array", "-c", str(path)]) == 0
    code = main(["cache", "wait", "old-array", "--timeout", "5s", "-c", str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "upsguard: not clean after 5s: old-array/slow (" in err and "MiB still dirty)" in err


def test_wait_on_a_cache_that_cannot_be_read_never_says_clean(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    """Its targets cannot be discovered: ``wait`` said ``0/0 clean``, then ``clean: ...``, and
    exit 0. It is not known clean: exit 1 when the time runs out, naming why."""
    path, _ = site
    code = main(["cache", "wait", "undiscovered", "--timeout", "1s", "-c", str(path)])
    out, err = capsys.readouterr()
    assert code == 1 and "clean:" not in out
    assert "0/1 clean, 1 unreadable" in err and not err.startswith(f"[{'#' * 30}]")
    assert "upsguard: not clean after 1s: undiscovered could not be read (" in err
    assert "/nonexistent/lvs: program not found" in err


def test_unknown_cache_name_is_a_config_error(
    site: tuple[Path, FakeTools], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _ = site
    assert main(["cache", "wait", "nope", "-c", str(path)]) == 2
    assert "no cache named nope (caches: nas-ssd, array-nvram, old-array, gone, undiscovered)" in (
        capsys.readouterr().err
    )
