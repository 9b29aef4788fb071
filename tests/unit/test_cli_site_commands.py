"""``schema``, ``validate``, ``plan`` and ``simulate`` as a person at a terminal sees them:
one line and a non-zero exit for a mistake, words rather than Python's data for what is
shown, and nothing on stderr that the timeline already says.

Defects these reproduce (each failed before its fix): ``schema -o`` into a missing folder,
a folder or /proc printed a traceback; a scenario whose outage starts after its horizon
passed quietly with exit 0; ``validate`` said "1 caches"; the plan showed a selector's
attribute as ``{'tier': 'batch'}``; ``simulate`` printed the watch's warnings with
wall-clock times on stderr beside its own timeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from upsguard.cli import main


@pytest.mark.parametrize(
    "target", ["missing/folder/site.schema.json", ".", "/proc/site.schema.json"]
)
def test_schema_that_cannot_be_written_is_one_line_and_a_non_zero_exit(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], target: str
) -> None:
    output = tmp_path / target if not target.startswith("/") else Path(target)

    code = main(["schema", "-o", str(output)])

    err = capsys.readouterr().err
    assert code != 0
    assert err.count("\n") == 1 and "Traceback" not in err
    assert err.startswith(f"upsguard: {output}: cannot write the schema")


def test_schema_is_written_where_asked(tmp_path: Path) -> None:
    output = tmp_path / "site.schema.json"
    assert main(["schema", "-o", str(output)]) == 0
    assert output.read_text(encoding="utf-8").startswith("{")
