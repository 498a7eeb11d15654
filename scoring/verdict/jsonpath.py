"""A small JSONPath subset for argument matchers: ``$``, ``.key``, ``['key']``, ``[n]``, ``[*]``, ``..key``."""

from __future__ import annotations

import re
from collections.abc import Iterator
from functools import lru_cache
from typing import Any

_TOKEN = re.compile(
    r"""\.\.(?P<deep>[A-Za-z_][\w-]*)        # ..key
      | \.(?P<key>[A-Za-z_][\w-]*)          # .key
      | \.\*(?P<dotstar>)                   # .*
      | \[\s*(?P<idx>-?\d+)\s*\]            # [n]
      | \[\s*\*\s*\](?P<star>)              # [*]
      | \[\s*'(?P<q1>[^']*)'\s*\]           # ['key']
      | \[\s*"(?P<q2>[^"]*)"\s*\]           # ["key"]
    """,
    re.X,
)

Step = tuple[str, str | int | None]


class JsonPathError(ValueError):
    pass


@lru_cache(maxsize=1024)
def compile_path(path: str) -> tuple[Step, ...]:
    if not path.startswith("$"):
        raise JsonPathError(f"JSONPath must start with '$': {path!r}")
    steps: list[Step] = []
    pos = 1
    while pos < len(path):
        m = _TOKEN.match(path, pos)
        if not m:
            raise JsonPathError(f"unsupported JSONPath syntax at offset {pos} in {path!r}")
        if m.group("deep") is not None:
            steps.append(("deep", m.group("deep")))
        elif m.group("key") is not None:
            steps.append(("key", m.group("key")))
        elif m.group("dotstar") is not None or m.group("star") is not None:
            steps.append(("star", None))
        elif m.group("idx") is not None:
            steps.append(("idx", int(m.group("idx"))))
        else:
            steps.append(("key", m.group("q1") if m.group("q1") is not None else m.group("q2")))
        pos = m.end()
    return tuple(steps)


def _descend(node: Any) -> Iterator[Any]:
    yield node
    if isinstance(node, dict):
        for v in node.values():
            yield from _descend(v)
    elif isinstance(node, list):
        for v in node:
            yield from _descend(v)


def select(document: Any, path: str) -> list[Any]:
    """All values the path selects (empty if none)."""
    nodes = [document]
    for kind, arg in compile_path(path):
        nxt: list[Any] = []
        for n in nodes:
            if kind == "key" and isinstance(n, dict):
                if arg in n:
                    nxt.append(n[arg])
            elif kind == "idx" and isinstance(n, list):
                i = int(arg or 0)
                if -len(n) <= i < len(n):
                    nxt.append(n[i])
            elif kind == "star":
                if isinstance(n, dict):
                    nxt.extend(n.values())
                elif isinstance(n, list):
                    nxt.extend(n)
            elif kind == "deep":
                for d in _descend(n):
                    if isinstance(d, dict) and arg in d:
                        nxt.append(d[arg])
        nodes = nxt
    return nodes
