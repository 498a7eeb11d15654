"""Seed 004's form of scorer metrics: ``scorer.evaluation_file_mapping`` + ``evaluate_async`` /
``get_scorer_metrics`` as scorer methods, with the names imported from ``scoring.score``."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from scoring.score import (
    ObjectiveScorerMetrics,
    PlagiarismScorer,
    RegistryUpdateBehavior,
    ScorerEvalDatasetFiles,
    SubStringScorer,
    get_all_objective_metrics,
)

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"


@pytest.fixture
def evals(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    (tmp_path / "sample").mkdir()
    shutil.copy(DATA / "refusal_objective.csv", tmp_path / "sample" / "mini_refusal.csv")
    monkeypatch.setenv("TOOLWITNESS_SCORER_EVALS_PATH", str(tmp_path))  # relative paths resolve here
    monkeypatch.setenv("TOOLWITNESS_EVAL_REGISTRY", str(tmp_path / "shared.jsonl"))
    return tmp_path


async def test_evaluate_then_read_back_through_the_scorer(evals: Path) -> None:
    scorer = SubStringScorer(substring="can't")
    assert scorer.get_scorer_metrics() is None  # nothing stored yet
    scorer.evaluation_file_mapping = ScorerEvalDatasetFiles(
        human_labeled_datasets_files=["sample/mini_refusal.csv"], result_file="sample/test_refusal_metrics.jsonl"
    )
    # NEVER_UPDATE (the seed's "testing only"): computed, nothing written.
    m = await scorer.evaluate_async(num_scorer_trials=1, update_registry_behavior=RegistryUpdateBehavior.NEVER_UPDATE)
    assert isinstance(m, ObjectiveScorerMetrics) and m.num_responses > 0 and 0.0 <= m.accuracy <= 1.0
    assert not (evals / "sample" / "test_refusal_metrics.jsonl").exists()
    assert scorer.get_scorer_metrics() is None

    stored = await scorer.evaluate_async(num_scorer_trials=1)  # SKIP_IF_EXISTS: nothing yet -> run, store
    assert (evals / "sample" / "test_refusal_metrics.jsonl").exists()
    again = scorer.get_scorer_metrics()
    assert again is not None and again.accuracy == stored.accuracy == m.accuracy
    # the same configuration (identity) finds them; another does not
    other = SubStringScorer(substring="won't")
    other.evaluation_file_mapping = scorer.evaluation_file_mapping
    assert other.get_scorer_metrics() is None
    # add_to_evaluation_results=False neither reads nor writes: a fresh run, registry unchanged
    before = (evals / "sample" / "test_refusal_metrics.jsonl").read_text()
    fresh = await scorer.evaluate_async(num_scorer_trials=2, add_to_evaluation_results=False)
    assert fresh.num_scorer_trials == 2
    assert (evals / "sample" / "test_refusal_metrics.jsonl").read_text() == before
    # the shared registry was never touched: every result went to the mapping's file
    assert get_all_objective_metrics() == []


async def test_missing_mapping_and_bad_files_are_named(evals: Path) -> None:
    with pytest.raises(ValueError, match=r"SubStringScorer\.evaluation_file_mapping is not set"):
        await SubStringScorer(substring="x").evaluate_async()
    with pytest.raises(TypeError, match="list of glob patterns"):
        ScorerEvalDatasetFiles(human_labeled_datasets_files="sample/mini_refusal.csv")
    with pytest.raises(ValueError, match="at least one"):
        ScorerEvalDatasetFiles(human_labeled_datasets_files=[])
    harm = PlagiarismScorer(reference_text="a b c")
    # seed 004: a harm scorer with nothing stored prints "No cached metrics found" (no error)
    assert harm.get_scorer_metrics() is None
    harm.evaluation_file_mapping = ScorerEvalDatasetFiles(
        human_labeled_datasets_files=["harm/*.csv"], harm_category="violence"
    )
    assert harm.get_scorer_metrics() is None  # the category comes from the mapping


def test_importing_scoring_score_does_not_load_the_evaluation_stack() -> None:
    code = "import sys, scoring.score; print('scoring.evaluation' in sys.modules, 'scipy' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False"]
