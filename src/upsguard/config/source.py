"""A parsed YAML file and where each value in it came from.

Every error upsguard reports about a site file names the field path and the
``file:line`` it came from. The parse (``upsguard.config.parsing``) gives the data; the
node tree, which holds the lines, is composed from the text only when a problem is
reported, and is let go with the ``SourceText`` once the file is checked. A problem found
later (the simulator's, on UPS entries) is placed by an ``Origin``, which keeps the text.
"""

from __future__ import annotations

import difflib
import functools
import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from upsguard.config.parsing import NodeProblem, parse, tree
from upsguard.config.reading import read_text
from upsguard.config.values import shorten
from upsguard.errors import ConfigError

PathKey = tuple[str | int, ...]


@dataclass
class SourceText:
    """A parsed YAML document and its text, from which lines are read on demand."""

    file: str
    data: Any
    text: str = field(default="", repr=False)
    _keys: dict[int, dict[str, tuple[int, Node]]] = field(
        default_factory=dict, init=False, repr=False
    )

    @functools.cached_property
    def root(self) -> Node | None:
        """The node tree, composed on the first problem to place."""
        return tree(self.text)

    def where(self, loc: Sequence[Any]) -> str:
        """``site.yaml:41`` for the deepest prefix of ``loc`` that is in the file."""
        return f"{self.file}:{self._line(loc)}"

    def problem(self, loc: Sequence[Any], message: str) -> str:
        return f"{format_path(self.known_path(loc))}: {message} ({self.where(loc)})"

    def known_path(self, loc: Sequence[Any]) -> PathKey:
        """Drop the parts of a pydantic location that are not in the file (union tags)."""
        path: list[Any] = []
        node = self.root
        for part in loc:
            found = self._step(node, part)
            if found is not None:
                path.append(part)
                node = found[1]
        return tuple(path) if path else tuple(loc)

    def _line(self, loc: Sequence[Any]) -> int:
        node = self.root
        if node is None:
            return 1
        line = int(node.start_mark.line) + 1
        for part in loc:
            found = self._step(node, part)
            if found is not None:
                line, node = found
        return line

    def _step(self, node: Node | None, part: Any) -> tuple[int, Node] | None:
        """The line and node of ``part`` under ``node``; a mapping entry's line is its key's.
        A mapping's keys are indexed on first use: a file with thousands of problems in
        one big mapping must not search it once per problem."""
        if isinstance(node, MappingNode):
            if id(node) not in self._keys:
                self._keys[id(node)] = _key_index(node)
            return self._keys[id(node)].get(str(part))
        if isinstance(node, SequenceNode) and isinstance(part, int) and 0 <= part < len(node.value):
            item = node.value[part]
            return int(item.start_mark.line) + 1, item
        return None

    def origin(self, paths: Iterable[PathKey]) -> Origin:
        """What places problems with ``paths`` found after the tree is let go."""
        return Origin(self.file, self.text, tuple(tuple(p) for p in paths))


@dataclass(frozen=True)
class Origin:
    """The file, its text and a few paths in it, for problems found after loading (the
    simulator's checks, the service's warnings)."""

    file: str
    text: str = field(default="", repr=False)
    paths: tuple[PathKey, ...] = field(default=(), repr=False)

    @functools.cached_property
    def lines(self) -> dict[PathKey, int]:
        """The line of each path, from a tree composed once, on the first problem, and let
        go at once: most sites never have one, and a big site's tree is big."""
        source = SourceText(self.file, None, self.text)
        return {path: source._line(path) for path in self.paths}

    def problem(self, loc: Sequence[str | int], message: str) -> str:
        line = 1
        for size in range(len(loc), 0, -1):
            if tuple(loc[:size]) in self.lines:
                line = self.lines[tuple(loc[:size])]
                break
        return f"{format_path(loc)}: {message} ({self.file}:{line})"


def _key_index(node: MappingNode) -> dict[str, tuple[int, Node]]:
    """Each key's line and value node, the keys a merge (``<<``) brings in included, at the
    line where they are written: that is where a problem with one is fixed. They win as
    they do in the data (``parsing._Builder``): the mapping's own keys over merged ones, and
    of the merged mappings the earlier."""
    merged: dict[str, tuple[int, Node]] = {}
    own: dict[str, tuple[int, Node]] = {}
    for key, value in node.value:
        if not isinstance(key, ScalarNode):
            continue
        if key.tag == _MERGE:
            sources = value.value if isinstance(value, SequenceNode) else [value]
            for source in reversed(sources):
                if isinstance(source, MappingNode):
                    merged.update(_key_index(source))
        else:
            own[str(key.value)] = (int(key.start_mark.line) + 1, value)
    return {**merged, **own}


_MERGE = "tag:yaml.org,2002:merge"


def _path_to(root: Node, line: int, column: int) -> PathKey:
    """The path of the node (or mapping key) at ``line``/``column``; () when none is.
    Depth first, each node once: an alias shares its anchor's node."""
    seen: set[int] = set()
    work: list[tuple[Node, PathKey]] = [(root, ())]
    while work:
        node, path = work.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if _at(node, line, column):
            return path
        if isinstance(node, MappingNode):
            for key, value in node.value:
                if not isinstance(key, ScalarNode):  # a list as a key: the mapping is the place
                    if _at(key, line, column):
                        return path
                    continue
                child = (*path, key.value)
                if _at(key, line, column):
                    return child
                work.append((value, child))
        elif isinstance(node, SequenceNode):
            work.extend((item, (*path, i)) for i, item in enumerate(node.value))
    return ()


def _at(node: Node, line: int, column: int) -> bool:
    return bool(node.start_mark.line == line and node.start_mark.column == column)


def format_path(path: Iterable[Any]) -> str:
    text = ""
    for part in path:
        if isinstance(part, int) and not isinstance(part, bool):
            text += f"[{part}]"
        else:
            name = shorten(part if isinstance(part, str) else repr(part), 40)
            text += f".{name}" if text else name
    return text or "(top)"


def load_yaml(path: Path) -> SourceText:
    """Parse one YAML file; a missing file or bad YAML is a ``ConfigError`` naming the line."""
    return parse_yaml(read_text(path), str(path))


def parse_yaml(text: str, name: str) -> SourceText:
    try:
        data = parse(text, name)
    except NodeProblem as problem:
        raise ConfigError(_node_problem(name, problem, tree(text))) from None
    return SourceText(file=name, data=data, text=text)


def _node_problem(name: str, problem: NodeProblem, root: Node | None) -> str:
    path = _path_to(root, problem.line, problem.column) if root is not None else ()
    message = problem.message
    if is_secret(path):
        message = "not a valid value (not shown: the field holds a secret)"
    return f"{format_path(path)}: {message} ({name}:{problem.line + 1})"


_SECRET = re.compile(r"password|community|token|secret|(^|_)key($|_)")


def is_secret(path: Iterable[Any]) -> bool:
    """Whether a path leads into a field that may hold a secret: its value is never shown."""
    return any(isinstance(part, str) and _SECRET.search(part) for part in path)


def suggest(word: str, choices: Iterable[str]) -> str:
    """`` (did you mean 'x'?)`` when a close choice exists, else an empty string."""
    if len(word) > 100:  # difflib is quadratic: a pasted paragraph is no typo
        return ""
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


class Suggestions:
    """``did you mean`` hints for many names against one list of choices. difflib compares
    a name with every choice: thousands of unknown names against thousands of resources took
    minutes. So each distinct name is looked up once, and only the first ``budget`` are:
    a file with that many unknown names is fixed in bulk, not by hints."""

    def __init__(self, choices: Iterable[str], budget: int = 20) -> None:
        self._choices = list(choices)
        self._budget = budget
        self._hints: dict[str, str] = {}

    def __call__(self, word: str) -> str:
        if word not in self._hints:
            if len(self._hints) >= self._budget:
                return ""
            self._hints[word] = suggest(word, self._choices)
        return self._hints[word]
