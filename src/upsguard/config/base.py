"""The base of every site-file model: strict about unknown keys, immutable once loaded."""

from __future__ import annotations

import re
import typing
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator

from upsguard.config.types import LocalPath


class Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


#: Keys that hold a secret itself (``password``, ``api_token``, ``priv_key``), as opposed to
#: where to find one (``password_file``, ``token_env``) or a name (``token_name``).
_INLINE_SECRET = re.compile(r"(^|_)(password|passphrase|community|token|secret|key)$")


def refuse_inline_secrets(data: object, nested: bool = False) -> object:
    """A before-validator: a secret written in the site file itself is refused, saying where
    to put it instead; its value is never repeated. With ``nested`` (a third-party plugin's
    settings, whose shape is unknown here) mappings inside are searched too."""
    if isinstance(data, dict):
        for key, value in data.items():
            if isinstance(key, str) and _INLINE_SECRET.search(key):
                name = key if len(key) <= 40 else key[:39] + "…"
                raise ValueError(
                    f"inline '{name}' is not accepted: put it in a file ({name}_file) "
                    f"or an environment variable ({name}_env)"
                )
            if nested:
                refuse_inline_secrets(value, nested)
    elif isinstance(data, list) and nested:
        for item in data:
            refuse_inline_secrets(item, nested)
    return data


class Credentials(Model):
    """A user and where to find the password: a file or an environment variable, never inline."""

    user: str | None = None
    password_file: LocalPath | None = None
    password_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_inline_password(cls, data: object) -> object:
        return refuse_inline_secrets(data)


def union_tags(union: Any) -> frozenset[str]:
    """The built-in type names: the tags of a discriminated union of settings models, so the
    union is the one list of them here (``plugins/registry.py`` maps them to classes)."""
    members = typing.get_args(typing.get_args(union)[0])
    return frozenset(m.__metadata__[0].tag for m in members) - {"external"}
