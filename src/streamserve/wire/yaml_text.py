"""A config file's YAML, read strictly: a key given twice in one mapping is an error, as an unknown field is.

PyYAML keeps the last of two equal keys without a word, so a second ``deployments:`` in a file dropped every
deployment of the first, and ``num_replicas: 1`` then ``num_replicas: 3`` started three. Errors name the file, line
and column in one line, not PyYAML's ``in "<unicode string>"`` block.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

import yaml
from yaml.constructor import ConstructorError
from yaml.nodes import MappingNode, ScalarNode

from streamserve.wire.errors import ConfigError

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


def load_yaml(text: str, source: str) -> Any:
    """The YAML document in ``text``; ConfigError naming ``source``, the line and the column for bad YAML."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # (a SafeLoader: plain data only, nothing that runs code)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = " ".join(part for part in (exc.context, exc.problem) if part)
        raise ConfigError(f"{source}{where}: not valid YAML: {problem}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{source}: not valid YAML: {exc}") from exc
