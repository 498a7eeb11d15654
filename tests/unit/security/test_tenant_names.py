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
