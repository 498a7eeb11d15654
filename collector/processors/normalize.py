"""The normalization processor: neutral span → compact span fact for the trace-state script.

It reuses ``scoring.normalize.normalize_span``; it never re-implements the rules.
"""

from __future__ import annotations

from typing import Any

from scoring.models.evidence import LIMIT_EXCEEDED, CaptureState
from scoring.normalize.spans import NeutralSpan, normalize_span

SPAN_REJECTED = "span_rejected"


def span_fact(span: NeutralSpan, max_argument_bytes: int) -> dict[str, Any]:
    """The compact record apply_spans.lua stores (times of executions kept in ns as strings)."""
    facts = normalize_span(span)
    x: list[Any] | bool = False
    e = facts.execution
    if e is not None:
        args = e.arguments
        state = e.arguments_state
        # A str of n characters is at most 4n UTF-8 bytes: encode only when that could exceed the cap.
        if args is not None and len(args) * 4 > max_argument_bytes and len(args.encode()) > max_argument_bytes:
            args = args.encode()[:max_argument_bytes].decode("utf-8", "ignore")
            state = CaptureState.TRUNCATED
        x = [
            e.span_id,
            e.name,
            e.status,
            str(e.start_time_unix_nano),
            str(e.end_time_unix_nano),
            state.value,
            args or "",
            e.call_id or "",
            e.convention,
        ]
    end_ms = (span.end_time_unix_nano or 0) // 1_000_000
    return {
        "i": span.span_id,
        "p": span.parent_span_id or "",
        "r": 1 if span.parent_is_remote else 0,
        "e": end_ms,
        "f": sorted(facts.reasons),
        "x": x,
        "s": span.session_id() or "",
    }


def rejected_fact(span_id: str, reason: str = SPAN_REJECTED) -> dict[str, Any]:
    """A placeholder for a span we refused: it counts as seen but keeps the trace incomplete."""
    return {"i": span_id, "p": "", "r": 1, "e": 0, "f": [reason, LIMIT_EXCEEDED], "x": False, "s": ""}
