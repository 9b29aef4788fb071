"""The files a site file names for upsguard to read: secrets, keys, CA bundles, known hosts.

``validate`` warns of each one that is missing (with its ``file:line``), and ``upsguard
doctor`` checks each is readable and that no secret is readable by everyone. Files
upsguard writes (the journal, the socket, state directories) are not among them.
"""

from __future__ import annotations

import functools
import os
import stat
import typing
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePath

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
        "secret_file",
        "session_key_file",
        "url_file",
    }
)
#: Fields that name a file upsguard reads but that holds no secret.
PUBLIC_FIELDS = frozenset({"ca_file", "cert_file", "known_hosts"})
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
    """Into models, lists and dicts only, and in a model into the fields whose type can hold
    a file (``_fields_to_walk``): a site of thousands of resources has a hundred thousand
    plain values, none of which names a file."""
    items: Iterable[tuple[str | int, object]]
    if isinstance(value, BaseModel):
        items = ((name, getattr(value, name)) for name in _fields_to_walk(type(value)))
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


@functools.cache
def _fields_to_walk(model: type[BaseModel]) -> tuple[str, ...]:
    """The fields of ``model`` that can name a file, or hold a model, list or dict that can;
    read from the field types once per model class. On the 5,000-VM bench site, reading every
    field of every resource took a quarter of ``validate``; of a resource's thirty fields only
    ``health`` can lead to a file."""
    return tuple(_fields_that_can_hold_a_file(model, frozenset({model})))


def _fields_that_can_hold_a_file(model: type[BaseModel], models: frozenset[type]) -> Iterator[str]:
    for name, field in model.model_fields.items():
        if name in FILE_FIELDS or _can_hold_a_file(field.annotation, models):
            yield name


def _can_hold_a_file(annotation: object, models: frozenset[type]) -> bool:
    """Whether a value of this type can be or hold a path: a ``Path``, or a model, list,
    tuple or dict that can. ``models``: those looked into already (a model that holds itself).
    A type this does not know (``Any``, a name not resolved) may: it is walked."""
    origin = typing.get_origin(annotation)
    if origin is typing.Literal:
        return False
    if origin is typing.Annotated:
        return _can_hold_a_file(typing.get_args(annotation)[0], models)
    if origin is not None:  # a union, list[X], dict[K, V], tuple[X, ...]
        args = [a for a in typing.get_args(annotation) if a is not Ellipsis]
        return not args or any(_can_hold_a_file(a, models) for a in args)
    if isinstance(annotation, typing.NewType):  # ResourceId: a str
        return _can_hold_a_file(annotation.__supertype__, models)
    if not isinstance(annotation, type):
        return True  # Any, a forward reference: to be safe
    if issubclass(annotation, BaseModel):
        if annotation in models:
            return True
        inner = models | {annotation}
        return next(_fields_that_can_hold_a_file(annotation, inner), None) is not None
    if issubclass(annotation, PurePath):
        return True
    return annotation is object or issubclass(annotation, list | tuple | dict | set | frozenset)


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
