"""Reading YAML while remembering where each value came from.

Every error upsguard reports about a site file names the field path and the
``file:line`` it came from, so the loader keeps a map from path to line.

Site files are read as YAML 1.2 by ryaml (Rust): a 5,000-VM site parses in
50 ms where PyYAML takes 600 ms. YAML 1.2 also spares users 1.1's surprises
(``no`` and ``on`` as booleans, ``1:30`` as a number) and duplicate keys are
an error instead of the last one silently winning. Merge keys (``<<``) are
applied here. PyYAML, only when an error is reported, maps paths to lines.
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any

import ryaml
import yaml

from upsguard.errors import ConfigError

try:  # libyaml maps lines ten times faster; the pure loader gives the same result
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
        data = ryaml.loads(text)
    except ValueError as exc:  # ryaml's InvalidYamlError, or a key YAML allows and Python not
        raise ConfigError(_yaml_problem(name, str(exc))) from None
    source = SourceText(file=name, data=data, text=text)
    if "<<" in text:
        source.data = _merged(data)
    if "!" in text:
        tag = _custom_tag(source.data, ())
        if tag is not None:
            path, name_of_tag = tag
            raise ConfigError(source.problem(path, f"YAML tag '{name_of_tag}' is not supported"))
    return source


_AT_LINE = re.compile(r" at line (\d+) column \d+")


def _yaml_problem(name: str, message: str) -> str:
    """``site.yaml:3: not valid YAML: <what>`` from ryaml's "<what> at line 3 column 5"."""
    found = _AT_LINE.search(message)
    line = found.group(1) if found else "1"
    what = message[: found.start()] if found else message
    if "unhashable type" in what:  # ``? [a, b]`` keys: valid YAML, no use in a site file
        what = "a key must be a single word or number, not a list or mapping"
    return f"{name}:{line}: not valid YAML: {what}"


def _merged(value: Any) -> Any:
    """Apply YAML merge keys: ``<<: *base`` (or a list of them; earlier ones win) under
    the mapping's own keys."""
    if isinstance(value, list):
        return [_merged(v) for v in value]
    if not isinstance(value, dict):
        return value
    out: dict[Any, Any] = {}
    bases = value.get("<<")
    for base in reversed(bases if isinstance(bases, list) else [bases] if bases else []):
        if isinstance(base, dict):
            out.update(_merged(base))
    out.update({k: _merged(v) for k, v in value.items() if k != "<<"})
    return out


def _custom_tag(value: Any, path: PathKey) -> tuple[PathKey, str] | None:
    """ryaml turns ``!include x`` into ``{"!include": "x"}``; no site field is written so."""
    if isinstance(value, dict):
        if len(value) == 1 and str(next(iter(value))).startswith("!"):
            return path, str(next(iter(value)))
        items: Iterable[tuple[Any, Any]] = value.items()
    elif isinstance(value, list):
        items = enumerate(value)
    else:
        return None
    for key, child in items:
        found = _custom_tag(child, (*path, key))
        if found is not None:
            return found
    return None


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
