"""A tool execution as the trace state keeps it reads back exactly (times to the nanosecond)."""

from __future__ import annotations

import base64
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from collector.processors.normalize import cap_arguments, pack_tool, unpack_execution
from scoring.models import Coverage, Observation, PayloadPropagated, ToolExecution, TraceScorable, Verdict
from scoring.models.evidence import CaptureState
from scoring.verdict.conditions import Evidence, judge

TRACE = "0af7651916cd43dd8448eb211c80319c"
_ns = st.integers(min_value=1, max_value=2**63 - 1)


@given(start=_ns, end=st.one_of(st.just(0), _ns), failed=st.sampled_from([None, True, False]))
def test_start_and_end_read_back_exactly(start: int, end: int, failed: bool | None) -> None:
    # end 0 = not ended; an end before the start (a clock step) stays one
    x = pack_tool("AAAAAAAAAAE", "search", failed, start, end, CaptureState.CAPTURED, "{}", "call-1", False)
    e = unpack_execution(x, TRACE)
    assert (e.start_time_unix_nano, e.end_time_unix_nano) == (start, end)
    assert e.status == ("unset" if failed is None else "error" if failed else "ok")


def test_a_state_written_with_microsecond_durations_still_reads() -> None:
    # states already in Redis when the service is upgraded: duration in whole µs, -1 = not ended
    ended = ["AAAAAAAAAAE", "search", 0, "1700000000000000000", 1500, 0, "{}"]
    assert unpack_execution(ended, TRACE).end_time_unix_nano == 1_700_000_000_001_500_000
    open_ = ["AAAAAAAAAAE", "search", 0, "1700000000000000000", -1, 0, "{}"]
    assert unpack_execution(open_, TRACE).end_time_unix_nano == 0


def test_arguments_cut_for_the_state_keep_what_tells_two_copies_apart() -> None:
    from collector.processors.normalize import cap_arguments, full_digest

    def packed(args: str) -> list[object]:
        cut, state = cap_arguments(args, CaptureState.CAPTURED, 64)
        return pack_tool("AAAAAAAAAAE", "search", False, 1, 2, state, cut, None, False, None, full_digest(args))

    same_start = '{"pad": "' + "x" * 100
    a, b = packed(same_start + '", "path": "/tmp/a"}'), packed(same_start + '", "path": "/etc/b"}')
    assert a[:7] == b[:7] and a != b  # the same cut, not the same arguments
    assert packed(same_start + '", "path": "/tmp/a"}') == a  # a replay is exact
    e = unpack_execution(a, TRACE)
    assert e.arguments_state is CaptureState.TRUNCATED and e.delivered_canary is None and e.call_id is None


CANARY = "tw-canary-3f9a0c1e5b7d2468ace0"


def _body(where: str) -> str:
    pad = "Dear team, " + "the quarterly report is attached. " * 40  # ~1.3 KB: past a 1 KiB cut
    if where == "plain":
        return json.dumps({"to": "x@example.test", "body": pad + f"ref {CANARY}"})
    if where == "base64":
        return json.dumps({"to": "x@example.test", "body": pad + base64.b64encode(f"code {CANARY}".encode()).decode()})
    if where == "json-escaped":  # every character escaped: only the decoded JSON string shows it
        escaped = "".join(f"\\u{ord(c):04x}" for c in CANARY)
        return '{"to": "x@example.test", "body": "' + pad + escaped + '"}'
    return json.dumps({"to": "x@example.test", "body": pad})


@pytest.mark.parametrize("where", ["plain", "base64", "json-escaped"])
def test_a_canary_past_the_argument_cut_still_proves_propagation(where: str) -> None:
    """The service keeps 1 KiB of arguments; a canary after that proved nothing (UNDETERMINED),
    while the library, reading the whole arguments, said TRUE."""
    full = _body(where)
    cut, state = cap_arguments(full, CaptureState.CAPTURED, 1024)
    assert state is CaptureState.TRUNCATED and cut is not None and len(cut.encode()) < len(full.encode())
    condition = PayloadPropagated(canaries=(CANARY,))
    for arguments in (full, cut):  # the library's view and the service's agree
        execution = ToolExecution(name="send_email", trace_id=TRACE, span_id="1" * 16, status="ok",
                                  start_time_unix_nano=1, end_time_unix_nano=2, arguments=arguments,
                                  arguments_state=CaptureState.CAPTURED if arguments is full else state)
        obs = Observation(scorable=TraceScorable(trace_ids=(TRACE,)), tool_executions=(execution,),
                          coverage=Coverage.completed())
        assert judge(condition, Evidence.of(obs)).verdict is Verdict.TRUE, arguments[-200:]


def test_arguments_cut_without_hex_after_the_cut_are_only_cut() -> None:
    full = _body("none")
    cut, _ = cap_arguments(full, CaptureState.CAPTURED, 1024)
    assert cut == full.encode()[:1024].decode()
