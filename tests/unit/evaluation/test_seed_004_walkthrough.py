"""Seed 004 ("Scorer Metrics") run end to end: its code cells, extracted from the seed text, with
only ``pyrit`` → ``scoring`` in the import lines, in-process, against a real OpenAI-compatible
HTTP server on 127.0.0.1 that the judges reach through ``OPENAI_CHAT_ENDPOINT``.

The cells are ``tests/data/seeds/004_code_cells.txt``: the seed's code cells as ``code_cells``
extracts them from ``shared/seeds/004_16ab1407f6d51a37.txt`` (the seeds are not part of this
repository). With ``TOOLWITNESS_SEEDS_DIR`` pointing at the seeds, a test checks that copy
against the seed itself.

The seed assumes a metrics registry already holding the PyRIT team's results (its cells print
"Found 24 scorer configurations" and take ``max()`` over them); here two refusal
configurations (a refusal judge, and an inverter over one) and one violence configuration are
evaluated into a fresh registry first, on
other model names than the seed's own judges use, so those still print "No cached metrics".
"""

from __future__ import annotations

import csv
import io
import json
import os
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.unit.evaluation.fake_openai import FakeOpenAI, Reply, running_fake_openai
from tests.unit.seed_cells import code_cells, run_cells, to_scoring_imports

SEED_NAME = "004_16ab1407f6d51a37.txt"
CELLS_FILE = Path(__file__).resolve().parents[2] / "data" / "seeds" / "004_code_cells.txt"
CELL_MARK = "# ---- cell ----\n"
REFUSAL_MARKERS = ("can't", "cannot", "won't", "not able to")
MODEL = "fake-judge"
KEY = "sk-fake-judge"


def judge_reply(body: dict[str, Any]) -> Reply:
    """A deterministic judge: refusal = a refusal phrase in the response; Likert level 1 for a
    refusal, 5 for withheld harmful text, else 3."""
    system = body["messages"][0]["content"]
    response = body["messages"][-1]["content"].split("Response to evaluate:\n", 1)[-1]
    refused = any(marker in response for marker in REFUSAL_MARKERS)
    if "is a refusal" in system:
        return Reply(content=json.dumps({"score_value": str(refused), "rationale": f"refusal phrase: {refused}"}))
    level = 1 if refused else 5 if "withheld" in response else 3
    return Reply(content=json.dumps({"score_value": str(level), "rationale": f"level {level}"}))


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as state:
        state.default = judge_reply
        yield state


@pytest.fixture
def seed_env(server: FakeOpenAI, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("OPENAI_CHAT_ENDPOINT", server.endpoint)
    monkeypatch.setenv("OPENAI_CHAT_MODEL", MODEL)
    monkeypatch.setenv("OPENAI_CHAT_KEY", KEY)
    for name in ("AZURE_OPENAI_GPT4O_ENDPOINT", "AZURE_OPENAI_GPT4O_MODEL"):  # the seed's; unset → the above
        monkeypatch.delenv(name, raising=False)
    evals = tmp_path / "evals"  # empty: the seed's dataset paths come from the bundled datasets
    evals.mkdir()
    monkeypatch.setenv("TOOLWITNESS_SCORER_EVALS_PATH", str(evals))
    monkeypatch.setenv("TOOLWITNESS_EVAL_REGISTRY", str(tmp_path / "registry.jsonl"))
    return tmp_path


async def _fill_registry(evals: Path) -> None:
    """What the seed's registry already holds in PyRIT: results of other configurations."""
    from scoring.prompt_target import OpenAIChatTarget
    from scoring.score import (
        LikertScalePaths,
        ScorerEvalDatasetFiles,
        SelfAskLikertScorer,
        SelfAskRefusalScorer,
        TrueFalseInverterScorer,
    )
    from scoring.score.evaluable import BUNDLED_SCORER_EVALS_PATH

    refusal = SelfAskRefusalScorer(chat_target=OpenAIChatTarget(model_name="judge-a"))
    refusal.evaluation_file_mapping = ScorerEvalDatasetFiles(human_labeled_datasets_files=["sample/mini_refusal.csv"])
    await refusal.evaluate_async(num_scorer_trials=1)
    # "not a refusal" scored against labels of "the objective was attempted" (the refusal labels
    # flipped), from the scorer-evals directory rather than the bundled datasets
    bundled = (BUNDLED_SCORER_EVALS_PATH / "sample" / "mini_refusal.csv").read_text(encoding="utf-8")
    rows = list(csv.reader(io.StringIO(bundled.split("\n", 1)[1])))
    flipped = io.StringIO()
    writer = csv.writer(flipped, lineterminator="\n")
    writer.writerow(rows[0])
    writer.writerows([objective, response, str(1 - int(label)), kind] for objective, response, label, kind in rows[1:])
    (evals / "objective").mkdir()
    (evals / "objective" / "mini_attempted.csv").write_text("# dataset_version=1.0\n" + flipped.getvalue())
    attempted = TrueFalseInverterScorer(
        scorer=SelfAskRefusalScorer(chat_target=OpenAIChatTarget(model_name="judge-b", temperature=0.7))
    )
    attempted.evaluation_file_mapping = ScorerEvalDatasetFiles(
        human_labeled_datasets_files=["objective/mini_attempted.csv"]
    )
    await attempted.evaluate_async(num_scorer_trials=1)
    violence = SelfAskLikertScorer.from_likert_scale(
        chat_target=OpenAIChatTarget(model_name="judge-a"), likert_scale=LikertScalePaths.VIOLENCE_SCALE.load()
    )
    await violence.evaluate_async(num_scorer_trials=1)


def original_cells() -> list[str]:
    """The seed's cells as written (``pyrit`` imports), from the copy kept with the tests."""
    text = CELLS_FILE.read_text(encoding="utf-8")
    return [cell.rstrip("\n") for cell in text.split(CELL_MARK)[1:]]


def seed_cells() -> list[str]:
    return [to_scoring_imports(cell) for cell in original_cells()]


@pytest.mark.skipif(not os.environ.get("TOOLWITNESS_SEEDS_DIR"), reason="TOOLWITNESS_SEEDS_DIR (the seeds) not set")
def test_the_kept_cells_are_the_seeds() -> None:
    seed = Path(os.environ["TOOLWITNESS_SEEDS_DIR"]) / SEED_NAME
    assert original_cells() == code_cells(seed.read_text(encoding="utf-8"))


def test_the_seed_has_seven_code_cells_and_only_their_imports_change() -> None:
    original = original_cells()
    assert len(original) == 7
    assert original[0].startswith("from pyrit.prompt_target import OpenAIChatTarget")
    assert "await likert_scorer.evaluate_async(" in original[-1]
    assert not any("scorer.evaluation_file_mapping = ScorerEvalDatasetFiles(\n    # Glob" in c for c in original)
    for before, after in zip(original, seed_cells(), strict=True):
        changed = [(a, b) for a, b in zip(before.splitlines(), after.splitlines(), strict=True) if a != b]
        assert changed and all(
            re.fullmatch(r"(from|import) pyrit\b.*", a) and b == a.replace("pyrit", "scoring", 1) for a, b in changed
        )


async def test_seed_004_cells_run_with_scoring_imports(
    seed_env: Path, server: FakeOpenAI, capsys: pytest.CaptureFixture[str]
) -> None:
    await _fill_registry(seed_env / "evals")
    registry = seed_env / "registry.jsonl"
    stored = registry.read_bytes()
    before = len(server.requests)
    capsys.readouterr()

    await run_cells(seed_cells(), {"__name__": "__seed_004__"}, name="seed 004")
    out = capsys.readouterr().out

    # cell 1: the refusal judge's identity
    assert "Scorer Identity:\n  Type: SelfAskRefusalScorer\n" in out
    assert re.search(r"^  System Prompt: \S.{0,49}\.\.\.$", out, re.MULTILINE)
    assert re.search(r"^  Target Info: OpenAIChatTarget::[0-9a-f]{8}$", out, re.MULTILINE)
    assert re.search(r"^  Identity Hash: [0-9a-f]{64}$", out, re.MULTILINE)
    # cells 2 and 3: the seed's own judge configurations have nothing stored
    assert out.count("No cached metrics found for this scorer configuration.") == 2
    # cell 4: the objective configurations in the registry, best first
    assert "Found 2 scorer configurations in the metrics file\n" in out
    assert "\n      • Scorer Type: SelfAskRefusalScorer\n" in out
    assert "      • Scorer Type: TrueFalseInverterScorer" in out
    assert "            • Scorer Type: SelfAskRefusalScorer" in out
    assert "• model_name: judge-a" in out and "• model_name: judge-b" in out
    assert re.search(r"^Best Accuracy:  100\.00%$", out, re.MULTILINE)
    assert re.search(r"^Fastest:        \d+\.\d{3} seconds$", out, re.MULTILINE)
    # cell 5: the violence configuration
    assert "Found 1 harm scorer configurations for violence\n" in out
    assert "      • Scorer Type: SelfAskLikertScorer" in out
    assert re.search(r"^      • Mean Absolute Error: \d\.\d{4}$", out, re.MULTILINE)
    # cell 6: the refusal judge evaluated on sample/mini_refusal.csv
    accuracy = re.search(r"^ Accuracy: (\S+)$", out, re.MULTILINE)
    assert accuracy is not None and float(accuracy.group(1)) == 1.0
    assert out.index("No cached metrics found") < accuracy.start()
    # cell 7: the exploits judge evaluated on its scale's bundled dataset
    assert 'Metrics for harm category "exploits" created' in out

    # The lines the seed printed (below its cells) that do not depend on its registry are printed
    # the same.
    for line in (
        "Scorer Identity:",
        "  Type: SelfAskRefusalScorer",
        "No cached metrics found for this scorer configuration.",
        "Top 5 configurations by F1 Score:",
        "Top configurations by Mean Absolute Error:",
        " Accuracy: 1.0",
        'Metrics for harm category "exploits" created',
    ):
        assert line in out.splitlines(), line

    # The judges called the server from the environment: 8 refusal rows, then 6 exploits rows.
    made = server.requests[before:]
    assert len(made) == 8 + 6
    assert {r["body"]["model"] for r in made} == {MODEL}
    assert {r["headers"]["Authorization"] for r in made} == {f"Bearer {KEY}"}
    assert sum("is a refusal" in r["body"]["messages"][0]["content"] for r in made) == 8
    # NEVER_UPDATE wrote nothing: not the seed's result file, not the registry
    assert not (seed_env / "evals" / "sample" / "test_refusal_metrics.jsonl").exists()
    assert registry.read_bytes() == stored
