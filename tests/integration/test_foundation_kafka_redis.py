"""The foundation the scorer stands on, against the real broker and server (no mocks).

* an OTLP ExportTraceServiceRequest survives Kafka (keyed by trace id) and a per-trace Redis key
  round-trips;
* the idempotent producer delivers N records exactly once, in order;
* transactions: read_committed sees the committed records and none of the aborted ones, while
  read_uncommitted sees both (which proves the assertion could fail).

Every wait is bounded by ``asyncio.timeout`` and ends on a condition (a record, an offset),
never on a sleep.
"""

from __future__ import annotations

import asyncio
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from typing import Any

import pytest
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.proto.common.v1.common_pb2 import AnyValue, InstrumentationScope, KeyValue
from opentelemetry.proto.resource.v1.resource_pb2 import Resource
from opentelemetry.proto.trace.v1.trace_pb2 import ResourceSpans, ScopeSpans, Span
from redis.asyncio import Redis

pytestmark = pytest.mark.integration

TEST_TIMEOUT_S = 60.0
# The conftest fixture `topic_factory`: await it with a partition count, get a fresh topic name.
TopicFactory = Callable[..., Awaitable[str]]


def _str_attr(key: str, value: str) -> KeyValue:
    return KeyValue(key=key, value=AnyValue(string_value=value))


def otlp_request(trace_id: bytes, span_id: bytes, tool_name: str) -> ExportTraceServiceRequest:
    span = Span(
        trace_id=trace_id,
        span_id=span_id,
        name=f"execute_tool {tool_name}",
        kind=Span.SPAN_KIND_INTERNAL,
        start_time_unix_nano=1_700_000_000_000_000_000,
        end_time_unix_nano=1_700_000_000_250_000_000,
        attributes=[
            _str_attr("gen_ai.operation.name", "execute_tool"),
            _str_attr("gen_ai.tool.name", tool_name),
        ],
    )
    return ExportTraceServiceRequest(
        resource_spans=[
            ResourceSpans(
                resource=Resource(attributes=[_str_attr("service.name", "toolwitness-test-agent")]),
                scope_spans=[ScopeSpans(scope=InstrumentationScope(name="tw.test"), spans=[span])],
            )
        ]
    )


@asynccontextmanager
async def started(client: Any) -> AsyncIterator[Any]:
    """start() an aiokafka producer/consumer and always stop() it."""
    await client.start()
    try:
        yield client
    finally:
        await client.stop()


async def read_to_end(consumer: AIOKafkaConsumer, tp: TopicPartition) -> list[Any]:
    """All records from the consumer's position up to the partition end measured NOW.

    The end is the high watermark for read_uncommitted and the last stable offset for
    read_committed, so the loop stops on an offset, not on a quiet period.
    """
    end = (await consumer.end_offsets([tp]))[tp]
    records: list[Any] = []
    while await consumer.position(tp) < end:
        batch = await consumer.getmany(tp, timeout_ms=1000)
        records.extend(batch.get(tp, []))
    return records


async def test_otlp_request_round_trips_through_kafka_and_redis(
    kafka_bootstrap: str,
    unique_topic: str,
    redis_client: Redis,
    redis_cleanup: set[str],
) -> None:
    trace_id = uuid.uuid4().bytes
    span_id = uuid.uuid4().bytes[:8]
    trace_hex = trace_id.hex()
    assert len(trace_hex) == 32
    sent = otlp_request(trace_id, span_id, tool_name="search_flights")

    async with asyncio.timeout(TEST_TIMEOUT_S):
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")
        async with started(producer):
            meta = await producer.send_and_wait(unique_topic, key=trace_hex.encode(), value=sent.SerializeToString())
        assert meta.topic == unique_topic and meta.offset == 0

        # A group consumer, so the group coordinator (JoinGroup/SyncGroup/OffsetCommit) is
        # exercised too, not just Fetch.
        group = f"tw-test-{uuid.uuid4().hex[:12]}"
        consumer = AIOKafkaConsumer(
            unique_topic,
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            auto_offset_reset="earliest",
            enable_auto_commit=False,
        )
        async with started(consumer):
            record = await consumer.getone()
            await consumer.commit()
            tp = TopicPartition(unique_topic, record.partition)
            assert await consumer.committed(tp) == record.offset + 1

    assert record.key == trace_hex.encode()
    got = ExportTraceServiceRequest.FromString(record.value)
    assert got == sent
    span = got.resource_spans[0].scope_spans[0].spans[0]
    assert span.trace_id == trace_id and span.span_id == span_id
    attrs = {kv.key: kv.value.string_value for kv in span.attributes}
    assert attrs["gen_ai.tool.name"] == "search_flights"

    # The per-trace key layout the scorer uses: hash tag {tenant:<traceid>} keeps all keys of
    # one trace in one cluster slot.
    key = f"tw:{{tenant:{trace_hex}}}:test"
    redis_cleanup.add(key)
    async with asyncio.timeout(TEST_TIMEOUT_S):
        assert await redis_client.set(key, record.value, ex=300)
        stored = await redis_client.get(key)
        assert isinstance(stored, bytes)
        assert ExportTraceServiceRequest.FromString(stored) == sent
        assert 0 < await redis_client.ttl(key) <= 300


async def test_idempotent_producer_delivers_each_record_once_in_order(kafka_bootstrap: str, unique_topic: str) -> None:
    n = 500
    values = [f"record-{i:04d}".encode() for i in range(n)]
    tp = TopicPartition(unique_topic, 0)

    async with asyncio.timeout(TEST_TIMEOUT_S):
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            enable_idempotence=True,  # implies acks=all and a producer id from InitProducerId
            linger_ms=5,
            max_batch_size=4096,  # several batches, each carrying a sequence number
        )
        async with started(producer):
            futures = [await producer.send(unique_topic, value=v, partition=0) for v in values]
            metas = await asyncio.gather(*futures)
        assert [m.offset for m in metas] == list(range(n))

        consumer = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, enable_auto_commit=False)
        async with started(consumer):
            consumer.assign([tp])
            await consumer.seek_to_beginning(tp)
            records = await read_to_end(consumer, tp)
            end = (await consumer.end_offsets([tp]))[tp]

    assert end == n, "the log holds more records than were sent: a duplicate was written"
    assert [r.value for r in records] == values
    assert [r.offset for r in records] == list(range(n))


async def test_transactions_read_committed_hides_aborted_records(kafka_bootstrap: str, unique_topic: str) -> None:
    tp = TopicPartition(unique_topic, 0)
    first = [f"committed-a-{i}".encode() for i in range(3)]
    aborted = [f"aborted-{i}".encode() for i in range(3)]
    last = [f"committed-b-{i}".encode() for i in range(2)]

    async with asyncio.timeout(TEST_TIMEOUT_S):
        producer = AIOKafkaProducer(
            bootstrap_servers=kafka_bootstrap,
            transactional_id=f"tw-test-{uuid.uuid4().hex}",
            enable_idempotence=True,
        )
        async with started(producer):
            async with producer.transaction():
                for v in first:
                    await producer.send_and_wait(unique_topic, value=v, partition=0)

            await producer.begin_transaction()
            for v in aborted:
                await producer.send_and_wait(unique_topic, value=v, partition=0)
            await producer.abort_transaction()

            async with producer.transaction():
                for v in last:
                    await producer.send_and_wait(unique_topic, value=v, partition=0)

        seen: dict[str, list[bytes]] = {}
        for isolation in ("read_committed", "read_uncommitted"):
            consumer = AIOKafkaConsumer(
                bootstrap_servers=kafka_bootstrap,
                isolation_level=isolation,
                enable_auto_commit=False,
            )
            async with started(consumer):
                consumer.assign([tp])
                await consumer.seek_to_beginning(tp)
                seen[isolation] = [r.value for r in await read_to_end(consumer, tp)]

    assert seen["read_committed"] == first + last
    assert not set(aborted) & set(seen["read_committed"])
    # Without the isolation level the aborted records ARE there: the check above can fail.
    assert seen["read_uncommitted"] == first + aborted + last


async def test_consume_transform_produce_commits_offsets_in_the_transaction(
    kafka_bootstrap: str, topic_factory: TopicFactory
) -> None:
    """Exactly-once pipeline shape: input offsets are committed inside the output transaction."""
    source = await topic_factory(1)
    sink = await topic_factory(1)
    group = f"tw-test-{uuid.uuid4().hex[:12]}"
    src_tp, sink_tp = TopicPartition(source, 0), TopicPartition(sink, 0)
    inputs = [f"in-{i}".encode() for i in range(5)]

    async with asyncio.timeout(TEST_TIMEOUT_S):
        async with started(AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, acks="all")) as plain:
            for v in inputs:
                await plain.send_and_wait(source, value=v, partition=0)

        consumer = AIOKafkaConsumer(
            bootstrap_servers=kafka_bootstrap,
            group_id=group,
            enable_auto_commit=False,
            isolation_level="read_committed",
        )
        producer = AIOKafkaProducer(bootstrap_servers=kafka_bootstrap, transactional_id=f"tw-test-{uuid.uuid4().hex}")
        async with started(consumer), started(producer):
            consumer.assign([src_tp])
            await consumer.seek_to_beginning(src_tp)
            records = await read_to_end(consumer, src_tp)
            async with producer.transaction():
                for r in records:
                    await producer.send_and_wait(sink, value=r.value.upper(), partition=0)
                await producer.send_offsets_to_transaction({src_tp: records[-1].offset + 1}, group)
            # EndTxn returns before the coordinator has written the commit marker into
            # __consumer_offsets, and aiokafka's OffsetFetch does not ask for stable offsets
            # (KIP-447 require_stable): until then the group's offset reads as None.
            while True:
                committed = await consumer.committed(src_tp)
                if committed is not None:
                    break
                await asyncio.sleep(0.05)
            assert committed == len(inputs)

        reader = AIOKafkaConsumer(bootstrap_servers=kafka_bootstrap, isolation_level="read_committed")
        async with started(reader):
            reader.assign([sink_tp])
            await reader.seek_to_beginning(sink_tp)
            out = [r.value for r in await read_to_end(reader, sink_tp)]

    assert out == [v.upper() for v in inputs]
