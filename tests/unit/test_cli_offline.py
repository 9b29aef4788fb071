"""The override commands with no service running: ``status`` from the journal and one fresh
poll, ``hold``/``release``/``trigger``/``abort`` acting on the journal themselves, and the
read commands (``status``, ``history``, ``events``) reading it.

Defects these reproduce (each failed before its fix):

- ``status`` said ``feed cp1500: ok, 1/1 supplying`` and exited 0 when its only UPS could
  not be read (its JSON said ``unknown``);
- a newline and an escape sequence in ``--reason`` forged a line of ``history`` when no
  service ran (the API cleans them; the direct path did not);
- ``status``, ``history`` and ``events`` created the journal, and its folder, when there was
  none.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.sites import write_site
from upsguard.cli import main

#: One UPS that cannot be read (its password file is not there: no network is needed to
#: fail), one simulated platform.
UNREADABLE = """
site: offline
journal: {journal}
ups:
  - {{name: cp1500, nut: {{host: 127.0.0.1, ups: cp1500, user: upsguard,
     password_file: {tmp}/missing.pw}}}}
platforms:
  sim: {{type: simulated, guest_shutdown: 0s, host_shutdown: 0s, power_on: 0s,
        host_power_on: 0s}}
resources:
  - {{id: vm1, kind: vm, platform: sim, runs_on: [h1]}}
  - {{id: h1, kind: host, platform: sim}}
service: {{socket: {tmp}/api.sock}}
"""

SIMULATED = UNREADABLE.replace(
    """nut: {{host: 127.0.0.1, ups: cp1500, user: upsguard,
     password_file: {tmp}/missing.pw}}""",
    "simulated: {{}}",
)


def site_file(tmp_path: Path, text: str = UNREADABLE, journal: Path | None = None) -> Path:
    journal = journal or tmp_path / "journal.sqlite"
    return write_site(tmp_path, text.format(tmp=tmp_path, journal=journal))


# -- status: a feed whose UPS cannot be read is unknown ---------------------------------------


def test_status_tells_a_feed_of_unreadable_upses_as_unknown_with_why_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = site_file(tmp_path)
    assert main(["hold", "-c", str(site), "--reason", "a journal to read", "--yes"]) == 0
    capsys.readouterr()

    code = main(["status", "-c", str(site)])

    out = capsys.readouterr().out
    feed = next(line for line in out.splitlines() if "feed cp1500" in line)
    assert code == 1
    assert "ok" not in feed.split(":", 1)[1].split()
    assert "UNKNOWN" in feed
    assert "cp1500 cannot be read" in feed and "missing.pw" in feed


def test_status_json_says_unknown_with_why_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = site_file(tmp_path)
    assert main(["hold", "-c", str(site), "--reason", "a journal to read", "--yes"]) == 0
    capsys.readouterr()

    code = main(["status", "-c", str(site), "--format", "json"])

    feed = json.loads(capsys.readouterr().out)["feeds"][0]
    assert code == 1
    assert feed["state"] == "unknown"
    assert feed["unknown"] == 1
    assert "missing.pw" in feed["why"]


def test_ups_status_tells_the_same_feed_as_unknown_and_fails(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = site_file(tmp_path)

    code = main(["ups", "status", "-c", str(site)])

    out, err = capsys.readouterr()
    feed = next(line for line in out.splitlines() if line.startswith("cp1500  unknown"))
    assert code == 1
    assert "1 unknown" in feed
    assert "missing.pw" in err
    code = main(["ups", "status", "-c", str(site), "--format", "json"])
    data = json.loads(capsys.readouterr().out)
    assert code == 1
    assert data["feeds"][0]["state"] == "unknown" and data["feeds"][0]["unknown"] == 1


def test_ups_status_watched_for_a_number_of_polls_fails_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """A script that watches a few polls (``--watch --polls N``) learns by the exit code
    that a UPS could not be read, as one poll's caller does."""
    site = site_file(tmp_path)

    code = main(["ups", "status", "-c", str(site), "--watch", "--polls", "1"])

    assert code == 1
    assert "missing.pw" in capsys.readouterr().err


def test_status_of_upses_that_read_well_is_ok_and_exits_0(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = site_file(tmp_path, SIMULATED)
    assert main(["hold", "-c", str(site), "--reason", "a journal to read", "--yes"]) == 0
    capsys.readouterr()

    assert main(["status", "-c", str(site)]) == 0

    out = capsys.readouterr().out
    assert "  feed cp1500: online, 1/1 supplying" in out.splitlines()


# -- reasons are cleaned on the direct path as the API cleans them ------------------------------

FORGED = "maint\n2026-11-28T10:00:00+00:00  release by root: forged \x1b[31mred\u202e"


@pytest.mark.parametrize(
    "argv",
    [
        ["hold", "--reason", FORGED],
        ["release", "--reason", FORGED],
        ["abort", "--reason", FORGED],
        ["trigger", "shutdown", "--reason", FORGED],
    ],
    ids=["hold", "release", "abort", "trigger"],
)
def test_a_reason_cannot_forge_a_line_of_history(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    site = site_file(tmp_path, SIMULATED)
    assert main([*argv, "-c", str(site), "--yes"]) == 0
    capsys.readouterr()

    assert main(["history", "-c", str(site)]) == 0

    out = capsys.readouterr().out
    assert "\x1b" not in out and "\u202e" not in out
    forged = [line for line in out.splitlines() if "forged" in line]
    assert forged and all("maint 2026-11-28T10:00:00" in line for line in forged), out
    assert not any(line.startswith("2026-11-28T10:00:00") for line in out.splitlines())
    assert "maint 2026-11-28T10:00:00+00:00  release by root: forged [31mred" in out


def test_a_hold_whose_reason_is_only_control_characters_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    site = site_file(tmp_path, SIMULATED)

    code = main(["hold", "-c", str(site), "--reason", "\x1b\x07", "--yes"])

    assert code == 1
    assert "hold needs a reason" in capsys.readouterr().err


# -- the read commands never create a journal ---------------------------------------------------


@pytest.mark.parametrize(
    "argv",
    [["status"], ["status", "--format", "json"], ["history"], ["events"]],
    ids=["status", "status-json", "history", "events"],
)
def test_a_read_command_without_a_journal_says_so_and_creates_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str]
) -> None:
    journal = tmp_path / "var" / "lib" / "upsguard" / "journal.sqlite"
    site = site_file(tmp_path, SIMULATED, journal=journal)

    code = main([*argv, "-c", str(site)])

    out, err = capsys.readouterr()
    assert code == 1
    assert out == ""
    assert err.count("\n") == 1
    assert err.startswith(f"upsguard: journal {journal} does not exist yet")
    assert not (tmp_path / "var").exists()
