"""Checks of the site file's values that need no model: plain functions, without pydantic,
so that what reads the site file without building it (``api_socket``, for ``status`` and
``hold``) and the YAML reader (``source``) load quickly (``bench/cli_start.py``).
``config.types`` builds ``LocalPath`` on ``check_local_path``."""

from __future__ import annotations

import os
from pathlib import Path


def shorten(value: object, limit: int = 60) -> str:
    """``repr`` of a value echoed in an error, cut to ``limit`` characters with an ellipsis:
    a pasted log or a megabyte of junk must not become the error line."""
    try:
        text = value if isinstance(value, str) else repr(value)
    except ValueError:  # an int of more than 4,300 digits has no repr
        text = "a number too long to show"
    return text if len(text) <= limit else text[: limit - 1] + "…"


#: Linux's limits (``NAME_MAX``, ``PATH_MAX`` less its NUL): a longer path fails only when
#: first used, as ``File name too long`` from whichever command touched it first.
NAME_MAX = 255
PATH_MAX = 4095


def check_local_path(value: Path) -> Path:
    """A path Linux can open: refused here, with the field's line, rather than at 3 a.m."""
    text = str(value)
    if "\0" in text:
        raise ValueError("a path cannot hold a NUL character")
    size = len(os.fsencode(text))
    if size > PATH_MAX:
        raise ValueError(f"a path of {size} bytes is longer than {PATH_MAX}, the most Linux takes")
    for name in value.parts:
        if len(os.fsencode(name)) > NAME_MAX:
            raise ValueError(
                f"{shorten(repr(name))} is longer than {NAME_MAX} bytes, the most a file name "
                "may have on Linux"
            )
    return value
