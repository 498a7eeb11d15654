"""Labeled traces through the real embedded pipeline: spans → in-memory client → scorer tree.

:class:`EmbeddedTracePipelineScorer` implements
:class:`~scoring.evaluation.traces.TraceEvaluableScorer` with the scoring library itself.
For each labeled case it

1. parses the case's OTLP/JSON into an ``ExportTraceServiceRequest`` with protobuf's
   ``json_format`` (hex ``traceId``/``spanId``/``parentSpanId`` become bytes, as the
   OTLP/JSON encoding specifies) and turns every span into a ``NeutralSpan``
   (:func:`scoring.normalize.spans.iter_otlp_request`);
2. feeds the spans **one by one, in event-time order** into a fresh
   :class:`~scoring.score.observation.InMemoryTraceClient`. A span's *event time* is its
   end time (a span is exported when it ends; a span that has not ended counts at its
   start time); ties keep the file order;
3. after each span acquires an observation through
   :class:`~scoring.score.observation.OtelTraceSource` and judges the case's expectation
   with the scorer tree in replay + streaming mode (the service's decide step does the
   same), stopping at the first TRUE/FALSE — a streaming verdict never flips;
4. if still undetermined and the case has a completion marker, applies it
   (``mark_complete(trace_ids=…, span_count=…)``) and judges once more, now with
   ``final=True`` (the evidence cannot grow, so fallbacks may answer). A case without a
   marker gets the same final pass at the end of its spans.

**Time to verdict** is event time, never wall time: ``t − t0`` in seconds, where ``t0`` is
the earliest ``startTimeUnixNano`` of the case and ``t`` is

* the event time of the span after which the verdict became TRUE/FALSE, or
* for a verdict decided by the completion marker, the marker's event time — the latest
  event time of the case (the producer sends the marker once its trace has ended);
* ``None`` for a verdict decided only by the final pass of a case without a marker (in
  the service that pass happens at the expectation's deadline, which a case does not
  carry), and for UNDETERMINED.

With ``streaming=False`` the pipeline is a batch scorer: every span and the marker go in
first, the tree judges once (``ScoringContext(streaming=False)``), and a decided verdict's
time is the latest event time of the case (the earliest moment a batch scorer can run).

Expectations are the scoring library's ``ScoringExpectation`` in JSON form
(``{"objective": …, "conditions": [{"type": "tools_called", "tools": [{"name": …}]}]}``);
the shorthand ``"tools_called": ["name", …]`` (names or requirement objects) adds one
``tools_called`` condition. A completion marker is ``{"span_count": N}`` (``N`` spans per
trace; only for single-trace cases) or ``{}`` (complete, count unknown).

:func:`build_scorer_tree` builds the named scorer trees of the eval YAML with the same
types and keys as the service's ``scorers:`` section (``collector.config.ScorerTreeConfig``);
this package cannot import the collector, so the builder is repeated here.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal, cast

from google.protobuf import json_format
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.trace.v1.trace_pb2 import TracesData
from pydantic import ValidationError

from scoring.evaluation.dataset import DatasetError
from scoring.evaluation.traces import LabeledTrace, TraceVerdict
from scoring.models.conditions import ScoringExpectation
from scoring.models.scorables import TraceScorable
from scoring.models.status import Verdict
from scoring.normalize.spans import NeutralSpan, SpanDecodeError, iter_otlp_request
from scoring.score import (
    Scorer,
    ScoringContext,
)
from scoring.score.identity import ScorerIdentifier
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource
from scoring.score.tree import (
    TREE_TYPES,
    ReplayOnlySource,
    build_scorer_tree,
    contains_otel_tool_call,
)
from scoring.score.tree import ScorerTreeConfigError as TraceTreeConfigError

__all__ = [
    "TREE_TYPES",
    "CaseRun",
    "EmbeddedTracePipelineScorer",
    "ReplayOnlySource",
    "TraceTreeConfigError",
    "build_scorer_tree",
    "contains_otel_tool_call",
    "event_time_unix_nano",
    "parse_case_expectation",
    "parse_case_spans",
]

_ID_FIELDS = frozenset({"traceId", "spanId", "parentSpanId"})


# -- a case's spans and expectation ------------------------------------------------------


def _hex_ids_to_base64(node: Any, where: str) -> Any:
    """OTLP/JSON carries ids as hex; protobuf's JSON mapping reads bytes fields as base64."""
    if isinstance(node, Mapping):
        out: dict[str, Any] = {}
        for key, value in node.items():
            if key in _ID_FIELDS and isinstance(value, str) and value:
                try:
                    out[key] = base64.b64encode(bytes.fromhex(value)).decode("ascii")
                except ValueError:
                    raise DatasetError(f"{key} {value[:40]!r} is not hex", path=where, column="otlp") from None
            else:
                out[key] = _hex_ids_to_base64(value, where)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(x, where) for x in node]
    return node


def event_time_unix_nano(span: NeutralSpan) -> int:
    """When the span becomes visible to a collector: its end, or its start if it has not ended."""
    return span.end_time_unix_nano if span.end_time_unix_nano else span.start_time_unix_nano


def parse_case_spans(case: LabeledTrace) -> list[NeutralSpan]:
    """The case's spans as neutral spans, sorted by event time (stable: ties keep file order).

    Raises:
        DatasetError: the OTLP/JSON does not parse as an ``ExportTraceServiceRequest``.
    """
    request = ExportTraceServiceRequest()
    try:
        json_format.ParseDict(_hex_ids_to_base64(case.otlp, case.source), request, ignore_unknown_fields=True)
        spans = list(iter_otlp_request(cast(TracesData, request)))  # same resource_spans shape
    except (json_format.ParseError, SpanDecodeError, binascii.Error, TypeError, ValueError) as exc:
        if isinstance(exc, DatasetError):
            raise
        raise DatasetError(f"case {case.case_id!r}: otlp: {exc}", path=case.source, column="otlp") from None
    if not spans:
        raise DatasetError(f"case {case.case_id!r} has no spans", path=case.source, column="otlp")
    return sorted(spans, key=event_time_unix_nano)


def parse_case_expectation(raw: Mapping[str, Any], *, where: str = "") -> ScoringExpectation:
    """A case's ``expectation`` as a ``ScoringExpectation`` (the ``tools_called`` shorthand accepted).

    Raises:
        DatasetError: the object is not a valid expectation.
    """
    data = dict(raw)
    shorthand = data.pop("tools_called", None)
    if shorthand is not None:
        if not isinstance(shorthand, list) or not shorthand:
            raise DatasetError(
                "expectation.tools_called must be a non-empty list of tool names or requirements",
                path=where or None,
                column="expectation",
            )
        tools = [{"name": t} if isinstance(t, str) else t for t in shorthand]
        data["conditions"] = [*(data.get("conditions") or []), {"type": "tools_called", "tools": tools}]
    try:
        return ScoringExpectation.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(p) for p in e['loc']) or '<root>'}: {e['msg']}" for e in exc.errors(include_url=False)
        )
        raise DatasetError(
            f"expectation is not a ScoringExpectation: {problems}", path=where or None, column="expectation"
        ) from None


def _marker_span_count(case: LabeledTrace, trace_ids: Sequence[str]) -> int | None:
    assert case.completion is not None
    count = case.completion.get("span_count")
    if count is None:
        return None
    if isinstance(count, bool) or not isinstance(count, int) or count < 0:
        raise DatasetError(
            f"completion.span_count must be a non-negative integer, got {count!r}",
            path=case.source,
            column="completion",
        )
    if len(trace_ids) > 1:
        raise DatasetError(
            "completion.span_count is per trace; a case with several traces takes {} (count unknown)",
            path=case.source,
            column="completion",
        )
    return count


# -- the pipeline ------------------------------------------------------------------------

DecidedAt = Literal["span", "marker", "end"]


@dataclass(frozen=True)
class CaseRun:
    """What the pipeline did with one case.

    ``steps`` holds the tree's verdict after each judging pass, in order (one per span
    until decided, then the marker/end pass if it ran). ``decided_at`` says which pass
    decided: a ``"span"`` (``span_index`` is its 0-based position in event order), the
    completion ``"marker"``, or the final ``"end"`` pass of a case without a marker;
    ``None`` when UNDETERMINED.
    """

    verdict: TraceVerdict
    steps: tuple[Verdict, ...]
    decided_at: DecidedAt | None
    span_index: int | None
    num_spans: int


class EmbeddedTracePipelineScorer:
    """Run labeled cases through the embedded pipeline and a scorer tree (module docstring)."""

    def __init__(self, scorer: Scorer, *, streaming: bool = True) -> None:
        if scorer.scorer_type != "true_false":
            raise TypeError(f"{type(scorer).__name__} is not a true/false scorer; a trace verdict is TRUE/FALSE")
        self._scorer = scorer
        self._streaming = streaming

    @property
    def scorer(self) -> Scorer:
        return self._scorer

    @property
    def streaming(self) -> bool:
        return self._streaming

    def get_identifier(self) -> ScorerIdentifier:
        return self._scorer.get_identifier()

    async def score_trace_async(self, case: LabeledTrace) -> TraceVerdict:
        return (await self.run_case(case)).verdict

    async def _judge(
        self,
        source: OtelTraceSource,
        scorable: TraceScorable,
        expectation: ScoringExpectation,
        *,
        final: bool,
    ) -> tuple[Verdict, str]:
        observation = await source.acquire(scorable)
        context = ScoringContext(memory=None, replay=observation, streaming=self._streaming, final=final)
        scores = await self._scorer.score_async(scorable, expectation, context=context)
        if not scores:
            return Verdict.UNDETERMINED, f"{type(self._scorer).__name__} did not apply to the trace"
        if len(scores) > 1:
            raise ValueError(f"{type(self._scorer).__name__} returned {len(scores)} scores; expected one")
        score = scores[0]
        return score.verdict, score.rationale

    async def run_case(self, case: LabeledTrace) -> CaseRun:
        """Feed the case through the pipeline and report the verdict and where it was decided."""
        expectation = parse_case_expectation(case.expectation, where=case.source)
        spans = parse_case_spans(case)
        trace_ids = tuple(sorted({s.trace_id for s in spans}))
        marker = None if case.completion is None else _marker_span_count(case, trace_ids)
        self._scorer.validate(expectation)  # a tree that cannot judge it fails before any span
        t0 = min(s.start_time_unix_nano for s in spans)
        last_event = max(event_time_unix_nano(s) for s in spans)
        has_marker = case.completion is not None
        scorable = TraceScorable(trace_ids=trace_ids)
        client = InMemoryTraceClient()
        source = OtelTraceSource(trace_client=client)
        steps: list[Verdict] = []

        async def judge(*, final: bool) -> tuple[Verdict, str]:
            verdict, why = await self._judge(source, scorable, expectation, final=final)
            steps.append(verdict)
            return verdict, why

        def run(verdict: Verdict, why: str, at: DecidedAt | None = None, event: int | None = None) -> CaseRun:
            decided = verdict.decided and at is not None
            ttv = (event - t0) / 1e9 if decided and event is not None else None
            index = None if at != "span" else len(steps) - 1
            return CaseRun(
                TraceVerdict(verdict.to_bool(), ttv, why), tuple(steps), at if decided else None, index, len(spans)
            )

        n = _plural(len(spans), "span")
        try:
            if not self._streaming:
                client.add_spans(spans)
                if has_marker:
                    client.mark_complete(trace_ids=trace_ids, span_count=marker)
                verdict, why = await judge(final=True)
                return run(
                    verdict,
                    f"{verdict.value} after all {n} (batch): {why}",
                    "marker" if has_marker else "end",
                    last_event,
                )
            for index, span in enumerate(spans):
                client.add_spans([span])
                verdict, why = await judge(final=False)
                if verdict.decided:
                    where = f"span {index + 1}/{len(spans)} {span.name!r}"
                    return run(verdict, f"{verdict.value} at {where}: {why}", "span", event_time_unix_nano(span))
            if has_marker:
                client.mark_complete(trace_ids=trace_ids, span_count=marker)
                verdict, why = await judge(final=True)
                return run(verdict, f"{verdict.value} after {n} and the completion marker: {why}", "marker", last_event)
            verdict, why = await judge(final=True)
            return run(verdict, f"{verdict.value} after {n}, no completion marker (final pass): {why}", "end")
        finally:
            client.close()


def _plural(count: int, noun: str) -> str:
    return f"{count} {noun}" + ("" if count == 1 else "s")


# -- scorer trees from configuration -----------------------------------------------------
