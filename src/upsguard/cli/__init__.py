"""The ``upsguard`` command: one entry point into the async core, one line per user error."""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Sequence

from upsguard import __version__
from upsguard.cli import cache, doctor, inventory, reports, service, site, ups, web
from upsguard.errors import UpsguardError

#: Each module adds its subcommands; the order here is the order of ``--help``.
COMMAND_MODULES = (site, ups, inventory, cache, doctor, service, reports, web)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="upsguard",
        description="UPS-aware cache policy and orderly shutdown controller.",
    )
    parser.add_argument("--version", action="version", version=f"upsguard {__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more log output")
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for module in COMMAND_MODULES:
        module.register(commands)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    level = logging.WARNING - 10 * min(args.verbose, 2)
    logging.basicConfig(level=level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
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
