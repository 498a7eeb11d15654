"""PyRIT's attribute and method names on the objects the library hands back or takes.

DESIGN §2: keep PyRIT's names where the concept is the same. Our own names stay the
serialized ones (stored observations and streamed records are read by them); PyRIT's are
accepted at construction where that makes sense and readable everywhere else.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from pydantic import ValidationError

from scoring.models import (
    ContentScorable,
    MessageScorable,
    Score,
    ScoreStatus,
    ScoringExpectation,
    ToolCallRequirement,
    ToolsCalled,
)
from scoring.score import (
    ScorerEvalDatasetFiles,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"

#: The keys a dumped Score has. The streaming service and saved scores depend on them, so
#: PyRIT's spellings must never appear here.
SERIALIZED_KEYS = {
    "id",
    "score_type",
    "status",
    "score_value",
    "score_category",
    "rationale",
    "metadata",
    "scorable",
    "observation_ids",
    "scorer_class",
    "scorer_hash",
    "objective",
    "expectation",
    "timestamp",
}


def _score(**fields: object) -> Score:
    values: dict[str, object] = {
        "score_type": "true_false",
        "status": ScoreStatus.COMPLETE,
        "score_value": "true",
        "scorable": ContentScorable(text="t"),
    }
    values.update(fields)
    return Score(**values)  # type: ignore[arg-type]


# --- Score -----------------------------------------------------------------------------------------


async def test_a_scored_result_reads_under_pyrit_names() -> None:
    """The known gap: ``score.score_rationale`` raised AttributeError on every score we return."""
    score = (await SubStringScorer(substring="bomb").score_text_async(text="a bomb"))[0]
    assert score.rationale  # a scorer always explains itself
    assert score.score_rationale == score.rationale
    assert score.score_metadata == score.metadata == {}
    fallback_meta = {"resolved_by": "primary", "primary.k": 1}
    assert _score(metadata=fallback_meta).score_metadata == fallback_meta


def test_a_score_is_built_with_pyrit_names_and_dumps_ours() -> None:
    score = _score(score_rationale="because", score_metadata={"k": "v"})
    assert (score.rationale, score.metadata) == ("because", {"k": "v"})
    dumped = score.model_dump(mode="json")
    assert set(dumped) == SERIALIZED_KEYS
    assert set(score.model_dump(by_alias=True)) == SERIALIZED_KEYS
    assert (dumped["rationale"], dumped["metadata"]) == ("because", {"k": "v"})
    assert Score.model_validate_json(score.model_dump_json()) == score
    # model_validate takes PyRIT's spelling too, and it means the same as ours
    ours = _score(rationale="r", metadata={"a": 1})
    doc = ours.model_dump()
    doc["score_rationale"], doc["score_metadata"] = doc.pop("rationale"), doc.pop("metadata")
    assert Score.model_validate(doc) == ours


def test_giving_both_spellings_of_a_field_is_refused() -> None:
    with pytest.raises(ValidationError, match="score_rationale"):
        _score(rationale="ours", score_rationale="pyrit's")
    with pytest.raises(ValidationError, match="score_metadata"):
        _score(metadata={"a": 1}, score_metadata={"b": 2})


def test_is_undetermined_follows_status() -> None:
    assert _score(status=ScoreStatus.UNDETERMINED, score_value="").is_undetermined is True
    assert _score().is_undetermined is False


async def test_scored_expectation_carries_the_objective_as_pyrit_does() -> None:
    tools = ScoringExpectation(
        objective="call it", conditions=(ToolsCalled(tools=(ToolCallRequirement(name="lookup"),)),)
    )
    assert _score(expectation=tools, objective="call it").scored_expectation == tools
    # an objective-only expectation is not stored in ``expectation``; PyRIT's name still has it
    objective_only = (await SubStringScorer(substring="x").score_text_async(text="x", objective="find x"))[0]
    assert objective_only.expectation is None
    assert objective_only.scored_expectation == ScoringExpectation(objective="find x")
    assert _score().scored_expectation is None


async def test_scorer_class_identifier_names_the_scorer_class_as_pyrit_does() -> None:
    scorer = SubStringScorer(substring="x")
    score = (await scorer.score_text_async(text="x"))[0]
    assert score.scorer_class_identifier == {"__type__": "SubStringScorer", "scorer_hash": scorer.get_identifier().hash}
    assert "scorer_class_identifier" not in score.model_dump()  # read-only: not serialized


def test_message_piece_id_is_the_scored_piece() -> None:
    assert _score(scorable=MessageScorable(message_id="piece-1")).message_piece_id == "piece-1"
    assert _score().message_piece_id is None


# --- scorer identity -------------------------------------------------------------------------------


def test_scorer_identifier_has_pyrit_display_and_child_names() -> None:
    leaf = SubStringScorer(substring="bomb")
    tree = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.OR, scorers=[leaf, TrueFalseInverterScorer(scorer=leaf)]
    )
    ident = tree.get_identifier()
    assert ident.short_hash == ident.hash[:8] and len(ident.short_hash) == 8
    assert ident.unique_name == f"TrueFalseCompositeScorer::{ident.hash[:8]}" == str(ident)
    children = ident.get_child_list("scorers")
    assert isinstance(children, list) and [c.class_name for c in children] == [
        "SubStringScorer",
        "TrueFalseInverterScorer",
    ]
    assert ident.get_child_list("prompt_target") == []
    # display-only: the dumped identity is unchanged
    assert set(ident.model_dump()) == {"class_name", "class_module", "params", "children", "hash"}


def test_eval_hash_is_the_key_metrics_are_stored_under() -> None:
    from scoring.evaluation import evaluation_hash

    a, b = SubStringScorer(substring="a").get_identifier(), SubStringScorer(substring="b").get_identifier()
    assert a.eval_hash == evaluation_hash(a) and len(a.eval_hash) == 64
    assert a.eval_hash != b.eval_hash


def test_simple_identifier_has_the_same_display_and_child_names() -> None:
    from scoring.evaluation.identity import SimpleScorerIdentifier

    target = SimpleScorerIdentifier(class_name="Target", params={"model_name": "m"})
    judge = SimpleScorerIdentifier(class_name="Judge", children={"prompt_target": target})
    assert judge.short_hash == judge.hash[:8]
    assert judge.unique_name == f"Judge::{judge.hash[:8]}"
    assert judge.get_child_list("prompt_target") == [target]
    assert judge.get_child_list("missing") == []


# --- scorer methods and metrics --------------------------------------------------------------------


@pytest.fixture
def evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sample").mkdir()
    shutil.copy(DATA / "refusal_objective.csv", tmp_path / "sample" / "mini_refusal.csv")
    monkeypatch.setenv("TOOLWITNESS_SCORER_EVALS_PATH", str(tmp_path))
    monkeypatch.setenv("TOOLWITNESS_EVAL_REGISTRY", str(tmp_path / "shared.jsonl"))
    return tmp_path


async def test_evaluate_async_takes_pyrits_file_mapping_argument(evals: Path) -> None:
    from scoring.evaluation.registry import MetricsRegistry
    from scoring.score import RegistryUpdateBehavior

    scorer = SubStringScorer(substring="can't")
    mapping = ScorerEvalDatasetFiles(
        human_labeled_datasets_files=["sample/mini_refusal.csv"], result_file="sample/metrics.jsonl"
    )
    metrics = await scorer.evaluate_async(
        mapping, num_scorer_trials=1, update_registry_behavior=RegistryUpdateBehavior.ALWAYS_UPDATE
    )
    assert metrics.num_responses > 0
    assert scorer.evaluation_file_mapping is None  # used for this call, not kept
    [stored] = MetricsRegistry(evals / "sample" / "metrics.jsonl").all_objective()
    assert stored.eval_hash == scorer.get_identifier().eval_hash
    assert stored.metrics.accuracy == metrics.accuracy


async def test_metrics_to_json_and_from_json_file_round_trip(evals: Path) -> None:
    from scoring.score import ObjectiveScorerMetrics

    scorer = SubStringScorer(substring="can't")
    scorer.evaluation_file_mapping = ScorerEvalDatasetFiles(human_labeled_datasets_files=["sample/mini_refusal.csv"])
    metrics = await scorer.evaluate_async(num_scorer_trials=1, add_to_evaluation_results=False)
    assert isinstance(metrics, ObjectiveScorerMetrics)
    text = metrics.to_json()
    assert json.loads(text) == metrics.to_dict()
    bare, wrapped = evals / "bare.json", evals / "wrapped.json"
    bare.write_text(text)
    wrapped.write_text(json.dumps({"metrics": json.loads(text), "eval_hash": "x"}))
    for path in (bare, wrapped, str(bare)):
        back = ObjectiveScorerMetrics.from_json_file(path)
        assert isinstance(back, ObjectiveScorerMetrics) and back == metrics and back.source == "registry"
    (evals / "list.json").write_text("[]")
    with pytest.raises(ValueError, match="expected a JSON object"):
        ObjectiveScorerMetrics.from_json_file(evals / "list.json")


# --- scores from judges and from scorers we wrap ---------------------------------------------------


def test_judge_scores_read_under_pyrit_names() -> None:
    from scoring.evaluation.judges import JudgeScore, JudgeScoreStatus

    score = JudgeScore("true_false", JudgeScoreStatus.COMPLETE, True, rationale="refused", metadata={"m": "1"})
    assert (score.score_rationale, score.score_metadata) == ("refused", {"m": "1"})


@dataclass
class _PyritStyleScore:
    """A score spelled as PyRIT spells it: no ``rationale`` / ``metadata`` attributes."""

    score_rationale: str
    score_metadata: dict[str, str | int | float] = field(default_factory=dict)
    status: ScoreStatus = ScoreStatus.COMPLETE

    def get_value(self) -> bool:
        return True


class _PyritStyleScorer:
    scorer_type = "true_false"

    async def score_text_async(self, text: str, *, objective: str | None = None) -> Sequence[_PyritStyleScore]:
        return [_PyritStyleScore(score_rationale="looked", score_metadata={"tokens": 3})]

    def get_identifier(self) -> object:
        from scoring.evaluation.identity import SimpleScorerIdentifier

        return SimpleScorerIdentifier(class_name="PyritStyleScorer")


async def test_a_wrapped_scorer_keeps_pyrit_spelled_rationale_and_metadata() -> None:
    """A text scorer whose scores spell them PyRIT's way kept the rationale but lost the metadata."""
    [inverted] = await TrueFalseInverterScorer(scorer=_PyritStyleScorer()).score_text_async(text="x")  # type: ignore[arg-type]
    assert inverted.get_value() is False and "looked" in inverted.rationale
    from scoring.score.adapt import as_scorer

    [leaf] = await as_scorer(_PyritStyleScorer()).score_text_async(text="x")
    assert leaf.rationale == "looked"
    assert leaf.metadata == {"tokens": 3}


@dataclass
class _ValuelessScore:
    """A PyRIT-era score without a judgment: its status says so and ``get_value()`` raises (an
    empty ``score_value`` cannot be read as a bool)."""

    status: ScoreStatus = ScoreStatus.UNDETERMINED
    score_rationale: str = "no answer"

    def get_value(self) -> bool:
        raise ValueError("score_value '' is not 'true' or 'false'")


class _ValuelessScorer(_PyritStyleScorer):
    async def score_text_async(self, text: str, *, objective: str | None = None) -> Sequence[_PyritStyleScore]:
        return [_ValuelessScore()]  # type: ignore[list-item]


async def test_an_undetermined_score_is_read_by_its_status_first() -> None:
    """Both readers of foreign scores asked ``get_value()`` before the status and raised on a score
    that has no value to give; the status already said it was undetermined."""
    from scoring.evaluation.dataset import LabeledEntry, MetricsType
    from scoring.evaluation.evaluator import score_entry_async
    from scoring.evaluation.protocols import is_undetermined
    from scoring.score.adapt import as_scorer

    assert is_undetermined(_ValuelessScore())
    [leaf] = await as_scorer(_ValuelessScorer()).score_text_async(text="x")
    assert leaf.get_value() is None and leaf.status is ScoreStatus.UNDETERMINED
    entry = LabeledEntry(assistant_response="x", human_scores=(1.0,), objective="o", source="t.csv:2")
    assert await score_entry_async(_ValuelessScorer(), entry, MetricsType.OBJECTIVE) is None  # type: ignore[arg-type]
