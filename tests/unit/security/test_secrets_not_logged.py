"""No secret is ever logged (issue 9): SASL credentials through every Kafka client toolwitness
builds, with every logger at DEBUG.

No broker here has a SASL listener, so a fake one (fake_kafka.py) takes the clients through the
real credential exchange: ApiVersions, SaslHandshake, SaslAuthenticate (then refuses). The test
checks that the password really went over the wire (so the sensitive code path ran) and that it
appears nowhere in the captured log output -- message, arguments, exception text.
aiokafka logs each request's repr at DEBUG, SaslAuthenticateRequest included (the PLAIN password
in clear); collector.client installs a filter that redacts it whenever SASL is configured.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Iterator

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from collector.client import ToolwitnessClient
from collector.config import KafkaConfig, KafkaSecurityConfig
from collector.exporters.kafka import KafkaExporter
from collector.otel import KafkaSpanExporter
from tests.unit.security.fake_kafka import FakeSaslBroker

USER_ENV, PASSWORD_ENV = "TOOLWITNESS_KAFKA_SASL_USERNAME", "TOOLWITNESS_KAFKA_SASL_PASSWORD"


@pytest.fixture
def secret(monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    value = f"sasl-pw-{uuid.uuid4().hex}"
    monkeypatch.setenv(USER_ENV, "toolwitness-svc")
    monkeypatch.setenv(PASSWORD_ENV, value)
    yield value


def all_log_text(caplog: pytest.LogCaptureFixture) -> str:
    """Everything a handler could write: formatted text, each message with its args, exception text."""
    parts = [caplog.text]
    for r in caplog.records:
        parts.append(r.getMessage())
        parts.append(repr(r.args))
        if r.exc_info and r.exc_info[1] is not None:
            parts.append(repr(r.exc_info[1]))
    return "\n".join(parts)


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"])
async def test_sasl_credentials_never_reach_the_logs(
    mechanism: str, secret: str, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    security = KafkaSecurityConfig(protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism)
    async with FakeSaslBroker().running() as broker:
        # 1. the control-plane client
        client = ToolwitnessClient(bootstrap_servers=broker.bootstrap, security=security, timeout_s=3,
                                   create_topics=False)
        with pytest.raises(Exception):  # noqa: B017 - any refusal will do; what matters is the log
            await client.start()
        await client.stop()
        # 2. the service's exporter
        exporter = KafkaExporter(KafkaConfig(bootstrap_servers=broker.bootstrap, security=security,
                                             request_timeout_ms=3000))
        with pytest.raises(Exception):  # noqa: B017
            await exporter.start()
        await exporter.shutdown()
        # 3. the OTel SDK exporter (its own thread and loop)
        span_exporter = KafkaSpanExporter(bootstrap_servers=broker.bootstrap, security=security, timeout_s=3)
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(span_exporter))
        await asyncio.to_thread(lambda: provider.get_tracer("t").start_span("s").end())
        await asyncio.to_thread(provider.shutdown)
        sent = list(broker.auth_payloads)
    assert len(sent) >= 3, f"the clients never reached SaslAuthenticate: {broker.requests}"
    if mechanism == "PLAIN":
        assert all(secret.encode() in p for p in sent), "the fake broker did not receive the password"
    text = all_log_text(caplog)
    assert any("SaslAuthenticate" in r.getMessage() for r in caplog.records), "aiokafka's request log was not seen"
    assert secret not in text
    for p in sent:  # SCRAM: neither the client-first nor the client-final message
        assert p.decode("utf-8", "replace") not in text


def test_missing_sasl_credentials_name_the_variable_not_a_value(monkeypatch: pytest.MonkeyPatch) -> None:
    from collector.client import kafka_security_kwargs

    monkeypatch.setenv(USER_ENV, "user-value-7d1")
    monkeypatch.delenv(PASSWORD_ENV, raising=False)
    with pytest.raises(ValueError) as err:
        kafka_security_kwargs(KafkaSecurityConfig(protocol="SASL_SSL", sasl_mechanism="PLAIN"))
    assert PASSWORD_ENV in str(err.value) and "user-value-7d1" not in str(err.value)


@pytest.mark.parametrize(
    "url",
    [
        "redis://:hunter2-pw@redis:99999/0",  # a port out of range
        "redis://app:hunter2-pw@redis:6379/prod",  # a database that is no number
        "http://app:hunter2-pw@redis:6379/0",  # another scheme
        "redis://:hunter2@pw@redis:http/0",  # a password with an "@"
        "redis://redis:http/0?password=hunter2-pw",  # the password as a query parameter
    ],
)
def test_a_refused_redis_url_is_named_without_its_password(url: str) -> None:
    """The config error names the bad URL (it goes to stderr: the pod's log), never its password."""
    from typer.testing import CliRunner

    from collector.cli import app
    from collector.config import ConfigError, load_config

    with pytest.raises(ConfigError) as err:
        load_config(None, env={"TOOLWITNESS_REDIS_URL": url})
    assert "hunter2" not in str(err.value) and "redis" in str(err.value)
    out = CliRunner().invoke(app, ["validate-config"], env={"TOOLWITNESS_REDIS_URL": url})
    assert out.exit_code == 2 and "redis.url" in out.output and "hunter2" not in out.output
