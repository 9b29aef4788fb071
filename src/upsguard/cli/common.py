"""What every subcommand shares: the site-file option, output formats, the async entry.

A command's module is imported to build its parser, and ``--help`` imports them all
(``upsguard.cli``), so each imports at its top only what building its parser needs; what a
command does (the site file's models, the plugins, the service, rich, asyncio) is imported
by the command's handler, and a command loads only its own (``bench/cli_start.py``).
"""

from __future__ import annotations

import argparse
import json
import os
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

if TYPE_CHECKING:
    from upsguard.config import SiteConfig

T = TypeVar("T")
Handler = Callable[[argparse.Namespace], int]
Subparsers = Any  # argparse._SubParsersAction has no public type

DEFAULT_SITE = Path(os.environ.get("UPSGUARD_SITE", "/etc/upsguard/site.yaml"))


def add_site_option(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "-c",
        "--config",
        type=Path,
        default=DEFAULT_SITE,
        metavar="SITE.yaml",
        help="the site file (default: $UPSGUARD_SITE or /etc/upsguard/site.yaml)",
    )


def add_format_option(parser: argparse.ArgumentParser, *choices: str) -> None:
    formats = choices or ("text", "json")
    parser.add_argument("--format", choices=formats, default=formats[0], help="output format")


def duration_seconds(text: str) -> float:
    """An argparse type: ``30s``, ``5m``, ``1h`` as seconds."""
    from upsguard.config.types import parse_duration

    try:
        return parse_duration(text).total_seconds()
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def site_of(args: argparse.Namespace) -> SiteConfig:
    """The site file, checked against the plugins installed here, as ``run`` would use it."""
    from upsguard.config import load_site
    from upsguard.plugins import catalog

    return load_site(args.config, catalog.names)


def run_async(coro: Coroutine[Any, Any, T]) -> T:
    """The one way the CLI enters the async core; asyncio is imported here, as ``status``
    and ``hold`` to a running service never enter it."""
    import asyncio

    return asyncio.run(coro)


def print_json(value: Any) -> None:
    print(json.dumps(value, indent=2, default=str))
