"""The ``upsguard`` command: one entry point into the async core, one line per user error.

A command imports what it uses and nothing of the other commands: its parser is built from
its own module alone (``COMMANDS``), so ``upsguard status`` does not import what ``cache``
or ``doctor`` import to build theirs (``bench/cli_start.py``). ``--help``, and anything that
does not begin with a command's name, builds them all.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import sys
from collections.abc import Iterator, Sequence

from upsguard import __version__
from upsguard.cli import logs
from upsguard.errors import UpsguardError

#: The modules (of ``upsguard.cli``) that add the subcommands, each with ``register``; the
#: order here is the order of ``--help``.
COMMAND_MODULES = (
    "init",
    "site",
    "ups",
    "inventory",
    "cache",
    "doctor",
    "service",
    "reports",
    "web",
)
#: The module that adds each command (``tests/unit/test_cli_dispatch.py`` keeps it true).
COMMANDS = {
    "init": "init",
    "validate": "site",
    "schema": "site",
    "plan": "site",
    "simulate": "site",
    "ups": "ups",
    "inventory": "inventory",
    "cache": "cache",
    "doctor": "doctor",
    "drill": "doctor",
    "run": "service",
    "status": "service",
    "hold": "service",
    "release": "service",
    "trigger": "service",
    "abort": "service",
    "history": "service",
    "events": "service",
    "demo": "service",
    "report": "reports",
    "runbook": "reports",
    "battery": "reports",
    "web-password": "web",
}
#: The commands that read a whole site, plan and simulate it, and end: ``collecting_for_a_batch``.
BATCH_COMMANDS = frozenset({"validate", "plan", "simulate"})


@contextlib.contextmanager
def collecting_for_a_batch() -> Iterator[None]:
    """Python looks for garbage cycles after every 700 new objects, and every tenth and
    hundredth time it walks the older objects too. On a 5,000-VM site those are the tens of
    thousands of objects that the site, its plans and the simulated world hold until the
    command ends: no garbage, walked again and again, a fifth of ``bench/plan_scale.py``'s
    time. A command that reads a site and ends looks after 300,000 new objects instead, as
    mypy raises its own (after 100,000, the bench took 0.04 s more). What it can cost is
    memory that a garbage cycle holds a little longer, in a command that ends (the peak RSS
    of ``simulate`` on that site grew by 0.7 MiB). The service keeps Python's own
    thresholds, which bound its memory."""
    before = gc.get_threshold()
    gc.set_threshold(300_000, 50, 100)
    try:
        yield
    finally:
        gc.set_threshold(*before)


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``command`` alone (the other commands' modules are not imported), or,
    without one, of every command."""
    parser = argparse.ArgumentParser(
        prog="upsguard",
        description="UPS-aware cache policy and orderly shutdown controller.",
    )
    parser.add_argument("--version", action="version", version=f"upsguard {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name in (COMMANDS[command],) if command else COMMAND_MODULES:
        importlib.import_module(f"{__name__}.{name}").register(commands)
    return parser


def command_of(argv: Sequence[str]) -> str | None:
    """The command ``argv`` begins with, or None. With options before it (``-v status``), or
    no command at all, every command's parser is built: argparse alone says what they mean,
    or prints the help of them all."""
    return argv[0] if argv and argv[0] in COMMANDS else None


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    args = build_parser(command_of(argv)).parse_args(argv)
    logs.configure(args.verbose)
    batch = args.command in BATCH_COMMANDS
    try:
        with collecting_for_a_batch() if batch else contextlib.nullcontext():
            code: int = args.handler(args)
    except UpsguardError as exc:
        for line in str(exc).splitlines() or [type(exc).__name__]:
            print(f"upsguard: {line}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        print("upsguard: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return 0
    return code


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
