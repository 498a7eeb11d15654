"""Prompt targets (PyRIT's ``pyrit.prompt_target``): ``HTTPTarget`` and opt-in W3C tracing.

This subpackage imports ``httpx``; the rest of ``scoring`` does not need it.
"""

from scoring.prompt_target.base import PromptTarget
from scoring.prompt_target.http_target import HTTPTarget, parse_http_request
from scoring.prompt_target.tracing import RequestTrace, TargetTraceConfig

__all__ = ["HTTPTarget", "PromptTarget", "RequestTrace", "TargetTraceConfig", "parse_http_request"]
