"""How site files read as YAML: version 1.2, merges, aliases, and problems with their place."""

from __future__ import annotations

from pathlib import Path

import pytest

from upsguard.config.source import parse_yaml
from upsguard.errors import ConfigError


def data(text: str) -> object:
    return parse_yaml(text, "f.yaml").data


def problem(text: str) -> str:
    with pytest.raises(ConfigError) as info:
        parse_yaml(text, "f.yaml")
    (only,) = info.value.problems
    return only


def test_yaml_1_2_scalars() -> None:
    assert data("a: [no, on, yes, true, 1:30, 017, 0o17, 0x1f, 1_000, .5, ~, 2024-01-01, =]") == {
        "a": ["no", "on", "yes", True, "1:30", 17, 15, 31, 1000, 0.5, None, "2024-01-01", "="]
    }


def test_merges_take_the_earlier_mapping_and_the_own_keys_first() -> None:
    text = "base: &b {a: 1, b: 1}\nmore: &m {a: 2, c: 2}\nx: {<<: [*b, *m], c: 3}\n"
    assert data(text)["x"] == {"a": 1, "b": 1, "c": 3}  # type: ignore[index]


def test_an_alias_shares_its_anchor_value() -> None:
    loaded = data("x: &a {b: [1]}\ny: *a\n")
    assert loaded == {"x": {"b": [1]}, "y": {"b": [1]}}


def test_an_alias_inside_its_own_anchor_is_refused() -> None:
    assert problem("a: 1\nloop: &l [x, *l]\n") == (
        "loop: an alias inside its own anchor: the value would contain itself (f.yaml:2)"
    )


def test_a_list_as_a_key_is_refused() -> None:
    assert problem("ups:\n  ? [a, b]\n  : 1\n") == (
        "ups: a key is a word or a number, not a list or mapping (f.yaml:2)"
    )


def test_merge_keys_given_twice() -> None:
    assert problem("x: {<<: {a: 1}, <<: {b: 1}}\n") == (
        "x.<<: '<<' given twice: merge a list, <<: [*a, *b] (f.yaml:1)"
    )


def test_a_merge_of_a_word() -> None:
    assert problem("x:\n  <<: word\n") == (
        "x.<<: '<<' merges a mapping or a list of mappings (f.yaml:2)"
    )


def test_a_control_character_names_its_line() -> None:
    assert problem("a: 1\nb: x\x01y\n") == (
        "f.yaml:2: not valid YAML: character U+0001 is not allowed: control characters are "
        "not allowed"
    )


def test_a_number_python_cannot_read() -> None:
    assert problem("a:\n  b: 0b_\n") == "a.b: cannot read '0b_' as a number (f.yaml:2)"


def test_two_documents_are_refused() -> None:
    assert problem("a: 1\n---\nb: 2\n").startswith("f.yaml:2: not valid YAML: but found another")


EXAMPLES = sorted((Path(__file__).resolve().parents[2] / "config" / "examples").rglob("*.yaml"))
PLAIN = (
    "a: [no, on, yes, true, 1:30, 017, 0o17, 0x1f, 1_000, .5, -.inf, ~, '', 2024-01-01, =]\n"
    "b: {'1': x, 1: y, 1.5: z, null: n, 'q: r': \"s\\tt\"}\n"
    "c:\n  - - deep\n    - [1, {x: [2]}]\n  - {}\n  - []\n"
    "d: |\n  two\n  lines\n"
    "e:\n"
)


@pytest.mark.parametrize(
    "text",
    [PLAIN, *(p.read_text(encoding="utf-8") for p in EXAMPLES)],
    ids=["plain", *(p.name for p in EXAMPLES)],
)
def test_an_anchor_does_not_change_how_the_rest_reads(text: str) -> None:
    """Plain files are read from the parser's events, files with anchors through the node
    tree: both must give the same values, of the same types."""
    plain = data(text)
    anchored = data(text.rstrip("\n") + "\nzz_anchor: &z 1\nzz_alias: *z\n")
    assert isinstance(anchored, dict)
    assert (anchored.pop("zz_anchor"), anchored.pop("zz_alias")) == (1, 1)
    assert repr(anchored) == repr(plain)


def test_a_problem_in_a_plain_file_names_its_line() -> None:
    assert problem("a: 1\nb:\n  c: 2\n  c: 3\n") == "b.c: key given twice: keep one (f.yaml:4)"
