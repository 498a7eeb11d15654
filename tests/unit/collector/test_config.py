"""Service configuration: every key validated, errors name the key, env overrides apply."""

import re
from pathlib import Path

import pytest

from collector.client import ToolwitnessClient
from collector.config import ConfigError, load_config
from collector.processors.decide import Decider


def test_defaults_load_and_build_trees() -> None:
    cfg = load_config(None, env={})
    assert cfg.kafka.topics.spans == "otlp_spans"
    assert cfg.admin.port == 8888
    assert set(Decider(cfg).trees) == {"tools"}


def test_unknown_key_is_named(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  bootstrap_server: x:1\n")
    with pytest.raises(ConfigError, match=r"kafka\.bootstrap_server"):
        load_config(p, env={})


def test_bad_value_is_named(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("completion:\n  mode: eventually\nredis:\n  url: http://x\n")
    with pytest.raises(ConfigError) as err:
        load_config(p, env={})
    assert "completion.mode" in str(err.value) and "redis.url" in str(err.value)


def test_env_overrides(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  bootstrap_servers: a:1\n")
    cfg = load_config(
        p,
        env={
            "TOOLWITNESS_KAFKA__BOOTSTRAP_SERVERS": "b:2",
            "TOOLWITNESS_COMPLETION__ALLOWED_LATENESS_MS": "5",
            "TOOLWITNESS_REDIS_URL": "redis://r:1/0",
            "UNRELATED": "x",
        },
    )
    assert cfg.kafka.bootstrap_servers == "b:2"
    assert cfg.completion.allowed_lateness_ms == 5
    assert cfg.redis.url == "redis://r:1/0"


def test_scorer_tree_errors_name_the_path(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(
        "scorers:\n  t:\n    type: threshold\n    scorer: {type: substring, substring: x}\n    threshold: 0.5\n"
    )
    with pytest.raises(ValueError, match=r"scorers\.t: threshold needs a float-scale scorer"):
        Decider(load_config(p, env={}))


def test_not_a_mapping(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("- a\n- b\n")
    with pytest.raises(ConfigError, match="top level must be a mapping"):
        load_config(p, env={})


def test_validate_config_never_prints_url_credentials() -> None:
    from collector.cli import _redact_urls

    out = _redact_urls('{"url": "redis://user:s3cr3t@redis:6379/0", "other": "rediss://:pw@h:1"}')
    assert "s3cr3t" not in out and ":pw@" not in out
    assert "redis://user:***@redis:6379/0" in out


def test_fetch_max_wait_is_bounded_and_named(tmp_path: Path) -> None:
    # It bounds how long a fresh span record can sit unread: 0 or more than a minute is refused.
    assert load_config(None, env={}).kafka.fetch_max_wait_ms <= 100
    for bad in ("0", "60001"):
        p = tmp_path / "c.yaml"
        p.write_text(f"kafka:\n  fetch_max_wait_ms: {bad}\n")
        with pytest.raises(ConfigError, match=r"kafka\.fetch_max_wait_ms"):
            load_config(p, env={})


def test_redis_cluster_needs_tcp_and_database_0(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("redis:\n  cluster: true\n  url: redis://rc-0:6379\n")
    assert load_config(p, env={}).redis.cluster
    for url, why in (("unix:///run/redis.sock", "over TCP"), ("redis://rc-0:6379/2", "database 0")):
        p.write_text(f"redis:\n  cluster: true\n  url: {url}\n")
        with pytest.raises(ConfigError, match=rf"redis.*{why}"):
            load_config(p, env={})


@pytest.mark.parametrize("command", ["run", "validate-config", "sidecar"])
def test_commands_name_a_bad_config_and_exit_2(tmp_path: Path, command: str) -> None:
    # `run` builds every scorer tree before it starts anything (as validate-config does); no traceback.
    from typer.testing import CliRunner

    from collector.cli import app

    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  t:\n    type: composite\n" if command != "sidecar" else "kafka:\n  nope: 1\n")
    result = CliRunner().invoke(app, [command, "--config", str(p)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output
    assert ("scorers.t" if command != "sidecar" else "kafka.nope") in result.output


def test_env_text_values_stay_text_and_top_level_keys_are_reachable() -> None:
    cfg = load_config(
        None,
        env={
            "TOOLWITNESS_KAFKA__GROUP_ID": "2024",  # JSON would make it a number
            "TOOLWITNESS_TENANT__DEFAULT": "null",  # ... or None
            "TOOLWITNESS_KAFKA__TOPICS__SPANS": "123",
            "TOOLWITNESS_LOG_LEVEL": "DEBUG",
            "TOOLWITNESS_INSTANCE": "pod-7",
            "TOOLWITNESS_REDIS__CLUSTER": "true",  # non-text keys are still JSON
            "TOOLWITNESS_REDIS__URL": "redis://rc:6379",
        },
    )
    assert cfg.kafka.group_id == "2024" and cfg.tenant.default == "null" and cfg.kafka.topics.spans == "123"
    assert cfg.log_level == "DEBUG" and cfg.instance == "pod-7" and cfg.redis.cluster is True


def test_env_errors_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"completion\.allowed_lateness_ms: .*\(set by TOOLWITNESS_COMPLETION__"):
        load_config(None, env={"TOOLWITNESS_COMPLETION__ALLOWED_LATENESS_MS": "soon"})
    # A config path spelled with single underscores is not read: it is refused, naming the spelling meant.
    with pytest.raises(ConfigError) as err:
        load_config(None, env={"TOOLWITNESS_KAFKA_GROUP_ID": "g", "TOOLWITNESS_TOOL_INTERCEPT": "true"})
    assert "TOOLWITNESS_KAFKA_GROUP_ID is not read" in str(err.value)
    assert "did you mean TOOLWITNESS_KAFKA__GROUP_ID?" in str(err.value)
    assert "TOOL_INTERCEPT" not in str(err.value)  # only the near miss; other TOOLWITNESS_* variables are not config


async def test_redis_tls_ca_reaches_the_client_and_needs_rediss(tmp_path: Path) -> None:
    from collector.pipeline.service import redis_client

    p = tmp_path / "c.yaml"
    p.write_text("redis:\n  url: rediss://toolwitness@redis:6380/0\n  ssl_ca_file: /etc/ca.pem\n")
    cfg = load_config(p, env={})
    client = redis_client(cfg.redis, "pw")
    kwargs = client.connection_pool.connection_kwargs
    assert (kwargs["ssl_ca_certs"], kwargs["username"], kwargs["password"]) == ("/etc/ca.pem", "toolwitness", "pw")
    await client.aclose()
    p.write_text("redis:\n  url: redis://redis:6379/0\n  ssl_ca_file: /etc/ca.pem\n")
    with pytest.raises(ConfigError, match=r"ssl_ca_file is set but redis.url is not rediss"):
        load_config(p, env={})


def test_one_topic_in_two_roles_is_refused(tmp_path: Path) -> None:
    # A DLQ that is the spans topic would re-read and dead-letter each bad record forever.
    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  topics:\n    dlq: otlp_spans\n")
    with pytest.raises(ConfigError, match=r"kafka\.topics: .*spans and dlq are the same topic 'otlp_spans'"):
        load_config(p, env={})


@pytest.mark.parametrize(
    ("security", "named"),
    [
        ("protocol: SASL_SSL", "sasl_mechanism must be set for protocol SASL_SSL"),
        ("protocol: PLAINTEXT\n    sasl_mechanism: SCRAM-SHA-512", "uses no SASL"),
        ("protocol: SASL_PLAINTEXT\n    sasl_mechanism: PLAIN\n    ssl_cafile: ca.pem", "ssl_cafile set but"),
    ],
    ids=["sasl-without-mechanism", "mechanism-without-sasl", "tls-file-without-tls"],
)
def test_kafka_security_settings_the_protocol_would_not_use_are_refused(
    tmp_path: Path, security: str, named: str
) -> None:
    # validate-config says so up front, instead of a traceback from run (or a setting ignored)
    p = tmp_path / "c.yaml"
    p.write_text(f"kafka:\n  security:\n    {security}\n")
    with pytest.raises(ConfigError, match=rf"kafka\.security: .*{named}"):
        load_config(p, env={})


def test_an_env_mapping_overrides_only_the_keys_it_names(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  topics:\n    spans: a.spans\n    control: a.control\n    dlq: a.dlq\n")
    cfg = load_config(p, env={"TOOLWITNESS_KAFKA__TOPICS": '{"spans": "a.spans-v2"}'})
    topics = cfg.kafka.topics
    assert (topics.spans, topics.control, topics.dlq) == ("a.spans-v2", "a.control", "a.dlq")


def test_env_scorer_names_keep_their_case_and_top_level_typos_are_refused(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text('scorers:\n  myTools:\n    type: substring\n    substring: "can\'t"\n')
    cfg = load_config(p, env={"TOOLWITNESS_SCORERS__MYTOOLS__SUBSTRING": "won't"})
    assert cfg.scorers["myTools"].substring == "won't"  # the file's scorer, not a new "mytools"
    with pytest.raises(ConfigError, match=r"TOOLWITNESS_LOGLEVEL is not read: did you mean TOOLWITNESS_LOG_LEVEL\?"):
        load_config(p, env={"TOOLWITNESS_LOGLEVEL": "DEBUG"})


@pytest.mark.parametrize(
    ("yaml_text", "key"),
    [
        ("completion:\n  default_deadline_seconds: .inf\n", "completion.default_deadline_seconds"),
        ("redis:\n  socket_timeout_seconds: .nan\n", "redis.socket_timeout_seconds"),
        ("kafka:\n  group_id: ''\n", "kafka.group_id"),
        ("kafka:\n  bootstrap_servers: ''\n", "kafka.bootstrap_servers"),
        ("kafka:\n  bootstrap_servers: 'broker'\n", "kafka.bootstrap_servers"),
        ("kafka:\n  topics:\n    scores: 'my scores/topic'\n", "kafka.topics.scores"),
        ("redis:\n  url: 'redis://localhost:notaport/0'\n", "redis.url"),
        ("redis:\n  url: 'redis://localhost:6379/abc'\n", "redis.url"),
    ],
)
def test_values_that_would_fail_only_at_run_time_are_refused_up_front(
    tmp_path: Path, yaml_text: str, key: str
) -> None:
    """Each once passed validation, then failed the running service (an infinite deadline crashed
    the poll loop on every restart) or failed at start with an error that named no key."""
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError, match=key.replace(".", r"\.")):
        load_config(p, env={})


def test_usual_values_still_load(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  bootstrap_servers: 'k1.example:9092, 10.0.0.2:9093'\nredis:\n  url: 'rediss://h:6380/3'\n")
    cfg = load_config(p, env={})
    assert cfg.kafka.bootstrap_servers == "k1.example:9092, 10.0.0.2:9093" and cfg.redis.url.endswith("/3")


def _closed_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_run_says_in_one_line_which_dependency_it_could_not_reach(tmp_path: Path) -> None:
    """A Redis that is not there printed a 100-270 line traceback; now one line naming the key."""
    import os
    import subprocess
    import sys

    p = tmp_path / "c.yaml"
    p.write_text(f"redis:\n  url: redis://127.0.0.1:{_closed_port()}/0\nadmin:\n  port: {_closed_port()}\n")
    # The file alone: TOOLWITNESS_REDIS_URL / _KAFKA_BOOTSTRAP (which point the tests at running
    # servers) are also the service's overrides, and would replace the closed port.
    env = {k: v for k, v in os.environ.items() if k not in ("TOOLWITNESS_REDIS_URL", "TOOLWITNESS_KAFKA_BOOTSTRAP")}
    done = subprocess.run(
        [sys.executable, "-c", "from collector.cli import app; app()", "run", "--config", str(p)],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 1, done.stderr
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("toolwitness:")]
    assert line.startswith("toolwitness: could not start: Redis at redis.url 'redis://127.0.0.1:"), line


def test_demo_without_its_services_says_so_in_one_line() -> None:
    import os
    import subprocess
    import sys

    env = {**os.environ, "TOOLWITNESS_KAFKA_BOOTSTRAP": f"127.0.0.1:{_closed_port()}",
           "TOOLWITNESS_REDIS_URL": f"redis://127.0.0.1:{_closed_port()}/0"}
    done = subprocess.run([sys.executable, "-c", "from collector.cli import app; app()", "demo"],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("toolwitness:")]
    assert line.startswith("toolwitness: could not start:") and line.endswith("start them with `make services-up`")


@pytest.mark.parametrize(
    ("tree", "message"),
    [
        # a mis-nested tree ran as another tree: the substring criterion was silently gone
        ("type: otel_tool_call\n    aggregator: and\n    scorers: [{type: substring, substring: x}]",
         r"scorers\.t.*\['aggregator', 'scorers'\] do\(es\) not apply to type 'otel_tool_call'"),
        ("type: inverter\n    scorer: {type: otel_tool_call}\n    scorers: [{type: otel_tool_call}]",
         r"\['scorers'\] do\(es\) not apply to type 'inverter'"),
        ("type: substring\n    substring: x\n    threshold: 7",
         r"\['threshold'\] do\(es\) not apply to type 'substring'"),
        # a float-scale root was published as TRUE whatever its value
        ("type: plagiarism\n    reference_text: the quick brown fox",
         r"scorers\.t: a service tree's root must be true/false"),
    ],
)
def test_trees_that_would_run_as_something_else_are_refused(tmp_path: Path, tree: str, message: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(f"scorers:\n  t:\n    {tree}\n")
    with pytest.raises(ValueError, match=message):
        Decider(load_config(p, env={}))


def test_a_float_scale_scorer_under_a_threshold_is_a_service_tree(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  t:\n    type: threshold\n    threshold: 0.5\n"
                 "    scorer: {type: plagiarism, reference_text: the quick brown fox}\n")
    assert set(Decider(load_config(p, env={})).trees) == {"t"}


def test_the_effective_config_validate_config_prints_loads_again(tmp_path: Path) -> None:
    """A dumped config sets every key of every tree node (the bench and the chart round-trip
    configs): keys left at their defaults are not keys of another type."""
    from typer.testing import CliRunner

    from collector.cli import app

    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  t:\n    type: composite\n    aggregator: and\n"
                 "    scorers: [{type: otel_tool_call}, {type: substring, substring: done}]\n")
    first = CliRunner().invoke(app, ["validate-config", "--config", str(p)])
    assert first.exit_code == 0, first.output
    again = tmp_path / "effective.json"
    again.write_text(first.output)
    second = CliRunner().invoke(app, ["validate-config", "--config", str(again)])
    assert second.exit_code == 0, second.output
    assert set(Decider(load_config(again, env={})).trees) == {"t"}


@pytest.mark.parametrize(
    ("yaml_text", "message"),
    [
        # a second section replaced the first: the service ran against the default broker
        ("kafka:\n  bootstrap_servers: 'broker-a:9092'\nredis:\n  url: redis://r:6379/0\nkafka:\n  client_id: s-1\n",
         r"key kafka is given twice \(lines 1 and 5\)"),
        ("kafka:\n  group_id: a\n  group_id: b\n", r"key kafka\.group_id is given twice \(lines 2 and 3\)"),
        # the later tree (an inverter) silently reversed every TRUE/FALSE of the first
        ("scorers:\n  tools: {type: otel_tool_call}\n  tools: {type: inverter, scorer: {type: otel_tool_call}}\n",
         r"key scorers\.tools is given twice \(lines 2 and 3\)"),
        ("scorers:\n  t:\n    type: composite\n    aggregator: and\n    scorers:\n"
         "      - {type: otel_tool_call}\n      - {type: substring, substring: a, substring: b}\n",
         r"key scorers\.t\.scorers\[1\]\.substring is given twice \(line 7\)"),
    ],
    ids=["section", "key", "scorer-tree", "in-a-list"],
)
def test_a_key_given_twice_is_refused_with_its_path_and_lines(tmp_path: Path, yaml_text: str, message: str) -> None:
    p = tmp_path / "c.yaml"
    p.write_text(yaml_text)
    with pytest.raises(ConfigError, match=message):
        load_config(p, env={})


def test_a_merge_key_may_still_be_overridden(tmp_path: Path) -> None:
    # `<<: *base` then an explicit key is YAML's override, not a key given twice
    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  <<: {group_id: a, client_id: c}\n  group_id: b\n")
    kafka = load_config(p, env={}).kafka
    assert (kafka.group_id, kafka.client_id) == ("b", "c")


def test_validate_config_exits_2_on_a_key_given_twice(tmp_path: Path) -> None:
    from typer.testing import CliRunner

    from collector.cli import app

    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  group_id: a\nkafka:\n  group_id: b\n")
    result = CliRunner().invoke(app, ["validate-config", "--config", str(p)])
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and "key kafka is given twice (lines 1 and 3)" in result.output


def test_an_env_scorer_tree_is_added_to_the_trees_not_put_in_their_place(tmp_path: Path) -> None:
    # A variable adds or changes one tree: the default `tools` (client.expect's default scorer) was dropped.
    strict = {"TOOLWITNESS_SCORERS__STRICT__TYPE": "inverter",
              "TOOLWITNESS_SCORERS__STRICT__SCORER": '{"type": "otel_tool_call"}'}
    cfg = load_config(None, env=strict)
    assert set(Decider(cfg).trees) == {"tools", "strict"}
    assert cfg.scorers["tools"].type == "otel_tool_call" and cfg.scorers["strict"].type == "inverter"
    # a file's trees stay as they are (it names its own: no default is added to them)
    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  mine: {type: otel_tool_call}\n")
    assert set(load_config(p, env=strict).scorers) == {"mine", "strict"}


def test_env_text_keys_of_a_scorer_tree_are_taken_verbatim(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  secret: {type: substring, substring: x}\n"
                 "  t: {type: threshold, threshold: 0.5, scorer: {type: plagiarism, reference_text: x}}\n")
    cfg = load_config(p, env={"TOOLWITNESS_SCORERS__SECRET__SUBSTRING": "1234",  # JSON made it a number
                              "TOOLWITNESS_SCORERS__T__SCORER__REFERENCE_TEXT": "null",  # ... or None
                              "TOOLWITNESS_SCORERS__T__THRESHOLD": "0.7"})  # non-text keys are still JSON
    assert cfg.scorers["secret"].substring == "1234"
    t = cfg.scorers["t"]
    assert t.threshold == 0.7 and t.scorer is not None and t.scorer.reference_text == "null"
    cfg = load_config(p, env={"TOOLWITNESS_SCORERS__SECRET__SUBSTRING": "null"})
    assert cfg.scorers["secret"].substring == "null"


def test_env_errors_in_a_scorer_tree_name_the_variable() -> None:
    with pytest.raises(ConfigError, match=r"scorers\.t\.type: .*\(set by TOOLWITNESS_SCORERS__T__TYPE\)"):
        load_config(None, env={"TOOLWITNESS_SCORERS__T__TYPE": "nope"})
    # a tree's own check fails at the tree: the variables that set keys in it are named
    with pytest.raises(ConfigError, match=r"scorers\.tools: .*\['threshold'\] do\(es\) not apply to type "
                       r"'otel_tool_call'.*\(keys in it set by TOOLWITNESS_SCORERS__TOOLS__THRESHOLD\)"):
        load_config(None, env={"TOOLWITNESS_SCORERS__TOOLS__THRESHOLD": "0.5"})


@pytest.mark.parametrize("tenant", ["acme corp", "", "a:b", "x" * 65])
def test_a_default_tenant_no_client_could_name_is_refused(tmp_path: Path, tenant: str) -> None:
    # ToolwitnessClient, the exporter and the sidecar refuse such a tenant; so does the config now
    with pytest.raises(ValueError, match="tenant"):
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant=tenant)
    p = tmp_path / "c.yaml"
    p.write_text(f"tenant:\n  default: '{tenant}'\n")
    with pytest.raises(ConfigError, match=r"tenant\.default: .*is not \[A-Za-z0-9\._-\]\{1,64\}"):
        load_config(p, env={})
    with pytest.raises(ConfigError, match=r"tenant\.default: .*\(set by TOOLWITNESS_TENANT__DEFAULT\)"):
        load_config(None, env={"TOOLWITNESS_TENANT__DEFAULT": tenant})


def test_a_usual_default_tenant_still_loads(tmp_path: Path) -> None:
    p = tmp_path / "c.yaml"
    p.write_text("tenant:\n  default: tenant-b.1_A\n")
    assert load_config(p, env={}).tenant.default == "tenant-b.1_A"


def test_an_empty_tenant_header_is_refused_naming_the_key(tmp_path: Path) -> None:
    # "" was accepted: the sidecar then stamped its tenant under a header with no name
    p = tmp_path / "c.yaml"
    p.write_text("tenant:\n  header: ''\n")
    with pytest.raises(ConfigError, match=r"tenant\.header: .*must not be empty"):
        load_config(p, env={})
    with pytest.raises(ConfigError, match=r"tenant\.header: .*empty.*\(set by TOOLWITNESS_TENANT__HEADER\)"):
        load_config(None, env={"TOOLWITNESS_TENANT__HEADER": ""})
    assert load_config(None, env={"TOOLWITNESS_TENANT__HEADER": "x-tenant"}).tenant.header == "x-tenant"


@pytest.mark.parametrize(
    ("var", "meant"),
    [
        ("TOOLWITNESS_KAFKA", "TOOLWITNESS_KAFKA__BOOTSTRAP_SERVERS"),
        ("TOOLWITNESS_REDIS", "TOOLWITNESS_REDIS__URL"),
        ("TOOLWITNESS_SCORERS", "TOOLWITNESS_SCORERS__<NAME>__TYPE"),
        ("TOOLWITNESS_SCORERS_STRICT_TYPE", "TOOLWITNESS_SCORERS__<NAME>__<KEY>"),
    ],
)
def test_a_section_without_the_two_underscore_separator_is_refused(var: str, meant: str) -> None:
    # these were silently ignored: the service ran with the file's (or the default) values
    with pytest.raises(ConfigError, match=rf"{var} is not read: .*{re.escape(meant)}"):
        load_config(None, env={var: '{"bootstrap_servers": "k:9092", "url": "redis://r:1/0", "t": {"type": "x"}}'})


def test_toolwitness_variables_that_are_not_config_are_left_alone(caplog: pytest.LogCaptureFixture) -> None:
    # the secrets the config names, the boundary's switches, the eval and test-service paths
    others = {name: "x" for name in (
        "TOOLWITNESS_KAFKA_SASL_USERNAME", "TOOLWITNESS_KAFKA_SASL_PASSWORD", "TOOLWITNESS_REDIS_PASSWORD",
        "TOOLWITNESS_SIDECAR_TOKEN", "TOOLWITNESS_TOOL_INTERCEPT", "TOOLWITNESS_POISONING_ENDPOINT",
        "TOOLWITNESS_POISONING_TOKEN", "TOOLWITNESS_POISONING_TLS", "TOOLWITNESS_POISONING_CA_FILE",
        "TOOLWITNESS_SCORER_EVALS_PATH", "TOOLWITNESS_EVAL_REGISTRY", "TOOLWITNESS_SERVICES_REDIS_PORT",
        "TOOLWITNESS_SERVICES_STATE_DIR", "TOOLWITNESS_TAILSAMPLING_BIN",
        # Kubernetes service links of Services named toolwitness / toolwitness-kafka
        "TOOLWITNESS_PORT", "TOOLWITNESS_SERVICE_HOST", "TOOLWITNESS_KAFKA_PORT",
    )}
    with caplog.at_level("WARNING", logger="toolwitness.config"):
        assert load_config(None, env=others) == load_config(None, env={})
        # a service link that reads like admin.port is no typo of ours: a warning, not a refusal
        assert load_config(None, env={"TOOLWITNESS_ADMIN_PORT": "tcp://10.0.0.7:8888"}).admin.port == 8888
    assert [r.getMessage() for r in caplog.records] == [
        "config: TOOLWITNESS_ADMIN_PORT is not read (its value looks like a Kubernetes service link; "
        "the config key would be TOOLWITNESS_ADMIN__PORT)"
    ]


def test_a_scorer_tree_from_env_that_does_not_build_names_the_variables(tmp_path: Path) -> None:
    # the config validates key by key; building the tree fails later, and named only scorers.t
    env = {"TOOLWITNESS_SCORERS__T__TYPE": "threshold", "TOOLWITNESS_SCORERS__T__THRESHOLD": "0.5",
           "TOOLWITNESS_SCORERS__T__SCORER": '{"type": "substring", "substring": "x"}'}
    with pytest.raises(ValueError, match=r"scorers\.t: threshold needs a float-scale scorer \(keys in it set by "
                       r"TOOLWITNESS_SCORERS__T__SCORER, TOOLWITNESS_SCORERS__T__THRESHOLD, "
                       r"TOOLWITNESS_SCORERS__T__TYPE\)"):
        Decider(load_config(None, env=env))
    with pytest.raises(ValueError, match=r"scorers\.t: .* needs scorers \(set by TOOLWITNESS_SCORERS__T\)"):
        Decider(load_config(None, env={"TOOLWITNESS_SCORERS__T": '{"type": "composite"}'}))
    # `run` and `validate-config` print it in one line
    from typer.testing import CliRunner

    from collector.cli import app

    result = CliRunner().invoke(app, ["validate-config"], env={"TOOLWITNESS_SCORERS__T__TYPE": "composite"})
    assert result.exit_code == 2, result.output
    assert "scorers.t: type 'composite' needs scorers (keys in it set by TOOLWITNESS_SCORERS__T__TYPE)" in result.output
    # a tree from the file alone names no variable
    p = tmp_path / "c.yaml"
    p.write_text("scorers:\n  t:\n    type: composite\n")
    with pytest.raises(ValueError, match=r"needs scorers$"):
        Decider(load_config(p, env={"TOOLWITNESS_KAFKA__GROUP_ID": "g"}))


def test_sidecar_says_in_one_line_that_it_could_not_reach_kafka() -> None:
    """A sidecar that could not start printed a ~100-line traceback; now one line naming the key."""
    import os
    import subprocess
    import sys

    env = {**os.environ, "TOOLWITNESS_KAFKA_BOOTSTRAP": f"127.0.0.1:{_closed_port()}",
           "TOOLWITNESS_KAFKA__REQUEST_TIMEOUT_MS": "2000"}
    done = subprocess.run(
        [sys.executable, "-c", "from collector.cli import app; app()", "sidecar", "--listen", "127.0.0.1:0"],
        capture_output=True, text=True, timeout=120, env=env,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "Traceback" not in done.stderr and "──" not in done.stderr  # neither plain nor rich
    (line,) = [x for x in done.stderr.splitlines() if x.startswith("toolwitness")]
    assert line.startswith("toolwitness sidecar: could not start: Kafka at kafka.bootstrap_servers '127.0.0.1:"), line


def test_sidecar_says_in_one_line_that_its_listen_address_is_taken(monkeypatch: pytest.MonkeyPatch) -> None:
    import socket

    from typer.testing import CliRunner

    from collector.cli import app
    from collector.receivers.otlp_grpc import OtlpGrpcReceiver

    async def no_kafka(self: OtlpGrpcReceiver) -> None:  # the bind comes after the Kafka producer
        pass

    monkeypatch.setattr(OtlpGrpcReceiver, "_before_start", no_kafka)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = CliRunner().invoke(app, ["sidecar", "--listen", f"127.0.0.1:{port}"])
    assert result.exit_code == 1, result.output
    assert isinstance(result.exception, SystemExit)  # no exception escaped: no traceback
    assert f"toolwitness sidecar: could not start: otlp_grpc: cannot listen on 127.0.0.1:{port}: " in result.output
    assert result.output.rstrip().endswith("(--listen)")


def test_python_dash_m_collector_cli_runs_the_command_line(tmp_path: Path) -> None:
    """``python -m collector.cli validate-config`` exited 0 having done nothing (no ``__main__``
    guard): a container or job started that way "succeeded" without running anything."""
    import subprocess
    import sys

    p = tmp_path / "c.yaml"
    p.write_text("kafka:\n  max_poll_records: lots\n")
    done = subprocess.run([sys.executable, "-m", "collector.cli", "validate-config", "--config", str(p)],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, (done.stdout, done.stderr)
    assert "kafka.max_poll_records" in done.stderr


def test_a_session_timeout_the_brokers_refuse_is_named_at_start() -> None:
    """The config allows 3000 ms; a broker with the default group.min.session.timeout.ms (6000)
    refuses the join, and the one line said only 'Kafka at kafka.bootstrap_servers ...', as if the
    brokers were unreachable."""
    from aiokafka.errors import InvalidSessionTimeoutError

    from collector.cli import _start_failure
    from collector.config import ServiceConfig

    cfg = ServiceConfig.model_validate({"kafka": {"session_timeout_ms": 4000}})
    line = _start_failure(cfg, InvalidSessionTimeoutError())
    assert line.startswith("kafka.session_timeout_ms (4000) is refused by the brokers"), line
    assert "group.min.session.timeout.ms" in line


def test_an_empty_scorers_section_is_refused(tmp_path: Path) -> None:
    """`scorers: {}` loaded, and every expectation was then dead-lettered as unknown_scorer."""
    p = tmp_path / "c.yaml"
    p.write_text("scorers: {}\n")
    with pytest.raises(ConfigError, match=r"scorers.*no scorer tree.*leave `scorers:` out"):
        load_config(p, env={})
