"""The files a site file names for upsguard to read: secrets, keys, CA bundles, known hosts.

``validate`` warns of each one that is missing (with its ``file:line``), and ``upsguard
doctor`` checks each is readable and that no secret is readable by everyone. Files
upsguard writes (the journal, the socket, state directories) are not among them.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from pydantic import BaseModel

from upsguard.config.site import SiteConfig

Loc = tuple[str | int, ...]

#: Fields that name a file holding a secret (a password, a key, a token).
SECRET_FIELDS = frozenset(
    {
        "password_file",
        "key_file",
        "community_file",
        "auth_key_file",
        "priv_key_file",
        "token_file",
        "bearer_token_file",
        "value_file",
    }
)
#: Fields that name a file upsguard reads but that holds no secret.
PUBLIC_FIELDS = frozenset({"ca_file", "known_hosts"})
FILE_FIELDS = SECRET_FIELDS | PUBLIC_FIELDS


@dataclass(frozen=True, slots=True)
class NamedFile:
    loc: Loc
    """Where the site file names it (``("ups", 1, "nut", "password_file")``)."""
    path: Path
    secret: bool


def named_files(site: SiteConfig) -> list[NamedFile]:
    """Every file the site names for upsguard to read, in the order of the site file."""
    return list(_walk(site, ()))


def _walk(value: object, loc: Loc) -> Iterator[NamedFile]:
    """Into models, lists and dicts only: a site of thousands of resources has a hundred
    thousand plain values, none of which names a file."""
    items: Iterable[tuple[str | int, object]]
    if isinstance(value, BaseModel):
        items = ((name, getattr(value, name)) for name in type(value).model_fields)
    elif isinstance(value, list):
        items = enumerate(value)
    elif isinstance(value, dict):
        items = ((str(key), item) for key, item in value.items())
    else:
        return
    for key, child in items:
        if isinstance(child, Path) and key in FILE_FIELDS:
            yield NamedFile((*loc, key), child, key in SECRET_FIELDS)
        elif isinstance(child, BaseModel | list | dict):
            yield from _walk(child, (*loc, key))


def missing(named: NamedFile) -> str | None:
    """Why the file cannot be read here, in a few words, or None when it can."""
    try:
        mode = named.path.stat().st_mode
    except FileNotFoundError:
        return f"{named.path} does not exist"
    except OSError as exc:
        return f"{named.path}: {exc.strerror}"
    if not stat.S_ISREG(mode):
        return f"{named.path} is not a regular file"
    if not os.access(named.path, os.R_OK):
        return f"{named.path} cannot be read by this user"
    return None


def world_readable(named: NamedFile) -> bool:
    try:
        return bool(named.path.stat().st_mode & stat.S_IROTH)
    except OSError:
        return False
