"""Labeled traces through the real embedded pipeline (scoring.evaluation.pipeline) and `toolwitness eval`.

Expected values are worked out by hand from tests/data/evaluation/labeled_traces_pipeline.jsonl:
every case starts at t0 = 2026-01-01T00:00:00Z and its span times are whole milliseconds after t0.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import pytest
import typer
from typer.testing import CliRunner

from collector.config import ScorerTreeConfig
from collector.processors.decide import build_tree
from scoring.evaluation import DatasetError, LabeledTrace, TraceEvaluableScorer, evaluate_traces_async
from scoring.evaluation.command import ScorerConfigError, build_trace_scorer, eval_command, load_scorer_config
from scoring.evaluation.pipeline import (
    EmbeddedTracePipelineScorer,
    TraceTreeConfigError,
    build_scorer_tree,
    contains_otel_tool_call,
    parse_case_expectation,
    parse_case_spans,
)
from scoring.evaluation.traces import load_labeled_traces
from scoring.models import Scorable, Score, ScoringExpectation, ToolsCalled, Verdict
from scoring.score import OtelToolCallScorer, PlagiarismScorer, ScoringContext, TrueFalseScorer

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"
SAMPLE = DATA / "labeled_traces_pipeline.jsonl"
OLD_SAMPLE = DATA / "labeled_traces.jsonl"
T0 = 1767225600000000000

# case → (verdict, time to verdict in s, decided at, 0-based span index in event order, judging passes)
EXPECTED: dict[str, tuple[bool | None, float | None, str | None, int | None, int]] = {
    # the tool span (ends 900 ms) is the 2nd event: the chat span ends at 400 ms, the root at 1500 ms
    "weather-ran": (True, 0.9, "span", 1, 2),
    # two spans, undetermined after each; the marker (latest event: root end 800 ms) proves absence
    "weather-absent-marker": (False, 0.8, "marker", None, 3),
    # humans say FALSE; without a marker absence is unprovable: UNDETERMINED (2 spans + final pass)
    "search-absent-no-marker": (None, None, None, None, 3),
    # OpenInference TOOL span, ends at 1250 ms
    "oi-search-ran": (True, 1.25, "span", 1, 2),
    # a failed execution (status ERROR, error.type) counts as called; it is the first event (600 ms)
    "email-failed-still-called": (True, 0.6, "span", 0, 1),
    # undetermined after lookup_order (500 ms), TRUE once issue_refund ends (1100 ms)
    "refund-both-tools": (True, 1.1, "span", 1, 2),
    # issue_refund never ran; FALSE at the marker = root end 1000 ms
    "refund-missing-marker": (False, 1.0, "marker", None, 4),
    # the marker promises 4 spans, 3 arrived: coverage stays incomplete
    "marker-count-short": (None, None, None, None, 4),
    # the LLM only *requested* search_web; FALSE at the marker = root end 1600 ms
    "oi-requested-not-executed": (False, 1.6, "marker", None, 3),
    # fetch_forecast ran, get_weather did not (exact names): FALSE at 1200 ms, humans' majority says TRUE
    "weather-name-mismatch": (False, 1.2, "marker", None, 3),
}
# batch mode: one pass after every span and the marker; time = latest event of the case
BATCH_SECONDS = {
    "weather-ran": 1.5,
    "weather-absent-marker": 0.8,
    "oi-search-ran": 2.0,
    "email-failed-still-called": 0.7,
    "refund-both-tools": 1.3,
    "refund-missing-marker": 1.0,
    "oi-requested-not-executed": 1.6,
    "weather-name-mismatch": 1.2,
}


@pytest.fixture(scope="module")
def cases() -> dict[str, LabeledTrace]:
    return {c.case_id: c for c in load_labeled_traces(SAMPLE).cases}


def pipeline(config: dict[str, Any] | None = None, *, streaming: bool = True) -> EmbeddedTracePipelineScorer:
    return EmbeddedTracePipelineScorer(build_scorer_tree(config or {"type": "otel_tool_call"}), streaming=streaming)


def test_sample_has_the_hand_labeled_cases(cases: dict[str, LabeledTrace]) -> None:
    assert list(cases) == list(EXPECTED)
    assert isinstance(pipeline(), TraceEvaluableScorer)


@pytest.mark.parametrize("case_id", list(EXPECTED))
async def test_streaming_verdict_and_time_to_verdict(cases: dict[str, LabeledTrace], case_id: str) -> None:
    value, seconds, at, index, passes = EXPECTED[case_id]
    run = await pipeline().run_case(cases[case_id])
    assert run.verdict.value is value, run.verdict.rationale
    assert run.verdict.time_to_verdict_seconds == (None if seconds is None else pytest.approx(seconds, abs=1e-9))
    assert (run.decided_at, run.span_index) == (at, index)
    assert len(run.steps) == passes
    # streaming: undetermined until the deciding pass, which is the last one
    assert all(v is Verdict.UNDETERMINED for v in run.steps[:-1])
    assert run.steps[-1] is Verdict.of(value)
    assert (await pipeline().score_trace_async(cases[case_id])) == run.verdict


@pytest.mark.parametrize("case_id", list(EXPECTED))
async def test_batch_mode_decides_once_at_the_latest_event(cases: dict[str, LabeledTrace], case_id: str) -> None:
    run = await pipeline(streaming=False).run_case(cases[case_id])
    assert run.verdict.value is EXPECTED[case_id][0]
    assert len(run.steps) == 1
    expected = BATCH_SECONDS.get(case_id)
    assert run.verdict.time_to_verdict_seconds == (None if expected is None else pytest.approx(expected, abs=1e-9))


async def test_rationale_names_where_the_verdict_was_decided(cases: dict[str, LabeledTrace]) -> None:
    ran = await pipeline().run_case(cases["weather-ran"])
    assert ran.verdict.rationale.startswith("true at span 2/3 'execute_tool get_weather': 'get_weather' executed")
    absent = await pipeline().run_case(cases["weather-absent-marker"])
    assert absent.verdict.rationale.startswith("false after 2 spans and the completion marker")
    open_ended = await pipeline().run_case(cases["search-absent-no-marker"])
    assert "no completion marker" in open_ended.verdict.rationale
    assert "awaiting_completion" in open_ended.verdict.rationale


def test_spans_are_parsed_with_hex_ids_and_sorted_by_event_time(cases: dict[str, LabeledTrace]) -> None:
    spans = parse_case_spans(cases["weather-ran"])
    # the file lists root, chat, tool; events come chat (400 ms), tool (900 ms), root (1500 ms)
    assert [s.name for s in spans] == ["chat gpt-4o", "execute_tool get_weather", "invoke_agent weather"]
    assert {s.trace_id for s in spans} == {"a1000000000000000000000000000001"}
    assert spans[1].span_id == "a100000000000003" and spans[1].parent_span_id == "a100000000000001"
    assert spans[1].attributes["gen_ai.tool.name"] == "get_weather"
    assert spans[1].resource_attributes["service.name"] == "demo-agent"
    assert spans[0].start_time_unix_nano == T0 + 10_000_000 and spans[0].end_time_unix_nano == T0 + 400_000_000
    failed = parse_case_spans(cases["email-failed-still-called"])
    assert [s.status_code for s in failed] == ["error", "unset"]


async def test_metrics_on_the_sample() -> None:
    metrics = await evaluate_traces_async(pipeline(), load_labeled_traces(SAMPLE))
    assert metrics.num_responses == 10 and metrics.num_undetermined_responses == 2
    assert metrics.undetermined_fraction == pytest.approx(0.2)
    # decided: 4 TRUE/TRUE, 3 FALSE/FALSE, 1 FALSE where the humans' majority says TRUE
    counts = (metrics.true_positive, metrics.false_positive, metrics.true_negative, metrics.false_negative)
    assert counts == (4, 0, 3, 1)
    assert metrics.accuracy == pytest.approx(7 / 8)
    assert metrics.precision == pytest.approx(1.0)
    assert metrics.recall == pytest.approx(0.8)
    assert metrics.f1_score == pytest.approx(8 / 9)
    # times of the 8 decided verdicts: 0.6 0.8 0.9 1.0 1.1 1.2 1.25 1.6 (linear percentiles)
    assert metrics.num_time_to_verdict == 8
    assert metrics.time_to_verdict_p50_seconds == pytest.approx(1.05)
    assert metrics.time_to_verdict_p95_seconds == pytest.approx(1.25 + 0.65 * 0.35)
    assert metrics.time_to_verdict_mean_seconds == pytest.approx(8.45 / 8)
    assert metrics.time_to_verdict_max_seconds == pytest.approx(1.6)


async def test_streaming_decides_no_later_than_batch() -> None:
    dataset = load_labeled_traces(SAMPLE)
    streaming = await evaluate_traces_async(pipeline(), dataset)
    batch = await evaluate_traces_async(pipeline(streaming=False), dataset)
    assert (batch.accuracy, batch.undetermined_fraction) == (streaming.accuracy, streaming.undetermined_fraction)
    assert batch.time_to_verdict_p50_seconds == pytest.approx(1.25)
    assert streaming.time_to_verdict_p50_seconds is not None and batch.time_to_verdict_p50_seconds is not None
    assert streaming.time_to_verdict_p50_seconds < batch.time_to_verdict_p50_seconds


async def test_the_older_sample_with_shorthand_expectations_runs() -> None:
    dataset = load_labeled_traces(OLD_SAMPLE)
    verdicts = [await pipeline().score_trace_async(c) for c in dataset.cases]
    assert [v.value for v in verdicts] == [True, False, None, True]
    assert [v.time_to_verdict_seconds for v in verdicts] == [
        pytest.approx(0.9),
        pytest.approx(0.8),
        None,
        pytest.approx(1.3),
    ]


async def test_composite_and_inverter_trees(cases: dict[str, LabeledTrace]) -> None:
    inverted = pipeline({"type": "inverter", "scorer": {"type": "otel_tool_call"}})
    run = await inverted.run_case(cases["weather-ran"])
    assert (run.verdict.value, run.decided_at) == (False, "span")
    # a substring leaf does not apply to traces; the composite decides on the tool leaf alone
    composite = pipeline(
        {
            "type": "composite",
            "aggregator": "and",
            "scorers": [{"type": "otel_tool_call"}, {"type": "substring", "substring": "refuse"}],
        }
    )
    assert (await composite.score_trace_async(cases["refund-missing-marker"])).value is False
    assert composite.get_identifier() == composite.scorer.get_identifier()
    assert composite.get_identifier().class_name == "TrueFalseCompositeScorer"


class FinalOnlyScorer(TrueFalseScorer):
    """TRUE once the evidence is final (what a fallback judge would do), UNDETERMINED before."""

    supported_conditions: ClassVar[frozenset[str]] = frozenset({"tools_called"})

    async def _score_async(
        self, scorable: Scorable, expectation: ScoringExpectation, context: ScoringContext
    ) -> list[Score]:
        verdict = Verdict.TRUE if context.final else Verdict.UNDETERMINED
        return [self._verdict_score(scorable, expectation, verdict, f"final={context.final}")]


async def test_a_verdict_from_the_final_pass_has_no_time_without_a_marker(cases: dict[str, LabeledTrace]) -> None:
    scorer = EmbeddedTracePipelineScorer(FinalOnlyScorer())
    open_ended = await scorer.run_case(cases["search-absent-no-marker"])
    assert (open_ended.verdict.value, open_ended.decided_at) == (True, "end")
    assert open_ended.verdict.time_to_verdict_seconds is None
    marked = await scorer.run_case(cases["weather-absent-marker"])
    assert (marked.verdict.value, marked.decided_at) == (True, "marker")
    assert marked.verdict.time_to_verdict_seconds == pytest.approx(0.8)


def _two_trace_case(completion: dict[str, Any] | None) -> LabeledTrace:
    case = load_labeled_traces(SAMPLE).cases[1]  # weather-absent-marker: 2 spans of one trace
    otlp = copy.deepcopy(dict(case.otlp))
    spans = otlp["resourceSpans"][0]["scopeSpans"][0]["spans"]
    spans[1]["traceId"] = "b2000000000000000000000000000002"
    spans[1].pop("parentSpanId")
    return LabeledTrace(
        case_id="two-traces",
        expectation=case.expectation,
        human_scores=(0.0,),
        otlp=otlp,
        spans=case.spans,
        completion=completion,
        source="memory:1",
    )


async def test_a_marker_without_a_count_completes_every_trace_of_the_case() -> None:
    run = await pipeline().run_case(_two_trace_case({}))
    assert (run.verdict.value, run.decided_at) == (False, "marker")
    with pytest.raises(DatasetError, match="span_count is per trace"):
        await pipeline().run_case(_two_trace_case({"span_count": 2}))


def test_expectations_canonical_and_shorthand() -> None:
    canonical = parse_case_expectation(
        {"objective": "o", "conditions": [{"type": "tools_called", "tools": [{"name": "a"}]}]}
    )
    shorthand = parse_case_expectation({"objective": "o", "tools_called": ["a"]})
    assert canonical == shorthand
    mixed = parse_case_expectation(
        {"tools_called": [{"name": "b", "status": "ok"}], "conditions": [{"type": "tool_sequence", "tools": ["a"]}]}
    )
    assert [c.type for c in mixed.conditions] == ["tool_sequence", "tools_called"]
    assert isinstance(mixed.conditions[1], ToolsCalled) and mixed.conditions[1].tools[0].status == "ok"
    with pytest.raises(DatasetError, match="not a ScoringExpectation"):
        parse_case_expectation({"conditions": [{"type": "tools_called", "tools": []}]}, where="x.jsonl:3")
    with pytest.raises(DatasetError, match="non-empty list"):
        parse_case_expectation({"tools_called": "a"})


async def test_bad_cases_are_dataset_errors(cases: dict[str, LabeledTrace], tmp_path: Path) -> None:
    base = cases["weather-ran"]
    otlp = copy.deepcopy(dict(base.otlp))
    otlp["resourceSpans"][0]["scopeSpans"][0]["spans"][0]["traceId"] = "zz" * 16
    bad_id = LabeledTrace(base.case_id, base.expectation, base.human_scores, otlp, base.spans, None, "f.jsonl:2")
    with pytest.raises(DatasetError, match="traceId 'zzzz"):
        await pipeline().run_case(bad_id)
    bad_marker = LabeledTrace(
        base.case_id, base.expectation, base.human_scores, base.otlp, base.spans, {"span_count": "3"}, "f.jsonl:2"
    )
    with pytest.raises(DatasetError, match="span_count must be a non-negative integer"):
        await pipeline().run_case(bad_marker)
    unsupported = LabeledTrace(
        base.case_id,
        {"conditions": [{"type": "tools_called", "tools": [{"name": "a"}]}]},
        base.human_scores,
        base.otlp,
        base.spans,
        None,
        "f.jsonl:2",
    )
    with pytest.raises(ValueError, match="does not support"):
        await pipeline({"type": "substring", "substring": "x"}).run_case(unsupported)


@pytest.mark.parametrize(
    "config",
    [
        {"type": "otel_tool_call"},
        {"type": "otel_tool_call", "categories": ["tools"]},
        {"type": "inverter", "scorer": {"type": "otel_tool_call"}},
        {
            "type": "composite",
            "aggregator": "or",
            "scorers": [{"type": "otel_tool_call"}, {"type": "substring", "substring": "no", "case_sensitive": True}],
        },
        {
            "type": "fallback",
            "scorer": {"type": "otel_tool_call"},
            "fallback_scorer": {"type": "otel_tool_call", "categories": []},
        },
        {"type": "threshold", "threshold": 0.5, "scorer": {"type": "plagiarism", "reference_text": "abc"}},
    ],
    ids=["leaf", "categories", "inverter", "composite", "fallback", "threshold"],
)
def test_trees_have_the_identity_of_the_service_trees(config: dict[str, Any]) -> None:
    ours = build_scorer_tree(config)
    theirs = build_tree(ScorerTreeConfig.model_validate(config))
    assert ours.get_identifier() == theirs.get_identifier()


def test_tree_builder_errors_and_names() -> None:
    defs = {"a": {"type": "inverter", "scorer": "b"}, "b": {"type": "inverter", "scorer": "a"}, "leaf": {}}
    with pytest.raises(TraceTreeConfigError, match="cycle: a -> b -> a"):
        build_scorer_tree("a", resolve=defs.__getitem__)
    with pytest.raises(TraceTreeConfigError, match="unknown scorer 'nope'"):
        build_scorer_tree({"type": "inverter", "scorer": "nope"}, resolve=defs.__getitem__)
    with pytest.raises(TraceTreeConfigError, match=r"scorer\.scorers\[1\]: type must be one of"):
        build_scorer_tree({"type": "composite", "aggregator": "and", "scorers": [{"type": "otel_tool_call"}, {}]})
    with pytest.raises(TraceTreeConfigError, match="unknown key"):
        build_scorer_tree({"type": "otel_tool_call", "source": "x"})
    with pytest.raises(TraceTreeConfigError, match="needs aggregator"):
        build_scorer_tree({"type": "composite", "scorers": [{"type": "otel_tool_call"}]})
    with pytest.raises(TraceTreeConfigError, match="'xor' is not a valid"):
        build_scorer_tree({"type": "composite", "aggregator": "xor", "scorers": [{"type": "otel_tool_call"}]})
    with pytest.raises(TraceTreeConfigError, match="threshold needs a float-scale scorer"):
        build_scorer_tree({"type": "threshold", "threshold": 0.5, "scorer": {"type": "otel_tool_call"}})
    tree = build_scorer_tree({"type": "inverter", "scorer": {"type": "otel_tool_call"}})
    assert contains_otel_tool_call(tree) and isinstance(tree.children()[0], OtelToolCallScorer)
    assert not contains_otel_tool_call(build_scorer_tree({"type": "substring", "substring": "x"}))
    with pytest.raises(TypeError, match="not a true/false scorer"):
        EmbeddedTracePipelineScorer(PlagiarismScorer(reference_text="abc"))


# -- `toolwitness eval --dataset labeled.jsonl` ------------------------------------------

CONFIG = """\
scorers:
  tools:
    type: otel_tool_call
    tags: [traces]
  tools_and_no_refusal:
    type: composite
    aggregator: and
    scorers: [tools, {type: inverter, scorer: {type: substring, substring: "I can't"}}]
  keyword:
    type: substring
    substring: "weather"
"""


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    monkeypatch.setenv("COLUMNS", "160")
    app = typer.Typer()
    app.command("eval")(eval_command)
    return app


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "scorers.yaml"
    path.write_text(CONFIG)
    return path


def run(app: typer.Typer, *args: str) -> tuple[int, str]:
    result = CliRunner().invoke(app, list(args))
    return result.exit_code, result.output


def row(out: str, label: str) -> str:
    """The value cell of a table row."""
    line = next(line for line in out.splitlines() if f"│ {label} " in line)
    return line.split("│")[2].strip()


def test_cli_prints_the_trace_metrics_table(app: typer.Typer, config: Path) -> None:
    code, out = run(app, "--tags", "traces", "--config", str(config), "--dataset", str(SAMPLE))
    assert code == 0, out
    assert "tools — OtelToolCallScorer (eval hash" in out
    assert row(out, "Dataset") == "labeled_traces_pipeline.jsonl (version 1.0)"
    assert row(out, "Responses scored / total") == "8 / 10"
    assert row(out, "Undetermined share (of all trial scores)") == "20.0%"
    assert row(out, "Accuracy ± std. error").startswith("0.8750 ± ")
    assert row(out, "Precision") == "1.0000" and row(out, "Recall") == "0.8000" and row(out, "F1") == "0.8889"
    assert row(out, "TP / FP / TN / FN") == "4 / 0 / 3 / 1"
    assert row(out, "Verdicts with a time to verdict") == "8"
    assert row(out, "Time to verdict p50 / p95 (event time)") == "1.050 s / 1.477 s"
    assert row(out, "Time to verdict mean / max") == "1.056 s / 1.600 s"


def test_cli_composite_two_trials_and_registry_note(app: typer.Typer, config: Path, tmp_path: Path) -> None:
    registry = tmp_path / "metrics.jsonl"
    code, out = run(
        app,
        *("--scorer", "tools_and_no_refusal", "--config", str(config), "--dataset", str(SAMPLE)),
        *("--trials", "2", "--registry", str(registry)),
    )
    assert code == 0, out
    assert "tools_and_no_refusal — TrueFalseCompositeScorer" in out
    assert "--registry is not used for labeled traces" in out and not registry.exists()
    assert row(out, "Scorer trials") == "2" and row(out, "TP / FP / TN / FN") == "4 / 0 / 3 / 1"
    assert row(out, "Verdicts with a time to verdict") == "16"


def test_cli_rejects_trees_without_a_tool_leaf_and_traces_on_csv(app: typer.Typer, config: Path) -> None:
    code, out = run(app, "--scorer", "keyword,tools", "--config", str(config), "--dataset", str(SAMPLE))
    assert code == 1
    assert "keyword: scorer 'keyword' has no otel_tool_call in its tree" in out
    assert "tools — OtelToolCallScorer" in out  # the other scorer still ran
    code, out = run(app, "--scorer", "tools", "--config", str(config), "--dataset", str(DATA / "refusal_objective.csv"))
    assert code == 1 and "judges traces: point --dataset at a labeled-trace .jsonl file" in out


def test_cli_reports_a_bad_trace_file(app: typer.Typer, config: Path, tmp_path: Path) -> None:
    lines = SAMPLE.read_text().splitlines()
    case = json.loads(lines[1])
    case["expectation"] = {"conditions": [{"type": "nope"}]}
    bad = tmp_path / "bad.jsonl"
    bad.write_text("\n".join([lines[0], json.dumps(case)]) + "\n")
    code, out = run(app, "--scorer", "tools", "--config", str(config), "--dataset", str(bad))
    assert code == 1 and "not a ScoringExpectation" in out and "bad.jsonl:2" in out


def test_build_trace_scorer_resolves_names(config: Path) -> None:
    definitions = load_scorer_config(config)
    scorer = build_trace_scorer(definitions, "tools_and_no_refusal")
    kids: Sequence[Any] = scorer.scorer.children()
    assert isinstance(kids[0], OtelToolCallScorer) and scorer.streaming
    with pytest.raises(ScorerConfigError, match="unknown scorer 'missing'"):
        build_trace_scorer(definitions, "missing")
