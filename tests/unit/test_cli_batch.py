"""``validate``, ``plan`` and ``simulate`` look for garbage cycles less often while they run,
and leave the process's thresholds as they found them: a caller that runs the CLI in its
own process (a test, a script) keeps its own."""

from __future__ import annotations

import argparse
import gc

import pytest

from upsguard.cli import BATCH_COMMANDS, main
from upsguard.cli import site as site_commands

HANDLERS = {"validate": "cmd_validate", "plan": "cmd_plan", "simulate": "cmd_simulate"}


def thresholds_seen_by(handler: str, monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, ...]]:
    """The collector's thresholds each call of the site command's ``handler`` ran with."""
    seen: list[tuple[int, ...]] = []

    def record(args: argparse.Namespace) -> int:
        seen.append(gc.get_threshold())
        return 0

    monkeypatch.setattr(site_commands, handler, record)
    return seen


@pytest.mark.parametrize("command", sorted(BATCH_COMMANDS))
def test_a_batch_command_collects_less_often_and_restores_the_thresholds(
    command: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    seen = thresholds_seen_by(HANDLERS[command], monkeypatch)
    before = gc.get_threshold()
    argv = [command, "shutdown"] if command == "plan" else [command]
    assert main([*argv, "-c", "site.yaml"]) == 0
    assert seen[0][0] > before[0]
    assert gc.get_threshold() == before


def test_other_commands_keep_pythons_thresholds(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = thresholds_seen_by("cmd_schema", monkeypatch)
    assert main(["schema"]) == 0
    assert seen == [gc.get_threshold()]
