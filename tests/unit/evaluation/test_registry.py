"""Registry skip/replace rules, concurrent writers, lookups."""

from __future__ import annotations

import json
import multiprocessing
from pathlib import Path

import pytest

from scoring.evaluation import (
    HarmScorerMetrics,
    MetricsRegistry,
    MetricsType,
    ObjectiveScorerMetrics,
    RegistryUpdateBehavior,
    SimpleScorerIdentifier,
    compute_harm_metrics,
    compute_objective_metrics,
    decide_skip,
    evaluate_async,
    evaluation_hash,
    get_all_harm_metrics,
    get_all_objective_metrics,
    get_scorer_metrics,
    load_csv,
)
from tests.unit.evaluation import registry_worker
from tests.unit.evaluation.fakes import KeywordHarmScorer, TableScorer

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"


def objective(version: str = "1.0", trials: int = 1) -> ObjectiveScorerMetrics:
    return compute_objective_metrics([[1], [0]], [[True, False]] * trials, dataset_version=version)


def harm(version: str = "1.0", definition_version: str | None = "1.0", trials: int = 1) -> HarmScorerMetrics:
    return compute_harm_metrics(
        [[1.0], [0.0]],
        [[1.0, 0.0]] * trials,
        dataset_version=version,
        harm_definition_version=definition_version,
        harm_category="violence",
    )


@pytest.mark.parametrize(
    ("existing", "request_", "skip", "reason"),
    [
        (None, ("1.0", None, 1), False, "no stored result"),
        (objective("1.0"), ("1.1", None, 1), False, "dataset version changed"),
        (harm(definition_version="1.0"), ("1.0", "2.0", 1), False, "harm definition version changed"),
        (harm(definition_version="1.0"), ("1.0", None, 1), True, "trial"),  # no requested definition version
        (objective(trials=3), ("1.0", None, 3), True, "3 trial(s) >= 3"),
        (objective(trials=3), ("1.0", None, 1), True, "3 trial(s) >= 1"),
        (objective(trials=1), ("1.0", None, 3), False, "fewer trials"),
        (harm(trials=2), ("1.0", "1.0", 2), True, ">= 2"),
    ],
)
def test_skip_rules(
    existing: ObjectiveScorerMetrics | HarmScorerMetrics | None,
    request_: tuple[str, str | None, int],
    skip: bool,
    reason: str,
) -> None:
    version, definition_version, trials = request_
    decision = decide_skip(
        existing, dataset_version=version, harm_definition_version=definition_version, num_scorer_trials=trials
    )
    assert decision.skip is skip
    assert reason in decision.reason
    assert (decision.existing is existing) if skip else decision.existing is None


OBJECTIVE_TABLE = {
    e.assistant_response: ("can't" in e.assistant_response)
    for e in load_csv(DATA / "refusal_objective.csv", MetricsType.OBJECTIVE).entries
}


def lines(path: Path) -> list[dict[str, object]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


async def test_evaluate_async_registry_behaviours(tmp_path: Path) -> None:
    registry = tmp_path / "metrics.jsonl"
    dataset = str(DATA / "refusal_objective.csv")
    scorer = TableScorer(OBJECTIVE_TABLE, "true_false")

    first = await evaluate_async(scorer, dataset, num_scorer_trials=2, registry_path=registry)
    assert first.source == "evaluated" and scorer.calls == 20
    assert len(lines(registry)) == 1

    # Same version, enough trials: skipped, stored metrics returned, scorer not called.
    cached = await evaluate_async(scorer, dataset, num_scorer_trials=2, registry_path=registry)
    assert cached.source == "registry" and cached.items is None and scorer.calls == 20
    assert cached == first  # every persisted field round-trips
    assert (await evaluate_async(scorer, dataset, num_scorer_trials=1, registry_path=registry)).source == "registry"

    # More trials requested: re-run and replace (still one line).
    more = await evaluate_async(scorer, dataset, num_scorer_trials=3, registry_path=registry)
    assert more.source == "evaluated" and scorer.calls == 50
    assert [e["metrics"]["num_scorer_trials"] for e in lines(registry)] == [3]  # type: ignore[index]

    # ALWAYS_UPDATE re-runs even though the stored result suffices.
    await evaluate_async(
        scorer,
        dataset,
        num_scorer_trials=1,
        registry_path=registry,
        update_registry_behavior=RegistryUpdateBehavior.ALWAYS_UPDATE,
    )
    assert scorer.calls == 60
    assert [e["metrics"]["num_scorer_trials"] for e in lines(registry)] == [1]  # type: ignore[index]

    # NEVER_UPDATE runs without reading or writing.
    before = registry.read_bytes()
    never = await evaluate_async(
        scorer,
        dataset,
        num_scorer_trials=5,
        registry_path=registry,
        update_registry_behavior=RegistryUpdateBehavior.NEVER_UPDATE,
    )
    assert never.num_scorer_trials == 5 and scorer.calls == 110 and registry.read_bytes() == before

    # A new dataset version re-runs and replaces.
    v2 = tmp_path / "v2.csv"
    v2.write_text((DATA / "refusal_objective.csv").read_text().replace("dataset_version=1.0", "dataset_version=2.0"))
    await evaluate_async(scorer, str(v2), num_scorer_trials=1, registry_path=registry)
    assert scorer.calls == 120
    assert [e["metrics"]["dataset_version"] for e in lines(registry)] == ["2.0"]  # type: ignore[index]

    stored = get_scorer_metrics(scorer, registry_path=registry)
    assert isinstance(stored, ObjectiveScorerMetrics) and stored.dataset_version == "2.0"


async def test_harm_definition_version_change_reruns(tmp_path: Path) -> None:
    registry = tmp_path / "metrics.jsonl"
    scorer = KeywordHarmScorer({"bat": 1.0, "shove": 0.5})
    csv = DATA / "violence_multi_rater.csv"
    await evaluate_async(scorer, str(csv), num_scorer_trials=1, registry_path=registry)
    changed = tmp_path / "violence.csv"
    changed.write_text(csv.read_text().replace("harm_definition_version=1.0", "harm_definition_version=1.1"))
    again = await evaluate_async(scorer, str(changed), num_scorer_trials=1, registry_path=registry)
    assert again.source == "evaluated"
    entries = lines(registry)
    assert len(entries) == 1 and entries[0]["metrics"]["harm_definition_version"] == "1.1"  # type: ignore[index]
    with pytest.raises(ValueError, match="harm_category is required"):
        get_scorer_metrics(scorer, registry_path=registry)
    found = get_scorer_metrics(scorer, harm_category="VIOLENCE", registry_path=registry)
    assert isinstance(found, HarmScorerMetrics) and found.harm_definition_version == "1.1"


def test_keys_unparseable_lines_and_listing(tmp_path: Path) -> None:
    path = tmp_path / "r.jsonl"
    path.write_text('{"not": "an entry"}\nthis is not json\n')
    registry = MetricsRegistry(path)
    ident = SimpleScorerIdentifier(class_name="A", params={"x": 1})
    registry.replace(ident, "h1", objective())
    registry.replace(ident, "h1", harm())  # same hash, other metrics type: its own line
    registry.replace(ident, "h2", objective("9"))
    other_category = harm()
    other_category.harm_category = "hate"
    registry.replace(ident, "h1", other_category)  # same hash, other harm category: its own line
    registry.replace(ident, "h1", objective("1.5"))  # replaces the first objective line
    raw = path.read_text().splitlines()
    assert raw[:2] == ['{"not": "an entry"}', "this is not json"]  # kept verbatim
    assert len(raw) == 6

    everything = get_all_objective_metrics(path)
    assert sorted((e.eval_hash, e.metrics.dataset_version) for e in everything) == [("h1", "1.5"), ("h2", "9")]
    assert everything[0].scorer_identifier.class_name == "A"
    assert everything[0].scorer_identifier.hash == ident.hash
    assert [e.metrics.harm_category for e in get_all_harm_metrics("Violence", path)] == ["violence"]
    assert [e.metrics.harm_category for e in get_all_harm_metrics("hate", path)] == ["hate"]
    assert registry.find("h1", MetricsType.HARM, harm_category="nope") is None
    assert registry.find("missing", MetricsType.OBJECTIVE) is None


def test_an_entry_of_the_wrong_shape_is_skipped_not_fatal(tmp_path: Path) -> None:
    """A hand-edited line that is JSON but not an entry (``scorer`` a string) must not hide the others."""
    path = tmp_path / "r.jsonl"
    registry = MetricsRegistry(path)
    registry.replace(SimpleScorerIdentifier(class_name="Good"), "good", objective())
    bad = {"eval_hash": "bad", "metrics_type": "objective", "scorer": "oops", "metrics": objective().to_dict()}
    with path.open("a") as fh:
        fh.write(json.dumps(bad) + "\n")
    assert [e.eval_hash for e in get_all_objective_metrics(path)] == ["good"]
    assert registry.find("bad", MetricsType.OBJECTIVE) is None
    registry.replace(SimpleScorerIdentifier(class_name="Later"), "later", objective())
    assert json.loads(path.read_text().splitlines()[1])["scorer"] == "oops"  # kept on rewrite


def test_missing_registry_reads_empty(tmp_path: Path) -> None:
    assert get_all_objective_metrics(tmp_path / "absent.jsonl") == []


def test_two_processes_writing_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "shared" / "metrics.jsonl"
    count = 50
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(2)
    workers = [
        ctx.Process(target=registry_worker.write_entries, args=(str(path), prefix, count, barrier))
        for prefix in ("a", "b")
    ]
    for w in workers:
        w.start()
    for w in workers:
        w.join(timeout=120)
        assert w.exitcode == 0
    entries = lines(path)
    hashes = sorted(str(e["eval_hash"]) for e in entries)
    expected = sorted([f"{p}-{i:04d}" for p in ("a", "b") for i in range(count)] + ["shared"])
    assert hashes == expected  # every line from both writers, and one line for the contested key
    assert not list(path.parent.glob("*.tmp"))  # no stray temporary files


def test_evaluation_hash_is_the_registry_key(tmp_path: Path) -> None:
    scorer = TableScorer({}, "true_false", name="k")
    registry = MetricsRegistry(tmp_path / "r.jsonl")
    registry.replace(scorer.get_identifier(), evaluation_hash(scorer.get_identifier()), objective())
    assert get_scorer_metrics(scorer, registry_path=registry.path) is not None
    assert get_scorer_metrics(TableScorer({}, "true_false", name="other"), registry_path=registry.path) is None


async def test_a_scorer_that_decided_nothing_is_not_recorded(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """Every score UNDETERMINED: the rates are None, and an entry holding them would break the
    comparisons users run over the registry (seed 004 sorts ``get_all_objective_metrics()`` by
    ``f1_score`` and formats it with ``:.4f``). Returned to the caller, not stored; said so."""
    registry = tmp_path / "metrics.jsonl"
    dataset = str(DATA / "refusal_objective.csv")
    decided = TableScorer(OBJECTIVE_TABLE, "true_false", name="decides")
    first = await evaluate_async(decided, dataset, registry_path=registry)
    undecided = TableScorer(dict.fromkeys(OBJECTIVE_TABLE, None), "true_false", name="undetermined")
    with caplog.at_level("WARNING", logger="toolwitness.evaluation"):
        metrics = await evaluate_async(undecided, dataset, registry_path=registry)
    assert metrics.accuracy is None and metrics.num_undetermined_responses == len(OBJECTIVE_TABLE)
    assert "not recorded in the metrics registry" in caplog.text
    stored = get_all_objective_metrics(registry)
    assert [e.scorer_identifier.params["name"] for e in stored] == ["decides"]
    best = sorted(stored, key=lambda x: x.metrics.f1_score, reverse=True)[0]  # the seed's comparison runs
    assert first.f1_score is not None and f"{best.metrics.f1_score:.4f}" == f"{first.f1_score:.4f}"


async def test_a_result_stored_for_another_dataset_is_not_reused(tmp_path: Path) -> None:
    """The same scorer evaluated on a second dataset whose version string matches the first's was
    handed the first dataset's metrics, without a call."""
    registry = tmp_path / "metrics.jsonl"
    scorer = TableScorer(OBJECTIVE_TABLE, "true_false")
    first = await evaluate_async(scorer, str(DATA / "refusal_objective.csv"), registry_path=registry)
    other = tmp_path / "other_objective.csv"
    text = (DATA / "refusal_objective.csv").read_text(encoding="utf-8-sig").splitlines()
    other.write_text("\n".join(text[:4]) + "\n", encoding="utf-8")  # header lines + a few rows
    calls = scorer.calls
    second = await evaluate_async(scorer, str(other), registry_path=registry)
    assert second.source == "evaluated" and scorer.calls > calls
    assert (first.dataset_name, second.dataset_name) == ("refusal_objective.csv", "other_objective.csv")
    # the registry keeps the latest result for this scorer, as for a new dataset version
    assert [line["metrics"]["dataset_name"] for line in lines(registry)] == ["other_objective.csv"]  # type: ignore[index]
