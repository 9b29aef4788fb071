"""``upsguard cache status|set|wait`` on a site whose caches are fake but drain for real.

bcache: a copy of its sysfs tree drained by a writer thread (tests/fixtures/caches/fake_bcache.py);
command and lvmcache: the fake tools of tests/fixtures/caches/bin.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from tests.fixtures.caches.fake_bcache import Device, FakeBcacheSysfs
from tests.fixtures.caches.tools import FakeTools
from upsguard.cli import main

MiB = 1024 * 1024


@pytest.fixture
def site(tmp_path: Path) -> Iterator[tuple[Path, FakeTools, FakeBcacheSysfs]]:
    tools = FakeTools(
        tmp_path / "bin",
        {
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
            {
                "name": "nas-ssd",
                "provider": "bcache",
                "sysfs_root": str(tmp_path / "sys"),
                "state_dir": str(tmp_path / "state"),
                "poll_interval": "200ms",
                "destage_timeout": "1m",
            },
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
        ],
    }
    path = tmp_path / "site.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    with FakeBcacheSysfs(tmp_path / "sys", {"bcache0": Device(dirty=200 * MiB)}) as sysfs:
        yield path, tools, sysfs


def test_status_shows_each_cache_and_names_the_one_that_fails(
    site: tuple[Path, FakeTools, FakeBcacheSysfs], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = site
    code = main(["cache", "status", "-c", str(path), "--sample", "0", "--format", "json"])
    rows = {r["cache"]: r for r in json.loads(capsys.readouterr().out)}
    assert code == 1  # one cache could not be read
    assert rows["nas-ssd"]["mode"] == "write-back" and rows["nas-ssd"]["dirty_bytes"] > 0
    assert rows["array-nvram"]["mode"] == "write-back" and not rows["array-nvram"]["clean"]
    assert rows["gone"]["error"] == (
        "/nonexistent/dmsetup: program not found: install it or set its path in the site file"
    )


def test_status_table_measures_the_rate(
    site: tuple[Path, FakeTools, FakeBcacheSysfs], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = site
    assert main(["cache", "set", "write-through", "array-nvram", "-c", str(path)]) == 0
    capsys.readouterr()
    assert main(["cache", "status", "array-nvram", "-c", str(path), "--sample", "500ms"]) == 0
    header, row = capsys.readouterr().out.splitlines()
    assert header.split()[:7] == ["CACHE", "TARGET", "MODE", "DIRTY", "RATE", "ETA", "CLEAN"]
    assert row.startswith("array-nvram") and "write-through" in row and "MiB/s" in row


def test_set_write_through_wait_shows_progress_and_returns_when_clean(
    site: tuple[Path, FakeTools, FakeBcacheSysfs], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, sysfs = site
    code = main(
        ["cache", "set", "write-through", "nas-ssd", "array-nvram", "--wait", "-c", str(path)]
    )
    out, err = capsys.readouterr()
    assert code == 0, err
    assert "nas-ssd/bcache0: ok: bcache0: write-through" in out
    assert out.rstrip().endswith("clean: nas-ssd, array-nvram")
    progress = err.splitlines()
    assert progress[0].startswith("[") and "MiB dirty" in progress[0] and "ETA" in progress[0]
    assert progress[-1].startswith(f"[{'#' * 30}] 0 B dirty") and "2/2 clean" in progress[-1]
    assert sysfs.attr("bcache0", "writeback_percent") == "10"  # restored once clean


def test_one_failing_cache_does_not_stop_the_others(
    site: tuple[Path, FakeTools, FakeBcacheSysfs], capsys: pytest.CaptureFixture[str]
) -> None:
    path, tools, _ = site
    code = main(["cache", "set", "write-through", "array-nvram", "gone", "-c", str(path)])
    out = capsys.readouterr().out
    assert code == 1
    assert "array-nvram/nvram: ok" in out
    assert "gone/vg9/missing: FAILED: /nonexistent/dmsetup: program not found" in out
    assert tools.device("nvram")["accepting"] is False


def test_wait_times_out_with_a_non_zero_exit_naming_what_is_dirty(
    site: tuple[Path, FakeTools, FakeBcacheSysfs], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = site
    assert main(["cache", "set", "write-through", "old-array", "-c", str(path)]) == 0
    code = main(["cache", "wait", "old-array", "--timeout", "1s", "-c", str(path)])
    err = capsys.readouterr().err
    assert code == 1
    assert "upsguard: not clean after 1s: old-array/slow (" in err and "MiB still dirty)" in err


def test_unknown_cache_name_is_a_config_error(
    site: tuple[Path, FakeTools, FakeBcacheSysfs], capsys: pytest.CaptureFixture[str]
) -> None:
    path, _, _ = site
    assert main(["cache", "wait", "nope", "-c", str(path)]) == 2
    assert "no cache named nope (caches: nas-ssd, array-nvram, old-array, gone)" in (
        capsys.readouterr().err
    )
