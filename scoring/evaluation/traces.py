"""Labeled traces for evaluating trace scorers: the JSONL format, its loader, the metrics.

Format (``docs/evaluation.md`` §"Labeled traces" has a full example). Line 1 is a header
object, every further non-blank line is one case::

    {"dataset_version": "1.0", "description": "…"}
    {"case_id": "weather-ok",
     "expectation": {…},                 # handed to the scorer as-is (a ScoringExpectation)
     "human_scores": [1, 1, 0],          # one 0/1 label per rater: did the expectation hold?
     "completion": {"span_count": 3},    # optional: the completion marker the producer sends
     "otlp": {"resourceSpans": [ … ]}}   # OTLP/JSON ExportTraceServiceRequest

Metrics are the objective metrics (majority of raters is the gold label; UNDETERMINED
verdicts are counted, never read as False) plus time-to-verdict statistics as the scorer
reports them (event time from the first span's start to the decision).
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

import numpy as np

from scoring.evaluation.dataset import DatasetError
from scoring.evaluation.evaluator import gather_or_cancel
from scoring.evaluation.metrics import ObjectiveScorerMetrics, compute_objective_metrics
from scoring.evaluation.protocols import ScorerIdentifierLike

_TRACE_ID = re.compile(r"^[0-9a-f]{32}$")
_SPAN_ID = re.compile(r"^[0-9a-f]{16}$")


@dataclass(frozen=True)
class SpanSummary:
    """What the loader checks and keeps of each span (the raw OTLP/JSON stays in ``otlp``)."""

    trace_id: str
    span_id: str
    parent_span_id: str | None
    name: str
    start_time_unix_nano: int
    end_time_unix_nano: int


@dataclass(frozen=True)
class LabeledTrace:
    """One labeled case: spans, the expectation to decide, and the human labels."""

    case_id: str
    expectation: Mapping[str, Any]
    human_scores: tuple[float, ...]
    otlp: Mapping[str, Any]
    spans: tuple[SpanSummary, ...]
    completion: Mapping[str, Any] | None = None
    source: str = ""

    @property
    def trace_ids(self) -> tuple[str, ...]:
        return tuple(sorted({s.trace_id for s in self.spans}))

    @property
    def start_time_unix_nano(self) -> int | None:
        return min((s.start_time_unix_nano for s in self.spans), default=None)


@dataclass(frozen=True)
class LabeledTraceDataset:
    name: str
    version: str
    cases: tuple[LabeledTrace, ...]


@dataclass(frozen=True)
class TraceVerdict:
    """A trace scorer's decision for one case.

    ``value`` is None when UNDETERMINED. ``time_to_verdict_seconds`` is the event time from
    the first span's start to the decision, as the pipeline reports it (None if unknown).
    """

    value: bool | None
    time_to_verdict_seconds: float | None = None
    rationale: str = ""


@runtime_checkable
class TraceEvaluableScorer(Protocol):
    """A scorer that decides a labeled trace case (the embedded pipeline, or a fake)."""

    def get_identifier(self) -> ScorerIdentifierLike: ...

    async def score_trace_async(self, case: LabeledTrace) -> TraceVerdict: ...


@dataclass(kw_only=True)
class TraceScorerMetrics(ObjectiveScorerMetrics):
    """Objective metrics plus time-to-verdict over the decided verdicts that report it."""

    num_time_to_verdict: int = 0
    time_to_verdict_mean_seconds: float | None = None
    time_to_verdict_p50_seconds: float | None = None
    time_to_verdict_p95_seconds: float | None = None
    time_to_verdict_max_seconds: float | None = None


def _unix_nano(raw: object, *, key: str, where: str, line: int) -> int:
    if isinstance(raw, bool) or not isinstance(raw, int | str):
        raise DatasetError(f"{key} must be an integer or a decimal string", path=where, line=line, column=key)
    try:
        value = int(raw)
    except ValueError:
        raise DatasetError(f"{key} {raw!r} is not a decimal integer", path=where, line=line, column=key) from None
    if value < 0:
        raise DatasetError(f"{key} is negative", path=where, line=line, column=key)
    return value


def _spans(otlp: Mapping[str, Any], *, where: str, line: int) -> tuple[SpanSummary, ...]:
    resource_spans = otlp.get("resourceSpans")
    if not isinstance(resource_spans, list):
        raise DatasetError("otlp.resourceSpans must be a list", path=where, line=line, column="otlp")
    result: list[SpanSummary] = []
    for rs in resource_spans:
        for ss in (rs or {}).get("scopeSpans") or []:
            for span in (ss or {}).get("spans") or []:
                if not isinstance(span, dict):
                    raise DatasetError("a span must be an object", path=where, line=line, column="otlp")
                trace_id = str(span.get("traceId", "")).lower()
                span_id = str(span.get("spanId", "")).lower()
                parent = str(span.get("parentSpanId") or "").lower() or None
                if not _TRACE_ID.match(trace_id):
                    raise DatasetError(
                        f"traceId {span.get('traceId')!r} is not 32 hex digits", path=where, line=line, column="otlp"
                    )
                if not _SPAN_ID.match(span_id) or (parent is not None and not _SPAN_ID.match(parent)):
                    raise DatasetError(
                        f"spanId/parentSpanId of span {span.get('name')!r} is not 16 hex digits",
                        path=where,
                        line=line,
                        column="otlp",
                    )
                start = _unix_nano(span.get("startTimeUnixNano"), key="startTimeUnixNano", where=where, line=line)
                end = _unix_nano(span.get("endTimeUnixNano", start), key="endTimeUnixNano", where=where, line=line)
                result.append(SpanSummary(trace_id, span_id, parent, str(span.get("name", "")), start, end))
    if not result:
        raise DatasetError("the case has no spans", path=where, line=line, column="otlp")
    return tuple(result)


def load_labeled_traces(path: Path | str) -> LabeledTraceDataset:
    """Load a labeled-trace JSONL file (format in the module docstring).

    Raises:
        DatasetError: naming the file, line and field of the first problem.
    """
    path = Path(path)
    where = str(path)
    try:
        # split("\n"), not splitlines(): JSON strings may hold U+2028, U+0085 … unescaped
        lines = path.read_text(encoding="utf-8-sig").split("\n")  # a BOM is accepted, as for CSV
    except OSError as exc:
        raise DatasetError(f"cannot read labeled traces: {exc.strerror or exc}", path=path) from exc
    records: list[tuple[int, dict[str, Any]]] = []
    for number, text in enumerate(lines, 1):
        if not text.strip():
            continue
        try:
            record = json.loads(text)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"not valid JSON: {exc.msg}", path=path, line=number) from None
        if not isinstance(record, dict):
            raise DatasetError("each line must be a JSON object", path=path, line=number)
        records.append((number, record))
    if not records or "case_id" in records[0][1]:
        raise DatasetError('missing header line {"dataset_version": "<v>"} before the cases', path=path, line=1)
    header_line, header = records[0]
    version = header.get("dataset_version")
    if not isinstance(version, str) or not version:
        raise DatasetError("header has no dataset_version", path=path, line=header_line, column="dataset_version")

    cases: list[LabeledTrace] = []
    seen: set[str] = set()
    for number, record in records[1:]:
        case_id = record.get("case_id")
        if not isinstance(case_id, str) or not case_id:
            raise DatasetError("case_id must be a non-empty string", path=path, line=number, column="case_id")
        if case_id in seen:
            raise DatasetError(f"duplicate case_id {case_id!r}", path=path, line=number, column="case_id")
        seen.add(case_id)
        expectation = record.get("expectation")
        if not isinstance(expectation, dict):
            raise DatasetError("expectation must be an object", path=path, line=number, column="expectation")
        labels = record.get("human_scores")
        if not isinstance(labels, list) or not labels:
            raise DatasetError(
                "human_scores must be a non-empty list of 0/1 labels", path=path, line=number, column="human_scores"
            )
        for label in labels:
            if isinstance(label, bool) or label not in (0, 1):
                raise DatasetError(
                    f"human score {label!r} is not 0 or 1 (missing labels are not allowed)",
                    path=path,
                    line=number,
                    column="human_scores",
                )
        otlp = record.get("otlp")
        if not isinstance(otlp, dict):
            raise DatasetError(
                "otlp must be an OTLP/JSON object with resourceSpans", path=path, line=number, column="otlp"
            )
        completion = record.get("completion")
        if completion is not None and not isinstance(completion, dict):
            raise DatasetError("completion must be an object or null", path=path, line=number, column="completion")
        cases.append(
            LabeledTrace(
                case_id=case_id,
                expectation=expectation,
                human_scores=tuple(float(x) for x in labels),
                otlp=otlp,
                spans=_spans(otlp, where=where, line=number),
                completion=completion,
                source=f"{path}:{number}",
            )
        )
    if not cases:
        raise DatasetError("no labeled cases after the header", path=path)
    return LabeledTraceDataset(name=path.name, version=version, cases=tuple(cases))


def _percentile(values: Sequence[float], q: float) -> float | None:
    return float(np.percentile(values, q)) if values else None


async def evaluate_traces_async(
    scorer: TraceEvaluableScorer,
    dataset: LabeledTraceDataset,
    *,
    num_scorer_trials: int = 1,
    max_concurrency: int = 4,
    on_progress: Callable[[int], None] | None = None,
) -> TraceScorerMetrics:
    """Score every case ``num_scorer_trials`` times and compute :class:`TraceScorerMetrics`.

    ``average_score_time_seconds`` is the harness's wall time per case (as for text
    scorers); the time-to-verdict statistics come from the verdicts themselves.
    """
    if num_scorer_trials < 1 or max_concurrency < 1:
        raise ValueError("num_scorer_trials and max_concurrency must be >= 1")
    if not dataset.cases:
        raise ValueError(f"labeled-trace dataset {dataset.name!r} has no cases")
    semaphore = asyncio.Semaphore(max_concurrency)

    async def one(case: LabeledTrace) -> TraceVerdict:
        async with semaphore:
            verdict = await scorer.score_trace_async(case)
        if on_progress is not None:
            on_progress(1)
        return verdict

    verdicts: list[list[TraceVerdict]] = []
    elapsed = 0.0
    for _ in range(num_scorer_trials):
        start = time.perf_counter()
        verdicts.append(await gather_or_cancel([one(c) for c in dataset.cases]))
        elapsed += time.perf_counter() - start

    base = compute_objective_metrics(
        [c.human_scores for c in dataset.cases],
        [[v.value for v in trial] for trial in verdicts],
        sources=[c.source for c in dataset.cases],
        dataset_name=dataset.name,
        dataset_version=dataset.version,
        average_score_time_seconds=elapsed / (num_scorer_trials * len(dataset.cases)),
    )
    ttv = [
        v.time_to_verdict_seconds
        for trial in verdicts
        for v in trial
        if v.value is not None and v.time_to_verdict_seconds is not None and math.isfinite(v.time_to_verdict_seconds)
    ]
    inherited = {f.name: getattr(base, f.name) for f in fields(ObjectiveScorerMetrics) if f.init}
    return TraceScorerMetrics(
        **inherited,
        num_time_to_verdict=len(ttv),
        time_to_verdict_mean_seconds=float(np.mean(ttv)) if ttv else None,
        time_to_verdict_p50_seconds=_percentile(ttv, 50),
        time_to_verdict_p95_seconds=_percentile(ttv, 95),
        time_to_verdict_max_seconds=max(ttv) if ttv else None,
    )
