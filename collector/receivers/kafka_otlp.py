"""Receiver ``receiver/kafka_otlp``: the consumer-group member that reads span batches and control.

One consumer subscribes to the spans topic (OTLP records as the Collector's kafkaexporter
writes them: otlp_proto or otlp_json, keyed by trace id or not) and the control topic
(expectations, completion markers, cancellations). Offsets are committed manually, only
by the checkpoint after a batch has gone through every step. A rebalance waits for the
in-flight batch (under a deadline) before partitions move.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping, Sequence

from aiokafka import AIOKafkaConsumer, ConsumerRebalanceListener, ConsumerRecord, TopicPartition
from aiokafka.errors import CommitFailedError, IllegalStateError

from collector.config import KafkaConfig
from collector.exporters.kafka import kafka_security_kwargs
from collector.telemetry.metrics import COMMIT_FAILURES, CONSUMER_LAG

log = logging.getLogger("toolwitness.receiver.kafka_otlp")

REBALANCE_DEADLINE_S = 20.0
#: the check for records lost to retention after a rebalance (``skipped_records``) waits at most this long
SKIP_CHECK_TIMEOUT_S = 5.0

Batch = Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]]


class ReceiverStopError(Exception):
    """The consumer did not stop cleanly (e.g. the broker was unreachable): the group was perhaps
    not left (the broker drops the member after its session timeout)."""


class _Rebalance(ConsumerRebalanceListener):  # type: ignore[misc]
    def __init__(self, receiver: KafkaOTLPReceiver) -> None:
        self.receiver = receiver

    async def on_partitions_revoked(self, revoked: list[TopicPartition]) -> None:
        for tp in revoked:  # another instance reports their lag now: no stale series here
            with contextlib.suppress(KeyError):
                CONSUMER_LAG.remove(self.receiver.name, tp.topic, str(tp.partition))
        # Let the in-flight batch finish and commit before the partitions move.
        try:
            async with asyncio.timeout(REBALANCE_DEADLINE_S), self.receiver.batch_lock:
                pass
        except TimeoutError:
            log.warning("%s: in-flight batch still running at the rebalance deadline", self.receiver.name)

    async def on_partitions_assigned(self, assigned: list[TopicPartition]) -> None:
        spans = self.receiver.cfg.topics.spans
        self.receiver.on_assigned({tp.partition for tp in assigned if tp.topic == spans})
        # checked by the poll loop before the next batch is processed (``skipped_records``)
        self.receiver.unchecked.update(assigned)


class KafkaOTLPReceiver:
    name = "receiver/kafka_otlp"

    def __init__(
        self,
        cfg: KafkaConfig,
        *,
        instance: str,
        batch_lock: asyncio.Lock,
        on_assigned: Callable[[set[int]], None] = lambda _: None,
    ) -> None:
        self.cfg = cfg
        self.instance = instance
        self.batch_lock = batch_lock
        self.on_assigned = on_assigned
        self.consumer: AIOKafkaConsumer | None = None
        #: partitions assigned since ``skipped_records`` last looked at them
        self.unchecked: set[TopicPartition] = set()

    async def start(self) -> None:
        if self.consumer is not None:
            return
        k = self.cfg
        consumer = AIOKafkaConsumer(
            bootstrap_servers=k.bootstrap_servers,
            group_id=k.group_id,
            client_id=f"{k.client_id}-{self.instance}",
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            isolation_level="read_committed",
            max_poll_records=k.max_poll_records,
            fetch_max_wait_ms=k.fetch_max_wait_ms,
            fetch_max_bytes=max(52428800, k.max_record_bytes * 2),
            max_partition_fetch_bytes=max(1048576, k.max_record_bytes + 65536),
            request_timeout_ms=k.request_timeout_ms,
            session_timeout_ms=k.session_timeout_ms,
            heartbeat_interval_ms=max(1000, k.session_timeout_ms // 3),
            metadata_max_age_ms=k.metadata_max_age_ms,
            **kafka_security_kwargs(k),
        )
        consumer.subscribe([k.topics.spans, k.topics.control], listener=_Rebalance(self))
        await asyncio.wait_for(consumer.start(), timeout=60)
        self.consumer = consumer

    async def shutdown(self) -> None:
        """Leave the group (idempotent). Raises ``ReceiverStopError`` when the consumer could not be
        closed cleanly (its connections are closed anyway)."""
        consumer, self.consumer = self.consumer, None
        if consumer is None:
            return
        try:
            await consumer.stop()
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if task is not None and task.cancelling():
                raise  # this task is being cancelled: honour it
            # Not a cancellation of ours: aiokafka 0.14's stop() cancels the fetcher's pending fetch
            # tasks and awaits them, and one asleep in its retry backoff (the broker is gone) re-raises
            # the CancelledError, so stop() ends before it closes its client (the connections).
            await self._close_client(consumer)
            raise ReceiverStopError("the consumer's fetcher did not stop cleanly (broker unreachable?)") from None
        except Exception as exc:
            await self._close_client(consumer)
            raise ReceiverStopError(f"the consumer did not stop cleanly: {type(exc).__name__}: {exc}") from exc

    @staticmethod
    async def _close_client(consumer: AIOKafkaConsumer) -> None:
        """Close the connections of a consumer whose ``stop()`` failed half-way (aiokafka has no
        public call for that; ``stop()`` again returns at once, being marked closed already)."""
        client = getattr(consumer, "_client", None)
        close = getattr(client, "close", None)
        if close is not None:
            with contextlib.suppress(Exception):
                await close()

    def _require(self) -> AIOKafkaConsumer:
        if self.consumer is None:
            raise RuntimeError(f"{self.name} is not started")
        return self.consumer

    async def poll(self) -> Batch:
        batch: Batch = await self._require().getmany(
            timeout_ms=self.cfg.poll_timeout_ms, max_records=self.cfg.max_poll_records
        )
        return batch

    async def probe(self) -> None:
        """One request to the brokers that lead this consumer's partitions (their end offsets; the
        spans topic's partition 0 when none is assigned): raises when they do not answer. Cheap (a
        ListOffsets round trip) and, unlike ``getmany`` (which returns an empty batch when the
        broker is gone), says whether Kafka is reachable. The caller bounds it in time."""
        consumer = self._require()
        partitions = list(consumer.assignment()) or [TopicPartition(self.cfg.topics.spans, 0)]
        await consumer.end_offsets(partitions)

    async def skipped_records(self) -> list[tuple[TopicPartition, int, int]]:
        """(partition, committed offset, first offset in the log) of each partition assigned since
        the last call whose committed offset is no longer in the log: the records in between were
        deleted (retention) before this group read them, and the consumer, reset to the earliest
        offset, skips them without a word. Empty when every committed offset is still readable (or
        the group has none: a new group reads from the start anyway). One ListOffsets request and
        one OffsetFetch per partition, only after a rebalance; a partition that cannot be checked
        now (it moved again, the broker did not answer) is left unchecked, not retried."""
        tps, self.unchecked = sorted(self.unchecked), set()
        consumer = self._require()
        tps = [tp for tp in tps if tp in consumer.assignment()]
        if not tps:
            return []
        try:
            async with asyncio.timeout(SKIP_CHECK_TIMEOUT_S):  # in the poll loop: bounded
                first = await consumer.beginning_offsets(tps)
                committed = {tp: await consumer.committed(tp) for tp in tps}
        except Exception as exc:  # only a check: never a reason to stop consuming
            log.warning("%s: could not check %d assigned partition(s) for records lost to retention: %r",
                        self.name, len(tps), exc)
            return []
        return [(tp, c, first[tp]) for tp, c in committed.items() if c is not None and tp in first and c < first[tp]]

    def rewind(self, batch: Batch) -> None:
        """Seek every partition of a failed batch back to its first record (nothing was committed)."""
        consumer = self._require()
        for tp, recs in batch.items():
            consumer.seek(tp, recs[0].offset)

    async def commit(self, offsets: Mapping[TopicPartition, int]) -> bool:
        """Step 5 of the checkpoint. False when a rebalance took the partitions meanwhile."""
        try:
            await self._require().commit(dict(offsets))
        except (CommitFailedError, IllegalStateError) as exc:
            # The new owner replays the batch; every step is idempotent (identical re-sends at most).
            COMMIT_FAILURES.labels(self.name).inc()
            log.warning("%s: offsets not committed (%s); the new owner replays the batch", self.name, exc)
            return False
        return True

    async def span_partitions_caught_up(self, *, fresh: bool = False) -> dict[int, bool]:
        """For each assigned span partition: whether it is caught up. Updates the lag of every
        assigned partition (spans and control) on the way: against the high watermarks of the
        last fetches, or (``fresh``) the end offsets the broker reports now (one request)."""
        consumer = self._require()
        spans = self.cfg.topics.spans
        caught: dict[int, bool] = {}
        assigned = list(consumer.assignment())
        ends: dict[TopicPartition, int] = await consumer.end_offsets(assigned) if fresh and assigned else {}
        for tp in assigned:
            hw = ends.get(tp, consumer.highwater(tp))
            try:
                pos = await consumer.position(tp)
            except Exception:  # the partition moved during a rebalance
                continue
            CONSUMER_LAG.labels(self.name, tp.topic, str(tp.partition)).set(max(0, (hw or 0) - pos))
            if tp.topic == spans:
                caught[tp.partition] = hw is not None and pos >= hw
        return caught

    async def replay_control(self) -> int:
        """Seek the assigned control partitions to the beginning (data-loss recovery)."""
        consumer = self._require()
        control = [tp for tp in consumer.assignment() if tp.topic == self.cfg.topics.control]
        if control:
            await consumer.seek_to_beginning(*control)
        return len(control)
