"""Prompt targets (PyRIT's ``pyrit.prompt_target``): ``HTTPTarget``, opt-in W3C tracing, and
``OpenAIChatTarget`` (the judges' chat endpoint, :mod:`scoring.evaluation.judges`, loaded on
first use because that module brings in the evaluation package's numpy and scipy).

This subpackage imports ``httpx``; the rest of ``scoring`` does not need it.
"""

from typing import TYPE_CHECKING

from scoring.prompt_target.base import PromptTarget
from scoring.prompt_target.http_target import HTTPTarget, parse_http_request
from scoring.prompt_target.tracing import RequestTrace, TargetTraceConfig

_JUDGES = frozenset({"OpenAIChatTarget", "RetryPolicy", "ChatTargetError"})

if TYPE_CHECKING:  # the same names, typed for a type checker (at run time: ``__getattr__``)
    from scoring.evaluation.judges import ChatTargetError, OpenAIChatTarget, RetryPolicy


def __getattr__(name: str) -> object:
    if name not in _JUDGES:
        raise AttributeError(f"module 'scoring.prompt_target' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module("scoring.evaluation.judges"), name)


__all__ = [
    "ChatTargetError",
    "HTTPTarget",
    "OpenAIChatTarget",
    "PromptTarget",
    "RequestTrace",
    "RetryPolicy",
    "TargetTraceConfig",
    "parse_http_request",
]
