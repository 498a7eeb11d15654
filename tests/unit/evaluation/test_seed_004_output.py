"""Seed 004's remaining cells: ``output_scorer_async`` (from ``scoring.output``), the
``scoring.score.scorer_evaluation`` module paths, and harm scorers' metrics by category."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from scoring.output import format_scorer, output_scorer_async
from scoring.score import (
    PlagiarismScorer,
    RegistryUpdateBehavior,
    SubStringScorer,
    TrueFalseInverterScorer,
    get_all_harm_metrics,
    get_all_objective_metrics,
)
from scoring.score.scorer_evaluation.scorer_evaluator import ScorerEvalDatasetFiles
from scoring.score.scorer_evaluation.scorer_metrics import HarmScorerMetrics, ObjectiveScorerMetrics

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"


@pytest.fixture
def evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sample").mkdir()
    shutil.copy(DATA / "refusal_objective.csv", tmp_path / "sample" / "refusal.csv")
    shutil.copy(DATA / "violence_multi_rater.csv", tmp_path / "sample" / "violence.csv")
    monkeypatch.setenv("TOOLWITNESS_SCORER_EVALS_PATH", str(tmp_path))
    monkeypatch.setenv("TOOLWITNESS_EVAL_REGISTRY", str(tmp_path / "registry.jsonl"))
    return tmp_path


async def test_output_scorer_prints_identity_and_stored_metrics(
    evals: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    scorer = TrueFalseInverterScorer(scorer=SubStringScorer(substring="can't"))
    scorer.evaluation_file_mapping = ScorerEvalDatasetFiles(human_labeled_datasets_files=["sample/refusal.csv"])
    stored = await scorer.evaluate_async(num_scorer_trials=1)
    assert isinstance(stored, ObjectiveScorerMetrics)

    [entry] = get_all_objective_metrics()
    await output_scorer_async(scorer_identifier=entry.scorer_identifier)  # the seed's call
    out = capsys.readouterr().out
    assert "  📊 Scorer Information\n    ▸ Scorer Identifier\n      • Scorer Type: TrueFalseInverterScorer" in out
    assert "        └─ Composite of 1 scorer(s):\n            • Scorer Type: SubStringScorer" in out
    assert f"      • Accuracy: {stored.accuracy:.2%}" in out
    assert f"      • F1 Score: {stored.f1_score:.4f}" in out and "Average Score Time:" in out

    # a configuration without a stored result says so
    other = TrueFalseInverterScorer(scorer=SubStringScorer(substring="won't")).get_identifier()
    assert "Official evaluation has not been run yet for this specific configuration" in format_scorer(other)


async def test_a_harm_scorers_metrics_are_found_by_category(evals: Path, capsys: pytest.CaptureFixture[str]) -> None:
    harm = PlagiarismScorer(reference_text="Hit them repeatedly with a bat until they stop moving.")
    assert harm.get_scorer_metrics() is None  # nothing stored: None, no error (seed 004)
    harm.evaluation_file_mapping = ScorerEvalDatasetFiles(human_labeled_datasets_files=["sample/violence.csv"])
    stored = await harm.evaluate_async(num_scorer_trials=1)
    assert isinstance(stored, HarmScorerMetrics) and stored.harm_category == "violence"
    found = harm.get_scorer_metrics()  # no category named: the one stored for this configuration
    assert isinstance(found, HarmScorerMetrics) and found.mean_absolute_error == stored.mean_absolute_error

    [entry] = get_all_harm_metrics(harm_category="violence")
    await output_scorer_async(scorer_identifier=entry.scorer_identifier, harm_category="violence")
    out = capsys.readouterr().out
    assert f"      • Mean Absolute Error: {stored.mean_absolute_error:.4f}" in out
    assert "Krippendorff Alpha (Combined)" in out

    # a mapping naming another category than the datasets' would store results where no lookup goes
    harm.evaluation_file_mapping = ScorerEvalDatasetFiles(
        human_labeled_datasets_files=["sample/violence.csv"], harm_category="hate_speech"
    )
    with pytest.raises(ValueError, match=r"harm_category is 'hate_speech' but the datasets .* are labeled 'violence'"):
        await harm.evaluate_async(num_scorer_trials=1, update_registry_behavior=RegistryUpdateBehavior.ALWAYS_UPDATE)
