"""Keeping a library's log from flooding the service's during an outage, and the service's
log line formats."""

from __future__ import annotations

import json
import logging
import time
from datetime import UTC, datetime

#: the `log_format: text` line
TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    """One JSON object per record, on one line: ``timestamp`` (RFC 3339, UTC), ``level``,
    ``logger``, ``message``, and ``exception`` / ``stack`` when the record carries them.

    A traceback stays inside its record's line (json escapes the newlines), so a log pipeline
    reading pod logs line by line keeps it with its message. ASCII output: a U+2028 in a message
    would be a line break to some readers."""

    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, str] = {
            "timestamp": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")[:-6] + "Z",
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info and not record.exc_text:
            # cached on the record as logging.Formatter does: every handler reuses one rendering
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            line["exception"] = record.exc_text
        if record.stack_info:
            line["stack"] = self.formatStack(record.stack_info)
        return json.dumps(line)


def log_formatter(log_format: str) -> logging.Formatter:
    """The formatter of config ``log_format`` (``text`` or ``json``)."""
    return JsonFormatter() if log_format == "json" else logging.Formatter(TEXT_FORMAT)


class RepeatThrottle(logging.Filter):
    """Lets one record per message kind (logger, level, format string, and the record's
    ``throttle_key`` when it has one: ``extra={"throttle_key": reason}`` keeps one reason's flood
    from hiding another's) through per ``every_s``; the next one let through says how many like it
    were not logged meanwhile. DEBUG records always pass (whoever turns DEBUG on wants all of them)."""

    def __init__(self, every_s: float) -> None:
        super().__init__()
        self.every_s = every_s
        #: message kind -> (when one was last let through, how many were held back since)
        self._last: dict[tuple[str, int, str, str], tuple[float, int]] = {}

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno < logging.INFO:
            return True
        key = (record.name, record.levelno, str(record.msg), str(getattr(record, "throttle_key", "")))
        now = time.monotonic()
        last = self._last.get(key)
        if last is not None and now - last[0] < self.every_s:
            self._last[key] = (last[0], last[1] + 1)
            return False
        self._last[key] = (now, 0)
        if last is not None and last[1] and isinstance(record.msg, str):
            record.msg += f" [{last[1]} more like this in the last {now - last[0]:.0f}s not logged]"
        return True


def throttle_logs(prefix: str, every_s: float) -> None:
    """Install one ``RepeatThrottle`` on every logger named ``prefix`` or ``prefix.*`` that exists
    now (a logger's filters see the records logged to it, not its children's: each gets it; a
    library creates its loggers when its modules are imported). Idempotent."""
    throttle = RepeatThrottle(every_s)
    names = [prefix] + [n for n in logging.root.manager.loggerDict if n.startswith(prefix + ".")]
    for name in names:
        logger = logging.getLogger(name)
        if not any(isinstance(f, RepeatThrottle) for f in logger.filters):
            logger.addFilter(throttle)


class RetriedCoordinatorLookup(logging.Filter):
    """Drops aiokafka's "Group Coordinator Request failed" for an error it retries (the broker has
    no coordinator for the group yet: normal for a minute on a broker just started). For the demo
    and the benches, whose reader did not ask for the consumer's log; the service keeps it."""

    def filter(self, record: logging.LogRecord) -> bool:
        # startswith: a RepeatThrottle before this filter may have appended its count
        if not str(record.msg).startswith("Group Coordinator Request failed: ") or not record.args:
            return True
        err = record.args[0] if isinstance(record.args, tuple) else None
        return not getattr(err, "retriable", False)


def quiet_retried_coordinator_lookups() -> None:
    """Install :class:`RetriedCoordinatorLookup` on aiokafka's group coordinator logger. Idempotent."""
    logger = logging.getLogger("aiokafka.consumer.group_coordinator")
    if not any(isinstance(f, RetriedCoordinatorLookup) for f in logger.filters):
        logger.addFilter(RetriedCoordinatorLookup())
