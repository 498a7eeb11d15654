"""``toolwitness bench vs-tailsampling``: toolwitness next to the Collector's tail_sampling, same traces.

The comparison Collector is a minimal distribution built from
``deploy/collector/tailsampling/builder-config.yaml`` (kafkareceiver → tail_sampling →
nop / otlphttp exporter; pinned versions, cached build: ``scripts/tools.sh tailsampling``).
Its policy keeps a trace when ``gen_ai.tool.name`` is the expectation's tool — the Collector's
way of asking "did tool X run". Both read the SAME spans topic (each its own consumer group),
one after the other so they never share the CPU:

- **spans/s**: a backlog of whole-trace records drained — toolwitness end to end (applied and
  decided); the Collector from its own ``otelcol_receiver_accepted_spans`` counter, sampled
  every 50 ms, first to last increase;
- **time to decision** at the same paced load (one process sends one record per trace): for
  toolwitness, record produced → TRUE score read on the scores topic; for the Collector, record
  produced → the sampled trace received by a loopback OTLP/HTTP endpoint the bench runs (its
  otlphttp exporter, no queue, no compression). The Collector decides ``decision_wait`` after
  a trace's first span (default 30 s, its own default; ``--decision-wait``);
- **memory per trace**: toolwitness keeps per-trace state in Redis (``MEMORY USAGE``, mean over
  decided traces, and nothing per trace in the service process); the Collector holds the traces
  in its heap until the decision: VmRSS (``/proc/<pid>/status``) growth from before consuming
  to all traces held, over the number of traces (and its Go heap, ``otelcol_process_runtime_heap_alloc_bytes``).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import math
import os
import re
import signal
import socket
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import yaml
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from redis.asyncio import Redis
from rich.console import Console
from rich.markup import escape
from rich.progress import Progress
from rich.table import Table

from collector.bench import (
    TENANT,
    TRACE_SPANS,
    TRACE_TOOLS,
    Rig,
    _service,
    child_main,
    drain_in_process,
    latency_at,
    make_traces,
    on_rig,
    prepare_backlog,
    producer_kwargs,
    run_child,
    trace_memory,
)
from collector.benches.common import (
    CpuMeter,
    Target,
    busy_text,
    consoles,
    emit,
    new_progress,
    percentiles,
    proc_cpu_seconds,
    proc_rss_bytes,
    task,
)
from collector.config import KafkaConfig, ServiceConfig
from collector.exporters.kafka import kafka_security_kwargs
from collector.processors.trace_state import Keys

__all__ = ["build_collector", "run_vs_tailsampling_bench"]

ROOT = Path(__file__).resolve().parents[2]
TOOLS_SH = ROOT / "scripts" / "tools.sh"
#: a prebuilt comparison Collector (skips the build): path to its binary.
BIN_ENV = "TOOLWITNESS_TAILSAMPLING_BIN"
POLICY_TOOL = "tool_3"


# --------------------------------------------------------------------------------------------------
# The Collector: build, config, process
# --------------------------------------------------------------------------------------------------


@dataclass(slots=True)
class Build:
    ok: bool
    path: str = ""
    seconds: float = 0.0
    detail: str = ""


def _is_file(p: str | Path) -> bool:
    return Path(p).is_file()


async def build_collector(timeout: float = 1200.0) -> Build:
    """``scripts/tools.sh tailsampling`` (a cache hit after the first build); its wall time."""
    env_bin = os.environ.get(BIN_ENV)
    if env_bin:
        return Build(_is_file(env_bin), env_bin, 0.0, f"prebuilt ({BIN_ENV})")
    if not _is_file(TOOLS_SH):
        return Build(False, detail=f"{TOOLS_SH} not found (set {BIN_ENV} to a built otelcol-tailsampling)")
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        "bash", str(TOOLS_SH), "tailsampling", stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE
    )
    try:
        out, errb = await asyncio.wait_for(proc.communicate(), timeout=timeout)
    except TimeoutError:
        with contextlib.suppress(ProcessLookupError):
            proc.kill()
        await proc.wait()
        return Build(False, seconds=time.perf_counter() - t0, detail=f"build still running after {timeout:.0f}s")
    secs = time.perf_counter() - t0
    text = errb.decode(errors="replace")
    if proc.returncode != 0:
        tail = " | ".join(line.strip() for line in text.splitlines()[-4:])
        return Build(False, seconds=secs, detail=f"tools.sh exited {proc.returncode}: {tail[:600]}")
    cached = "built" not in text
    return Build(True, out.decode().strip().splitlines()[-1], secs, "cache hit" if cached else "built now")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def collector_config(
    k: KafkaConfig,
    topic: str,
    group: str,
    *,
    offset: str,
    decision_wait: str,
    num_traces: int,
    metrics_port: int,
    export_port: int | None,
) -> dict[str, Any]:
    exporter = (
        {
            "otlphttp": {
                "endpoint": f"http://127.0.0.1:{export_port}",
                "compression": "none",
                "sending_queue": {"enabled": False},
            }
        }
        if export_port
        else {"nop": {}}
    )
    return {
        "receivers": {
            "kafka": {
                "brokers": k.bootstrap_servers.split(","),
                "group_id": group,
                "client_id": group,
                "initial_offset": offset,
                "traces": {"topics": [topic], "encoding": "otlp_proto"},
            }
        },
        "processors": {
            "tail_sampling": {
                "decision_wait": decision_wait,
                "num_traces": num_traces,
                "expected_new_traces_per_sec": 1000,
                "drop_pending_traces_on_shutdown": True,
                "policies": [
                    {
                        "name": "tool-ran",
                        "type": "string_attribute",
                        "string_attribute": {"key": "gen_ai.tool.name", "values": [POLICY_TOOL]},
                    }
                ],
            }
        },
        "exporters": exporter,
        "service": {
            "telemetry": {
                "logs": {"level": "warn"},
                "metrics": {
                    "level": "detailed",
                    "readers": [{"pull": {"exporter": {"prometheus": {"host": "127.0.0.1", "port": metrics_port}}}}],
                },
            },
            "pipelines": {
                "traces": {"receivers": ["kafka"], "processors": ["tail_sampling"], "exporters": list(exporter)}
            },
        },
    }


_SAMPLE = re.compile(r"^([a-zA-Z_:][a-zA-Z0-9_:]*)(\{[^}]*\})?\s+(\S+)")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {name: sum over label sets}."""
    out: dict[str, float] = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        m = _SAMPLE.match(line)
        if m:
            with contextlib.suppress(ValueError):
                out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


def metric(m: dict[str, float], *needles: str) -> float:
    for needle in needles:
        for name, v in m.items():
            if needle in name and not name.endswith(("_bucket", "_count", "_sum")):
                return v
    return math.nan


class Collector:
    """One otelcol-tailsampling process with a config file, its metrics endpoint and RSS."""

    def __init__(self, binary: str, config: dict[str, Any], workdir: Path, metrics_port: int) -> None:
        self.binary = binary
        self.config = config
        self.workdir = workdir
        self.metrics_url = f"http://127.0.0.1:{metrics_port}/metrics"
        self.proc: asyncio.subprocess.Process | None = None
        self.http = httpx.AsyncClient(timeout=2.0)
        self.log = workdir / f"collector-{metrics_port}.log"

    async def start(self) -> None:
        cfg_path = self.workdir / f"config-{id(self)}.yaml"
        await asyncio.to_thread(cfg_path.write_text, yaml.safe_dump(self.config))
        log = await asyncio.to_thread(open, self.log, "wb")
        self._log = log
        self.proc = await asyncio.create_subprocess_exec(self.binary, "--config", str(cfg_path), stdout=log, stderr=log)

    async def metrics(self) -> dict[str, float] | None:
        try:
            r = await self.http.get(self.metrics_url)
        except httpx.HTTPError:
            return None
        return parse_metrics(r.text) if r.status_code == 200 else None

    @property
    def rss(self) -> int:
        return proc_rss_bytes(self.proc.pid) if self.proc is not None else 0

    async def stop(self) -> None:
        if self.proc is not None and self.proc.returncode is None:
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(signal.SIGTERM)
            try:
                await asyncio.wait_for(self.proc.wait(), timeout=20)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    self.proc.kill()
                await self.proc.wait()
        await self.http.aclose()
        with contextlib.suppress(Exception):
            self._log.close()

    async def log_tail(self) -> str:
        with contextlib.suppress(OSError):
            text = await asyncio.to_thread(self.log.read_text, errors="replace")
            return " | ".join(text.strip().splitlines()[-3:])[:500]
        return ""


# --------------------------------------------------------------------------------------------------
# The time-to-decision child process: paced producer + loopback OTLP/HTTP receiver
# --------------------------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class DecisionJob:
    kafka: dict[str, Any]
    spans_topic: str
    records: list[tuple[bytes, bytes]]  # key = trace id hex, value = whole-trace record
    spans_per_record: int
    rate: int
    port: int
    wait_s: float


@dataclass(slots=True)
class DecisionResult:
    sent: int = 0
    send_seconds: float = 0.0
    achieved_rate: float = 0.0
    latencies_ms: list[float] = field(default_factory=list)
    missing: int = 0
    requests: int = 0


def decision_child_main() -> None:
    child_main(_decision_run)


async def _decision_run(job: DecisionJob) -> DecisionResult:
    k = KafkaConfig.model_validate(job.kafka)
    arrivals: dict[str, float] = {}
    wanted = {key.decode() for key, _ in job.records}
    all_in = asyncio.Event()
    out = DecisionResult()

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = 0
                for line in head.split(b"\r\n")[1:]:
                    name, _, value = line.partition(b":")
                    if name.strip().lower() == b"content-length":
                        length = int(value.strip())
                body = await reader.readexactly(length)
                now = time.perf_counter()
                out.requests += 1
                req = ExportTraceServiceRequest()
                with contextlib.suppress(Exception):
                    req.ParseFromString(body)
                for rs in req.resource_spans:
                    for ss in rs.scope_spans:
                        for s in ss.spans:
                            arrivals.setdefault(s.trace_id.hex(), now)
                if wanted.issubset(arrivals):
                    all_in.set()
                writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/x-protobuf\r\nContent-Length: 0\r\n\r\n")
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError, ValueError, asyncio.LimitOverrunError):
            pass
        except asyncio.CancelledError:  # the run is over: the server closes with the process
            return
        finally:
            writer.close()

    server = await asyncio.start_server(handle, "127.0.0.1", job.port)
    producer = AIOKafkaProducer(**producer_kwargs(k))
    await asyncio.wait_for(producer.start(), timeout=30)
    try:
        await producer.partitions_for(job.spans_topic)
        interval = job.spans_per_record / job.rate
        sent_at: dict[str, float] = {}
        acks = []
        t0 = time.perf_counter()
        last = t0
        for i, (key, value) in enumerate(job.records):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            last = sent_at[key.decode()] = time.perf_counter()
            acks.append(await producer.send(job.spans_topic, value=value, key=key))
        async with asyncio.timeout(60):
            await asyncio.gather(*acks)
        out.sent = len(job.records)
        out.send_seconds = last - t0
        out.achieved_rate = (out.sent - 1) * job.spans_per_record / out.send_seconds if out.sent > 1 else 0.0
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(all_in.wait(), timeout=job.wait_s)
        out.latencies_ms = sorted((arrivals[t] - sent_at[t]) * 1000 for t in wanted if t in arrivals)
        out.missing = len(wanted) - len(out.latencies_ms)
    finally:
        await producer.stop()
        server.close()
    return out


async def _run_decision_process(job: DecisionJob, timeout: float) -> DecisionResult:
    entry = "collector.benches.tailsampling:decision_child_main"
    return await run_child(entry, job, DecisionResult, timeout, "decision")


async def _group_stable(k: KafkaConfig, group: str, timeout: float = 60.0) -> None:
    """Wait until the Collector's consumer group has a member holding partitions."""
    admin = AIOKafkaAdminClient(bootstrap_servers=k.bootstrap_servers, **kafka_security_kwargs(k))
    await asyncio.wait_for(admin.start(), timeout=30)
    try:
        async with asyncio.timeout(timeout):
            while True:
                with contextlib.suppress(Exception):
                    desc = await admin.describe_consumer_groups([group])
                    for g in desc:
                        for err, gid, state, *_rest in g.groups:
                            if gid == group and state == "Stable" and not err:
                                return
                await asyncio.sleep(0.25)
    except TimeoutError:
        raise TimeoutError(f"the Collector's consumer group {group} did not become stable in {timeout:.0f}s") from None
    finally:
        await admin.close()


# --------------------------------------------------------------------------------------------------
# The two sides
# --------------------------------------------------------------------------------------------------


async def _collector_throughput(
    binary: str, cfg: ServiceConfig, total: int, traces: int, decision_wait: str, workdir: Path, progress: Progress
) -> dict[str, Any]:
    port = free_port()
    conf = collector_config(
        cfg.kafka,
        cfg.kafka.topics.spans,
        f"{cfg.kafka.group_id}-otelcol",
        offset="earliest",
        decision_wait=decision_wait,
        num_traces=max(50000, 2 * traces),
        metrics_port=port,
        export_port=None,
    )
    col = Collector(binary, conf, workdir, port)
    tid, adv = task(progress, "Collector: drain the backlog", total)
    samples: list[tuple[float, float]] = []
    out: dict[str, Any] = {}
    try:
        t_start = time.perf_counter()
        await col.start()
        assert col.proc is not None
        base_rss = 0
        base_heap = math.nan
        seen = 0.0
        async with asyncio.timeout(max(120.0, total / 2000)):
            while True:
                if col.proc.returncode is not None:
                    raise RuntimeError(f"the Collector exited ({col.proc.returncode}): {await col.log_tail()}")
                m = await col.metrics()
                now = time.perf_counter()
                if m is not None:
                    accepted = metric(m, "receiver_accepted_spans")
                    if not base_rss:
                        base_rss = col.rss
                        base_heap = metric(m, "process_runtime_heap_alloc_bytes")
                        out["accepted_at_baseline"] = 0 if math.isnan(accepted) else accepted
                        out["startup_s"] = now - t_start
                    if math.isfinite(accepted) and accepted > seen:
                        samples.append((now, accepted))
                        adv(int(accepted - seen))
                        seen = accepted
                    if seen >= total:
                        break
                await asyncio.sleep(0.05)
        await asyncio.sleep(0.5)  # let the processor take in the last batch
        m = await col.metrics() or {}
        held = metric(m, "sampling_traces_on_memory")
        rss = col.rss
        heap = metric(m, "process_runtime_heap_alloc_bytes")
        cpu = await asyncio.to_thread(_cpu_of, col.proc.pid)
    finally:
        await col.stop()
        progress.remove_task(tid)
    first = samples[0]
    secs = samples[-1][0] - first[0]
    # spans counted at the first sample arrived before it: rate over the spans after it
    out.update(
        {
            "spans": seen,
            "seconds": secs,
            "spans_per_s": (seen - first[1]) / secs if secs > 0 else math.nan,
            "traces": traces,
            "traces_on_memory": held,
            "rss_base_bytes": base_rss,
            "rss_bytes": rss,
            "rss_per_trace": (rss - base_rss) / traces,
            "heap_per_trace": (heap - base_heap) / traces if math.isfinite(heap - base_heap) else math.nan,
            "cpu_s": cpu,
        }
    )
    return out


def _cpu_of(pid: int) -> float:
    return proc_cpu_seconds(pid)


async def _collector_decisions(
    binary: str,
    cfg: ServiceConfig,
    records: list[tuple[bytes, bytes]],
    rate: int,
    decision_wait: str,
    decision_wait_s: float,
    workdir: Path,
    progress: Progress,
) -> dict[str, Any]:
    port = free_port()
    export_port = free_port()
    group = f"{cfg.kafka.group_id}-otelcol-latency"
    conf = collector_config(
        cfg.kafka,
        cfg.kafka.topics.spans,
        group,
        offset="latest",
        decision_wait=decision_wait,
        num_traces=50000,
        metrics_port=port,
        export_port=export_port,
    )
    col = Collector(binary, conf, workdir, port)
    try:
        await col.start()
        tid = progress.add_task("Collector: waiting for its consumer group", total=None)
        await _group_stable(cfg.kafka, group)
        await asyncio.sleep(1.0)
        progress.remove_task(tid)
        tid = progress.add_task(f"Collector: decisions at {rate:,} spans/s (decision_wait {decision_wait})", total=None)
        job = DecisionJob(
            kafka=cfg.kafka.model_dump(),
            spans_topic=cfg.kafka.topics.spans,
            records=records,
            spans_per_record=TRACE_SPANS,
            rate=rate,
            port=export_port,
            wait_s=decision_wait_s + 30.0,
        )
        send_s = len(records) * TRACE_SPANS / rate
        res = await _run_decision_process(job, timeout=send_s + decision_wait_s + 120)
        progress.remove_task(tid)
        m = await col.metrics() or {}
    finally:
        await col.stop()
    return {
        "target_rate": rate,
        "achieved_rate": res.achieved_rate,
        "traces": res.sent,
        "decided": len(res.latencies_ms),
        "missing": res.missing,
        "requests": res.requests,
        "sampled_traces_metric": metric(m, "count_traces_sampled"),
        **percentiles(res.latencies_ms),
    }


def _seconds(d: str) -> float:
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", d.strip())
    if not m:
        raise ValueError(f"decision wait {d!r}: use e.g. 30s, 500ms, 1m")
    v = float(m.group(1))
    return v / 1000 if m.group(2) == "ms" else v * 60 if m.group(2) == "m" else v


async def _run(
    rig: Rig,
    binary: str,
    spans: int,
    rate: int,
    latency_seconds: float,
    decision_wait: str,
    err: Console,
) -> dict[str, Any]:
    wait_s = _seconds(decision_wait)
    cfg = rig.config()
    n = max(4, spans // TRACE_SPANS)
    n_lat = max(2, round(rate * latency_seconds / TRACE_SPANS))
    progress = new_progress(err)
    redis = Redis.from_url(cfg.redis.url)
    keys = Keys(cfg.redis.key_prefix)
    tw: dict[str, Any] = {}
    with progress, tempfile.TemporaryDirectory(prefix="tw-bench-otelcol-") as tmp:
        try:
            _, adv = task(progress, "generate traces", n + 2 * n_lat)
            one = functools.partial(adv, 1)
            backlog = make_traces(n, on_trace=one)
            later_tw = make_traces(n_lat, on_trace=one)
            later_col = make_traces(n_lat, on_trace=one)
            # toolwitness: drain the backlog, bytes per trace, time to verdict -----------------------------
            total = await prepare_backlog(cfg, redis, backlog, progress)
            cpu = CpuMeter(cfg.kafka.bootstrap_servers, cfg.redis.url)
            tw["e2e"] = await drain_in_process(cfg, total, progress, cpu, desc="toolwitness: drain the backlog")
            sample = backlog[: min(50, len(backlog))]
            sizes = [sum((await trace_memory(redis, keys, TENANT, b.trace_id)).values()) for b in sample]
            tw["trace_bytes"] = sum(sizes) / len(sizes)
            async with _service(cfg) as svc:
                tw["latency"] = await latency_at(cfg, svc, redis, later_tw, rate, progress, seconds=latency_seconds)
        finally:
            await redis.aclose()
        # the Collector, on the same topic ------------------------------------------------------------------
        col = await _collector_throughput(binary, cfg, total, n, decision_wait, Path(tmp), progress)
        col["latency"] = await _collector_decisions(
            binary,
            cfg,
            [(b.trace_id.encode(), b.record) for b in later_col],
            rate,
            decision_wait,
            wait_s,
            Path(tmp),
            progress,
        )
    return {
        "cpus": os.cpu_count() or 0,
        "spans": total,
        "traces": n,
        "spans_per_trace": TRACE_SPANS,
        "tools_per_trace": TRACE_TOOLS,
        "decision_wait": decision_wait,
        "policy": f"string_attribute gen_ai.tool.name in [{POLICY_TOOL}]",
        "toolwitness": tw,
        "collector": col,
    }


def _table(report: dict[str, Any], build: Build, targets: Sequence[Target]) -> Table:
    t = Table(
        title=f"toolwitness vs Collector tail_sampling — one run, same topic, {report.get('traces', 0):,} traces of "
        f"{TRACE_SPANS} spans, {report.get('cpus', 0)} CPUs"
    )
    t.add_column("measure")
    t.add_column("toolwitness", justify="right")
    t.add_column("Collector tail_sampling", justify="right")
    t.add_column("detail")
    t.add_row(
        "comparison Collector build",
        "",
        "ok" if build.ok else "[red]FAILED[/]",
        f"{build.seconds:,.1f} s ({build.detail}) {build.path}",
    )
    tw, col = report.get("toolwitness"), report.get("collector")
    if tw and col:
        e = tw["e2e"]
        t.add_row(
            "spans/s draining the backlog",
            f"{e['spans_per_s']:,.0f}",
            f"{col['spans_per_s']:,.0f}",
            f"toolwitness applied + decided (CPU {busy_text(e['cpu'])}); Collector accepted into tail_sampling "
            f"({col['cpu_s']:.1f} CPU s)",
        )
        tl, cl = tw["latency"], col["latency"]
        for q in ("p50", "p95", "p99", "max"):
            t.add_row(
                f"time to decision {q} at {tl['target_rate']:,} spans/s",
                f"{tl[q + '_ms']:,.1f} ms",
                f"{cl[q + '_ms']:,.1f} ms",
                "record produced → TRUE score read / sampled trace received downstream" if q == "p50" else "",
            )
        t.add_row(
            "  decided / sent (achieved rate)",
            f"{tl['verdicts']:,}/{tl['traces']:,} ({tl['achieved_rate']:,.0f}/s)",
            f"{cl['decided']:,}/{cl['traces']:,} ({cl['achieved_rate']:,.0f}/s)",
            escape(f"Collector decision_wait {report['decision_wait']}; policy {report['policy']}"),
        )
        t.add_row(
            "memory per trace",
            f"{tw['trace_bytes']:,.0f} B",
            f"{col['rss_per_trace']:,.0f} B",
            f"toolwitness: Redis MEMORY USAGE (state + sets), decided traces; Collector: VmRSS "
            f"{col['rss_base_bytes'] / 1e6:,.0f} → {col['rss_bytes'] / 1e6:,.0f} MB holding the "
            f"{col['traces']:,} traces (traces_on_memory gauge {col['traces_on_memory']:,.0f}); "
            f"Go heap {col['heap_per_trace']:,.0f} B/trace",
        )
    if targets:
        t.add_section()
        for tg in targets:
            mark = "[green]met[/]" if tg.met else "[red]MISSED[/]"
            t.add_row(f"target: {tg.name}", mark, "", f"{tg.value} ({tg.target})")
    return t


def _targets(report: dict[str, Any]) -> list[Target]:
    tw, col = report["toolwitness"], report["collector"]
    tl, cl = tw["latency"], col["latency"]
    return [
        Target(
            "toolwitness p99 (TRUE) < 100 ms next to the Collector's on the same traces",
            "< 100 ms, every verdict read",
            f"{tl['p99_ms']:,.1f} ms vs Collector {cl['p99_ms']:,.1f} ms",
            tl["p99_ms"] < 100.0 and tl["missing"] == 0,
        )
    ]


async def run_vs_tailsampling_bench(
    *,
    spans: int = 50000,
    rate: int = 5000,
    latency_seconds: float = 10.0,
    decision_wait: str = "30s",
    as_json: bool = False,
    bootstrap: str | None = None,
    redis_url: str | None = None,
    build_timeout: float = 1200.0,
) -> int:
    """Build (cached) and run the comparison; one table (or JSON). Exit: 0 met, 1 missed, 2 failed."""
    _seconds(decision_wait)
    if spans < TRACE_SPANS or rate < TRACE_SPANS or latency_seconds <= 0:
        raise ValueError(f"need spans >= {TRACE_SPANS}, rate >= {TRACE_SPANS}, latency_seconds > 0")
    out, err = consoles()
    with err.status("building the comparison Collector (scripts/tools.sh tailsampling; cached after the first)"):
        build = await build_collector(build_timeout)
    report: dict[str, Any] = {
        "build": {"ok": build.ok, "path": build.path, "seconds": build.seconds, "detail": build.detail}
    }
    if not build.ok:
        err.print(f"toolwitness bench vs-tailsampling: the Collector build failed: {build.detail}")
        emit(report, [], _table(report, build, []), as_json, out)
        return 2
    ran = await on_rig(
        "vs-tailsampling",
        bootstrap,
        redis_url,
        err,
        lambda rig: _run(rig, build.path, spans, rate, latency_seconds, decision_wait, err),
    )
    if ran is None:
        return 2
    report.update(ran)
    targets = _targets(report)
    return emit(report, targets, _table(report, build, targets), as_json, out)
