"""The checks a conformance run is judged by, derived from what its tool bodies received.

Every expected verdict here comes from ``truth.json`` (written by the tool bodies, see
``agents/_witness.py``), never from the spans: the spans are only what toolwitness reads.
"""

from __future__ import annotations

import asyncio
import json
from collections import Counter
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from scoring.models import (
    ArgumentMatcher,
    ScoringExpectation,
    ToolCallRequirement,
    ToolsCalled,
    ToolSequence,
    TraceScorable,
)
from scoring.normalize import NeutralSpan, iter_otlp_request
from scoring.score import OtelToolCallScorer, TrueFalseInverterScorer
from scoring.score.observation import InMemoryTraceClient, OtelTraceSource

Expected = Literal["TRUE", "FALSE", "UNDETERMINED"]
#: the check categories, in the order the matrix lists them
CATEGORIES = (
    "ran",
    "open_absence",
    "absence",
    "never",
    "arguments",
    "arguments_mismatch",
    "status",
    "count",
    "sequence",
)
#: the tools every agent offers (``agents/_witness.py``)
TOOLS = ("get_weather", "book_trip", "fail_tool", "send_email")


@dataclass(frozen=True)
class Check:
    """One expectation with the verdict the ground truth calls for.

    ``complete``: judged after the trace was marked complete with its span count (else before)."""

    id: str
    category: str
    expectation: ScoringExpectation
    expected: Expected
    invert: bool = False
    complete: bool = True


@dataclass
class Run:
    """One scenario's output: its spans (as OTLP bytes and neutral spans) and its ground truth."""

    name: str
    otlp: bytes
    spans: list[NeutralSpan]
    truth: dict[str, Any]

    @property
    def trace_ids(self) -> tuple[str, ...]:
        return tuple(sorted({s.trace_id for s in self.spans}))

    def span_counts(self) -> dict[str, int]:
        return dict(Counter(s.trace_id for s in {(s.trace_id, s.span_id): s for s in self.spans}.values()))


def load_run(name: str, out: Path) -> Run:
    otlp = (out / "spans.pb").read_bytes()
    req = ExportTraceServiceRequest()
    req.ParseFromString(otlp)
    return Run(name, otlp, list(iter_otlp_request(req)), json.loads((out / "truth.json").read_text()))


def leaves(value: Any, path: str = "$") -> Iterator[tuple[str, Any]]:
    """Every scalar in a JSON value with its JSONPath (lists by index)."""
    if isinstance(value, dict):
        for k, v in value.items():
            yield from leaves(v, f"{path}.{k}" if k.isidentifier() else f"{path}['{k}']")
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from leaves(v, f"{path}[{i}]")
    else:
        yield path, value


def _expect(*conditions: Any) -> ScoringExpectation:
    return ScoringExpectation(conditions=tuple(conditions))


def _called(req: ToolCallRequirement) -> ScoringExpectation:
    return _expect(ToolsCalled(tools=(req,)))


def _is_subsequence(needle: Sequence[str], haystack: Sequence[str]) -> bool:
    it = iter(haystack)
    return all(any(x == y for y in it) for x in needle)


#: ``truth["notes"][FLATTENED]``: tools whose one parameter is an object the framework shows the
#: model as the tool's whole schema (pydantic-ai does for a model-like parameter): the call's
#: arguments, as the tool's interface has them, are that object's fields
FLATTENED = "single_object_parameter"


def _interface(call: dict[str, Any], notes: dict[str, Any]) -> dict[str, Any]:
    if call["tool"] in notes.get(FLATTENED, ()) and len(call["arguments"]) == 1:
        [inner] = call["arguments"].values()
        return {**call, "arguments": inner}
    return call


def derive_checks(truth: dict[str, Any]) -> list[Check]:
    """The checks of one run, each with the verdict what the tool bodies received calls for."""
    calls = [_interface(c, truth["notes"]) for c in sorted(truth["calls"], key=lambda c: c["at"])]
    order = [c["tool"] for c in calls]
    counts = Counter(order)
    checks: list[Check] = []
    tools = list(dict.fromkeys([*TOOLS, *order]))
    for tool in tools:
        n = counts[tool]
        if n:
            checks.append(Check(f"ran {tool}", "ran", _called(ToolCallRequirement(name=tool)), "TRUE", complete=False))
            checks.append(Check(f"ran {tool} (complete)", "ran", _called(ToolCallRequirement(name=tool)), "TRUE"))
            checks.append(
                Check(f"{tool} never ran", "never", _called(ToolCallRequirement(name=tool)), "FALSE", invert=True)
            )
            checks.append(
                Check(
                    f"{tool} ran exactly {n}x",
                    "count",
                    _called(ToolCallRequirement(name=tool, min_count=n, max_count=n)),
                    "TRUE",
                )
            )
            checks.append(
                Check(
                    f"{tool} ran at least {n + 1}x",
                    "count",
                    _called(ToolCallRequirement(name=tool, min_count=n + 1)),
                    "FALSE",
                )
            )
            raised = [c["raised"] for c in calls if c["tool"] == tool]
            if all(raised):
                checks.append(
                    Check(f"{tool} failed", "status", _called(ToolCallRequirement(name=tool, status="error")), "TRUE")
                )
                checks.append(
                    Check(f"{tool} succeeded", "status", _called(ToolCallRequirement(name=tool, status="ok")), "FALSE")
                )
            elif not any(raised):
                checks.append(
                    Check(f"{tool} succeeded", "status", _called(ToolCallRequirement(name=tool, status="ok")), "TRUE")
                )
                checks.append(
                    Check(f"{tool} failed", "status", _called(ToolCallRequirement(name=tool, status="error")), "FALSE")
                )
        else:
            checks.append(
                Check(
                    f"{tool} absent before completion",
                    "open_absence",
                    _called(ToolCallRequirement(name=tool)),
                    "UNDETERMINED",
                    complete=False,
                )
            )
            checks.append(Check(f"ran {tool}", "absence", _called(ToolCallRequirement(name=tool)), "FALSE"))
            checks.append(
                Check(f"{tool} never ran", "never", _called(ToolCallRequirement(name=tool)), "TRUE", invert=True)
            )
    # Arguments: every leaf each call received holds; a value no call of that tool received does not.
    for i, call in enumerate(calls):
        for path, value in leaves(call["arguments"]):
            matcher = ArgumentMatcher(path=path, equals=value)
            checks.append(
                Check(
                    f"{call['tool']}#{i} {path} == {json.dumps(value)}",
                    "arguments",
                    _called(ToolCallRequirement(name=call["tool"], arguments=(matcher,))),
                    "TRUE",
                )
            )
    for tool in tools:
        received = [c["arguments"] for c in calls if c["tool"] == tool]
        if not received:
            continue
        for path, value in leaves(received[0]):
            if not isinstance(value, str):
                continue
            wrong = value + "-never-received"
            checks.append(
                Check(
                    f"{tool} {path} == {json.dumps(wrong)}",
                    "arguments_mismatch",
                    _called(ToolCallRequirement(name=tool, arguments=(ArgumentMatcher(path=path, equals=wrong),))),
                    "FALSE",
                )
            )
    # Order: the whole run exactly, each ordered pair as a subsequence (held or not).
    if order:
        checks.append(
            Check(f"exactly {order}", "sequence", _expect(ToolSequence(tools=tuple(order), mode="exact")), "TRUE")
        )
        checks.append(
            Check(
                f"exactly {order[:-1]}",
                "sequence",
                _expect(ToolSequence(tools=tuple(order[:-1]) or ("send_email",), mode="exact")),
                "FALSE",
            )
        )
        names = list(dict.fromkeys(order))
        for a in names:
            for b in names:
                if a == b:
                    continue
                held = _is_subsequence([a, b], order)
                checks.append(
                    Check(
                        f"{a} then {b}",
                        "sequence",
                        _expect(ToolSequence(tools=(a, b), mode="subsequence")),
                        "TRUE" if held else "FALSE",
                    )
                )
    return checks


def judge_in_process(run: Run, checks: Sequence[Check]) -> dict[str, str]:
    """Each check's verdict from the in-process scorer (``OtelToolCallScorer`` over an
    ``InMemoryTraceClient`` holding the run's spans), before and after the run is marked complete
    with each trace's span count. Runs its own event loop (in a thread of its own when called
    from inside a running one)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_judge(run, checks))
    with ThreadPoolExecutor(max_workers=1) as pool:
        return pool.submit(asyncio.run, _judge(run, checks)).result()


async def _judge(run: Run, checks: Sequence[Check]) -> dict[str, str]:
    client = InMemoryTraceClient()
    client.add_spans(run.spans)
    scorer = OtelToolCallScorer(source=OtelTraceSource(trace_client=client))
    inverted = TrueFalseInverterScorer(scorer=scorer)
    scope = TraceScorable(trace_ids=run.trace_ids)
    out: dict[str, str] = {}
    for complete in (False, True):
        if complete:
            for trace_id, count in run.span_counts().items():
                client.mark_complete(trace_ids=(trace_id,), span_count=count)
        for check in checks:
            if check.complete is not complete:
                continue
            [score] = await (inverted if check.invert else scorer).score_async(scope, check.expectation)
            out[check.id] = verdict_of(score)
    return out


def verdict_of(score: Any) -> str:
    if score.status.value == "undetermined":
        return "UNDETERMINED"
    return "TRUE" if score.get_value() else "FALSE"


def wrong(check: Check, got: str) -> bool:
    """A verdict the ground truth contradicts: TRUE for FALSE or FALSE for TRUE (and any decided
    verdict where only UNDETERMINED is right)."""
    if check.expected == "UNDETERMINED":
        return got != "UNDETERMINED"
    return got != "UNDETERMINED" and got != check.expected
