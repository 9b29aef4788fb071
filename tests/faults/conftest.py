"""Fixtures of the fault-injection suite: a lab of logged devices behind a real upsd."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import ONLINE, Lab


@pytest.fixture
def lab(tmp_path: Path, nut_factory: Any) -> Iterator[Lab]:
    nut = nut_factory({"ups1": ONLINE, "ups2": ONLINE}, ext="dev")
    lab = Lab(tmp_path / "lab", nut)
    yield lab
    lab.release_all()
