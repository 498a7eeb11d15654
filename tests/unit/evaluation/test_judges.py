"""Self-ask judges and the OpenAI-compatible target, against a real HTTP server on 127.0.0.1."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from scoring.evaluation import (
    EvaluableScorer,
    MetricsType,
    ObjectiveScorerMetrics,
    RegistryUpdateBehavior,
    evaluate_async,
    evaluation_hash,
    is_undetermined,
    load_csv,
)
from scoring.evaluation.judges import (
    ChatTargetError,
    OpenAIChatTarget,
    RetryPolicy,
    SelfAskLikertScorer,
    SelfAskTrueFalseScorer,
    parse_judge_json,
)
from tests.unit.evaluation.fake_openai import FakeOpenAI, Reply, running_fake_openai

DATA = Path(__file__).resolve().parents[2] / "data" / "evaluation"
FAST = RetryPolicy(max_attempts=3, initial_backoff_seconds=0.01, max_backoff_seconds=0.02, jitter=0.0)


@pytest.fixture
def server() -> Iterator[FakeOpenAI]:
    with running_fake_openai() as state:
        yield state


def target(server: FakeOpenAI, **kw: Any) -> OpenAIChatTarget:
    options: dict[str, Any] = {
        "endpoint": server.endpoint,
        "model_name": "judge-model",
        "api_key": "sk-test",
        "retry": FAST,
        "timeout": 2.0,
    }
    options.update(kw)
    return OpenAIChatTarget(**options)


def true_false(t: OpenAIChatTarget) -> SelfAskTrueFalseScorer:
    return SelfAskTrueFalseScorer(
        chat_target=t, true_description="The response refuses.", false_description="The response complies."
    )


async def test_request_shape_and_true_verdict(server: FakeOpenAI) -> None:
    server.script = [Reply(content='{"score_value": "True", "rationale": "It declines."}')]
    async with target(server, temperature=0.0, max_tokens=64, json_mode=True) as t:
        scorer = true_false(t)
        scores = await scorer.score_text_async("I can't help with that.", objective="Did it refuse?")
    assert len(scores) == 1 and scores[0].get_value() is True and not is_undetermined(scores[0])
    assert scores[0].rationale == "It declines."
    (request,) = server.requests
    assert request["path"] == "/v1/chat/completions"
    assert request["headers"]["Authorization"] == "Bearer sk-test"
    assert request["headers"]["Content-Type"] == "application/json"
    body = request["body"]
    assert body["model"] == "judge-model" and body["temperature"] == 0.0 and body["max_tokens"] == 64
    assert body["response_format"] == {"type": "json_object"}
    assert "top_p" not in body
    assert [m["role"] for m in body["messages"]] == ["system", "user"]
    assert "The response refuses." in body["messages"][0]["content"]
    assert "Did it refuse?" in body["messages"][1]["content"]
    assert "I can't help with that." in body["messages"][1]["content"]


@pytest.mark.parametrize(
    "content",
    [
        "I think it is probably a refusal.",  # prose, no JSON
        '{"score_value": "maybe", "rationale": "unsure"}',  # not True/False
        '{"rationale": "forgot the value"}',
        "[true]",
        "",
    ],
)
async def test_unparseable_judge_output_is_undetermined(server: FakeOpenAI, content: str) -> None:
    server.script = [Reply(content=content)]
    async with target(server) as t:
        (score,) = await true_false(t).score_text_async("text")
    assert is_undetermined(score) and score.get_value() is None
    assert score.raw_output == content
    assert len(server.requests) == 1  # a bad answer is not retried either


async def test_fenced_json_and_lowercase_are_parsed(server: FakeOpenAI) -> None:
    server.script = [Reply(content='Here you go:\n```json\n{"score_value": "false", "rationale": "ok"}\n```')]
    async with target(server) as t:
        (score,) = await true_false(t).score_text_async("text")
    assert score.get_value() is False


async def test_retries_on_5xx_then_succeeds(server: FakeOpenAI) -> None:
    server.script = [
        Reply(status=500, raw="boom"),
        Reply(status=503, raw="busy"),
        Reply(content='{"score_value": "True"}'),
    ]
    async with target(server) as t:
        (score,) = await true_false(t).score_text_async("text")
    assert score.get_value() is True
    assert len(server.requests) == 3
    assert server.requests[0]["body"] == server.requests[2]["body"]  # the same request, re-sent


async def test_retries_exhausted_raise_retriable(server: FakeOpenAI) -> None:
    server.script = [Reply(status=502, raw="bad gateway")] * 3
    async with target(server) as t:
        with pytest.raises(ChatTargetError, match="gave up after 3") as err:
            await true_false(t).score_text_async("text")
    assert err.value.retriable and err.value.status_code == 502
    assert len(server.requests) == 3


async def test_429_is_retried_but_400_is_not(server: FakeOpenAI) -> None:
    server.script = [Reply(status=429, raw="slow down"), Reply(content='{"score_value": "True"}')]
    async with target(server) as t:
        (score,) = await true_false(t).score_text_async("text")
        assert score.get_value() is True
        server.script = [Reply(status=400, raw="bad request")]
        with pytest.raises(ChatTargetError, match="HTTP 400") as err:
            await true_false(t).score_text_async("text")
    assert not err.value.retriable
    assert len(server.requests) == 3


async def test_timeouts_are_retried(server: FakeOpenAI) -> None:
    server.script = [Reply(delay=1.0, content='{"score_value": "True"}'), Reply(content='{"score_value": "True"}')]
    async with target(server, timeout=0.2) as t:
        (score,) = await true_false(t).score_text_async("text")
    assert score.get_value() is True and len(server.requests) == 2


async def test_malformed_body_is_an_error(server: FakeOpenAI) -> None:
    server.script = [Reply(raw='{"choices": []}')]
    async with target(server) as t:
        with pytest.raises(ChatTargetError, match="malformed"):
            await true_false(t).score_text_async("text")


@pytest.mark.parametrize(
    ("content", "expected"),
    [
        ('{"score_value": "4"}', 0.75),
        ('{"score_value": 1}', 0.0),
        ('{"score_value": 5.0}', 1.0),
        ('{"score_value": "7"}', None),
        ('{"score_value": "2.5"}', None),
        ("four", None),
        ('{"score_value": true}', None),
    ],
)
async def test_likert(server: FakeOpenAI, content: str, expected: float | None) -> None:
    server.script = [Reply(content=content)]
    async with target(server) as t:
        scorer = SelfAskLikertScorer(chat_target=t, category="violence")
        (score,) = await scorer.score_text_async("text")
    assert score.get_value() == expected
    assert is_undetermined(score) is (expected is None)
    assert "violence" in server.requests[0]["body"]["messages"][0]["content"]


async def test_judges_are_evaluable_and_identities_are_behavioural(server: FakeOpenAI) -> None:
    async with target(server) as a, target(server, endpoint="http://127.0.0.1:1") as b:
        scorers: list[EvaluableScorer] = [true_false(a), SelfAskLikertScorer(chat_target=a)]
        assert all(isinstance(s, EvaluableScorer) for s in scorers)
        ident = true_false(a).get_identifier()
        assert ident.class_name == "SelfAskTrueFalseScorer"
        child = ident.get_child("prompt_target")
        assert child is not None and child.params["model_name"] == "judge-model"  # type: ignore[attr-defined]
        # same judge on another endpoint: same evaluation hash, different identity hash
        assert evaluation_hash(true_false(b).get_identifier()) == evaluation_hash(ident)
        assert true_false(b).get_identifier().hash != ident.hash
        async with target(server, temperature=0.9) as hot:
            assert evaluation_hash(true_false(hot).get_identifier()) != evaluation_hash(ident)


async def test_evaluate_a_judge_end_to_end(server: FakeOpenAI, tmp_path: Path) -> None:
    def answer(body: dict[str, Any]) -> Reply:
        text = body["messages"][1]["content"]
        if "sorry" in text:
            return Reply(content="I'd rather not say.")  # unparseable → UNDETERMINED
        refused = "can't" in text or "won't" in text or "not able" in text
        return Reply(content=json.dumps({"score_value": str(refused), "rationale": "keyword"}))

    server.default = answer
    dataset = load_csv(DATA / "refusal_objective.csv", MetricsType.OBJECTIVE)
    async with target(server) as t:
        m = await evaluate_async(
            true_false(t),
            dataset,
            num_scorer_trials=1,
            max_concurrency=4,
            update_registry_behavior=RegistryUpdateBehavior.NEVER_UPDATE,
            registry_path=tmp_path / "r.jsonl",
        )
    assert isinstance(m, ObjectiveScorerMetrics)
    assert len(server.requests) == 10
    assert m.num_undetermined_responses == 1 and m.accuracy == 1.0


def test_parse_judge_json() -> None:
    assert parse_judge_json('x {"a": 1} y {"b": 2}') == {"a": 1}
    assert parse_judge_json('{broken {"a": 2}') == {"a": 2}
    assert parse_judge_json("no json") is None


def test_retry_policy() -> None:
    policy = RetryPolicy(initial_backoff_seconds=0.5, multiplier=2.0, max_backoff_seconds=1.5, jitter=0.0)
    assert [policy.backoff_seconds(n) for n in (1, 2, 3, 4)] == [0.5, 1.0, 1.5, 1.5]
    assert policy.is_retriable_status(500) and policy.is_retriable_status(429)
    assert not policy.is_retriable_status(404)
    with pytest.raises(ValueError):
        RetryPolicy(max_attempts=0)


async def test_aclose_is_idempotent(server: FakeOpenAI) -> None:
    t = target(server)
    await t.aclose()
    await t.aclose()
    with pytest.raises(ChatTargetError, match="closed"):
        await t.complete_async([])
