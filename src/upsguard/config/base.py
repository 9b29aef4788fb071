"""The base of every site-file model: strict about unknown keys, immutable once loaded."""

from __future__ import annotations

import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, model_validator


class Model(BaseModel):
    model_config = ConfigDict(
        extra="forbid", frozen=True, populate_by_name=True, allow_inf_nan=False
    )


class Credentials(Model):
    """A user and where to find the password: a file or an environment variable, never inline."""

    user: str | None = None
    password_file: Path | None = None
    password_env: str | None = None

    @model_validator(mode="before")
    @classmethod
    def _no_inline_password(cls, data: object) -> object:
        if isinstance(data, dict) and "password" in data:
            raise ValueError(
                "inline 'password' is not accepted: put it in a file (password_file) "
                "or an environment variable (password_env)"
            )
        return data


def union_tags(union: Any) -> frozenset[str]:
    """The built-in type names: the tags of a discriminated union of settings models, so the
    union is the one list of them here (``plugins/registry.py`` maps them to classes)."""
    members = typing.get_args(typing.get_args(union)[0])
    return frozenset(m.__metadata__[0].tag for m in members) - {"external"}
