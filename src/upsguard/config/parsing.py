"""Parsing YAML 1.2 with ruamel.yaml's C parser, within limits; lines only when needed.

Most site files are plain data: mappings, lists and scalars, with no anchor, merge or tag.
``_plain_data`` reads those straight from the parser's events into dicts, lists and
scalars, without building the node tree: on the 5,000-VM bench site the tree's 73,000 nodes
and their 146,000 marks cost more than the parse itself, half of it in the garbage
collector, which walked them again and again while they lived. Where each value came from
is needed only to report a problem, so the tree is composed (``tree``) only then.

A file that is more than plain data (an anchor, an alias, a merge, a tag) or that has a
problem is read again by the full reader: ``compose`` (libyaml, in C) builds the node tree,
whose marks hold every line, and ``_Builder`` turns it into data and says what is wrong at
which node. So every problem is found and worded by one reader, and the fast one only
refuses to go on. The fast one stops at the same limits (``MAX_NESTING``, ``MAX_NODES``), so
that libyaml never reads deeper than the full reader would. On that site ``validate`` took
0.38 s of CPU with the full reader (0.2 s of it in the garbage collector) and takes 0.19 s.

The full reader, measured on the same site, where ``YAML(typ="safe", pure=False).load``
took 1.6 s of CPU and this reader 0.7 s:

* ``_Resolver`` (``YAML.Resolver``) fixes the YAML version at 1.2 (``no`` and ``on`` are
  words, ``1:30`` is a string, ``017`` is seventeen) instead of looking the document's
  version up again for every scalar, and settles lists, mappings and the common plain word
  (``vm01``) without trying the rules for numbers and booleans: compose went from 1.07 s to
  0.50 s. It also counts depth and nodes as the C composer descends, and stops it beyond
  ``MAX_NESTING`` levels or ``MAX_NODES`` nodes: libyaml takes quadratic time on deep
  nesting (100,000 ``[`` took more than 40 s) and the C composer overflows its stack (the
  process dies) further on.
* ``_Builder`` builds plain strings, lists and mappings itself (84 ms where
  ``construct_document`` took 293 ms) and hands every other node to ``_Constructor``
  (``YAML.Constructor``), which reads timestamps and ``=`` as strings (YAML 1.2's core
  schema has neither, and no field is a date), refuses custom tags (``!include``) at the
  tagged node, and reports a number Python cannot convert (``0b_``, 5,000 digits) at its
  line.

The C parser lacks one piece of YAML 1.2: a colon inside a plain scalar in a flow
collection, as in ``{host: https://10.0.1.21}``. A file the C parser refuses for exactly
that is parsed by ruamel.yaml's own pure-Python parser, which reads it as YAML 1.2 says:
the same results, several times slower, and only for such files.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import Any

from ruamel.yaml import YAML
from ruamel.yaml.constructor import DuplicateKeyError, SafeConstructor
from ruamel.yaml.error import MarkedYAMLError, ReusedAnchorWarning, YAMLError
from ruamel.yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from ruamel.yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode
from ruamel.yaml.reader import ReaderError
from ruamel.yaml.resolver import BaseResolver, VersionedResolver
from ruamel.yaml.tag import Tag

from upsguard.config.values import shorten
from upsguard.errors import ConfigError

#: The deepest nesting of lists and mappings a file may have (a site file needs about six).
MAX_NESTING = 64
#: The most nodes (keys, values, list items, mappings, lists) a file may hold; the 5,000-VM
#: bench site (bench/gen_site.py) holds about 73,000.
MAX_NODES = 1_000_000


class NodeProblem(Exception):
    """A problem at one node of the composed tree; ``line`` and ``column`` count from 0.
    The caller finds the node's path in the tree (``tree``)."""

    def __init__(self, line: int, column: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.column = column
        self.message = message


class _LimitExceeded(Exception):
    def __init__(self, line: int, message: str) -> None:
        super().__init__(message)
        self.line = line
        self.message = message


class _Resolver(VersionedResolver):
    def __init__(self, version: Any = None, loader: Any = None, loadumper: Any = None) -> None:
        super().__init__(version, loader, loadumper)
        self._nesting = 0
        self._node_count = 0
        self._tags: dict[str, Tag] = {}
        rules = self.versioned_resolver  # YAML 1.2's, by the first character they can match
        self._typed_starts = frozenset() if None in rules else frozenset(rules)

    @property
    def processing_version(self) -> Any:
        return (1, 2)

    def resolve(self, kind: Any, value: Any, implicit: Any) -> Any:
        """The tag of a node, as the base class finds it, but faster for the common cases:
        a mapping or a list, and a plain scalar whose first character starts no YAML 1.2
        rule (``vm01``, ``kind``), which is a string without trying any. Other tags are
        shared, one ``Tag`` object per name: ruamel.yaml makes one per scalar and decodes
        its name character by character."""
        if kind is ScalarNode:
            if implicit[0] and value and value[0] not in self._typed_starts:
                return self.DEFAULT_SCALAR_TAG
        elif kind is MappingNode:  # as the base class says when no path resolvers are set
            return self.DEFAULT_MAPPING_TAG
        elif kind is SequenceNode:
            return self.DEFAULT_SEQUENCE_TAG
        tag = super().resolve(kind, value, implicit)
        return self._tags.setdefault(tag.suffix, tag) if isinstance(tag, Tag) else tag

    # No path resolvers are registered: the base versions of the two methods below only
    # return, so they are not called.
    def descend_resolver(self, current_node: Any, current_index: Any) -> None:
        self._nesting += 1
        self._node_count += 1
        if self._nesting > MAX_NESTING:
            raise _LimitExceeded(_line(current_node), f"nested deeper than {MAX_NESTING} levels")
        if self._node_count > MAX_NODES:
            raise _LimitExceeded(
                _line(current_node),
                f"more than {MAX_NODES:,} values: a site of that size is beyond what upsguard "
                "plans (see docs/site-file.md, Limits)",
            )

    def ascend_resolver(self) -> None:
        self._nesting -= 1


def _line(node: Any) -> int:
    return int(node.start_mark.line) + 1 if node is not None else 1


class _Constructor(SafeConstructor):
    def construct_undefined(self, node: Any) -> Any:
        mark = node.start_mark
        if node.tag == "tag:yaml.org,2002:merge":
            message = "'<<' is a key only: <<: *anchor merges a mapping"
        else:
            message = f"YAML tag {shorten(node.tag)!r} is not supported"
        raise NodeProblem(mark.line, mark.column, message)


def _readable(construct: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """A number Python cannot convert (``0b_``, 5,000 digits) is a problem at its line."""

    def checked(constructor: Any, node: Any) -> Any:
        try:
            return construct(constructor, node)
        except (ValueError, OverflowError):
            mark = node.start_mark
            raise NodeProblem(
                mark.line, mark.column, f"cannot read {shorten(node.value)!r} as a number"
            ) from None

    return checked


_Constructor.add_constructor(None, _Constructor.construct_undefined)
for _word in ("timestamp", "value"):  # YAML 1.1 types: in YAML 1.2, plain strings
    _Constructor.add_constructor(f"tag:yaml.org,2002:{_word}", SafeConstructor.construct_yaml_str)
_Constructor.add_constructor("tag:yaml.org,2002:int", _readable(SafeConstructor.construct_yaml_int))
_Constructor.add_constructor(
    "tag:yaml.org,2002:float", _readable(SafeConstructor.construct_yaml_float)
)


_STR = BaseResolver.DEFAULT_SCALAR_TAG
_MAP = BaseResolver.DEFAULT_MAPPING_TAG
_SEQ = BaseResolver.DEFAULT_SEQUENCE_TAG
_MERGE = "tag:yaml.org,2002:merge"


class _Builder:
    """Plain data from the composed tree. ``construct_document`` goes through several calls
    per node and keeps a table of them all; here plain strings, lists and mappings are built
    directly, and every other node (a number, a boolean, ``!!set``, a custom tag) goes to
    ``_Constructor``, so YAML's types read as ruamel.yaml reads them. Mappings follow YAML's
    rules: a key given twice is a problem, ``<<`` merges a mapping or a list of them (the
    earlier win, the mapping's own keys over all). An alias shares its anchor's value; one
    inside its own anchor is a problem, as the value would contain itself."""

    def __init__(self, constructor: _Constructor) -> None:
        self._constructor = constructor
        self._built: dict[int, Any] = {}
        self._open: set[int] = set()

    def value(self, node: Node) -> Any:
        if node.ctag is _STR and isinstance(node, ScalarNode):
            return node.value  # the common case, first
        if isinstance(node, ScalarNode):
            return self._constructor.construct_object(node)
        key = id(node)
        if key in self._built:
            return self._built[key]
        if key in self._open:
            raise _problem(node, "an alias inside its own anchor: the value would contain itself")
        self._open.add(key)
        if isinstance(node, SequenceNode) and node.ctag is _SEQ:
            built: Any = [self.value(item) for item in node.value]
        elif isinstance(node, MappingNode) and node.ctag is _MAP:
            built = self._mapping(node)
        else:  # !!set, !!omap, a custom tag (refused by _Constructor)
            built = self._constructor.construct_object(node, deep=True)
        self._open.discard(key)
        self._built[key] = built
        return built

    def _mapping(self, node: MappingNode) -> dict[Any, Any]:
        own: dict[Any, Any] = {}
        merged: dict[Any, Any] | None = None
        for key_node, value_node in node.value:
            if key_node.ctag.suffix == _MERGE:
                if merged is not None:
                    raise _problem(key_node, "'<<' given twice: merge a list, <<: [*a, *b]")
                merged = self._merged(value_node)
                continue
            if not isinstance(key_node, ScalarNode):
                raise _problem(key_node, "a key is a word or a number, not a list or mapping")
            key = self.value(key_node)
            if key in own:
                raise _problem(key_node, "key given twice: keep one")
            own[key] = self.value(value_node)
        return own if merged is None else {**merged, **own}

    def _merged(self, node: Node) -> dict[Any, Any]:
        sources = node.value if isinstance(node, SequenceNode) else [node]
        out: dict[Any, Any] = {}
        for source in reversed(sources):  # the earlier ones win
            data = self.value(source)
            if not isinstance(data, dict):
                raise _problem(source, "'<<' merges a mapping or a list of mappings")
            out.update(data)
        return out


def _problem(node: Node, message: str) -> NodeProblem:
    return NodeProblem(int(node.start_mark.line), int(node.start_mark.column), message)


def _loader(pure: bool = False) -> YAML:
    yaml = YAML(typ="safe", pure=pure)
    yaml.Resolver = _Resolver
    yaml.Constructor = _Constructor
    return yaml


def parse(text: str, name: str) -> Any:
    """The data of one YAML document.

    Raises ``ConfigError`` (``name:line: ...``) for text that is not YAML or is beyond the
    limits, and ``NodeProblem`` for a problem at one node (a duplicate key, a custom tag),
    whose path the caller reads from the tree (``tree``).
    """
    try:
        return _plain_data(text)
    except (_NotPlain, NodeProblem, YAMLError):
        pass  # more than plain data, or a problem: the full reader reads it and says which
    try:
        root = tree(text)
    except _LimitExceeded as exc:
        raise ConfigError(f"{name}:{exc.line}: {exc.message}") from None
    except YAMLError as exc:
        raise ConfigError(f"{name}:{_yaml_line(exc, text)}: not valid YAML: {_what(exc)}") from None
    if root is None:
        return None
    try:
        return _Builder(_loader().constructor).value(root)
    except DuplicateKeyError as exc:
        raise _at_mark(exc.problem_mark, "key given twice: keep one") from None
    except MarkedYAMLError as exc:  # a merge of a scalar, a list as a key, bad !!binary
        mark = exc.problem_mark or exc.context_mark
        raise _at_mark(mark, f"not valid here: {_what(exc)}") from None


def tree(text: str) -> Node | None:
    """The node tree of a document that parses, whose marks hold every line.

    Raises ``YAMLError`` for text that is not YAML and ``_LimitExceeded`` beyond the limits.
    """
    # The C composer refuses an anchor defined twice; the pure-Python one, read for a colon in
    # a flow mapping, accepts it (YAML lets an alias take the latest) and warns on stderr: a
    # line of Python output beside upsguard's own. It is read as before, without the line.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ReusedAnchorWarning)
        try:
            root: Node | None = _loader().compose(text)
        except MarkedYAMLError as exc:
            if not _colon_in_flow(exc):
                raise
            root = _loader(pure=True).compose(text)
    return root


class _NotPlain(Exception):
    """The file holds more than plain data, or a problem: the full reader reads it."""


class _Collection:
    """A mapping or list being read, and, in a mapping, the key read before its value."""

    __slots__ = ("data", "key")

    def __init__(self, data: dict[Any, Any] | list[Any]) -> None:
        self.data = data
        self.key: Any = _NO_KEY

    def add(self, value: Any) -> None:
        data = self.data
        if isinstance(data, list):
            data.append(value)
        elif self.key is _NO_KEY:
            if value in data:
                raise _NotPlain  # a key given twice
            self.key = value
        else:
            data[self.key] = value
            self.key = _NO_KEY

    @property
    def wants_key(self) -> bool:
        return self.key is _NO_KEY and isinstance(self.data, dict)


_NO_KEY = object()


def _plain_data(text: str) -> Any:
    """The data of a document of plain mappings, lists and scalars, from the parser's
    events. Scalars are typed by the same resolver and constructor as the full reader's.
    Raises ``_NotPlain`` at anything else: an anchor, an alias, a tag, a merge, a key
    given twice, a key that is not a scalar, a second document, or beyond the limits."""
    yaml = _loader()
    resolver, constructor = yaml.resolver, yaml.constructor
    open_: list[_Collection] = []
    document: list[Any] = []
    typed: dict[tuple[str, str], Any] = {}
    values = 0
    for event in yaml.parse(text):
        kind = type(event)
        if kind is ScalarEvent:
            if event.anchor is not None or event.tag is not None:
                raise _NotPlain
            tag = resolver.resolve(ScalarNode, event.value, event.implicit)
            if tag is _STR:
                value: Any = event.value
            elif tag.suffix == _MERGE:
                raise _NotPlain
            else:  # a number, a boolean, null: read once per text (thousands say watts: 8)
                key = (tag.suffix, event.value)
                if key not in typed:
                    node = ScalarNode(tag, event.value, event.start_mark, event.end_mark)
                    typed[key] = constructor.construct_object(node)
                value = typed[key]
        elif kind is MappingStartEvent or kind is SequenceStartEvent:
            if event.anchor is not None or event.tag is not None or len(open_) >= MAX_NESTING:
                raise _NotPlain
            if open_ and open_[-1].wants_key:
                raise _NotPlain  # a list or mapping as a key
            open_.append(_Collection({} if kind is MappingStartEvent else []))
            continue
        elif kind is MappingEndEvent or kind is SequenceEndEvent:
            value = open_.pop().data
        elif kind is AliasEvent or (kind is DocumentStartEvent and document):
            raise _NotPlain  # an alias, a second document
        else:  # the start and end of the stream and of the document
            continue
        values += 1
        if values > MAX_NODES:
            raise _NotPlain
        if open_:
            open_[-1].add(value)
        else:
            document.append(value)
    return document[0] if document else None


def _at_mark(mark: Any, message: str) -> NodeProblem:
    return NodeProblem(int(mark.line), int(mark.column), message)


def _colon_in_flow(exc: MarkedYAMLError) -> bool:
    """libyaml's refusal of ``{host: https://x}``, which YAML 1.2 allows."""
    return bool(
        exc.problem == "found unexpected ':'" and exc.context == "while scanning a plain scalar"
    )


def _yaml_line(exc: YAMLError, text: str) -> int:
    if isinstance(exc, MarkedYAMLError):
        mark = exc.problem_mark or exc.context_mark
        return int(mark.line) + 1 if mark is not None else 1
    if isinstance(exc, ReaderError):
        return text.count("\n", 0, max(0, int(exc.position))) + 1
    return 1


def _what(exc: YAMLError) -> str:
    if isinstance(exc, ReaderError):
        char = exc.character
        code = (
            char if isinstance(char, int) else ord(char[0]) if isinstance(char, str) and char else 0
        )
        return f"character U+{code:04X} is not allowed: {exc.reason}"
    if isinstance(exc, MarkedYAMLError):
        what = str(exc.problem or exc.context or "")
        if exc.problem and exc.context:
            context, where = exc.context_mark, exc.problem_mark
            same_line = context is None or (where is not None and where.line == context.line)
            what += (
                f" ({exc.context})" if same_line else f" ({exc.context} on line {context.line + 1})"
            )
        return shorten(what, 200)
    return shorten(str(exc).splitlines()[0] if str(exc) else type(exc).__name__, 200)
