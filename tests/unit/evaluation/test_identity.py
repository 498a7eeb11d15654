"""Evaluation hash and identity serialization."""

from __future__ import annotations

import pytest

from scoring.evaluation import SimpleScorerIdentifier, evaluation_hash, identity_to_dict


def judge(
    endpoint: str = "http://a", temperature: float = 0.0, model: str = "m1", prompt: str = "p"
) -> SimpleScorerIdentifier:
    target = SimpleScorerIdentifier(
        "OpenAIChatTarget",
        {"endpoint": endpoint, "model_name": model, "temperature": temperature, "max_tokens": None},
    )
    return SimpleScorerIdentifier("SelfAskTrueFalseScorer", {"system_prompt": prompt}, {"prompt_target": target})


def test_eval_hash_ignores_operational_target_params() -> None:
    assert evaluation_hash(judge(endpoint="http://a")) == evaluation_hash(judge(endpoint="http://b"))
    assert judge(endpoint="http://a").hash != judge(endpoint="http://b").hash  # the identity hash does not


@pytest.mark.parametrize("change", [{"temperature": 0.7}, {"model": "m2"}, {"prompt": "q"}])
def test_eval_hash_tracks_behaviour(change: dict[str, object]) -> None:
    assert evaluation_hash(judge()) != evaluation_hash(judge(**change))  # type: ignore[arg-type]


def test_non_target_children_count_fully() -> None:
    inner_a = SimpleScorerIdentifier("SubStringScorer", {"substring": "a", "endpoint": "x"})
    inner_b = SimpleScorerIdentifier("SubStringScorer", {"substring": "a", "endpoint": "y"})

    def wrap(inner: SimpleScorerIdentifier) -> SimpleScorerIdentifier:
        return SimpleScorerIdentifier("TrueFalseInverterScorer", {}, {"sub_scorers": [inner]})

    assert evaluation_hash(wrap(inner_a)) != evaluation_hash(wrap(inner_b))


def test_none_params_do_not_change_the_eval_hash() -> None:
    assert evaluation_hash(SimpleScorerIdentifier("A", {"x": 1, "y": None})) == evaluation_hash(
        SimpleScorerIdentifier("A", {"x": 1})
    )


def test_round_trip_keeps_the_reported_hash() -> None:
    original = judge()
    data = identity_to_dict(original)
    restored = SimpleScorerIdentifier.from_dict(data)
    assert restored.hash == original.hash
    assert restored.class_name == "SelfAskTrueFalseScorer"
    child = restored.get_child("prompt_target")
    assert isinstance(child, SimpleScorerIdentifier) and child.params["model_name"] == "m1"
    assert evaluation_hash(restored) == evaluation_hash(original)


def test_unhashable_param_is_rejected() -> None:
    with pytest.raises(TypeError, match="no stable JSON form"):
        _ = SimpleScorerIdentifier("A", {"x": object()}).hash
