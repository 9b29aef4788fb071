"""Bad site and scenario files: one line naming the field and file:line, exit 2, no traceback.

Each case goes through the command line (``upsguard.cli.main``, in this process) the way a
user meets it: ``validate``, ``plan`` or ``simulate`` with ``-c FILE [--scenario FILE]``.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from upsguard.cli import main

SITE = """\
site: hq
ups:
  - name: ups-a
    simulated: {}
    runtime_at: {minutes: 30, load_watts: 400}
platforms:
  vc: {type: simulated}
resources:
  - {id: db, kind: vm, platform: vc, runs_on: [h1], watts: 40}
  - {id: app, kind: vm, platform: vc, runs_on: [h1], watts: 40, depends_on: [db]}
  - {id: h1, kind: host, platform: vc, watts: 100}
policies:
  poll_interval: 5s
"""


@dataclass
class Run:
    code: int
    out: str
    err: str

    @property
    def lines(self) -> list[str]:
        return self.err.strip().splitlines()


def run(*argv: str | Path) -> Run:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([str(a) for a in argv])
    return Run(code, out.getvalue(), err.getvalue())


def write(tmp_path: Path, text: str | bytes, name: str = "site.yaml") -> Path:
    path = tmp_path / name
    if isinstance(text, bytes):
        path.write_bytes(text)
    else:
        path.write_text(text, encoding="utf-8")
    return path


def one_problem(result: Run) -> str:
    """The single error line, checked for what every error line must be."""
    assert result.code == 2, result
    assert "Traceback" not in result.err
    (line,) = result.lines
    assert line.startswith("upsguard: ")
    return line.removeprefix("upsguard: ")


# -- reading the file ------------------------------------------------------------------------


def test_a_site_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    path = write(tmp_path, b"site: hq\nups:\n  - name: \xff\xfe\n")
    line = one_problem(run("validate", "-c", path))
    assert line == f"{path}:3: not UTF-8 text (byte 0xff): save the file as UTF-8"


def test_a_scenario_file_that_is_not_utf8_names_the_line(tmp_path: Path) -> None:
    site = write(tmp_path, SITE)
    scenario = write(tmp_path, b"\xff\xfe", "s.yaml")
    line = one_problem(run("simulate", "-c", site, "--scenario", scenario))
    assert line.startswith(f"{scenario}:1: not UTF-8 text")


def test_a_device_is_not_read(tmp_path: Path) -> None:
    line = one_problem(run("validate", "-c", "/dev/zero"))
    assert line == "/dev/zero: not a regular file: give the path of a YAML file"


def test_a_fifo_is_not_waited_on(tmp_path: Path) -> None:
    fifo = tmp_path / "site.yaml"
    os.mkfifo(fifo)
    line = one_problem(run("plan", "shutdown", "-c", fifo))
    assert line == f"{fifo}: not a regular file: give the path of a YAML file"


def test_a_file_beyond_the_size_limit_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SITE + "#" * (16 * 1024 * 1024) + "\n")
    line = one_problem(run("validate", "-c", path))
    assert line == f"{path}: larger than 16 MiB, the most upsguard reads: is this the right file?"


# -- limits on the YAML --------------------------------------------------------------------


def test_deep_nesting_is_refused_before_it_is_parsed(tmp_path: Path) -> None:
    path = write(tmp_path, "site: " + "[" * 100_000 + "]" * 100_000 + "\n")
    assert one_problem(run("validate", "-c", path)) == f"{path}:1: nested deeper than 64 levels"


def test_deep_block_nesting_is_refused_too(tmp_path: Path) -> None:
    path = write(tmp_path, "site: hq\nups:\n  " + "- " * 100_000 + "x\n")
    assert one_problem(run("validate", "-c", path)) == f"{path}:3: nested deeper than 64 levels"


def test_a_site_beyond_the_resource_limit_is_refused(tmp_path: Path) -> None:
    text = SITE.replace("policies:\n  poll_interval: 5s\n", "") + "  - {}\n" * 20_000
    path = write(tmp_path, text)
    line = one_problem(run("validate", "-c", path))
    assert line == (
        "resources: 20,003 entries: a section holds at most 20,000 (see docs/site-file.md, "
        f"Limits) ({path}:8)"
    )


@pytest.mark.slow
def test_a_file_of_too_many_values_is_refused_while_parsing(tmp_path: Path) -> None:
    path = write(tmp_path, "site: hq\njunk: [" + "0," * 1_000_000 + "0]\n")
    line = one_problem(run("validate", "-c", path))
    assert line.startswith(f"{path}:2: more than 1,000,000 values")


# -- numbers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("value", [".inf", "1e300", '"99999999999999d"', "-.inf", ".nan"])
def test_a_duration_out_of_range_is_a_config_error(tmp_path: Path, value: str) -> None:
    path = write(tmp_path, SITE.replace("poll_interval: 5s", f"poll_interval: {value}"))
    line = one_problem(run("validate", "-c", path))
    assert line.startswith("policies.poll_interval: ")
    assert line.endswith(f"({path}:13)")


def test_a_duration_beyond_its_limit_says_the_limit(tmp_path: Path) -> None:
    text = SITE.replace("{id: db, kind: vm,", "{id: db, kind: vm, guest_timeout: 99999999999999d,")
    path = write(tmp_path, text)
    assert one_problem(run("validate", "-c", path)) == (
        "resources[0].guest_timeout: '99999999999999d' is longer than 30 days, the most this "
        f"field takes ({path}:9)"
    )


def test_a_poll_interval_of_zero_is_refused(tmp_path: Path) -> None:
    path = write(tmp_path, SITE.replace("poll_interval: 5s", "poll_interval: 0"))
    assert one_problem(run("validate", "-c", path)) == (
        f"policies.poll_interval: 0 is shorter than 10 ms, the least this field takes ({path}:13)"
    )


def test_infinite_watts_fail_validate_not_simulate(tmp_path: Path) -> None:
    path = write(tmp_path, SITE.replace("load_watts: 400", "load_watts: 1e999"))
    line = one_problem(run("validate", "-c", path))
    assert line == f"ups[0].runtime_at.load_watts: input should be a finite number ({path}:5)"


def test_a_huge_integer_names_the_bound(tmp_path: Path) -> None:
    text = SITE.replace("watts: 100}", "watts: 99999999999999999999999999999999999}")
    line = one_problem(run("validate", "-c", write(tmp_path, text)))
    assert line.startswith("resources[2].watts: input should be less than or equal to 1000000 (")


def test_a_huge_integer_in_a_float_field_is_too_large(tmp_path: Path) -> None:
    text = SITE.replace("load_watts: 400", "load_watts: " + "9" * 400)
    line = one_problem(run("validate", "-c", write(tmp_path, text)))
    assert line.startswith("ups[0].runtime_at.load_watts: the number is too large (")


def test_a_condition_against_nan_is_refused(tmp_path: Path) -> None:
    text = SITE + '  shutdown: {when_any: ["charge < nan"]}\n'
    line = one_problem(run("validate", "-c", write(tmp_path, text)))
    assert line.startswith("policies.shutdown.when_any[0]: 'charge < nan': charge is compared")


# -- what the messages say ------------------------------------------------------------------


def test_long_values_are_shortened_in_errors(tmp_path: Path) -> None:
    text = SITE.replace(
        "{id: db, kind: vm,", "{id: db, kind: vm, guest_timeout: " + "x" * 5000 + ","
    )
    line = one_problem(run("validate", "-c", write(tmp_path, text)))
    assert "'" + "x" * 58 + "…" in line
    assert len(line) < 300


def test_a_path_field_says_it_wants_a_path(tmp_path: Path) -> None:
    text = SITE.replace("simulated: {}", "nut: {ups: u, password_file: 5}")
    assert one_problem(run("validate", "-c", write(tmp_path, text))).startswith(
        "ups[0].nut.password_file: expected a path, written as a string like /etc/upsguard/nut.pw ("
    )


@pytest.mark.parametrize("command", [["validate"], ["plan", "shutdown"]])
def test_a_journal_name_longer_than_linux_allows_is_a_config_error(
    tmp_path: Path, command: list[str]
) -> None:
    text = SITE + "journal: /var/lib/upsguard/" + "x" * 300 + ".sqlite\n"
    line = one_problem(run(*command, "-c", write(tmp_path, text)))
    assert line.startswith("journal: 'xxxx")
    assert "is longer than 255 bytes, the most a file name may have" in line
    assert re.search(r"site\.yaml:\d+\)$", line), line


def test_a_path_longer_than_linux_allows_is_a_config_error(tmp_path: Path) -> None:
    long_path = "/" + "/".join(["d" * 200] * 25) + "/ca.pem"
    text = SITE.replace(
        "vc: {type: simulated}",
        "vc: {type: simulated}\n"
        f"  esx: {{type: vsphere, host: vc.example, ca_file: {long_path}}}",
    )
    line = one_problem(run("validate", "-c", write(tmp_path, text)))
    assert line.startswith("platforms.esx.ca_file: a path of 5032 bytes is longer than 4095")


def test_a_path_with_a_nul_is_a_config_error(tmp_path: Path) -> None:
    text = SITE + 'journal: "/var/lib/upsguard/a\\0b.sqlite"\n'
    line = one_problem(run("plan", "shutdown", "-c", write(tmp_path, text)))
    assert line.startswith("journal: a path cannot hold a NUL character")


def test_an_acronym_keeps_its_capitals(tmp_path: Path) -> None:
    text = SITE.replace("simulated: {}", "snmp: {host: 10.0.0.5, version: '3'}")
    line = one_problem(run("validate", "-c", write(tmp_path, text)))
    assert line.startswith("ups[0].snmp: SNMP version 3 needs 'user' (")


def test_a_numeric_secret_is_never_echoed(tmp_path: Path) -> None:
    secret = "1" * 30
    text = SITE.replace("simulated: {}", f"snmp: {{host: 10.0.0.5, community: {secret}}}")
    result = run("validate", "-c", write(tmp_path, text))
    line = one_problem(result)
    assert line.startswith("ups[0].snmp.community: ")
    assert secret[:6] not in result.err + result.out


def test_a_secret_that_yaml_cannot_read_is_not_echoed(tmp_path: Path) -> None:
    secret = "7" * 5000  # more digits than Python turns into an int
    text = SITE.replace("simulated: {}", f"snmp: {{host: 10.0.0.5, community: {secret}}}")
    result = run("validate", "-c", write(tmp_path, text))
    line = one_problem(result)
    assert line.startswith("ups[0].snmp.community: ")
    assert "777777" not in result.err


# -- every problem in one pass --------------------------------------------------------------


def test_field_and_reference_problems_come_together(tmp_path: Path) -> None:
    text = SITE.replace("depends_on: [db]}", "depends_on: [db, nope]}").replace(
        "{id: h1, kind: host, platform: vc, watts: 100}",
        "{id: h1, kind: host, platform: vcc, watts: -1}\n  - {id: h2, kind: host, platform: vcc}",
    )
    result = run("validate", "-c", path := write(tmp_path, text))
    assert result.code == 2
    assert result.lines == [
        f"upsguard: resources[2].watts: input should be greater than or equal to 0 ({path}:11)",
        f"upsguard: resources[1].depends_on[1]: unknown resource 'nope' ({path}:10)",
        f"upsguard: resources[3].platform: unknown platform 'vcc' (did you mean 'vc'?) ({path}:12)",
    ]


def test_a_reference_to_an_entry_with_a_bad_field_is_not_unknown(tmp_path: Path) -> None:
    text = SITE.replace(
        "{id: db, kind: vm, platform: vc,", "{id: db, kind: vm, platform: vc, wats: 1,"
    )
    result = run("validate", "-c", write(tmp_path, text))
    assert result.code == 2
    (line,) = result.lines
    assert "unknown field 'wats' (did you mean 'watts'?)" in line


# -- the simulator's needs ------------------------------------------------------------------


def test_simulate_names_the_line_of_a_ups_without_runtime_at(tmp_path: Path) -> None:
    path = write(tmp_path, SITE.replace("    runtime_at: {minutes: 30, load_watts: 400}\n", ""))
    assert run("validate", "-c", path).code == 0
    line = one_problem(run("simulate", "-c", path))
    assert line.startswith("ups[0].runtime_at: the simulator needs the battery's runtime")
    assert line.endswith(f"({path}:3)")


def test_a_scenario_that_would_poll_forever_is_refused(tmp_path: Path) -> None:
    site = write(
        tmp_path, SITE + "caches:\n  - {name: c, provider: simulated, poll_interval: 10ms}\n"
    )
    scenario = write(tmp_path, "outage: {at: 1m}\nhorizon: 30d\n", "s.yaml")
    line = one_problem(run("simulate", "-c", site, "--scenario", scenario))
    assert line.startswith(
        "horizon: 259,200,000 polls of 10 ms (the site's caches[0].poll_interval)"
    )
    assert line.endswith(f"({scenario}:2)")


def test_flapping_that_would_never_end_is_refused(tmp_path: Path) -> None:
    site = write(tmp_path, SITE)
    scenario = write(tmp_path, "flapping:\n  - {start: 0, stop: 30d, every: 100ms}\n", "s.yaml")
    line = one_problem(run("simulate", "-c", site, "--scenario", scenario))
    assert line.startswith("flapping[0]: 25,920,000 changes of mains: at most 100,000")


# -- a UPS must name its source -------------------------------------------------------------


def test_a_ups_whose_nut_body_is_commented_out_is_an_error(tmp_path: Path) -> None:
    text = SITE.replace("    simulated: {}\n", "    nut:\n    #  ups: cp1500\n")
    assert one_problem(run("validate", "-c", path := write(tmp_path, text))) == (
        f"ups[0]: 'nut:' is empty: write nut: {{ups: NAME, host: ADDRESS}} ({path}:3)"
    )


def test_a_ups_without_a_source_is_an_error(tmp_path: Path) -> None:
    text = SITE.replace("    simulated: {}\n", "")
    assert one_problem(run("validate", "-c", path := write(tmp_path, text))) == (
        "ups[0]: UPS 'ups-a' has no source: write nut: {ups: NAME, host: ADDRESS} or "
        "snmp: {host: ADDRESS, community_file: FILE}, or simulated: {} for one that exists only "
        "in the simulator "
        f"({path}:3)"
    )


def test_the_simulated_ups_asked_for_is_fine(tmp_path: Path) -> None:
    result = run("validate", "-c", write(tmp_path, SITE))
    assert result.code == 0, result.err


# -- as a separate process ------------------------------------------------------------------


def test_the_command_exits_2_without_a_traceback(tmp_path: Path) -> None:
    path = write(tmp_path, b"\xff\xfe")
    done = subprocess.run(
        [sys.executable, "-m", "upsguard", "validate", "-c", str(path)],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2
    assert re.fullmatch(rf"upsguard: {re.escape(str(path))}:1: not UTF-8 text .*\n", done.stderr)


def test_hints_stop_after_a_few_distinct_names() -> None:
    """difflib against every resource, for thousands of unknown names, took minutes."""
    from upsguard.config.source import Suggestions

    hint = Suggestions([f"vm{i:05d}" for i in range(5000)], budget=2)
    assert hint("vm00001x") == " (did you mean 'vm00001'?)"
    assert hint("vm00002x") == " (did you mean 'vm00002'?)"
    assert hint("vm00003x") == ""  # past the budget
    assert hint("vm00001x") == " (did you mean 'vm00001'?)"  # looked up already
