"""A boolean where the config takes a number is refused, naming the key (pydantic's lax mode
read ``admin: {port: true}`` as port 1), in the file and in an environment override alike."""

from __future__ import annotations

from pathlib import Path
from typing import Any, get_args

import pytest

from collector.config import ConfigError, _config_paths, _leaf_type, load_config

#: (file text, environment variable, value, the error's start)
CASES = [
    ("admin:\n  port: true\n", "TOOLWITNESS_ADMIN__PORT", "true",
     "admin.port: expected an integer, got a boolean (true)"),
    ("kafka:\n  max_poll_records: false\n", "TOOLWITNESS_KAFKA__MAX_POLL_RECORDS", "false",
     "kafka.max_poll_records: expected an integer, got a boolean (false)"),
    # YAML 1.1 reads `yes` as a boolean: the message says what the service saw
    ("redis:\n  socket_timeout_seconds: yes\n", "TOOLWITNESS_REDIS__SOCKET_TIMEOUT_SECONDS", "true",
     "redis.socket_timeout_seconds: expected a number, got a boolean (true)"),
    ("completion:\n  default_deadline_seconds: true\n", "TOOLWITNESS_COMPLETION__DEFAULT_DEADLINE_SECONDS", "true",
     "completion.default_deadline_seconds: expected a number, got a boolean (true)"),
]
IDS = ["admin.port", "kafka.max_poll_records", "redis.socket_timeout_seconds", "completion.default_deadline_seconds"]


@pytest.mark.parametrize(("text", "var", "value", "error"), CASES, ids=IDS)
def test_a_boolean_for_a_number_in_the_file_is_refused(tmp_path: Path, text: str, var: str, value: str,
                                                       error: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(text)
    with pytest.raises(ConfigError) as caught:
        load_config(p, env={})
    assert str(caught.value) == f"invalid configuration: {error}"


@pytest.mark.parametrize(("text", "var", "value", "error"), CASES, ids=IDS)
def test_a_boolean_for_a_number_in_a_variable_is_refused(text: str, var: str, value: str, error: str) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(None, env={var: value})
    assert str(caught.value) == f"invalid configuration: {error} (set by {var})"


def test_a_scorer_trees_number_refuses_a_boolean_too(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  t:\n    type: threshold\n    threshold: true\n"
                 "    scorer: {type: plagiarism, reference_text: the quick brown fox}\n")
    with pytest.raises(ConfigError, match=r"scorers\.t\.threshold: expected a number, got a boolean \(true\)$"):
        load_config(p, env={})


def test_numbers_still_come_from_variables_and_files(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("redis:\n  socket_timeout_seconds: 2\n")  # an integer where a float is taken
    env = {"TOOLWITNESS_ADMIN__PORT": "9000", "TOOLWITNESS_COMPLETION__DEFAULT_DEADLINE_SECONDS": "1.5"}
    cfg = load_config(p, env=env)
    assert (cfg.admin.port, cfg.redis.socket_timeout_seconds, cfg.completion.default_deadline_seconds) == (9000, 2, 1.5)


def _takes_a_number(ann: Any) -> bool:
    return bool({int, float} & set(get_args(ann) or (ann,)))


def test_every_number_key_refuses_a_boolean() -> None:
    numbers = [p for p in _config_paths() if _takes_a_number(_leaf_type(p))]
    assert len(numbers) >= 20 and ("admin", "port") in numbers  # the walk found the number keys
    for path in numbers:
        var = "TOOLWITNESS_" + "__".join(path).upper()
        with pytest.raises(ConfigError, match=rf"{'.'.join(path)}: expected an? \w+, got a boolean \(true\)"):
            load_config(None, env={var: "true"})
