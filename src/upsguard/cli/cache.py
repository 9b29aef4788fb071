"""Subcommands of `upsguard` (filled in by its own issue)."""

from __future__ import annotations

from upsguard.cli.common import Subparsers


def register(commands: Subparsers) -> None:
    """Add this module's subcommands to the `upsguard` parser."""
