"""An observation too large for one Kafka record is judged and published in a form that fits.

The producer refuses records over 1 MiB; a retriable refusal would stall the partition for good
(the decision is stored, every replay and sweep fails the same way). 1,000 executions with
1,024-byte arguments (both default limits) make a 1.16 MB observation. The decision step now
judges and publishes a smaller one: arguments cut (TRUNCATED), else no executions
(limit_exceeded) -- and the verdict is always what that published evidence gives on replay.
"""

from __future__ import annotations

import json
import time
from typing import Any

import pytest

from collector.config import ServiceConfig
from collector.pipeline.engine import Engine, Work
from collector.processors.normalize import pack_tool
from collector.processors.trace_state import TraceState
from collector.wire.convert import RegisteredExpectation, decode_observation, encode, observation_from_proto
from scoring.models import (
    ArgumentMatcher,
    CaptureState,
    ScoringExpectation,
    ToolCallRequirement,
    ToolsCalled,
    TraceScorable,
    Verdict,
)
from scoring.models.evidence import LIMIT_EXCEEDED
from scoring.score import OtelToolCallScorer
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource

TENANT, TRACE = "default", "0af7651916cd43dd8448eb211c80319c"


class _NoStore:
    async def load_states(self, keys: Any) -> dict[Any, Any]:
        return {}


def _state(n: int, arg_chars: int) -> TraceState:
    args = json.dumps({"q": "x" * (arg_chars - 9)})
    t0 = 1_700_000_000_000_000_000
    xs = [
        pack_tool(f"{i:011d}", "search" if i % 2 else "fetch", False, t0 + i * 1000, t0 + i * 1000 + 500,
                  CaptureState.CAPTURED, args, None, False)
        for i in range(n)
    ]
    return TraceState(span_count=n, executions=xs, marker_count=n)


def _expect(ident: str, req: ToolCallRequirement) -> RegisteredExpectation:
    now = int(time.time() * 1000)
    return RegisteredExpectation(ident, TENANT, TraceScorable(trace_ids=(TRACE,)), "tools",
                                 ScoringExpectation(conditions=(ToolsCalled(tools=(req,)),)), now + 60_000, now)


async def _decide(fmt: str, n: int, arg_chars: int, *exps: RegisteredExpectation, final: bool = False) -> list[Any]:
    cfg = ServiceConfig.model_validate({"kafka": {"output_format": fmt}})
    engine = Engine(cfg, _NoStore(), None)  # type: ignore[arg-type]
    work = Work()
    for e in exps:
        engine.remember(e)
        work.add(TENANT, [e.expectation_id], "span")
        if final:
            work.final.add((TENANT, e.expectation_id))
    work.states[(TENANT, TRACE)] = _state(n, arg_chars)
    return await engine.evaluate(work, 0)


async def _replayed(observation_bytes: bytes, exp: RegisteredExpectation) -> Verdict:
    obs = observation_from_proto(decode_observation(observation_bytes))
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=InMemoryTraceClient()))
    (score,) = await scorer.score_observation_async(observation=obs, expectation=exp.expectation)
    return score.verdict


@pytest.mark.parametrize("fmt", ["protobuf", "json"])
async def test_arguments_are_cut_to_fit_and_the_verdict_is_the_published_evidences(fmt: str) -> None:
    ran = _expect("ran", ToolCallRequirement(name="search"))
    args = _expect("args", ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex="^x+$"),)))
    budget = ServiceConfig().limits.max_observation_bytes
    (out,) = await _decide(fmt, 1000, 1024, ran, args)  # args: UNDETERMINED on cut arguments, not final
    assert out.expectation.expectation_id == "ran" and out.verdict is Verdict.TRUE
    body = encode(out.observation, fmt)
    assert len(body) <= budget  # the uncut observation is over 1 MB
    obs = observation_from_proto(decode_observation(body))
    assert len(obs.tool_executions) == 1000  # every execution kept: absence stays provable
    assert {e.arguments_state for e in obs.tool_executions} == {CaptureState.TRUNCATED}
    assert obs.coverage.complete
    assert await _replayed(body, ran) is Verdict.TRUE
    # At the deadline the argument condition is published UNDETERMINED, as replay gives it.
    outs = {o.expectation.expectation_id: o for o in await _decide(fmt, 1000, 1024, args, final=True)}
    assert outs["args"].verdict is Verdict.UNDETERMINED
    assert await _replayed(encode(outs["args"].observation, fmt), args) is Verdict.UNDETERMINED


async def test_small_observations_are_untouched() -> None:
    args = _expect("args", ToolCallRequirement(name="search", arguments=(ArgumentMatcher(path="$.q", regex="^x+$"),)))
    (out,) = await _decide("protobuf", 10, 1024, args)
    assert out.verdict is Verdict.TRUE  # judged on the full arguments
    obs = observation_from_proto(decode_observation(encode(out.observation, "protobuf")))
    assert {e.arguments_state for e in obs.tool_executions} == {CaptureState.CAPTURED}


async def test_too_many_executions_publish_none_and_never_a_negative() -> None:
    ran = _expect("ran", ToolCallRequirement(name="search"))
    never = _expect("absent", ToolCallRequirement(name="delete_everything"))
    outs = {o.expectation.expectation_id: o for o in await _decide("protobuf", 20_000, 16, ran, never, final=True)}
    for ident in ("ran", "absent"):
        body = encode(outs[ident].observation, "protobuf")
        obs = observation_from_proto(decode_observation(body))
        assert obs.tool_executions == () and LIMIT_EXCEEDED in obs.coverage.reasons
        assert outs[ident].verdict is Verdict.UNDETERMINED  # neither TRUE nor a FALSE from missing evidence
        assert len(body) <= ServiceConfig().limits.max_observation_bytes


async def test_losing_to_a_false_with_contradicting_evidence_asks_for_a_revision() -> None:
    # The sweeper (or another instance) decided FALSE; before its settle, a late span was applied
    # and this batch judged TRUE: the compare-and-set is lost, and the FALSE must be revised.
    from collector.processors.trace_state import Decision

    class Store(_NoStore):
        async def decide_many(self, items: Any) -> list[Decision]:
            return [Decision(False, 1, "sid", b"ev", b"", False, "false") for _ in items]

        async def settle(self, *args: Any) -> list[tuple[str, str]]:
            return []

        async def rejudge_at(self, keys: Any, at_ms: int) -> None:
            persisted.update(keys)

        async def rearm_deadlines(self, exps: Any) -> None:
            assert not exps

    persisted: set[tuple[str, str]] = set()

    class Exporter:
        async def send_observation(self, *args: Any) -> None:
            return None

        async def send_score(self, *args: Any) -> None:
            return None

    cfg = ServiceConfig()
    engine = Engine(cfg, Store(), Exporter())  # type: ignore[arg-type]
    ran = _expect("ran", ToolCallRequirement(name="search"))
    engine.remember(ran)
    work = Work()
    work.add(TENANT, ["ran"], "span")
    work.states[(TENANT, TRACE)] = _state(2, 16)
    (out,) = await engine.evaluate(work, 0)
    assert out.verdict is Verdict.TRUE
    await engine.decide_and_send([out])
    assert engine.contradicted == {(TENANT, "ran")}
    assert persisted == {(TENANT, "ran")}  # for the sweeper too, should this process die first


@pytest.mark.parametrize("long_text", ["name", "call_id", "canary"])
def test_every_text_an_agent_writes_counts_toward_the_record_size(long_text: str) -> None:
    # Only arguments were counted: 1,000 executions with a 1,200-character tool name (or call id,
    # or delivered canary) "fit" without being encoded, made a 1.3 MB record, and the producer's
    # refusal stalled the partition. Now they do not fit, and shrink() drops the executions.
    from collector.processors.decide import Decider
    from collector.wire.convert import observation_to_proto
    from scoring.models import TraceScorable as _Trace
    from scoring.models.evidence import CaptureState, Coverage, Observation, ToolExecution

    cfg = ServiceConfig()
    decider = Decider(cfg)
    text = "f" * 1200
    executions = tuple(
        ToolExecution(
            name=text if long_text == "name" else "search",
            trace_id=TRACE,
            span_id=f"{i:016x}",
            call_id=text if long_text == "call_id" else None,
            start_time_unix_nano=i + 1,
            end_time_unix_nano=i + 2,
            arguments="{}",
            arguments_state=CaptureState.CAPTURED,
            delivered_canary=text if long_text == "canary" else None,
        )
        for i in range(1000)
    )
    o = Observation(scorable=_Trace(trace_ids=(TRACE,)), tool_executions=executions, coverage=Coverage.completed())
    assert len(encode(observation_to_proto(o), cfg.kafka.output_format)) > cfg.limits.max_observation_bytes
    assert not decider.fits(o)
    small = decider.shrink(o)
    assert decider.fits(small) and small.tool_executions == () and LIMIT_EXCEEDED in small.coverage.reasons


def test_a_canary_no_boundary_writes_is_no_delivery() -> None:
    from scoring.normalize.spans import MAX_CANARY_CHARS, span_rules

    tool = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": "fetch_page"}
    kw: dict[str, Any] = {"status_error": False, "ended": True, "sampled": True, "dropped": False}
    ok = span_rules({**tool, "toolwitness.poisoning.canary": "tw-canary-0123456789abcdef0123"}, **kw)
    assert ok.delivered == "tw-canary-0123456789abcdef0123"
    assert span_rules({**tool, "toolwitness.poisoning.canary": "x" * (MAX_CANARY_CHARS + 1)}, **kw).delivered is None
    assert span_rules({**tool, "toolwitness.poisoning.canary": 7}, **kw).delivered is None


@pytest.mark.parametrize("fmt", ["protobuf", "json"])
def test_a_scope_is_measured_as_its_record_takes_it(fmt: str) -> None:
    """``scope_record_bytes`` is the record's size: the registration check refuses on it, not on
    the bound that assumes every character escaped (six times a plain ASCII text)."""
    from collector.processors.decide import scope_bytes_bound, scope_record_bytes
    from collector.wire.convert import scope_to_proto
    from collector.wire.gen import score_pb2
    from scoring.models import MessageScorable

    plain = MessageScorable(message_id="m-1", trace_ids=(TRACE,), response_text="x" * 200_000)
    escaped = MessageScorable(message_id="m-1", trace_ids=(TRACE,), response_text="\x01" * 200_000)

    for scope in (plain, escaped):
        record = encode(score_pb2.Observation(scope=scope_to_proto(scope)), fmt)
        assert scope_record_bytes(scope, fmt) == len(record)
        assert scope_record_bytes(scope, fmt) <= scope_bytes_bound(scope)
    half = ServiceConfig().limits.max_observation_bytes // 2
    assert scope_bytes_bound(plain) > half  # the bound alone refused it
    assert 200_000 < scope_record_bytes(plain, fmt) < half  # it fits
    if fmt == "json":  # a control character is written \u0001: this one does not fit
        assert scope_record_bytes(escaped, fmt) > half
