"""Self-ask judges inside scorer trees and attacks (seed 004, the eval config), and scorer
identities read back from their own JSON."""

from __future__ import annotations

import pytest
from pydantic import ValidationError

from scoring.score import (
    ScorerIdentifier,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
)


def test_scorer_identifier_json_round_trip() -> None:
    """``get_identifier().model_dump_json()`` includes the computed ``hash``; reading it back must
    work (nested children too), and a hash that does not match the content is refused."""
    leaf = SubStringScorer(substring="bomb")
    tree = TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND, scorers=[leaf, TrueFalseInverterScorer(scorer=leaf)]
    )
    for ident in (leaf.get_identifier(), tree.get_identifier()):
        back = ScorerIdentifier.model_validate_json(ident.model_dump_json())
        assert back == ident and back.hash == ident.hash
        assert ScorerIdentifier.model_validate(ident.model_dump()).hash == ident.hash
    tampered = {**leaf.get_identifier().model_dump(), "hash": "0" * 64}
    with pytest.raises(ValidationError, match="does not match"):
        ScorerIdentifier.model_validate(tampered)


class _ScriptedChatTarget:
    """A chat target that answers each request with the next scripted reply."""

    def __init__(self, *replies: str) -> None:
        self._replies = list(replies)

    async def complete_async(self, messages: object) -> str:
        return self._replies.pop(0)

    def get_identifier(self) -> object:
        from scoring.evaluation.identity import SimpleScorerIdentifier

        return SimpleScorerIdentifier(class_name="ScriptedChatTarget", params={"model_name": "m", "temperature": 0.0})


async def test_wrappers_take_self_ask_judges_as_seed_004_and_the_eval_config_do() -> None:
    """Seed 004 wraps a judge directly (``TrueFalseInverterScorer(scorer=SelfAskRefusalScorer(...))``)
    and docs/evaluation.md configures ``threshold`` over a ``self_ask_likert`` judge; both crashed
    (the judge has no tree-node members: ValidationError building the identity, then no
    ``_score_async``)."""
    from scoring.evaluation.judges import SelfAskLikertScorer, SelfAskTrueFalseScorer
    from scoring.models import ScoreStatus
    from scoring.score import FloatScaleThresholdScorer, create_conversation_scorer

    judge = SelfAskTrueFalseScorer(
        chat_target=_ScriptedChatTarget('{"score_value": "True", "rationale": "refused"}', "no json"),  # type: ignore[arg-type]
        true_description="refuses",
        false_description="complies",
    )
    not_refused = TrueFalseInverterScorer(scorer=judge)  # type: ignore[arg-type]
    ident = not_refused.get_identifier()
    child = ident.get_child("scorer")
    assert child is not None and child.class_name == "SelfAskTrueFalseScorer"
    assert child.get_child("prompt_target") is not None
    first = (await not_refused.score_text_async(text="I can't help with that."))[0]
    assert first.get_value() is False and "refused" in first.rationale
    second = (await not_refused.score_text_async(text="Sure."))[0]  # unreadable judge output
    assert second.status is ScoreStatus.UNDETERMINED and second.get_value() is None

    likert = SelfAskLikertScorer(chat_target=_ScriptedChatTarget('{"score_value": 4}', '{"score_value": 2}'))  # type: ignore[arg-type]
    strict = FloatScaleThresholdScorer(scorer=likert, threshold=0.5)  # type: ignore[arg-type]
    assert (await strict.score_text_async(text="a"))[0].get_value() is True  # level 4 of 5: 0.75
    assert (await strict.score_text_async(text="b"))[0].get_value() is False  # level 2 of 5: 0.25
    assert create_conversation_scorer(scorer=judge).scorer_type == "true_false"  # type: ignore[arg-type]


async def test_eval_config_threshold_over_a_likert_judge_builds() -> None:
    """The docs/evaluation.md YAML (``violence_strict: {type: threshold, scorer: violence_judge}``)."""
    from scoring.evaluation.command import ScorerFactory, parse_definition

    definitions = {
        "violence_judge": parse_definition(
            "violence_judge",
            {"type": "self_ask_likert", "target": {"endpoint": "http://127.0.0.1:9", "model_name": "m"},
             "category": "violence"},
        ),
        "violence_strict": parse_definition(
            "violence_strict", {"type": "threshold", "scorer": "violence_judge", "threshold": 0.5}
        ),
    }
    factory = ScorerFactory(definitions)
    try:
        built = factory.build("violence_strict")
        assert built.scorer_type == "true_false"
        assert built.get_identifier().hash  # raised ValidationError before
    finally:
        await factory.aclose()


async def test_attack_takes_a_self_ask_judge_as_its_objective_scorer() -> None:
    """Seed 000: "a normal LLM objective scorer can use the same composite path"; a judge given as
    ``objective_scorer`` itself crashed (AttributeError: no ``validate``)."""
    import httpx

    from scoring.evaluation.judges import SelfAskTrueFalseScorer
    from scoring.executor.attack import AttackScoringConfig, PromptSendingAttack
    from scoring.models import AttackOutcome
    from scoring.prompt_target import HTTPTarget
    from scoring.setup import IN_MEMORY, initialize_pyrit_async

    await initialize_pyrit_async(memory_db_type=IN_MEMORY)
    target = HTTPTarget(
        http_request="POST / HTTP/1.1\nHost: local-agent.test\n\n{PROMPT}",
        transport=httpx.MockTransport(lambda request: httpx.Response(200, text="done")),
    )
    judge = SelfAskTrueFalseScorer(
        chat_target=_ScriptedChatTarget('{"score_value": "True", "rationale": "met"}'),  # type: ignore[arg-type]
        true_description="the objective is met",
        false_description="it is not",
    )
    attack = PromptSendingAttack(
        objective_target=target, attack_scoring_config=AttackScoringConfig(objective_scorer=judge)  # type: ignore[arg-type]
    )
    result = await attack.execute_async(objective="say done")
    assert result.outcome is AttackOutcome.SUCCESS
    assert result.automated_score is not None and result.automated_score.rationale == "met"
