"""The tool boundary: ``intercept_tool`` (one call per tool result) and a dispatch middleware.

Off by default (``TOOLWITNESS_TOOL_INTERCEPT=true`` to enable), fail-open, no network import
until a poisoning endpoint is actually called. The streaming attack scorer lives in
``collector.boundary.streaming`` (it needs the Kafka control-plane client).
"""

from collector.boundary.intercept import (
    DEFAULT_REDACT_KEYS,
    CapturePolicy,
    ToolDispatch,
    intercept_enabled,
    intercept_tool,
    make_tool_middleware,
)

__all__ = [
    "DEFAULT_REDACT_KEYS",
    "CapturePolicy",
    "ToolDispatch",
    "intercept_enabled",
    "intercept_tool",
    "make_tool_middleware",
]
