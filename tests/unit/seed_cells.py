"""Run a seed walkthrough's code cells as they are written, with only the import lines changed.

A seed file (``shared/seeds/*.txt``) is a rendered notebook: prose, code cells, and below
each cell the output it printed, all as plain text. A code cell is found where a paragraph
starting with an ``import`` / ``from … import`` line compiles as Python (top-level ``await``
allowed); it is extended paragraph by paragraph for as long as the text still compiles, so
prose and printed output are left out. Code shown inside the prose (a snippet quoting
``scorer`` without defining it) does not start with an import and is not a cell.

:func:`to_scoring_imports` rewrites ``pyrit`` → ``scoring`` in import statements only;
:func:`run_cells` executes the cells in one namespace, like a notebook kernel, awaiting
cells that use top-level ``await``.
"""

from __future__ import annotations

import ast
import inspect
import re
from collections.abc import Sequence
from typing import Any

_IMPORT_LINE = re.compile(r"^(from [A-Za-z_][\w.]* import |import [A-Za-z_])")
_FLAGS = ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
#: after this many paragraphs that do not compile, the cell has ended
_LOOKAHEAD = 3


def _compiles(source: str) -> bool:
    try:
        compile(source, "<cell>", "exec", flags=_FLAGS, dont_inherit=True)
    except SyntaxError:
        return False
    return True


def _paragraphs(text: str) -> list[str]:
    """Blank-line-separated paragraphs (each keeps its inner blank-free lines)."""
    return [p.strip("\n") for p in re.split(r"\n[ \t]*\n", text) if p.strip()]


def code_cells(text: str) -> list[str]:
    """The code cells of a rendered walkthrough, in order."""
    paragraphs = _paragraphs(text)
    cells: list[str] = []
    i = 0
    while i < len(paragraphs):
        if not _IMPORT_LINE.match(paragraphs[i]) or not _compiles(paragraphs[i]):
            i += 1
            continue
        end, misses, j = i + 1, 0, i + 1
        while j < len(paragraphs) and misses < _LOOKAHEAD:
            if _compiles("\n\n".join(paragraphs[i : j + 1])):
                end, misses = j + 1, 0
            else:
                misses += 1
            j += 1
        cells.append("\n\n".join(paragraphs[i:end]))
        i = end
    return cells


_FROM = re.compile(r"^(\s*)from pyrit(?=[.\s])", re.MULTILINE)
_IMPORT = re.compile(r"^(\s*)import pyrit(?=[.\s,]|$)", re.MULTILINE)


def to_scoring_imports(cell: str, *, package: str = "scoring") -> str:
    """``pyrit.*`` → ``scoring.*`` in the cell's import statements; nothing else changes.

    Raises:
        AssertionError: an import of ``pyrit`` is left (one this rewrite does not recognise).
    """
    out = _IMPORT.sub(rf"\1import {package}", _FROM.sub(rf"\1from {package}", cell))
    tree = compile(out, "<cell>", "exec", flags=_FLAGS | ast.PyCF_ONLY_AST, dont_inherit=True)
    for node in ast.walk(tree):
        modules: list[str] = []
        if isinstance(node, ast.ImportFrom) and node.module:
            modules = [node.module]
        elif isinstance(node, ast.Import):
            modules = [alias.name for alias in node.names]
        assert not any(m == "pyrit" or m.startswith("pyrit.") for m in modules), f"pyrit import left in:\n{out}"
    return out


async def run_cells(cells: Sequence[str], namespace: dict[str, Any], *, name: str = "seed") -> None:
    """Execute ``cells`` in order in ``namespace`` (top-level ``await`` is awaited)."""
    for n, cell in enumerate(cells, 1):
        code = compile(cell, f"<{name} cell {n}>", "exec", flags=_FLAGS, dont_inherit=True)
        result = eval(code, namespace)  # a coroutine when the cell awaits at top level
        if inspect.iscoroutine(result):
            await result
