"""Decoding input records: OTLP span batches (otlp_proto / otlp_json) and their tenant.

Records are decoded once; only what scoring needs is kept. A record that cannot be
decoded raises ``RecordDecodeError`` with a reason code for the DLQ header. A record
with some bad spans keeps its good spans; the bad ones are reported per record.
"""

from __future__ import annotations

import base64
import json
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.config import ServiceConfig
from scoring.normalize.spans import AttrValue, NeutralSpan, SpanDecodeError, from_otlp_span, otlp_attributes

#: matched with fullmatch: ``$`` alone would also accept a trailing newline ("acme\n").
TENANT_RE = re.compile(r"[A-Za-z0-9._-]{1,64}")


class RecordDecodeError(ValueError):
    """A record that cannot be used at all. ``reason`` is the DLQ reason code."""

    retriable = False

    def __init__(self, reason: str, detail: str) -> None:
        super().__init__(f"{reason}: {detail}")
        self.reason = reason
        self.detail = detail


@dataclass(slots=True)
class DecodedRecord:
    """The spans of one record, grouped by (tenant, trace id), plus per-span rejections."""

    spans: list[tuple[str, NeutralSpan]] = field(default_factory=list)
    #: (tenant, trace id or "", reason, detail) for spans that were not kept.
    rejected: list[tuple[str, str, str, str]] = field(default_factory=list)


_ID_FIELDS = ("traceId", "spanId", "parentSpanId")


def _hex_ids_to_base64(node: Any) -> Any:
    """OTLP/JSON carries ids as hex; protobuf's JSON mapping expects base64 for bytes."""
    if isinstance(node, dict):
        out = {}
        for k, v in node.items():
            if k in _ID_FIELDS and isinstance(v, str) and v:
                try:
                    out[k] = base64.b64encode(bytes.fromhex(v)).decode()
                except ValueError:
                    raise RecordDecodeError("invalid_id", f"{k} is not hex: {v[:40]!r}") from None
            else:
                out[k] = _hex_ids_to_base64(v)
        return out
    if isinstance(node, list):
        return [_hex_ids_to_base64(x) for x in node]
    return node


def parse_request(value: bytes, encoding: str) -> ExportTraceServiceRequest:
    req = ExportTraceServiceRequest()
    if encoding == "otlp_json":
        try:
            doc = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise RecordDecodeError("invalid_json", str(exc)[:200]) from None
        if not isinstance(doc, dict) or ("resourceSpans" not in doc and "resource_spans" not in doc):
            raise RecordDecodeError("not_otlp_json", "JSON document has no resourceSpans")
        try:
            json_format.ParseDict(_hex_ids_to_base64(doc), req, ignore_unknown_fields=True)
        except (json_format.ParseError, RecursionError, TypeError, ValueError) as exc:
            if isinstance(exc, RecordDecodeError):
                raise
            raise RecordDecodeError("not_otlp_json", str(exc)[:200]) from None
    else:
        try:
            req.ParseFromString(value)
        except (DecodeError, RecursionError) as exc:
            raise RecordDecodeError("undecodable_protobuf", str(exc)[:200]) from None
    if not req.resource_spans or not any(ss.spans for rs in req.resource_spans for ss in rs.scope_spans):
        raise RecordDecodeError("no_spans", "record decoded but holds no spans")
    return req


def record_tenant(headers: Sequence[tuple[str, bytes]], resource: Mapping[str, AttrValue], cfg: ServiceConfig) -> str:
    for k, v in headers:
        if k == cfg.tenant.header:
            return v.decode("utf-8", "replace")
    t = resource.get(cfg.tenant.resource_attribute)
    return t if isinstance(t, str) and t else cfg.tenant.default


def decode_span_record(value: bytes, headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig) -> DecodedRecord:
    """Decode one span record. Raises RecordDecodeError if nothing in it is usable."""
    if len(value) > cfg.kafka.max_record_bytes:
        limit = cfg.kafka.max_record_bytes
        raise RecordDecodeError("record_too_large", f"{len(value)} bytes > max_record_bytes {limit}")
    req = parse_request(value, cfg.kafka.encoding)
    out = DecodedRecord()
    max_attrs = cfg.limits.max_attributes_per_span
    for rs in req.resource_spans:
        resource = otlp_attributes(rs.resource.attributes)
        tenant = record_tenant(headers, resource, cfg)
        if not TENANT_RE.fullmatch(tenant):
            raise RecordDecodeError("invalid_tenant", f"tenant {tenant[:80]!r} is not [A-Za-z0-9._-]{{1,64}}")
        for ss in rs.scope_spans:
            for span in ss.spans:
                trace_hex = span.trace_id.hex() if len(span.trace_id) == 16 else ""
                if len(span.attributes) > max_attrs:
                    out.rejected.append(
                        (tenant, trace_hex, "too_many_attributes", f"{len(span.attributes)} > {max_attrs}")
                    )
                    continue
                try:
                    out.spans.append((tenant, from_otlp_span(span, resource)))
                except SpanDecodeError as exc:
                    out.rejected.append((tenant, trace_hex, "invalid_span", str(exc)))
    if not out.spans and out.rejected:
        first = out.rejected[0]
        raise RecordDecodeError(first[2], first[3])
    return out
