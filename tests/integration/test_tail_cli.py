"""``toolwitness scores | observation | dlq``: what the service wrote, read back from Kafka and decoded.

The service scores a group of traces and dead-letters a record that is not OTLP; then, with the
service stopped (the commands read Kafka alone), each command must print exactly what is on its
topic: every score once (a re-send only with ``--resends``), the observation a score cites with
its tool executions, and the dead letter with its reason and the original bytes.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import os
import sys
import time
from pathlib import Path

import pytest
from aiokafka import AIOKafkaProducer
from rich.console import Console

from collector.config import ServiceConfig
from collector.tail import Tail, TailError, show_dead_letters, show_observation, show_scores
from collector.wire.convert import decode_score_event
from tests.integration.harness import (
    REPO_ROOT,
    TraceGroup,
    make_config,
    raw_producer,
    read_until,
    running_service,
    write_config,
)

pytestmark = pytest.mark.integration

GARBAGE = b"\x00 not an OTLP record \xff"
MARKUP_KEY = "[/]not markup[bold]"


def console() -> Console:
    return Console(file=io.StringIO(), width=400, color_system=None)


def text(c: Console) -> str:
    out = c.file.getvalue()  # type: ignore[attr-defined]
    assert isinstance(out, str)
    return out


async def send_group(producer: AIOKafkaProducer, cfg: ServiceConfig, group: TraceGroup) -> None:
    t = cfg.kafka.topics
    for topic, items in ((t.control, group.expectations()), (t.spans, group.spans()), (t.control, group.markers())):
        await asyncio.gather(*[await producer.send(topic, key=k.encode(), value=v) for k, v in items])


@pytest.fixture(scope="module")
async def written(kafka_bootstrap: str, redis_url: str) -> tuple[ServiceConfig, TraceGroup]:
    cfg = make_config(kafka_bootstrap, redis_url)
    group = TraceGroup.build("tail", 2, int(time.time() * 1000))
    async with running_service(cfg) as _, raw_producer(cfg) as producer:
        await send_group(producer, cfg, group)
        await producer.send_and_wait(cfg.kafka.topics.spans, key=b"garbage", value=GARBAGE)
        # text from a bad record is printed as text, never as rich markup ("[/]" alone would raise)
        await producer.send_and_wait(cfg.kafka.topics.spans, key=MARKUP_KEY.encode(), value=GARBAGE)
        await read_until(kafka_bootstrap, cfg.kafka.topics.scores, lambda rs: len(rs) >= 4, timeout=60)
        await read_until(kafka_bootstrap, cfg.kafka.topics.dlq, lambda rs: len(rs) >= 2, timeout=60)
    return cfg, group


async def test_scores_prints_every_score_once_and_filters(written: tuple[ServiceConfig, TraceGroup]) -> None:
    cfg, group = written
    out = console()
    assert await show_scores(cfg.kafka, Tail(), json_out=True, out=out) == 4
    events = [json.loads(line) for line in text(out).splitlines()]
    assert {e["expectation_id"]: e["status"] for e in events} == {
        e: f"SCORE_STATUS_{v.upper()}" for e, v in group.verdicts().items()
    }
    # a re-send after a crash is byte-identical: shown once, unless asked for
    raw = await read_until(cfg.kafka.bootstrap_servers, cfg.kafka.topics.scores, lambda rs: len(rs) >= 4)
    async with raw_producer(cfg) as producer:
        first = raw[0]
        await producer.send_and_wait(cfg.kafka.topics.scores, key=first.key, value=first.value)
    assert await show_scores(cfg.kafka, Tail(), json_out=True, out=console()) == 4
    assert await show_scores(cfg.kafka, Tail(), json_out=True, resends=True, out=console()) == 5

    one = console()
    assert await show_scores(cfg.kafka, Tail(), expectations={"tail-true-1"}, out=one) == 1
    table = text(one)
    assert "tail-true-1" in table and "TRUE" in table and "tail-false" not in table
    assert await show_scores(cfg.kafka, Tail(), tenant="someone-else", out=console()) == 0
    # the limit counts what is printed, after filters and de-duplication (the re-send above is skipped)
    for limit in (1, 2, 3, 4):
        assert await show_scores(cfg.kafka, Tail(limit=limit), out=console()) == limit
    assert await show_scores(cfg.kafka, Tail(limit=5), out=console()) == 4
    assert await show_scores(cfg.kafka, Tail(limit=1), expectations={"tail-false-0", "tail-false-1"},
                             out=console()) == 1
    assert await show_scores(cfg.kafka, Tail(from_beginning=False), out=console()) == 0


async def test_observation_prints_the_evidence_a_score_cites(written: tuple[ServiceConfig, TraceGroup]) -> None:
    cfg, _ = written
    records = await read_until(cfg.kafka.bootstrap_servers, cfg.kafka.topics.scores, lambda rs: len(rs) >= 4)
    event = next(ev for ev in map(decode_score_event, (r.value or b"" for r in records))
                 if ev.expectation_id == "tail-true-0")
    (oid,) = event.observation_ids
    out = console()
    await show_observation(cfg.kafka, oid, json_out=True, out=out)
    obs = json.loads(text(out))
    assert obs["observation_id"] == oid
    assert [e["name"] for e in obs["tool_executions"]] == ["search"]
    assert obs["scope"]["traces"]["trace_ids"] == list(event.scope.traces.trace_ids)
    table = console()
    await show_observation(cfg.kafka, oid, out=table)
    assert oid in text(table) and "search" in text(table) and "content checked" in text(table)
    with pytest.raises(TailError, match="is not on topic"):
        await show_observation(cfg.kafka, "0" * 64, timeout_s=1.0, out=console())


async def test_dlq_prints_the_reason_and_the_original_record(written: tuple[ServiceConfig, TraceGroup]) -> None:
    cfg, _ = written
    out = console()
    assert await show_dead_letters(cfg.kafka, Tail(), json_out=True, out=out) == 2
    letters = {d["key"]: d for d in (json.loads(line) for line in text(out).splitlines())}
    assert set(letters) == {"garbage", MARKUP_KEY}
    letter = letters["garbage"]
    assert letter["reason"] == "undecodable_protobuf"
    assert letter["source"].startswith(f"{cfg.kafka.topics.spans}/")
    assert letter["key"] == "garbage"
    assert base64.b64decode(letter["value_base64"]) == GARBAGE
    assert await show_dead_letters(cfg.kafka, Tail(), reason="record_too_large", out=console()) == 0
    for tail in (Tail(), Tail(follow=True, limit=2)):
        table = console()
        assert await show_dead_letters(cfg.kafka, tail, out=table) == 2
        assert MARKUP_KEY in text(table)


async def test_following_prints_a_line_per_score(written: tuple[ServiceConfig, TraceGroup]) -> None:
    cfg, group = written
    out = console()
    assert await show_scores(cfg.kafka, Tail(follow=True, limit=4), out=out) == 4
    lines = text(out).splitlines()
    assert len(lines) == 4 and not any("┃" in line for line in lines)  # no table header per row
    assert {line.split()[2] for line in lines} == set(group.verdicts())  # at, tenant, expectation, ...


async def test_the_commands_run_from_the_shell(written: tuple[ServiceConfig, TraceGroup], tmp_path: Path) -> None:
    cfg, group = written
    config = write_config(cfg, tmp_path / "config.yaml")

    async def cli(*args: str) -> tuple[int, str, str]:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-m", "collector.cli", *args, "--config", str(config),
            stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE, cwd=REPO_ROOT,
            env={**os.environ, "COLUMNS": "250"},  # a table as wide as a terminal's, not as a pipe's 80
        )
        async with asyncio.timeout(60):
            out, err = await proc.communicate()
        return proc.returncode or 0, out.decode(), err.decode()

    rc, out, err = await cli("scores", "--json", "-e", "tail-false-0")
    assert rc == 0, err
    (event,) = [json.loads(line) for line in out.splitlines()]
    assert event["status"] == "SCORE_STATUS_FALSE"
    rc, out, err = await cli("dlq")
    assert rc == 0 and "undecodable_protobuf" in out, err
    missing = cfg.model_copy(update={"kafka": cfg.kafka.model_copy(update={
        "topics": cfg.kafka.topics.model_copy(update={"scores": "no-such-topic-here"})})})
    write_config(missing, config)
    rc, out, err = await cli("scores")
    assert rc == 1 and "topic no-such-topic-here does not exist" in err, (rc, out, err)
    assert group.verdicts()  # the group the scores came from
