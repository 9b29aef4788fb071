"""``upsguard demo`` plays the whole loop with nothing but the package."""

from __future__ import annotations

import io
from pathlib import Path

from upsguard.journal import Journal
from upsguard.simulation.demo import run_demo


def test_the_demo_goes_down_and_comes_back_in_order(tmp_path: Path) -> None:
    out = io.StringIO()
    path = tmp_path / "demo.sqlite"
    journal = Journal(path)
    report = run_demo(speed=0, out=out, observers=[journal.write.record])
    journal.close()
    assert report.final_phase == "normal"
    text = out.getvalue()
    order = [
        "phase normal -> on_battery",
        "esx01-flash -> write-through",
        "shedding",
        "phase shedding -> shutting_down",
        "point of no return",
        "phase shutting_down -> down",
        "phase down -> recovering",
        "startup runbook done",
        "phase recovering -> normal",
        "esx01-flash -> write-back",
    ]
    positions = [text.index(marker) for marker in order]
    assert positions == sorted(positions), text
    assert "start:nas01" in text and text.index("start:nas01") < text.index("start:esx01")
    assert "waiting for esx01-flash to be clean" in text
    journal = Journal(path)
    assert [r.kind for r in journal.read.runs(with_steps=False)] == [
        "startup",
        "shutdown",
        "shedding",
    ]
    journal.close()
