"""RepeatThrottle: one record per message kind per interval, then a count of those held back."""

from __future__ import annotations

import logging

import pytest

from collector.telemetry import logs
from collector.telemetry.logs import RepeatThrottle, throttle_logs


def record(msg: str, level: int = logging.ERROR, name: str = "aiokafka.conn") -> logging.LogRecord:
    return logging.LogRecord(name, level, __file__, 1, msg, ("x",), None)


def test_one_per_kind_per_interval_then_the_count(monkeypatch: pytest.MonkeyPatch) -> None:
    now = [100.0]
    monkeypatch.setattr(logs.time, "monotonic", lambda: now[0])
    t = RepeatThrottle(10.0)
    assert t.filter(record("failed %s"))
    assert not any(t.filter(record("failed %s")) for _ in range(5))
    assert t.filter(record("other %s"))  # another kind
    assert t.filter(record("failed %s", logging.WARNING))  # another level
    assert t.filter(record("failed %s", logging.DEBUG))  # DEBUG is never held back
    now[0] += 10.0
    r = record("failed %s")
    assert t.filter(r)
    assert r.getMessage() == "failed x [5 more like this in the last 10s not logged]"
    r = record("failed %s")
    assert not t.filter(r)


def test_installed_once_on_every_logger_of_the_prefix() -> None:
    child = logging.getLogger("tw_test_lib.sub.mod")
    throttle_logs("tw_test_lib", 10.0)
    throttle_logs("tw_test_lib", 10.0)
    for logger in (logging.getLogger("tw_test_lib"), child):
        assert sum(isinstance(f, RepeatThrottle) for f in logger.filters) == 1
