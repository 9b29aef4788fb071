"""docs/architecture.md names every folder of the package, and only those: a newcomer finds
any behaviour from its table, so the table must not drift from the tree."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "src" / "upsguard"


def test_the_architecture_table_names_every_folder_and_every_core_module() -> None:
    text = (ROOT / "docs" / "architecture.md").read_text()
    table = text[text.index("## The folders") : text.index("## The life of a run")]
    named = set(re.findall(r"^\| `(\w+)/` \|", table, re.M))
    folders = {p.name for p in PACKAGE.iterdir() if (p / "__init__.py").exists()}
    assert named == folders
    core_row = next(line for line in table.splitlines() if line.startswith("| core |"))
    core = {p.name for p in PACKAGE.glob("*.py") if p.name not in ("__init__.py", "__main__.py")}
    assert {m for m in core if f"`{m}`" not in core_row} == set()
