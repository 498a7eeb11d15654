"""``set_timestamp`` / ``set_duration``: the hot path's protobuf time setters equal protobuf's own."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from google.protobuf.duration_pb2 import Duration
from google.protobuf.timestamp_pb2 import Timestamp
from hypothesis import given
from hypothesis import strategies as st

from collector.wire.convert import set_duration, set_timestamp

_when = st.datetimes(min_value=datetime(1900, 1, 1), max_value=datetime(2200, 1, 1))


@given(_when, st.booleans())
def test_set_timestamp_equals_from_datetime(dt: datetime, aware: bool) -> None:
    value = dt.replace(tzinfo=UTC) if aware else dt
    ours, theirs = Timestamp(), Timestamp()
    set_timestamp(ours, value)
    theirs.FromDatetime(value)
    assert ours == theirs


@given(st.timedeltas(min_value=timedelta(0), max_value=timedelta(days=10_000)))
def test_set_duration_equals_from_timedelta(td: timedelta) -> None:
    ours, theirs = Duration(), Duration()
    set_duration(ours, td)
    theirs.FromTimedelta(td)
    assert ours == theirs


def test_a_negative_duration_is_refused() -> None:
    with pytest.raises(ValueError, match="negative duration"):
        set_duration(Duration(), timedelta(microseconds=-1))
