"""Find which field names a model accepts at a path, for 'did you mean' hints."""

from __future__ import annotations

import types
import typing
from typing import Any

from pydantic import BaseModel


def fields_at(model: type[BaseModel], path: tuple[str | int, ...], data: Any) -> list[str]:
    current: Any = model
    value: Any = data
    for part in path:
        value = _child(value, part)
        current = _step(current, part, value)
        if current is None:
            return []
    models = _models_in(current, value)
    return sorted({name for m in models for name in m.model_fields})


def _child(value: Any, part: str | int) -> Any:
    if isinstance(value, dict):
        return value.get(part)
    if isinstance(value, list) and isinstance(part, int) and part < len(value):
        return value[part]
    return None


def _step(annotation: Any, part: str | int, value: Any) -> Any:
    for model in _models_in(annotation, value):
        if isinstance(part, str) and part in model.model_fields:
            return model.model_fields[part].annotation
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _step(args[0], part, value)
    if origin in (list, tuple) and args:
        return args[0]
    if origin is dict and len(args) == 2:
        return args[1]
    if origin in (typing.Union, types.UnionType):
        for arg in args:
            found = _step(arg, part, value)
            if found is not None:
                return found
    return None


def _models_in(annotation: Any, value: Any) -> list[type[BaseModel]]:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return [annotation]
    origin = typing.get_origin(annotation)
    args = typing.get_args(annotation)
    if origin is typing.Annotated:
        return _models_in(args[0], value)
    if origin in (typing.Union, types.UnionType):
        found = [m for arg in args for m in _models_in(arg, value)]
        tagged = [m for m in found if _matches_tag(m, value)]
        return tagged or found
    return []


def _matches_tag(model: type[BaseModel], value: Any) -> bool:
    if not isinstance(value, dict):
        return False
    for key in ("type", "provider"):
        field = model.model_fields.get(key)
        if field is not None and key in value:
            return value[key] in typing.get_args(field.annotation)
    return False
