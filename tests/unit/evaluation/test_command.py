"""`toolwitness eval` through typer's CliRunner on a tiny app built here."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

from scoring.evaluation.command import ScorerConfigError, ScorerFactory, eval_command, load_scorer_config
from tests.unit.evaluation.fakes import fake_scoring_score_module

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"

CONFIG = """\
scorers:
  refusal_keyword:
    type: substring
    substring: "can't"
    categories: [refusal]
    tags: [refusal, default]
  violence_keywords:
    type: python
    factory: "tests.unit.evaluation.fakes:KeywordHarmScorer"
    weights: {bat: 1.0, shove: 0.5, bottles: 0.5, glass: 0.25}
    tags: [harm, default]
  broken:
    type: substring
    no_such_argument: 1
"""


@pytest.fixture
def app(monkeypatch: pytest.MonkeyPatch) -> typer.Typer:
    # The real scoring.score is being written elsewhere; stand in for its SubStringScorer.
    monkeypatch.setitem(sys.modules, "scoring.score", fake_scoring_score_module())
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


def test_harm_eval_prints_the_unanimous_contested_split(app: typer.Typer, config: Path, tmp_path: Path) -> None:
    code, out = run(
        app,
        "--scorer",
        "violence_keywords",
        "--config",
        str(config),
        "--dataset",
        str(DATA / "violence_multi_rater.csv"),
        "--trials",
        "2",
    )
    assert code == 0, out
    assert "violence_keywords — KeywordHarmScorer" in out
    assert "MAE ± std. error" in out and "Baseline MAE (median guess)" in out
    assert "Krippendorff α humans (ordinal)" in out
    # 8 responses; the raters split across 0.5 on 3 of them (data rows 2, 5 and 7). Gold = mean of
    # the raters: unanimous errors 0, 1/12 (bat: 1 vs 11/12), 1/12 (crash: 0 vs 1/12), 0, 0;
    # contested 0, 0, 1/12 (glass: 0.25 vs 1/3)
    assert "Unanimous responses (MAE), threshold 0.50" in out and " 5 (0.0333) │" in out
    assert "Contested responses (MAE), threshold 0.50" in out and " 3 (0.0278) │" in out
    assert "evaluated now" in out


def test_single_rater_has_no_split(app: typer.Typer, config: Path) -> None:
    code, out = run(app, "-s", "violence_keywords", "-c", str(config), "-d", str(DATA / "violence_single*.csv"))
    assert code == 0, out
    assert "n/a (single rater)" in out


def test_objective_eval_with_registry_and_tags(app: typer.Typer, config: Path, tmp_path: Path) -> None:
    registry = tmp_path / "metrics.jsonl"
    args = [
        "--tags",
        "refusal",
        "--config",
        str(config),
        "--dataset",
        str(DATA / "refusal_*.csv"),
        "--registry",
        str(registry),
    ]
    code, out = run(app, *args)
    assert code == 0, out
    assert "refusal_keyword — SubStringScorer" in out
    assert "Accuracy ± std. error" in out and "Accuracy 95% Wilson interval" in out
    # gold (majority of 3 raters) has 5 refusals; "can't" finds 3 of them and no false positive
    assert "3 / 0 / 5 / 2" in out and "0.8000 ± 0.1265" in out
    (entry,) = [json.loads(line) for line in registry.read_text().splitlines()]
    assert entry["scorer"]["class_name"] == "SubStringScorer" and entry["metrics"]["true_positive"] == 3
    code, out = run(app, *args)  # second run: the registry already has a sufficient result
    assert code == 0 and "registry (cached; not re-run)" in out


def test_tags_can_select_both_kinds(app: typer.Typer, config: Path) -> None:
    # The refusal CSV is not a harm dataset: the harm scorer reports the error, the other still runs.
    code, out = run(app, "--tags", "default", "-c", str(config), "-d", str(DATA / "refusal_objective.csv"))
    assert code == 1
    assert "refusal_keyword — SubStringScorer" in out
    assert "violence_keywords:" in out and "harm dataset header has no harm_definition_version" in out


def test_selection_and_config_errors(app: typer.Typer, config: Path) -> None:
    code, out = run(app, "-s", "nope", "-c", str(config), "-d", "x.csv")
    assert code == 2 and "unknown scorer" in out
    code, out = run(app, "-c", str(config), "-d", "x.csv")
    assert code == 2 and "no scorer selected" in out
    code, out = run(app, "-s", "refusal_keyword", "-c", str(config), "-d", "/nonexistent/*.csv")
    assert code == 1 and "no dataset file matches" in out
    code, out = run(app, "-s", "broken", "-c", str(config), "-d", str(DATA / "refusal_objective.csv"))
    assert code == 1 and "no_such_argument" in out


def test_factory_builds_wrappers_and_judges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(
        """\
scorers:
  judge:
    type: self_ask_true_false
    target: {endpoint: "http://127.0.0.1:9", model: m, api_key_env: TW_TEST_KEY, max_attempts: 1}
    true_description: refuses
    false_description: complies
  likert:
    type: self_ask_likert
    target: {endpoint: "http://127.0.0.1:9", model_name: m}
    category: violence
  loop_a: {type: inverter, scorer: loop_b}
  loop_b: {type: inverter, scorer: loop_a}
"""
    )
    factory = ScorerFactory(load_scorer_config(path))
    with pytest.raises(ScorerConfigError, match="TW_TEST_KEY is not set"):
        factory.build("judge")
    monkeypatch.setenv("TW_TEST_KEY", "sk-x")
    assert factory.build("judge").scorer_type == "true_false"
    assert factory.build("likert").scorer_type == "float_scale"
    with pytest.raises(ScorerConfigError, match="cycle"):
        factory.build("loop_a")


def test_a_judge_target_without_endpoint_falls_back_to_the_environment(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "s.yaml"
    path.write_text("scorers:\n  likert:\n    type: self_ask_likert\n    target: {model: m}\n")
    monkeypatch.delenv("OPENAI_CHAT_ENDPOINT", raising=False)
    factory = ScorerFactory(load_scorer_config(path))
    with pytest.raises(ScorerConfigError, match=r"scorer 'likert': target: .*no endpoint.*OPENAI_CHAT_ENDPOINT"):
        factory.build("likert")
    monkeypatch.setenv("OPENAI_CHAT_ENDPOINT", "http://127.0.0.1:9")
    assert factory.build("likert").scorer_type == "float_scale"


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        ("scorers: {}\n", "non-empty `scorers:`"),
        ("scorers:\n  a: {type: magic}\n", "type must be one of"),
        ("scorers:\n  a: {type: threshold, threshold: 0.5}\n", "needs `scorer:`"),
        ("scorers:\n  a: {type: self_ask_likert}\n", "needs a `target:`"),
        ("scorers:\n  a: {type: substring, tags: refusal}\n", "tags must be a list"),
    ],
)
def test_config_validation(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ScorerConfigError, match=message):
        load_scorer_config(path)


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        # the second `refusal` silently replaced the first: the run evaluated another scorer
        ("scorers:\n  refusal: {type: substring, substring: sorry}\n  refusal: {type: substring, substring: no}\n",
         r"key scorers\.refusal is given twice \(lines 2 and 3\)"),
        ("scorers:\n  a:\n    type: substring\n    substring: x\n    substring: y\n",
         r"key scorers\.a\.substring is given twice \(lines 4 and 5\)"),
    ],
)
def test_a_key_given_twice_in_the_scorer_config_is_refused(tmp_path: Path, yaml_text: str, message: str) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(yaml_text)
    with pytest.raises(ScorerConfigError, match=message):
        load_scorer_config(path)
