"""The count of traces in state (``toolwitness_traces_in_state``), its Python half: expiry buckets
and the moves between them that the service sends along with its next round trip. The Redis half
(and the gauge end to end) is in ``tests/integration/test_traces_in_state.py``."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from collector.config import ServiceConfig
from collector.processors.resp import Commands
from collector.processors.trace_state import TraceStateStore, bucket_end_s, count_bucket_ms


@pytest.mark.parametrize(
    ("ttl_s", "width_s"), [(1, 1), (5, 1), (99, 1), (250, 2), (3600, 36), (6000, 60), (86400, 60), (10**7, 60)]
)
def test_bucket_width_is_a_hundredth_of_the_ttl_in_whole_seconds_from_1_to_60(ttl_s: int, width_s: int) -> None:
    assert count_bucket_ms(ttl_s * 1000) == width_s * 1000


def test_an_expiry_falls_in_the_bucket_ending_at_or_after_it() -> None:
    assert bucket_end_s(1_800_000_060_000, 60_000) == 1_800_000_060  # on the boundary: that bucket
    assert bucket_end_s(1_800_000_060_001, 60_000) == 1_800_000_120  # 1 ms past it: the next one
    assert bucket_end_s(1_800_000_000_001, 60_000) == 1_800_000_060
    assert bucket_end_s(1_800_000_000_500, 1_000) == 1_800_000_001


def _store(ttl_s: int = 86400) -> TraceStateStore:
    cfg = ServiceConfig.model_validate({"redis": {"state_ttl_seconds": ttl_s}})
    store = TraceStateStore(None, cfg)  # type: ignore[arg-type]  # no Redis: only the bookkeeping
    store._count_move = SimpleNamespace(sha="0" * 40, script="")  # type: ignore[assignment]
    return store


T0 = 1_800_000_000_000  # ms, on a 60 s boundary


def test_a_created_state_counts_once_in_its_expiry_bucket() -> None:
    s = _store()
    s.note_expiry("acme", -2, T0 + 30_000)
    assert s._moves == {"acme": {1_800_000_060: 1}}


def test_a_renewal_within_its_bucket_moves_nothing_and_one_past_it_moves_the_trace() -> None:
    s = _store()
    s.note_expiry("acme", T0 + 1_000, T0 + 59_000)  # same bucket: the common case of an active trace
    s.note_expiry("acme", T0 + 5_000, T0 + 5_000)  # not written (a replay)
    assert s._moves == {}
    s.note_expiry("acme", T0 + 59_000, T0 + 61_000)
    assert s._moves == {"acme": {1_800_000_060: -1, 1_800_000_120: 1}}


def test_created_then_renewed_before_the_moves_are_sent_nets_to_the_last_bucket() -> None:
    s = _store()
    s.note_expiry("acme", -2, T0 + 10_000)
    s.note_expiry("acme", T0 + 10_000, T0 + 70_000)
    s.note_expiry("acme", T0 + 70_000, T0 + 130_000)
    assert {b: d for b, d in s._moves["acme"].items() if d} == {1_800_000_180: 1}


def test_a_reclaimed_state_moves_to_its_earlier_bucket_and_tenants_are_apart() -> None:
    s = _store()
    s.note_expiry("acme", T0 + 86_400_000, T0 + 300_000)  # PEXPIRE LT: the short life of a decided trace
    s.note_expiry("other", -2, T0 + 1)
    assert s._moves == {"acme": {1_800_086_400: -1, 1_800_000_300: 1}, "other": {1_800_000_060: 1}}


def _sent(cmds: Commands) -> list[list[Any]]:
    """The commands as sent (RESP parsed back into argument lists)."""
    import hiredis

    reader = hiredis.Reader()
    reader.feed(cmds.packed())
    out = []
    while (cmd := reader.gets()) is not False:
        out.append([a.decode() for a in cmd])
    return out


def test_moves_go_as_one_script_call_per_tenant_and_a_tenant_is_listed_once_per_new_bucket() -> None:
    s = _store()
    s.note_expiry("acme", -2, T0 + 10_000)
    s.note_expiry("acme", -2, T0 + 20_000)
    s.note_expiry("acme", T0 + 50_000, T0 + 70_000)
    s.note_expiry("other", -2, T0 + 10_000)
    s.note_expiry("other", T0 + 10_000, -2)  # created and gone again: nothing to send for it
    cmds = Commands()
    assert s._add_moves(cmds) == 2
    sent = _sent(cmds)
    assert sent[0][:4] == ["EVALSHA", "0" * 40, "1", "tw:{acme:count}:live"]
    assert dict(zip(sent[0][4::2], sent[0][5::2], strict=True)) == {"1800000060": "1", "1800000120": "1"}
    assert sent[1] == ["ZADD", "tw:live_tenants", "GT", "1800000120", "acme"]
    assert s._moves == {}  # taken: sent once

    # more traces in a bucket the tenant is listed for already: the moves only
    s.note_expiry("acme", -2, T0 + 100_000)
    cmds = Commands()
    assert s._add_moves(cmds) == 1
    assert _sent(cmds)[0][4:] == ["1800000120", "1"]
    # a later bucket: listed again (with the end of that bucket)
    s.note_expiry("acme", -2, T0 + 130_000)
    cmds = Commands()
    assert s._add_moves(cmds) == 2
    assert _sent(cmds)[1] == ["ZADD", "tw:live_tenants", "GT", "1800000180", "acme"]


def test_a_failed_move_lists_the_tenants_again_with_the_next_moves() -> None:
    s = _store()
    s.note_expiry("acme", -2, T0 + 10_000)
    s._add_moves(Commands())
    s._moves_sent([RuntimeError("READONLY")])
    s.note_expiry("acme", -2, T0 + 20_000)
    cmds = Commands()
    assert s._add_moves(cmds) == 2
    assert _sent(cmds)[1][:3] == ["ZADD", "tw:live_tenants", "GT"]


async def test_tenants_redis_no_longer_lists_are_forgotten_here_too() -> None:
    """One entry per tenant ever counted stayed in ``_listed`` for the life of the process (a
    tenant per session: it grew without end) while Redis dropped them from its index."""
    import time

    from collector.processors.trace_state import LIVE_TENANT_GRACE_S

    s = _store()
    s._count_read = SimpleNamespace(sha="1" * 40, script="")  # type: ignore[assignment]
    now_ms = int(time.time() * 1000)
    for i in range(1000):  # counted once, long ago: their last bucket ended before the grace
        s.note_expiry(f"gone-{i}", -2, now_ms - 2 * LIVE_TENANT_GRACE_S * 1000)
    s.note_expiry("live", -2, now_ms + 3_600_000)
    s._add_moves(Commands())
    assert len(s._listed) == 1001
    sent: list[list[Any]] = []
    replies = [[1000, [b"live"]], [5]]  # Redis's: the index pruned and read, then live's count

    async def execute(cmds: Commands) -> list[Any]:
        sent.extend(_sent(cmds))
        return replies.pop(0)

    s._execute = execute  # type: ignore[method-assign]
    assert await s.count_traces() == {"live": 5}
    assert list(s._listed) == ["live"]
    # forgotten here as Redis forgot it: the same cut-off
    assert sent[0][:3] == ["ZREMRANGEBYSCORE", "tw:live_tenants", "-inf"]
    assert abs(int(sent[0][3]) - (now_ms // 1000 - LIVE_TENANT_GRACE_S)) <= 2
    # counted again: listed again with its next moves
    s.note_expiry("gone-7", -2, now_ms + 60_000)
    cmds = Commands()
    assert s._add_moves(cmds) == 2 and _sent(cmds)[1][:3] == ["ZADD", "tw:live_tenants", "GT"]
