"""A tenant becomes part of every Redis key (``tw:{<tenant>:…}``), so every way in accepts the same
names, ``[A-Za-z0-9._-]{1,64}``: span records (header or resource attribute), control messages
(expectation, completion, cancel), and the control-plane client, which refuses up front a tenant
the service would dead-letter."""

from __future__ import annotations

import pytest

from collector.client import ToolwitnessClient
from collector.config import ServiceConfig
from collector.receivers.decode import RecordDecodeError, decode_span_record
from collector.wire.convert import ControlDecodeError, decode_control
from collector.wire.gen import control_pb2
from tests.integration.harness import new_trace_id, otlp_request, otlp_span

BAD = ["a:b", "acme\n", "a}b", "x" * 65, " ", "../x", "é"]
GOOD = ["acme", "tenant-b.1", "A_0", "x" * 64]


@pytest.mark.parametrize("tenant", BAD + GOOD)
def test_every_way_in_accepts_the_same_tenant_names(tenant: str) -> None:
    ok = tenant in GOOD
    record = otlp_request([otlp_span(new_trace_id(), name="s", start_ms=1, end_ms=2)]).SerializeToString()
    try:
        out = decode_span_record(record, [("toolwitness-tenant", tenant.encode())], ServiceConfig())
        assert ok and out.spans[0][0] == tenant
    except RecordDecodeError as exc:
        assert not ok and exc.reason == "invalid_tenant"
    for msg in (control_pb2.ControlMessage(cancel=control_pb2.CancelExpectation(tenant=tenant, expectation_id="e")),
                control_pb2.ControlMessage(completion=control_pb2.CompletionMarker(tenant=tenant, trace_id="ab" * 16))):
        try:
            decode_control(msg.SerializeToString())
            assert ok
        except ControlDecodeError as exc:
            assert not ok and exc.reason == "invalid_tenant"
    if ok:
        ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant=tenant)
    else:
        with pytest.raises(ValueError, match="tenant"):
            ToolwitnessClient(bootstrap_servers="127.0.0.1:1", tenant=tenant)


@pytest.mark.parametrize("tenant", BAD + GOOD)
def test_the_sidecar_accepts_the_same_tenant_names(tenant: str) -> None:
    from pydantic import ValidationError

    from collector.receivers.otlp_grpc import SidecarConfig

    if tenant in GOOD:
        assert SidecarConfig(tenant=tenant).tenant == tenant
    else:
        with pytest.raises(ValidationError, match="tenant"):
            SidecarConfig(tenant=tenant)


def test_the_tenant_rule_is_written_down_once() -> None:
    """The sidecar (and the span decoder) had their own copies of the regex: a change to the rule
    would have left them accepting tenants the service dead-letters, or refusing ones it takes."""
    from pathlib import Path

    import collector
    from collector.receivers.decode import TENANT_RE
    from collector.wire.convert import TENANT

    assert TENANT_RE is TENANT
    root = Path(collector.__file__).resolve().parent
    copies = [
        p.relative_to(root).as_posix()
        for p in sorted(root.rglob("*.py"))
        if "A-Za-z0-9._-]{1,64}" in p.read_text(encoding="utf-8")  # not the topic rule ({1,249})
    ]
    assert copies == ["wire/convert.py"]
