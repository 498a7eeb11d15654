"""Labeled-trace JSONL loader and trace-scorer metrics (fake scorer; the real pipeline wires in later)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest

from scoring.evaluation import (
    DatasetError,
    LabeledTrace,
    SimpleScorerIdentifier,
    TraceEvaluableScorer,
    TraceVerdict,
    evaluate_traces_async,
    load_labeled_traces,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation" / "labeled_traces.jsonl"


def tool_names(case: LabeledTrace) -> dict[str, int]:
    """Tool name → end time (ns) of its execute_tool span, read from the raw OTLP/JSON."""
    found: dict[str, int] = {}
    for rs in case.otlp["resourceSpans"]:
        for ss in rs["scopeSpans"]:
            for span in ss["spans"]:
                attrs = {a["key"]: a["value"].get("stringValue") for a in span.get("attributes", [])}
                if attrs.get("gen_ai.operation.name") == "execute_tool":
                    found[str(attrs["gen_ai.tool.name"])] = int(span["endTimeUnixNano"])
    return found


class PresenceScorer:
    """TRUE when every expected tool ran; FALSE only with a complete trace; else UNDETERMINED."""

    def get_identifier(self) -> SimpleScorerIdentifier:
        return SimpleScorerIdentifier("PresenceScorer")

    async def score_trace_async(self, case: LabeledTrace) -> TraceVerdict:
        start = case.start_time_unix_nano or 0
        tools = tool_names(case)
        wanted = list(case.expectation["tools_called"])
        if all(t in tools for t in wanted):
            return TraceVerdict(True, (max(tools[t] for t in wanted) - start) / 1e9)
        complete = case.completion is not None and case.completion.get("span_count") == len(case.spans)
        if complete:
            return TraceVerdict(False, (max(s.end_time_unix_nano for s in case.spans) - start) / 1e9)
        return TraceVerdict(None)


def test_sample_file_loads() -> None:
    ds = load_labeled_traces(DATA)
    assert ds.version == "1.0" and len(ds.cases) == 4
    first = ds.cases[0]
    assert first.case_id == "weather-called" and first.human_scores == (1.0, 1.0, 1.0)
    assert first.trace_ids == ("4bf92f3577b34da6a3ce929d0e0e4736",)
    assert len(first.spans) == 3 and first.spans[2].parent_span_id == "00f067aa0ba902b7"
    assert ds.cases[2].completion is None
    assert first.source.endswith("labeled_traces.jsonl:2")


async def test_trace_metrics_with_time_to_verdict() -> None:
    scorer = PresenceScorer()
    assert isinstance(scorer, TraceEvaluableScorer)
    m = await evaluate_traces_async(scorer, load_labeled_traces(DATA))
    # weather-called TRUE (gold T), weather-not-called FALSE (gold F),
    # search-partial-trace UNDETERMINED (no completion), search-called TRUE (gold T by 2 of 3)
    assert (m.true_positive, m.false_positive, m.true_negative, m.false_negative) == (2, 0, 1, 0)
    assert m.num_undetermined_responses == 1 and m.undetermined_fraction == pytest.approx(0.25)
    assert m.accuracy == 1.0
    # time to verdict: 0.9 s, 0.8 s, 1.3 s
    assert m.num_time_to_verdict == 3
    assert m.time_to_verdict_mean_seconds == pytest.approx(1.0)
    assert m.time_to_verdict_p50_seconds == pytest.approx(0.9)
    assert m.time_to_verdict_p95_seconds == pytest.approx(0.9 + 0.9 * 0.4)  # linear interpolation
    assert m.time_to_verdict_max_seconds == pytest.approx(1.3)
    assert m.to_dict()["time_to_verdict_max_seconds"] == pytest.approx(1.3)


def write_cases(tmp_path: Path, *records: Any) -> Path:
    path = tmp_path / "cases.jsonl"
    path.write_text("\n".join(r if isinstance(r, str) else json.dumps(r) for r in records) + "\n")
    return path


def good_case(**changes: Any) -> dict[str, Any]:
    case: dict[str, Any] = json.loads(DATA.read_text().splitlines()[1])
    case.update(changes)
    return case


@pytest.mark.parametrize(
    ("records", "line", "column", "message"),
    [
        ([good_case()], 1, None, "missing header"),
        ([{"description": "x"}, good_case()], 1, "dataset_version", "no dataset_version"),
        ([{"dataset_version": "1"}, "{not json"], 2, None, "not valid JSON"),
        ([{"dataset_version": "1"}, good_case(case_id="")], 2, "case_id", "case_id"),
        ([{"dataset_version": "1"}, good_case(), good_case()], 3, "case_id", "duplicate"),
        ([{"dataset_version": "1"}, good_case(human_scores=[1, None])], 2, "human_scores", "not 0 or 1"),
        ([{"dataset_version": "1"}, good_case(human_scores=[])], 2, "human_scores", "non-empty"),
        ([{"dataset_version": "1"}, good_case(expectation=None)], 2, "expectation", "object"),
        ([{"dataset_version": "1"}, good_case(otlp={"spans": []})], 2, "otlp", "resourceSpans"),
        ([{"dataset_version": "1"}, good_case(otlp={"resourceSpans": []})], 2, "otlp", "no spans"),
        ([{"dataset_version": "1"}], None, None, "no labeled cases"),
    ],
)
def test_loader_errors_are_located(
    tmp_path: Path, records: list[Any], line: int | None, column: str | None, message: str
) -> None:
    path = write_cases(tmp_path, *records)
    with pytest.raises(DatasetError, match=message) as err:
        load_labeled_traces(path)
    assert (err.value.path, err.value.line, err.value.column) == (str(path), line, column)


def test_bad_span_ids_and_times(tmp_path: Path) -> None:
    case = good_case()
    case["otlp"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "xyz"
    with pytest.raises(DatasetError, match="32 hex"):
        load_labeled_traces(write_cases(tmp_path, {"dataset_version": "1"}, case))
    case = good_case()
    case["otlp"]["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["startTimeUnixNano"] = "soon"
    with pytest.raises(DatasetError, match="not a decimal integer"):
        load_labeled_traces(write_cases(tmp_path, {"dataset_version": "1"}, case))


def test_a_case_holding_unicode_line_separators_in_a_string_loads(tmp_path: Path) -> None:
    # json.dumps(ensure_ascii=False) writes U+2028 / U+0085 raw; they are not JSONL line breaks.
    header, first, *_ = DATA.read_text(encoding="utf-8").splitlines()
    record = json.loads(first)
    record["expectation"]["objective"] = "scraped text\u2028next line\x85end"
    path = tmp_path / "separators.jsonl"
    path.write_text(header + "\r\n" + json.dumps(record, ensure_ascii=False) + "\r\n", encoding="utf-8")
    [case] = load_labeled_traces(path).cases
    assert case.expectation["objective"] == "scraped text\u2028next line\x85end"
    assert case.source.endswith("separators.jsonl:2")


def test_a_file_saved_with_a_utf8_bom_loads(tmp_path: Path) -> None:
    path = tmp_path / "bom.jsonl"
    path.write_text(DATA.read_text(encoding="utf-8"), encoding="utf-8-sig")  # as Windows editors save
    ds = load_labeled_traces(path)
    assert ds.version == "1.0" and len(ds.cases) == 4


class FailsOnFirstCase(PresenceScorer):
    """Raises for the first case (a pipeline that fails); the others take a while and are counted."""

    def __init__(self, first: str) -> None:
        self.first = first
        self.started: list[str] = []
        self.finished: list[str] = []

    async def score_trace_async(self, case: LabeledTrace) -> TraceVerdict:
        self.started.append(case.case_id)
        if case.case_id == self.first:
            raise RuntimeError("pipeline failed")
        await asyncio.sleep(0.05)
        self.finished.append(case.case_id)
        return await super().score_trace_async(case)


async def test_a_failing_case_stops_the_rest_of_the_evaluation() -> None:
    dataset = load_labeled_traces(DATA)
    scorer = FailsOnFirstCase(dataset.cases[0].case_id)

    with pytest.raises(RuntimeError, match="pipeline failed"):
        await evaluate_traces_async(scorer, dataset, max_concurrency=4)

    # nothing left running: the other cases were cancelled before the error came back (the loop is
    # shared with other tests: only this evaluation's per-case tasks are looked at)
    ours = "evaluate_traces_async.<locals>.one"
    left = [t for t in asyncio.all_tasks() if ours in getattr(t.get_coro(), "__qualname__", "")]
    assert left == []
    assert len(scorer.started) > 1 and scorer.finished == []
