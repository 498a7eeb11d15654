"""Decoding input records: OTLP span batches (otlp_proto / otlp_json) and their tenant.

Records are decoded once; only what scoring needs is kept. A record that cannot be
decoded raises ``RecordDecodeError`` with a reason code for the DLQ header. A record
with some bad spans keeps its good spans; the bad ones are reported per record.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import json_format
from google.protobuf.message import DecodeError
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

from collector.config import ServiceConfig
from collector.processors.normalize import cap_arguments, full_digest, pack_tool, span_fact
from collector.receivers.lenient import parse_lenient
from collector.wire.convert import TENANT
from scoring.normalize.spans import (
    SESSION_KEYS,
    AttrValue,
    NeutralSpan,
    SpanDecodeError,
    check_otlp_ids,
    check_otlp_times,
    fact_attributes,
    from_otlp_span,
    otlp_attributes,
    otlp_flags,
    session_of,
    span_rules,
)

#: the one tenant-name rule (``collector.wire.convert.TENANT``), matched with fullmatch: ``$``
#: alone would also accept a trailing newline ("acme\n").
TENANT_RE = TENANT


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
#: a trace id as OTLP/JSON writes it
_HEX_TRACE_ID = re.compile(r"[0-9a-fA-F]{32}")


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


def _json_span_ids(doc: dict[str, Any]) -> list[tuple[int, str, str, str]]:
    """Convert the ids of every span in an OTLP/JSON document in place; a span with an id that
    is not hex is taken out. Returns (resource index, trace id hex or "", reason, detail) per
    span taken out, so one bad span costs that span only, not the record's other spans."""
    bad: list[tuple[int, str, str, str]] = []
    resources = doc.get("resourceSpans", doc.get("resource_spans"))
    for i, rs in enumerate(resources if isinstance(resources, list) else []):
        scopes = rs.get("scopeSpans", rs.get("scope_spans")) if isinstance(rs, dict) else None
        for ss in scopes if isinstance(scopes, list) else []:
            spans = ss.get("spans") if isinstance(ss, dict) else None
            if not isinstance(spans, list):
                continue
            kept = []
            for span in spans:
                try:
                    kept.append(_hex_ids_to_base64(span))
                except RecordDecodeError as exc:
                    trace = span.get("traceId", span.get("trace_id")) if isinstance(span, dict) else None
                    ok = isinstance(trace, str) and _HEX_TRACE_ID.fullmatch(trace) is not None
                    bad.append((i, trace.lower() if ok and isinstance(trace, str) else "", exc.reason, exc.detail))
            ss["spans"] = kept
    return bad


def parse_json_request(value: bytes) -> tuple[ExportTraceServiceRequest, list[tuple[int, str, str, str]]]:
    """An OTLP/JSON record, and the spans taken out for ids that are not hex (see ``_json_span_ids``)."""
    req = ExportTraceServiceRequest()
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError) as exc:
        raise RecordDecodeError("invalid_json", str(exc)[:200]) from None
    if not isinstance(doc, dict) or ("resourceSpans" not in doc and "resource_spans" not in doc):
        raise RecordDecodeError("not_otlp_json", "JSON document has no resourceSpans")
    try:
        bad = _json_span_ids(doc)  # ids occur in spans (and their links) only
        json_format.ParseDict(doc, req, ignore_unknown_fields=True)
    except (json_format.ParseError, RecursionError, TypeError, ValueError, AttributeError) as exc:
        if isinstance(exc, RecordDecodeError):
            raise
        raise RecordDecodeError("not_otlp_json", str(exc)[:200]) from None
    if not bad:
        _require_spans(req)
    return req, bad


def _base64_ids_to_hex(node: Any) -> Any:
    if isinstance(node, dict):
        return {
            k: base64.b64decode(v).hex() if k in _ID_FIELDS and isinstance(v, str) else _base64_ids_to_hex(v)
            for k, v in node.items()
        }
    if isinstance(node, list):
        return [_base64_ids_to_hex(x) for x in node]
    return node


def otlp_json_bytes(req: ExportTraceServiceRequest) -> bytes:
    """A request as an ``otlp_json`` record, what the Collector's kafkaexporter writes with
    ``encoding: otlp_json``: the protobuf JSON mapping (lowerCamelCase names, enums as numbers)
    with trace and span ids as hex, as OTLP/JSON has them. ``parse_json_request`` reads it back."""
    doc = json_format.MessageToDict(req, use_integers_for_enums=True)
    return json.dumps(_base64_ids_to_hex(doc), separators=(",", ":"), ensure_ascii=False).encode()


def _require_spans(req: ExportTraceServiceRequest) -> None:
    if not req.resource_spans or not any(ss.spans for rs in req.resource_spans for ss in rs.scope_spans):
        raise RecordDecodeError("no_spans", "record decoded but holds no spans")


def parse_request(value: bytes, encoding: str) -> ExportTraceServiceRequest:
    if encoding == "otlp_json":
        req, bad = parse_json_request(value)
        if bad:
            _, _, reason, detail = bad[0]
            raise RecordDecodeError(reason, detail)
        return req
    req = ExportTraceServiceRequest()
    try:
        req.ParseFromString(value)
    except (DecodeError, RecursionError) as exc:
        try:  # strings that are not UTF-8 (the Collector passes them through): read as U+FFFD
            req = parse_lenient(value)
        except (DecodeError, RecursionError):
            raise RecordDecodeError("undecodable_protobuf", str(exc)[:200]) from None
    _require_spans(req)
    return req


def record_tenant(headers: Sequence[tuple[str, bytes]], resource: Mapping[str, AttrValue], cfg: ServiceConfig) -> str:
    for k, v in headers:
        if k == cfg.tenant.header:
            return v.decode("utf-8", "replace")
    key = cfg.tenant.resource_attribute
    t = resource.get(key) if key else None  # "": the agent's own attributes name no tenant
    return t if isinstance(t, str) and t else cfg.tenant.default


def decode_span_record(value: bytes, headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig) -> DecodedRecord:
    """Decode one span record. Raises RecordDecodeError if nothing in it is usable."""
    if len(value) > cfg.kafka.max_record_bytes:
        limit = cfg.kafka.max_record_bytes
        raise RecordDecodeError("record_too_large", f"{len(value)} bytes > max_record_bytes {limit}")
    bad_ids: list[tuple[int, str, str, str]] = []
    if cfg.kafka.encoding == "otlp_json":
        req, bad_ids = parse_json_request(value)
    else:
        req = parse_request(value, cfg.kafka.encoding)
    out = DecodedRecord()
    max_attrs = cfg.limits.max_attributes_per_span
    for index, rs in enumerate(req.resource_spans):
        resource = otlp_attributes(rs.resource.attributes)
        tenant = record_tenant(headers, resource, cfg)
        if not TENANT_RE.fullmatch(tenant):
            # this resource's spans only: the record's other resources (other agents) are kept
            out.rejected.extend(_bad_tenant(tenant, rs))
            out.rejected.extend(("", "", reason, detail) for i, _, reason, detail in bad_ids if i == index)
            continue
        out.rejected.extend((tenant, trace, reason, detail) for i, trace, reason, detail in bad_ids if i == index)
        for ss in rs.scope_spans:
            for span in ss.spans:
                trace_hex = span.trace_id.hex() if len(span.trace_id) == 16 else ""
                if len(span.attributes) > max_attrs:
                    out.rejected.append(
                        (tenant, trace_hex, "too_many_attributes", f"{len(span.attributes)} > {max_attrs}")
                    )
                    continue
                try:
                    out.spans.append((tenant, from_otlp_span(span, resource, ss.scope.name)))
                except SpanDecodeError as exc:
                    out.rejected.append((tenant, trace_hex, "invalid_span", str(exc)))
    if not out.spans and out.rejected:
        first = out.rejected[0]
        raise RecordDecodeError(first[2], first[3])
    return out


def _bad_tenant(tenant: str, rs: Any) -> list[tuple[str, str, str, str]]:
    """One rejection per span of a resource naming an invalid tenant (no trace: no tenant's state)."""
    detail = f"tenant {tenant[:80]!r} is not {TENANT.pattern}"
    return [("", "", "invalid_tenant", detail) for ss in rs.scope_spans[:] for _ in ss.spans[:]]


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise ValueError("truncated varint")
        b = buf[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7


def _fields(buf: bytes, pos: int, end: int, *, cut: bool = False) -> Iterator[tuple[int, int, int]]:
    """(field number, start, end) of each length-delimited field of one protobuf message; other
    wire types are skipped. Raises ValueError on bytes that are not protobuf. ``cut``: a field
    running past ``end`` (a record cut short) is given up to ``end``, and is the last one."""
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        field_no, wire = tag >> 3, tag & 7
        if wire == 0:
            _, pos = _varint(buf, pos, end)
        elif wire == 1:
            pos += 8
        elif wire == 5:
            pos += 4
        elif wire == 2:
            n, pos = _varint(buf, pos, end)
            if pos + n > end:
                if cut:
                    yield field_no, pos, end
                    return
                raise ValueError("truncated field")
            yield field_no, pos, pos + n
            pos += n
        else:
            raise ValueError(f"wire type {wire}")
    if pos != end:
        raise ValueError("truncated message")


def _header_tenant(headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig) -> str | None:
    for k, v in headers:
        if k == cfg.tenant.header:
            return v.decode("utf-8", "replace")
    return None


def _resource_tenant(value: bytes, start: int, end: int, attribute: bytes, default: str) -> str:
    """The tenant attribute of one ``ResourceSpans`` (``value[start:end]``), read from the framing."""
    tenant = default
    for g, c, d in _fields(value, start, end, cut=True):  # ResourceSpans.resource (the rest may be cut)
        if g != 1:
            continue
        for h, kv_start, kv_end in _fields(value, c, d):  # Resource.attributes (KeyValue)
            if h != 1:
                continue
            key = None
            text = ""
            for i, x, y in _fields(value, kv_start, kv_end):
                if i == 1:
                    key = value[x:y]
                elif i == 2:  # AnyValue: string_value (1) as is, bytes_value (7) in hex
                    for j, u, w in _fields(value, x, y):
                        if j == 1:
                            text = value[u:w].decode("utf-8", "replace")
                        elif j == 7:
                            text = value[u:w].hex()
            if key == attribute:  # a repeated key: the last one counts, as in decoding
                tenant = text or default
    return tenant


def record_tenants(value: bytes, headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig) -> set[str]:
    """The tenants of a span record that will not be decoded (too large, unparseable): its header,
    else the resource attribute of each of its resources, read from the protobuf's framing
    without parsing its spans (what is unreadable names the default tenant)."""
    header = _header_tenant(headers, cfg)
    if header is not None:
        return {header}
    attribute = cfg.tenant.resource_attribute.encode()
    if not attribute or cfg.kafka.encoding != "otlp_proto":
        return {cfg.tenant.default}
    tenants: set[str] = set()
    try:
        for f, a, b in _fields(value, 0, len(value)):  # ExportTraceServiceRequest.resource_spans
            if f == 1:
                tenants.add(_resource_tenant(value, a, b, attribute, cfg.tenant.default))
    except ValueError:
        return {cfg.tenant.default}
    return tenants or {cfg.tenant.default}


def record_traces(value: bytes, headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig) -> set[tuple[str, str]]:
    """(tenant, trace id) of every span a record that will not be decoded shows, as far as it can
    be read: from the protobuf's framing (a string that is not UTF-8, a record too large), or from
    the JSON when that parses. A record need not be keyed by trace (the Collector's kafkaexporter
    does not by default), and each trace it held can never be proven complete now."""
    header = _header_tenant(headers, cfg)
    out: set[tuple[str, str]] = set()
    if cfg.kafka.encoding == "otlp_json":
        _json_traces(value, header, cfg, out)
        return out
    attribute = cfg.tenant.resource_attribute.encode()
    with contextlib.suppress(ValueError):  # truncated: what was read so far
        for f, a, b in _fields(value, 0, len(value), cut=True):  # ExportTraceServiceRequest.resource_spans
            if f != 1:
                continue
            tenant = header
            if tenant is None:
                tenant = cfg.tenant.default
                if attribute:
                    with contextlib.suppress(ValueError):  # its resource cut short: the default
                        tenant = _resource_tenant(value, a, b, attribute, tenant)
            for g, c, d in _fields(value, a, b, cut=True):  # ResourceSpans.scope_spans
                if g != 2:
                    continue
                for h, x, y in _fields(value, c, d, cut=True):  # ScopeSpans.spans
                    if h != 2:
                        continue
                    for i, u, w in _fields(value, x, y, cut=True):  # Span.trace_id
                        if i == 1 and w - u == 16:
                            out.add((tenant, value[u:w].hex()))
    return out


def _json_traces(value: bytes, header: str | None, cfg: ServiceConfig, out: set[tuple[str, str]]) -> None:
    try:
        doc = json.loads(value)
    except (ValueError, RecursionError):
        return
    key = cfg.tenant.resource_attribute

    def items(node: Any, *names: str) -> list[Any]:
        for n in names:
            if isinstance(node, dict) and isinstance(node.get(n), list):
                return list(node[n])
        return []

    for rs in items(doc, "resourceSpans", "resource_spans"):
        tenant = header
        if tenant is None:
            tenant = cfg.tenant.default
            resource = rs.get("resource") if isinstance(rs, dict) else None
            for kv in items(resource, "attributes"):
                if key and isinstance(kv, dict) and kv.get("key") == key and isinstance(kv.get("value"), dict):
                    text = kv["value"].get("stringValue", kv["value"].get("string_value"))
                    tenant = text if isinstance(text, str) and text else cfg.tenant.default
        for ss in items(rs, "scopeSpans", "scope_spans"):
            for span in items(ss, "spans"):
                trace = span.get("traceId", span.get("trace_id")) if isinstance(span, dict) else None
                if isinstance(trace, str) and _HEX_TRACE_ID.fullmatch(trace):
                    out.add((tenant, trace.lower()))


@dataclass(slots=True)
class DecodedFacts:
    """The span facts of one record (what ``decode_span_record`` + ``span_fact`` give), plus rejections."""

    #: (tenant, trace id hex, span fact, end time ns or 0) per kept span, in record order
    facts: list[tuple[str, str, dict[str, Any], int]] = field(default_factory=list)
    #: as ``DecodedRecord.rejected``
    rejected: list[tuple[str, str, str, str]] = field(default_factory=list)


_B64URL = bytes.maketrans(b"+/", b"-_")
_SESSION_KEYS = frozenset(SESSION_KEYS)


def decode_span_facts(
    value: bytes, headers: Sequence[tuple[str, bytes]], cfg: ServiceConfig, max_argument_bytes: int
) -> DecodedFacts:
    """``decode_span_record`` then ``span_fact`` per span, fused: the same facts, rejections and
    errors, straight from the protobuf (only the attributes a fact depends on are converted,
    no neutral span, no model). Raises RecordDecodeError if nothing in the record is usable.
    """
    out = DecodedFacts()
    if cfg.kafka.encoding == "otlp_json":  # rare: the general path
        decoded = decode_span_record(value, headers, cfg)
        out.rejected = decoded.rejected
        for tenant, neutral in decoded.spans:
            try:
                fact = span_fact(neutral, max_argument_bytes)
            except Exception as exc:  # as on the protobuf path below
                out.rejected.append((tenant, neutral.trace_id, "unreadable_span", f"{type(exc).__name__}: {exc}"[:200]))
                continue
            out.facts.append((tenant, neutral.trace_id, fact, neutral.end_time_unix_nano or 0))
        if not out.facts and out.rejected:
            first = out.rejected[0]
            raise RecordDecodeError(first[2], first[3])
        return out
    if len(value) > cfg.kafka.max_record_bytes:
        limit = cfg.kafka.max_record_bytes
        raise RecordDecodeError("record_too_large", f"{len(value)} bytes > max_record_bytes {limit}")
    req = parse_request(value, cfg.kafka.encoding)
    max_attrs = cfg.limits.max_attributes_per_span
    resource_keys = frozenset({*SESSION_KEYS, cfg.tenant.resource_attribute})
    facts = out.facts
    b64 = binascii.b2a_base64
    no_attrs: dict[str, AttrValue] = {}
    last_trace = b""
    trace_hex = ""
    #: parent id → base64url (most spans of a record share a parent)
    parents: dict[bytes, str] = {b"": ""}
    # [:] everywhere: iterating an upb repeated field ends in a (costly) formatted IndexError.
    for rs in req.resource_spans[:]:
        resource = fact_attributes(rs.resource.attributes, resource_keys)
        tenant = record_tenant(headers, resource, cfg)
        if not TENANT_RE.fullmatch(tenant):
            out.rejected.extend(_bad_tenant(tenant, rs))
            continue
        resource_session = session_of(no_attrs, resource) or ""
        for ss in rs.scope_spans[:]:
            scope = ss.scope.name
            for span in ss.spans[:]:
                trace_id = span.trace_id
                if trace_id != last_trace:  # the spans of a record mostly share one trace
                    last_trace = trace_id
                    trace_hex = trace_id.hex() if len(trace_id) == 16 else ""
                kvs = span.attributes
                if len(kvs) > max_attrs:
                    out.rejected.append((tenant, trace_hex, "too_many_attributes", f"{len(kvs)} > {max_attrs}"))
                    continue
                span_id = span.span_id
                parent = span.parent_span_id
                end = span.end_time_unix_nano
                try:
                    check_otlp_ids(trace_id, span_id, parent)
                    check_otlp_times(span.start_time_unix_nano, end)
                except SpanDecodeError as exc:
                    out.rejected.append((tenant, trace_hex, "invalid_span", str(exc)))
                    continue
                try:
                    sampled, remote = otlp_flags(span.flags)
                    attrs = fact_attributes(kvs) if kvs else no_attrs
                    rules = span_rules(
                        attrs,
                        status_error=span.status.code == 2,
                        ended=end > 0,
                        sampled=sampled,
                        dropped=span.dropped_attributes_count > 0,
                        scope=scope,
                        span_name=span.name,
                    )
                    # 8 bytes in base64url without padding: short_id() of the same id in hex.
                    short = b64(span_id, newline=False).translate(_B64URL, b"=").decode()
                    parent_short = parents.get(parent)
                    if parent_short is None:
                        parent_short = b64(parent, newline=False).translate(_B64URL, b"=").decode()
                        parents[parent] = parent_short
                    x: list[Any] | bool = False
                    if rules.name is not None:
                        full = rules.arguments
                        args, state = cap_arguments(full, rules.arguments_state, max_argument_bytes)
                        x = pack_tool(
                            short,
                            rules.name,
                            rules.failed,
                            span.start_time_unix_nano,
                            end,
                            state,
                            args,
                            rules.call_id,
                            rules.convention == "openinference",
                            rules.delivered,
                            full_digest(full) if full is not None and args != full else None,
                            rules.recorder,
                        )
                    fact = {
                        "i": short,
                        "p": parent_short,
                        "r": 1 if remote else 0,
                        "e": end // 1_000_000,
                        "f": list(rules.reasons),
                        "x": x,
                        # without a session key of its own a span has its resource's session
                        "s": (
                            resource_session if _SESSION_KEYS.isdisjoint(attrs) else session_of(attrs, resource) or ""
                        ),
                    }
                except Exception as exc:
                    # What the agent wrote must not stop the partition: the span is refused (its
                    # trace then never complete), the rest of the record is kept.
                    out.rejected.append((tenant, trace_hex, "unreadable_span", f"{type(exc).__name__}: {exc}"[:200]))
                    continue
                facts.append((tenant, trace_hex, fact, end))
    if not facts and out.rejected:
        first = out.rejected[0]
        raise RecordDecodeError(first[2], first[3])
    return out
