"""A record with strings that are not UTF-8 is read with U+FFFD (as the Collector's JSON encoding
writes it), not dropped whole with every good span batched beside the bad byte."""

from __future__ import annotations

import pytest
from google.protobuf.message import DecodeError
from hypothesis import given, settings
from hypothesis import strategies as st
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.receivers.decode import decode_span_facts
from collector.receivers.lenient import parse_lenient
from tests.unit.collector.test_fast_decode import config, records

MARK = "MARK\u00e9"


def _with_bad_byte() -> tuple[ExportTraceServiceRequest, bytes]:
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    spans = rs.scope_spans.add().spans
    tool = spans.add(
        trace_id=bytes(range(1, 17)), span_id=bytes(range(1, 9)), start_time_unix_nano=1, end_time_unix_nano=2
    )
    tool.attributes.add(key="gen_ai.operation.name").value.string_value = "execute_tool"
    tool.attributes.add(key="gen_ai.tool.name").value.string_value = "search"
    other = spans.add(
        trace_id=bytes(range(2, 18)), span_id=bytes(range(2, 10)), start_time_unix_nano=1, end_time_unix_nano=2
    )
    other.attributes.add(key="http.url").value.string_value = MARK
    return req, req.SerializeToString().replace(MARK.encode(), b"MARK\xc3X")


@settings(max_examples=200, deadline=None)
@given(rec=records())
def test_a_valid_request_reads_the_same_either_way(rec: tuple[bytes, list[tuple[str, bytes]]]) -> None:
    value, _ = rec
    assert parse_lenient(value) == ExportTraceServiceRequest.FromString(value)


def test_a_bad_byte_reads_as_the_replacement_character_and_every_span_is_kept() -> None:
    req, bad = _with_bad_byte()
    with pytest.raises(DecodeError):
        ExportTraceServiceRequest.FromString(bad)
    want = ExportTraceServiceRequest()
    want.CopyFrom(req)
    want.resource_spans[0].scope_spans[0].spans[1].attributes[0].value.string_value = "MARK\ufffdX"
    assert parse_lenient(bad) == want
    facts = decode_span_facts(bad, [], config(), 1024)
    assert [trace for _, trace, _, _ in facts.facts] == [bytes(range(1, 17)).hex(), bytes(range(2, 18)).hex()]
    assert facts.facts[0][2]["x"] and facts.rejected == []


@given(junk=st.binary(min_size=1, max_size=64))
def test_bytes_that_are_no_request_are_still_refused(junk: bytes) -> None:
    try:
        ExportTraceServiceRequest.FromString(junk)
    except DecodeError:
        with pytest.raises(DecodeError):
            parse_lenient(junk)
