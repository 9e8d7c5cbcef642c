"""YAML parsing for Kiwi's small config and manifest files, parsed once per distinct text.

Every run start reads ``agent_harness.yaml``, ``mcp_registry.yaml`` and each local tool's
manifest; PyYAML's pure-Python parser made that a large share of a start. The cache is keyed
by the text, so an edited file is parsed again, and callers get their own copy to change.

Config files are small, and anyone who can write one (an agent with a wide grant, a shared
user space) must not be able to stall every process that reads it: a file over
:data:`MAX_YAML_BYTES` is refused unread, and parsing stops at :data:`MAX_YAML_ALIASES` alias
uses, :data:`MAX_YAML_NODES` nodes, :data:`MAX_YAML_DEPTH` levels of nesting (deeper, Python's
recursion ran out: an exception nothing expected), or a document that would hold more than
:data:`MAX_YAML_NODES` values once its aliases are expanded: a "billion laughs" alias bomb is
a few dozen aliases, each naming a node that itself holds many aliases.
"""

from __future__ import annotations

import copy
from functools import lru_cache
from pathlib import Path
from typing import Any

import yaml

from kiwi import projectfiles
from kiwi.errors import ItemInvalid, Problem

MAX_YAML_BYTES = 1_000_000
MAX_YAML_ALIASES = 1_000
MAX_YAML_NODES = 100_000
MAX_YAML_DEPTH = 100


class YamlTooLarge(yaml.YAMLError):
    """A document over the size, alias or node limits."""

    def __init__(self, problem: str) -> None:
        super().__init__(problem)
        self.problem = problem
        self.problem_mark = None


class _BoundedLoader(yaml.SafeLoader):
    """SafeLoader that counts alias uses and composed nodes, and gives up past the limits."""

    def __init__(self, stream: Any) -> None:
        super().__init__(stream)
        self._aliases = 0
        self._nodes = 0
        self._depth = 0

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_YAML_ALIASES:
                raise YamlTooLarge(
                    f"more than {MAX_YAML_ALIASES} aliases (*name); a config file needs few, and "
                    "an alias bomb needs many"
                )
        else:
            self._nodes += 1
            if self._nodes > MAX_YAML_NODES:
                raise YamlTooLarge(f"more than {MAX_YAML_NODES:,} nodes")
        self._depth += 1
        try:
            if self._depth > MAX_YAML_DEPTH:
                raise YamlTooLarge(f"nested more than {MAX_YAML_DEPTH} levels deep")
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1


class YamlDuplicateKey(yaml.YAMLError):
    """A mapping that names one key twice: YAML keeps the last, so the first block is dropped unread."""

    def __init__(self, key: str, first: Any, again: Any) -> None:
        self.problem = (
            f"the key '{key}' is given twice (lines {first.line + 1} and {again.line + 1}); YAML keeps only the "
            "second, so what the first holds would be dropped: merge the two into one"
        )
        super().__init__(self.problem)
        self.problem_mark = again


def _no_duplicate_keys(root: yaml.Node) -> None:
    """Refuse a mapping with a key given twice (README trial s36: a second `internal_tools:` block, added as a
    refusal's hint said, replaced the first, and the base policy's reads and tools were gone unsaid)."""
    seen_nodes: set[int] = set()
    todo = [root]
    while todo:
        node = todo.pop()
        if id(node) in seen_nodes:
            continue
        seen_nodes.add(id(node))
        if isinstance(node, yaml.MappingNode):
            keys: dict[str, Any] = {}
            for key, value in node.value:
                if isinstance(key, yaml.ScalarNode):  # (`<<` too: a second merge key replaced the first, s36)
                    if key.value in keys:
                        raise YamlDuplicateKey(key.value, keys[key.value], key.start_mark)
                    keys[key.value] = key.start_mark
                todo += [key, value]
        elif isinstance(node, yaml.SequenceNode):
            todo += node.value


def _expanded_size(root: yaml.Node) -> int:
    """How many nodes the document holds once every alias is expanded (as JSON or a copy would see it).

    An alias is the node it names, so a few nested aliases can stand for billions of nodes; the
    count stops as soon as it passes the limit, and a node that contains itself is refused.
    """
    sizes: dict[int, int] = {}
    active: set[int] = set()

    def size(node: yaml.Node) -> int:
        key = id(node)
        if key in sizes:
            return sizes[key]
        if key in active:
            raise YamlTooLarge("an alias refers to a node that contains it (a recursive document)")
        active.add(key)
        total = 1
        if isinstance(node, yaml.SequenceNode):
            children: list[yaml.Node] = list(node.value)
        elif isinstance(node, yaml.MappingNode):
            children = [part for pair in node.value for part in pair]
        else:
            children = []
        for child in children:
            total += size(child)
            if total > MAX_YAML_NODES:
                raise YamlTooLarge(
                    f"more than {MAX_YAML_NODES:,} values once its aliases are expanded (an alias bomb?)"
                )
        active.discard(key)
        sizes[key] = total
        return total

    return size(root)


@lru_cache(maxsize=512)
def _parse(text: str) -> Any:
    if len(text) > MAX_YAML_BYTES:
        raise YamlTooLarge(
            f"{len(text):,} characters, over the limit of {MAX_YAML_BYTES:,} for a config file"
        )
    loader = _BoundedLoader(text)
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        _expanded_size(node)
        _no_duplicate_keys(node)
        return loader.construct_document(node)
    except RecursionError:
        # (Aliases nest what they name: within the depth limit, a document can still be deeper once
        # they are expanded.)
        raise YamlTooLarge("nested too deeply once its aliases are expanded") from None
    finally:
        loader.dispose()


def safe_load(text: str) -> Any:
    """``yaml.safe_load(text)`` within the limits, cached; raises ``yaml.YAMLError`` as it does."""
    return copy.deepcopy(_parse(text))


def read(path: Path) -> Any:
    """A config file's YAML (``{}`` when empty), or ItemInvalid naming the file, line and column."""
    try:
        size = path.stat().st_size
    except OSError:
        size = 0
    if size > MAX_YAML_BYTES:
        raise ItemInvalid(
            [
                Problem(
                    f"file is {size:,} bytes, over the limit of {MAX_YAML_BYTES:,} for a config file",
                    str(path),
                )
            ]
        )
    return _parsed(path.read_text(encoding="utf-8"), path)


def read_in_project(project_root: Path, rel: str) -> Any:
    """The YAML of the project's file ``rel`` (``{}`` when empty), None when there is no such file; read
    without following a link on the way (:func:`kiwi.projectfiles.read_bytes`: a link is ItemInvalid)."""
    data = projectfiles.read_bytes(project_root, rel, MAX_YAML_BYTES)
    if data is None:
        return None
    path = Path(project_root) / rel
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ItemInvalid([Problem(f"not UTF-8 text (byte {exc.start})", str(path))]) from None
    return _parsed(text, path)


def _parsed(text: str, path: Path) -> Any:
    try:
        return safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        what = "refused YAML" if isinstance(exc, (YamlTooLarge, YamlDuplicateKey)) else "malformed YAML"
        raise ItemInvalid(
            [
                Problem(
                    f"{what}: {getattr(exc, 'problem', exc)}",
                    str(path),
                    mark.line + 1 if mark else 0,
                    mark.column + 1 if mark else 0,
                )
            ]
        ) from None
