"""How many steps a backtracking matcher takes on a text: a small model of Python's ``re``.

It walks the same tree ``re`` compiles (``re._parser``), in the engine's order (greedy repetitions
try one more iteration first, alternatives left to right, an iteration that matched nothing ends
the repetition, atomic groups, possessive repetitions and lookarounds keep their first match) and
counts every step. One character item is tested by ``re`` itself, so character sets, categories and
IGNORECASE mean exactly what they mean to the engine. The count is deterministic: it shows a
pattern's blow-up without timing it (``re``'s own optimisations make it faster, never slower in
kind). Backreferences and conditionals are not modelled.
"""

from __future__ import annotations

import re
import re._compiler as _sre_compile  # type: ignore[import-not-found]
import re._constants as _sre  # type: ignore[import-not-found]
import re._parser as _sre_parse  # type: ignore[import-not-found]
import sys
from collections.abc import Callable
from typing import Any

Then = Callable[[int], bool]


class _TooMany(Exception):
    pass


class StepCounter:
    def __init__(self, pattern: str, limit: int = 5_000_000) -> None:
        self._parsed = _sre_parse.parse(pattern)
        self._limit = limit
        self._steps = 0
        self._text = ""
        self._single: dict[tuple[int, int], re.Pattern[str]] = {}

    def steps(self, text: str) -> int:
        """Steps to find the first match at the start of ``text`` or to fail there (at most the limit)."""
        self._text, self._steps = text, 0
        depth = sys.getrecursionlimit()
        sys.setrecursionlimit(max(depth, 100 * len(text) + 1000))
        try:
            self._seq(list(self._parsed), 0, 0, self._parsed.state.flags, lambda end: True)
        except _TooMany:
            return self._limit
        finally:
            sys.setrecursionlimit(depth)
        return self._steps

    def _one(self, item: Any, flags: int) -> re.Pattern[str]:
        """The engine's own pattern for one item of the tree."""
        key = (id(item), flags)
        if key not in self._single:
            state = _sre_parse.State()
            state.flags = flags
            self._single[key] = _sre_compile.compile(_sre_parse.SubPattern(state, [item]), flags)
        return self._single[key]

    def _seq(self, items: list[Any], i: int, pos: int, flags: int, then: Then) -> bool:
        self._steps += 1
        if self._steps >= self._limit:
            raise _TooMany
        if i == len(items):
            return then(pos)
        op, av = items[i]
        text = self._text

        def nxt(end: int) -> bool:
            return self._seq(items, i + 1, end, flags, then)

        if op in (_sre.LITERAL, _sre.NOT_LITERAL, _sre.ANY, _sre.IN):
            return pos < len(text) and self._one(items[i], flags).fullmatch(text[pos]) is not None and nxt(pos + 1)
        if op is _sre.AT or (op in (_sre.ASSERT, _sre.ASSERT_NOT) and av[0] < 0):  # anchors, lookbehinds
            return self._one(items[i], flags).match(text, pos) is not None and nxt(pos)
        if op is _sre.SUBPATTERN:
            _, add, remove, body = av
            return self._seq(list(body), 0, pos, (flags | add) & ~remove, nxt)
        if op is _sre.BRANCH:
            return any(self._seq(list(b), 0, pos, flags, nxt) for b in av[1])
        if op in (_sre.ASSERT, _sre.ASSERT_NOT):
            found = self._seq(list(av[1]), 0, pos, flags, lambda end: True)
            return found == (op is _sre.ASSERT) and nxt(pos)
        if op is _sre.ATOMIC_GROUP:
            return self._first(lambda keep: self._seq(list(av), 0, pos, flags, keep), nxt)
        if op in (_sre.MAX_REPEAT, _sre.MIN_REPEAT, _sre.POSSESSIVE_REPEAT):
            lo, hi, body = av
            if op is _sre.POSSESSIVE_REPEAT:
                return self._first(lambda keep: self._repeat(list(body), lo, hi, True, 0, pos, flags, keep), nxt)
            return self._repeat(list(body), lo, hi, op is _sre.MAX_REPEAT, 0, pos, flags, nxt)
        raise NotImplementedError(f"not modelled: {op}")

    @staticmethod
    def _first(run: Callable[[Then], bool], then: Then) -> bool:
        """What is never backtracked into: its first match, then the rest."""
        ends: list[int] = []

        def keep(end: int) -> bool:
            ends.append(end)
            return True

        run(keep)
        return bool(ends) and then(ends[0])

    def _repeat(
        self, body: list[Any], lo: int, hi: int, greedy: bool, count: int, pos: int, flags: int, then: Then
    ) -> bool:
        def again(end: int) -> bool:
            if end == pos and count + 1 >= lo:
                return then(end)  # an iteration that matched nothing ends the repetition
            return self._repeat(body, lo, hi, greedy, count + 1, end, flags, then)

        if greedy:
            if count < hi and self._seq(body, 0, pos, flags, again):
                return True
            return count >= lo and then(pos)
        if count >= lo and then(pos):
            return True
        return count < hi and self._seq(body, 0, pos, flags, again)
