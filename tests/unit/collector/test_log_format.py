"""``log_format: json``: one JSON object per log line, from every command that sets logging up."""

from __future__ import annotations

import json
import logging
import os
import re
import socket
import subprocess
import sys
from typing import Any

import pytest

from collector.config import load_config
from collector.telemetry.logs import JsonFormatter, log_formatter


def record(msg: str, *args: object, exc: bool = False) -> logging.LogRecord:
    exc_info = None
    if exc:
        try:
            raise KeyError("gone")
        except KeyError:
            exc_info = sys.exc_info()
    r = logging.LogRecord("toolwitness.pipeline", logging.WARNING, __file__, 7, msg, args, exc_info)
    r.created = 1_700_000_000.25  # 2023-11-14T22:13:20.250Z
    return r


def test_a_record_is_one_json_object_with_the_fields() -> None:
    line = JsonFormatter().format(record("batch of %d retried", 3))
    assert json.loads(line) == {
        "timestamp": "2023-11-14T22:13:20.250Z",
        "level": "WARNING",
        "logger": "toolwitness.pipeline",
        "message": "batch of 3 retried",
    }


def test_the_exception_stays_in_its_records_line() -> None:
    line = JsonFormatter().format(record("could not publish", exc=True))
    assert "\n" not in line
    parsed = json.loads(line)
    assert parsed["message"] == "could not publish"
    assert parsed["exception"].startswith("Traceback (most recent call last):")
    assert parsed["exception"].endswith("KeyError: 'gone'")


@pytest.mark.parametrize("text", ['say "hi"\nand {"a": 1}\r\n', "tab\there \u2028 \\ end"])
def test_quotes_and_line_breaks_in_a_message_stay_on_one_line(text: str) -> None:
    line = JsonFormatter().format(record("%s", text))
    assert len(line.splitlines()) == 1
    assert json.loads(line)["message"] == text


def test_text_stays_the_default_format() -> None:
    assert load_config(None, env={}).log_format == "text"
    assert not isinstance(log_formatter("text"), JsonFormatter)
    from_env = load_config(None, env={"TOOLWITNESS_LOG_FORMAT": "json"}).log_format
    assert isinstance(log_formatter(from_env), JsonFormatter)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cli(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    # Only the variables given: the test run's TOOLWITNESS_REDIS_URL / _KAFKA_BOOTSTRAP would
    # point the command at the running servers.
    base = {k: v for k, v in os.environ.items() if not k.startswith("TOOLWITNESS_")}
    return subprocess.run([sys.executable, "-m", "collector.cli", *args],
                          capture_output=True, text=True, timeout=120, env={**base, **env})


def _log_lines(stderr: str) -> list[str]:
    """stderr without the command's own one-line verdict (typer.echo, not a log record)."""
    return [x for x in stderr.splitlines() if x.strip() and not x.startswith("toolwitness")]


#: each command's start failure, logged at DEBUG with its exception, then one echoed line
COMMANDS = {
    "run": (["run"], {"TOOLWITNESS_REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0",
                      "TOOLWITNESS_ADMIN__PORT": str(_closed_port())}, "start failed"),
    "sidecar": (["sidecar", "--listen", "127.0.0.1:0"],
                {"TOOLWITNESS_KAFKA_BOOTSTRAP": f"127.0.0.1:{_closed_port()}",
                 "TOOLWITNESS_KAFKA__REQUEST_TIMEOUT_MS": "1000"}, "sidecar start failed"),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_command_logs_json_lines_when_the_config_says_so(tmp_path: Any, command: str) -> None:
    args, env, failed = COMMANDS[command]
    (tmp_path / "c.yaml").write_text("log_level: DEBUG\n")
    done = _cli([*args, "--config", str(tmp_path / "c.yaml")], {**env, "TOOLWITNESS_LOG_FORMAT": "json"})
    assert done.returncode == 1, done.stderr[-2000:]
    lines = _log_lines(done.stderr)
    parsed = [json.loads(x) for x in lines]  # every log line is one JSON object
    assert all(re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", p["timestamp"]) for p in parsed)
    (start,) = [p for p in parsed if p["message"] == failed]
    assert start["logger"] == "toolwitness" and start["level"] == "DEBUG"
    assert "Traceback (most recent call last):" in start["exception"]


def test_without_the_setting_the_lines_stay_text(tmp_path: Any) -> None:
    args, env, failed = COMMANDS["run"]
    (tmp_path / "c.yaml").write_text("log_level: DEBUG\n")
    done = _cli([*args, "--config", str(tmp_path / "c.yaml")], env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert any(x.endswith(f" DEBUG toolwitness: {failed}") for x in _log_lines(done.stderr)), done.stderr[-2000:]
