"""Mangled example files never crash ``validate``, ``plan`` or ``simulate``.

Hypothesis takes the example sites and scenarios (config/examples) and mangles them: a
flipped byte, a line deleted or doubled, a value swapped for an odd one (``.inf``, a huge
number, deep nesting, a wrong type, bytes that are not UTF-8). Whatever comes out, each
command must end with exit code 0, 1 or 2, print no traceback, name ``file:line`` in every
error line, and finish within a generous time. Run in this process (``upsguard.cli.main``)
so that hundreds of examples stay fast. As many examples as the Hypothesis profile says
(tests/conftest.py: a few in the quick lane); the ``slow`` run (scripts/test, CI) tries 1,000.
"""

from __future__ import annotations

import contextlib
import io
import re
import signal
import tempfile
import traceback
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from upsguard.cli import main

EXAMPLES = Path(__file__).resolve().parents[2] / "config" / "examples"
SITES = [p.read_bytes() for p in sorted(EXAMPLES.glob("*.yaml"))]
SCENARIOS = [p.read_bytes() for p in sorted((EXAMPLES / "scenarios").glob("*.yaml"))]
#: Per example, for all three commands: generous, a guard against hangs, not a speed test.
EXAMPLE_TIMEOUT_S = 60

ODD_VALUES = [
    ".inf",
    "-.inf",
    ".nan",
    "1e999",
    "1e300",
    "-1",
    "0",
    "99999999999999999999999999999999999999",
    "9" * 5000,
    '"99999999999999d"',
    '"1e300s"',
    "0b_",
    "2024-02-30",
    "~",
    "''",
    "[]",
    "{}",
    "{a: 1}",
    "[1, [2, [3]]]",
    "[" * 200 + "]" * 200,
    "- - - x",
    "true",
    "no",
    "1:30",
    "!include other.yaml",
    "*nowhere",
    "&anchor x",
    '"\\u0000"',
    "x" * 3000,
    "'nan'",
    "<<: 5",
    "? [a]",
]

Mutation = Callable[[st.DrawFn, bytes], bytes]


def _flip_byte(draw: st.DrawFn, text: bytes) -> bytes:
    if not text:
        return text
    at = draw(st.integers(0, len(text) - 1))
    return text[:at] + bytes([draw(st.integers(0, 255))]) + text[at + 1 :]


def _delete_line(draw: st.DrawFn, text: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    if not lines:
        return text
    del lines[draw(st.integers(0, len(lines) - 1))]
    return b"".join(lines)


def _duplicate_line(draw: st.DrawFn, text: bytes) -> bytes:
    lines = text.splitlines(keepends=True)
    if not lines:
        return text
    at = draw(st.integers(0, len(lines) - 1))
    lines.insert(at, lines[at])
    return b"".join(lines)


_VALUE = re.compile(rb"(?<=: )[^\s,{}\[\]#][^,{}\[\]#\n]*")


def _swap_value(draw: st.DrawFn, text: bytes) -> bytes:
    spots = [m.span() for m in _VALUE.finditer(text)]
    if not spots:
        return text
    start, end = draw(st.sampled_from(spots))
    odd = draw(st.sampled_from(ODD_VALUES)).encode()
    return text[:start] + odd + text[end:]


def _deep_nesting(draw: st.DrawFn, text: bytes) -> bytes:
    depth = draw(st.sampled_from([65, 1000, 100_000]))
    return text + b"deep: " + b"[" * depth + b"]" * depth + b"\n"


def _not_utf8(draw: st.DrawFn, text: bytes) -> bytes:
    at = draw(st.integers(0, len(text)))
    return (
        text[:at]
        + draw(st.sampled_from([b"\xff\xfe", b"\xc3", b"\x80", b"\xed\xa0\x80"]))
        + text[at:]
    )


MUTATIONS: list[Mutation] = [
    _flip_byte,
    _delete_line,
    _duplicate_line,
    _swap_value,
    _swap_value,  # the most telling: twice as likely
    _deep_nesting,
    _not_utf8,
]


@st.composite
def mangled(draw: st.DrawFn, originals: list[bytes]) -> bytes:
    text = draw(st.sampled_from(originals))
    for _ in range(draw(st.integers(0, 3))):
        text = draw(st.sampled_from(MUTATIONS))(draw, text)
    return text


class ExampleTimeout(Exception):
    pass


@contextlib.contextmanager
def time_limit(seconds: int) -> Iterator[None]:
    def expire(signum: int, frame: FrameType | None) -> None:
        raise ExampleTimeout(f"still running after {seconds} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def run(argv: list[str]) -> tuple[int, str]:
    err = io.StringIO()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except Exception:  # what a user would see as a traceback
            pytest.fail(f"upsguard {' '.join(argv)} raised:\n{traceback.format_exc()}")
    return code, err.getvalue()


def check(site: bytes, scenario: bytes) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        site_file, scenario_file = Path(tmp) / "site.yaml", Path(tmp) / "scenario.yaml"
        site_file.write_bytes(site)
        scenario_file.write_bytes(scenario)
        names = f"({re.escape(str(site_file))}|{re.escape(str(scenario_file))}):\\d+"
        commands = [
            ["validate", "-c", str(site_file)],
            ["plan", "shutdown", "-c", str(site_file)],
            ["simulate", "-c", str(site_file), "--scenario", str(scenario_file)],
        ]
        with time_limit(EXAMPLE_TIMEOUT_S):
            for argv in commands:
                code, err = run(argv)
                assert code in (0, 1, 2), (argv, code, err)
                for line in err.splitlines():
                    assert line.startswith("upsguard: "), (argv, line)
                    assert re.search(names, line), (argv, line)


#: Mangled files may be large (deep nesting, long numbers): that is the point, not a problem.
#: (A setting replaces the profile's list, so the profiles' too_slow is named again.)
FUZZ = settings(suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


@FUZZ
@given(site=mangled(SITES), scenario=mangled(SCENARIOS))
def test_mangled_files_give_one_line_errors(site: bytes, scenario: bytes) -> None:
    check(site, scenario)


@pytest.mark.slow
@settings(FUZZ, max_examples=1000)
@given(site=mangled(SITES), scenario=mangled(SCENARIOS))
def test_many_mangled_files_give_one_line_errors(site: bytes, scenario: bytes) -> None:
    check(site, scenario)


def test_the_examples_themselves_pass() -> None:
    for site in SITES:
        for scenario in SCENARIOS:
            check(site, scenario)
