"""A whole toolwitness stack for integration tests: the service in-process (or as a subprocess),
a control-plane client, and a real OTel SDK provider exporting to Kafka. Unique topics, consumer
group and Redis key prefix per stack, so tests never see each other's data."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import os
import re
import signal
import sys
import traceback
import uuid
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from pathlib import Path
from typing import IO, Any

import pytest
import yaml
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import KafkaError
from google.protobuf import json_format
from opentelemetry.context import Context
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1 import common_pb2 as otlp_common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.trace import SpanLimits, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.sampling import ALWAYS_ON
from opentelemetry.trace import Tracer
from prometheus_client.parser import text_string_to_metric_families
from redis.asyncio import Redis

from collector.client import ToolwitnessClient, build_expectation
from collector.config import ScorerTreeConfig, ServiceConfig, TopicsConfig
from collector.otel import KafkaSpanExporter, SpanCountingProcessor
from collector.pipeline.checkpoint import Batch, BatchResult
from collector.pipeline.service import ToolwitnessService
from collector.processors.trace_state import Keys
from collector.wire.convert import decode_score_event
from collector.wire.gen import control_pb2, score_pb2
from scoring.models import ScoringExpectation, ToolCallRequirement, ToolsCalled, TraceScorable


def expects(*names: str) -> ScoringExpectation:
    return ScoringExpectation(conditions=(ToolsCalled(tools=tuple(ToolCallRequirement(name=n) for n in names)),))


#: every stack ``make_config`` named and ``drop_stack`` has not dropped yet: the integration
#: conftest drops what a test left behind, so a long run does not pile up topics on the broker.
UNDROPPED: dict[str, ServiceConfig] = {}


def make_config(kafka_bootstrap: str, redis_url: str, **overrides: Any) -> ServiceConfig:
    run = uuid.uuid4().hex[:10]
    topics = TopicsConfig(
        spans=f"t-{run}-spans", control=f"t-{run}-control", scores=f"t-{run}-scores",
        observations=f"t-{run}-obs", dlq=f"t-{run}-dlq",
    )
    base: dict[str, Any] = {
        "kafka": {"bootstrap_servers": kafka_bootstrap, "group_id": f"g-{run}", "topics": topics.model_dump(),
                  "poll_timeout_ms": 50},
        "redis": {"url": redis_url, "key_prefix": f"t{run}"},
        # idle after 1 s (default 10 s): a quiet test pipeline's watermark follows the clock sooner
        "completion": {"sweep_interval_ms": 100, "default_deadline_seconds": 60, "idle_partition_ms": 1000},
        "admin": {"port": 0},
    }
    for k, v in overrides.items():
        if isinstance(v, dict) and isinstance(base.get(k), dict):
            base[k] = {**base[k], **v}
        else:
            base[k] = v
    cfg = ServiceConfig.model_validate(base)
    UNDROPPED[cfg.kafka.topics.spans] = cfg
    return cfg


@dataclass
class Agent:
    """A real OTel SDK provider exporting to the stack's spans topic."""

    provider: TracerProvider
    tracer: Tracer
    counter: SpanCountingProcessor
    exporter: KafkaSpanExporter

    def tool(self, name: str, **attrs: Any) -> None:
        with self.tracer.start_as_current_span(
            name, attributes={"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": name, **attrs}
        ):
            pass

    def trace(self, *tools: str) -> str:
        """A new trace: a root span ``agent`` (fresh context) around one execution per tool; its id (hex)."""
        with self.tracer.start_as_current_span("agent", context=Context()) as root:
            for name in tools:
                self.tool(name)
        return f"{root.get_span_context().trace_id:032x}"

    def close(self) -> None:
        self.provider.shutdown()


def make_agent(cfg: ServiceConfig, tenant: str | None = None) -> Agent:
    provider = TracerProvider(sampler=ALWAYS_ON, span_limits=SpanLimits(max_span_attribute_length=SpanLimits.UNSET))
    counter = SpanCountingProcessor()
    exporter = KafkaSpanExporter(bootstrap_servers=cfg.kafka.bootstrap_servers, topic=cfg.kafka.topics.spans,
                                 tenant=tenant, tenant_header=cfg.tenant.header, encoding=cfg.kafka.encoding)
    provider.add_span_processor(counter)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return Agent(provider, provider.get_tracer("toolwitness-tests"), counter, exporter)


@contextlib.asynccontextmanager
async def running_service(cfg: ServiceConfig) -> AsyncIterator[ToolwitnessService]:
    service = ToolwitnessService(cfg)
    async with service.serving():
        yield service


@contextlib.asynccontextmanager
async def control_client(cfg: ServiceConfig, tenant: str = "default") -> AsyncIterator[ToolwitnessClient]:
    async with ToolwitnessClient(bootstrap_servers=cfg.kafka.bootstrap_servers, tenant=tenant,
                                 topics=cfg.kafka.topics) as client:
        yield client


async def until(predicate: Callable[[], Any], timeout: float = 30.0, interval: float = 0.05) -> Any:
    """Await a condition by polling state the test can observe (not a sleep-and-hope)."""
    async with asyncio.timeout(timeout):
        while True:
            value = predicate()
            if asyncio.iscoroutine(value):
                value = await value
            if value:
                return value
            await asyncio.sleep(interval)


async def producer_sees_partitions(producer: AIOKafkaProducer, topic: str, count: int) -> None:
    """Refresh ``producer``'s metadata until it knows ``count`` partitions of ``topic``: the broker
    answers CreatePartitions before its metadata shows them, and sending to a partition the
    producer does not know fails ("Unrecognized partition")."""

    async def known() -> bool:
        await producer.client.force_metadata_update()
        return len(producer.client.cluster.partitions_for_topic(topic) or ()) >= count

    await until(known)


#: the key of the records ``set_record_limit`` probes the broker with (readers drop them)
PROBE_KEY = b"probe"
#: the broker's default max.message.bytes (1 MiB + record batch overhead)
BROKER_RECORD_LIMIT = 1048588


async def set_record_limit(bootstrap: str, topic: str, limit: int, timeout: float = 30.0) -> int:
    """Set ``topic``'s max.message.bytes to ``limit`` and return once the broker enforces it.

    The broker applies a topic's new config when it publishes the metadata record, after the
    AlterConfigs answer: a record sent right after could still be taken (seen in CI). So a probe
    (a plain producer, key ``PROBE_KEY``) is sent until the broker refuses one just over a lowered
    limit, or takes one a raised limit lets through. Returns how many probes the topic took, so the
    caller can drop them when reading."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.alter_configs([ConfigResource(ConfigResourceType.TOPIC, topic, {"max.message.bytes": str(limit)})])
    finally:
        await admin.close()
    lowered = limit < BROKER_RECORD_LIMIT
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, max_request_size=2 * BROKER_RECORD_LIMIT, acks=1)
    await producer.start()
    taken = 0
    try:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    await producer.send_and_wait(topic, b"x" * (limit + 1000 if lowered else 2000), key=PROBE_KEY)
                except KafkaError:
                    if lowered:
                        return taken  # refused: the lowered limit holds
                else:
                    taken += 1
                    if not lowered:
                        return taken  # taken: the raised limit holds
                await asyncio.sleep(0.05)
    finally:
        await producer.stop()


async def settled(service: ToolwitnessService, tenant: str, expectation_id: str) -> None:
    """Wait until the service has registered the expectation and finished the batch that did."""
    key = service.store.k.expectation(tenant, expectation_id)
    await until(lambda: service.redis.exists(key))
    async with service.batch_lock:
        pass
    await service.sweep()


def verdict(ev: score_pb2.ScoreEvent) -> str:
    return {1: "true", 2: "false", 3: "undetermined"}.get(ev.status, "unspecified")


#: scorer trees for expectations that need completion to be TRUE: "never ran" is not_tools
TOOL_TREES = {
    "tools": ScorerTreeConfig(type="otel_tool_call"),
    "not_tools": ScorerTreeConfig(type="inverter", scorer=ScorerTreeConfig(type="otel_tool_call")),
}


def history(events: Sequence[score_pb2.ScoreEvent]) -> list[tuple[int, str]]:
    """(version, verdict) of an expectation's score events, oldest version first."""
    return [(e.version, verdict(e)) for e in sorted(events, key=lambda e: e.version)]


async def send_spans(producer: AIOKafkaProducer, cfg: ServiceConfig, trace: str, *spans: Any, tenant: str = "") -> None:
    """One OTLP record of ``spans`` keyed by the trace id; ``tenant``: named by the resource
    attribute (the kafkaexporter path: no header)."""
    req = otlp_request(list(spans))
    if tenant:
        req.resource_spans[0].resource.attributes.add(key="toolwitness.tenant").value.string_value = tenant
    await producer.send_and_wait(cfg.kafka.topics.spans, req.SerializeToString(), key=trace.encode())


async def gone(redis: Redis, key: str) -> bool:
    return not await redis.exists(key)


# ------------------------------------------------------------------------------------------------
# Raw OTLP records and raw Kafka I/O: for tests that must choose partitions, keys, bytes and
# batches themselves (consumer groups, crash/replay, dead letters, backlogs).
# ------------------------------------------------------------------------------------------------


def new_trace_id() -> str:
    """A random 32-hex trace id (never all zero)."""
    return uuid.uuid4().hex


def new_span_id() -> bytes:
    """A random non-zero 8-byte span id."""
    return uuid.uuid4().bytes[:7] + b"\x01"


AttrInput = str | bool | int | float


def _any_value(v: AttrInput) -> otlp_common_pb2.AnyValue:
    if isinstance(v, bool):
        return otlp_common_pb2.AnyValue(bool_value=v)
    if isinstance(v, int):
        return otlp_common_pb2.AnyValue(int_value=v)
    if isinstance(v, float):
        return otlp_common_pb2.AnyValue(double_value=v)
    return otlp_common_pb2.AnyValue(string_value=v)


def otlp_span(
    trace_id: str | bytes,
    *,
    span_id: bytes | None = None,
    parent: bytes = b"",
    name: str = "span",
    start_ms: int,
    end_ms: int | None,
    tool: str | None = None,
    attrs: Mapping[str, AttrInput] | None = None,
) -> trace_pb2.Span:
    """One OTLP span (times in ms since the epoch; ``end_ms=None`` = not ended). ``tool`` makes it a
    GenAI ``execute_tool`` span. ``trace_id`` as 32 hex or raw bytes (any length, for bad ids)."""
    attributes = dict(attrs or {})
    if tool is not None:
        attributes = {"gen_ai.operation.name": "execute_tool", "gen_ai.tool.name": tool, **attributes}
    span = trace_pb2.Span(
        trace_id=bytes.fromhex(trace_id) if isinstance(trace_id, str) else trace_id,
        span_id=span_id or new_span_id(),
        parent_span_id=parent,
        name=name,
        kind=trace_pb2.Span.SpanKind.SPAN_KIND_INTERNAL,
        start_time_unix_nano=start_ms * 1_000_000,
        end_time_unix_nano=(end_ms or 0) * 1_000_000,
    )
    for k, v in attributes.items():
        span.attributes.add(key=k, value=_any_value(v))
    return span


def otlp_request(spans: Sequence[trace_pb2.Span], *, service_name: str = "agent") -> ExportTraceServiceRequest:
    """An ``ExportTraceServiceRequest`` (what the Collector's kafkaexporter writes) holding ``spans``."""
    req = ExportTraceServiceRequest()
    rs = req.resource_spans.add()
    rs.resource.attributes.add(key="service.name", value=_any_value(service_name))
    ss = rs.scope_spans.add()
    ss.scope.name = "toolwitness-tests"
    ss.spans.extend(spans)
    return req


def otlp_json(req: ExportTraceServiceRequest) -> bytes:
    """OTLP/JSON as the Collector writes it (``otlp_json``): camelCase, ids as hex."""
    doc = json_format.MessageToDict(req)

    def hex_ids(node: Any) -> Any:
        if isinstance(node, dict):
            return {
                k: (base64.b64decode(v).hex() if k in ("traceId", "spanId", "parentSpanId") else hex_ids(v))
                for k, v in node.items()
            }
        if isinstance(node, list):
            return [hex_ids(x) for x in node]
        return node

    return json.dumps(hex_ids(doc)).encode()


def expectation_bytes(
    expectation_id: str,
    trace_ids: Sequence[str],
    expectation: ScoringExpectation,
    *,
    scorer: str = "tools",
    tenant: str = "default",
    deadline: timedelta = timedelta(seconds=60),
) -> bytes:
    """A control record registering an expectation on a trace scope (as ``ToolwitnessClient.expect``)."""
    msg = build_expectation(
        expectation_id=expectation_id, tenant=tenant, scope=TraceScorable(trace_ids=tuple(trace_ids)),
        expectation=expectation, scorer=scorer, deadline=deadline,
    )
    return control_pb2.ControlMessage(expectation=msg).SerializeToString(deterministic=True)


def marker_bytes(trace_id: str, span_count: int | None, *, tenant: str = "default") -> bytes:
    """A control record declaring a trace complete (with its span count when given)."""
    m = control_pb2.CompletionMarker(tenant=tenant, trace_id=trace_id)
    if span_count is not None:
        m.span_count = span_count
    m.at.GetCurrentTime()
    return control_pb2.ControlMessage(completion=m).SerializeToString(deterministic=True)


@contextlib.asynccontextmanager
async def raw_producer(cfg: ServiceConfig, *, max_request_size: int = 1024 * 1024) -> AsyncIterator[AIOKafkaProducer]:
    """An idempotent aiokafka producer on the stack's broker (``send_and_wait`` gives partition + offset)."""
    producer = AIOKafkaProducer(
        bootstrap_servers=cfg.kafka.bootstrap_servers, acks="all", enable_idempotence=True,
        max_request_size=max_request_size, request_timeout_ms=30_000,
    )
    async with asyncio.timeout(30):
        await producer.start()
    try:
        yield producer
    finally:
        async with asyncio.timeout(30):
            await producer.stop()


async def read_all(bootstrap: str, topic: str, timeout: float = 30.0) -> list[ConsumerRecord[bytes, bytes]]:
    """Every record of ``topic`` from the beginning up to its end offsets at call time (no group)."""
    consumer = AIOKafkaConsumer(
        topic, bootstrap_servers=bootstrap, group_id=None, enable_auto_commit=False, auto_offset_reset="earliest",
        fetch_max_bytes=64 * 1024 * 1024, max_partition_fetch_bytes=16 * 1024 * 1024,
    )
    out: list[ConsumerRecord[bytes, bytes]] = []
    async with asyncio.timeout(timeout):
        await consumer.start()
        try:
            tps = sorted(consumer.assignment())
            assert tps, f"topic {topic} has no partitions"
            await consumer.seek_to_beginning(*tps)
            ends = await consumer.end_offsets(tps)
            while [tp for tp in tps if await consumer.position(tp) < ends[tp]]:
                for records in (await consumer.getmany(timeout_ms=200)).values():
                    out.extend(records)
        finally:
            await consumer.stop()
    return out


async def read_until(
    bootstrap: str,
    topic: str,
    enough: Callable[[list[ConsumerRecord[bytes, bytes]]], bool],
    timeout: float = 30.0,
) -> list[ConsumerRecord[bytes, bytes]]:
    """Records of ``topic`` from the beginning until ``enough(records so far)`` (or TimeoutError)."""
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        remaining = deadline - asyncio.get_running_loop().time()
        records = await read_all(bootstrap, topic, timeout=max(1.0, remaining))
        if enough(records):
            return records
        if remaining <= 0:
            raise TimeoutError(f"{topic}: condition not met within {timeout}s ({len(records)} records read)")
        await asyncio.sleep(0.2)


def scores_by_id(records: Sequence[ConsumerRecord[bytes, bytes]]) -> dict[str, list[bytes]]:
    """Raw score events on the scores topic grouped by score_id (re-sends show up as repeats)."""
    out: dict[str, list[bytes]] = {}
    for r in records:
        ev = decode_score_event(r.value or b"")
        out.setdefault(ev.score_id, []).append(r.value or b"")
    return out


def header(rec: ConsumerRecord[bytes, bytes], name: str) -> str | None:
    for k, v in rec.headers or ():
        if k == name:
            text: str = bytes(v).decode("utf-8", "replace")  # aiokafka types header values as Any
            return text
    return None


async def admin_get(port: int, path: str, host: str = "127.0.0.1", timeout: float = 10) -> tuple[int, str]:
    """GET ``path`` from an admin endpoint (HTTP/1.1, connection closed by the server): (status, body)."""
    async with asyncio.timeout(timeout):
        reader, writer = await asyncio.open_connection(host, port)
        writer.write(f"GET {path} HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n".encode())
        await writer.drain()
        raw = await reader.read()
        writer.close()
        await writer.wait_closed()
    head, _, body = raw.partition(b"\r\n\r\n")
    parts = head.split(b" ", 2)
    assert len(parts) > 1 and parts[1].isdigit(), head[:80]
    return int(parts[1]), body.decode()


async def scrape_metrics(port: int, host: str = "127.0.0.1") -> str:
    """GET /metrics from the service's admin endpoint; it must answer 200."""
    status, body = await admin_get(port, "/metrics", host)
    assert status == 200, status
    return body


def metric_value(text: str, sample: str, labels: Mapping[str, str]) -> float:
    """The value of one sample (e.g. ``toolwitness_dlq_records_total``) with these labels; 0 if absent."""
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            if s.name == sample and all(s.labels.get(k) == v for k, v in labels.items()):
                return float(s.value)
    return 0.0


@dataclass
class BatchLog:
    """Wraps an in-process service's checkpoint to record what each processed batch held:
    one list of (topic, partition, offset) per batch, in processing order."""

    service: ToolwitnessService
    batches: list[list[tuple[str, int, int]]] = field(default_factory=list)
    after_batch: list[Callable[[int], Any]] = field(default_factory=list)

    def install(self) -> BatchLog:
        original = self.service.checkpoint.process

        async def process(batch: Batch) -> BatchResult:
            result = await original(batch)
            self.batches.append([(tp.topic, tp.partition, r.offset) for tp, recs in batch.items() for r in recs])
            for hook in self.after_batch:
                value = hook(len(self.batches) - 1)
                if asyncio.iscoroutine(value):
                    await value
            return result

        self.service.checkpoint.process = process  # type: ignore[method-assign]
        return self

    def traces(self, located: Mapping[tuple[int, int], str], topic: str) -> set[str]:
        """Trace ids of the ``located`` records of ``topic`` ((partition, offset) -> trace id) processed."""
        return {located[(p, o)] for b in self.batches for (t, p, o) in b if t == topic and (p, o) in located}

    def batch_of(self, topic: str, partition: int, offset: int) -> int:
        """Index of the batch that held this record (ValueError if none did)."""
        for i, b in enumerate(self.batches):
            if (topic, partition, offset) in b:
                return i
        raise ValueError(f"record {topic}/{partition}/{offset} was not processed")


async def drop_stack(cfg: ServiceConfig) -> None:
    """Delete a stack's topics and its Redis keys (its key prefix), after the service stopped."""
    t = cfg.kafka.topics
    UNDROPPED.pop(t.spans, None)
    admin = AIOKafkaAdminClient(bootstrap_servers=cfg.kafka.bootstrap_servers, request_timeout_ms=30_000)
    async with asyncio.timeout(30):
        await admin.start()
        try:
            existing = set(await admin.list_topics())
            doomed = [n for n in (t.spans, t.control, t.scores, t.observations, t.dlq) if n in existing]
            if doomed:
                await admin.delete_topics(doomed, timeout_ms=30_000)
        finally:
            await admin.close()
    redis: Redis = Redis.from_url(cfg.redis.url)
    try:
        async with asyncio.timeout(30):
            keys = [k async for k in redis.scan_iter(match=f"{cfg.redis.key_prefix}:*", count=1000)]
            for i in range(0, len(keys), 500):
                await redis.delete(*keys[i : i + 500])
    finally:
        await redis.aclose()


# ------------------------------------------------------------------------------------------------
# The service as a subprocess: `toolwitness run --config FILE`, as it is deployed.
# ------------------------------------------------------------------------------------------------


def write_config(cfg: ServiceConfig, path: Path) -> Path:
    """The config as YAML (what `toolwitness run --config` reads)."""
    path.write_text(yaml.safe_dump(cfg.model_dump(mode="json"), sort_keys=False))
    return path


REPO_ROOT = Path(__file__).resolve().parents[2]
#: the `toolwitness` console script's entry point
_RUN_CLI = "import sys; sys.argv[0] = 'toolwitness'; from collector.cli import app; sys.exit(app())"


#: environment names ``toolwitness run`` reads as config overrides (collector.config)
_CONFIG_OVERRIDE = re.compile(r"TOOLWITNESS_(KAFKA_BOOTSTRAP|REDIS_URL|[A-Z_]+__.*)$")


class ServiceProcess:
    """``toolwitness run --config FILE`` (or ``command`` ``--config FILE``, e.g. the sidecar) as a
    child process; its output goes to ``log_path``."""

    def __init__(self, config_path: Path, log_path: Path, command: Sequence[str] = ("run",)) -> None:
        self.config_path = config_path
        self.log_path = log_path
        self.command = tuple(command)
        self.proc: asyncio.subprocess.Process | None = None
        self._log: IO[bytes] | None = None
        self.starts = 0

    def _open_log(self) -> IO[bytes]:
        return self.log_path.open("ab")

    async def start(self) -> None:
        assert self.proc is None or self.proc.returncode is not None, "already running"
        self._close_log()
        self._log = self._open_log()
        self._log.write(f"\n===== start #{self.starts + 1} =====\n".encode())
        self._log.flush()
        # The config file is the service's whole configuration: config overrides in the test run's
        # environment (the TOOLWITNESS_KAFKA_BOOTSTRAP / TOOLWITNESS_REDIS_URL that point the tests
        # at existing servers are also the service's shorthands) would take precedence over it.
        env = {k: v for k, v in os.environ.items() if not _CONFIG_OVERRIDE.match(k)}
        env["PYTHONUNBUFFERED"] = "1"
        # `toolwitness run`, from THIS checkout's code: the venv's `toolwitness` script imports the
        # checkout the package was installed from (editable), which need not be the one under test
        # (a git worktree). Run from the repository root, its packages come first on sys.path.
        self.proc = await asyncio.create_subprocess_exec(
            sys.executable, "-c", _RUN_CLI, *self.command, "--config", str(self.config_path), stdout=self._log,
            stderr=self._log, env=env, cwd=REPO_ROOT,
        )
        self.starts += 1

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    async def kill(self) -> int:
        """SIGKILL (no shutdown code runs at all); returns the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGKILL)
        async with asyncio.timeout(30):
            return await self.proc.wait()

    async def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (graceful stop), SIGKILL if it has not exited within ``timeout``."""
        proc = self.proc
        if proc is None or proc.returncode is not None:
            self._close_log()
            return None if proc is None else proc.returncode
        proc.send_signal(signal.SIGTERM)
        try:
            async with asyncio.timeout(timeout):
                rc = await proc.wait()
        except TimeoutError:
            proc.send_signal(signal.SIGKILL)
            rc = await proc.wait()
        self._close_log()
        return rc

    def _close_log(self) -> None:
        if self._log is not None:
            self._log.close()
            self._log = None

    def log_tail(self, lines: int = 80) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


@contextlib.asynccontextmanager
async def service_and_task(cfg: ServiceConfig) -> AsyncIterator[tuple[ToolwitnessService, asyncio.Task[None]]]:
    """Like ``running_service``, but also yields the poll-loop task (so a test can see it end)."""
    service = ToolwitnessService(cfg)
    async with service.serving() as task:
        yield service, task


@contextlib.asynccontextmanager
async def running_service_prepared(
    cfg: ServiceConfig, prepare: Callable[[ToolwitnessService], Any]
) -> AsyncIterator[ToolwitnessService]:
    """Like ``running_service``, with ``prepare(service)`` called before it starts consuming
    (e.g. ``lambda s: BatchLog(s).install()`` so that not even the first batch is missed)."""
    service = ToolwitnessService(cfg)
    prepare(service)
    async with service.serving():
        yield service


async def create_topic(bootstrap: str, name: str, partitions: int, configs: Mapping[str, str]) -> None:
    """Create a topic with these topic configs (before the service's own topic set-up sees it)."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=30_000)
    async with asyncio.timeout(30):
        await admin.start()
        try:
            await admin.create_topics([NewTopic(name, partitions, 1, topic_configs=dict(configs))], timeout_ms=30_000)
            while True:
                rows = await admin.describe_topics([name])
                parts = rows[0].get("partitions") or [] if rows else []
                if rows and rows[0].get("error_code") == 0 and len(parts) == partitions and all(
                    p.get("leader", -1) >= 0 for p in parts
                ):
                    return
                await asyncio.sleep(0.05)
        finally:
            await admin.close()


# ------------------------------------------------------------------------------------------------
# Fault tests (issue 9): isolated Redis / Kafka instances that a test may stop and restart, whole
# traces as one record, exactly-once checks on the raw scores topic, Redis key listings.
# ------------------------------------------------------------------------------------------------

SERVICES_SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "services.py"


def free_ports(n: int) -> list[int]:
    """``n`` distinct TCP ports that were free on 127.0.0.1 a moment ago."""
    import socket

    socks = [socket.socket() for _ in range(n)]
    try:
        for s in socks:
            s.bind(("127.0.0.1", 0))
        return [int(s.getsockname()[1]) for s in socks]
    finally:
        for s in socks:
            s.close()


class IsolatedServices:
    """A SECOND Redis and/or Kafka, started by ``scripts/services.py`` in its own state dir on free
    ports, that a test may stop and restart (``down`` / ``up --keep-data``) without touching the
    shared instance every other test uses. Every call runs the script as an asyncio subprocess,
    so an in-process service keeps running (and failing, and retrying) while it works."""

    def __init__(self, state_dir: Path, timeout_s: float = 90.0) -> None:
        self.state_dir = state_dir
        self.redis_port, self.kafka_port, self.controller_port = free_ports(3)
        self.timeout_s = timeout_s
        self.output: list[str] = []

    @property
    def redis_url(self) -> str:
        return f"redis://127.0.0.1:{self.redis_port}/0"

    @property
    def kafka_bootstrap(self) -> str:
        return f"127.0.0.1:{self.kafka_port}"

    async def _run(self, *args: str) -> str:
        flags = [
            f"--state-dir={self.state_dir}", f"--redis-port={self.redis_port}", f"--kafka-port={self.kafka_port}",
            f"--controller-port={self.controller_port}",
        ]
        if args[0] == "up":
            flags.append(f"--timeout={self.timeout_s:.0f}")
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(SERVICES_SCRIPT), *args, *flags, stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT,
        )
        async with asyncio.timeout(self.timeout_s + 60):
            out, _ = await proc.communicate()
        text = out.decode(errors="replace")
        self.output.append(f"$ services.py {' '.join(args)}\n{text}")
        if proc.returncode != 0:
            raise RuntimeError(f"services.py {' '.join(args)} failed ({proc.returncode}):\n{text}")
        return text

    async def up(self, only: str, *, keep_data: bool = False) -> None:
        await self._run("up", f"--only={only}", *(["--keep-data"] if keep_data else []))

    async def down(self, only: str | None = None) -> None:
        await self._run("down", *([f"--only={only}"] if only else []))

    def pid(self, service: str) -> int | None:
        meta = self.state_dir / service / f"{service}.json"
        return int(json.loads(meta.read_text())["pid"]) if meta.exists() else None


def whole_trace(
    trace_id: str, t0_ms: int, tools: Sequence[str] = ("search",), *, arguments: str | None = None,
    resource: Mapping[str, AttrInput] | None = None,
) -> tuple[ExportTraceServiceRequest, int]:
    """One OTLP request holding a whole trace: a root, a chat span and one execution per tool
    (each with ``arguments`` when given). Returns (request, span count)."""
    root = new_span_id()
    spans = [
        otlp_span(trace_id, span_id=root, name="agent", start_ms=t0_ms, end_ms=t0_ms + 500),
        otlp_span(trace_id, parent=root, name="chat", start_ms=t0_ms + 1, end_ms=t0_ms + 20,
                  attrs={"gen_ai.operation.name": "chat"}),
    ]
    for i, tool in enumerate(tools):
        attrs = {"gen_ai.tool.call.arguments": arguments} if arguments is not None else None
        spans.append(otlp_span(trace_id, parent=root, name=f"execute_tool {tool}", tool=tool,
                               start_ms=t0_ms + 30 + 10 * i, end_ms=t0_ms + 35 + 10 * i, attrs=attrs))
    req = otlp_request(spans)
    for k, v in (resource or {}).items():
        req.resource_spans[0].resource.attributes.add(key=k, value=_any_value(v))
    return req, len(spans)


def assert_exactly_once(records: Sequence[ConsumerRecord[bytes, bytes]], expected: Mapping[str, str]) -> int:
    """The raw scores topic: every expectation in ``expected`` (id -> verdict) has exactly one
    distinct score_id, version 1, the expected verdict; nothing else was scored; re-sent events are
    byte-identical. Returns the number of re-sends."""
    by_id = scores_by_id(records)
    per_expectation: dict[str, set[str]] = {}
    for sid, payloads in by_id.items():
        assert all(p == payloads[0] for p in payloads), f"{sid}: re-sent events differ"
        ev = decode_score_event(payloads[0])
        assert ev.version == 1, ev
        assert ev.expectation_id in expected, f"unexpected score for {ev.expectation_id}"
        assert verdict(ev) == expected[ev.expectation_id], (ev.expectation_id, verdict(ev), ev.rationale)
        per_expectation.setdefault(ev.expectation_id, set()).add(sid)
    missing = set(expected) - set(per_expectation)
    assert not missing, f"never scored: {sorted(missing)}"
    contradicted = {e: s for e, s in per_expectation.items() if len(s) != 1}
    assert not contradicted, f"more than one score_id: {contradicted}"
    return sum(len(p) - 1 for p in by_id.values())


async def redis_keys(cfg: ServiceConfig, pattern: str = "*") -> list[str]:
    """Every key under the stack's key prefix matching ``<prefix>:<pattern>`` (SCAN, not KEYS)."""
    redis: Redis = Redis.from_url(cfg.redis.url)
    try:
        return sorted([k.decode() async for k in redis.scan_iter(match=f"{cfg.redis.key_prefix}:{pattern}",
                                                                 count=1000)])
    finally:
        await redis.aclose()


def counter_value(name: str, labels: Mapping[str, str]) -> float:
    """An in-process metric sample from the service's registry (0 when never incremented)."""
    from collector.telemetry.metrics import REGISTRY

    return REGISTRY.get_sample_value(name, dict(labels)) or 0.0


# ------------------------------------------------------------------------------------------------
# What the fault, consumer-group and crash tests share: a stack with its client and producer
# (dropped afterwards), isolated servers and service processes as context managers, groups of whole
# traces with a TRUE and a FALSE expectation each, and waiting / failing on what the client saw.
# ------------------------------------------------------------------------------------------------


@dataclass
class Stack:
    """A test's own stack (``make_config``: unique topics, group and key prefix), with a control
    client ``tw`` reading its scores topic and a raw producer writing its spans and control topics."""

    cfg: ServiceConfig
    tw: ToolwitnessClient
    producer: AIOKafkaProducer

    @property
    def topics(self) -> TopicsConfig:
        return self.cfg.kafka.topics

    async def send(self, topic: str, items: Iterable[tuple[str, bytes]]) -> None:
        """Produce (key, value) records (in this order, concurrently) and wait for every ack."""
        await asyncio.gather(*[await self.producer.send(topic, value=v, key=k.encode()) for k, v in items])

    async def send_group(self, group: TraceGroup, *, markers: bool = True) -> None:
        """Register a group's expectations, then send its spans, then (unless told not to) its markers."""
        await self.send(self.topics.control, group.expectations())
        await self.send(self.topics.spans, group.spans())
        if markers:
            await self.send(self.topics.control, group.markers())

    def received(self, ids: Iterable[str]) -> int:
        """How many of these expectations the client has a score for."""
        return sum(1 for e in ids if self.tw.events(e))

    def missing(self, ids: Iterable[str]) -> list[str]:
        """Those of these expectations the client has no score for."""
        return [e for e in ids if not self.tw.events(e)]

    async def all_scored(self, ids: Iterable[str], timeout: float) -> None:
        """Until the client has a score for every one of these expectations (else TimeoutError)."""
        await asyncio.gather(*[self.tw.wait_for(e, timeout=timeout) for e in ids])

    def only_events(self, ids: Iterable[str]) -> dict[str, score_pb2.ScoreEvent]:
        """Asserts that the client saw exactly one distinct score event per expectation; returns them."""
        out: dict[str, score_pb2.ScoreEvent] = {}
        for eid in ids:
            events = self.tw.events(eid)
            assert len(events) == 1, f"{eid}: {len(events)} distinct score events: {events}"
            out[eid] = events[0]
        return out

    async def scores(self) -> list[ConsumerRecord[bytes, bytes]]:
        """Every record on the scores topic so far, raw (read it once the services have stopped)."""
        return await read_all(self.cfg.kafka.bootstrap_servers, self.topics.scores)


@contextlib.asynccontextmanager
async def open_stack(cfg: ServiceConfig, *, drop_errors_ok: bool = False) -> AsyncIterator[Stack]:
    """The client and producer of ``cfg``'s stack; on the way out its topics and Redis keys are
    dropped (``drop_errors_ok`` where the broker or Redis is an isolated one, removed whole anyway)."""
    try:
        async with control_client(cfg) as tw, raw_producer(cfg) as producer:
            yield Stack(cfg, tw, producer)
    finally:
        if drop_errors_ok:
            with contextlib.suppress(Exception):
                await drop_stack(cfg)
        else:
            await drop_stack(cfg)


@contextlib.asynccontextmanager
async def isolated(state_dir: Path, only: str) -> AsyncIterator[IsolatedServices]:
    """``IsolatedServices`` with ``only`` (redis or kafka) up; all of it stopped on the way out."""
    iso = IsolatedServices(state_dir)
    try:
        await iso.up(only)
        yield iso
    finally:
        await iso.down()


@contextlib.asynccontextmanager
async def service_process(cfg: ServiceConfig, tmp_path: Path) -> AsyncIterator[ServiceProcess]:
    """``toolwitness run`` on ``cfg`` (written to tmp_path), NOT started yet; stopped on the way out."""
    proc = ServiceProcess(write_config(cfg, tmp_path / "toolwitness.yaml"), tmp_path / "service.log")
    try:
        yield proc
    finally:
        await proc.stop()


@contextlib.contextmanager
def fail_on_timeout(message: Callable[[], str]) -> Iterator[None]:
    """A TimeoutError inside fails the test with ``message()`` (built when it fails: what is missing,
    a service log tail)."""
    try:
        yield
    except TimeoutError:
        pytest.fail(message())


def ended(task: asyncio.Task[None]) -> str:
    """How a service's poll loop ended (its traceback), for a failure message."""
    exc = task.exception() if not task.cancelled() else None
    return "".join(traceback.format_exception(exc)) if exc is not None else "cancelled or returned"


def service_count(counter: Any) -> float:
    """The service's sample of a ``component``-labelled counter (e.g. EXPORT_FAILURES)."""
    return float(counter.labels("service")._value.get())


async def until_registered(cfg: ServiceConfig, ids: Sequence[str], tenant: str = "default",
                           timeout: float = 30.0) -> None:
    """Until every one of these expectations is stored in Redis (the service consumed its record)."""
    keys = [Keys(cfg.redis.key_prefix).expectation(tenant, e) for e in ids]
    redis: Redis = Redis.from_url(cfg.redis.url)
    try:

        async def all_there() -> bool:
            return int(await redis.exists(*keys)) == len(keys)

        await until(all_there, timeout=timeout)
    finally:
        await redis.aclose()


@dataclass
class TraceGroup:
    """Whole traces (``whole_trace``, one record each, calling ``search``), each meant to get a TRUE
    expectation ``<name>-true-<i>`` and a FALSE one ``<name>-false-<i>`` (``delete_db``, never called)."""

    name: str
    traces: list[tuple[str, bytes, int]]  # (trace id, OTLP record, span count)

    @classmethod
    def build(cls, name: str, n: int, t0_ms: int, *, step_ms: int = 1000, arguments: str | None = None) -> TraceGroup:
        traces = []
        for i in range(n):
            trace_id = new_trace_id()
            req, count = whole_trace(trace_id, t0_ms + step_ms * i, ("search",), arguments=arguments)
            traces.append((trace_id, req.SerializeToString(), count))
        return cls(name, traces)

    def verdicts(self) -> dict[str, str]:
        """Expectation id -> the verdict it must get."""
        return {f"{self.name}-{kind}-{i}": kind for i in range(len(self.traces)) for kind in ("true", "false")}

    def ids(self, kind: str = "") -> list[str]:
        """The expectation ids, or only those of one kind (``true`` / ``false``)."""
        return [e for e in self.verdicts() if e.startswith(f"{self.name}-{kind}")]

    def expectations(
        self, true_expectation: Callable[[int], ScoringExpectation] = lambda i: expects("search"),
        deadline: timedelta = timedelta(seconds=120),
    ) -> list[tuple[str, bytes]]:
        """Control records registering the TRUE and FALSE expectation of every trace, keyed by id."""
        out = []
        for i, (trace_id, _, _) in enumerate(self.traces):
            for kind, exp in (("true", true_expectation(i)), ("false", expects("delete_db"))):
                eid = f"{self.name}-{kind}-{i}"
                out.append((eid, expectation_bytes(eid, [trace_id], exp, deadline=deadline)))
        return out

    def spans(self) -> list[tuple[str, bytes]]:
        """The span records, keyed by trace id."""
        return [(t, v) for t, v, _ in self.traces]

    def markers(self) -> list[tuple[str, bytes]]:
        """Completion markers (with span counts), keyed by trace id."""
        return [(t, marker_bytes(t, n)) for t, _, n in self.traces]


# Consumer-group tests: one trace's spans spread over partitions, so that they are consumed by
# different members of the group and meet only in Redis.

SpanRecord = tuple[int, bytes, bytes]  # (partition, key, value)


def split_records(trace_id: str, spans: Sequence[trace_pb2.Span], first: int, partitions: int) -> list[SpanRecord]:
    """One record per span, with its own key ``<trace id>:<j>``, span j on partition (first + j) % partitions."""
    return [((first + j) % partitions, f"{trace_id}:{j}".encode(), otlp_request([span]).SerializeToString())
            for j, span in enumerate(spans)]


async def send_located(
    producer: AIOKafkaProducer, topic: str, records: Sequence[tuple[str, SpanRecord]]
) -> dict[tuple[int, int], str]:
    """Produce (trace id, record) pairs concurrently to their partitions; (partition, offset) -> trace id."""
    futures = [await producer.send(topic, value=v, key=k, partition=p) for _, (p, k, v) in records]
    acks = await asyncio.gather(*futures)
    return {(md.partition, md.offset): trace_id for (trace_id, _), md in zip(records, acks, strict=True)}


def span_partitions(service: ToolwitnessService) -> set[int]:
    """The partitions of the spans topic the service's consumer holds now."""
    consumer = service.consumer
    spans = service.cfg.kafka.topics.spans
    return set() if consumer is None else {tp.partition for tp in consumer.assignment() if tp.topic == spans}


async def until_split(a: ToolwitnessService, b: ToolwitnessService, partitions: int,
                      timeout: float = 30.0) -> tuple[list[int], list[int]]:
    """Until a and b both hold spans partitions, disjoint, together all of them; returns both shares."""
    every = set(range(partitions))
    await until(lambda: (pa := span_partitions(a)) and (pb := span_partitions(b)) and not pa & pb
                and pa | pb == every, timeout=timeout)
    return sorted(span_partitions(a)), sorted(span_partitions(b))
