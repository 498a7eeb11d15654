"""``toolwitness smoke`` under Kafka ACLs: the control plane's credentials register the expectations
(the config's), a span producer's write the spans, as an agent's exporter would (the control plane
may never write spans, span producers never the control topic)."""

from __future__ import annotations

import pytest

from collector.config import ServiceConfig
from collector.otel import KafkaSpanExporter
from collector.smoke import _span_exporter

ENV = {
    "TOOLWITNESS_KAFKA_SASL_USERNAME": "control-plane", "TOOLWITNESS_KAFKA_SASL_PASSWORD": "cp-secret",
    "SMOKE_SPANS_USER": "span-producer", "SMOKE_SPANS_PASSWORD": "sp-secret",
}


@pytest.fixture
def cfg(monkeypatch: pytest.MonkeyPatch) -> ServiceConfig:
    for k, v in ENV.items():
        monkeypatch.setenv(k, v)
    return ServiceConfig.model_validate(
        {"kafka": {"security": {"protocol": "SASL_PLAINTEXT", "sasl_mechanism": "SCRAM-SHA-512"}}}
    )


def credentials(exporter: object) -> tuple[str, str]:
    assert isinstance(exporter, KafkaSpanExporter)
    kwargs = exporter._kafka_kwargs
    return kwargs["sasl_plain_username"], kwargs["sasl_plain_password"]


def test_spans_go_out_as_the_span_producer_when_given(cfg: ServiceConfig) -> None:
    exporter = _span_exporter(cfg, "toolwitness-smoke", None, 5.0, ("SMOKE_SPANS_USER", "SMOKE_SPANS_PASSWORD"))
    try:
        assert credentials(exporter) == ("span-producer", "sp-secret")
    finally:
        exporter.shutdown()


def test_without_them_the_configs_credentials_write_the_spans(cfg: ServiceConfig) -> None:
    exporter = _span_exporter(cfg, "toolwitness-smoke", None, 5.0, None)
    try:
        assert credentials(exporter) == ("control-plane", "cp-secret")
    finally:
        exporter.shutdown()


def test_a_span_producer_variable_not_set_is_named(cfg: ServiceConfig) -> None:
    with pytest.raises(ValueError, match="SMOKE_UNSET_PASSWORD"):
        _span_exporter(cfg, "toolwitness-smoke", None, 5.0, ("SMOKE_SPANS_USER", "SMOKE_UNSET_PASSWORD"))
