"""Conversions between the wire (protobuf / JSON) and the scoring library's models.

Decoding control messages validates every field and raises ``ControlDecodeError``
with a reason that names what was wrong; the receiver sends such records to the DLQ.
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Literal

import orjson
from google.protobuf import json_format
from google.protobuf.duration_pb2 import Duration
from google.protobuf.message import DecodeError
from google.protobuf.timestamp_pb2 import Timestamp
from pydantic import ValidationError

from collector.wire.gen import common_pb2, control_pb2, score_pb2
from collector.wire.regex_safety import backtracking_problem
from scoring.models import (
    Acquisition,
    ArgumentMatcher,
    CaptureState,
    CompletionSource,
    Coverage,
    MessageScorable,
    Observation,
    PayloadPropagated,
    ScoringExpectation,
    SessionScorable,
    ToolCallRequirement,
    ToolExecution,
    ToolsCalled,
    ToolSequence,
    TraceScorable,
)
from scoring.models.conditions import Condition
from scoring.models.scorables import check_trace_id

Scope = TraceScorable | SessionScorable | MessageScorable

#: A tenant as it appears in Redis keys (``tw:{<tenant>:…}``): the same rule as for span records,
#: so no tenant can contain the ``:`` that separates it from a trace or expectation id.
TENANT = re.compile(r"[A-Za-z0-9._-]{1,64}")
#: The range of ``google.protobuf.Duration`` (about 10,000 years); the binary form accepts more.
MAX_DURATION_SECONDS = 315_576_000_000


class ControlDecodeError(ValueError):
    """A control record that cannot be used. ``reason`` is a short machine-readable code."""

    retriable = False

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


def _expectation_to_json(expectation: ScoringExpectation) -> dict[str, object]:
    """The expectation as JSON that validates back to the same model.

    ``ArgumentMatcher`` tells its kind by which fields were *set* (``equals`` may be null), so a
    plain ``model_dump`` (every field, unset ones as null) would not validate again: an
    expectation with a regex / range / one-of matcher could then never be loaded from Redis.
    Matchers are dumped with their set fields only.
    """
    doc = expectation.model_dump(mode="json")
    for cond, cond_doc in zip(expectation.conditions, doc["conditions"], strict=True):
        if isinstance(cond, ToolsCalled):
            for req, req_doc in zip(cond.tools, cond_doc["tools"], strict=True):
                req_doc["arguments"] = [m.model_dump(mode="json", exclude_unset=True) for m in req.arguments]
    return doc


@dataclass(frozen=True, slots=True)
class RegisteredExpectation:
    """An expectation as the service keeps it."""

    expectation_id: str
    tenant: str
    scope: Scope
    scorer: str
    expectation: ScoringExpectation
    deadline_ms: int
    created_ms: int
    #: the caller's labels (run, suite, ...), echoed in every score's metadata as ``label.<key>``
    labels: tuple[tuple[str, str], ...] = ()

    def trace_ids(self) -> tuple[str, ...]:
        if isinstance(self.scope, SessionScorable):
            return ()
        return self.scope.trace_ids or ()

    def to_json(self) -> str:
        return json.dumps(
            {
                "id": self.expectation_id,
                "tenant": self.tenant,
                "scope": self.scope.model_dump(mode="json"),
                "scorer": self.scorer,
                "expectation": _expectation_to_json(self.expectation),
                "deadline_ms": self.deadline_ms,
                "created_ms": self.created_ms,
                **({"labels": dict(self.labels)} if self.labels else {}),
            },
            separators=(",", ":"),
        )

    @classmethod
    def from_json(cls, raw: str | bytes) -> RegisteredExpectation:
        try:  # orjson: the same values as json.loads, faster; what it refuses takes json.loads
            d = orjson.loads(raw)
        except orjson.JSONDecodeError:
            d = json.loads(raw)
        kind = d["scope"]["kind"]
        scope: Scope
        if kind == "trace":
            scope = TraceScorable.model_validate(d["scope"])
        elif kind == "session":
            scope = SessionScorable.model_validate(d["scope"])
        else:
            scope = MessageScorable.model_validate(d["scope"])
        return cls(
            expectation_id=d["id"],
            tenant=d["tenant"],
            scope=scope,
            scorer=d["scorer"],
            expectation=ScoringExpectation.model_validate(d["expectation"]),
            deadline_ms=int(d["deadline_ms"]),
            created_ms=int(d["created_ms"]),
            labels=tuple(sorted(d.get("labels", {}).items())),
        )


# --- control: proto -> models ---------------------------------------------------------------------


#: why ``check_regex`` refuses, by ``backtracking_problem``'s cause
_BACKTRACKING = {
    "nested": "a repetition of varying length sits in another repetition and no character it cannot "
    "match separates the iterations (as in (\\w+\\s?)+): exponential time",
    "alternatives": "alternatives in a repetition can match the same text (as in (a|a)+ or (.|\\s)*): exponential time",
    "adjacent": "three or more adjacent unbounded repetitions can match the same characters (as in "
    "\\w*\\w*\\w*x): time of the cube of the length or worse",
    "too_deep": "it is nested too deeply to check",
}


def check_regex(pattern: str) -> None:
    """Refuse a matcher regex that backtracks catastrophically. It runs on the agent's arguments,
    which the model under test steers, inside the service's event loop: ``^(\\w+\\s?)+$`` on 40
    letters and a ``!`` would stall every tenant's scoring for hours. What is refused, and what is
    not, is described in ``collector.wire.regex_safety``."""
    cause = backtracking_problem(pattern)
    if cause is not None:
        raise ControlDecodeError(
            "invalid_matcher",
            f"regex {pattern[:80]!r} can backtrack for hours on the agent's arguments: {_BACKTRACKING[cause]}; "
            "make the repetition possessive (a++, (?:...)++) or atomic ((?>...)), or rewrite it",
        )


def _matcher(m: control_pb2.ArgumentMatcher) -> ArgumentMatcher:
    kind = m.WhichOneof("match")
    path = m.path or "$"
    if kind == "equals_json":
        return ArgumentMatcher(path=path, equals=json.loads(m.equals_json))
    if kind == "regex":
        check_regex(m.regex)
        return ArgumentMatcher(path=path, regex=m.regex)
    if kind == "range":
        return ArgumentMatcher(
            path=path,
            minimum=m.range.min if m.range.HasField("min") else None,
            maximum=m.range.max if m.range.HasField("max") else None,
        )
    if kind == "one_of":
        return ArgumentMatcher(path=path, one_of=tuple(json.loads(v) for v in m.one_of.values_json))
    raise ControlDecodeError("invalid_matcher", f"argument matcher at {path!r} has no match kind")


def _condition(c: control_pb2.Condition) -> Condition:
    kind = c.WhichOneof("kind")
    if kind == "tools_called":
        return ToolsCalled(
            tools=tuple(
                ToolCallRequirement(
                    name=t.name,
                    arguments=tuple(_matcher(m) for m in t.arguments),
                    status=(t.status or "any"),
                    min_count=t.min_count if t.HasField("min_count") else 1,
                    max_count=t.max_count if t.HasField("max_count") else None,
                )
                for t in c.tools_called.tools
            )
        )
    if kind == "tool_sequence":
        return ToolSequence(tools=tuple(c.tool_sequence.tools), mode=(c.tool_sequence.mode or "subsequence"))
    if kind == "payload_propagated":
        return PayloadPropagated(
            canaries=tuple(c.payload_propagated.canaries), target_tools=tuple(c.payload_propagated.target_tools)
        )
    raise ControlDecodeError("invalid_condition", "condition has no kind")


def scope_from_proto(s: common_pb2.Scope) -> Scope:
    kind = s.WhichOneof("kind")
    if kind == "traces":
        return TraceScorable(trace_ids=tuple(s.traces.trace_ids))
    if kind == "session":
        return SessionScorable(session_id=s.session.session_id)
    if kind == "message":
        m = s.message
        return MessageScorable(
            message_id=m.message_id or "message",
            conversation_id=m.conversation_id,
            trace_ids=tuple(m.trace_ids),
            response_text=m.response_text if m.HasField("response_text") else None,
        )
    raise ControlDecodeError("invalid_scope", "expectation has no scope")


def scope_to_proto(scope: Scope) -> common_pb2.Scope:
    if isinstance(scope, TraceScorable):
        return common_pb2.Scope(traces=common_pb2.TraceScope(trace_ids=list(scope.trace_ids)))
    if isinstance(scope, SessionScorable):
        return common_pb2.Scope(session=common_pb2.SessionScope(session_id=scope.session_id))
    return common_pb2.Scope(
        message=common_pb2.MessageScope(
            conversation_id=scope.conversation_id,
            message_id=scope.message_id,
            trace_ids=list(scope.trace_ids or ()),
            response_text=scope.response_text,  # None: not set (no text), "" : the empty text
        )
    )


def decode_control(value: bytes, *, json_format_input: bool = False) -> control_pb2.ControlMessage:
    """Parse a control record (protobuf, or protobuf-JSON when the first byte is '{')."""
    msg = control_pb2.ControlMessage()
    try:
        if json_format_input or value[:1] == b"{":
            json_format.Parse(value.decode("utf-8"), msg)
        else:
            msg.ParseFromString(value)
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, RecursionError) as exc:
        raise ControlDecodeError("undecodable_control", f"{type(exc).__name__}: {exc}") from None
    kind = msg.WhichOneof("message")
    if kind is None:
        raise ControlDecodeError("empty_control", "control message has no expectation, completion or cancel")
    tenant = getattr(msg, kind).tenant
    if tenant and not TENANT.fullmatch(tenant):
        raise ControlDecodeError("invalid_tenant", f"tenant {tenant[:80]!r} is not {TENANT.pattern}")
    return msg


def expectation_from_proto(
    e: control_pb2.Expectation, *, default_tenant: str, default_deadline_s: float, now_ms: int
) -> RegisteredExpectation:
    if not e.expectation_id:
        raise ControlDecodeError("invalid_expectation", "expectation_id is empty")
    try:
        scope = scope_from_proto(e.scope)
        expectation = ScoringExpectation(
            conditions=tuple(_condition(c) for c in e.conditions), objective=e.objective or None
        )
    except ValidationError as exc:
        first = exc.errors(include_url=False)[0]
        where = ".".join(str(x) for x in first["loc"])
        raise ControlDecodeError("invalid_expectation", f"{where}: {first['msg']}") from None
    except (ValueError, json.JSONDecodeError, RecursionError) as exc:
        if isinstance(exc, ControlDecodeError):
            raise
        raise ControlDecodeError("invalid_expectation", str(exc)[:300]) from None
    labels = check_labels(e.labels)
    if e.HasField("deadline"):
        d = e.deadline
        if abs(d.seconds) > MAX_DURATION_SECONDS or abs(d.nanos) > 999_999_999:
            raise ControlDecodeError("invalid_expectation", f"deadline out of range: {d.seconds}s {d.nanos}ns")
        deadline_s = d.ToTimedelta().total_seconds()
    else:
        deadline_s = default_deadline_s
    created_ms = now_ms
    return RegisteredExpectation(
        expectation_id=e.expectation_id,
        tenant=e.tenant or default_tenant,
        scope=scope,
        scorer=e.scorer or "tools",
        expectation=expectation,
        deadline_ms=created_ms + int(deadline_s * 1000),
        created_ms=created_ms,
        labels=labels,
    )


#: bounds on an expectation's labels (they are stored with it and copied into every score)
MAX_LABELS, MAX_LABEL_KEY, MAX_LABEL_VALUE = 32, 64, 256


def check_labels(labels: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    if len(labels) > MAX_LABELS:
        raise ControlDecodeError("invalid_expectation", f"{len(labels)} labels; at most {MAX_LABELS}")
    for k, v in labels.items():
        if not k or len(k) > MAX_LABEL_KEY or len(v) > MAX_LABEL_VALUE:
            raise ControlDecodeError(
                "invalid_expectation",
                f"label {k[:40]!r}: keys take 1-{MAX_LABEL_KEY} characters, values at most {MAX_LABEL_VALUE}",
            )
    return tuple(sorted(labels.items()))


def check_marker(m: control_pb2.CompletionMarker) -> None:
    target = m.WhichOneof("target")
    if target is None:
        raise ControlDecodeError("invalid_marker", "completion marker names neither trace_id nor session_id")
    if target == "trace_id":
        try:
            check_trace_id(m.trace_id)
        except ValueError as exc:
            raise ControlDecodeError("invalid_marker", str(exc)) from None


# --- outputs: models -> proto ----------------------------------------------------------------------

_CAPTURE = {
    CaptureState.CAPTURED: common_pb2.CAPTURE_STATE_CAPTURED,
    CaptureState.ABSENT: common_pb2.CAPTURE_STATE_ABSENT,
    CaptureState.TRUNCATED: common_pb2.CAPTURE_STATE_TRUNCATED,
}
_CAPTURE_BACK = {v: k for k, v in _CAPTURE.items()}
_SOURCE = {
    CompletionSource.MARKER: common_pb2.COMPLETION_SOURCE_MARKER,
    CompletionSource.WATERMARK: common_pb2.COMPLETION_SOURCE_WATERMARK,
    CompletionSource.CALLER: common_pb2.COMPLETION_SOURCE_CALLER,
}
_SOURCE_BACK = {v: k for k, v in _SOURCE.items()}
_ACQ = {
    Acquisition.COMPLETE: score_pb2.ACQUISITION_COMPLETE,
    Acquisition.PARTIAL: score_pb2.ACQUISITION_PARTIAL,
    Acquisition.UNAVAILABLE: score_pb2.ACQUISITION_UNAVAILABLE,
    Acquisition.ERROR: score_pb2.ACQUISITION_ERROR,
}
_ACQ_BACK = {v: k for k, v in _ACQ.items()}


def coverage_to_proto(c: Coverage) -> common_pb2.Coverage:
    return common_pb2.Coverage(
        complete=c.complete,
        reasons=list(c.reasons),
        source=_SOURCE[c.source] if c.source is not None else common_pb2.COMPLETION_SOURCE_UNSPECIFIED,
    )


def coverage_from_proto(c: common_pb2.Coverage) -> Coverage:
    if c.complete:
        return Coverage.completed(_SOURCE_BACK.get(c.source, CompletionSource.MARKER))
    return Coverage.incomplete(*c.reasons)


_EXEC_STATUS = {
    "ok": common_pb2.EXECUTION_STATUS_OK,
    "error": common_pb2.EXECUTION_STATUS_ERROR,
    "unset": common_pb2.EXECUTION_STATUS_UNSPECIFIED,  # not known (attributes were dropped)
}
_EXEC_STATUS_BACK: dict[int, Literal["ok", "error", "unset"]] = {
    common_pb2.EXECUTION_STATUS_OK: "ok",
    common_pb2.EXECUTION_STATUS_ERROR: "error",
}


def execution_to_proto(e: ToolExecution) -> common_pb2.ToolExecution:
    return common_pb2.ToolExecution(
        name=e.name,
        trace_id=e.trace_id,
        span_id=e.span_id,
        call_id=e.call_id or "",
        status=_EXEC_STATUS[e.status],
        start_time_unix_nano=e.start_time_unix_nano,
        end_time_unix_nano=e.end_time_unix_nano,
        arguments_json=e.arguments or "",
        arguments_state=_CAPTURE[e.arguments_state],
        convention=e.convention,
        delivered_canary=e.delivered_canary or "",
        recorder=e.recorder or "",
    )


def execution_from_proto(p: common_pb2.ToolExecution) -> ToolExecution:
    return ToolExecution(
        name=p.name,
        trace_id=p.trace_id,
        span_id=p.span_id,
        call_id=p.call_id or None,
        status=_EXEC_STATUS_BACK.get(p.status, "unset"),
        start_time_unix_nano=p.start_time_unix_nano,
        end_time_unix_nano=p.end_time_unix_nano,
        arguments=p.arguments_json if p.arguments_state != common_pb2.CAPTURE_STATE_ABSENT else None,
        arguments_state=_CAPTURE_BACK.get(p.arguments_state, CaptureState.ABSENT),
        convention="openinference" if p.convention == "openinference" else "gen_ai",
        delivered_canary=p.delivered_canary or None,
        recorder=p.recorder or None,
    )


def observation_to_proto(o: Observation) -> score_pb2.Observation:
    msg = score_pb2.Observation(
        observation_id=o.observation_id,
        scope=scope_to_proto(o.scorable),  # type: ignore[arg-type]
        coverage=coverage_to_proto(o.coverage),
        acquisition=_ACQ[o.acquisition],
        normalization_version=o.normalization_version,
    )
    # ``execution_to_proto`` inlined into ``add``: one message each, not one built and then copied
    # (the service encodes every execution of every observation it publishes).
    add = msg.tool_executions.add
    for e in o.tool_executions:
        d = e.__dict__
        add(
            name=d["name"],
            trace_id=d["trace_id"],
            span_id=d["span_id"],
            call_id=d["call_id"] or "",
            status=_EXEC_STATUS[d["status"]],
            start_time_unix_nano=d["start_time_unix_nano"],
            end_time_unix_nano=d["end_time_unix_nano"],
            arguments_json=d["arguments"] or "",
            arguments_state=_CAPTURE[d["arguments_state"]],
            convention=d["convention"],
            delivered_canary=d["delivered_canary"] or "",
            recorder=d["recorder"] or "",
        )
    set_timestamp(msg.captured_at, o.captured_at)
    return msg


_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


def _set_seconds(msg: Timestamp | Duration, td: timedelta) -> None:
    # whole seconds rounded down and a non-negative remainder: a valid Timestamp for any td,
    # a valid Duration for td >= 0 (seconds and nanos of one sign)
    msg.seconds = td.days * 86_400 + td.seconds
    msg.nanos = td.microseconds * 1000


def set_timestamp(ts: Timestamp, dt: datetime) -> None:
    """``ts.FromDatetime(dt)``, exact to the microsecond, without its time tuple (naive = UTC)."""
    _set_seconds(ts, (dt if dt.tzinfo is not None else dt.replace(tzinfo=UTC)) - _EPOCH)


def set_duration(d: Duration, td: timedelta) -> None:
    """``d.FromTimedelta(td)`` for ``td >= 0``, exact to the microsecond."""
    if td < timedelta(0):
        raise ValueError(f"negative duration {td}")
    _set_seconds(d, td)


def observation_from_proto(p: score_pb2.Observation) -> Observation:
    """Rebuild the library Observation; its content hash must match the id (tamper check)."""
    return Observation(
        observation_id=p.observation_id,
        scorable=scope_from_proto(p.scope),
        tool_executions=tuple(execution_from_proto(e) for e in p.tool_executions),
        coverage=coverage_from_proto(p.coverage),
        acquisition=_ACQ_BACK.get(p.acquisition, Acquisition.PARTIAL),
        normalization_version=p.normalization_version,
        captured_at=p.captured_at.ToDatetime(tzinfo=UTC),
    )


def score_id_for(tenant: str, expectation_id: str, version: int) -> str:
    """Deterministic score id: the same expectation (of one tenant) and version always give the same
    id; two tenants' expectations with the same id never share one (the scores topic is shared)."""
    return hashlib.sha256(f"{tenant}\x00{expectation_id}\x00{version}".encode()).hexdigest()[:32]


def encode(msg: score_pb2.ScoreEvent | score_pb2.Observation | control_pb2.ControlMessage, fmt: str) -> bytes:
    if fmt == "json":
        return json_format.MessageToJson(msg, preserving_proto_field_name=True, sort_keys=True, indent=None).encode()
    return msg.SerializeToString(deterministic=True)


def decode_score_event(value: bytes) -> score_pb2.ScoreEvent:
    ev = score_pb2.ScoreEvent()
    if value[:1] == b"{":
        json_format.Parse(value.decode(), ev)
    else:
        ev.ParseFromString(value)
    return ev


def decode_observation(value: bytes) -> score_pb2.Observation:
    ob = score_pb2.Observation()
    if value[:1] == b"{":
        json_format.Parse(value.decode(), ob)
    else:
        ob.ParseFromString(value)
    return ob


def now_ms() -> int:
    return int(datetime.now(UTC).timestamp() * 1000)
