"""Every internal metric of the service, declared in one place (like the Collector's metadata.yaml).

Each metric carries the ``component`` label: the unique name of the pipeline
stage that records it. Count every drop.
"""

from __future__ import annotations

from typing import Literal, get_args

from prometheus_client import (
    GC_COLLECTOR,
    PLATFORM_COLLECTOR,
    PROCESS_COLLECTOR,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
)

REGISTRY = CollectorRegistry(auto_describe=True)
# The standard process_* (resident memory, CPU, open fds), python_gc_* and python_info series,
# as any Prometheus client exposes them by default.
for _standard in (PROCESS_COLLECTOR, PLATFORM_COLLECTOR, GC_COLLECTOR):
    REGISTRY.register(_standard)

SPANS_IN = Counter(
    "toolwitness_spans_received",
    "Spans decoded from input records (the service: once per batch that went through, not per retry).",
    ["component"],
    registry=REGISTRY,
)
RECORDS_IN = Counter(
    "toolwitness_records_received",
    "Kafka records consumed, by topic kind (once per batch that went through, not per retry).",
    ["component", "kind"],
    registry=REGISTRY,
)
DLQ_RECORDS = Counter(
    "toolwitness_dlq_records",
    "Records sent to the dead-letter topic, by reason.",
    ["component", "reason"],
    registry=REGISTRY,
)
DROPPED = Counter(
    "toolwitness_dropped", "Items dropped by a limit or rule, by reason.", ["component", "reason"], registry=REGISTRY
)
TRACES_TOUCHED = Gauge(
    "toolwitness_traces_touched",
    "Distinct traces updated in Redis by the last batch.",
    ["component"],
    registry=REGISTRY,
)
TRACES_IN_STATE = Gauge(
    "toolwitness_traces_in_state",
    "Traces whose state Redis holds now (created, not yet expired or reclaimed), by tenant. Counted in Redis, "
    "so every instance reports the same figure (aggregate with max, not sum); refreshed by the sweeper every "
    "15 s. A state is counted until the end of the expiry bucket it falls in (redis.state_ttl_seconds / 100, "
    "1 to 60 s): at most that long after it expired. At most 100 series: beyond that, the largest 99 tenants and "
    "tenant=\"(other)\" with the rest.",
    ["component", "tenant"],
    registry=REGISTRY,
)
#: what made an expectation decidable: the ``trigger`` label of ``toolwitness_decisions_total``
Trigger = Literal["span", "expectation", "marker", "watermark", "deadline", "revision"]
DECISION_TRIGGERS: tuple[Trigger, ...] = get_args(Trigger)
DECISIONS = Counter(
    "toolwitness_decisions",
    "Score events decided, by verdict (true, false, undetermined) and trigger (" + ", ".join(DECISION_TRIGGERS) + ").",
    ["component", "verdict", "trigger"],
    registry=REGISTRY,
)
REVISIONS = Counter(
    "toolwitness_revisions", "Scores revised after a broken completion claim.", ["component"], registry=REGISTRY
)
RESENT = Counter(
    "toolwitness_scores_resent",
    "Identical score events re-sent after a crash or by the sweeper.",
    ["component"],
    registry=REGISTRY,
)
EVALUATION_FAILURES = Counter(
    "toolwitness_evaluation_failures",
    "Expectations whose evaluation raised (a bug, or evidence no judge can read): each is published "
    "UNDETERMINED with the error in its metadata, and the batch goes on.",
    ["component"],
    registry=REGISTRY,
)
OVERSIZED = Counter(
    "toolwitness_observations_shrunk",
    "Observations over limits.max_observation_bytes, judged and published with arguments cut or without executions.",
    ["component"],
    registry=REGISTRY,
)
TIME_TO_VERDICT = Histogram(
    "toolwitness_time_to_verdict_seconds",
    "From expectation registration (or deciding record) to score publication.",
    ["component", "verdict"],
    buckets=(0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 300),
    registry=REGISTRY,
)
CONSUMER_LAG = Gauge(
    "toolwitness_consumer_lag",
    "Records behind the high watermark, by topic and partition.",
    ["component", "topic", "partition"],
    registry=REGISTRY,
)
WATERMARK = Gauge(
    "toolwitness_event_time_watermark_seconds",
    "Global event-time watermark (seconds since epoch).",
    ["component"],
    registry=REGISTRY,
)
EXPORT_FAILURES = Counter(
    "toolwitness_export_failures",
    "Failed deliveries to Kafka: records the service's exporter could not write (its batch or sweep is "
    "retried on a new producer), and failed exports of the span exporter and the sidecar.",
    ["component"],
    registry=REGISTRY,
)
DEPENDENCY_FAILURES = Counter(
    "toolwitness_dependency_failures",
    "Redis or Kafka failures of the service's loops, retried: batch (not committed, replayed), "
    "watermarks (not published), sweep (deadlines, completions, re-sends postponed), kafka (the brokers did "
    "not answer the poll loop's probe), deliveries (scores, observations or dead letters of a batch or a sweep "
    "not delivered; ended by a delivery that succeeds).",
    ["component", "loop"],
    registry=REGISTRY,
)
COMMIT_FAILURES = Counter(
    "toolwitness_commit_failures",
    "Offset commits refused after a rebalance (the batch is replayed).",
    ["component"],
    registry=REGISTRY,
)
STATE_LOSSES = Counter(
    "toolwitness_state_losses",
    "Times Redis was found to have lost its data (evidence marked state_lost).",
    ["component"],
    registry=REGISTRY,
)
RECORDS_SKIPPED = Counter(
    "toolwitness_records_skipped",
    "Records deleted from a partition (retention) before the group read them, found after a rebalance "
    "(the committed offset was no longer in the log); spans lost so: evidence marked state_lost.",
    ["component", "topic", "partition"],
    registry=REGISTRY,
)
BATCH_SECONDS = Histogram(
    "toolwitness_batch_seconds",
    "Time to process one consumed batch through the commit protocol.",
    ["component"],
    registry=REGISTRY,
)
