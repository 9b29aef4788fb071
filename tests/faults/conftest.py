"""Fixtures of the fault-injection suite: a lab of logged devices behind a real upsd."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.faults.lab import ONLINE, Lab


@pytest.fixture
def lab(tmp_path: Path, nut_factory: Any) -> Lab:
    nut = nut_factory({"ups1": ONLINE, "ups2": ONLINE}, ext="dev")
    return Lab(tmp_path / "lab", nut)
