"""The scoring library is pure: nothing under ``scoring/`` imports Kafka, Redis or gRPC clients.

Checked twice: statically (every import statement in every module, including imports
inside functions and ``importlib.import_module`` / ``__import__`` calls with a literal
name), and dynamically (a fresh interpreter imports every ``scoring`` module and then
looks at ``sys.modules``).
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

import scoring

FORBIDDEN = frozenset({"aiokafka", "redis", "grpc"})
PACKAGE_DIR = Path(scoring.__file__).resolve().parent
SOURCES = sorted(PACKAGE_DIR.rglob("*.py"))


def imported_top_levels(tree: ast.AST) -> set[str]:
    """Top-level package names a module imports, anywhere in its body."""
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else func.id if isinstance(func, ast.Name) else ""
            first = node.args[0]
            literal = isinstance(first, ast.Constant) and isinstance(first.value, str)
            if name in {"import_module", "__import__"} and literal:
                found.add(str(first.value).split(".")[0])
    return found


def test_the_scan_sees_the_library() -> None:
    names = {p.relative_to(PACKAGE_DIR).as_posix() for p in SOURCES}
    assert {"__init__.py", "verdict/conditions.py", "score/base.py", "normalize/spans.py"} <= names


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("import redis", {"redis"}),
        ("import grpc.aio as g", {"grpc"}),
        ("from aiokafka import AIOKafkaConsumer", {"aiokafka"}),
        ("def f():\n    from redis.asyncio import Redis\n    return Redis", {"redis"}),
        ("import importlib\nimportlib.import_module('grpc')", {"importlib", "grpc"}),
        ("__import__('aiokafka.admin')", {"aiokafka"}),
        ("from . import redis", set()),
        ("from .redis import x", set()),
    ],
    ids=[
        "import",
        "import-as",
        "from-import",
        "inside-function",
        "import-module",
        "dunder-import",
        "relative",
        "rel-mod",
    ],
)
def test_scanner(source: str, expected: set[str]) -> None:
    assert imported_top_levels(ast.parse(source)) == expected


@pytest.mark.parametrize("path", SOURCES, ids=[p.relative_to(PACKAGE_DIR).as_posix() for p in SOURCES])
def test_no_forbidden_import_statement(path: Path) -> None:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    assert not imported_top_levels(tree) & FORBIDDEN


def _module_name(path: Path) -> str:
    parts = ("scoring", *path.relative_to(PACKAGE_DIR).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


_PROBE = """
import importlib, json, pkgutil, sys
import scoring
modules, errors = [], {}
for info in pkgutil.walk_packages(scoring.__path__, "scoring."):
    try:
        importlib.import_module(info.name)
        modules.append(info.name)
    except Exception as exc:  # reported, and fails the test
        errors[info.name] = f"{type(exc).__name__}: {exc}"
loaded = sorted({name.split(".")[0] for name in sys.modules} & set(sys.argv[1:]))
print(json.dumps({"modules": modules, "errors": errors, "loaded": loaded}))
"""


def test_importing_every_scoring_module_loads_no_network_client() -> None:
    proc = subprocess.run(
        [sys.executable, "-c", _PROBE, *sorted(FORBIDDEN)],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=PACKAGE_DIR.parent,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout.strip().splitlines()[-1])
    assert report["errors"] == {}
    expected = {_module_name(p) for p in SOURCES} - {"scoring"}
    assert set(report["modules"]) == expected  # every module file was imported
    assert report["loaded"] == []
