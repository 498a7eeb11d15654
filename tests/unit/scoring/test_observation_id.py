"""The observation id: ``content_hash`` builds its body from the fields directly; it must stay
exactly the SHA-256 of the canonical JSON of ``model_dump(mode="json")`` (the published ids,
and every consumer's tamper check, depend on it)."""

from __future__ import annotations

import hashlib
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scoring.models import (
    Acquisition,
    CompletionSource,
    Coverage,
    MessageScorable,
    Observation,
    SessionScorable,
    ToolExecution,
    TraceScorable,
)
from scoring.models.evidence import NORMALIZATION_VERSION, CaptureState, canonical_json
from scoring.models.scorables import ContentScorable

# Unicode beyond ASCII, quotes, backslashes and control characters: the JSON writer's hard cases.
_text = st.text(alphabet=st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=24)
_id = st.text(alphabet="0123456789abcdef", min_size=1, max_size=32)
_trace = st.text(alphabet="0123456789abcdef", min_size=32, max_size=32).filter(lambda t: t.strip("0"))

_execution = st.builds(
    ToolExecution,
    name=st.text(min_size=1, max_size=20),
    trace_id=_text,
    span_id=_text,
    call_id=st.none() | _text,
    status=st.sampled_from(["ok", "error", "unset"]),
    start_time_unix_nano=st.integers(min_value=0, max_value=2**63 - 1),
    end_time_unix_nano=st.integers(min_value=0, max_value=2**63 - 1),
    arguments=st.none() | _text,
    arguments_state=st.sampled_from(list(CaptureState)),
    convention=st.sampled_from(["gen_ai", "openinference"]),
    delivered_canary=st.none() | _text,
    recorder=st.none() | _text,
)
_trusted = _execution.map(lambda e: ToolExecution.trusted(**e.__dict__))
_coverage = st.one_of(
    st.sampled_from(list(CompletionSource)).map(Coverage.completed),
    st.lists(
        st.sampled_from(["awaiting_completion", "late_span_after_completion", "orphan_parent", "z", "a"]), min_size=1
    ).map(lambda r: Coverage.incomplete(*r)),
)
_scope = st.one_of(
    st.lists(_trace, min_size=1, max_size=3).map(lambda ids: TraceScorable(trace_ids=tuple(ids))),
    _id.map(lambda s: SessionScorable(session_id=s)),
    st.builds(
        MessageScorable,
        message_id=_id,
        conversation_id=_text,
        trace_ids=st.none() | st.lists(_trace, max_size=2).map(tuple),
        response_text=st.none() | _text,
    ),
)


def reference_hash(o: Observation) -> str:
    """The definition: model_dump(mode="json") without the id, the capture time and each execution's
    unset delivered_canary and recorder (normalizations 3 and 4 added them: earlier observations keep
    their ids), canonical JSON, SHA-256."""
    body = o.model_dump(mode="json", exclude={"observation_id", "captured_at"})
    for e in body["tool_executions"]:
        for optional in ("delivered_canary", "recorder"):
            if e[optional] is None:
                del e[optional]
    return hashlib.sha256(canonical_json(body).encode()).hexdigest()


@settings(max_examples=400)
@given(
    scope=_scope,
    executions=st.lists(_execution | _trusted, max_size=6),
    coverage=_coverage,
    acquisition=st.sampled_from(list(Acquisition)),
)
def test_content_hash_is_the_hash_of_the_canonical_dump(
    scope: Any, executions: list[ToolExecution], coverage: Coverage, acquisition: Acquisition
) -> None:
    o = Observation(scorable=scope, tool_executions=tuple(executions), coverage=coverage, acquisition=acquisition)
    assert o.content_hash() == reference_hash(o)
    assert o.observation_id == reference_hash(o)
    built = Observation.model_construct(
        observation_id="",
        scorable=scope,
        tool_executions=tuple(executions),
        coverage=coverage,
        acquisition=acquisition,
        normalization_version=NORMALIZATION_VERSION,
        captured_at=o.captured_at,
    )
    assert built.content_hash() == o.observation_id


def test_what_the_fast_writer_refuses_is_hashed_by_the_definition() -> None:
    # orjson writes 64-bit integers only; the reference path takes the rest, with the same id.
    huge = ToolExecution(name="t", start_time_unix_nano=2**70, end_time_unix_nano=2**64)
    o = Observation(scorable=SessionScorable(session_id="s"), tool_executions=(huge,))
    assert o.observation_id == reference_hash(o)


def test_content_scorable_and_content_fields_covered() -> None:
    # Every field but the id and capture time is covered: a field added to Observation must be
    # added to _content too, or its value would not change the id.
    o = Observation(scorable=ContentScorable(text="hi"))
    assert set(o._content()) == set(Observation.model_fields) - {"observation_id", "captured_at"}
    assert o.content_hash() == reference_hash(o)


def test_an_argument_change_changes_the_id() -> None:
    e = ToolExecution(name="t", arguments='{"a":1}', arguments_state=CaptureState.CAPTURED)
    a = Observation(scorable=SessionScorable(session_id="s"), tool_executions=(e,))
    b = Observation(
        scorable=SessionScorable(session_id="s"), tool_executions=(e.model_copy(update={"arguments": '{"a":2}'}),)
    )
    assert a.observation_id != b.observation_id


def test_a_tampered_id_is_refused() -> None:
    o = Observation(scorable=SessionScorable(session_id="s"))
    with pytest.raises(ValueError, match="does not match"):
        Observation(observation_id="0" * 64, scorable=o.scorable, captured_at=o.captured_at)


@settings(max_examples=200)
@given(executions=st.lists(_execution | _trusted, min_size=2, max_size=6), data=st.data())
def test_equal_evidence_in_any_order_has_one_id_and_one_order(executions: list[ToolExecution], data: Any) -> None:
    # The library, the service and a replay list the same executions in one order, so the same
    # evidence always gets the same id (one record per id on a compacted observations topic).
    shuffled = data.draw(st.permutations(executions))
    scope = TraceScorable(trace_ids=("0af7651916cd43dd8448eb211c80319c",))
    a = Observation(scorable=scope, tool_executions=tuple(executions), coverage=Coverage.completed())
    b = Observation(scorable=scope, tool_executions=tuple(shuffled), coverage=Coverage.completed())
    assert a.observation_id == b.observation_id
    assert a.tool_executions == b.tool_executions
    built = Observation.model_construct(
        observation_id="",
        scorable=scope,
        tool_executions=tuple(shuffled),
        coverage=Coverage.completed(),
        acquisition=a.acquisition,
        normalization_version=NORMALIZATION_VERSION,
        captured_at=a.captured_at,
    )
    assert built.content_hash() == a.observation_id


def test_an_observation_published_before_normalization_3_still_loads_with_its_id() -> None:
    # Written by the service at 5ef347e (normalization "2", before executions had
    # delivered_canary): the snapshot stays re-scorable, its id unchanged.
    from pathlib import Path

    from collector.wire.convert import observation_from_proto
    from collector.wire.gen import score_pb2

    data = Path(__file__).resolve().parents[2] / "data" / "observations"
    want = "247ab2d829abaed4898b6eeeaa7085c16b51d053c209bd4df39fd1157d4c66c6"
    from_json = Observation.model_validate_json((data / "v2_observation.json").read_bytes())
    from_proto = observation_from_proto(score_pb2.Observation.FromString((data / "v2_observation.bin").read_bytes()))
    assert from_json.observation_id == from_proto.observation_id == want
    assert from_json.normalization_version == "2" and from_json.tool_executions[0].delivered_canary is None
