"""The output topics, read from a shell: ``toolwitness scores``, ``observation`` and ``dlq``.

Scores and observations are protobuf by default, which a console consumer prints as bytes.
These commands decode each record (protobuf or JSON, whichever it is) and print one table row
per record, or with ``--json`` one JSON object per line (the protobuf JSON mapping
``kafka.output_format: json`` writes) for ``jq``. They read with no consumer group (nothing is
committed, the service's group is not touched): from the start of every partition, up to the
end offsets seen when they start, unless ``--follow``.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
from collections.abc import AsyncGenerator, Callable, Collection
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Generic, TypeVar

from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from google.protobuf import json_format
from google.protobuf.message import DecodeError
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from collector.client import ToolwitnessClient, kafka_security_kwargs, topic_partitions
from collector.config import KafkaConfig
from collector.exporters.kafka import (
    DLQ_DETAIL_HEADER,
    DLQ_REASON_HEADER,
    DLQ_SOURCE_HEADER,
    DLQ_TRUNCATED_HEADER,
    TENANT_HEADER,
)
from collector.wire.convert import decode_score_event, encode, observation_to_proto
from collector.wire.gen import common_pb2, score_pb2

#: what a dead letter's headers say (KafkaExporter.send_dead_letter writes them)
DLQ_HEADERS = {
    "reason": DLQ_REASON_HEADER,
    "detail": DLQ_DETAIL_HEADER,
    "source": DLQ_SOURCE_HEADER,
    "truncated_from": DLQ_TRUNCATED_HEADER,
    "tenant": TENANT_HEADER,
}


#: rows per printed table: a long topic is printed in tables of this many, not held whole
TABLE_ROWS = 200
T = TypeVar("T")


class _Printer(Generic[T]):
    """How each record a reader keeps is printed: a JSON line (``--json``), a line as it arrives
    (``--follow``), else a row of a table printed every ``TABLE_ROWS`` rows and at the end."""

    def __init__(self, console: Console, *, json_out: bool, follow: bool, as_json: Callable[[T], str],
                 as_line: Callable[[T], str], as_table: Callable[[list[T]], Table]) -> None:
        self.console, self.json_out, self.follow = console, json_out, follow
        self.as_json, self.as_line, self.as_table = as_json, as_line, as_table
        self.rows: list[T] = []

    def add(self, item: T) -> None:
        if self.json_out:
            self.console.print(self.as_json(item), markup=False, highlight=False, soft_wrap=True)
        elif self.follow:  # no table header per row
            self.console.print(self.as_line(item), highlight=False, soft_wrap=True)
        else:
            self.rows.append(item)
            if len(self.rows) >= TABLE_ROWS:  # bounded memory
                self.flush()

    def flush(self) -> None:
        if self.rows:
            self.console.print(self.as_table(self.rows))
            self.rows = []


class TailError(RuntimeError):
    """The topic cannot be read as asked (it does not exist, the brokers do not answer)."""


@dataclass(frozen=True, slots=True)
class Tail:
    """Which records: from the start of each partition (else only new ones), up to the end
    offsets seen at the start unless ``follow``; at most ``limit`` of them printed (0: no limit),
    counted after filters and de-duplication, so ``--limit 2`` prints two when two are there."""

    from_beginning: bool = True
    follow: bool = False
    limit: int = 0
    #: how long to wait for the brokers and for the topic's metadata
    timeout_s: float = 15.0


async def records(k: KafkaConfig, topic: str, tail: Tail) -> AsyncGenerator[ConsumerRecord[bytes, bytes], None]:
    """The records of ``topic`` as ``tail`` says, partition by partition as fetched."""
    consumer = AIOKafkaConsumer(
        bootstrap_servers=k.bootstrap_servers,
        client_id=f"{k.client_id}-tail",
        group_id=None,
        enable_auto_commit=False,
        request_timeout_ms=max(1000, int(tail.timeout_s * 1000)),
        max_partition_fetch_bytes=max(1048576, k.max_record_bytes + 65536),
        **kafka_security_kwargs(k.security),
    )
    try:
        try:
            async with asyncio.timeout(tail.timeout_s):
                await consumer.start()
                parts = sorted(await topic_partitions(consumer, topic))
        except TimeoutError:
            raise TailError(f"Kafka at {k.bootstrap_servers} did not answer within {tail.timeout_s:.0f}s") from None
        if not parts:
            raise TailError(f"topic {topic} does not exist on {k.bootstrap_servers}")
        tps = [TopicPartition(topic, p) for p in parts]
        consumer.assign(tps)
        if tail.from_beginning:
            await consumer.seek_to_beginning(*tps)
        else:
            await consumer.seek_to_end(*tps)
        ends: dict[TopicPartition, int] = await consumer.end_offsets(tps)
        done: set[TopicPartition] = set()
        while True:
            if not tail.follow:
                done |= {tp for tp in tps if tp not in done and await consumer.position(tp) >= ends[tp]}
                if len(done) == len(tps):
                    return
            batch = await consumer.getmany(timeout_ms=200)
            for tp, recs in batch.items():
                for rec in recs:
                    if not tail.follow and rec.offset >= ends[tp]:
                        continue  # written after the start: the next run shows it
                    yield rec
    finally:
        await consumer.stop()


# -- scores ----------------------------------------------------------------------------------------


def status_name(status: int) -> str:
    return common_pb2.ScoreStatus.Name(status).removeprefix("SCORE_STATUS_")  # type: ignore[arg-type]


def coverage_text(c: common_pb2.Coverage) -> str:
    if c.complete:
        source = common_pb2.CompletionSource.Name(c.source).removeprefix("COMPLETION_SOURCE_").lower()
        return f"complete ({source})"
    return ", ".join(c.reasons) or "incomplete"


def score_json(ev: score_pb2.ScoreEvent) -> str:
    return encode(ev, "json").decode()


async def show_scores(
    k: KafkaConfig,
    tail: Tail,
    *,
    expectations: Collection[str] = (),
    tenant: str | None = None,
    resends: bool = False,
    json_out: bool = False,
    out: Console | None = None,
) -> int:
    """Print the score events of the scores topic (one per ``score_id`` unless ``resends``: a
    re-send after a crash is byte-identical); return how many were printed."""
    printer = _Printer(out or Console(), json_out=json_out, follow=tail.follow, as_json=score_json,
                       as_line=score_line, as_table=score_table)
    seen: set[str] = set()
    printed = 0
    async with contextlib.aclosing(records(k, k.topics.scores, tail)) as recs:
        async for rec in recs:
            ev = _score_of(rec, printer.console)
            if ev is None:
                continue
            if expectations and ev.expectation_id not in expectations:
                continue
            if tenant is not None and ev.tenant != tenant:
                continue
            if not resends and ev.score_id in seen:
                continue
            seen.add(ev.score_id)
            printer.add(ev)
            printed += 1
            if printed == tail.limit:
                break
    printer.flush()
    return printed


def _score_of(rec: ConsumerRecord[bytes, bytes], console: Console) -> score_pb2.ScoreEvent | None:
    try:
        return decode_score_event(rec.value or b"")
    except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError) as exc:
        where = f"{rec.topic}/{rec.partition}/{rec.offset}"
        console.print(f"{where}: not a score event ({exc})", markup=False, highlight=False, style="yellow")
        return None


SCORE_COLUMNS = ("decided at", "tenant", "expectation", "v", "verdict", "time to verdict", "coverage",
                 "observation", "rationale")


def score_cells(ev: score_pb2.ScoreEvent) -> list[str]:
    """A score as text (rich markup, what came from the record escaped), one cell per column."""
    verdict = status_name(ev.status)
    style = {"TRUE": "green", "FALSE": "red"}.get(verdict, "yellow")
    return [
        ev.decided_at.ToDatetime().isoformat(timespec="milliseconds") + "Z",
        escape(ev.tenant),
        escape(ev.expectation_id),
        f"v{ev.version}",
        f"[{style}]{verdict}[/]",
        f"{ev.time_to_verdict.ToTimedelta().total_seconds() * 1000:.1f} ms",
        coverage_text(ev.coverage),
        ", ".join(ev.observation_ids),  # whole: `toolwitness observation <id>` takes it
        escape(ev.rationale[:200]),
    ]


def score_line(ev: score_pb2.ScoreEvent) -> str:
    return "  ".join(score_cells(ev))


def score_table(events: list[score_pb2.ScoreEvent]) -> Table:
    table = Table(show_edge=False)
    for col in SCORE_COLUMNS:
        table.add_column(col, overflow="fold")
    for ev in events:
        table.add_row(*score_cells(ev))
    return table


# -- one observation -------------------------------------------------------------------------------


async def show_observation(
    k: KafkaConfig, observation_id: str, *, timeout_s: float = 15.0, json_out: bool = False, out: Console | None = None
) -> None:
    """Print an observation found on the observations topic (its content checked against its id)."""
    console = out or Console()
    client = ToolwitnessClient.from_kafka_config(k, timeout_s=timeout_s)
    try:
        obs = await client.get_observation(observation_id, timeout=timeout_s)
    except TimeoutError:
        raise TailError(
            f"observation {observation_id} is not on topic {k.topics.observations} (waited {timeout_s:.0f}s)"
        ) from None
    proto = observation_to_proto(obs)
    if json_out:
        console.print(encode(proto, "json").decode(), markup=False, highlight=False, soft_wrap=True)
        return
    console.print(f"observation [bold]{obs.observation_id}[/] (content checked against its id)")
    console.print(f"scope: {json.dumps(json_format.MessageToDict(proto.scope, preserving_proto_field_name=True))}",
                  markup=False, highlight=False)
    console.print(f"coverage: {coverage_text(proto.coverage)}; acquisition: {obs.acquisition.value}; "
                  f"captured at {obs.captured_at.isoformat()}; normalization {obs.normalization_version}")
    table = Table(show_edge=False, title=f"{len(obs.tool_executions)} tool execution(s), in start order")
    for col in ("start", "tool", "status", "call id", "trace / span", "arguments"):
        table.add_column(col, overflow="fold")
    for e in proto.tool_executions:
        state = common_pb2.CaptureState.Name(e.arguments_state).removeprefix("CAPTURE_STATE_").lower()
        table.add_row(
            datetime.fromtimestamp(e.start_time_unix_nano / 1e9, UTC).isoformat(timespec="microseconds"),
            escape(e.name),
            common_pb2.ExecutionStatus.Name(e.status).removeprefix("EXECUTION_STATUS_").lower(),
            escape(e.call_id),
            f"{e.trace_id[:8]}…/{e.span_id}",
            escape(e.arguments_json[:200]) + (f" ({state})" if state not in ("captured", "unspecified") else ""),
        )
    console.print(table)


# -- dead letters ----------------------------------------------------------------------------------


def dead_letter(rec: ConsumerRecord[bytes, bytes]) -> dict[str, Any]:
    """What a dead letter says: its reason headers, the original record's key and value."""
    headers = {k: v.decode("utf-8", "replace") for k, v in rec.headers or ()}
    value = rec.value or b""
    out: dict[str, Any] = {name: headers.get(header, "") for name, header in DLQ_HEADERS.items()}
    out.update(
        dlq=f"{rec.topic}/{rec.partition}/{rec.offset}",
        timestamp_ms=rec.timestamp,
        key=(rec.key or b"").decode("utf-8", "replace"),
        bytes=len(value),
        value_base64=base64.b64encode(value).decode(),
    )
    return out


async def show_dead_letters(
    k: KafkaConfig, tail: Tail, *, reason: str | None = None, json_out: bool = False, out: Console | None = None
) -> int:
    """Print the dead letters of the DLQ topic (``reason``: only those); return how many."""
    printer: _Printer[dict[str, Any]] = _Printer(
        out or Console(), json_out=json_out, follow=tail.follow, as_json=lambda d: json.dumps(d, sort_keys=True),
        as_line=lambda d: "  ".join(_dead_letter_cells(d)), as_table=dead_letter_table,
    )
    printed = 0
    async with contextlib.aclosing(records(k, k.topics.dlq, tail)) as recs:
        async for rec in recs:
            d = dead_letter(rec)
            if reason is not None and d["reason"] != reason:
                continue
            printer.add(d)
            printed += 1
            if printed == tail.limit:
                break
    printer.flush()
    return printed


def _dead_letter_cells(d: dict[str, Any]) -> list[str]:
    size = f"{d['bytes']:,}" + (f" of {int(d['truncated_from']):,}" if d["truncated_from"] else "") + " bytes"
    return [*(escape(x) for x in (d["source"], d["reason"], d["detail"][:200], d["tenant"], d["key"])), size]


def dead_letter_table(letters: list[dict[str, Any]]) -> Table:
    table = Table(show_edge=False)
    for col in ("source record", "reason", "detail", "tenant", "key", "bytes"):
        table.add_column(col, overflow="fold")
    for d in letters:
        table.add_row(*_dead_letter_cells(d))
    return table
