"""A config file's YAML, read strictly: a key given twice in one mapping is an error, as an unknown field is.

PyYAML keeps the last of two equal keys without a word, so a second ``deployments:`` in a file dropped every
deployment of the first, and ``num_replicas: 1`` then ``num_replicas: 3`` started three. Errors name the file, line
and column in one line, not PyYAML's ``in "<unicode string>"`` block.

Aliases (``*name``) are measured before anything is built from them. PyYAML shares an anchored value between its
aliases, but validation and JSON copy it once per use, so a 547-byte file of ten nested nine-fold aliases became
gigabytes (minutes, then out of memory) before the deployment's ``config_bytes`` check could refuse it. What aliases
add to a file, in all, is bounded by that same number: merge keys (``<<: *base``) and shared settings stay far below.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import CollectionNode, MappingNode, Node, ScalarNode

from streamserve.wire.errors import ConfigError
from streamserve.wire.limits import DEFAULT_LIMITS, ConfigLimits

MERGE_TAG = "tag:yaml.org,2002:merge"


class _StrictLoader(yaml.SafeLoader):
    """SafeLoader that refuses a mapping holding one key twice (a merge's ``<<`` may still be overridden)."""

    def construct_mapping(self, node: MappingNode, deep: bool = False) -> dict[Hashable, Any]:
        if isinstance(node, MappingNode):  # (as SafeLoader's own, it may be handed another node, to refuse it)
            first_at: dict[Any, int] = {}
            for key_node, _value in node.value:
                if not isinstance(key_node, ScalarNode) or key_node.tag == MERGE_TAG:
                    continue  # (a collection as a key: SafeLoader's own error says so)
                key = self.construct_object(key_node)
                line = key_node.start_mark.line + 1
                if key in first_at:
                    raise ConstructorError(
                        None, None, f"{key!r} is given twice (first on line {first_at[key]})", key_node.start_mark
                    )
                first_at[key] = line
        return super().construct_mapping(node, deep=deep)


def _children(node: Node) -> list[Node]:
    """The nodes ``node`` holds, keys and values alike (an alias is the very node its anchor names)."""
    if isinstance(node, MappingNode):
        return [part for pair in node.value for part in pair]
    return list(node.value) if isinstance(node, CollectionNode) else []


def _own_bytes(node: Node) -> int:
    """About what ``node`` itself takes as JSON: a scalar's text and its quotes, or a collection's brackets, and
    a separator after either."""
    return len(node.value) + 3 if isinstance(node, ScalarNode) else 3


def _written_bytes(root: Node) -> int:
    """The document's size with each node counted once, where it is written (an alias adds nothing)."""
    seen: set[int] = set()
    todo = [root]
    total = 0
    while todo:
        node = todo.pop()
        if id(node) not in seen:
            seen.add(id(node))
            total += _own_bytes(node)
            todo.extend(_children(node))
    return total


def _expanded_bytes(node: Node, bound: int, sizes: dict[int, int], open_: set[int]) -> int:
    """The size of ``node`` with its aliases expanded, or ``bound + 1`` once past ``bound``: each node is measured
    once (``sizes``), so a chain of aliases costs its length, not the size it stands for."""
    if id(node) in sizes:
        return sizes[id(node)]
    if id(node) in open_:
        raise yaml.MarkedYAMLError(problem="an alias stands for a value it is inside of", problem_mark=node.start_mark)
    open_.add(id(node))
    total = _own_bytes(node)
    for child in _children(node):
        total += _expanded_bytes(child, bound, sizes, open_)
        if total > bound:
            total = bound + 1
            break
    open_.discard(id(node))
    sizes[id(node)] = total
    return total


def _check_aliases(root: Node, source: str, limits: ConfigLimits) -> None:
    """ConfigError when expanding the aliases would add more than ``config_bytes`` to the document as JSON, before
    they are built. Only what aliases add counts: a file without any is never refused here, however large."""
    bound = _written_bytes(root) + limits.config_bytes
    if _expanded_bytes(root, bound, {}, set()) > bound:
        raise ConfigError(
            f"{source}: its aliases (*name) would add more than {limits.config_bytes} bytes (config_bytes) "
            f"to it as JSON ({limits.how_to_raise('config_bytes')})"
        )


def load_yaml(text: str, source: str, limits: ConfigLimits = DEFAULT_LIMITS) -> Any:
    """The YAML document in ``text``; ConfigError naming ``source``, the line and the column for bad YAML, or
    naming ``config_bytes`` when its aliases would add more than that (``limits``)."""
    loader = _StrictLoader(text)  # (a SafeLoader: plain data only, nothing that runs code)
    try:
        root = loader.get_single_node()
        if root is None:
            return None
        _check_aliases(root, source, limits)
        return loader.construct_document(root)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{source}{where}: not valid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
    finally:
        loader.dispose()
