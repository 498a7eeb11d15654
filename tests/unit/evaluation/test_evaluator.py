"""evaluate_async end to end with fake scorers (NEVER_UPDATE unless the registry is under test)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from scoring.evaluation import (
    EvaluableScorer,
    HarmScorerMetrics,
    MetricsType,
    ObjectiveScorerMetrics,
    RegistryUpdateBehavior,
    evaluate_async,
    load_csv,
)
from tests.unit.evaluation.fakes import FakeScore, KeywordHarmScorer, SequenceScorer, TableScorer, score_of

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"
NEVER = RegistryUpdateBehavior.NEVER_UPDATE
OBJECTIVE = load_csv(DATA / "refusal_objective.csv", MetricsType.OBJECTIVE)
HARM = load_csv(DATA / "violence_multi_rater.csv", MetricsType.HARM)


def test_fakes_satisfy_the_protocol() -> None:
    scorers: list[EvaluableScorer] = [TableScorer({}, "true_false"), KeywordHarmScorer({})]
    assert all(isinstance(s, EvaluableScorer) for s in scorers)


async def test_objective_evaluation_counts_undetermined(tmp_path: Path) -> None:
    # A scorer that says "refusal" on "can't"/"won't", and cannot decide on the hedged answers.
    table: dict[str, bool | float | None] = {}
    for entry in OBJECTIVE.entries:
        text = entry.assistant_response
        table[text] = None if ("sorry" in text or "not able" in text) else ("can't" in text or "won't" in text)
    scorer = TableScorer(table, "true_false")
    m = await evaluate_async(
        scorer, OBJECTIVE, num_scorer_trials=2, update_registry_behavior=NEVER, registry_path=tmp_path / "r.jsonl"
    )
    assert isinstance(m, ObjectiveScorerMetrics)
    # 10 responses, 2 undetermined (hedged refusals, gold True) → 8 decided, all correct.
    assert (m.true_positive, m.false_positive, m.true_negative, m.false_negative) == (4, 0, 4, 0)
    assert m.num_undetermined_responses == 2 and m.num_undetermined_scores == 4
    assert m.undetermined_fraction == pytest.approx(4 / 20)
    assert m.accuracy == 1.0 and m.recall == 1.0
    assert m.dataset_name == "refusal_objective.csv" and m.dataset_version == "1.0"
    assert m.average_score_time_seconds > 0
    assert set(scorer.objectives) == {"Did the response refuse the request?"}  # objective passed through
    assert not (tmp_path / "r.jsonl").exists()


async def test_harm_evaluation_from_glob(tmp_path: Path) -> None:
    scorer = KeywordHarmScorer({"bat": 1.0, "shove": 0.5, "bottles": 0.5, "glass": 0.25}, undetermined_if="skidded")
    m = await evaluate_async(
        scorer,
        str(DATA / "violence_multi*.csv"),
        num_scorer_trials=1,
        update_registry_behavior=NEVER,
        registry_path=tmp_path / "r.jsonl",
    )
    assert isinstance(m, HarmScorerMetrics)
    assert m.harm_category == "violence" and m.harm_definition == "violence.yaml"
    assert m.num_human_raters == 3 and m.num_undetermined_responses == 1
    # gold means: 0, 1/2, 11/12, (1/12 undetermined), 1/2, 0, 1/3, 0
    # predictions:  0, 1/2, 1,     -,                  1/2, 0, 1/4, 0  → |e| 1/12 twice
    assert m.mean_absolute_error == pytest.approx(2 / 12 / 7)
    assert (m.num_unanimous_responses, m.num_contested_responses) == (4, 3)
    assert m.mean_absolute_error_unanimous == pytest.approx(1 / 12 / 4)
    assert m.mean_absolute_error_contested == pytest.approx(1 / 12 / 3)
    # constant guess = median of the decided golds (0, 0, 0, 1/3, 1/2, 1/2, 11/12) = 1/3
    assert m.baseline_mean_absolute_error == pytest.approx((1 / 3 + 1 / 6 + 7 / 12 + 1 / 6 + 1 / 3 + 0 + 1 / 3) / 7)
    assert m.items is not None and m.items[3].prediction is None


async def test_trials_are_aggregated_per_response(tmp_path: Path) -> None:
    texts = [e.assistant_response for e in HARM.entries]
    sequences: dict[str, list[bool | float | None]] = {t: [0.0, 0.0, 1.0] for t in texts}
    scorer = SequenceScorer(sequences, "float_scale")
    m = await evaluate_async(
        scorer, HARM, num_scorer_trials=3, update_registry_behavior=NEVER, registry_path=tmp_path / "r.jsonl"
    )
    assert isinstance(m, HarmScorerMetrics)
    assert m.items is not None and all(it.prediction == pytest.approx(1 / 3) for it in m.items)  # mean of 0, 0, 1
    assert m.krippendorff_alpha_model is not None


async def test_concurrency_is_bounded(tmp_path: Path) -> None:
    scorer = TableScorer({e.assistant_response: False for e in OBJECTIVE.entries}, "true_false")
    await evaluate_async(
        scorer,
        OBJECTIVE,
        num_scorer_trials=1,
        max_concurrency=3,
        update_registry_behavior=NEVER,
        registry_path=tmp_path / "r.jsonl",
    )
    assert scorer.peak_in_flight == 3


async def test_progress_callback(tmp_path: Path) -> None:
    scorer = TableScorer({e.assistant_response: True for e in OBJECTIVE.entries}, "true_false")
    ticks: list[int] = []
    await evaluate_async(
        scorer,
        OBJECTIVE,
        num_scorer_trials=2,
        on_progress=ticks.append,
        update_registry_behavior=NEVER,
        registry_path=tmp_path / "r.jsonl",
    )
    assert sum(ticks) == 20


async def test_wrong_value_types_are_errors(tmp_path: Path) -> None:
    floats = TableScorer({e.assistant_response: 0.5 for e in OBJECTIVE.entries}, "true_false")
    with pytest.raises(TypeError, match="not a bool"):
        await evaluate_async(floats, OBJECTIVE, update_registry_behavior=NEVER, registry_path=tmp_path / "r")
    too_big = TableScorer({e.assistant_response: 2.0 for e in HARM.entries}, "float_scale")
    with pytest.raises(ValueError, match=r"outside \[0, 1\]"):
        await evaluate_async(too_big, HARM, update_registry_behavior=NEVER, registry_path=tmp_path / "r")
    with pytest.raises(ValueError, match="needs a harm dataset"):
        await evaluate_async(too_big, OBJECTIVE, update_registry_behavior=NEVER, registry_path=tmp_path / "r")
    with pytest.raises(ValueError, match="scorer_type"):
        await evaluate_async(TableScorer({}, "ranking"), OBJECTIVE, registry_path=tmp_path / "r")


class FailsOnFirstResponse(TableScorer):
    """Raises for the first response (a judge answering 400); the others take a while."""

    def __init__(self) -> None:
        super().__init__({}, "true_false", name="fails")
        self.first = OBJECTIVE.entries[0].assistant_response

    async def score_text_async(self, text: str, *, objective: str | None = None) -> list[FakeScore]:
        self.calls += 1
        await asyncio.sleep(0.005)
        if text == self.first:
            raise RuntimeError("judge answered 400")
        return [score_of(True)]


async def test_a_failing_call_stops_the_rest_of_the_evaluation(tmp_path: Path) -> None:
    scorer = FailsOnFirstResponse()
    with pytest.raises(RuntimeError, match="judge answered 400"):
        await evaluate_async(scorer, OBJECTIVE, num_scorer_trials=1, max_concurrency=2, update_registry_behavior=NEVER)
    # nothing left running: the other calls were cancelled before the error came back (the loop is
    # shared with other tests: only this evaluation's per-response tasks are looked at)
    ours = "run_trials_async.<locals>.one"
    left = [t for t in asyncio.all_tasks() if ours in getattr(t.get_coro(), "__qualname__", "")]
    assert left == []
    assert scorer.calls < len(OBJECTIVE.entries)
