"""Capture, acquisition, replay, identity, tree validation and fallback metadata (in-process, no services)."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator, Sequence
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from opentelemetry.context import Context
from opentelemetry.sdk.trace import ReadableSpan, SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor, SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import SpanContext, TraceFlags
from pydantic import ValidationError

from scoring.memory import CentralMemory, MemoryInterface
from scoring.models import (
    Acquisition,
    Coverage,
    MessageScorable,
    Observation,
    Score,
    ScoreStatus,
    ScoringExpectation,
    SessionScorable,
    ToolCallRequirement,
    ToolExecution,
    ToolsCalled,
    ToolSequence,
    TraceScorable,
    Verdict,
)
from scoring.models.evidence import (
    ATTRIBUTE_LIMITS,
    AWAITING_COMPLETION,
    LATE_SPAN,
    ORPHAN_PARENT,
    RETENTION_EXPIRED,
    canonical_json,
)
from scoring.models.scorables import Scorable
from scoring.normalize import NeutralSpan
from scoring.score import (
    FloatScaleFallbackScorer,
    FloatScaleScorer,
    OtelToolCallScorer,
    PlagiarismScorer,
    ScorerConfigurationError,
    ScoringContext,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseFallbackScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
    TrueFalseScorer,
)
from scoring.score.observation import (
    InMemoryTraceClient,
    InMemoryTraceExporter,
    OtelTraceSource,
    TraceClientClosedError,
)

T, F, U = Verdict.TRUE, Verdict.FALSE, Verdict.UNDETERMINED
TRACE_A = "0af7651916cd43dd8448eb211c80319c"
TRACE_B = "4bf92f3577b34da6a3ce929d0e0e4736"
CAPTURED_AT = datetime(2026, 1, 1, tzinfo=UTC)


def expects(*names: str) -> ScoringExpectation:
    return ScoringExpectation(conditions=(ToolsCalled(tools=tuple(ToolCallRequirement(name=n) for n in names)),))


def tool_span(
    trace_id: str,
    span_id: int,
    name: str | None = None,
    *,
    parent: int | None = None,
    session: str | None = None,
    start: int = 100,
) -> NeutralSpan:
    """A finished span; a tool execution named ``name`` when given, else a plain span."""
    attributes: dict[str, Any] = {}
    if name is not None:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name}
    if session is not None:
        attributes["gen_ai.conversation.id"] = session
    return NeutralSpan(
        trace_id=trace_id,
        span_id=f"{span_id:016x}",
        name=name or "agent",
        parent_span_id=None if parent is None else f"{parent:016x}",
        start_time_unix_nano=start,
        end_time_unix_nano=start + 10,
        attributes=attributes,
    )


async def verdict(scorer: OtelToolCallScorer, scorable: Any, expectation: ScoringExpectation) -> Verdict:
    (score,) = await scorer.score_async(scorable, expectation, context=ScoringContext())
    return score.verdict


@pytest.fixture
def client() -> Iterator[InMemoryTraceClient]:
    c = InMemoryTraceClient()
    yield c
    c.close()


@pytest.fixture
def scorer(client: InMemoryTraceClient) -> OtelToolCallScorer:
    return OtelToolCallScorer(source=OtelTraceSource(trace_client=client))


@pytest.fixture
def memory(monkeypatch: pytest.MonkeyPatch) -> MemoryInterface:
    """A fresh central memory for this test only (the process-wide instance is restored afterwards)."""
    m = MemoryInterface()
    monkeypatch.setattr(CentralMemory, "_instance", m)
    return m


# --- the exporter and attribute-length limits ----------------------------------------------------------


def _provider(client: InMemoryTraceClient, limits: SpanLimits, *also: InMemorySpanExporter) -> TracerProvider:
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=limits)
    provider.add_span_processor(SimpleSpanProcessor(InMemoryTraceExporter(trace_client=client)))
    for exporter in also:
        provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider


def _run_agent(provider: TracerProvider, tool: str = "my_tool_call") -> str:
    tracer = provider.get_tracer("test")
    with (
        tracer.start_as_current_span("agent", context=Context()) as root,
        tracer.start_as_current_span(
            tool, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool}
        ),
    ):
        pass
    return f"{root.get_span_context().trace_id:032x}"


async def test_exporter_refuses_finite_attribute_length_and_absence_stays_undetermined(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    copies = InMemorySpanExporter()
    provider = _provider(client, SpanLimits(max_span_attribute_length=10), copies)
    try:
        trace_id = _run_agent(provider, tool="a_rather_long_tool_name")
    finally:
        provider.shutdown()
    (result,) = client.query([trace_id])
    assert result.spans == ()
    assert ATTRIBUTE_LIMITS in result.coverage.reasons
    # Exporting the same spans again is refused outright.
    again = InMemoryTraceExporter(trace_client=InMemoryTraceClient())
    assert again.export(copies.get_finished_spans()) is SpanExportResult.FAILURE

    scope = TraceScorable(trace_ids=(trace_id,))
    assert await verdict(scorer, scope, expects("summarize")) is U
    client.mark_complete(trace_ids=(trace_id,))
    (result,) = client.query([trace_id])
    assert not result.coverage.complete
    # every span was refused: nothing seen, so "complete" without a count proves nothing either
    assert set(result.coverage.reasons) == {ATTRIBUTE_LIMITS, AWAITING_COMPLETION}
    # FALSE is impossible: a truncated name cannot prove which tool ran, even after completion.
    assert await verdict(scorer, scope, expects("summarize")) is U
    assert await verdict(scorer, scope, expects("a_rather_long_tool_name")) is U


async def test_exporter_refuses_limits_from_the_environment(
    monkeypatch: pytest.MonkeyPatch, client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "64")
    provider = _provider(client, SpanLimits())
    try:
        trace_id = _run_agent(provider)
    finally:
        provider.shutdown()
    (result,) = client.query([trace_id])
    assert result.spans == ()
    assert ATTRIBUTE_LIMITS in result.coverage.reasons


def test_exporter_refuses_unknown_limits() -> None:
    client = InMemoryTraceClient()
    ctx = SpanContext(trace_id=int(TRACE_A, 16), span_id=1, is_remote=False, trace_flags=TraceFlags(1))
    plain = ReadableSpan(name="x", context=ctx, attributes={"gen_ai.tool.name": "t"}, start_time=1, end_time=2)
    assert InMemoryTraceExporter(trace_client=client).export([plain]) is SpanExportResult.FAILURE
    (result,) = client.query([TRACE_A])
    assert result.spans == ()
    assert ATTRIBUTE_LIMITS in result.coverage.reasons


async def test_exporter_accepts_unset_limits_even_with_an_environment_limit(
    monkeypatch: pytest.MonkeyPatch, client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    monkeypatch.setenv("OTEL_ATTRIBUTE_VALUE_LENGTH_LIMIT", "8")
    copies = InMemorySpanExporter()
    long_name = "tool_" + "x" * 200
    provider = _provider(client, SpanLimits(max_span_attribute_length=SpanLimits.UNSET), copies)
    try:
        trace_id = _run_agent(provider, tool=long_name)
    finally:
        provider.shutdown()
    assert InMemoryTraceExporter(trace_client=InMemoryTraceClient()).export(copies.get_finished_spans()) is (
        SpanExportResult.SUCCESS
    )
    (result,) = client.query([trace_id])
    assert len(result.spans) == 2
    scope = TraceScorable(trace_ids=(trace_id,))
    assert await verdict(scorer, scope, expects(long_name)) is T
    assert await verdict(scorer, scope, expects("summarize")) is U
    client.mark_complete(trace_ids=(trace_id,))
    assert await verdict(scorer, scope, expects("summarize")) is F


def test_exporter_after_shutdown_fails() -> None:
    exporter = InMemoryTraceExporter(trace_client=InMemoryTraceClient())
    exporter.shutdown()
    assert exporter.export([]) is SpanExportResult.FAILURE


# --- the in-memory trace client ------------------------------------------------------------------------


async def test_mark_complete_is_per_trace(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    client.add_spans([tool_span(TRACE_B, 1), tool_span(TRACE_B, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A,))
    a, b = TraceScorable(trace_ids=(TRACE_A,)), TraceScorable(trace_ids=(TRACE_B,))
    assert await verdict(scorer, a, expects("email")) is F
    assert await verdict(scorer, b, expects("email")) is U
    # Both traces together: absence needs both complete.
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_A, TRACE_B)), expects("email")) is U
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_A, TRACE_B)), expects("search")) is T


async def test_complete_without_count_and_without_spans_proves_nothing(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    # Spans unsampled or never exported, or a mistyped trace id: "complete" alone is no evidence.
    a = TraceScorable(trace_ids=(TRACE_A,))
    client.mark_complete(trace_ids=(TRACE_A,))
    assert await verdict(scorer, a, expects("email")) is U
    # Spans that come after that claim are late for it: absence stays unproven, presence is TRUE.
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    assert await verdict(scorer, a, expects("email")) is U
    assert await verdict(scorer, a, expects("search")) is T
    # An explicit count of 0 is a claim about an empty trace: absence is proven.
    client.mark_complete(trace_ids=(TRACE_B,), span_count=0)
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_B,)), expects("email")) is F


def test_mark_complete_refuses_one_bare_trace_id(client: InMemoryTraceClient) -> None:
    with pytest.raises(TypeError, match=r"trace_ids must be a sequence.*mark_complete\(trace_ids=\("):
        client.mark_complete(trace_ids=TRACE_A)  # type: ignore[arg-type]


async def test_mark_complete_refuses_a_trace_id_no_span_can_be_kept_under(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    # Upper case (as some UIs show ids) or OTel's int: the claim completed no trace, silently,
    # and "email never ran" stayed UNDETERMINED with nothing saying why.
    client.add_spans([tool_span(TRACE_A, 1)])
    with pytest.raises(ValueError, match="lowercase hex"):
        client.mark_complete(trace_ids=(TRACE_A.upper(),), span_count=1)
    with pytest.raises(TypeError, match="format_trace_id"):
        client.mark_complete(trace_ids=(int(TRACE_A, 16),), span_count=1)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="lowercase hex"):  # refused whole: TRACE_A not claimed either
        client.mark_complete(trace_ids=(TRACE_A, "trace-b"), span_count=1)
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_A,)), expects("email")) is U
    client.mark_complete(trace_ids=(TRACE_A,), span_count=1)
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_A,)), expects("email")) is F


async def test_mark_complete_with_span_count_waits_for_the_spans(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    a = TraceScorable(trace_ids=(TRACE_A,))
    client.mark_complete(trace_ids=(TRACE_A,), span_count=2)
    client.add_spans([tool_span(TRACE_A, 1)])
    assert await verdict(scorer, a, expects("email")) is U
    client.add_spans([tool_span(TRACE_A, 2, "search", parent=1)])
    assert await verdict(scorer, a, expects("email")) is F
    client.add_spans([tool_span(TRACE_A, 2, "search", parent=1)])  # a replayed span is idempotent
    assert await verdict(scorer, a, expects("email")) is F


async def test_late_span_after_completion_reopens_only_that_trace(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    for t in (TRACE_A, TRACE_B):
        client.add_spans([tool_span(t, 1), tool_span(t, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A, TRACE_B))
    a, b = TraceScorable(trace_ids=(TRACE_A,)), TraceScorable(trace_ids=(TRACE_B,))
    assert await verdict(scorer, a, expects("email")) is F
    assert await verdict(scorer, b, expects("email")) is F

    client.add_spans([tool_span(TRACE_A, 3, "lookup", parent=1, start=150)])  # late, and not "email"
    (result,) = client.query([TRACE_A])
    assert LATE_SPAN in result.coverage.reasons
    assert not result.coverage.complete
    # The broken completion claim makes absence unprovable again, for that trace only.
    assert await verdict(scorer, a, expects("email")) is U
    assert await verdict(scorer, b, expects("email")) is F
    # Presence still proves invocation, including for the late span.
    assert await verdict(scorer, a, expects("lookup")) is T
    # Re-declaring completion does not heal a broken claim.
    client.mark_complete(trace_ids=(TRACE_A,))
    assert await verdict(scorer, a, expects("email")) is U


async def test_late_span_beyond_the_declared_count(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A,), span_count=2)
    a = TraceScorable(trace_ids=(TRACE_A,))
    assert await verdict(scorer, a, expects("email")) is F
    client.add_spans([tool_span(TRACE_A, 3, "email", parent=1)])
    (result,) = client.query([TRACE_A])
    assert LATE_SPAN in result.coverage.reasons
    assert await verdict(scorer, a, expects("email")) is T  # the verdict a revision would publish


async def test_expired_trace_is_unavailable_never_false(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer, memory: MemoryInterface
) -> None:
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    client.add_spans([tool_span(TRACE_B, 1), tool_span(TRACE_B, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A, TRACE_B))
    client.expire(trace_ids=(TRACE_A,))
    a = TraceScorable(trace_ids=(TRACE_A,))
    (score,) = await scorer.score_async(a, expects("email"))
    assert score.status is ScoreStatus.UNDETERMINED
    assert score.metadata["acquisition"] == Acquisition.UNAVAILABLE.value
    (observation,) = memory.get_observations(observation_ids=score.observation_ids)
    assert observation.acquisition is Acquisition.UNAVAILABLE
    assert RETENTION_EXPIRED in observation.coverage.reasons
    # Expired evidence proves nothing either way.
    assert await verdict(scorer, a, expects("search")) is U
    # One expired trace of two: the rest is still evidence, but absence is unprovable.
    both = TraceScorable(trace_ids=(TRACE_A, TRACE_B))
    (score,) = await scorer.score_async(both, expects("email"), context=ScoringContext())
    assert score.status is ScoreStatus.UNDETERMINED
    assert score.metadata["acquisition"] == Acquisition.PARTIAL.value
    assert await verdict(scorer, both, expects("search")) is T
    # A late span for an expired trace does not resurrect it.
    client.add_spans([tool_span(TRACE_A, 9, "search")])
    assert await verdict(scorer, a, expects("search")) is U


async def test_orphan_parent_keeps_the_trace_incomplete(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer
) -> None:
    client.add_spans([tool_span(TRACE_A, 2, "search", parent=1)])  # the parent (span 1) never arrived
    client.mark_complete(trace_ids=(TRACE_A,))
    (result,) = client.query([TRACE_A])
    assert result.coverage.reasons == (ORPHAN_PARENT,)
    a = TraceScorable(trace_ids=(TRACE_A,))
    assert await verdict(scorer, a, expects("email")) is U
    assert await verdict(scorer, a, expects("search")) is T
    # The parent arriving after the completion claim is a late span: the claim stays broken.
    client.add_spans([tool_span(TRACE_A, 1)])
    (result,) = client.query([TRACE_A])
    assert result.coverage.reasons == (LATE_SPAN,)
    assert await verdict(scorer, a, expects("email")) is U
    # Had it arrived before the claim, the trace would have been complete.
    client.add_spans([tool_span(TRACE_B, 2, "search", parent=1)])
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_B,)), expects("email")) is U
    client.add_spans([tool_span(TRACE_B, 1)])
    client.mark_complete(trace_ids=(TRACE_B,))
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_B,)), expects("email")) is F


async def test_remote_parent_is_not_an_orphan(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    child = tool_span(TRACE_A, 2, "search", parent=1)
    child.parent_is_remote = True
    client.add_spans([child])
    client.mark_complete(trace_ids=(TRACE_A,))
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_A,)), expects("email")) is F


async def test_unknown_trace_is_pending_not_absent(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    (result,) = client.query([TRACE_A])
    assert result.available
    assert result.coverage.reasons == (AWAITING_COMPLETION,)
    assert await verdict(scorer, TraceScorable(trace_ids=(TRACE_A,)), expects("email")) is U


async def test_session_scope(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    client.add_spans([tool_span(TRACE_A, 1, session="conv-1"), tool_span(TRACE_A, 2, "search", parent=1)])
    client.add_spans([tool_span(TRACE_B, 1, session="conv-1"), tool_span(TRACE_B, 2, "email", parent=1)])
    client.add_spans([tool_span("1" * 32, 1, "delete", session="conv-2")])
    session = SessionScorable(session_id="conv-1")
    both = ScoringExpectation(conditions=(ToolSequence(tools=("search", "email"), mode="any_order"),))
    assert await verdict(scorer, session, both) is T
    assert await verdict(scorer, session, expects("delete")) is U  # another session's tool is not evidence
    # Every trace complete, but more traces of the session may still come.
    client.mark_complete(trace_ids=(TRACE_A, TRACE_B))
    assert await verdict(scorer, session, expects("delete")) is U
    client.mark_session_complete(session_id="conv-1")
    assert await verdict(scorer, session, expects("delete")) is F
    assert await verdict(scorer, SessionScorable(session_id="conv-2"), expects("delete")) is T
    # A session nobody has seen yet is pending, not empty.
    assert await verdict(scorer, SessionScorable(session_id="conv-9"), expects("delete")) is U


async def test_session_keyed_by_session_id_attribute(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    s = tool_span(TRACE_A, 1, "search")
    s.attributes = {**s.attributes, "session.id": "sess-7"}
    client.add_spans([s])
    assert await verdict(scorer, SessionScorable(session_id="sess-7"), expects("search")) is T


async def test_closed_client_refuses_queries(client: InMemoryTraceClient, scorer: OtelToolCallScorer) -> None:
    client.close()
    with pytest.raises(TraceClientClosedError):
        client.query([TRACE_A])
    with pytest.raises(TraceClientClosedError):
        await scorer.score_async(TraceScorable(trace_ids=(TRACE_A,)), expects("x"), context=ScoringContext())


# --- replay --------------------------------------------------------------------------------------------


class _ExplodingSource:
    async def acquire(self, scorable: Any, trace_ids: Sequence[str] | None = None) -> Observation:
        raise AssertionError("replay acquired evidence")


async def test_replay_never_touches_the_client_and_keeps_the_observation(
    client: InMemoryTraceClient, scorer: OtelToolCallScorer, memory: MemoryInterface
) -> None:
    client.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    client.mark_complete(trace_ids=(TRACE_A,))
    scope = MessageScorable(message_id="m-1", trace_ids=(TRACE_A,), response_text="I searched")
    (live,) = await scorer.score_async(scope, expects("email"))
    assert live.verdict is F
    (saved,) = memory.get_observations(observation_ids=live.observation_ids)
    before = saved.model_dump_json()
    scores_before = len(memory.get_scores())
    client.close()

    tree = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND,
        scorers=[scorer, SubStringScorer(substring="searched"), OtelToolCallScorer(source=_ExplodingSource())],
    )
    (replayed,) = await tree.score_observation_async(saved, expects("search"))
    assert replayed.verdict is T
    assert replayed.observation_ids == live.observation_ids
    assert saved.model_dump_json() == before
    assert memory.get_observations(observation_ids=live.observation_ids)[0].model_dump_json() == before
    assert len(memory.get_scores()) == scores_before  # replay writes nothing


# --- observation identity -----------------------------------------------------------------------------


def _observation(**kw: Any) -> Observation:
    fields: dict[str, Any] = {
        "scorable": TraceScorable(trace_ids=(TRACE_A,)),
        "tool_executions": (ToolExecution(name="search", trace_id=TRACE_A, span_id="1" * 16),),
        "coverage": Coverage.completed(),
        "acquisition": Acquisition.COMPLETE,
        "captured_at": CAPTURED_AT,
    }
    fields.update(kw)
    return Observation(**fields)


def test_observation_id_is_a_content_hash() -> None:
    first = _observation()
    assert len(first.observation_id) == 64
    from tests.unit.scoring.test_observation_id import reference_hash  # the definition, in one place

    assert first.observation_id == reference_hash(first)
    # Equal content, different capture time: same id.
    assert _observation(captured_at=CAPTURED_AT + timedelta(hours=1)).observation_id == first.observation_id
    # Round trips keep it.
    assert Observation.model_validate_json(first.model_dump_json()) == first
    assert Observation.model_validate(json.loads(first.model_dump_json())).observation_id == first.observation_id


@pytest.mark.parametrize(
    "change",
    [
        {"tool_executions": ()},
        {"tool_executions": (ToolExecution(name="Search", trace_id=TRACE_A, span_id="1" * 16),)},
        {"coverage": Coverage.incomplete()},
        {"acquisition": Acquisition.PARTIAL},
        {"scorable": TraceScorable(trace_ids=(TRACE_B,))},
        {"normalization_version": "1"},
    ],
    ids=["executions", "tool-name-case", "coverage", "acquisition", "scope", "normalization-version"],
)
def test_observation_id_changes_with_content(change: dict[str, Any]) -> None:
    assert _observation(**change).observation_id != _observation().observation_id


def test_tampered_observation_id_is_rejected() -> None:
    data = json.loads(_observation().model_dump_json())
    data["observation_id"] = "0" * 64
    with pytest.raises(ValidationError, match="observation_id"):
        Observation.model_validate(data)
    data = json.loads(_observation().model_dump_json())
    data["tool_executions"][0]["name"] = "email"  # content edited, id kept
    with pytest.raises(ValidationError, match="observation_id"):
        Observation.model_validate(data)


def test_observation_is_immutable() -> None:
    with pytest.raises(ValidationError):
        _observation().acquisition = Acquisition.PARTIAL  # type: ignore[misc]


# --- scorer identity ----------------------------------------------------------------------------------


def _tree(
    substring: str = "bomb", aggregator: TrueFalseScoreAggregator = TrueFalseScoreAggregator.AND
) -> TrueFalseScorer:
    client = InMemoryTraceClient()
    return TrueFalseCompositeScorer(
        aggregator=aggregator,
        scorers=[
            OtelToolCallScorer(source=OtelTraceSource(trace_client=client)),
            TrueFalseInverterScorer(scorer=SubStringScorer(substring=substring, categories=["weapon"])),
        ],
    )


def test_scorer_identity_is_stable_across_equal_instances() -> None:
    a, b = _tree().get_identifier(), _tree().get_identifier()
    assert a.hash == b.hash
    assert len(a.hash) == 64
    assert a == b


def test_leaf_identity_is_sha256_of_canonical_json() -> None:
    ident = SubStringScorer(substring="bomb").get_identifier()
    body = {
        "class_name": "SubStringScorer",
        "class_module": "scoring.score.text_scorers",
        "params": {"substring": "bomb", "case_sensitive": False},
        "children": {},
    }
    assert ident.hash == hashlib.sha256(canonical_json(body).encode()).hexdigest()


@pytest.mark.parametrize(
    "other",
    [
        lambda: _tree(substring="Bomb"),
        lambda: _tree(aggregator=TrueFalseScoreAggregator.OR),
        lambda: SubStringScorer(substring="bomb"),
        lambda: TrueFalseCompositeScorer(
            aggregator=TrueFalseScoreAggregator.AND,
            scorers=[
                TrueFalseInverterScorer(scorer=SubStringScorer(substring="bomb", categories=["weapon"])),
                OtelToolCallScorer(source=OtelTraceSource(trace_client=InMemoryTraceClient())),
            ],
        ),
        lambda: TrueFalseCompositeScorer(
            aggregator=TrueFalseScoreAggregator.AND,
            scorers=[
                OtelToolCallScorer(source=OtelTraceSource(trace_client=InMemoryTraceClient())),
                TrueFalseInverterScorer(scorer=SubStringScorer(substring="bomb", categories=["harm"])),
            ],
        ),
        lambda: TrueFalseCompositeScorer(
            aggregator=TrueFalseScoreAggregator.AND,
            scorers=[
                OtelToolCallScorer(source=_ExplodingSource()),
                TrueFalseInverterScorer(scorer=SubStringScorer(substring="bomb", categories=["weapon"])),
            ],
        ),
    ],
    ids=["leaf-param", "aggregator", "different-shape", "child-order", "categories", "source-type"],
)
def test_scorer_identity_changes_with_config(other: Any) -> None:
    assert other().get_identifier().hash != _tree().get_identifier().hash


@pytest.mark.parametrize(
    ("a", "b"),
    [
        (lambda: SubStringScorer(substring="x"), lambda: SubStringScorer(substring="x", case_sensitive=True)),
        (lambda: PlagiarismScorer(reference_text="abc"), lambda: PlagiarismScorer(reference_text="abc", n=3)),
    ],
    ids=["substring-case-sensitive", "plagiarism-n"],
)
def test_leaf_identity_param_changes(a: Any, b: Any) -> None:
    assert a().get_identifier().hash == a().get_identifier().hash
    assert a().get_identifier().hash != b().get_identifier().hash


async def test_scores_carry_the_scorer_hash() -> None:
    tree = _tree()
    scope = MessageScorable(message_id="m", trace_ids=(TRACE_A,), response_text="hi")
    observation = Observation(scorable=scope, coverage=Coverage.completed(), acquisition=Acquisition.COMPLETE)
    (score,) = await tree.score_observation_async(observation, expects("x"))
    assert score.scorer_hash == tree.get_identifier().hash
    assert score.scorer_class == "TrueFalseCompositeScorer"


# --- tree validation ----------------------------------------------------------------------------------


def _otel() -> OtelToolCallScorer:
    return OtelToolCallScorer(source=_ExplodingSource())


@pytest.mark.parametrize(
    ("build", "expectation"),
    [
        (
            lambda: TrueFalseCompositeScorer(
                aggregator=TrueFalseScoreAggregator.OR, scorers=[SubStringScorer(substring="x")]
            ),
            expects("a"),
        ),
        (
            lambda: TrueFalseCompositeScorer(
                aggregator=TrueFalseScoreAggregator.OR,
                scorers=[
                    SubStringScorer(substring="x"),
                    TrueFalseInverterScorer(scorer=SubStringScorer(substring="y")),
                ],
            ),
            expects("a"),
        ),
        (lambda: SubStringScorer(substring="x"), expects("a")),
        (lambda: TrueFalseInverterScorer(scorer=SubStringScorer(substring="x")), expects("a")),
        (lambda: _otel(), ScoringExpectation()),
        (
            lambda: TrueFalseCompositeScorer(
                aggregator=TrueFalseScoreAggregator.OR, scorers=[_otel(), SubStringScorer(substring="x")]
            ),
            ScoringExpectation(),
        ),
    ],
    ids=[
        "or-missing-criterion",
        "or-nested-missing-criterion",
        "direct-text-leaf-extra-condition",
        "inverter-text-leaf-extra-condition",
        "tool-leaf-without-conditions",
        "tool-leaf-under-or-without-conditions",
    ],
)
async def test_tree_validation_errors(build: Any, expectation: ScoringExpectation) -> None:
    scorer = build()
    scope = MessageScorable(message_id="m", trace_ids=(TRACE_A,), response_text="x")
    with pytest.raises(ScorerConfigurationError) as info:
        await scorer.score_async(scope, expectation, context=ScoringContext())
    assert info.value.retriable is False
    observation = Observation(scorable=scope)
    with pytest.raises(ScorerConfigurationError):
        await scorer.score_observation_async(observation, expectation)


async def test_conditions_route_to_the_leaves_that_support_them() -> None:
    scope = MessageScorable(message_id="m", trace_ids=(TRACE_A,), response_text="done")
    executions = (ToolExecution(name="a", trace_id=TRACE_A, span_id="1" * 16, end_time_unix_nano=5),)
    observation = Observation(
        scorable=scope, tool_executions=executions, coverage=Coverage.completed(), acquisition=Acquisition.COMPLETE
    )
    tree = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND,
        scorers=[
            TrueFalseCompositeScorer(aggregator=TrueFalseScoreAggregator.OR, scorers=[SubStringScorer(substring="x")]),
            _otel(),
        ],
    )
    (score,) = await tree.score_observation_async(observation, expects("a"))
    assert score.verdict is F  # the text branch ("x" not in "done") got no conditions and still counted
    (score,) = await _otel().score_observation_async(observation, expects("a"))
    assert score.verdict is T


def test_fallback_children_must_support_the_same_conditions() -> None:
    with pytest.raises(ScorerConfigurationError):
        TrueFalseFallbackScorer(scorer=_otel(), fallback_scorer=SubStringScorer(substring="x"))
    with pytest.raises(TypeError):
        TrueFalseFallbackScorer(scorer=_otel(), fallback_scorer=PlagiarismScorer(reference_text="a"))  # type: ignore[arg-type]


# --- fallback metadata (seed 001, "Routing abstentions to a fallback scorer") -----------------------------


class Fixed(TrueFalseScorer):
    """A test double: always the same verdict (or not applicable), with some metadata."""

    def __init__(
        self,
        verdict: Verdict | None,
        *,
        tag: str,
        categories: Sequence[str] | None = None,
        copies: int = 1,
        boom: bool = False,
    ) -> None:
        super().__init__(categories=categories)
        self.verdict, self.tag, self.copies, self.boom, self.calls = verdict, tag, copies, boom, 0

    def _identity_params(self) -> dict[str, Any]:
        return {"tag": self.tag}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        self.calls += 1
        if self.boom:
            raise RuntimeError(f"{self.tag} failed")
        if self.verdict is None:
            return []
        return [
            self._verdict_score(
                scorable,
                expectation,
                self.verdict,
                f"{self.tag} says {self.verdict.value}",
                metadata={"who": self.tag, "n": 1},
                observation_ids=(f"obs-{self.tag}",),
            )
            for _ in range(self.copies)
        ]


TEXT = MessageScorable(message_id="m", response_text="hello")


async def test_fallback_not_consulted_when_primary_decides() -> None:
    for v in (T, F):
        primary, fallback = Fixed(v, tag="p"), Fixed(T, tag="f")
        (score,) = await TrueFalseFallbackScorer(scorer=primary, fallback_scorer=fallback).score_async(
            TEXT, context=ScoringContext()
        )
        assert score.verdict is v
        assert fallback.calls == 0
        assert score.metadata == {"primary.who": "p", "primary.n": 1, "resolved_by": "primary"}
        assert score.rationale == f"p says {v.value}"
        assert score.observation_ids == ("obs-p",)


async def test_fallback_resolves_an_undetermined_primary() -> None:
    primary, fallback = Fixed(U, tag="p", categories=["c"]), Fixed(F, tag="f", categories=["c"])
    (score,) = await TrueFalseFallbackScorer(scorer=primary, fallback_scorer=fallback).score_async(
        TEXT, context=ScoringContext()
    )
    assert score.verdict is F
    assert score.metadata == {
        "primary.who": "p",
        "primary.n": 1,
        "primary_rationale": "p says undetermined",
        "fallback.who": "f",
        "fallback.n": 1,
        "fallback_rationale": "f says false",
        "fallback_status": "complete",
        "resolved_by": "fallback",
    }
    assert "p says undetermined" in score.rationale
    assert "f says false" in score.rationale
    assert score.observation_ids == ("obs-p", "obs-f")
    assert score.score_category == ("c",)


async def test_fallback_both_undetermined() -> None:
    (score,) = await TrueFalseFallbackScorer(scorer=Fixed(U, tag="p"), fallback_scorer=Fixed(U, tag="f")).score_async(
        TEXT, context=ScoringContext()
    )
    assert score.status is ScoreStatus.UNDETERMINED
    assert score.metadata["resolved_by"] == "fallback"
    assert score.metadata["fallback_status"] == "undetermined"
    assert score.metadata["fallback_rationale"] == "f says undetermined"
    assert score.metadata["primary_rationale"] == "p says undetermined"


async def test_fallback_not_applicable() -> None:
    (score,) = await TrueFalseFallbackScorer(
        scorer=Fixed(U, tag="p"), fallback_scorer=Fixed(None, tag="f")
    ).score_async(TEXT, context=ScoringContext())
    assert score.status is ScoreStatus.UNDETERMINED
    assert score.metadata == {
        "primary.who": "p",
        "primary.n": 1,
        "primary_rationale": "p says undetermined",
        "fallback_status": "not_applicable",
        "resolved_by": "primary",
    }


async def test_primary_not_applicable_skips_the_fallback() -> None:
    fallback = Fixed(T, tag="f")
    scores = await TrueFalseFallbackScorer(scorer=Fixed(None, tag="p"), fallback_scorer=fallback).score_async(
        TEXT, context=ScoringContext()
    )
    assert scores == []
    assert fallback.calls == 0


async def test_fallback_deferred_in_streaming_until_final() -> None:
    fallback = Fixed(T, tag="f")
    tree = TrueFalseFallbackScorer(scorer=Fixed(U, tag="p"), fallback_scorer=fallback)
    (score,) = await tree.score_async(TEXT, context=ScoringContext(streaming=True, final=False))
    assert score.status is ScoreStatus.UNDETERMINED
    assert score.metadata["resolved_by"] == "primary"
    assert score.metadata["fallback_status"] == "deferred"
    assert fallback.calls == 0
    (score,) = await tree.score_async(TEXT, context=ScoringContext(streaming=True, final=True))
    assert score.verdict is T
    assert score.metadata["resolved_by"] == "fallback"


async def test_fallback_errors() -> None:
    with pytest.raises(ScorerConfigurationError, match="categories"):
        await TrueFalseFallbackScorer(
            scorer=Fixed(U, tag="p", categories=["a"]), fallback_scorer=Fixed(T, tag="f", categories=["b"])
        ).score_async(TEXT, context=ScoringContext())
    with pytest.raises(ScorerConfigurationError, match="2 scores"):
        await TrueFalseFallbackScorer(
            scorer=Fixed(U, tag="p", copies=2), fallback_scorer=Fixed(T, tag="f")
        ).score_async(TEXT, context=ScoringContext())
    with pytest.raises(RuntimeError, match="f failed"):
        await TrueFalseFallbackScorer(
            scorer=Fixed(U, tag="p"), fallback_scorer=Fixed(T, tag="f", boom=True)
        ).score_async(TEXT, context=ScoringContext())


async def test_nested_fallback_metadata_is_prefixed_not_overwritten() -> None:
    inner = TrueFalseFallbackScorer(scorer=Fixed(U, tag="p1"), fallback_scorer=Fixed(U, tag="f1"))
    outer = TrueFalseFallbackScorer(scorer=inner, fallback_scorer=Fixed(T, tag="f2"))
    (score,) = await outer.score_async(TEXT, context=ScoringContext())
    assert score.verdict is T
    assert score.metadata["resolved_by"] == "fallback"
    assert score.metadata["primary.resolved_by"] == "fallback"
    assert score.metadata["primary.fallback_status"] == "undetermined"
    assert score.metadata["primary.primary.who"] == "p1"
    assert score.metadata["primary.fallback.who"] == "f1"
    assert score.metadata["fallback.who"] == "f2"


async def test_trace_fallback_keeps_both_observations_and_persists_only_the_root(memory: MemoryInterface) -> None:
    pending, complete = InMemoryTraceClient(), InMemoryTraceClient()
    for c in (pending, complete):
        c.add_spans([tool_span(TRACE_A, 1), tool_span(TRACE_A, 2, "search", parent=1)])
    complete.mark_complete(trace_ids=(TRACE_A,))
    tree = TrueFalseFallbackScorer(
        scorer=OtelToolCallScorer(source=OtelTraceSource(trace_client=pending)),
        fallback_scorer=OtelToolCallScorer(source=OtelTraceSource(trace_client=complete)),
    )
    (score,) = await tree.score_async(TraceScorable(trace_ids=(TRACE_A,)), expects("email"))
    assert score.verdict is F
    assert score.metadata["resolved_by"] == "fallback"
    assert score.metadata["primary.coverage_complete"] is False
    assert score.metadata["primary.coverage_reasons"] == AWAITING_COMPLETION
    assert score.metadata["fallback.coverage_complete"] is True
    assert score.metadata["fallback_status"] == "complete"
    assert len(score.observation_ids) == 2
    assert [s.id for s in memory.get_scores()] == [score.id]
    assert len(memory.get_observations(observation_ids=score.observation_ids)) == 2


class FixedFloat(FloatScaleScorer):
    def __init__(self, value: float | None, tag: str) -> None:
        super().__init__()
        self.value, self.tag = value, tag

    def _identity_params(self) -> dict[str, Any]:
        return {"tag": self.tag}

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        return [self._make_score(scorable=scorable, expectation=expectation, value=self.value, rationale=f"{self.tag}")]


async def test_float_fallback() -> None:
    (score,) = await FloatScaleFallbackScorer(
        scorer=FixedFloat(0.0, "p"), fallback_scorer=FixedFloat(1.0, "f")
    ).score_async(TEXT, context=ScoringContext())
    assert score.get_value() == 0.0  # a completed 0.0 is a judgment, not an abstention
    assert score.metadata == {"resolved_by": "primary"}
    (score,) = await FloatScaleFallbackScorer(
        scorer=FixedFloat(None, "p"), fallback_scorer=FixedFloat(0.25, "f")
    ).score_async(TEXT, context=ScoringContext())
    assert score.get_value() == 0.25
    assert score.metadata["resolved_by"] == "fallback"
    assert score.metadata["fallback_status"] == "complete"
