"""Service instances in their own processes (one interpreter each), for multi-instance figures.

The parent starts N children with the same consumer group; each child starts a
``ToolwitnessService`` (joins the group) but does not poll until every child reports a
stable partition assignment and the parent says ``go`` — the backlog is already on the
topic, so the measured window is pure draining, with no rebalance inside it. Each child
reports every batch (wall-clock start/end, spans) as a JSON line on stdout; the parent
sums them. ``stop`` ends a child gracefully (commit, leave the group).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from collector.config import ServiceConfig
from collector.pipeline.checkpoint import Batch, BatchResult, Checkpoint
from collector.pipeline.service import ToolwitnessService

__all__ = ["InstancesResult", "child_main", "run_instances"]


class _ReportingCheckpoint(Checkpoint):
    def __init__(self, base: Checkpoint) -> None:
        super().__init__(base.cfg, base.store, base.engine, base.exporter, base.watermarks)

    async def process(self, batch: Batch) -> BatchResult:
        t0 = time.time()
        res = await super().process(batch)
        if res.spans:
            _say({"event": "batch", "t0": t0, "t1": time.time(), "spans": res.spans, "published": res.published})
        return res


def _say(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


async def _child(cfg: ServiceConfig) -> None:
    svc = ToolwitnessService(cfg, owns_process=True)
    svc.checkpoint = _ReportingCheckpoint(svc.checkpoint)
    await asyncio.wait_for(svc.start(), timeout=90)
    assert svc.consumer is not None
    consumer = svc.consumer
    loop = asyncio.get_running_loop()
    reader = asyncio.StreamReader()
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(reader), sys.stdin)
    go = asyncio.Event()
    stop = asyncio.Event()

    async def commands() -> None:
        while True:
            line = await reader.readline()
            if not line or line.strip() == b"stop":
                stop.set()
                go.set()
                return
            if line.strip() == b"go":
                go.set()

    async def assignment() -> None:
        last: list[int] | None = None
        while not go.is_set():
            now = sorted(tp.partition for tp in consumer.assignment() if tp.topic == cfg.kafka.topics.spans)
            if now != last:
                _say({"event": "assigned", "partitions": now})
                last = now
            await asyncio.sleep(0.1)

    cmd = asyncio.create_task(commands())
    watch = asyncio.create_task(assignment())
    await go.wait()
    watch.cancel()
    cpu0 = time.process_time()
    run = asyncio.create_task(svc.run()) if not stop.is_set() else None
    await stop.wait()
    svc.request_stop()
    if run is not None:
        with contextlib.suppress(Exception):
            await asyncio.wait_for(run, timeout=30)
    await svc.shutdown()
    cmd.cancel()
    _say({"event": "stopped", "cpu_s": time.process_time() - cpu0})


def child_main() -> None:
    """Entry point of one instance process: the ServiceConfig as JSON in argv[1]."""
    cfg = ServiceConfig.model_validate_json(sys.argv[1])
    asyncio.run(_child(cfg))


@dataclass(slots=True)
class InstancesResult:
    instances: int
    spans: int = 0
    published: int = 0
    seconds: float = 0.0
    spans_per_s: float = 0.0
    batches: int = 0
    assignment: list[list[int]] = field(default_factory=list)
    cpu_s: list[float] = field(default_factory=list)


class _Child:
    def __init__(self, proc: asyncio.subprocess.Process) -> None:
        self.proc = proc
        self.partitions: list[int] = []
        self.assigned_at = 0.0
        self.cpu_s = float("nan")
        self.stopped = asyncio.Event()


async def run_instances(
    cfg: ServiceConfig,
    n: int,
    total_spans: int,
    *,
    partitions: int,
    on_spans: Callable[[int], None] | None = None,
    on_start: Callable[[list[int]], None] | None = None,
    on_done: Callable[[], None] | None = None,
    timeout: float = 300.0,
) -> InstancesResult:
    """Drain the spans topic (backlog already there) with ``n`` instance processes of one group.

    ``on_start`` gets the children's pids once they all hold partitions (before ``go``);
    ``on_done`` runs when the last span is applied, while the children still live.
    """
    res = InstancesResult(instances=n)
    children: list[_Child] = []
    batches: list[tuple[float, float, int]] = []
    done = asyncio.Event()
    readers: list[asyncio.Task[None]] = []

    async def read(c: _Child) -> None:
        assert c.proc.stdout is not None
        while True:
            line = await c.proc.stdout.readline()
            if not line:
                c.stopped.set()
                return
            try:
                msg = json.loads(line)
            except ValueError:
                continue
            ev = msg.get("event")
            if ev == "assigned":
                c.partitions = list(msg["partitions"])
                c.assigned_at = time.perf_counter()
            elif ev == "batch":
                batches.append((float(msg["t0"]), float(msg["t1"]), int(msg["spans"])))
                res.published += int(msg.get("published", 0))
                if on_spans is not None:
                    on_spans(int(msg["spans"]))
                if sum(b[2] for b in batches) >= total_spans:
                    done.set()
            elif ev == "stopped":
                c.cpu_s = float(msg["cpu_s"])
                c.stopped.set()

    try:
        for _ in range(n):
            proc = await asyncio.create_subprocess_exec(
                sys.executable,
                "-c",
                "from collector.benches.instances import child_main; child_main()",
                cfg.model_dump_json(),
                stdin=asyncio.subprocess.PIPE,
                stdout=asyncio.subprocess.PIPE,
            )
            c = _Child(proc)
            children.append(c)
            readers.append(asyncio.create_task(read(c)))

        def settled() -> bool:
            parts = [p for c in children for p in c.partitions]
            want = min(n, partitions)
            held = sum(1 for c in children if c.partitions)
            quiet = all(time.perf_counter() - c.assigned_at > 1.0 for c in children)
            return sorted(parts) == list(range(partitions)) and held >= want and quiet

        async with asyncio.timeout(120):
            while not settled():
                if any(c.proc.returncode is not None for c in children):
                    raise RuntimeError("a service instance exited before joining the group")
                await asyncio.sleep(0.1)
        res.assignment = [c.partitions for c in children]
        if on_start is not None:
            on_start([c.proc.pid for c in children])
        for c in children:
            assert c.proc.stdin is not None
            c.proc.stdin.write(b"go\n")
            await c.proc.stdin.drain()
        try:
            await asyncio.wait_for(done.wait(), timeout=timeout)
        except TimeoutError:
            got = sum(b[2] for b in batches)
            raise TimeoutError(f"{n} instance(s) applied {got} of {total_spans} spans in {timeout:.0f}s") from None
        if on_done is not None:
            on_done()
        first = min(b[0] for b in batches)
        last = max(b[1] for b in batches)
        res.spans = sum(b[2] for b in batches)
        res.batches = len(batches)
        res.seconds = last - first
        res.spans_per_s = res.spans / res.seconds if res.seconds > 0 else float("nan")
    finally:
        for c in children:
            if c.proc.stdin is not None and not c.proc.stdin.is_closing():
                with contextlib.suppress(Exception):
                    c.proc.stdin.write(b"stop\n")
                    await c.proc.stdin.drain()
                    c.proc.stdin.close()
        for c in children:
            try:
                await asyncio.wait_for(c.proc.wait(), timeout=45)
            except TimeoutError:
                with contextlib.suppress(ProcessLookupError):
                    c.proc.kill()
                await c.proc.wait()
        for r in readers:
            with contextlib.suppress(Exception):
                await asyncio.wait_for(r, timeout=5)
    res.cpu_s = [c.cpu_s for c in children]
    return res
