"""OTLP requests with strings that are not UTF-8, read anyway (as the OpenTelemetry Collector does).

The Go Collector passes such strings through; the protobuf runtime here refuses the whole
message for one bad byte, which would drop every good span batched with it. A second reading
uses a copy of the OTLP schema in which every ``string`` field is ``bytes`` (nothing else
differs), then rebuilds the real message with each bad sequence replaced by U+FFFD: what the
Collector's JSON encoding writes for the same input, so both encodings give the same facts.
"""

from __future__ import annotations

from typing import Any

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import DecodeError, Message
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest

__all__ = ["parse_lenient"]

_PREFIX = "toolwitness_lenient"


def _rename(type_name: str) -> str:
    return f".{_PREFIX}{type_name}" if type_name.startswith(".opentelemetry.") else type_name


def _bytes_for_strings(msg: descriptor_pb2.DescriptorProto) -> None:
    for f in msg.field:
        if f.type == descriptor_pb2.FieldDescriptorProto.TYPE_STRING:
            f.type = descriptor_pb2.FieldDescriptorProto.TYPE_BYTES
        if f.type_name:
            f.type_name = _rename(f.type_name)
    for nested in msg.nested_type:
        _bytes_for_strings(nested)


def _lenient_request_class() -> type[Message]:
    pool = descriptor_pool.DescriptorPool()
    order: list[Any] = []

    def visit(fd: Any) -> None:
        for dep in fd.dependencies:
            visit(dep)
        if fd not in order:
            order.append(fd)

    visit(trace_service_pb2.DESCRIPTOR)
    for fd in order:
        proto = descriptor_pb2.FileDescriptorProto()
        fd.CopyToProto(proto)
        proto.name = f"{_PREFIX}/{proto.name}"
        proto.package = f"{_PREFIX}.{proto.package}"
        proto.dependency[:] = [f"{_PREFIX}/{d}" for d in proto.dependency]
        del proto.service[:]
        for msg in proto.message_type:
            _bytes_for_strings(msg)
        pool.Add(proto)
    name = f"{_PREFIX}.{ExportTraceServiceRequest.DESCRIPTOR.full_name}"
    return message_factory.GetMessageClass(pool.FindMessageTypeByName(name))


_LENIENT: type[Message] | None = None


def _copy(src: Message, dst: Message) -> None:
    fields = dst.DESCRIPTOR.fields_by_name
    for fd, value in src.ListFields():
        target = fields[fd.name]
        repeated = fd.is_repeated
        if fd.type == FieldDescriptor.TYPE_MESSAGE:
            if repeated:
                out = getattr(dst, fd.name)
                for item in value:
                    _copy(item, out.add())
            else:
                sub = getattr(dst, fd.name)
                sub.SetInParent()  # present even when empty, as parsed
                _copy(value, sub)
        elif target.type == FieldDescriptor.TYPE_STRING:
            if repeated:
                getattr(dst, fd.name).extend(v.decode("utf-8", "replace") for v in value)
            else:
                setattr(dst, fd.name, value.decode("utf-8", "replace"))
        elif repeated:
            getattr(dst, fd.name).extend(value)
        else:
            setattr(dst, fd.name, value)


def parse_lenient(value: bytes) -> ExportTraceServiceRequest:
    """``ExportTraceServiceRequest`` of ``value`` with strings that are not UTF-8 read as U+FFFD.
    Raises DecodeError (or RecursionError) when the bytes are not such a request at all."""
    global _LENIENT
    if _LENIENT is None:
        _LENIENT = _lenient_request_class()
    raw = _LENIENT()
    raw.ParseFromString(value)
    req = ExportTraceServiceRequest()
    try:
        _copy(raw, req)
    except (TypeError, ValueError) as exc:  # a value the real schema refuses
        raise DecodeError(f"not an OTLP request: {exc}") from None
    return req
