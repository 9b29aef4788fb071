"""A command's parser is built from its own module alone (``upsguard.cli.COMMANDS``), and
reads its arguments as the parser of every command does; ``--help`` still lists them all."""

from __future__ import annotations

import argparse
import contextlib
import importlib
import io

import pytest

from upsguard.cli import COMMAND_MODULES, COMMANDS, build_parser, command_of, main


def commands_of(*modules: str) -> list[str]:
    """The commands the modules add, in the order they add them."""
    commands = argparse.ArgumentParser().add_subparsers()
    for module in modules:
        importlib.import_module(f"upsguard.cli.{module}").register(commands)
    return list(commands.choices)


@pytest.mark.parametrize("module", COMMAND_MODULES)
def test_each_module_adds_the_commands_the_table_gives_it(module: str) -> None:
    assert commands_of(module) == [c for c, m in COMMANDS.items() if m == module]


def test_the_table_lists_the_commands_in_the_order_of_help() -> None:
    assert commands_of(*COMMAND_MODULES) == list(COMMANDS)


def help_of(parser: argparse.ArgumentParser, command: str) -> str:
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit):
        parser.parse_args([command, "--help"])
    return out.getvalue()


@pytest.mark.parametrize("command", COMMANDS)
def test_a_command_built_alone_reads_as_among_them_all(command: str) -> None:
    assert help_of(build_parser(command), command) == help_of(build_parser(), command)


def test_only_a_command_first_is_built_alone() -> None:
    assert command_of(["status", "-c", "site.yaml"]) == "status"
    assert command_of(["-v", "status"]) is None  # argparse reads the options first
    assert command_of(["--help"]) is None
    assert command_of(["statsu"]) is None
    assert command_of([]) is None


def test_help_and_a_wrong_name_are_argparse_s_own(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["--help"])
    assert done.value.code == 0
    listed = capsys.readouterr().out
    assert all(command in listed for command in COMMANDS)

    with pytest.raises(SystemExit) as done:
        main(["statsu"])
    assert done.value.code == 2
    assert "invalid choice: 'statsu'" in capsys.readouterr().err


def test_an_option_before_the_command_still_reads(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main(["-v", "schema", "--help"])
    assert done.value.code == 0
    assert capsys.readouterr().out.startswith("usage: upsguard schema")
