"""``toolwitness bench pipeline``: the streaming service measured on real Kafka and Redis, in one run.

Figures, all from the same run so their ratios mean something on a
noisy machine:

- **floor**: spans/s of a bare aiokafka consumer (the service's consumer settings, a fresh
  group) that only consumes and decodes the records (``ExportTraceServiceRequest.ParseFromString``
  + ``scoring.normalize.iter_otlp_request``);
- **end to end**: spans/s of the in-process ``ToolwitnessService`` draining the same backlog
  until every span is applied and every batch's scores are produced (one expectation per trace
  registered beforehand through the control topic, so each trace is decided TRUE on the way);
  ``ratio = end to end / floor``;
- **ingest only**: the same kind of backlog (fresh trace ids) drained with no expectation
  registered, so what one decision costs the service is read off the two rates of this run;
- **time to verdict** p50/p99 at a stated load: a paced producer (its own process, so it does
  not share an interpreter with the service) sends traces at the target span rate; for each
  trace an expectation "tool X ran" was registered before. Latency = from the moment the record
  carrying tool X is handed to the producer to the moment the score is read from the scores
  topic by a consumer in that same process;
- **Redis bytes** of one 25-span, 10-tool trace: ``MEMORY USAGE`` summed over the trace's keys
  (one state key per trace; its pending and decided expectation ids are inside it).

Every record is one ``ExportTraceServiceRequest`` holding one whole trace (25 spans: an
``invoke_agent`` root, 14 chat spans, 10 ``execute_tool`` spans), keyed by the 32-hex trace id,
``otlp_proto``: what the Collector's kafkaexporter writes when it partitions by trace id.

Exit code: 0 every target met, 1 measured but a target missed, 2 the run failed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import math
import os
import pickle
import sys
import time
import uuid
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import Any, TypeVar, cast

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, KeyValue
from opentelemetry.proto.trace.v1.trace_pb2 import Span, TracesData
from redis.asyncio import Redis
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from collector.benches.common import (
    CpuMeter,
    Target,
    busy_text,
    consoles,
    emit,
    new_progress,
    percentile,
    percentiles,
    target_rows,
    task,
)
from collector.benches.instances import run_instances
from collector.client import build_expectation, topic_partitions
from collector.client import ensure_topics as create_topics
from collector.config import KafkaConfig, ServiceConfig, TopicsConfig, load_config
from collector.exporters.kafka import kafka_security_kwargs
from collector.pipeline.checkpoint import Batch, BatchResult, Checkpoint
from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import Keys
from collector.receivers.decode import decode_span_facts
from collector.wire.convert import decode_score_event
from collector.wire.gen import common_pb2, control_pb2
from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable
from scoring.normalize import iter_otlp_request

__all__ = [
    "TRACE_SPANS",
    "TRACE_TOOLS",
    "BenchTrace",
    "Rig",
    "make_trace",
    "make_traces",
    "percentile",
    "run_pipeline_bench",
    "trace_memory",
]

log = logging.getLogger("toolwitness.bench")

TRACE_SPANS = 25
TRACE_TOOLS = 10
PARTITIONS = 4
TENANT = "default"
EXPECTATION_DEADLINE = timedelta(minutes=15)
#: a tool no bench trace runs: the probe trace's second expectation stays pending (its pending set lives).
ABSENT_TOOL = "tool_never_called"

# The throughput and latency targets (they replace an earlier 0.5 ratio and 250 ms).
TARGET_RATIO = 0.6
TARGET_P99_MS = 100.0
TARGET_TRACE_BYTES = 2048
TARGET_SCALING = 1.6
#: the latency figures only count as "at the stated load" if the producer achieved this share of it.
RATE_TOLERANCE = 0.95


# --------------------------------------------------------------------------------------------------
# Workload
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class BenchTrace:
    trace_id: str  # 32 hex
    record: bytes  # otlp_proto ExportTraceServiceRequest with the whole trace
    tool: str  # the tool the trace's expectation asks for
    expectation_id: str
    #: the trace split into several records (empty: ``record`` alone carries it)
    parts: tuple[bytes, ...] = ()

    @property
    def records(self) -> tuple[bytes, ...]:
        return self.parts or (self.record,)


def _kv(key: str, value: str | int) -> KeyValue:
    if isinstance(value, int):
        return KeyValue(key=key, value=AnyValue(int_value=value))
    return KeyValue(key=key, value=AnyValue(string_value=value))


def make_trace(
    index: int,
    start_ns: int,
    *,
    expected_tool: int | None = None,
    spans: int = TRACE_SPANS,
    tools: int = TRACE_TOOLS,
    record_spans: int = 0,
) -> BenchTrace:
    """One trace of ``spans`` spans with ``tools`` tool executions (GenAI semconv).

    Children end before the root; children are in end order, the root is last (as an SDK
    exports them). The expectation asks for ``tool_<expected_tool>`` (default: index mod
    tools). ``record_spans`` > 0 also splits the trace into records of at most that many
    spans (``BenchTrace.parts``, in export order) — what an SDK batching by size sends.
    """
    if spans < 1 or tools < 0 or tools > spans - 1:
        raise ValueError(f"need spans >= 1 and 0 <= tools <= spans - 1, got {spans} spans, {tools} tools")
    trace_id = os.urandom(16)
    root_id = os.urandom(8)
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.extend(
        [
            _kv("service.name", "bench-agent"),
            _kv("telemetry.sdk.language", "python"),
            _kv("telemetry.sdk.name", "opentelemetry"),
            _kv("telemetry.sdk.version", "1.45.2"),
        ]
    )
    ss = rs.scope_spans.add()
    ss.scope.name = "toolwitness-bench"
    pairs = min(tools, spans - 1 - tools)
    kinds = ["chat", "tool"] * pairs + ["tool"] * (tools - pairs) + ["chat"] * (spans - 1 - tools - pairs)
    tool_no = 0
    step = 2_000_000
    for j, kind in enumerate(kinds):
        s = ss.spans.add()
        s.trace_id = trace_id
        s.span_id = os.urandom(8)
        s.parent_span_id = root_id
        s.flags = 0x101  # sampled, parent known to be local
        s.kind = Span.SPAN_KIND_INTERNAL
        s.start_time_unix_nano = start_ns + j * step
        s.end_time_unix_nano = start_ns + j * step + step * 3 // 4
        if kind == "chat":
            s.name = "chat gpt-4o-mini"
            s.attributes.extend(
                [
                    _kv("gen_ai.operation.name", "chat"),
                    _kv("gen_ai.provider.name", "openai"),
                    _kv("gen_ai.request.model", "gpt-4o-mini"),
                    _kv("gen_ai.usage.input_tokens", 812 + j),
                    _kv("gen_ai.usage.output_tokens", 64 + j),
                ]
            )
        else:
            name = f"tool_{tool_no}"
            s.name = f"execute_tool {name}"
            s.attributes.extend(
                [
                    _kv("gen_ai.operation.name", "execute_tool"),
                    _kv("gen_ai.tool.name", name),
                    _kv("gen_ai.tool.call.id", f"call_{os.urandom(6).hex()}"),
                    _kv("gen_ai.tool.call.arguments", json.dumps({"query": f"item {index}-{tool_no}", "limit": 5})),
                    _kv("gen_ai.tool.call.result", json.dumps({"status": "ok", "items": [index, tool_no, j]})),
                ]
            )
            tool_no += 1
    root = ss.spans.add()
    root.trace_id = trace_id
    root.span_id = root_id
    root.flags = 0x101
    root.kind = Span.SPAN_KIND_INTERNAL
    root.name = "invoke_agent bench-agent"
    root.start_time_unix_nano = start_ns
    root.end_time_unix_nano = start_ns + len(kinds) * step
    root.attributes.extend([_kv("gen_ai.operation.name", "invoke_agent"), _kv("gen_ai.agent.name", "bench-agent")])
    wanted = index if expected_tool is None else expected_tool
    tool = f"tool_{wanted % tools}" if tools else ABSENT_TOOL
    parts: tuple[bytes, ...] = ()
    if record_spans > 0 and spans > record_spans:
        out = []
        for i in range(0, spans, record_spans):
            part = ExportTraceServiceRequest()
            prs = part.resource_spans.add()
            prs.resource.CopyFrom(rs.resource)
            pss = prs.scope_spans.add()
            pss.scope.CopyFrom(ss.scope)
            pss.spans.extend(ss.spans[i : i + record_spans])
            out.append(part.SerializeToString())
        parts = tuple(out)
    return BenchTrace(trace_id.hex(), req.SerializeToString(), tool, uuid.uuid4().hex, parts)


def make_traces(
    n: int,
    *,
    on_trace: Callable[[], None] | None = None,
    spans: int = TRACE_SPANS,
    tools: int = TRACE_TOOLS,
    record_spans: int = 0,
) -> list[BenchTrace]:
    start = time.time_ns()
    out = []
    for i in range(n):
        out.append(make_trace(i, start + i * 1_000_000, spans=spans, tools=tools, record_spans=record_spans))
        if on_trace is not None:
            on_trace()
    return out


def _control_record(trace: BenchTrace, tool: str | None = None, expectation_id: str | None = None) -> bytes:
    exp = ScoringExpectation(conditions=(ToolsCalled(tools=(ToolCallRequirement(name=tool or trace.tool),)),))
    msg = build_expectation(
        expectation_id=expectation_id or trace.expectation_id,
        tenant=TENANT,
        scope=TraceScorable(trace_ids=(trace.trace_id,)),
        expectation=exp,
        deadline=EXPECTATION_DEADLINE,
    )
    return control_pb2.ControlMessage(expectation=msg).SerializeToString(deterministic=True)


def _marker_record(trace: BenchTrace) -> bytes:
    """The trace's completion marker with its span count (``ToolwitnessClient.mark_complete``)."""
    marker = control_pb2.CompletionMarker(tenant=TENANT, trace_id=trace.trace_id, span_count=TRACE_SPANS)
    return control_pb2.ControlMessage(completion=marker).SerializeToString(deterministic=True)


# --------------------------------------------------------------------------------------------------
# Redis state measurement
# --------------------------------------------------------------------------------------------------


async def trace_memory(redis: Redis, keys: Keys, tenant: str, trace_id: str) -> dict[str, int]:
    """``MEMORY USAGE`` (all samples) of one trace's keys (0 = key absent).

    A trace has one key: its state also holds its pending and decided expectation ids."""
    names = {"state": keys.state(tenant, trace_id)}
    out: dict[str, int] = {}
    for part, key in names.items():
        used = await redis.memory_usage(key, samples=0)
        out[part] = int(used or 0)
    return out


async def expectation_memory(redis: Redis, keys: Keys, tenant: str, expectation_id: str) -> dict[str, int]:
    """``MEMORY USAGE`` of one expectation's keys: its definition and its decision (payloads included)."""
    out: dict[str, int] = {}
    for part, key in (
        ("definition", keys.expectation(tenant, expectation_id)),
        ("decision", keys.decision(tenant, expectation_id)),
    ):
        used = await redis.memory_usage(key, samples=0)
        out[part] = int(used or 0)
    return out


# --------------------------------------------------------------------------------------------------
# Helpers
# --------------------------------------------------------------------------------------------------


def bench_config(bootstrap: str | None, redis_url: str | None) -> ServiceConfig:
    """The service config (env overrides honoured) with fresh topics, group and key prefix."""
    run = uuid.uuid4().hex[:10]
    data = load_config().model_dump()
    kafka = data["kafka"]
    if bootstrap:
        kafka["bootstrap_servers"] = bootstrap
    kafka["group_id"] = f"bench-{run}"
    kafka["topics"] = {
        "spans": f"bench-{run}-spans",
        "control": f"bench-{run}-control",
        "scores": f"bench-{run}-scores",
        "observations": f"bench-{run}-obs",
        "dlq": f"bench-{run}-dlq",
    }
    if redis_url:
        data["redis"]["url"] = redis_url
    data["redis"]["key_prefix"] = f"bench{run}"
    data["admin"]["port"] = 0
    data["instance"] = f"bench-{run}"
    return ServiceConfig.model_validate(data)


def _with_spans_topic(cfg: ServiceConfig, spans: str) -> ServiceConfig:
    data = cfg.model_dump()
    data["kafka"]["topics"]["spans"] = spans
    return ServiceConfig.model_validate(data)


def consumer_kwargs(k: KafkaConfig, group_id: str | None) -> dict[str, Any]:
    """The service consumer's settings (ToolwitnessService.start), for another group."""
    return {
        "bootstrap_servers": k.bootstrap_servers,
        "group_id": group_id,
        "enable_auto_commit": False,
        "auto_offset_reset": "earliest",
        "isolation_level": "read_committed",
        "max_poll_records": k.max_poll_records,
        "fetch_max_wait_ms": k.fetch_max_wait_ms,
        "fetch_max_bytes": max(52428800, k.max_record_bytes * 2),
        "max_partition_fetch_bytes": max(1048576, k.max_record_bytes + 65536),
        "request_timeout_ms": k.request_timeout_ms,
        **kafka_security_kwargs(k),
    }


def producer_kwargs(k: KafkaConfig, **extra: Any) -> dict[str, Any]:
    return {
        "bootstrap_servers": k.bootstrap_servers,
        "enable_idempotence": True,
        "acks": "all",
        "request_timeout_ms": k.request_timeout_ms,
        **kafka_security_kwargs(k),
        **extra,
    }


async def until(predicate: Callable[[], Awaitable[bool]], timeout: float, what: str, interval: float = 0.05) -> None:
    try:
        async with asyncio.timeout(timeout):
            while not await predicate():  # noqa: ASYNC110 - the state lives in Redis/Kafka, not in an Event
                await asyncio.sleep(interval)
    except TimeoutError:
        raise TimeoutError(f"bench: {what} not reached within {timeout:.0f}s") from None


async def _produce(
    k: KafkaConfig, topic: str, records: Sequence[tuple[bytes, bytes]], advance: Callable[[int], None] | None = None
) -> None:
    producer = AIOKafkaProducer(
        **producer_kwargs(k, linger_ms=5, max_batch_size=1 << 20, max_request_size=max(1 << 20, k.max_record_bytes))
    )
    await asyncio.wait_for(producer.start(), timeout=30)
    try:
        pending = []
        for key, value in records:
            pending.append(await producer.send(topic, value=value, key=key))
            if advance is not None:
                advance(1)
        async with asyncio.timeout(120):
            await asyncio.gather(*pending)
    finally:
        await producer.stop()


# --------------------------------------------------------------------------------------------------
# Measurement hooks
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Meter:
    """Counts spans applied by the service's checkpoint, batch by batch."""

    first_start: float = 0.0
    last_end: float = 0.0
    spans: int = 0
    batches: int = 0
    target: int = 0
    reached: asyncio.Event = field(default_factory=asyncio.Event)
    on_spans: Callable[[int], None] | None = None
    #: records of every topic (spans and control), when the pass is timed on them (``record_target``)
    records: int = 0
    record_target: int = 0
    records_start: float = 0.0
    records_end: float = 0.0

    def reset(self, target: int, on_spans: Callable[[int], None] | None = None, *, record_target: int = 0) -> None:
        self.first_start = self.last_end = self.records_start = self.records_end = 0.0
        self.spans = self.batches = self.records = 0
        self.target = target
        self.record_target = record_target
        self.reached = asyncio.Event()
        self.on_spans = on_spans

    def batch(self, started: float, ended: float, res: BatchResult) -> None:
        if self.record_target and res.records:
            if self.records == 0:
                self.records_start = started
            self.records += res.records
            self.records_end = ended
            if self.records >= self.record_target:
                self.reached.set()
        if res.spans == 0:
            return
        if self.spans == 0:
            self.first_start = started
        self.spans += res.spans
        self.batches += 1
        self.last_end = ended
        if self.on_spans is not None:
            self.on_spans(res.spans)
        if self.target and self.spans >= self.target:
            self.reached.set()


class TimedCheckpoint(Checkpoint):
    """The service's own checkpoint, timed: the service runs unchanged, we only observe."""

    def __init__(self, base: Checkpoint, meter: Meter) -> None:
        super().__init__(base.cfg, base.store, base.engine, base.exporter, base.watermarks)
        self.meter = meter

    async def process(self, batch: Batch) -> BatchResult:
        started = time.perf_counter()
        res = await super().process(batch)
        self.meter.batch(started, time.perf_counter(), res)
        return res


@contextlib.asynccontextmanager
async def _service(cfg: ServiceConfig, meter: Meter | None = None) -> Any:
    service = ToolwitnessService(cfg, owns_process=True)
    if meter is not None:
        service.checkpoint = TimedCheckpoint(service.checkpoint, meter)
    async with service.serving(start_timeout=90):
        yield service


async def _registered(redis: Redis, keys: Keys, ids: Sequence[str]) -> int:
    n = 0
    for i in range(0, len(ids), 2000):
        chunk = ids[i : i + 2000]
        n += int(await redis.exists(*[keys.expectation(TENANT, e) for e in chunk]))
    return n


async def _decided_true(redis: Redis, keys: Keys, ids: Sequence[str]) -> tuple[int, int]:
    """(decided TRUE, of them marked published) among ``ids``."""
    true = published = 0
    for i in range(0, len(ids), 2000):
        async with redis.pipeline(transaction=False) as pipe:
            for e in ids[i : i + 2000]:
                pipe.hmget(keys.decision(TENANT, e), ["verdict", "pub"])
            rows = await pipe.execute()
        for verdict, pub in rows:
            if verdict == b"true":
                true += 1
                published += pub == b"1"
    return true, published


async def _committed_all(cfg: ServiceConfig, topic: str) -> bool:
    """True when the service group's committed offsets on ``topic`` equal the end offsets."""
    k = cfg.kafka
    admin = AIOKafkaAdminClient(bootstrap_servers=k.bootstrap_servers, **kafka_security_kwargs(k))
    consumer = AIOKafkaConsumer(**consumer_kwargs(k, None))
    await asyncio.wait_for(admin.start(), timeout=30)
    await asyncio.wait_for(consumer.start(), timeout=30)
    try:
        parts = [TopicPartition(topic, p) for p in sorted(await topic_partitions(consumer, topic))]
        if not parts:  # never "all committed" over no partitions
            return False
        ends = await consumer.end_offsets(parts)
        committed = await admin.list_consumer_group_offsets(k.group_id, partitions=parts)
        return all(committed.get(tp) is not None and committed[tp].offset == ends[tp] for tp in parts)
    finally:
        await consumer.stop()
        await admin.close()


# --------------------------------------------------------------------------------------------------
# Phases
# --------------------------------------------------------------------------------------------------


async def measure_floor(
    cfg: ServiceConfig,
    total_spans: int,
    advance: Callable[[int], None],
    *,
    normalize: bool = False,
    name: str = "floor",
) -> dict[str, float]:
    """Consume + decode the spans topic with a bare aiokafka consumer (a fresh group per ``name``).

    ``normalize``: decode as the service does (``decode_span_facts``: protobuf → span facts,
    tool executions and coverage reasons) instead of protobuf parse + span walk — what the
    service must spend per record before any state or decision work."""
    k = cfg.kafka
    max_arg = cfg.limits.max_argument_bytes
    consumer = AIOKafkaConsumer(**consumer_kwargs(k, f"{k.group_id}-{name}"))
    consumer.subscribe([k.topics.spans])
    await asyncio.wait_for(consumer.start(), timeout=60)
    spans = 0
    first = 0.0
    try:
        async with asyncio.timeout(max(120.0, total_spans / 500)):
            while spans < total_spans:
                batch = await consumer.getmany(timeout_ms=k.poll_timeout_ms, max_records=k.max_poll_records)
                if not batch:
                    continue
                if not first:
                    first = time.perf_counter()
                n = 0
                for records in batch.values():
                    for rec in records:
                        if normalize:
                            n += len(decode_span_facts(rec.value or b"", list(rec.headers or ()), cfg, max_arg).facts)
                            continue
                        req = ExportTraceServiceRequest()
                        req.ParseFromString(rec.value)
                        for _span in iter_otlp_request(cast(TracesData, req)):  # same resource_spans shape
                            n += 1
                spans += n
                advance(n)
        elapsed = time.perf_counter() - first
    finally:
        await consumer.stop()
    return {"spans": spans, "seconds": elapsed, "spans_per_s": spans / elapsed}


@dataclass(frozen=True, slots=True)
class LatencyJob:
    """What the paced-producer process needs (picklable)."""

    kafka: dict[str, Any]
    spans_topic: str
    scores_topic: str
    records: list[tuple[bytes, bytes, str]]  # key, value, expectation id
    spans_per_record: int
    rate: int
    wait_s: float


@dataclass(slots=True)
class LatencyResult:
    sent: int = 0
    spans_sent: int = 0
    send_seconds: float = 0.0
    achieved_rate: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    statuses: dict[str, int] = field(default_factory=dict)
    missing: int = 0


_R = TypeVar("_R")


def child_main(run: Callable[[Any], Coroutine[Any, Any, Any]]) -> None:
    """Entry point of a measuring child process: a pickled job on stdin, ``run(job)``'s result on stdout."""
    job = pickle.load(sys.stdin.buffer)  # written by our own parent process
    result = asyncio.run(run(job))
    sys.stdout.buffer.write(pickle.dumps(result))
    sys.stdout.buffer.flush()


async def run_child(entry: str, job: object, expect: type[_R], timeout: float, what: str) -> _R:
    """Run ``entry`` (``module:function``, a ``child_main`` caller) in a separate interpreter, so
    the measuring side shares no event loop or CPU time slice with the service; return its result."""
    module, func = entry.split(":")
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        f"from {module} import {func}; {func}()",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
    )
    try:
        out, _ = await asyncio.wait_for(proc.communicate(pickle.dumps(job)), timeout=timeout)
    except BaseException:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        raise
    if proc.returncode != 0:
        raise RuntimeError(f"the {what} process exited with status {proc.returncode}")
    result = pickle.loads(out)  # written by our own child process
    if not isinstance(result, expect):
        raise RuntimeError(f"the {what} process returned {type(result).__name__}")
    return result


def latency_child_main() -> None:
    """The paced producer + scores reader, in its own process (see ``run_latency_process``)."""
    child_main(_latency_run)


async def run_latency_process(job: LatencyJob, timeout: float) -> LatencyResult:
    """Run the paced producer + scores reader in a separate interpreter (not sharing the service's)."""
    return await run_child("collector.bench:latency_child_main", job, LatencyResult, timeout, "latency")


async def _latency_run(job: LatencyJob) -> LatencyResult:
    k = KafkaConfig.model_validate(job.kafka)
    arrivals: dict[str, tuple[float, int]] = {}
    wanted = {eid for _k, _v, eid in job.records}
    all_in = asyncio.Event()
    consumer = AIOKafkaConsumer(
        job.scores_topic,
        bootstrap_servers=k.bootstrap_servers,
        group_id=None,
        enable_auto_commit=False,
        auto_offset_reset="latest",
        fetch_max_wait_ms=10,
        **kafka_security_kwargs(k),
    )
    producer = AIOKafkaProducer(**producer_kwargs(k))
    await asyncio.wait_for(consumer.start(), timeout=30)
    await asyncio.wait_for(producer.start(), timeout=30)

    async def read_scores() -> None:
        while True:
            batch = await consumer.getmany(timeout_ms=200)
            now = time.perf_counter()
            for records in batch.values():
                for rec in records:
                    ev = decode_score_event(rec.value)
                    if ev.expectation_id in wanted and ev.expectation_id not in arrivals:
                        arrivals[ev.expectation_id] = (now, ev.status)
            if len(arrivals) >= len(wanted):
                all_in.set()

    out = LatencyResult()
    reader: asyncio.Task[None] | None = None
    try:
        assigned = consumer.assignment()
        await consumer.seek_to_end(*assigned)
        for tp in assigned:
            await consumer.position(tp)
        await producer.partitions_for(job.spans_topic)  # metadata before the clock starts
        reader = asyncio.create_task(read_scores())
        interval = job.spans_per_record / job.rate
        sent_at: dict[str, float] = {}
        acks = []
        t0 = time.perf_counter()
        last = t0
        for i, (key, value, eid) in enumerate(job.records):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            last = sent_at[eid] = time.perf_counter()
            acks.append(await producer.send(job.spans_topic, value=value, key=key))
        async with asyncio.timeout(60):
            await asyncio.gather(*acks)
        out.sent = len(job.records)
        out.spans_sent = out.sent * job.spans_per_record
        out.send_seconds = last - t0
        # n records at fixed spacing span (n - 1) intervals
        out.achieved_rate = (out.sent - 1) * job.spans_per_record / out.send_seconds if out.sent > 1 else 0.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), timeout=job.wait_s)
        for eid, (arrived, status) in arrivals.items():
            out.latencies_ms.append((arrived - sent_at[eid]) * 1000)
            name = common_pb2.ScoreStatus.Name(status)  # type: ignore[arg-type]
            out.statuses[name] = out.statuses.get(name, 0) + 1
        out.latencies_ms.sort()
        out.missing = len(wanted) - len(arrivals)
    finally:
        if reader is not None:
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await reader
        await producer.stop()
        await consumer.stop()
    return out


async def _cleanup(cfg: ServiceConfig, extra_topics: Sequence[str]) -> None:
    """Drop the run's Redis keys and topics (best effort: shared servers)."""
    r = Redis.from_url(cfg.redis.url)
    try:
        batch: list[bytes] = []
        async for key in r.scan_iter(match=f"{cfg.redis.key_prefix}:*", count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                await r.unlink(*batch)
                batch = []
        if batch:
            await r.unlink(*batch)
    finally:
        await r.aclose()
    t = cfg.kafka.topics
    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap_servers, **kafka_security_kwargs(cfg.kafka))
    await asyncio.wait_for(admin.start(), timeout=30)
    try:
        await admin.delete_topics([t.spans, t.control, t.scores, t.observations, t.dlq, *extra_topics])
    finally:
        await admin.close()


# --------------------------------------------------------------------------------------------------
# Building blocks the suites share (collector/benches/)
# --------------------------------------------------------------------------------------------------


class Rig:
    """One bench run's servers and names: fresh configs (topics, group, key prefix) and their cleanup."""

    def __init__(self, bootstrap: str | None = None, redis_url: str | None = None) -> None:
        self.bootstrap = bootstrap
        self.redis_url = redis_url
        self.cfgs: list[ServiceConfig] = []

    def config(self, **redis_overrides: Any) -> ServiceConfig:
        cfg = bench_config(self.bootstrap, self.redis_url)
        if redis_overrides:
            data = cfg.model_dump()
            data["redis"].update(redis_overrides)
            cfg = ServiceConfig.model_validate(data)
        self.cfgs.append(cfg)
        return cfg

    async def topics(self, cfg: ServiceConfig) -> None:
        await bench_topics(cfg)

    async def cleanup(self) -> None:
        for cfg in self.cfgs:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(_cleanup(cfg, [warm_topic(cfg)]), timeout=120)


async def bench_topics(cfg: ServiceConfig) -> None:
    """The config's topics and its (empty) registration spans topic."""
    k = cfg.kafka
    await create_topics(k.bootstrap_servers, k.topics, security=k.security, partitions=PARTITIONS)
    await create_topics(
        k.bootstrap_servers,
        TopicsConfig(**{**k.topics.model_dump(), "spans": warm_topic(cfg)}),
        security=k.security,
        partitions=PARTITIONS,
    )


def warm_topic(cfg: ServiceConfig) -> str:
    """The empty spans topic the registration pass consumes (only the control topic matters then)."""
    return f"{cfg.kafka.topics.spans}-warm"


async def register_expectations(
    cfg: ServiceConfig,
    redis: Redis,
    controls: Sequence[tuple[bytes, bytes]],
    ids: Sequence[str],
    progress: Progress,
    what: str = "register expectations",
) -> float:
    """Produce control records and let the service (same group, empty spans topic) register them all.

    The group's control offsets are committed when it returns, so the service started next
    on the real spans topic reads spans only. Returns the seconds the started service took to
    register them all (checked every 50 ms).
    """
    keys = Keys(cfg.redis.key_prefix)
    await _produce(cfg.kafka, cfg.kafka.topics.control, controls)
    tid = progress.add_task(what, total=len(ids))

    async def done() -> bool:
        n = await _registered(redis, keys, ids)
        progress.update(tid, completed=n)
        return n >= len(ids)

    async with _service(_with_spans_topic(cfg, warm_topic(cfg))) as svc:
        started = time.perf_counter()
        await until(done, max(60.0, len(ids) / 100), what)
        took = time.perf_counter() - started
        async with svc.batch_lock:
            pass
    return took


async def prepare_backlog(
    cfg: ServiceConfig,
    redis: Redis,
    traces: Sequence[BenchTrace],
    progress: Progress,
    *,
    extra_controls: Sequence[tuple[bytes, bytes]] = (),
    extra_ids: Sequence[str] = (),
) -> int:
    """Topics, the traces' records on the spans topic, one expectation per trace registered.

    Returns the number of spans produced. Expectations are registered BEFORE the service
    sees a span, so each trace is decided (TRUE) while its spans are applied.
    """
    await bench_topics(cfg)
    records = [(t.trace_id.encode(), r) for t in traces for r in t.records]
    tid, adv = task(progress, "produce span backlog", len(records))
    await _produce(cfg.kafka, cfg.kafka.topics.spans, records, adv)
    progress.remove_task(tid)
    controls = [(t.expectation_id.encode(), _control_record(t)) for t in traces]
    ids = [t.expectation_id for t in traces]
    await register_expectations(cfg, redis, [*controls, *extra_controls], [*ids, *extra_ids], progress)
    return sum(_spans_in(r) for _, r in records)


def _spans_in(record: bytes) -> int:
    req = ExportTraceServiceRequest()
    req.ParseFromString(record)
    return sum(len(ss.spans) for rs in req.resource_spans for ss in rs.scope_spans)


async def drain_in_process(
    cfg: ServiceConfig,
    total: int,
    progress: Progress,
    cpu: CpuMeter | None = None,
    desc: str = "end to end: service",
) -> dict[str, Any]:
    """Run the in-process service on the backlog until ``total`` spans are applied (timed batches)."""
    meter = Meter()
    tid, adv = task(progress, desc, total)
    meter.reset(total, adv)
    usage: dict[str, Any] = {}
    async with _service(cfg, meter):
        if cpu is not None:
            cpu.start()
        try:
            await asyncio.wait_for(meter.reached.wait(), timeout=max(180.0, total / 200))
        except TimeoutError:
            raise TimeoutError(f"service applied {meter.spans} of {total} spans in time") from None
        if cpu is not None:
            usage = cpu.stop()
    progress.remove_task(tid)
    secs = meter.last_end - meter.first_start
    return {
        "spans": meter.spans,
        "seconds": secs,
        "spans_per_s": meter.spans / secs if secs > 0 else math.nan,
        "batches": meter.batches,
        "cpu": usage,
    }


async def latency_at(
    cfg: ServiceConfig,
    svc: ToolwitnessService,
    redis: Redis,
    traces: Sequence[BenchTrace],
    rate: int,
    progress: Progress,
    *,
    seconds: float,
    wait_s: float = 30.0,
) -> dict[str, Any]:
    """Time to verdict at ``rate`` spans/s: register the traces' expectations on the running
    service, then a paced producer (own process) sends one record per trace and reads the scores."""
    k = cfg.kafka
    keys = Keys(cfg.redis.key_prefix)
    ids = [b.expectation_id for b in traces]
    await _produce(k, k.topics.control, [(b.expectation_id.encode(), _control_record(b)) for b in traces])
    tid = progress.add_task(f"register latency expectations ({rate:,} spans/s)", total=len(ids))

    async def registered() -> bool:
        n = await _registered(redis, keys, ids)
        progress.update(tid, completed=n)
        return n >= len(ids)

    await until(registered, max(60.0, len(ids) / 100), "latency expectation registration")
    async with svc.batch_lock:
        pass
    progress.remove_task(tid)
    spans_per_record = _spans_in(traces[0].record)
    job = LatencyJob(
        kafka=k.model_dump(),
        spans_topic=k.topics.spans,
        scores_topic=k.topics.scores,
        records=[(b.trace_id.encode(), b.record, b.expectation_id) for b in traces],
        spans_per_record=spans_per_record,
        rate=rate,
        wait_s=wait_s,
    )
    tid = progress.add_task(f"latency run at {rate:,} spans/s", total=None)
    res = await run_latency_process(job, timeout=seconds + wait_s + 180)
    progress.remove_task(tid)
    lat = res.latencies_ms
    return {
        "target_rate": rate,
        "achieved_rate": res.achieved_rate,
        "seconds": res.send_seconds,
        "traces": res.sent,
        "spans": res.spans_sent,
        "verdicts": len(lat),
        "missing": res.missing,
        "statuses": res.statuses,
        **percentiles(lat),
    }


# --------------------------------------------------------------------------------------------------
# The pipeline suite
# --------------------------------------------------------------------------------------------------


def _targets(report: dict[str, Any], rate: int) -> list[Target]:
    lat = report["latency"]
    at_load = lat["achieved_rate"] >= RATE_TOLERANCE * rate
    out = [
        Target(
            "end-to-end / floor (1 instance)",
            f">= {TARGET_RATIO}",
            f"{report['ratio']:.2f}",
            report["ratio"] >= TARGET_RATIO and report["e2e"]["decided_true"] == report["e2e"]["expectations"],
        ),
        Target(
            f"time-to-verdict p99 at {rate:,} spans/s",
            f"< {TARGET_P99_MS:.0f} ms (achieved >= {RATE_TOLERANCE:.0%} of rate, every verdict read)",
            f"{lat['p99_ms']:.1f} ms at {lat['achieved_rate']:,.0f} spans/s, {lat['missing']} missing",
            lat["p99_ms"] < TARGET_P99_MS and at_load and lat["missing"] == 0,
        ),
        Target(
            "Redis bytes / trace (25 spans, 10 tools)",
            f"<= {TARGET_TRACE_BYTES:,} B",
            f"{report['redis']['trace_bytes']:,} B",
            0 < report["redis"]["trace_bytes"] <= TARGET_TRACE_BYTES,
        ),
    ]
    sc = report.get("scaling")
    if sc:
        out.append(
            Target(
                "2 instances / 1 instance",
                f">= {TARGET_SCALING} when CPU allows (else the bound is shown)",
                f"{sc['ratio']:.2f}; {sc['bound']}",
                sc["ratio"] >= TARGET_SCALING or sc["cpu_bound"],
            )
        )
    return out


def _table(report: dict[str, Any], targets: Sequence[Target]) -> Table:
    f, e, lat, rd = report["floor"], report["e2e"], report["latency"], report["redis"]
    t = Table(title=f"toolwitness bench pipeline — one run, {report['partitions']} partitions, {report['cpus']} CPUs")
    t.add_column("measure")
    t.add_column("value", justify="right")
    t.add_column("detail")
    fa, nz = report["floor_after"], report["normalized"]
    t.add_row(
        "floor: aiokafka consume + decode",
        f"{report['floor_mean_spans_per_s']:,.0f} spans/s",
        f"mean of before {f['spans_per_s']:,.0f} ({f['spans']:,} spans in {f['seconds']:.2f} s) and after the "
        f"end-to-end pass {fa['spans_per_s']:,.0f} ({fa['seconds']:.2f} s)",
    )
    t.add_row(
        "consume + the service's decode (normalize)",
        f"{nz['spans_per_s']:,.0f} spans/s",
        f"decode_span_facts instead of parse + walk: the ceiling of end to end; "
        f"{report['ratio_ceiling']:.2f} of the floor",
    )
    t.add_row(
        "end to end: service applied + decided",
        f"{e['spans_per_s']:,.0f} spans/s",
        f"{e['spans']:,} spans in {e['seconds']:.2f} s, {e['batches']} batches; {e['decided_true']:,}/"
        f"{e['expectations']:,} decided TRUE ({e['decisions_per_s']:,.0f}/s), "
        f"offsets committed: {'yes' if e['offsets_committed'] else 'NO'}",
    )
    if e.get("cpu"):
        t.add_row("  CPU while draining (cores)", f"{e['cpu']['cores_busy']:.2f}", busy_text(e["cpu"]))
    t.add_row("ratio end to end / floor", f"{report['ratio']:.2f}", "")
    mix = report["interleaved"]
    t.add_row(
        "interleaved: expectation + spans + marker",
        f"{mix['spans_per_s']:,.0f} spans/s",
        f"{report['interleaved_ratio']:.2f} of the floor; {mix['traces_per_s']:,.0f} traces/s, each registered, "
        f"decided and completed in the same backlog ({mix['decided_true']:,}/{mix['traces']:,} TRUE); what a "
        "harness sending all three per attempt gets",
    )
    sev = report["several"]
    t.add_row(
        f"{sev['per_trace']} expectations per trace",
        f"{sev['spans_per_s']:,.0f} spans/s",
        f"{sev['decisions_per_s']:,.0f} decisions/s ({sev['decided_true']:,}/{sev['expectations']:,} TRUE); "
        "the expectations a span decides together share one observation",
    )
    reg = report["registration"]
    t.add_row(
        "expectations registered (control topic)",
        f"{reg['per_s']:,.0f} /s",
        f"{reg['expectations']:,} expectation records, taken in runs per batch, in {reg['seconds']:.2f} s "
        "(started service, checked every 50 ms)",
    )
    ing = report["ingest"]
    t.add_row(
        "ingest only: no expectation registered",
        f"{ing['spans_per_s']:,.0f} spans/s",
        f"{report['ingest_ratio']:.2f} of the floor; so one decision (evaluate, compare-and-set, score + "
        f"observation produced, marked published) costs {report['us_per_decision']:,.0f} us of the service's time",
    )
    for run in report.get("instances", []):
        t.add_row(
            f"service instances: {run['instances']} process(es)",
            f"{run['spans_per_s']:,.0f} spans/s",
            f"{run['spans']:,} spans in {run['seconds']:.2f} s, partitions {run['assignment']}; "
            f"CPU {busy_text(run['cpu'])}",
        )
    sc = report.get("scaling")
    if sc:
        t.add_row("ratio 2 instances / 1 instance", f"{sc['ratio']:.2f}", sc["bound"])
    t.add_row(
        "latency run: achieved rate",
        f"{lat['achieved_rate']:,.0f} spans/s",
        f"target {lat['target_rate']:,} spans/s, {lat['traces']:,} traces in {lat['seconds']:.1f} s",
    )
    t.add_row("time to verdict p50", f"{lat['p50_ms']:.1f} ms", "deciding record produced → score read")
    t.add_row("time to verdict p95", f"{lat['p95_ms']:.1f} ms", "")
    t.add_row(
        "time to verdict p99",
        f"{lat['p99_ms']:.1f} ms",
        f"max {lat['max_ms']:.1f} ms; {lat['verdicts']:,} read, {lat['missing']} missing; {lat['statuses']}",
    )
    parts = ", ".join(f"{k} {v:,}" for k, v in rd["trace_keys"].items())
    t.add_row("Redis bytes / trace (25 spans, 10 tools)", f"{rd['trace_bytes']:,} B", f"MEMORY USAGE: {parts}")
    t.add_row(
        "  decided trace (no pending set), mean",
        f"{rd['decided_trace_bytes_mean']:,.0f} B",
        f"over {rd['sampled_traces']} traces",
    )
    exp = ", ".join(f"{k} {v:,}" for k, v in rd["expectation_keys"].items())
    t.add_row("  per expectation (not per trace)", f"{rd['expectation_bytes']:,} B", exp)
    if report.get("profile"):
        t.add_row("profile of the end-to-end pass", "", report["profile"])
    target_rows(t, targets)
    return t


def scaling_bound(one: dict[str, Any], two: dict[str, Any]) -> dict[str, Any]:
    """2-vs-1 instance ratio, and whether the machine's CPU allowed the target at all.

    What 1.6x one instance's throughput costs, if every span costs what it cost with one
    instance (service + Redis + Kafka, all measured): 1.6 x the cores busy then. When that
    exceeds the cores the machine has to give (90 %: the OS, the bench's own process), or
    two instances already used them, the ratio is bounded by CPU, not by the service.
    """
    ratio = two["spans_per_s"] / one["spans_per_s"] if one["spans_per_s"] else math.nan
    cores = two["cpu"].get("cores") or (os.cpu_count() or 1)
    busy = two["cpu"].get("cores_busy", math.nan)
    busy_one = one["cpu"].get("cores_busy", math.nan)
    needed = TARGET_SCALING * busy_one
    usable = 0.9 * cores
    cpu_bound = (math.isfinite(needed) and needed > usable) or (math.isfinite(busy) and busy >= usable)
    if cpu_bound:
        bound = (
            f"CPU-bound: x{TARGET_SCALING} would need {needed:.2f} cores at one instance's cost per span "
            f"({busy_one:.2f} cores for x1), {usable:.1f} of {cores} usable; 2 instances used {busy:.2f} "
            f"({busy_text(two['cpu'])})"
        )
    else:
        bound = (
            f"not CPU-bound: x{TARGET_SCALING} needs {needed:.2f} of {usable:.1f} usable cores; 2 instances "
            f"used {busy:.2f} ({busy_text(two['cpu'])})"
        )
    return {
        "ratio": ratio,
        "bound": bound,
        "cpu_bound": cpu_bound,
        "cores_needed": needed,
        "cores_busy_1": busy_one,
        "cores_busy_2": busy,
        "cores": cores,
    }


async def on_rig(
    suite: str,
    bootstrap: str | None,
    redis_url: str | None,
    err: Console,
    run: Callable[[Rig], Awaitable[dict[str, Any]]],
) -> dict[str, Any] | None:
    """Run one suite on a fresh ``Rig`` and always clean it up; None (reported on ``err``) if it failed."""
    rig = Rig(bootstrap, redis_url)
    try:
        return await run(rig)
    except Exception as exc:
        log.debug("bench %s failed", suite, exc_info=True)
        err.print(f"toolwitness bench {suite} failed: {type(exc).__name__}: {exc}")
        return None
    finally:
        with contextlib.suppress(Exception):
            await rig.cleanup()


async def run_pipeline_bench(
    *,
    spans: int = 50000,
    rate: int = 5000,
    as_json: bool = False,
    bootstrap: str | None = None,
    redis_url: str | None = None,
    latency_seconds: float = 10.0,
    instances: Sequence[int] = (1, 2),
    profile: str | None = None,
) -> int:
    """Run the pipeline benchmark and print a table (or JSON). Exit code: 0 met, 1 missed, 2 failed."""
    if spans < TRACE_SPANS or rate < TRACE_SPANS or latency_seconds <= 0:
        raise ValueError(f"need spans >= {TRACE_SPANS}, rate >= {TRACE_SPANS}, latency_seconds > 0")
    out, err = consoles()
    report = await on_rig(
        "pipeline",
        bootstrap,
        redis_url,
        err,
        lambda rig: _run(rig, spans, rate, latency_seconds, err, list(instances), profile),
    )
    if report is None:
        return 2
    targets = _targets(report, rate)
    return emit(report, targets, _table(report, targets), as_json, out)


async def ingest_only(rig: Rig, traces: Sequence[BenchTrace], progress: Progress) -> dict[str, Any]:
    """Drain ``traces`` with the in-process service on fresh topics where no expectation is registered."""
    cfg = rig.config()
    await rig.topics(cfg)
    records = [(t.trace_id.encode(), r) for t in traces for r in t.records]
    tid, adv = task(progress, "produce ingest-only backlog", len(records))
    await _produce(cfg.kafka, cfg.kafka.topics.spans, records, adv)
    progress.remove_task(tid)
    return await drain_in_process(cfg, sum(_spans_in(r) for _, r in records), progress, desc="ingest only: service")


#: expectations per trace in the "several expectations" pass (what a harness registers per attempt)
SEVERAL = 3


async def several_expectations(
    rig: Rig, traces: Sequence[BenchTrace], progress: Progress, per_trace: int = SEVERAL
) -> dict[str, Any]:
    """The end-to-end pass with ``per_trace`` expectations on each trace (each a tool the trace
    ran: all TRUE, decided by the same spans), registered before the spans are read."""
    cfg = rig.config()
    redis = Redis.from_url(cfg.redis.url)
    try:
        extra: list[tuple[bytes, bytes]] = []
        ids = [t.expectation_id for t in traces]
        for t in traces:
            first = int(t.tool.rsplit("_", 1)[1])
            for j in range(1, per_trace):
                eid = f"{t.expectation_id}-{j}"
                extra.append((eid.encode(), _control_record(t, f"tool_{(first + j) % TRACE_TOOLS}", eid)))
                ids.append(eid)
        total = await prepare_backlog(cfg, redis, traces, progress, extra_controls=extra,
                                      extra_ids=ids[len(traces):])
        out = await drain_in_process(cfg, total, progress, desc=f"{per_trace} expectations per trace: service")
        true, _ = await _decided_true(redis, Keys(cfg.redis.key_prefix), ids)
    finally:
        await redis.aclose()
    out.update(per_trace=per_trace, decided_true=true, expectations=len(ids),
               decisions_per_s=len(ids) / out["seconds"] if out["seconds"] > 0 else math.nan)
    return out


async def interleaved(rig: Rig, traces: Sequence[BenchTrace], progress: Progress) -> dict[str, Any]:
    """What a harness sends per attempt, all in the backlog of fresh topics: its expectation
    (control topic, first), its spans, then its completion marker with the span count. Timed from
    the first batch to the last record taken; every expectation must end decided TRUE."""
    cfg = rig.config()
    await rig.topics(cfg)
    controls = [(t.expectation_id.encode(), _control_record(t)) for t in traces]
    spans = [(t.trace_id.encode(), r) for t in traces for r in t.records]
    markers = [(t.trace_id.encode(), _marker_record(t)) for t in traces]
    tid, adv = task(progress, "produce interleaved backlog", len(controls) + len(spans) + len(markers))
    await _produce(cfg.kafka, cfg.kafka.topics.control, controls, adv)
    await _produce(cfg.kafka, cfg.kafka.topics.spans, spans, adv)
    await _produce(cfg.kafka, cfg.kafka.topics.control, markers, adv)
    progress.remove_task(tid)
    n_spans = sum(_spans_in(r) for _, r in spans)
    records = len(controls) + len(spans) + len(markers)
    meter = Meter()
    tid, adv = task(progress, "interleaved: expectation + spans + marker per trace", n_spans)
    meter.reset(0, adv, record_target=records)
    redis = Redis.from_url(cfg.redis.url)
    try:
        async with _service(cfg, meter):
            try:
                await asyncio.wait_for(meter.reached.wait(), timeout=max(180.0, records / 200))
            except TimeoutError:
                raise TimeoutError(f"service took {meter.records} of {records} records in time") from None
        true, _ = await _decided_true(redis, Keys(cfg.redis.key_prefix), [t.expectation_id for t in traces])
    finally:
        await redis.aclose()
    progress.remove_task(tid)
    secs = meter.records_end - meter.records_start
    return {
        "traces": len(traces),
        "spans": n_spans,
        "records": records,
        "seconds": secs,
        "spans_per_s": n_spans / secs if secs > 0 else math.nan,
        "traces_per_s": len(traces) / secs if secs > 0 else math.nan,
        "decided_true": true,
    }


async def run_instances_phase(rig: Rig, traces: Sequence[BenchTrace], n: int, progress: Progress) -> dict[str, Any]:
    """Drain the same backlog with ``n`` service processes of one group (fresh topics and keys)."""
    cfg = rig.config()
    redis = Redis.from_url(cfg.redis.url)
    try:
        total = await prepare_backlog(cfg, redis, traces, progress)
    finally:
        await redis.aclose()
    cpu = CpuMeter(cfg.kafka.bootstrap_servers, cfg.redis.url)
    tid, adv = task(progress, f"end to end: {n} service process(es)", total)

    def started(pids: list[int]) -> None:
        for i, pid in enumerate(pids):
            cpu.add_child(f"instance-{i + 1}", pid)
        cpu.start()

    usage: dict[str, Any] = {}
    res = await run_instances(
        cfg, n, total, partitions=PARTITIONS, on_spans=adv, on_start=started, on_done=lambda: usage.update(cpu.stop())
    )
    progress.remove_task(tid)
    return {
        "instances": n,
        "spans": res.spans,
        "seconds": res.seconds,
        "spans_per_s": res.spans_per_s,
        "batches": res.batches,
        "published": res.published,
        "assignment": res.assignment,
        "cpu": usage,
    }


async def _run(
    rig: Rig,
    spans: int,
    rate: int,
    latency_seconds: float,
    err: Console,
    instances: list[int],
    profile: str | None,
) -> dict[str, Any]:
    cfg = rig.config()
    k = cfg.kafka
    n_traces = max(1, spans // TRACE_SPANS)
    n_lat = max(2, round(rate * latency_seconds / TRACE_SPANS))
    total = n_traces * TRACE_SPANS
    progress = new_progress(err)
    redis = Redis.from_url(cfg.redis.url)
    keys = Keys(cfg.redis.key_prefix)
    cpu = CpuMeter(k.bootstrap_servers, cfg.redis.url)
    report: dict[str, Any] = {}
    try:
        with progress:
            # 1. workload, topics, backlog ------------------------------------------------------------
            _, adv = task(progress, "generate traces", n_traces + n_lat)
            backlog = make_traces(n_traces, on_trace=lambda: adv(1))
            later = make_traces(n_lat, on_trace=lambda: adv(1))
            probe = backlog[0]
            probe_pending_id = uuid.uuid4().hex
            await rig.topics(cfg)
            _, adv = task(progress, "produce span backlog", n_traces)
            await _produce(k, k.topics.spans, [(b.trace_id.encode(), b.record) for b in backlog], adv)

            # 2. floor -----------------------------------------------------------------------------------
            _, adv = task(progress, "floor: consume + decode", total)
            floor = await measure_floor(cfg, total, adv)
            _, adv = task(progress, "consume + normalize (the service's decode)", total)
            normalized = await measure_floor(cfg, total, adv, normalize=True, name="normalize")

            # 3. register the expectations through the control topic (spans topic: an empty one) --------
            controls = [(b.expectation_id.encode(), _control_record(b)) for b in backlog]
            controls.append((probe_pending_id.encode(), _control_record(probe, ABSENT_TOOL, probe_pending_id)))
            ids = [b.expectation_id for b in backlog] + [probe_pending_id]
            registration_s = await register_expectations(cfg, redis, controls, ids, progress)

            # 4. end to end on the backlog ----------------------------------------------------------------
            meter = Meter()
            _, adv = task(progress, "end to end: service", total)
            meter.reset(total, adv)
            profiler: Any = None
            async with _service(cfg, meter) as svc:
                if profile:
                    from pyinstrument import Profiler  # a dev dependency (pyproject [dev])

                    profiler = Profiler(interval=0.001, async_mode="disabled")
                    profiler.start()
                cpu.start()
                try:
                    await asyncio.wait_for(meter.reached.wait(), timeout=max(180.0, total / 200))
                except TimeoutError:
                    raise TimeoutError(f"service applied {meter.spans} of {total} spans in time") from None
                usage = cpu.stop()
                if profiler is not None:
                    profiler.stop()
                    text = profiler.output_text(unicode=False, color=False)
                    await asyncio.to_thread(Path(profile or "").write_text, text)
                    report["profile"] = f"pyinstrument text written to {profile}"
                e2e_seconds = meter.last_end - meter.first_start
                e2e: dict[str, Any] = {
                    "spans": meter.spans,
                    "seconds": e2e_seconds,
                    "spans_per_s": meter.spans / e2e_seconds,
                    "batches": meter.batches,
                    "expectations": n_traces,
                    "cpu": usage,
                }
                backlog_ids = [b.expectation_id for b in backlog]
                true, published = await _decided_true(redis, keys, backlog_ids)
                e2e["decided_true"] = true
                e2e["decisions_per_s"] = true / e2e_seconds
                e2e["published"] = published
                committed = False
                with contextlib.suppress(TimeoutError):
                    await until(lambda: _committed_all(cfg, k.topics.spans), 20, "offsets committed", interval=0.5)
                    committed = True
                e2e["offsets_committed"] = committed
                # The floor again, right after: the machine's speed drifts (shared, noisy), so the
                # ratio is taken against the mean of the floor measured before and after.
                _, adv = task(progress, "floor again (after end to end)", total)
                floor_after = await measure_floor(cfg, total, adv, name="floor-after")

                # 5. Redis bytes -------------------------------------------------------------------------
                probe_keys = await trace_memory(redis, keys, TENANT, probe.trace_id)
                sample = backlog[1 : 1 + min(50, len(backlog) - 1)]
                decided_sizes = [sum((await trace_memory(redis, keys, TENANT, b.trace_id)).values()) for b in sample]
                exp_keys = await expectation_memory(redis, keys, TENANT, probe.expectation_id)
                redis_report = {
                    "trace_bytes": sum(probe_keys.values()),
                    "trace_keys": probe_keys,
                    "decided_trace_bytes_mean": (sum(decided_sizes) / len(decided_sizes)) if decided_sizes else 0.0,
                    "sampled_traces": len(decided_sizes),
                    "expectation_bytes": sum(exp_keys.values()),
                    "expectation_keys": exp_keys,
                }

                # 6. time to verdict at a stated load ----------------------------------------------------
                lat = await latency_at(cfg, svc, redis, later, rate, progress, seconds=latency_seconds)

            # 7. ingest only: the same kind of backlog (fresh trace ids) with no expectation registered:
            # what applying spans costs without a decision, so a decision's own cost can be read off.
            ingest = await ingest_only(rig, make_traces(n_traces), progress)
            mixed = await interleaved(rig, make_traces(n_traces), progress)
            several = await several_expectations(rig, make_traces(n_traces), progress)

            # 8. the same backlog through 1 and 2 service processes -----------------------------------------
            runs = [await run_instances_phase(rig, backlog, n, progress) for n in instances]
    finally:
        await redis.aclose()
    report.update(
        {
            "spans": total,
            "traces": n_traces,
            "spans_per_trace": TRACE_SPANS,
            "tools_per_trace": TRACE_TOOLS,
            "partitions": PARTITIONS,
            "cpus": os.cpu_count() or 0,
            "floor": floor,
            "floor_after": floor_after,
            "floor_mean_spans_per_s": (floor_mean := (floor["spans_per_s"] + floor_after["spans_per_s"]) / 2),
            "normalized": normalized,
            # e2e cannot beat consume + the service's own decode: the ratio's ceiling in this run.
            "ratio_ceiling": normalized["spans_per_s"] / floor_mean,
            "e2e": e2e,
            "ratio": e2e["spans_per_s"] / floor_mean,
            "ingest": ingest,
            "ingest_ratio": ingest["spans_per_s"] / floor_mean,
            "interleaved": mixed,
            "interleaved_ratio": mixed["spans_per_s"] / floor_mean,
            "several": several,
            "registration": {"expectations": len(ids), "seconds": registration_s,
                             "per_s": len(ids) / registration_s if registration_s > 0 else math.nan},
            # CPU-free arithmetic on two rates of this run: each trace here is one decision
            "us_per_decision": (1 / e2e["spans_per_s"] - 1 / ingest["spans_per_s"]) * TRACE_SPANS * 1e6,
            "latency": lat,
            "redis": redis_report,
            "instances": runs,
        }
    )
    by_n = {r["instances"]: r for r in runs}
    if 1 in by_n and 2 in by_n:
        report["scaling"] = scaling_bound(by_n[1], by_n[2])
    return report
