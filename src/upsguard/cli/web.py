"""``web-password``: the hash of a web page user's password, for the site file's
``web.users`` (docs/web.md). The password is read from the terminal (asked twice) or
from the first line of standard input; it is never printed, only its argon2id hash. One
shorter than ``MIN_PASSWORD`` characters is refused (exit 2): argon2 slows each guess, it
cannot make a short password long."""

from __future__ import annotations

import argparse
import getpass
import re
import sys

from upsguard.cli.common import Subparsers
from upsguard.errors import ConfigError, PermanentError


def register(commands: Subparsers) -> None:
    p = commands.add_parser(
        "web-password", help="hash a web page user's password for the site file"
    )
    p.add_argument("--name", help="print a whole web.users entry for this user")
    p.add_argument("--role", choices=("viewer", "operator"), default="viewer")
    p.set_defaults(handler=cmd_web_password)


def cmd_web_password(args: argparse.Namespace) -> int:
    from upsguard.controller.web.auth import MIN_PASSWORD, hash_password

    if args.name and not re.fullmatch(r"[A-Za-z0-9._@+-]{1,64}", args.name):
        raise PermanentError(
            f"--name {args.name[:64]!r}: letters, digits and . _ @ + - only, 64 at most"
        )
    password = _password()
    if len(password) < MIN_PASSWORD:
        raise ConfigError(
            f"the password is {len(password)} characters: give {MIN_PASSWORD} at least "
            "(a few words make a good one)"
        )
    hashed = hash_password(password)
    if args.name:
        print(f'- {{name: {args.name}, role: {args.role}, password_hash: "{hashed}"}}')
    else:
        print(hashed)
    return 0


def _password() -> str:
    if not sys.stdin.isatty():
        return sys.stdin.readline().rstrip("\r\n")
    first = getpass.getpass("password: ")
    if getpass.getpass("again: ") != first:
        raise PermanentError("the two passwords differ; nothing printed")
    return first
