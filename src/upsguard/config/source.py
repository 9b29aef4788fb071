"""Reading YAML while remembering where each value came from.

Every error upsguard reports about a site file names the field path and the
``file:line`` it came from, so the loader keeps a map from path to line.
"""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import yaml

from upsguard.errors import ConfigError

try:  # libyaml is ten times faster on big sites; the pure loader gives the same result
    from yaml import CSafeLoader as _Loader
except ImportError:  # pragma: no cover - depends on how PyYAML was built
    from yaml import SafeLoader as _Loader  # type: ignore[assignment]

PathKey = tuple[str | int, ...]


@dataclass
class SourceText:
    """A parsed YAML document and, when an error needs them, the line of every path in it."""

    file: str
    data: Any
    text: str = ""

    @cached_property
    def lines(self) -> dict[PathKey, int]:
        """Computed only when a problem is reported: big sites load faster without it."""
        lines: dict[PathKey, int] = {}
        loader = _Loader(self.text)
        try:
            node = loader.get_single_node()
        finally:
            loader.dispose()
        if node is not None:
            _record_lines(node, (), lines)
        return lines

    def where(self, loc: Sequence[str | int]) -> str:
        """``site.yaml:41`` for the deepest known prefix of ``loc``."""
        best = self.lines.get((), 1)
        path: PathKey = ()
        for part in loc:
            candidate = (*path, part)
            if candidate in self.lines:
                path = candidate
                best = self.lines[candidate]
        return f"{self.file}:{best}"

    def problem(self, loc: Sequence[str | int], message: str) -> str:
        return f"{format_path(self.known_path(loc))}: {message} ({self.where(loc)})"

    def known_path(self, loc: Sequence[str | int]) -> PathKey:
        """Drop the parts of a pydantic location that are not in the file (union tags)."""
        path: PathKey = ()
        for part in loc:
            if (*path, part) in self.lines:
                path = (*path, part)
        return path if path else tuple(loc)


def format_path(path: Iterable[str | int]) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text or "(top)"


def load_yaml(path: Path) -> SourceText:
    """Parse one YAML file; a missing file or bad YAML is a ``ConfigError`` naming the line."""
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"{path}: cannot read the file: {exc.strerror}") from exc
    return parse_yaml(text, str(path))


def parse_yaml(text: str, name: str) -> SourceText:
    try:
        data = yaml.load(text, Loader=_Loader)
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        raise ConfigError(f"{name}:{line}: not valid YAML: {exc.problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{name}: not valid YAML: {exc}") from exc
    return SourceText(file=name, data=data, text=text)


def _record_lines(node: yaml.Node, path: PathKey, lines: dict[PathKey, int]) -> None:
    lines[path] = node.start_mark.line + 1
    if isinstance(node, yaml.MappingNode):
        for key_node, value_node in node.value:
            if isinstance(key_node, yaml.ScalarNode):
                child = (*path, key_node.value)
                _record_lines(value_node, child, lines)
                lines[child] = key_node.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for index, item in enumerate(node.value):
            _record_lines(item, (*path, index), lines)


def suggest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a close choice exists, else an empty string."""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""
