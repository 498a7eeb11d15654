"""What a conformance agent leaves behind: the spans its framework emitted, and what its tools got.

Runs inside a framework's own virtualenv (which may not hold toolwitness): it needs only the
OpenTelemetry SDK and its OTLP protobuf encoder. The ground truth is written by the tool bodies
themselves (``Witness.record``), never read back from the spans.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

#: the tools every conformance agent offers its (scripted) model; ``send_email`` is never called
TOOLS = ("get_weather", "book_trip", "fail_tool", "send_email")
#: what the scripted model asks for, in this order (the agent runs them one after the other)
SCRIPT: tuple[tuple[str, dict[str, Any]], ...] = (
    ("get_weather", {"city": "Paris", "units": "metric"}),
    (
        "book_trip",
        {"trip": {"city": "Rome", "dates": {"from": "2026-05-01", "to": "2026-05-04"}, "travellers": ["ada", "bob"]}},
    ),
    ("get_weather", {"city": "Rome", "units": "metric"}),
    ("fail_tool", {"reason": "boom"}),
)
FINAL_ANSWER = "done"


class ToolFailed(RuntimeError):
    """What ``fail_tool`` raises: its body ran, and failed."""


class Witness:
    """The ground truth of one run: each tool body appends what it received, in call order."""

    def __init__(self) -> None:
        self.calls: list[dict[str, Any]] = []
        self.notes: dict[str, Any] = {}
        self._lock = threading.Lock()

    def record(self, tool: str, **arguments: Any) -> dict[str, Any]:
        """Called first thing in a tool body, with the arguments exactly as the body got them."""
        entry = {"tool": tool, "arguments": _plain(arguments), "at": time.time_ns(), "raised": False}
        with self._lock:
            self.calls.append(entry)
        return entry

    # The tool bodies every agent wraps in its framework's tool type.
    def get_weather(self, city: str, units: str) -> str:
        self.record("get_weather", city=city, units=units)
        return f"sunny in {city}"

    def book_trip(self, trip: dict[str, Any]) -> str:
        self.record("book_trip", trip=trip)
        return f"booked {trip.get('city') if isinstance(trip, dict) else trip}"

    def fail_tool(self, reason: str) -> str:
        self.record("fail_tool", reason=reason)["raised"] = True
        raise ToolFailed(f"failed on purpose: {reason}")

    def send_email(self, to: str, body: str) -> str:
        self.record("send_email", to=to, body=body)
        return "sent"


def _plain(value: Any) -> Any:
    """Arguments as JSON values (a pydantic model or a mapping proxy as the dict it holds)."""
    if hasattr(value, "model_dump"):
        return _plain(value.model_dump())
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    return value


@contextmanager
def captured(out: Path, scenario: str) -> Iterator[tuple[TracerProvider, Witness]]:
    """A real SDK provider (set as the global one) whose finished spans, and the witness's calls,
    are written to ``out`` (``spans.pb``: one OTLP ``ExportTraceServiceRequest``; ``truth.json``)
    when the block ends, even if the agent raised."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource.create({"service.name": f"conformance-{scenario}"}))
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    witness = Witness()
    error: BaseException | None = None
    try:
        yield provider, witness
    except BaseException as e:
        error = e
        raise
    finally:
        provider.force_flush()
        spans = exporter.get_finished_spans()
        out.mkdir(parents=True, exist_ok=True)
        (out / "spans.pb").write_bytes(encode_spans(spans).SerializeToString())
        truth = {
            "scenario": scenario,
            "calls": witness.calls,
            "notes": witness.notes,
            "trace_ids": sorted({f"{s.context.trace_id:032x}" for s in spans}),
            "span_count": len(spans),
            "error": repr(error) if error else None,
        }
        (out / "truth.json").write_text(json.dumps(truth, indent=1, sort_keys=True))
