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


def test_a_retried_coordinator_lookup_is_not_shown_by_the_demo(caplog: pytest.LogCaptureFixture) -> None:
    from aiokafka import errors

    from collector.telemetry.logs import quiet_retried_coordinator_lookups

    log = logging.getLogger("aiokafka.consumer.group_coordinator")
    before = list(log.filters)
    log.filters[:] = []  # without the service's RepeatThrottle an earlier test may have installed
    try:
        quiet_retried_coordinator_lookups()
        quiet_retried_coordinator_lookups()  # idempotent: one filter
        assert sum(isinstance(f, logs.RetriedCoordinatorLookup) for f in log.filters) == 1
        with caplog.at_level(logging.ERROR, logger="aiokafka"):
            # what aiokafka logs while a fresh broker has no coordinator yet: retried, not shown
            log.error("Group Coordinator Request failed: %s", errors.CoordinatorNotAvailableError())
            # an error it does not retry, and any other message: shown
            log.error("Group Coordinator Request failed: %s", errors.GroupAuthorizationFailedError("g"))
            log.error("Heartbeat failed: %s", errors.CoordinatorNotAvailableError())
    finally:
        log.filters[:] = before
    shown = [r.getMessage() for r in caplog.records]
    assert len(shown) == 2
    assert shown[0].startswith("Group Coordinator Request failed: [Error 30] GroupAuthorizationFailedError")
    assert shown[1].startswith("Heartbeat failed")


async def test_the_service_logs_one_dead_letter_line_per_reason_not_one_per_record(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A producer writing the wrong encoding sends every record to the DLQ: the log gets one line per
    reason per interval (the DLQ metric counts each record), and one reason's flood does not hide
    another's."""
    from aiokafka.structs import ConsumerRecord

    from collector.config import ServiceConfig
    from collector.pipeline.service import ToolwitnessService

    service = ToolwitnessService(ServiceConfig(), owns_process=True)
    checkpoint = logging.getLogger("toolwitness.checkpoint")
    before = list(checkpoint.filters)
    try:
        service.throttle_logs()
        with caplog.at_level(logging.WARNING, logger="toolwitness.checkpoint"):
            for offset in range(200):
                reason = "undecodable_protobuf" if offset % 2 else "unknown_scorer"
                rec = ConsumerRecord("otlp_spans", 0, offset, 0, 0, None, b"\xff", None, -1, 1, ())
                service.checkpoint._dead(rec, reason, "bad")
    finally:
        checkpoint.filters[:] = before
        await service.redis.aclose()
    lines = [r.getMessage() for r in caplog.records if r.name == "toolwitness.checkpoint"]
    assert len(lines) == 2, lines
    assert {line.split("to DLQ: ")[1].split(" ")[0] for line in lines} == {"unknown_scorer", "undecodable_protobuf"}


async def test_the_service_logs_failed_deliveries_once_per_outage_interval(caplog: pytest.LogCaptureFixture) -> None:
    """A topic that refuses records fails every re-send (the sweeper's, every ~2 s): the exporter's
    ERROR comes once per interval with the count held back, not once per re-send."""
    import asyncio

    from collector.config import KafkaConfig, ServiceConfig
    from collector.exporters.kafka import ExportError, KafkaExporter
    from collector.pipeline.service import ToolwitnessService

    service = ToolwitnessService(ServiceConfig(), owns_process=True)
    loggers = [logging.getLogger(n) for n in list(logging.root.manager.loggerDict)]
    before = {lg: list(lg.filters) for lg in loggers}  # throttle_logs installs process-wide
    exporter = KafkaExporter(KafkaConfig())  # not started: flush reads the futures alone
    try:
        service.throttle_logs()
        with caplog.at_level(logging.WARNING, logger="toolwitness.exporter.kafka"):
            for _ in range(20):
                refused: asyncio.Future[None] = asyncio.get_running_loop().create_future()
                refused.set_exception(RuntimeError("MessageSizeTooLargeError"))
                exporter._pending = [refused]
                with pytest.raises(ExportError):
                    await exporter.flush()
    finally:
        for lg, filters in before.items():
            lg.filters[:] = filters
        await service.redis.aclose()
    lines = [r.getMessage() for r in caplog.records if r.name == "toolwitness.exporter.kafka"]
    assert len(lines) == 1, lines
    assert "1 of 1 deliveries failed" in lines[0]
