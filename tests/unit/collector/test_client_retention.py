"""``ToolwitnessClient``'s memory of score events: bounded, oldest arrivals forgotten first, and
only its own tenant's kept (the records are fed as the scores consumer would hand them over)."""

from __future__ import annotations

import hashlib

import pytest

from collector.client import ToolwitnessClient
from collector.wire.convert import encode, score_id_for
from collector.wire.gen import common_pb2, score_pb2


def _event(expectation_id: str, version: int = 1, tenant: str = "acme") -> bytes:
    ev = score_pb2.ScoreEvent(
        score_id=score_id_for(tenant, expectation_id, version),
        expectation_id=expectation_id,
        version=version,
        tenant=tenant,
        status=common_pb2.SCORE_STATUS_TRUE,
        value="true",
    )
    return encode(ev, "protobuf")


def test_the_oldest_arrivals_are_forgotten_beyond_max_retained() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", max_retained=3)
    for raw in (_event("a"), _event("b"), _event("a", 2), _event("c")):
        tw._ingest(raw)
    # a@1 was the oldest arrival: gone; a@2 is kept and is now a's only (latest) event
    assert [e.version for e in tw.events("a")] == [2]
    assert tw.latest("a") is not None and tw.latest("a").version == 2  # type: ignore[union-attr]
    assert [e.expectation_id for e in tw.events("b")] == ["b"] and tw.events("c")
    assert tw.forgotten == 1
    tw._ingest(_event("d"))
    tw._ingest(_event("e"))
    assert tw.events("b") == [] and tw.events("a") == [] and tw.forgotten == 3
    assert tw.latest("a") is None
    assert len(tw._arrived) == 3 and set(tw._events) == {("acme", "c"), ("acme", "d"), ("acme", "e")}


def test_a_resend_within_the_window_is_a_duplicate() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", max_retained=10)
    tw._ingest(_event("a"))
    tw._ingest(_event("a"))
    assert tw.duplicates == 1 and len(tw.events("a")) == 1


def test_other_tenants_are_counted_and_not_kept() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    tw._ingest(_event("x", tenant="globex"))
    assert tw.other_tenants == 1 and tw.events("x") == [] and not tw._arrived


@pytest.mark.parametrize("bad", [0, -1])
def test_max_retained_must_be_positive(bad: int) -> None:
    with pytest.raises(ValueError, match="max_retained"):
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", max_retained=bad)


@pytest.mark.parametrize("bad", [50, 3_600_001])
def test_metadata_max_age_is_bounded(bad: int) -> None:
    with pytest.raises(ValueError, match="metadata_max_age_ms"):
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", metadata_max_age_ms=bad)


@pytest.mark.parametrize("bad", [0, -1, float("nan"), float("inf")])
def test_timeout_s_must_be_positive_and_finite(bad: float) -> None:
    with pytest.raises(ValueError, match="timeout_s"):
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", timeout_s=bad)


def test_two_tenants_with_one_expectation_id_do_not_collide() -> None:
    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", all_tenants=True)
    assert score_id_for("acme", "e1", 1) != score_id_for("beta", "e1", 1)
    tw._ingest(_event("e1", tenant="beta"))
    tw._ingest(_event("e1", tenant="acme"))
    assert tw.duplicates == 0
    assert [e.tenant for e in tw.events("e1")] == ["acme"]  # this client's tenant by default
    assert [e.tenant for e in tw.events("e1", tenant="beta")] == ["beta"]


async def test_wait_for_gets_the_event_even_if_the_same_batch_evicted_it() -> None:
    import asyncio

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", max_retained=2)
    tw._started = True  # records are fed by hand below, as the consumer would
    waiter = asyncio.create_task(tw.wait_for("w", timeout=5))
    await asyncio.sleep(0)  # the waiter is registered
    for raw in (_event("w"), _event("x"), _event("y")):  # one batch: w is evicted before the waiter runs
        tw._ingest(raw)
    ev = await waiter
    assert ev.expectation_id == "w" and tw.events("w") == []


async def test_cancel_wakes_whoever_waits_for_it() -> None:
    import asyncio

    from collector.client import ExpectationCancelledError

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    tw._started = True

    async def sent(*_: object) -> None:
        return None

    tw._send_control = sent  # type: ignore[method-assign]
    waiter = asyncio.create_task(tw.wait_for("c", timeout=30))
    await asyncio.sleep(0)
    await tw.cancel("c")
    with pytest.raises(ExpectationCancelledError, match="'c' was cancelled"):
        await waiter
    # ... and whoever waits for it afterwards, at once (no score will ever come)
    with pytest.raises(ExpectationCancelledError, match="'c' was cancelled"):
        await asyncio.wait_for(tw.wait_for("c", timeout=30), timeout=1)
    with pytest.raises(ValueError, match="timeout must be a positive"):
        await tw.wait_for("c", timeout=None)  # type: ignore[arg-type]
    # another tenant's scores are not kept by this client: waiting for one could only time out
    with pytest.raises(ValueError, match="all_tenants=True"):
        await tw.wait_for("c", timeout=30, tenant="globex")


async def test_a_message_scope_without_its_traces_is_refused_before_sending() -> None:
    from scoring.models import MessageScorable, ScoringExpectation, ToolCallRequirement, ToolsCalled

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    expectation = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name="t"),)),))
    with pytest.raises(ValueError, match=r"needs its trace_ids .* inline"):
        await tw.expect(MessageScorable(message_id="m-1"), expectation)


async def test_a_partition_moved_ahead_by_the_consumer_is_read_from_where_the_client_stopped() -> None:
    import asyncio
    from types import SimpleNamespace

    from aiokafka import TopicPartition

    tp = TopicPartition("scores", 0)
    rec = lambda off, eid: SimpleNamespace(offset=off, value=_event(eid))  # noqa: E731
    batches = [
        {tp: [rec(7, "skipped-ahead")]},  # reset to the end: offsets 5 and 6 were skipped
        {tp: [rec(5, "five"), rec(6, "six"), rec(7, "skipped-ahead")]},  # after the seek back
        {tp: [rec(10, "after-a-gap")]},  # a real gap (8, 9 gone): back once ...
        {tp: [rec(10, "after-a-gap")]},  # ... the same first offset again: taken as it is
    ]
    seeks: list[int] = []
    drained = asyncio.Event()

    class Consumer:
        def assignment(self) -> frozenset[TopicPartition]:
            return frozenset({tp})

        async def getmany(self, timeout_ms: int) -> dict[TopicPartition, list[SimpleNamespace]]:
            if not batches:
                drained.set()  # every batch was handed over and handled
                await asyncio.sleep(3600)
            return batches.pop(0)

        async def beginning_offsets(self, tps: list[TopicPartition]) -> dict[TopicPartition, int]:
            return {t: 0 for t in tps}

        def seek(self, t: TopicPartition, offset: int) -> None:
            seeks.append(offset)

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    tw._consumer = Consumer()  # type: ignore[assignment]
    tw._assigned = frozenset({tp})
    tw._positions = {tp: 5}
    task = asyncio.create_task(tw._consume())
    await asyncio.wait_for(drained.wait(), timeout=5)
    task.cancel()
    assert seeks == [5, 8]
    assert [e.expectation_id for e in tw._arrived.values()] == ["five", "six", "skipped-ahead", "after-a-gap"]
    assert tw._positions[tp] == 11


async def test_an_expectation_with_no_conditions_is_refused_before_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    """The service dead-lettered it (unscorable_expectation) and the harness waited out its timeout."""
    from scoring.models import MessageScorable, ScoringExpectation, TraceScorable
    from scoring.score.base import ScorerConfigurationError
    from scoring.score.tree import build_scorer_tree

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    sent: list[object] = []

    async def send(key: str, msg: object) -> None:
        sent.append(msg)

    monkeypatch.setattr(tw, "_send_control", send)
    trace = TraceScorable(trace_ids=("ab" * 16,))
    for kwargs in ({"conditions": []}, {}, {"expectation": ScoringExpectation(objective="o")}):
        with pytest.raises(ScorerConfigurationError, match="no conditions to check"):
            await tw.expect(trace, **kwargs)  # type: ignore[arg-type]
    # the same error as the library's tool-call scorer gives in-process
    with pytest.raises(ScorerConfigurationError, match="needs at least one condition"):
        build_scorer_tree({"type": "otel_tool_call"}).validate(ScoringExpectation())
    assert sent == []
    # a text tree judges a message's response_text without conditions: that one is sent
    text = MessageScorable(message_id="m-1", trace_ids=("cd" * 16,), response_text="I can't help with that")
    await tw.expect(text, conditions=[], scorer="refusal")
    assert len(sent) == 1


def test_the_score_id_is_the_documented_formula() -> None:
    """score.proto tells consumers how to compute the id they wait for; hold the code to it."""
    for tenant, expectation_id, version in [("acme", "e1", 1), ("default", "ünïcode-id", 12)]:
        text = f"{tenant}\0{expectation_id}\0{version}".encode()
        assert score_id_for(tenant, expectation_id, version) == hashlib.sha256(text).hexdigest()[:32]


async def test_what_the_service_would_refuse_is_refused_before_sending(monkeypatch: pytest.MonkeyPatch) -> None:
    """A matcher regex that backtracks catastrophically is dead-lettered by the service
    (invalid_matcher) and the harness waited out its timeout; expect() now says so at once."""
    from scoring.models import ArgumentMatcher, ToolCallRequirement, ToolsCalled, TraceScorable

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme")
    sent: list[object] = []

    async def send(key: str, msg: object) -> None:
        sent.append(msg)

    monkeypatch.setattr(tw, "_send_control", send)
    trace = TraceScorable(trace_ids=("ab" * 16,))

    def calls(regex: str) -> list[ToolsCalled]:
        matcher = ArgumentMatcher(path="$.q", regex=regex)
        return [ToolsCalled(tools=(ToolCallRequirement(name="search", arguments=(matcher,)),))]

    with pytest.raises(ValueError, match=r"would refuse this expectation \(invalid_matcher\).*possessive"):
        await tw.expect(trace, conditions=calls(r"^(\w+\s?)+$"))
    assert sent == []
    await tw.expect(trace, conditions=calls(r"^(?:\w+\s?)++$"))  # the suggested rewrite is sent
    assert len(sent) == 1


async def test_cancellations_are_remembered_within_max_retained() -> None:
    """A harness keeps one client open for days: every cancel was kept in a set that only grew."""
    import asyncio

    from collector.client import ExpectationCancelledError

    tw = ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant="acme", max_retained=3)
    tw._started = True

    async def sent(*_: object) -> None:
        return None

    tw._send_control = sent  # type: ignore[method-assign]
    for i in range(1000):
        await tw.cancel(f"c{i}")
    assert len(tw._cancelled) == 3
    # the most recent ones still fail at once; the oldest now wait (and time out) like any other
    with pytest.raises(ExpectationCancelledError):
        await asyncio.wait_for(tw.wait_for("c999", timeout=30), timeout=1)
    with pytest.raises(TimeoutError):
        await tw.wait_for("c0", timeout=0.01)
