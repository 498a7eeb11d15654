"""The control-plane client: register expectations, declare completion, await scores.

    async with ToolwitnessClient(bootstrap_servers="127.0.0.1:19092", tenant="default") as tw:
        eid = await tw.expect(TraceScorable(trace_ids=(trace_id,)), conditions=[ToolsCalled(...)])
        await tw.mark_complete(trace_id, span_count=counter.pop(trace_id))
        event = await tw.wait_for(eid, timeout=30)

Everything goes through Kafka (the wire contract in ``proto/toolwitness/v1``):
expectations, completion markers and cancels are ``ControlMessage`` records on the control
topic; scores are read back from the scores topic by a background consumer that is
positioned at the end of every partition *before* ``start()`` returns, so a score for an
expectation sent after ``start()`` can never be missed. Partitions added to the scores topic
later are noticed within ``metadata_max_age_ms`` and read from their start, and the others
resume where the client stopped reading (not where a re-assignment would reset them).
Score events are deduplicated by ``score_id`` (the service may re-send identical events after
a crash); only the client's own tenant's are kept and yielded unless ``all_tenants``, and at
most ``max_retained`` of them (the oldest arrivals are forgotten first).

Every network await is bounded by a timeout.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
import os
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncGenerator, AsyncIterator, Mapping, Sequence
from datetime import UTC, datetime, timedelta
from types import TracebackType
from typing import Any, Literal, Self

from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.errors import KafkaError
from aiokafka.helpers import create_ssl_context
from google.protobuf import json_format
from google.protobuf.message import DecodeError

from collector.config import KafkaConfig, KafkaSecurityConfig, TopicsConfig
from collector.exporters.partition import KeyPartitioner
from collector.producer import RecordRefusedError, RenewingProducer, describe_topic_configs, start_idempotent
from collector.wire.convert import (
    TENANT,
    ControlDecodeError,
    check_labels,
    decode_observation,
    decode_score_event,
    expectation_from_proto,
    observation_from_proto,
    scope_to_proto,
    score_id_for,
)
from collector.wire.gen import control_pb2, score_pb2
from scoring.models import (
    ArgumentMatcher,
    MessageScorable,
    Observation,
    PayloadPropagated,
    ScoringExpectation,
    SessionScorable,
    ToolCallRequirement,
    ToolsCalled,
    ToolSequence,
    TraceScorable,
)
from scoring.models.conditions import Condition
from scoring.models.evidence import canonical_json
from scoring.models.scorables import check_trace_id
from scoring.score.base import ScorerConfigurationError

__all__ = [
    "DEFAULT_DEADLINE",
    "ExpectationCancelledError",
    "ToolwitnessClient",
    "TopicSetupError",
    "build_expectation",
    "condition_to_proto",
    "ensure_topics",
    "kafka_security_kwargs",
    "matcher_to_proto",
]

log = logging.getLogger(__name__)

Scope = TraceScorable | SessionScorable | MessageScorable
#: The service's default ``completion.default_deadline_seconds``. The client does not send it: an
#: expectation without a ``deadline`` gets the configured default of the service that scores it.
DEFAULT_DEADLINE = timedelta(minutes=5)
DEFAULT_PARTITIONS = 4
#: observations a client keeps after reading them (``get_observation``)
OBSERVATION_CACHE = 10_000
#: an observation's search starts at records written this long before the score that names it
#: was decided (the deciding instance's clock against the broker's timestamps)
OBSERVATION_SEARCH_SLACK_MS = 60_000
#: Kafka error code for a topic the broker does not know.
_UNKNOWN_TOPIC = 3
#: Kafka error code for "topic already exists" (another client won the creation race).
_TOPIC_EXISTS = 36
_LEADER_NOT_AVAILABLE = 5


class TopicSetupError(RuntimeError):
    """The toolwitness topics could not be created or did not become ready."""


# --------------------------------------------------------------------------------------------------
# Kafka connection settings
# --------------------------------------------------------------------------------------------------


class _RedactSaslAuthentication(logging.Filter):
    """aiokafka logs every request it sends at DEBUG (``aiokafka.conn``), SaslAuthenticateRequest
    included, whose repr carries the SASL/PLAIN password in clear (SCRAM: the client proof). Such
    arguments are replaced before any handler formats the record."""

    REDACTED = "<SaslAuthenticateRequest: redacted by toolwitness>"

    def filter(self, record: logging.LogRecord) -> bool:
        args = record.args
        if isinstance(args, tuple) and any(type(a).__name__.startswith("SaslAuthenticate") for a in args):
            record.args = tuple(
                self.REDACTED if type(a).__name__.startswith("SaslAuthenticate") else a for a in args
            )
        return True


def _redact_sasl_in_aiokafka_logs() -> None:
    conn_log = logging.getLogger("aiokafka.conn")
    if not any(isinstance(f, _RedactSaslAuthentication) for f in conn_log.filters):
        conn_log.addFilter(_RedactSaslAuthentication())


def kafka_security_kwargs(
    security: KafkaSecurityConfig | None, env: Mapping[str, str] | None = None
) -> dict[str, Any]:
    """aiokafka keyword arguments (producer, consumer, admin) for a security config.

    SASL credentials are read from the environment variables the config names; a missing
    one raises ``ValueError`` naming the variable (never its value).
    """
    if security is None or security.protocol == "PLAINTEXT":
        return {}
    environ = os.environ if env is None else env
    kwargs: dict[str, Any] = {"security_protocol": security.protocol}
    if security.protocol in ("SSL", "SASL_SSL"):
        kwargs["ssl_context"] = create_ssl_context(
            cafile=security.ssl_cafile or None,
            certfile=security.ssl_certfile or None,
            keyfile=security.ssl_keyfile or None,
        )
    if security.protocol in ("SASL_PLAINTEXT", "SASL_SSL"):
        if not security.sasl_mechanism:
            raise ValueError(f"kafka.security.sasl_mechanism must be set for protocol {security.protocol}")
        missing = [
            name for name in (security.sasl_username_env, security.sasl_password_env) if not environ.get(name)
        ]
        if missing:
            raise ValueError(f"SASL credentials missing: set the environment variable(s) {', '.join(missing)}")
        _redact_sasl_in_aiokafka_logs()
        kwargs["sasl_mechanism"] = security.sasl_mechanism
        kwargs["sasl_plain_username"] = environ[security.sasl_username_env]
        kwargs["sasl_plain_password"] = environ[security.sasl_password_env]
    return kwargs


def _response_errors(response: Any) -> list[tuple[str, int, str | None]]:
    """(topic, error_code, message) rows of a CreateTopics response, any version."""
    obj = response.to_object()
    rows = obj.get("topic_errors") or obj.get("topics") or []
    return [
        (str(row.get("topic") or row.get("name")), int(row.get("error_code", 0)), row.get("error_message"))
        for row in rows
    ]


def _ready(row: Mapping[str, Any]) -> bool:
    parts = row.get("partitions") or []
    return row.get("error_code") == 0 and bool(parts) and all(p.get("leader", -1) >= 0 for p in parts)


async def _warn_about_topic_configs(
    admin: Any, topics: TopicsConfig, rows: Sequence[Mapping[str, Any]], keep_ms: int | None = None
) -> None:
    """Warn about existing topics set up against their use (``rows``: their metadata): an observations
    topic that deletes (a score's evidence then vanishes), a compacted spans topic (spans lost), a
    topic with one replica in a cluster of several brokers, and control or scores topics that delete
    records sooner than ``keep_ms`` (how long the service relies on them). Only a check: never fails
    the set-up."""
    try:
        named = [topics.spans, topics.observations, topics.control, topics.scores]
        configs = await describe_topic_configs(admin, named)
        brokers = len((await admin.describe_cluster()).get("brokers") or [])
    except Exception as exc:
        log.debug("could not read the configs of the toolwitness topics: %r", exc)
        return
    obs = configs.get(topics.observations)
    if obs is not None:
        policy, retention = obs.get("cleanup.policy", ""), obs.get("retention.ms", "")
        if "compact" not in policy:
            log.warning(
                "observations topic %s has cleanup.policy=%s, not compact: observations will expire with retention",
                topics.observations, policy,
            )
        elif "delete" in policy and retention not in ("", "-1"):
            log.warning(
                "observations topic %s has cleanup.policy=%s: observations older than its retention.ms (%s) are "
                "deleted though the scores citing them remain; use cleanup.policy=compact",
                topics.observations, policy, retention,
            )
    if "compact" in configs.get(topics.spans, {}).get("cleanup.policy", ""):
        log.warning(
            "spans topic %s is compacted (cleanup.policy=%s): a record keyed by trace id replaces the earlier "
            "records of its trace, so spans not yet consumed (a backlog, a replay) are lost, and the broker refuses "
            "records without a key; use cleanup.policy=delete",
            topics.spans, configs[topics.spans]["cleanup.policy"],
        )
    if keep_ms is not None:
        # What a Redis data loss is recovered from (pipeline/recovery.py): the expectations, from
        # the control topic, and what was already published, from the scores topic.
        for name, role in ((topics.control, "re-registers expectations"), (topics.scores, "restores published scores")):
            conf = configs.get(name, {})
            retention = conf.get("retention.ms", "")
            if "delete" in conf.get("cleanup.policy", "delete") and retention.lstrip("-").isdigit() and (
                0 <= int(retention) < keep_ms
            ):
                log.warning(
                    "topic %s deletes records after retention.ms=%s, sooner than redis.state_ttl_seconds (%d s): "
                    "after a Redis data loss the service %s from it, and what it has deleted is not recovered "
                    "(a published score may be judged and published again, with another verdict); set its "
                    "retention.ms to %d or more",
                    name, retention, keep_ms // 1000, role, keep_ms,
                )
    if brokers > 1:
        for row in rows:
            parts = row.get("partitions") or []
            if parts and min(len(p.get("replicas") or ()) for p in parts) == 1:
                log.warning(
                    "topic %s has a partition with one replica in a cluster of %d brokers: losing that broker "
                    "stops the service (or loses the records); recreate it with replication 3",
                    row.get("topic"), brokers,
                )


def _check_timeout(timeout_s: float) -> None:
    if not 0 < timeout_s < math.inf:
        raise ValueError(f"timeout_s must be a positive, finite number of seconds, got {timeout_s!r}")


async def topic_partitions(consumer: AIOKafkaConsumer, topic: str) -> set[int]:
    """The partition ids of ``topic`` from fresh metadata (empty if unknown). A consumer that
    subscribes to nothing has no metadata of its own: ``consumer.topics()`` fetches it without
    keeping it, so ``partitions_for_topic`` stays None."""
    cluster = await consumer._client.fetch_all_metadata()
    return set(cluster.partitions_for_topic(topic) or ())


async def ensure_topics(
    bootstrap_servers: str,
    topics: TopicsConfig | None = None,
    *,
    security: KafkaSecurityConfig | None = None,
    partitions: int = DEFAULT_PARTITIONS,
    replication_factor: int | None = None,
    timeout_s: float = 30.0,
    client_id: str = "toolwitness-admin",
    keep_ms: int | None = None,
) -> list[str]:
    """Create the toolwitness topics that do not exist yet; return the names created.

    spans, control, scores and dlq are plain topics; observations is compacted
    (``cleanup.policy=compact``, keyed by content hash). Existing topics are left as they
    are. ``replication_factor`` defaults to min(3, brokers). Returns once every topic has a
    leader for each partition, within ``timeout_s``; raises ``TopicSetupError`` (or
    ``TimeoutError``, naming the servers) otherwise. ``keep_ms``: how long the caller relies on
    the control and scores topics keeping their records (the service: its state's TTL); a
    shorter retention is warned about.
    """
    _check_timeout(timeout_s)
    topics = topics or TopicsConfig()
    wanted: dict[str, dict[str, str]] = {
        topics.spans: {},
        topics.control: {},
        topics.scores: {},
        topics.dlq: {},
        topics.observations: {"cleanup.policy": "compact"},
    }
    admin = AIOKafkaAdminClient(
        bootstrap_servers=bootstrap_servers,
        client_id=client_id,
        request_timeout_ms=max(1000, int(timeout_s * 1000)),
        **kafka_security_kwargs(security),
    )
    created: list[str] = []
    try:
        async with asyncio.timeout(timeout_s):
            await admin.start()
            # list_topics, not describe_topics: a Metadata request naming a missing topic makes a
            # broker with auto.create.topics.enable create it with default configs (observations
            # would not be compacted).
            existing = set(await admin.list_topics())
            missing = [name for name in wanted if name not in existing]
            if missing:
                rf = replication_factor
                if rf is None:
                    brokers = (await admin.describe_cluster()).get("brokers") or []
                    rf = max(1, min(3, len(brokers)))
                response = await admin.create_topics(
                    [
                        NewTopic(
                            name=name,
                            num_partitions=partitions,
                            replication_factor=rf,
                            topic_configs=wanted[name],
                        )
                        for name in missing
                    ],
                    timeout_ms=max(1000, int(timeout_s * 1000)),
                )
                for name, code, message in _response_errors(response):
                    if code == 0:
                        created.append(name)
                        log.info("created topic %s (partitions=%d, replication=%d)", name, partitions, rf)
                    elif code != _TOPIC_EXISTS:
                        raise TopicSetupError(f"creating topic {name} failed: error {code} {message or ''}".strip())
            # Until every partition of every topic has a leader (creation is asynchronous).
            while True:
                rows = await admin.describe_topics(list(wanted))
                if len(rows) >= len(wanted) and all(_ready(r) for r in rows):
                    break
                fatal = [r for r in rows if r.get("error_code") not in (0, _UNKNOWN_TOPIC, _LEADER_NOT_AVAILABLE)]
                if fatal:
                    raise TopicSetupError(
                        "topics not usable: " + ", ".join(f"{r['topic']} (error {r['error_code']})" for r in fatal)
                    )
                await asyncio.sleep(0.05)
            await _warn_about_topic_configs(admin, topics, rows, keep_ms)
    except TimeoutError:
        raise TimeoutError(
            f"creating the toolwitness topics at {bootstrap_servers}: not ready within timeout_s={timeout_s}s "
            "(is a Kafka broker answering there?)"
        ) from None
    finally:
        with contextlib.suppress(Exception):
            async with asyncio.timeout(timeout_s):
                await admin.close()
    return created


# --------------------------------------------------------------------------------------------------
# scoring models -> control protobuf
# --------------------------------------------------------------------------------------------------


def matcher_to_proto(m: ArgumentMatcher) -> control_pb2.ArgumentMatcher:
    """One argument matcher; values travel as canonical JSON."""
    if m.kind == "equals":
        return control_pb2.ArgumentMatcher(path=m.path, equals_json=canonical_json(m.equals))
    if m.regex is not None:
        return control_pb2.ArgumentMatcher(path=m.path, regex=m.regex)
    if m.one_of is not None:
        return control_pb2.ArgumentMatcher(
            path=m.path, one_of=control_pb2.OneOf(values_json=[canonical_json(v) for v in m.one_of])
        )
    rng = control_pb2.NumberRange()
    if m.minimum is not None:
        rng.min = m.minimum
    if m.maximum is not None:
        rng.max = m.maximum
    return control_pb2.ArgumentMatcher(path=m.path, range=rng)


def _requirement_to_proto(t: ToolCallRequirement) -> control_pb2.ToolCallRequirement:
    req = control_pb2.ToolCallRequirement(
        name=t.name, arguments=[matcher_to_proto(m) for m in t.arguments], status=t.status, min_count=t.min_count
    )
    if t.max_count is not None:
        req.max_count = t.max_count
    return req


def condition_to_proto(c: Condition) -> control_pb2.Condition:
    if isinstance(c, ToolsCalled):
        return control_pb2.Condition(
            tools_called=control_pb2.ToolsCalled(tools=[_requirement_to_proto(t) for t in c.tools])
        )
    if isinstance(c, ToolSequence):
        return control_pb2.Condition(tool_sequence=control_pb2.ToolSequence(tools=list(c.tools), mode=c.mode))
    if isinstance(c, PayloadPropagated):
        return control_pb2.Condition(
            payload_propagated=control_pb2.PayloadPropagated(
                canaries=list(c.canaries), target_tools=list(c.target_tools)
            )
        )
    raise TypeError(f"unsupported condition type {type(c).__name__}")


def build_expectation(
    *,
    expectation_id: str,
    tenant: str,
    scope: Scope,
    expectation: ScoringExpectation,
    scorer: str = "tools",
    deadline: timedelta | None = None,
    labels: Mapping[str, str] | None = None,
    created_at: datetime | None = None,
) -> control_pb2.Expectation:
    """The ``control_pb2.Expectation`` for a scope and a ``ScoringExpectation``.

    ``deadline`` None leaves the field unset: the service applies its
    ``completion.default_deadline_seconds``."""
    if not expectation_id:
        raise ValueError("expectation_id must not be empty")
    if deadline is not None and not isinstance(deadline, timedelta):
        raise TypeError(
            f"deadline must be a datetime.timedelta, e.g. timedelta(seconds=30), got {type(deadline).__name__}"
        )
    if deadline is not None and deadline <= timedelta(0):
        raise ValueError(f"deadline must be positive, got {deadline}")
    try:  # the service's bounds, here where the caller can still act on them
        check_labels(labels or {})
    except ControlDecodeError as exc:
        raise ValueError(exc.detail) from None
    msg = control_pb2.Expectation(
        expectation_id=expectation_id,
        tenant=tenant,
        scope=scope_to_proto(scope),
        scorer=scorer,
        conditions=[condition_to_proto(c) for c in expectation.conditions],
        objective=expectation.objective or "",
        labels=dict(labels or {}),
    )
    if deadline is not None:
        msg.deadline.FromTimedelta(deadline)
    msg.created_at.FromDatetime(created_at or datetime.now(UTC))
    return msg


# --------------------------------------------------------------------------------------------------
# The client
# --------------------------------------------------------------------------------------------------


def _unsubscribe(
    subscribers: list[asyncio.Queue[score_pb2.ScoreEvent | None]], q: asyncio.Queue[score_pb2.ScoreEvent | None]
) -> None:
    with contextlib.suppress(ValueError):
        subscribers.remove(q)


class ExpectationCancelledError(Exception):
    """``wait_for`` on an expectation this client cancelled meanwhile."""

    retriable = False


class ToolwitnessClient:
    """Async control-plane client (see the module docstring). Use as ``async with``."""

    def __init__(
        self,
        *,
        bootstrap_servers: str,
        tenant: str = "default",
        topics: TopicsConfig | None = None,
        security: KafkaSecurityConfig | None = None,
        timeout_s: float = 10.0,
        client_id: str = "toolwitness-client",
        create_topics: bool = True,
        partitions: int = DEFAULT_PARTITIONS,
        fetch_max_wait_ms: int = 20,
        metadata_max_age_ms: int = 30_000,
        all_tenants: bool = False,
        max_retained: int = 100_000,
        scores_from: Literal["end", "beginning"] = "end",
    ) -> None:
        if scores_from not in ("end", "beginning"):
            raise ValueError(f"scores_from must be 'end' or 'beginning', got {scores_from!r}")
        self._scores_from = scores_from
        if not tenant:
            raise ValueError("tenant must not be empty")
        if not TENANT.fullmatch(tenant):  # the service would dead-letter every control message
            raise ValueError(f"tenant {tenant!r} is not {TENANT.pattern}")
        self.bootstrap_servers = bootstrap_servers
        self.tenant = tenant
        self.topics = topics or TopicsConfig()
        _check_timeout(timeout_s)
        #: bounds every network step: each step of start() (topics, producer, consumer), each send
        self.timeout_s = timeout_s
        self._security = security
        self._client_id = client_id
        if not 1 <= fetch_max_wait_ms <= 60_000:
            raise ValueError(f"fetch_max_wait_ms must be 1..60000, got {fetch_max_wait_ms}")
        #: the scores consumer's fetch wait: it bounds how long a published score can sit unread.
        self._fetch_max_wait_ms = fetch_max_wait_ms
        if not 100 <= metadata_max_age_ms <= 3_600_000:
            raise ValueError(f"metadata_max_age_ms must be 100..3600000, got {metadata_max_age_ms}")
        #: how soon partitions added to the scores topic are noticed (and read from their start).
        self._metadata_max_age_ms = metadata_max_age_ms
        #: False: only this client's tenant's scores are kept and yielded (others are counted).
        self._all_tenants = all_tenants
        if max_retained < 1:
            raise ValueError(f"max_retained must be >= 1, got {max_retained}")
        #: distinct score events kept (for events/latest/wait_for, replay to new subscribers and
        #: de-duplication); the oldest arrivals are forgotten first, so memory stays bounded. As
        #: many cancellations are remembered (``wait_for`` on an older one times out instead).
        self._max_retained = max_retained
        self._create_topics = create_topics
        self._partitions = partitions
        self._kafka_kwargs = kafka_security_kwargs(security)

        self._producer: Any = None
        self._consumer: Any = None
        self._consumer_task: asyncio.Task[None] | None = None
        self._consumer_error: BaseException | None = None
        self._started = False
        self._start_lock = asyncio.Lock()

        #: partitions sent back to where this client stopped after aiokafka moved them ahead
        self._reseek: dict[TopicPartition, int] = {}
        #: observations already read and verified, by id (most recent last)
        self._observations: OrderedDict[str, Observation] = OrderedDict()
        #: (tenant, expectation id) this client cancelled: wait_for on them fails at once. The most
        #: recent ``max_retained`` (most recent last): a harness open for days cancels without end.
        self._cancelled: OrderedDict[tuple[str, str], None] = OrderedDict()
        #: observation id -> when a score naming it was decided (ms): where its search starts
        self._observed_at: OrderedDict[str, int] = OrderedDict()
        #: records read by get_observation so far
        self._observation_records_read = 0
        #: (tenant, expectation id) -> events: two tenants may use the same expectation id
        self._events: dict[tuple[str, str], list[score_pb2.ScoreEvent]] = {}
        #: score_id -> event, in arrival order (also the de-duplication set)
        self._arrived: OrderedDict[str, score_pb2.ScoreEvent] = OrderedDict()
        self._forgotten = 0
        self._duplicates = 0
        self._undecodable = 0
        self._other_tenants = 0
        #: the next offset to read per scores partition, as far as this client has read: what a
        #: new assignment (partitions added to the topic) resumes from, so nothing is skipped.
        self._positions: dict[TopicPartition, int] = {}
        self._assigned: frozenset[TopicPartition] = frozenset()
        self._waiters: dict[tuple[str, str], list[asyncio.Future[score_pb2.ScoreEvent]]] = {}
        self._subscribers: list[asyncio.Queue[score_pb2.ScoreEvent | None]] = []

    @classmethod
    def from_kafka_config(cls, kafka: KafkaConfig, *, tenant: str = "default", timeout_s: float = 10.0) -> Self:
        """A client for the service's Kafka section (bootstrap, topics, security, client id)."""
        return cls(
            bootstrap_servers=kafka.bootstrap_servers,
            tenant=tenant,
            topics=kafka.topics,
            security=kafka.security,
            timeout_s=timeout_s,
            client_id=f"{kafka.client_id}-client",
        )

    # -- lifecycle -------------------------------------------------------------------------------

    async def __aenter__(self) -> Self:
        await self.start()
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.stop()

    @property
    def started(self) -> bool:
        return self._started

    async def ensure_topics(self, *, replication_factor: int | None = None) -> list[str]:
        """Create this client's topics when missing (see the module-level ``ensure_topics``)."""
        return await ensure_topics(
            self.bootstrap_servers,
            self.topics,
            security=self._security,
            partitions=self._partitions,
            replication_factor=replication_factor,
            timeout_s=self.timeout_s,
            client_id=f"{self._client_id}-admin",
        )

    async def start(self) -> None:
        """Create missing topics, start the producer and the scores consumer (at the end)."""
        async with self._start_lock:
            if self._started:
                return
            try:
                if self._create_topics:
                    await self.ensure_topics()
                else:
                    await self._require_scores_topic()
                self._producer = RenewingProducer(
                    self._new_producer, component="toolwitness client", timeout_s=self.timeout_s, logger=log
                )
                async with self._step("starting the producer"):
                    await self._producer.start()
                # No consumer group: every partition of the scores topic is assigned to us.
                self._consumer = AIOKafkaConsumer(
                    self.topics.scores,
                    bootstrap_servers=self.bootstrap_servers,
                    client_id=f"{self._client_id}-scores",
                    group_id=None,
                    enable_auto_commit=False,
                    # What aiokafka falls back to for a partition without a position (it may reset
                    # one on a metadata change): where this client starts. A re-assignment
                    # (partitions added) is repositioned explicitly (``_follow``); what a reset
                    # reads twice is dropped by score_id.
                    auto_offset_reset="earliest" if self._scores_from == "beginning" else "latest",
                    fetch_max_wait_ms=self._fetch_max_wait_ms,
                    metadata_max_age_ms=self._metadata_max_age_ms,
                    request_timeout_ms=max(1000, int(self.timeout_s * 1000)),
                    **self._kafka_kwargs,
                )
                async with self._step("starting the scores consumer"):
                    await self._consumer.start()
                    assigned = self._consumer.assignment()
                    if not assigned:
                        raise TopicSetupError(f"scores topic {self.topics.scores!r} has no partitions")
                    # Pin the position of every partition NOW, before any expectation can be sent,
                    # so no score for it can be missed: at the end, or (a harness that restarts and
                    # wants the verdicts published while it was down) at the start of what the
                    # topic retains.
                    if self._scores_from == "beginning":
                        await self._consumer.seek_to_beginning(*assigned)
                    else:
                        await self._consumer.seek_to_end(*assigned)
                    self._positions = {tp: await self._consumer.position(tp) for tp in assigned}
                    self._assigned = frozenset(assigned)
            except BaseException:
                await self._close_clients()
                raise
            self._consumer_error = None
            self._consumer_task = asyncio.create_task(self._consume(), name="toolwitness-client-scores")
            self._started = True
            log.debug("toolwitness client started (tenant=%s, scores=%s)", self.tenant, self.topics.scores)

    @contextlib.asynccontextmanager
    async def _step(self, what: str) -> AsyncIterator[None]:
        """Bounds one step of ``start()`` by ``timeout_s``; the ``TimeoutError`` names the step
        and the bootstrap servers (aiokafka's own says neither)."""
        deadline = asyncio.timeout(self.timeout_s)
        try:
            async with deadline:
                yield
        except TimeoutError:
            if not deadline.expired():
                raise
            raise TimeoutError(
                f"{what} at {self.bootstrap_servers}: no answer within timeout_s={self.timeout_s}s "
                "(is a Kafka broker answering there?)"
            ) from None

    async def _require_scores_topic(self) -> None:
        """With ``create_topics=False``: the scores topic must exist. Subscribing to a missing one
        would make a broker with ``auto.create.topics.enable`` create it (empty, default configs),
        and the client would then wait on a topic no service writes to. ``list_topics`` asks for
        every topic, which creates none."""
        admin = AIOKafkaAdminClient(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"{self._client_id}-admin",
            request_timeout_ms=max(1000, int(self.timeout_s * 1000)),
            **self._kafka_kwargs,
        )
        try:
            async with self._step("listing the topics"):
                await admin.start()
                existing = set(await admin.list_topics())
        finally:
            with contextlib.suppress(Exception):
                async with asyncio.timeout(self.timeout_s):
                    await admin.close()
        if self.topics.scores not in existing:
            raise TopicSetupError(
                f"scores topic {self.topics.scores!r} does not exist at {self.bootstrap_servers} "
                "(create_topics=False): create the toolwitness topics first (ensure_topics, or "
                "create_topics=True), or point topics.scores at the service's scores topic"
            )

    async def stop(self) -> None:
        """Stop the consumer and the producer; wake every waiter. Idempotent."""
        async with self._start_lock:
            if not self._started:
                return
            self._started = False
            task, self._consumer_task = self._consumer_task, None
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError, Exception):
                    await task
            await self._close_clients()
            self._wake_all(RuntimeError("the toolwitness client was stopped"))

    async def _close_clients(self) -> None:
        consumer, self._consumer = self._consumer, None
        producer, self._producer = self._producer, None
        for client in (consumer, producer):
            if client is None:
                continue
            try:
                async with asyncio.timeout(self.timeout_s):
                    await client.stop()
            except Exception as exc:
                log.warning("stopping %s failed: %r", type(client).__name__, exc)

    # -- control plane ---------------------------------------------------------------------------

    def _require_started(self) -> None:
        if not self._started:
            raise RuntimeError("ToolwitnessClient is not started: use `async with` or await start()")

    async def _new_producer(self) -> AIOKafkaProducer:
        """A started idempotent producer (the first at ``start()``; a new one when a record the
        broker refused left the last out of sequence: see ``collector.producer``)."""
        return await start_idempotent(
            self.timeout_s,
            bootstrap_servers=self.bootstrap_servers,
            client_id=self._client_id,
            request_timeout_ms=max(1000, int(self.timeout_s * 1000)),
            **self._kafka_kwargs,
        )

    async def _send(self, topic: str, key: str, value: bytes, what: str = "record") -> None:
        self._require_started()
        try:
            async with asyncio.timeout(self.timeout_s):
                (error,) = await self._producer.send_each(topic, [(key.encode("utf-8"), value)])
        except TimeoutError:
            raise TimeoutError(f"record to {topic!r} not acknowledged within {self.timeout_s}s") from None
        if isinstance(error, RecordRefusedError):  # this record only: the next calls work
            raise RecordRefusedError(
                f"{what} to topic {topic!r} refused by Kafka: {error.reason}",
                topic=topic, key=error.key, size=error.size, reason=error.reason,
            ) from error.__cause__
        if error is not None:
            raise error

    async def _send_control(self, key: str, msg: control_pb2.ControlMessage) -> None:
        kind = {"expectation": "expectation", "completion": "completion marker", "cancel": "cancel"}.get(
            msg.WhichOneof("message") or "", "control record"
        )
        await self._send(
            self.topics.control, key, msg.SerializeToString(deterministic=True), what=f"{kind} {key!r}"
        )

    async def expect(
        self,
        scope: Scope,
        expectation: ScoringExpectation | None = None,
        *,
        conditions: Sequence[Condition] | None = None,
        scorer: str = "tools",
        deadline: timedelta | None = None,
        expectation_id: str | None = None,
        objective: str | None = None,
        labels: Mapping[str, str] | None = None,
    ) -> str:
        """Register an expectation on the control topic; return its id (uuid4 hex by default).

        Give either ``expectation`` or ``conditions`` (+ ``objective``); ``objective`` also
        overrides the expectation's. The record is keyed by the expectation id. To retry after a
        ``TimeoutError`` (the record may still be delivered), pass the same ``expectation_id``:
        the service takes an identical registration once (the timeout message names the id).
        ``labels`` come back in every score of the expectation as metadata ``label.<key>``.
        ``deadline``: how long after registration an undecided expectation ends UNDETERMINED;
        without one the service's ``completion.default_deadline_seconds`` applies (300 s unless
        configured otherwise).

        Raises ``ScorerConfigurationError`` (a ``ValueError``), as ``OtelToolCallScorer`` does
        in-process, for an expectation with no conditions: a tool-call tree needs one to check,
        and a text tree has no text to judge unless the scope is a ``MessageScorable`` with
        ``response_text`` (the one case let through). The client does not know the service's
        scorer trees: an expectation naming a tree the service lacks (``unknown_scorer``), or
        one its tree cannot score (``unscorable_expectation``: a condition no scorer in the tree
        takes, or no condition for a tool-call tree), is dead-lettered by the service and never
        scored, so ``wait_for`` times out. It shows on the DLQ topic (``kafka.topics.dlq``: the
        control record keyed by the expectation id, headers ``toolwitness-dlq-reason`` /
        ``toolwitness-dlq-detail``), in the service's log (``... to DLQ: unknown_scorer``) and in
        its ``toolwitness_dlq_records_total{reason=...}``; ``toolwitness validate-config`` prints
        the configured trees. What the service refuses on its own (an argument matcher's regex
        that could backtrack for hours, labels beyond their bounds) raises ``ValueError`` here.
        """
        if expectation is not None and conditions is not None:
            raise ValueError("pass either `expectation` or `conditions`, not both")
        if isinstance(scope, MessageScorable) and not scope.trace_ids:
            # The service has no conversation memory: it judges the message's traces given here.
            raise ValueError(
                "a MessageScorable sent to the service needs its trace_ids (and response_text for text "
                "scorers) inline: MessageScorable(message_id=..., trace_ids=(trace_id,), response_text=...)"
            )
        if expectation is None:
            expectation = ScoringExpectation(conditions=tuple(conditions or ()), objective=objective)
        elif objective is not None:
            expectation = expectation.model_copy(update={"objective": objective})
        if not expectation.conditions and not (isinstance(scope, MessageScorable) and scope.response_text):
            # The service would dead-letter it (a tool-call tree: unscorable_expectation) or judge
            # nothing (a text tree without text), and the caller would wait out its timeout.
            raise ScorerConfigurationError(
                "expect: the expectation has no conditions to check: a tool-call scorer tree (the default "
                "'tools') needs at least one, e.g. conditions=[ToolsCalled(tools=(ToolCallRequirement(name=...),))]; "
                "only a text tree judges a MessageScorable's response_text without conditions"
            )
        eid = expectation_id or uuid.uuid4().hex
        msg = build_expectation(
            expectation_id=eid,
            tenant=self.tenant,
            scope=scope,
            expectation=expectation,
            scorer=scorer,
            deadline=deadline,
            labels=labels,
        )
        try:
            # What the service would dead-letter as it decodes the record (a matcher regex that
            # backtracks, labels out of bounds, ...) is refused here, where the caller can fix it,
            # not after its wait_for times out.
            expectation_from_proto(msg, default_tenant=self.tenant, default_deadline_s=1.0, now_ms=0)
        except ControlDecodeError as exc:
            raise ValueError(f"expect: the service would refuse this expectation ({exc.reason}): {exc.detail}") from (
                None
            )
        try:
            await self._send_control(eid, control_pb2.ControlMessage(expectation=msg))
        except TimeoutError as exc:
            raise TimeoutError(f"{exc}; expectation_id={eid!r}: retry with it, it is registered at most once") from None
        return eid

    async def mark_complete(self, trace_id: str, span_count: int | None = None, at: datetime | None = None) -> None:
        """Declare trace ``trace_id`` complete (optionally: it has exactly ``span_count`` spans).

        ``at`` is the event time of the claim (default now; naive datetimes are taken as UTC).
        """
        check_trace_id(trace_id)
        marker = control_pb2.CompletionMarker(tenant=self.tenant, trace_id=trace_id)
        if span_count is not None:
            if span_count < 0:
                raise ValueError(f"span_count must be >= 0, got {span_count}")
            marker.span_count = span_count
        marker.at.FromDatetime(at or datetime.now(UTC))
        await self._send_control(trace_id, control_pb2.ControlMessage(completion=marker))

    async def mark_session_complete(self, session_id: str, at: datetime | None = None) -> None:
        """Declare that session ``session_id`` has no traces beyond those it has (keyed by the session id).

        It completes the session's trace SET, not its traces: each trace still needs its own
        ``mark_complete`` (with ``span_count``) before absence can be proven. The session counts as
        complete once the event-time watermark passes ``at`` plus ``allowed_lateness_ms``, so the
        spans of a trace still in flight are linked first; a trace that joins the session after
        that breaks the claim: a FALSE decided on it is revised (never FALSE again for it)."""
        if not session_id:
            raise ValueError("session_id must not be empty")
        marker = control_pb2.CompletionMarker(tenant=self.tenant, session_id=session_id)
        marker.at.FromDatetime(at or datetime.now(UTC))
        await self._send_control(session_id, control_pb2.ControlMessage(completion=marker))

    async def cancel(self, expectation_id: str, reason: str = "") -> None:
        """Cancel an expectation (keyed by its id)."""
        if not expectation_id:
            raise ValueError("expectation_id must not be empty")
        msg = control_pb2.CancelExpectation(tenant=self.tenant, expectation_id=expectation_id, reason=reason)
        await self._send_control(expectation_id, control_pb2.ControlMessage(cancel=msg))
        # No score will come for it: whoever waits for it here -- now or later -- is told so, not
        # left to time out. (The service publishes nothing for a cancelled expectation: another
        # client waiting on the same id is not told.)
        self._cancelled[(self.tenant, expectation_id)] = None
        self._cancelled.move_to_end((self.tenant, expectation_id))
        while len(self._cancelled) > self._max_retained:
            self._cancelled.popitem(last=False)
        for fut in self._waiters.pop((self.tenant, expectation_id), []):
            if not fut.done():
                fut.set_exception(ExpectationCancelledError(f"expectation {expectation_id!r} was cancelled"))

    # -- scores ----------------------------------------------------------------------------------

    @property
    def duplicates(self) -> int:
        """Score events received again with an already seen ``score_id`` (and dropped)."""
        return self._duplicates

    @property
    def forgotten(self) -> int:
        """Score events dropped from the client's memory to keep it within ``max_retained``."""
        return self._forgotten

    @property
    def other_tenants(self) -> int:
        """Score events of other tenants on the shared scores topic (skipped unless ``all_tenants``)."""
        return self._other_tenants

    @property
    def observation_records_read(self) -> int:
        """Records of the observations topic read by ``get_observation`` so far (its cost)."""
        return self._observation_records_read

    @property
    def undecodable(self) -> int:
        """Records on the scores topic that were not a ScoreEvent (skipped)."""
        return self._undecodable

    def events(self, expectation_id: str, *, tenant: str | None = None) -> list[score_pb2.ScoreEvent]:
        """Every distinct score event received for an expectation (all versions, arrival order).

        ``tenant``: whose expectation (default this client's; other tenants' need ``all_tenants``)."""
        return list(self._events.get((tenant or self.tenant, expectation_id), ()))

    def latest(self, expectation_id: str, *, tenant: str | None = None) -> score_pb2.ScoreEvent | None:
        """The highest version received for an expectation, or None."""
        best: score_pb2.ScoreEvent | None = None
        for ev in self._events.get((tenant or self.tenant, expectation_id), ()):
            if best is None or ev.version >= best.version:
                best = ev
        return best

    async def _consume(self) -> None:
        """The background scores reader. Broker errors (``KafkaError``) anywhere in a round --
        reading, re-positioning after a re-assignment -- are retried; any other error ends it,
        and is then recorded and raised to every waiter and stream, now and later."""
        try:
            await self._read_scores()
        except asyncio.CancelledError:
            raise
        except BaseException as exc:
            log.error("the scores consumer stopped: %r", exc)
            self._consumer_error = exc
            # What wait_for and scores() raise once it is recorded, for those waiting now too.
            failed = RuntimeError("the scores consumer failed")
            failed.__cause__ = exc
            self._wake_all(failed)
            if not isinstance(exc, Exception):
                raise

    async def _read_scores(self) -> None:
        failing = False
        while True:
            try:
                await self._read_round()
            except KafkaError as exc:
                if not failing:
                    log.warning("reading scores from %s failed (retrying): %r", self.topics.scores, exc)
                failing = True
                await asyncio.sleep(0.5)
                continue
            if failing:
                log.info("reading scores from %s recovered", self.topics.scores)
                failing = False

    async def _read_round(self) -> None:
        """One fetch, taken in (or dropped, after a re-assignment). A ``KafkaError`` leaves the
        state as it was for the partitions not yet taken: the next round starts from it again."""
        batch = await self._consumer.getmany(timeout_ms=500)
        assigned = self._consumer.assignment()
        if assigned != self._assigned:
            # Partitions were added: aiokafka re-assigned every partition and resets the old
            # ones' positions too. This batch may have been read from reset positions: drop
            # it and resume each known partition where this client stopped reading.
            await self._follow(assigned)
            return
        for tp, records in batch.items():
            if not records:
                continue
            expected = self._positions.get(tp)
            if expected is not None and records[0].offset > expected and self._reseek.get(tp) != expected:
                # aiokafka reset this partition (a metadata change re-assigns even the same
                # partitions, to auto_offset_reset): records from where this client stopped
                # were skipped. Go back once (a real gap -- retention, transaction markers --
                # shows the same first offset again and is then taken as it is).
                start = (await self._consumer.beginning_offsets([tp]))[tp]
                if expected >= start:
                    log.info("scores partition %s moved ahead to %d; back to %d", tp, records[0].offset, expected)
                    self._reseek[tp] = expected
                    self._consumer.seek(tp, expected)
                    continue
            self._reseek.pop(tp, None)
            for record in records:
                self._ingest(record.value)
            self._positions[tp] = records[-1].offset + 1

    async def _follow(self, assigned: set[TopicPartition]) -> None:
        added = assigned - self._assigned
        # A partition that appeared after start() holds only records newer than this client:
        # from its first offset (explicitly: what this dropped batch read from it is re-read).
        if added:
            self._positions.update(await self._consumer.beginning_offsets(list(added)))
        for tp in assigned:
            self._consumer.seek(tp, self._positions[tp])
        log.info(
            "scores topic %s: partitions %s added; reading them from their start",
            self.topics.scores,
            sorted(tp.partition for tp in added),
        )
        self._assigned = frozenset(assigned)

    def _ingest(self, value: bytes | None) -> None:
        if value is None:
            return
        try:
            ev = decode_score_event(value)
        except (DecodeError, json_format.ParseError, UnicodeDecodeError, ValueError) as exc:
            self._undecodable += 1
            log.warning("skipping an undecodable record on %s: %s", self.topics.scores, type(exc).__name__)
            return
        if not ev.expectation_id:
            self._undecodable += 1
            log.warning("skipping a score event without expectation_id on %s", self.topics.scores)
            return
        if not self._all_tenants and ev.tenant != self.tenant:
            self._other_tenants += 1
            return
        sid = ev.score_id or score_id_for(ev.tenant, ev.expectation_id, ev.version)
        if sid in self._arrived:
            self._duplicates += 1
            return
        self._arrived[sid] = ev
        if ev.HasField("decided_at"):
            decided_ms = ev.decided_at.ToMilliseconds()
            for oid in ev.observation_ids:
                self._observed_at[oid] = decided_ms
                self._observed_at.move_to_end(oid)
            while len(self._observed_at) > self._max_retained:
                self._observed_at.popitem(last=False)
        key = (ev.tenant, ev.expectation_id)
        self._events.setdefault(key, []).append(ev)
        while len(self._arrived) > self._max_retained:
            _, old = self._arrived.popitem(last=False)
            old_key = (old.tenant, old.expectation_id)
            kept = self._events[old_key]
            kept.remove(old)
            if not kept:
                del self._events[old_key]
            self._forgotten += 1
        for q in self._subscribers:
            q.put_nowait(ev)
        # The event itself goes to the waiters: later records of the same batch may evict it from
        # the retained set (max_retained) before a waiter runs.
        for fut in self._waiters.pop(key, []):
            if not fut.done():
                fut.set_result(ev)

    def _wake_all(self, exc: BaseException) -> None:
        for futs in self._waiters.values():
            for fut in futs:
                if not fut.done():
                    fut.set_exception(exc)
        self._waiters.clear()
        for q in self._subscribers:
            q.put_nowait(None)

    def scores(self, *, include_received: bool = True) -> AsyncGenerator[score_pb2.ScoreEvent, None]:
        """Distinct score events as they arrive (first those already received, unless told not to).

        The subscription starts when ``scores()`` is called, not at the first ``anext``: a stream
        opened before ``expect`` yields that expectation's score even when it is iterated later.
        Ends when the client stops; raises if the scores consumer failed. A stream that is no
        longer read keeps every new event until it is closed (``aclose()``) or garbage collected.
        """
        self._require_started()
        q: asyncio.Queue[score_pb2.ScoreEvent | None] = asyncio.Queue()
        if include_received:
            for received in self._arrived.values():
                q.put_nowait(received)
        if self._consumer_error is not None:
            q.put_nowait(None)  # the reader is gone: nothing more will come; the stream says why
        self._subscribers.append(q)
        stream = self._stream(q)
        # An async generator that is never started runs no ``finally`` when it is dropped: its
        # queue leaves the subscribers when the generator object is collected.
        weakref.finalize(stream, _unsubscribe, self._subscribers, q)
        return stream

    async def _stream(
        self, q: asyncio.Queue[score_pb2.ScoreEvent | None]
    ) -> AsyncGenerator[score_pb2.ScoreEvent, None]:
        try:
            while True:
                ev = await q.get()
                if ev is None:
                    if self._consumer_error is not None:
                        raise RuntimeError("the scores consumer failed") from self._consumer_error
                    return
                yield ev
        finally:
            _unsubscribe(self._subscribers, q)

    async def wait_for(
        self, expectation_id: str, timeout: float, *, tenant: str | None = None
    ) -> score_pb2.ScoreEvent:
        """The latest version of the score for ``expectation_id``; waits up to ``timeout`` s.

        Only scores read since the client started count (``scores_from="end"``, the default,
        starts at the topic's end: a verdict published before, or while a restarted harness was
        down, needs ``scores_from="beginning"``). Raises ``TimeoutError`` (==
        ``asyncio.TimeoutError``) when none arrived in time, ``ExpectationCancelledError`` when this
        client cancelled the expectation (before or meanwhile), ``ValueError`` for another tenant's
        expectation on a client without ``all_tenants``.
        """
        if isinstance(timeout, timedelta):  # expect's deadline is one; this wait is in seconds
            raise TypeError(
                f"timeout is in seconds (e.g. timeout=30), not a timedelta: pass {timeout!r}.total_seconds()"
            )
        self._require_started()
        if timeout is None or not timeout > 0:
            raise ValueError(f"timeout must be a positive number of seconds, got {timeout!r}")
        key = (tenant or self.tenant, expectation_id)
        if key[0] != self.tenant and not self._all_tenants:
            raise ValueError(
                f"tenant {key[0]!r}: this client keeps only tenant {self.tenant!r}'s scores; "
                "start it with all_tenants=True to wait for another tenant's"
            )
        found = self.latest(expectation_id, tenant=key[0])
        if found is not None:
            return found
        if key in self._cancelled:
            raise ExpectationCancelledError(f"expectation {expectation_id!r} was cancelled")
        if self._consumer_error is not None:
            raise RuntimeError("the scores consumer failed") from self._consumer_error
        fut: asyncio.Future[score_pb2.ScoreEvent] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(key, []).append(fut)
        try:
            async with asyncio.timeout(timeout):
                arrived = await fut
        except TimeoutError:
            raise TimeoutError(
                f"no score for expectation {expectation_id!r} (tenant {key[0]!r}) on topic {self.topics.scores!r} "
                f"within {timeout}s: is the service running, was the scope completed or its deadline reached, "
                "was the expectation accepted (the service dead-letters unknown scorers and unscorable "
                f"expectations: see topic {self.topics.dlq!r}, header toolwitness-dlq-reason), and was the "
                "score published after this client started (scores_from)?"
            ) from None
        finally:
            waiters = self._waiters.get(key)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[key]
        # A newer version may have arrived meanwhile; the event itself if it was already evicted.
        latest = self.latest(expectation_id, tenant=key[0])
        return latest if latest is not None and latest.version >= arrived.version else arrived

    # -- observations ----------------------------------------------------------------------------

    def _match(
        self, batch: Mapping[TopicPartition, Sequence[ConsumerRecord[bytes, bytes]]], key: bytes
    ) -> bytes | None:
        for records in batch.values():
            self._observation_records_read += len(records)
            for record in records:
                if record.key == key and record.value is not None:
                    value: bytes = record.value
                    return value
        return None

    async def _scan(
        self, consumer: AIOKafkaConsumer, tps: list[TopicPartition], key: bytes, offset: int | None
    ) -> bytes | None:
        """The record keyed ``key`` in ``tps``, read from ``offset`` (None: the start) up to the end
        offsets seen now; None if it is not there."""
        consumer.assign(tps)
        ends = await consumer.end_offsets(tps)
        for tp in tps:
            if offset is None:
                await consumer.seek_to_beginning(tp)
            else:
                consumer.seek(tp, offset)
        left = {tp for tp in tps if await consumer.position(tp) < ends[tp]}
        while left:
            found = self._match(await consumer.getmany(*left, timeout_ms=200), key)
            if found is not None:
                return found
            left = {tp for tp in left if await consumer.position(tp) < ends[tp]}
        return None

    async def get_observation(
        self, observation_id: str, timeout: float = 10.0, *, published_after: datetime | None = None
    ) -> Observation:
        """Read an observation from the (compacted) observations topic.

        The search starts at the first record of its partition written a minute before the
        observation was published (Kafka's time index), known from a score that named it (one
        this client received, or ``published_after``: a score's ``decided_at``), else at the
        partition's start; a search from the time that does not find it goes on from the start.
        Waits up to ``timeout`` s for it to appear. The result is content-hash verified:
        a record whose content does not match its id raises ``ValueError``.
        """
        if not observation_id:
            raise ValueError("observation_id must not be empty")
        cached = self._observations.get(observation_id)
        if cached is not None:  # content-addressed, immutable: a verified copy stays right
            self._observations.move_to_end(observation_id)
            return cached
        key = observation_id.encode("utf-8")
        consumer = AIOKafkaConsumer(
            bootstrap_servers=self.bootstrap_servers,
            client_id=f"{self._client_id}-observations",
            group_id=None,
            enable_auto_commit=False,
            auto_offset_reset="earliest",
            request_timeout_ms=max(1000, int(self.timeout_s * 1000)),
            **self._kafka_kwargs,
        )
        value: bytes | None = None
        try:
            async with asyncio.timeout(timeout):
                await consumer.start()
                # The service keys observations by id with Kafka's default partitioner: the key's
                # partition now holds it, unless partitions were added since it was published.
                parts = sorted(await topic_partitions(consumer, self.topics.observations))
                while not parts:
                    await asyncio.sleep(0.1)  # metadata of a topic created a moment ago
                    parts = sorted(await topic_partitions(consumer, self.topics.observations))
                topic = self.topics.observations
                home = TopicPartition(topic, KeyPartitioner()(key, parts, parts))
                near = (
                    int(published_after.timestamp() * 1000)
                    if published_after is not None
                    else self._observed_at.get(observation_id)
                )
                # Searches, each up to the end offsets seen when it starts: the home partition from
                # the time index (when the time is known), then from its start, then every other
                # partition from its start; then wait on all of them for it to arrive.
                since = None
                if near:
                    found = await consumer.offsets_for_times({home: max(0, near - OBSERVATION_SEARCH_SLACK_MS)})
                    since = found.get(home)
                others = [TopicPartition(topic, p) for p in parts if p != home.partition]
                plan: list[tuple[list[TopicPartition], int | None]] = []
                if since is not None:
                    plan.append(([home], since.offset))
                plan.append(([home], None))
                if others:
                    plan.append((others, None))
                for tps, offset in plan:
                    value = await self._scan(consumer, tps, key, offset)
                    if value is not None:
                        break
                if value is None:
                    every = [home, *others]
                    consumer.assign(every)
                    ends = await consumer.end_offsets(every)
                    for tp in every:
                        consumer.seek(tp, ends[tp])
                    while value is None:
                        value = self._match(await consumer.getmany(timeout_ms=200), key)
        except TimeoutError:
            raise TimeoutError(
                f"observation {observation_id!r} not found on topic {self.topics.observations!r} within {timeout}s"
            ) from None
        finally:
            try:
                async with asyncio.timeout(self.timeout_s):
                    await consumer.stop()
            except Exception as exc:
                log.warning("stopping the observations consumer failed: %r", exc)
        assert value is not None
        proto = decode_observation(value)
        if proto.observation_id != observation_id:
            raise ValueError(
                f"record keyed {observation_id!r} carries observation_id {proto.observation_id!r}"
            )
        found = observation_from_proto(proto)
        self._observations[observation_id] = found
        while len(self._observations) > OBSERVATION_CACHE:
            self._observations.popitem(last=False)
        return found
