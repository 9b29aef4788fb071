"""Reading a site or scenario file from disk: a regular file, within a size limit, in UTF-8.

``-c /dev/zero`` would otherwise read until memory runs out, and ``-c`` on a FIFO would wait
for a writer forever; so only regular files are read, opened without blocking, and no more
than ``MAX_FILE_BYTES`` of them. Every refusal is one ``ConfigError`` line naming the file.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from upsguard.errors import ConfigError

#: The largest site or scenario file read (a 20,000-resource site takes about 2 MiB).
MAX_FILE_BYTES = 16 * 1024 * 1024


def read_text(path: Path, limit: int = MAX_FILE_BYTES) -> str:
    """The file's text; raises ``ConfigError`` for anything but a readable regular UTF-8
    file of at most ``limit`` bytes."""
    raw = read_bytes(path, limit)
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        raise ConfigError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}): save the file as UTF-8"
        ) from None


def read_bytes(path: Path, limit: int) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO returns at once instead of waiting for a writer
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror}") from None
    with os.fdopen(fd, "rb") as file:
        if not stat.S_ISREG(os.fstat(file.fileno()).st_mode):
            raise ConfigError(f"{path}: not a regular file: give the path of a YAML file")
        try:
            raw = file.read(limit + 1)
        except OSError as exc:
            raise ConfigError(f"{path}: cannot read the file: {exc.strerror}") from None
    if len(raw) > limit:
        raise ConfigError(
            f"{path}: larger than {_size_text(limit)}, the most upsguard reads: "
            "is this the right file?"
        )
    return raw


def _size_text(limit: int) -> str:
    if limit % (1024 * 1024) == 0:
        return f"{limit // (1024 * 1024)} MiB"
    return f"{limit // 1024} KiB"
