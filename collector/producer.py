"""An idempotent Kafka producer that survives a record the broker refuses.

aiokafka's idempotent producer numbers the records of each partition. When the broker refuses
one (over the topic's ``max.message.bytes``, or any other non-retriable answer), that sequence
number is never written: the next batch to the partition is out of sequence, the producer's
sender dies with ``OutOfOrderSequenceNumber``, and every later send fails with it (on every
partition) until the producer is replaced.

``RenewingProducer`` replaces it, and ``send_each`` sends records independently: one refused
record costs itself only (a record of the same call that failed only because the sequence
broke is sent once more on the new producer). Shared by the OTel exporter
(``collector.otel.KafkaSpanExporter``), the control-plane client (``ToolwitnessClient``) and
the OTLP/gRPC sidecar.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Any

from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient
from aiokafka.admin.config_resource import ConfigResource, ConfigResourceType
from aiokafka.errors import (
    KafkaError,
    MessageSizeTooLargeError,
    OutOfOrderSequenceNumber,
    ProducerFenced,
    RecordListTooLargeError,
)

__all__ = [
    "RecordRefusedError", "RenewingProducer", "describe_topic_configs", "send_each", "start_idempotent",
    "topic_record_limit",
]

log = logging.getLogger(__name__)

#: errors of a producer whose sequence broke (its sender is dead): not the record's fault
_SEQUENCE_BROKEN = (OutOfOrderSequenceNumber, ProducerFenced)

Record = tuple[bytes | None, bytes]  # (key, value)
Headers = Sequence[tuple[str, bytes]] | None


class RecordRefusedError(KafkaError):  # type: ignore[misc]
    """A record Kafka did not take (the broker, or this producer's own ``max_request_size``).

    ``reason`` says why; the original error is ``__cause__``. Sending it again would fail again.
    """

    def __init__(self, message: str, *, topic: str, key: bytes | None, size: int, reason: str) -> None:
        super().__init__(message)
        self.topic = topic
        self.key = key
        self.size = size
        self.reason = reason


def _refusal(
    topic: str, key: bytes | None, value: bytes, exc: BaseException, *, at_send: bool, limit: int | None = None
) -> RecordRefusedError:
    size = len(value) + len(key or b"")
    if isinstance(exc, MessageSizeTooLargeError) and at_send:
        reason = f"{size} bytes is over the record size limit ({limit or 'max_request_size'} bytes), not sent"
    elif isinstance(exc, MessageSizeTooLargeError | RecordListTooLargeError):
        reason = f"{size} bytes is over the topic's max.message.bytes (the broker refused it)"
    else:
        detail = getattr(exc, "description", "") or str(exc)
        reason = f"the broker refused it: {type(exc).__name__}" + (f" ({detail})" if detail else "")
    shown = key.decode("utf-8", "replace") if key is not None else None
    refused = RecordRefusedError(
        f"record {shown!r} to topic {topic!r} refused: {reason}", topic=topic, key=key, size=size, reason=reason
    )
    refused.__cause__ = exc
    return refused


async def send_each(
    producer: Any, topic: str, records: Sequence[Record], headers: Headers = None
) -> tuple[list[BaseException | None], bool]:
    """Send every record independently and wait for each acknowledgment.

    Returns one entry per record (None: written; ``RecordRefusedError``: refused; another error:
    not written because the producer broke) and whether the producer's sequence broke (it must be
    replaced: see ``RenewingProducer``). Any other error of ``send()`` (no metadata, the producer
    closed) is raised. Bound it with a timeout: an idempotent producer retries without end.
    """
    results: list[BaseException | None] = [None] * len(records)
    pending: list[asyncio.Future[Any]] = []
    sent: list[int] = []
    broke = False
    hdrs = list(headers) if headers else None
    try:
        for i, (key, value) in enumerate(records):
            try:
                pending.append(await producer.send(topic, value=value, key=key, headers=hdrs))
                sent.append(i)
            except MessageSizeTooLargeError as exc:  # over our own limit: nothing was sent
                limit = getattr(producer, "_max_request_size", None)
                results[i] = _refusal(topic, key, value, exc, at_send=True, limit=limit)
            except _SEQUENCE_BROKEN as exc:  # the sender died earlier: every send fails so
                results[i] = exc
                broke = True
        acks = await asyncio.gather(*pending, return_exceptions=True)
    except BaseException:
        for fut in pending:
            fut.cancel()
        raise
    for i, ack in zip(sent, acks, strict=True):
        if not isinstance(ack, BaseException):
            continue
        if isinstance(ack, _SEQUENCE_BROKEN):
            results[i] = ack
            broke = True
        elif isinstance(ack, KafkaError):  # the broker's answer for this record's batch
            key, value = records[i]
            results[i] = _refusal(topic, key, value, ack, at_send=False)
            broke = True  # that sequence number is never written: the next batch is out of order
        else:
            results[i] = ack
    return results, broke


async def start_idempotent(timeout_s: float, **kwargs: Any) -> AIOKafkaProducer:
    """An idempotent producer (``acks="all"``) with ``kwargs``, started within ``timeout_s``; one
    that does not start is stopped again (no unclosed producer left behind), and the error raised."""
    producer = AIOKafkaProducer(enable_idempotence=True, acks="all", **kwargs)
    try:
        async with asyncio.timeout(timeout_s):
            await producer.start()
    except BaseException:
        with contextlib.suppress(Exception):
            await producer.stop()
        raise
    return producer


class RenewingProducer:
    """An idempotent producer that is replaced when the broker breaks its sequence.

    ``factory`` returns a started producer. ``start()`` / ``stop()`` like the producer itself;
    ``send_each`` like the module function, renewing the producer when its sequence broke and
    sending once more, on the new one, the records that failed only because of that. A broken
    producer stays until a new one has started: a failed renewal is tried again by the next call.
    """

    def __init__(
        self,
        factory: Callable[[], Awaitable[Any]],
        *,
        component: str,
        timeout_s: float,
        logger: logging.Logger = log,
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        self._factory = factory
        self._component = component
        self._timeout_s = timeout_s
        self._log = logger
        self._extra = dict(extra or {})
        self._producer: Any = None
        self._lock: asyncio.Lock | None = None  # created on the loop that uses it
        self._stale = False  # the sequence broke and the renewal failed: renew before the next send
        self.renewals = 0

    def _get_lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    @property
    def started(self) -> bool:
        return self._producer is not None

    @property
    def current(self) -> Any:
        """The producer in use (None before ``start`` and after ``stop``)."""
        return self._producer

    async def start(self) -> None:
        async with self._get_lock():
            if self._producer is None:
                self._producer = await self._factory()

    async def get(self) -> Any:
        """The producer to send with: started on first use, renewed first if a renewal failed."""
        if self._producer is None:
            await self.start()
        elif self._stale:
            await self.renew(self._producer)
        return self._producer

    async def renew(self, broken: Any) -> None:
        """Replace ``broken`` (a no-op if another call replaced it already)."""
        async with self._get_lock():
            if self._producer is not broken or broken is None:
                return
            self._log.warning(
                "%s: renewing the Kafka producer (its sequence broke)", self._component, extra=self._extra
            )
            try:
                fresh = await self._factory()
            except Exception as exc:
                self._stale = True
                self._log.warning(
                    "%s: renewing the Kafka producer failed, next call retries: %r", self._component, exc,
                    extra=self._extra,
                )
                return
            self._producer, self._stale = fresh, False
            self.renewals += 1
        with contextlib.suppress(Exception):
            async with asyncio.timeout(self._timeout_s):
                await broken.stop()

    async def send_each(
        self, topic: str, records: Sequence[Record], headers: Headers = None
    ) -> list[BaseException | None]:
        """``send_each`` on the current producer, renewing it when its sequence broke."""
        producer = await self.get()
        results, broke = await send_each(producer, topic, records, headers)
        if not broke:
            return results
        await self.renew(producer)
        again = [i for i, r in enumerate(results) if isinstance(r, _SEQUENCE_BROKEN)]
        fresh = self._producer
        if again and fresh is not None and fresh is not producer:
            retried, broke = await send_each(fresh, topic, [records[i] for i in again], headers)
            for i, r in zip(again, retried, strict=True):
                results[i] = r
            if broke:
                await self.renew(fresh)
        return results

    async def flush(self) -> None:
        if self._producer is not None:
            await self._producer.flush()

    async def stop(self) -> None:
        """Stop the producer. Idempotent."""
        producer, self._producer = self._producer, None
        if producer is not None:
            await producer.stop()


async def describe_topic_configs(admin: Any, topics: Sequence[str]) -> dict[str, dict[str, str]]:
    """The configs of ``topics`` (name -> value, broker defaults included) in one DescribeConfigs
    request; a topic that cannot be described (missing, not permitted) is left out."""
    resources = [ConfigResource(ConfigResourceType.TOPIC, t) for t in topics]
    out: dict[str, dict[str, str]] = {}
    for response in await admin.describe_configs(resources):
        for resource in response.to_object()["resources"]:
            if resource.get("error_code", 0) != 0:
                continue
            out[str(resource["resource_name"])] = {
                str(e["config_names"]): str(e["config_value"]) for e in resource["config_entries"]
            }
    return out


async def topic_record_limit(
    bootstrap_servers: str, topic: str, *, kafka_kwargs: Mapping[str, Any], timeout_s: float
) -> int | None:
    """The topic's ``max.message.bytes`` (None if it cannot be read: the topic does not exist
    yet, or the principal may not describe it). A producer limited to it refuses a larger
    record itself instead of sending it to a broker that would."""
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap_servers, **kafka_kwargs)
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            resource = ConfigResource(ConfigResourceType.TOPIC, topic)
            (response,) = await admin.describe_configs([resource])
        entries = response.to_object()["resources"][0]["config_entries"]
        value = next((e["config_value"] for e in entries if e["config_names"] == "max.message.bytes"), None)
        return int(value) if value is not None else None
    except Exception as exc:
        log.debug("could not read the configs of %s: %r", topic, exc)
        return None
    finally:
        with contextlib.suppress(Exception):
            await admin.close()
