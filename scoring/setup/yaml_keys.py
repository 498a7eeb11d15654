"""YAML loading that refuses a key given twice in one mapping.

PyYAML keeps the last of two equal keys, so a second ``kafka:`` block, or a scorer defined twice,
silently replaced the first. The service config (``collector.config``) and the ``eval`` command's
scorer config both load through here.
"""

from __future__ import annotations

from typing import Any

import yaml

__all__ = ["DuplicateKeyError", "UniqueKeyLoader", "load_yaml"]


class DuplicateKeyError(yaml.YAMLError):
    """A key given twice in one YAML mapping."""


class UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (``<<`` merge keys may still be
    overridden by explicit ones)."""

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        #: dotted path of each node below a key or in a list, to name a duplicate key by its path
        self._where: dict[int, str] = {}

    def construct_mapping(self, node: yaml.MappingNode, deep: bool = False) -> dict[Any, Any]:
        where = self._where.get(id(node), "")
        first: dict[Any, yaml.Node] = {}
        for key_node, value_node in node.value:
            if key_node.tag == "tag:yaml.org,2002:merge":  # ``<<: *base``: explicit keys may override it
                continue
            key = self.construct_object(key_node, deep=True)
            name = f"{where}.{key}" if where else str(key)
            try:
                earlier = first.setdefault(key, key_node)
            except TypeError:  # an unhashable key: SafeLoader refuses it below
                continue
            if earlier is not key_node:
                lines = sorted({earlier.start_mark.line + 1, key_node.start_mark.line + 1})
                raise DuplicateKeyError(
                    f"key {name} is given twice (line{'s' if len(lines) > 1 else ''} "
                    f"{' and '.join(map(str, lines))}); YAML would silently keep only the last"
                )
            self._where[id(value_node)] = name
        return super().construct_mapping(node, deep=deep)

    def construct_sequence(self, node: yaml.SequenceNode, deep: bool = False) -> list[Any]:
        where = self._where.get(id(node), "")
        for i, item in enumerate(node.value):
            self._where[id(item)] = f"{where}[{i}]"
        return super().construct_sequence(node, deep=deep)


def load_yaml(text: str) -> Any:
    """``yaml.safe_load`` that raises :class:`DuplicateKeyError` (a ``yaml.YAMLError``) on a key
    given twice, naming its dotted path and lines."""
    return yaml.load(text, Loader=UniqueKeyLoader)  # a SafeLoader subclass: safe
