"""Evidence: tool executions seen in spans, coverage of that proof, and immutable observations."""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from enum import StrEnum
from typing import Literal

import orjson
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from scoring.models.scorables import AnyScorable

#: "2": an OpenInference TOOL span's arguments are ``input.value`` before ``tool.parameters``.
#: "3": an execution records the poisoning canary its result delivered (``delivered_canary``).
#: "4": attributes and argument envelopes per instrumentation (``scoring.normalize.conventions``);
#: an execution records the instrumentation scope that wrote it (``recorder``).
NORMALIZATION_VERSION = "4"

# Reasons why coverage is not complete. Any of them makes absence unprovable.
AWAITING_COMPLETION = "awaiting_completion"
SPAN_NOT_ENDED = "span_not_ended"
SPAN_UNSAMPLED = "span_unsampled"
ATTRIBUTES_DROPPED = "attributes_dropped"
ATTRIBUTE_LIMITS = "attribute_length_limited"
ORPHAN_PARENT = "orphan_parent"
CONFLICTING_EVIDENCE = "conflicting_evidence"
#: two completion claims for one trace that disagree (another span count): neither proves anything
CONFLICTING_COMPLETION = "conflicting_completion"
LATE_SPAN = "late_span_after_completion"
RETENTION_EXPIRED = "retention_expired"
STATE_LOST = "state_lost"
LIMIT_EXCEEDED = "limit_exceeded"
#: the service could not judge the evidence (an error while reading or judging it)
EVALUATION_FAILED = "evaluation_failed"
#: the trace was written by an instrumentation known to leave some executions unrecorded
EXECUTIONS_NOT_RECORDED = "executions_not_recorded"
#: the scope names no trace yet (a message whose target had tracing off, or no id linked).
NO_TRACE_LINKED = "no_trace_linked"


class _Frozen(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")


class CaptureState(StrEnum):
    """Whether a value (arguments, result) was recorded in full."""

    CAPTURED = "captured"
    ABSENT = "absent"
    TRUNCATED = "truncated"


class ToolExecution(_Frozen):
    """One tool execution seen in a span (not a model-*requested* call)."""

    name: str
    trace_id: str = ""
    span_id: str = ""
    call_id: str | None = None
    status: Literal["ok", "error", "unset"] = "unset"
    start_time_unix_nano: int = 0
    end_time_unix_nano: int = 0
    arguments: str | None = None
    arguments_state: CaptureState = CaptureState.ABSENT
    convention: Literal["gen_ai", "openinference"] = "gen_ai"
    #: the poisoning canary this execution's result delivered to the agent (the tool boundary's
    #: ``toolwitness.poisoning.canary``): what makes "the canary did not propagate" a finding
    delivered_canary: str | None = None
    #: the instrumentation scope (tracer name) that wrote the record: records of one call by two
    #: instrumentations are told apart from two calls by it
    recorder: str | None = None

    @property
    def failed(self) -> bool:
        return self.status == "error"

    @classmethod
    def trusted(
        cls,
        name: str,
        trace_id: str,
        span_id: str,
        call_id: str | None,
        status: Literal["ok", "error", "unset"],
        start_time_unix_nano: int,
        end_time_unix_nano: int,
        arguments: str | None,
        arguments_state: CaptureState,
        convention: Literal["gen_ai", "openinference"],
        delivered_canary: str | None = None,
        recorder: str | None = None,
    ) -> ToolExecution:
        """An execution rebuilt from values that were validated when first seen (stored state).

        No validation, and no default but ``delivered_canary`` and ``recorder``: every other field is given.
        Equal to the validated model of the same values; about ten times cheaper than
        ``model_construct`` (the streaming service rebuilds every execution of a trace for each
        decision).
        """
        m = cls.__new__(cls)
        values = {
            "name": name,
            "trace_id": trace_id,
            "span_id": span_id,
            "call_id": call_id,
            "status": status,
            "start_time_unix_nano": start_time_unix_nano,
            "end_time_unix_nano": end_time_unix_nano,
            "arguments": arguments,
            "arguments_state": arguments_state,
            "convention": convention,
            "delivered_canary": delivered_canary,
            "recorder": recorder,
        }
        object.__setattr__(m, "__dict__", values)
        object.__setattr__(m, "__pydantic_fields_set__", set(values))
        object.__setattr__(m, "__pydantic_extra__", None)
        object.__setattr__(m, "__pydantic_private__", None)
        return m


def execution_order(e: ToolExecution) -> tuple[object, ...]:
    """The one order of executions in an observation: start time, then ids, then every other field
    (a total order, so that equal evidence is always listed, and hashed, the same way)."""
    return (
        e.start_time_unix_nano,
        e.trace_id,
        e.span_id,
        e.name,
        e.end_time_unix_nano,
        e.status,
        e.call_id is not None,
        e.call_id or "",
        e.arguments is not None,
        e.arguments or "",
        e.arguments_state,
        e.convention,
        e.delivered_canary is not None,
        e.delivered_canary or "",
        e.recorder or "",
    )


class CompletionSource(StrEnum):
    MARKER = "marker"
    WATERMARK = "watermark"
    CALLER = "caller"


class Coverage(_Frozen):
    """How complete the evidence is. ``complete`` implies no reasons."""

    complete: bool = False
    reasons: tuple[str, ...] = (AWAITING_COMPLETION,)
    source: CompletionSource | None = None

    @field_validator("reasons")
    @classmethod
    def _sorted_unique(cls, v: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(set(v)))

    @model_validator(mode="after")
    def _complete_means_no_reasons(self) -> Coverage:
        if self.complete and self.reasons:
            raise ValueError(f"coverage cannot be complete with reasons {list(self.reasons)}")
        if not self.complete and not self.reasons:
            raise ValueError("incomplete coverage must name at least one reason")
        return self

    @classmethod
    def completed(cls, source: CompletionSource = CompletionSource.CALLER) -> Coverage:
        return cls(complete=True, reasons=(), source=source)

    @classmethod
    def incomplete(cls, *reasons: str) -> Coverage:
        return cls(complete=False, reasons=tuple(reasons) or (AWAITING_COMPLETION,))


class Acquisition(StrEnum):
    COMPLETE = "complete"
    PARTIAL = "partial"
    UNAVAILABLE = "unavailable"
    ERROR = "error"


# One encoder for every call (``json.dumps`` with options builds a new one each time).
_CANONICAL = json.JSONEncoder(sort_keys=True, separators=(",", ":"), ensure_ascii=False)


_OPTIONAL = ("delivered_canary", "recorder")


def _hashed(e: ToolExecution) -> dict[str, object]:
    """An execution as the observation id covers it: every field, but ``delivered_canary`` and
    ``recorder`` only when set (they came with normalizations 3 and 4: observations published
    before keep their ids)."""
    d = e.__dict__
    if d.get("delivered_canary") is None or d.get("recorder") is None:
        return {k: v for k, v in d.items() if k not in _OPTIONAL or v is not None}
    return d


def canonical_json(value: object) -> str:
    """Deterministic JSON: sorted keys, no whitespace, UTF-8 kept."""
    return _CANONICAL.encode(value)


def _content_bytes(content: dict[str, object]) -> bytes:
    """``canonical_json(content).encode()`` for an observation's content, about three times faster.

    orjson writes the same bytes for what that content can hold: str keys; str, str-enum, int,
    bool and None values; no floats (no observation field is one). What orjson refuses (an int
    beyond 64 bits, a lone surrogate) takes the reference path, which behaves as it always did.
    ``tests/unit/scoring/test_observation_id.py`` holds the two equal."""
    try:
        return orjson.dumps(content, option=orjson.OPT_SORT_KEYS)
    except TypeError:
        return canonical_json(content).encode()


class Observation(_Frozen):
    """An immutable evidence snapshot: anyone can re-score it without the trace store.

    ``observation_id`` is the SHA-256 of the canonical JSON of the content
    (everything but ``observation_id`` and ``captured_at``), so equal evidence
    always has the same id. Tool results are never retained; arguments are, so
    argument conditions can be replayed.
    """

    observation_id: str = ""
    scorable: AnyScorable
    tool_executions: tuple[ToolExecution, ...] = ()
    coverage: Coverage = Field(default_factory=Coverage)
    acquisition: Acquisition = Acquisition.PARTIAL
    normalization_version: str = NORMALIZATION_VERSION
    captured_at: datetime = Field(default_factory=lambda: datetime.now(UTC))

    @field_validator("tool_executions")
    @classmethod
    def _in_execution_order(cls, v: tuple[ToolExecution, ...]) -> tuple[ToolExecution, ...]:
        return tuple(sorted(v, key=execution_order))

    @model_validator(mode="after")
    def _content_id(self) -> Observation:
        expected = self.content_hash()
        if not self.observation_id:
            object.__setattr__(self, "observation_id", expected)
        elif self.observation_id != expected:
            raise ValueError("observation_id does not match the observation's content")
        return self

    def content_hash(self) -> str:
        return hashlib.sha256(_content_bytes(self._content())).hexdigest()

    def _content(self) -> dict[str, object]:
        """What the id covers, as ``model_dump(mode="json")`` gives it minus ``observation_id``,
        ``captured_at`` and each execution's unset ``delivered_canary``; built from the fields
        directly (the streaming service hashes every observation it publishes). Executions and
        coverage have only plain, None and str-enum values, which JSON writes as
        ``model_dump(mode="json")`` does; the differential test
        ``tests/unit/scoring/test_observation_id.py`` holds the two equal."""
        c = self.coverage
        return {
            "scorable": self.scorable.model_dump(mode="json"),
            # in execution order whatever the tuple's (``model_construct`` skips the validator)
            "tool_executions": [_hashed(e) for e in sorted(self.tool_executions, key=execution_order)],
            "coverage": {"complete": c.complete, "reasons": c.reasons, "source": c.source},
            "acquisition": self.acquisition,
            "normalization_version": self.normalization_version,
        }

    @property
    def available(self) -> bool:
        return self.acquisition is not Acquisition.UNAVAILABLE

    def with_gap(self, reason: str) -> Observation:
        """The same evidence, known to miss part of the scope for ``reason`` (coverage incomplete)."""
        reasons = (*self.coverage.reasons, reason)
        acquisition = Acquisition.PARTIAL if self.acquisition is Acquisition.COMPLETE else self.acquisition
        return Observation(
            scorable=self.scorable,
            tool_executions=self.tool_executions,
            coverage=Coverage.incomplete(*reasons),
            acquisition=acquisition,
            normalization_version=self.normalization_version,
            captured_at=self.captured_at,
        )
