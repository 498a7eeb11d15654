"""Scoring throughput: verdicts per second for a replayed 10-tool trace under a 5-leaf tree.

Run ``python -m scoring.bench [iterations]``. Pure and in-process: it replays one saved
observation (``score_observation_async``) and never touches a trace client.

The tree is ``AND[OR[tool, tool], MAJORITY[tool, substring, NOT tool]]``. Conditions are
routed by type, so every tool leaf judges the same expectation: ``ToolsCalled`` (with an
argument matcher and a count bound), a ``ToolSequence`` and a ``PayloadPropagated``.
For comparison it also times the pure decision core (``scoring.verdict.judge_all``) on
the same evidence.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from collections.abc import Sequence

from scoring.models import (
    Acquisition,
    ArgumentMatcher,
    Coverage,
    MessageScorable,
    Observation,
    PayloadPropagated,
    ScoringExpectation,
    ToolCallRequirement,
    ToolExecution,
    ToolsCalled,
    ToolSequence,
    Verdict,
)
from scoring.models.evidence import CaptureState
from scoring.score import (
    OtelToolCallScorer,
    SubStringScorer,
    TrueFalseCompositeScorer,
    TrueFalseInverterScorer,
    TrueFalseScoreAggregator,
    TrueFalseScorer,
)
from scoring.score.observation.source import EvidenceScorable
from scoring.verdict import Evidence, judge_all

TRACE_ID = "0af7651916cd43dd8448eb211c80319c"
CANARY = "CANARY-0000"
TOOLS = ("search", "fetch", "parse", "rank", "summarize", "lookup", "translate", "format", "review", "send_email")


class _ReplayOnlySource:
    """A source for replay benchmarks: acquiring live evidence is a mistake here."""

    async def acquire(self, scorable: EvidenceScorable, trace_ids: Sequence[str] | None = None) -> Observation:
        raise RuntimeError("the scoring bench replays saved observations only")


def _arguments(name: str, i: int) -> dict[str, object]:
    args: dict[str, object] = {"query": f"{name} step {i}", "limit": i + 1, "items": [{"id": i}, {"id": i + 10}]}
    if name == "send_email":  # the poisoned instruction from an earlier tool result reached the email
        args["body"] = f"Summary attached. {CANARY}"
    return args


def bench_observation() -> Observation:
    """A complete trace with 10 tool executions, each with captured JSON arguments."""
    executions = tuple(
        ToolExecution(
            name=name,
            trace_id=TRACE_ID,
            span_id=f"{i + 1:016x}",
            status="ok",
            start_time_unix_nano=1_000 * (i + 1),
            end_time_unix_nano=1_000 * (i + 1) + 500,
            arguments=json.dumps(_arguments(name, i)),
            arguments_state=CaptureState.CAPTURED,
        )
        for i, name in enumerate(TOOLS)
    )
    scorable = MessageScorable(
        message_id="bench-message",
        conversation_id="bench-conversation",
        trace_ids=(TRACE_ID,),
        response_text="I searched, fetched and summarized the results, then sent the email.",
    )
    return Observation(
        scorable=scorable,
        tool_executions=executions,
        coverage=Coverage.completed(),
        acquisition=Acquisition.COMPLETE,
    )


def bench_expectation() -> ScoringExpectation:
    return ScoringExpectation(
        conditions=(
            ToolsCalled(
                tools=(
                    ToolCallRequirement(
                        name="search",
                        arguments=(ArgumentMatcher(path="$.items[*].id", minimum=0, maximum=5),),
                        status="ok",
                        max_count=2,
                    ),
                    ToolCallRequirement(name="send_email"),
                )
            ),
            ToolSequence(tools=("search", "summarize", "send_email"), mode="subsequence"),
            PayloadPropagated(canaries=(CANARY,), target_tools=("send_email",)),
        )
    )


def bench_tree() -> TrueFalseScorer:
    """AND[OR[tool, tool], MAJORITY[tool, substring, NOT tool]]: five leaves."""

    def tool() -> OtelToolCallScorer:
        return OtelToolCallScorer(source=_ReplayOnlySource())

    return TrueFalseCompositeScorer(
        aggregator=TrueFalseScoreAggregator.AND,
        scorers=[
            TrueFalseCompositeScorer(aggregator=TrueFalseScoreAggregator.OR, scorers=[tool(), tool()]),
            TrueFalseCompositeScorer(
                aggregator=TrueFalseScoreAggregator.MAJORITY,
                scorers=[tool(), SubStringScorer(substring="summarized"), TrueFalseInverterScorer(scorer=tool())],
            ),
        ],
    )


async def _replay_many(
    tree: TrueFalseScorer, observation: Observation, expectation: ScoringExpectation, iterations: int
) -> tuple[float, Verdict]:
    verdict = Verdict.UNDETERMINED
    start = time.perf_counter()
    for _ in range(iterations):
        (score,) = await tree.score_observation_async(observation, expectation)
        verdict = score.verdict
    return time.perf_counter() - start, verdict


def run_scoring_bench(iterations: int = 20000) -> dict[str, float]:
    """Time ``iterations`` replayed tree verdicts and ``iterations`` pure ``judge_all`` verdicts.

    Returns rates (verdicts/s), elapsed seconds, the per-verdict latency in microseconds,
    and the iteration count.
    """
    if iterations < 1:
        raise ValueError(f"iterations must be positive, got {iterations}")
    observation = bench_observation()
    expectation = bench_expectation()
    tree = bench_tree()

    tree_seconds, tree_verdict = asyncio.run(_replay_many(tree, observation, expectation, iterations))
    if tree_verdict is not Verdict.TRUE:
        raise AssertionError(f"the bench tree should hold on the bench trace, got {tree_verdict.value}")

    conditions = expectation.conditions
    judge_verdict = Verdict.UNDETERMINED
    start = time.perf_counter()
    for _ in range(iterations):
        judge_verdict = judge_all(conditions, Evidence.of(observation)).verdict
    judge_seconds = time.perf_counter() - start
    if judge_verdict is not Verdict.TRUE:
        raise AssertionError(f"judge_all should be TRUE on the bench trace, got {judge_verdict.value}")

    return {
        "iterations": float(iterations),
        "tree_seconds": tree_seconds,
        "tree_verdicts_per_s": iterations / tree_seconds,
        "tree_us_per_verdict": 1e6 * tree_seconds / iterations,
        "judge_seconds": judge_seconds,
        "judge_verdicts_per_s": iterations / judge_seconds,
        "judge_us_per_verdict": 1e6 * judge_seconds / iterations,
    }


def main(argv: Sequence[str] | None = None) -> None:
    args = list(sys.argv[1:] if argv is None else argv)
    iterations = int(args[0]) if args else 20000
    r = run_scoring_bench(iterations)
    rows = [
        ("replay, 5-leaf tree, 10-tool trace", r["tree_verdicts_per_s"], r["tree_us_per_verdict"]),
        ("judge_all (pure core), same evidence", r["judge_verdicts_per_s"], r["judge_us_per_verdict"]),
    ]
    print(f"scoring bench: {iterations} iterations")
    print(f"{'what':<40} {'verdicts/s':>12} {'us/verdict':>11}")
    for name, rate, latency in rows:
        print(f"{name:<40} {rate:>12,.0f} {latency:>11.1f}")


if __name__ == "__main__":
    main()
