"""Objective and harm metrics against hand-computed fixtures; degenerate cases."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pytest
from scipy import stats

from scoring.evaluation import (
    HumanLabeledDataset,
    LabeledEntry,
    MetricsType,
    RegistryUpdateBehavior,
    compute_harm_metrics,
    compute_objective_metrics,
    evaluate_async,
    krippendorff_alpha,
    one_sample_t_test,
    wilson_interval,
)
from scoring.evaluation.metrics import majority
from scoring.score import SubStringScorer

T, F = True, False


def test_majority_ties_are_false() -> None:
    assert majority([1, 1, 0]) is True
    assert majority([1, 0]) is False
    assert majority([1, 1, 0, 0]) is False
    assert majority([0]) is False


def test_objective_metrics_hand_computed() -> None:
    # gold (majority of 3 raters): T F T F T F
    human = [[1, 1, 0], [0, 0, 1], [1, 1, 1], [0, 0, 0], [1, 0, 1], [0, 1, 0]]
    trials = [
        [T, T, F, F, None, F],
        [T, F, F, F, None, T],
        [F, T, T, F, None, None],
    ]
    # predictions (majority of determined trials): T T F F <undetermined> F(tie)
    # → TP=1 (0), FP=1 (1), FN=1 (2), TN=2 (3, 5); response 4 has no determined trial.
    m = compute_objective_metrics(human, trials, dataset_name="fixture", dataset_version="1")
    assert (m.true_positive, m.false_positive, m.true_negative, m.false_negative) == (1, 1, 2, 1)
    assert m.accuracy == pytest.approx(3 / 5)
    assert m.precision == pytest.approx(1 / 2)
    assert m.recall == pytest.approx(1 / 2)
    assert m.f1_score == pytest.approx(1 / 2)
    assert m.accuracy_standard_error == pytest.approx(math.sqrt(0.6 * 0.4 / 5))
    # Wilson 95 % for 3/5 (a textbook value): [0.2307, 0.8824]
    assert m.accuracy_ci_low == pytest.approx(0.2307, abs=1e-4)
    assert m.accuracy_ci_high == pytest.approx(0.8824, abs=1e-4)
    assert m.num_responses == 6 and m.num_human_raters == 3 and m.num_scorer_trials == 3
    assert m.num_undetermined_scores == 4
    assert m.undetermined_fraction == pytest.approx(4 / 18)
    assert m.num_undetermined_responses == 1
    assert m.items is not None
    assert [it.prediction for it in m.items] == [T, T, F, F, None, F]
    assert [it.gold for it in m.items] == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0]
    assert m.items[4].abs_error is None  # undetermined is not an error, and not False
    assert m.dataset_name == "fixture"


def test_undetermined_never_counts_as_false() -> None:
    # Gold is False; an undetermined scorer must not earn a true negative.
    m = compute_objective_metrics([[0], [0]], [[None, None]])
    assert m.true_negative == 0 and m.accuracy is None
    assert m.undetermined_fraction == 1.0 and m.num_undetermined_responses == 2


def test_objective_degenerate_cases() -> None:
    never_positive = compute_objective_metrics([[1], [0], [1]], [[F, F, F]])
    assert never_positive.precision == 0.0  # no positive prediction: defined as 0.0 (PyRIT)
    assert never_positive.recall == 0.0
    assert never_positive.f1_score == 0.0
    assert never_positive.accuracy == pytest.approx(1 / 3)

    no_positive_gold = compute_objective_metrics([[0], [0]], [[T, F]])
    assert no_positive_gold.recall == 0.0 and no_positive_gold.precision == 0.0

    perfect = compute_objective_metrics([[1], [0]], [[T, F]])
    assert perfect.accuracy == 1.0 and perfect.accuracy_standard_error == 0.0
    assert perfect.accuracy_ci_high == 1.0 and perfect.accuracy_ci_low == pytest.approx(0.3424, abs=1e-4)

    nothing_decided = compute_objective_metrics([[1]], [[None]])
    assert nothing_decided.accuracy is None and nothing_decided.f1_score is None
    assert nothing_decided.accuracy_ci_low is None and nothing_decided.accuracy_standard_error is None


def test_wilson_interval() -> None:
    assert wilson_interval(0, 0) is None
    low, high = wilson_interval(0, 10) or (math.nan, math.nan)
    assert low == 0.0 and high == pytest.approx(0.2775, abs=1e-4)
    low, high = wilson_interval(50, 100) or (math.nan, math.nan)
    assert low == pytest.approx(0.4038, abs=1e-4) and high == pytest.approx(0.5962, abs=1e-4)


def test_shape_errors() -> None:
    with pytest.raises(ValueError, match="trial 0 has 1 values for 2 responses"):
        compute_objective_metrics([[1], [0]], [[T]])
    with pytest.raises(ValueError, match="at least one scorer trial"):
        compute_harm_metrics([[0.5]], [])


HUMAN: list[list[float]] = [
    [0.0, 0.0, 0.25],  # gold (mean, as PyRIT) 1/12, unanimous (all < 0.5)
    [0.75, 0.5, 0.25],  # gold 1/2, contested
    [1.0, 1.0, 0.75],  # gold 11/12, unanimous
    [0.25, 0.5, 0.5],  # gold 5/12, contested
]
TRIALS: list[list[float | None]] = [
    [0.0, 0.25, 0.75, 0.5],
    [0.25, 0.25, 0.75, None],
]
# model (mean of determined trials): 0.125, 0.25, 0.75, 0.5
# differences, in 24ths: +1, -6, -4, +2 → |e| = 1, 6, 4, 2 (24ths)


def test_harm_metrics_hand_computed() -> None:
    m = compute_harm_metrics(HUMAN, TRIALS, harm_category="violence", dataset_version="1.0")
    assert m.mean_absolute_error == pytest.approx(13 / 96)
    # population std of |e| (PyRIT): mean 3.25/24, squared deviations sum 14.75/576
    assert m.mae_standard_error == pytest.approx(math.sqrt(14.75 / 4) / 24 / 2)
    # constant guess = median gold (5/12 + 1/2) / 2 = 11/24 → |gold - 11/24| = 9, 1, 11, 1 (24ths)
    assert m.baseline_mean_absolute_error == pytest.approx(22 / 96)
    diffs = [1 / 24, -6 / 24, -4 / 24, 2 / 24]
    t = stats.ttest_1samp(diffs, 0)
    assert m.t_statistic == pytest.approx(t.statistic) and m.t_statistic == pytest.approx(-0.906, abs=1e-3)
    assert m.p_value == pytest.approx(t.pvalue)
    assert m.contested_threshold == 0.5
    assert (m.num_unanimous_responses, m.num_contested_responses) == (2, 2)
    assert m.mean_absolute_error_unanimous == pytest.approx((1 + 4) / 24 / 2)
    assert m.mean_absolute_error_contested == pytest.approx((6 + 2) / 24 / 2)
    assert m.num_undetermined_scores == 1 and m.undetermined_fraction == pytest.approx(1 / 8)
    assert m.num_undetermined_responses == 0
    assert m.items is not None and [it.prediction for it in m.items] == [0.125, 0.25, 0.75, 0.5]
    assert [it.gold for it in m.items] == pytest.approx([1 / 12, 1 / 2, 11 / 12, 5 / 12])
    assert [it.contested for it in m.items] == [False, True, False, True]
    assert m.harm_category == "violence" and m.krippendorff_level == "ordinal"


def test_harm_gold_and_prediction_are_means_as_pyrit() -> None:
    # PyRIT's HarmScorerEvaluator: gold = mean of the human scores, model = mean of the trials.
    # Three raters 0, 0, 0.75 and trials 0, 0.75: mean gold 0.25, mean prediction 0.375 (a
    # median would say 0 and 0.375).
    m = compute_harm_metrics([[0.0, 0.0, 0.75]], [[0.0], [0.75]])
    assert m.items is not None and (m.items[0].gold, m.items[0].prediction) == (0.25, 0.375)
    assert m.mean_absolute_error == pytest.approx(0.125)


def test_harm_alphas_use_all_rows_with_undetermined_missing() -> None:
    m = compute_harm_metrics(HUMAN, TRIALS)
    humans = np.array(HUMAN).T
    model = np.array([[np.nan if v is None else v for v in t] for t in TRIALS])
    assert m.krippendorff_alpha_humans == pytest.approx(krippendorff_alpha(humans, "ordinal"))
    assert m.krippendorff_alpha_model == pytest.approx(krippendorff_alpha(model, "ordinal"))
    assert m.krippendorff_alpha_combined == pytest.approx(krippendorff_alpha(np.vstack([humans, model]), "ordinal"))
    interval = compute_harm_metrics(HUMAN, TRIALS, alpha_level="interval")
    assert interval.krippendorff_alpha_humans == pytest.approx(krippendorff_alpha(humans, "interval"))
    assert interval.krippendorff_level == "interval"


def test_single_rater_single_trial() -> None:
    m = compute_harm_metrics([[0.0], [0.5], [1.0]], [[0.25, 0.5, 0.75]])
    assert m.krippendorff_alpha_humans is None  # one rater
    assert m.krippendorff_alpha_model is None  # one trial
    assert m.krippendorff_alpha_combined is not None
    assert m.contested_threshold is None
    assert m.num_unanimous_responses is None and m.num_contested_responses is None
    assert m.mean_absolute_error_unanimous is None and m.mean_absolute_error_contested is None


def test_harm_response_without_determined_trial_is_left_out() -> None:
    m = compute_harm_metrics([[0.0, 0.0], [1.0, 1.0]], [[None, 1.0], [None, 0.5]])
    assert m.num_undetermined_responses == 1
    assert m.mean_absolute_error == pytest.approx(0.25)  # only response 1: mean(1.0, 0.5) = 0.75
    assert m.num_unanimous_responses == 1 and m.mean_absolute_error_contested is None
    assert m.t_statistic is None and m.p_value is None  # one difference


def test_t_test_matches_scipy() -> None:
    rng = np.random.default_rng(7)
    for _ in range(50):
        d = rng.normal(loc=rng.uniform(-0.3, 0.3), scale=rng.uniform(0.01, 0.5), size=int(rng.integers(2, 60)))
        expected = stats.ttest_1samp(d, 0.0)
        t, p = one_sample_t_test(list(d))
        assert t == pytest.approx(float(expected.statistic), rel=1e-12)
        assert p == pytest.approx(float(expected.pvalue), rel=1e-12)


def test_t_test_degenerate_cases() -> None:
    assert one_sample_t_test([]) == (None, None)
    assert one_sample_t_test([0.3]) == (None, None)  # n < 2
    assert one_sample_t_test([0.0, 0.0, 0.0]) == (0.0, 1.0)  # perfect agreement (PyRIT)
    assert one_sample_t_test([0.25, 0.25, 0.25]) == (None, None)  # constant bias: zero variance


def test_perfect_harm_scorer() -> None:
    m = compute_harm_metrics([[0.0], [0.5], [1.0]], [[0.0, 0.5, 1.0]])
    assert m.mean_absolute_error == 0.0 and m.mae_standard_error == 0.0
    assert (m.t_statistic, m.p_value) == (0.0, 1.0)
    assert m.krippendorff_alpha_combined == 1.0


def test_to_dict_drops_in_memory_fields_and_non_finite() -> None:
    m = compute_harm_metrics(HUMAN, TRIALS)
    m.average_score_time_seconds = math.nan
    data = m.to_dict()
    assert "items" not in data and "source" not in data
    assert data["average_score_time_seconds"] is None
    assert data["mean_absolute_error"] == pytest.approx(13 / 96)


# --- labels that would skew a metric are refused, wherever they come from ------------------------


@pytest.mark.parametrize(
    ("human", "trials", "match"),
    [
        ([[math.nan], [0.0]], [[False, False]], "human score 0 is nan, not a number"),
        ([[None], [0.0]], [[False, False]], "human score 0 is None, not a number"),
        ([[0.3], [0.0]], [[False, False]], "objective labels are 0 or 1"),
        ([[1.0], [0.0]], [[0.2, False]], r"0.2 is not True, False or None"),
        ([], [[]], "at least one human-labelled response"),
    ],
)
def test_objective_metrics_refuse_labels_that_are_not_0_or_1(human: list[Any], trials: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_objective_metrics(human, trials)


@pytest.mark.parametrize(
    ("human", "trials", "match"),
    [
        ([[math.nan, 0.5], [0.25, 0.25]], [[0.5, 0.25]], "human score 0 is nan"),
        ([[3.0], [0.25]], [[0.5, 0.25]], r"human score 0 is 3.0, outside \[0, 1\]"),
        ([[0.5], [0.25]], [[1.5, 0.25]], r"1.5 is not a score in \[0, 1\]"),
        ([[0.5], [0.25]], [[math.nan, 0.25]], r"nan is not a score in \[0, 1\]"),
    ],
)
def test_harm_metrics_refuse_labels_outside_0_1(human: list[Any], trials: list[Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        compute_harm_metrics(human, trials)


async def test_an_in_memory_dataset_with_a_nan_label_is_refused_not_counted_true() -> None:
    ds = HumanLabeledDataset(
        name="x",
        metrics_type=MetricsType.OBJECTIVE,
        version="1",
        entries=(LabeledEntry(assistant_response="hello", human_scores=(math.nan,), objective="q"),),
    )
    with pytest.raises(ValueError, match="human score 0 is nan"):
        await evaluate_async(
            SubStringScorer(substring="zzz"),
            ds,
            num_scorer_trials=1,
            update_registry_behavior=RegistryUpdateBehavior.NEVER_UPDATE,
        )
