"""Fixtures shared by every test.

Integration tests (``@pytest.mark.integration``) talk to a REAL Kafka broker and a REAL Redis
server: by default the ones ``make services-up`` starts (``scripts/services.py``), or whatever
``TOOLWITNESS_KAFKA_BOOTSTRAP`` / ``TOOLWITNESS_REDIS_URL`` point at. When they cannot be
reached the fixtures FAIL with a message saying what to run; they never skip, so a missing
service can never turn into a green run.

(Where a Docker engine exists and neither variable is set, testcontainers could start the two
servers here instead. This project's machines have no Docker engine, so that is not done.)
"""

from __future__ import annotations

import asyncio
import logging
import os
import re
import socket
import uuid
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, Protocol
from urllib.parse import urlsplit

import pytest
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from redis.asyncio import Redis

from collector.telemetry.logs import RepeatThrottle

# The endpoints scripts/services.py starts: its defaults, or its port overrides when set.
DEFAULT_KAFKA_BOOTSTRAP = f"127.0.0.1:{os.environ.get('TOOLWITNESS_SERVICES_KAFKA_PORT') or 19092}"
DEFAULT_REDIS_URL = f"redis://127.0.0.1:{os.environ.get('TOOLWITNESS_SERVICES_REDIS_PORT') or 6390}/0"
START_HINT = (
    "run `make services-up` (scripts/services.py up), or point TOOLWITNESS_KAFKA_BOOTSTRAP / "
    "TOOLWITNESS_REDIS_URL at running servers"
)
CONNECT_TIMEOUT_S = 10.0


def _loggers() -> list[logging.Logger]:
    return [lg for lg in list(logging.root.manager.loggerDict.values()) if isinstance(lg, logging.Logger)]


@pytest.fixture(autouse=True)
def _log_throttles_stay_with_their_test() -> Iterator[None]:
    """A service that owns its process (the benches, the demo, ``owns_process=True``) throttles
    process-wide loggers; taken off after the test, or a later test that counts log lines would
    find the first of them held back (one per kind per interval, the interval still running)."""
    before = {id(f) for lg in _loggers() for f in lg.filters if isinstance(f, RepeatThrottle)}
    yield
    for lg in _loggers():
        lg.filters[:] = [f for f in lg.filters if not isinstance(f, RepeatThrottle) or id(f) in before]
TOPIC_READY_TIMEOUT_S = 30.0


def _tcp_error(host: str, port: int, timeout_s: float = 2.0) -> str | None:
    """None if host:port accepts a TCP connection, else the reason it does not."""
    try:
        with socket.create_connection((host, port), timeout=timeout_s):
            return None
    except OSError as exc:
        return f"{type(exc).__name__}: {exc}"


def _split_host_port(server: str, default_port: int) -> tuple[str, int]:
    host, _, port = server.strip().rpartition(":")
    if not host:
        return server.strip(), default_port
    return host.strip("[]"), int(port)


# --------------------------------------------------------------------------------------------
# Kafka
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
async def kafka_bootstrap() -> str:
    """bootstrap.servers of the test broker; fails (never skips) when it is not reachable."""
    bootstrap = os.environ.get("TOOLWITNESS_KAFKA_BOOTSTRAP") or DEFAULT_KAFKA_BOOTSTRAP
    errors = []
    for server in bootstrap.split(","):
        host, port = _split_host_port(server, 9092)
        err = _tcp_error(host, port)
        if err is None:
            break
        errors.append(f"{host}:{port}: {err}")
    else:
        pytest.fail(f"Kafka is not reachable at {bootstrap} ({'; '.join(errors)}): {START_HINT}", pytrace=False)
    # A TCP accept is not a broker: also complete a metadata round trip.
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap, request_timeout_ms=int(CONNECT_TIMEOUT_S * 1000))
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await admin.start()
            await admin.describe_cluster()
    except Exception as exc:
        pytest.fail(f"Kafka at {bootstrap} does not answer metadata requests ({exc!r}): {START_HINT}", pytrace=False)
    finally:
        await admin.close()
    return bootstrap


@pytest.fixture(scope="session")
async def kafka_admin(kafka_bootstrap: str) -> AsyncIterator[AIOKafkaAdminClient]:
    admin = AIOKafkaAdminClient(bootstrap_servers=kafka_bootstrap, request_timeout_ms=30_000)
    await admin.start()
    try:
        yield admin
    finally:
        await admin.close()


class TopicFactory(Protocol):
    """``await topic_factory(partitions=4)`` -> name of a new, empty, uniquely named topic."""

    def __call__(self, partitions: int = 1, *, configs: dict[str, str] | None = None) -> Awaitable[str]: ...


def _response_errors(response: Any) -> list[tuple[str, int, str | None]]:
    """(topic, error_code, message) of a CreateTopics/DeleteTopics response, any version."""
    obj = response.to_object()
    rows = obj.get("topic_errors") or obj.get("topics") or obj.get("topic_error_codes") or []
    out: list[tuple[str, int, str | None]] = []
    for row in rows:
        name = row.get("topic") or row.get("name")
        out.append((str(name), int(row.get("error_code", 0)), row.get("error_message")))
    return out


async def _await_topic_ready(admin: AIOKafkaAdminClient, name: str, partitions: int) -> None:
    """Until the topic's metadata lists every partition with a leader (no sleep-and-hope)."""
    async with asyncio.timeout(TOPIC_READY_TIMEOUT_S):
        while True:
            for topic in await admin.describe_topics([name]):
                parts = topic.get("partitions") or []
                if (
                    topic.get("topic") == name
                    and topic.get("error_code") == 0
                    and len(parts) == partitions
                    and all(p.get("leader", -1) >= 0 for p in parts)
                ):
                    return
            await asyncio.sleep(0.05)


@pytest.fixture
async def topic_factory(
    kafka_admin: AIOKafkaAdminClient, request: pytest.FixtureRequest
) -> AsyncIterator[TopicFactory]:
    """Creates uniquely named topics for one test and deletes them after it."""
    created: list[str] = []
    stem = re.sub(r"[^a-zA-Z0-9]+", "-", request.node.name).strip("-")[:60] or "test"

    async def make(partitions: int = 1, *, configs: dict[str, str] | None = None) -> str:
        name = f"tw-test-{stem}-{uuid.uuid4().hex[:12]}"
        topic = NewTopic(name=name, num_partitions=partitions, replication_factor=1, topic_configs=configs or {})
        response = await kafka_admin.create_topics([topic], timeout_ms=30_000)
        bad = [e for e in _response_errors(response) if e[1] != 0]
        assert not bad, f"creating topic {name} failed: {bad}"
        created.append(name)
        await _await_topic_ready(kafka_admin, name, partitions)
        return name

    yield make
    if created:
        response = await kafka_admin.delete_topics(created, timeout_ms=30_000)
        bad = [e for e in _response_errors(response) if e[1] != 0]
        assert not bad, f"deleting topics {created} failed: {bad}"


@pytest.fixture
async def unique_topic(topic_factory: TopicFactory) -> str:
    """A fresh single-partition topic (total order), deleted after the test."""
    return await topic_factory(1)


# --------------------------------------------------------------------------------------------
# Redis
# --------------------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of the test Redis; fails (never skips) when it is not reachable."""
    url = os.environ.get("TOOLWITNESS_REDIS_URL") or DEFAULT_REDIS_URL
    parts = urlsplit(url)
    host, port = parts.hostname or "127.0.0.1", parts.port or 6379
    err = _tcp_error(host, port)
    if err is not None:
        pytest.fail(f"Redis is not reachable at {url} ({err}): {START_HINT}", pytrace=False)
    return url


@pytest.fixture
def redis_key_prefix() -> str:
    """A key prefix unique to one test; every key under it is deleted after the test."""
    return f"tw-test:{uuid.uuid4().hex}:"


@pytest.fixture
def redis_cleanup() -> set[str]:
    """Extra keys (or glob patterns) a test wrote outside its prefix, deleted after the test.

    Per-trace keys such as ``tw:{tenant:<traceid>}:...`` cannot carry the test prefix, so a
    test that writes them adds them here.
    """
    return set()


@pytest.fixture
async def redis_client(redis_url: str, redis_key_prefix: str, redis_cleanup: set[str]) -> AsyncIterator[Redis]:
    """A redis.asyncio client; afterwards deletes ``redis_key_prefix*`` and ``redis_cleanup``."""
    client: Redis = Redis.from_url(redis_url, socket_connect_timeout=CONNECT_TIMEOUT_S)
    try:
        async with asyncio.timeout(CONNECT_TIMEOUT_S):
            await client.ping()
    except Exception as exc:
        await client.aclose()
        pytest.fail(f"Redis at {redis_url} does not answer PING ({exc!r}): {START_HINT}", pytrace=False)
    try:
        yield client
    finally:
        try:
            patterns = {redis_key_prefix + "*", *redis_cleanup}
            doomed: set[bytes] = set()
            for pattern in patterns:
                if any(ch in pattern for ch in "*?["):
                    doomed.update([k async for k in client.scan_iter(match=pattern, count=500)])
                else:
                    doomed.add(pattern.encode())
            if doomed:
                await client.delete(*doomed)
        finally:
            await client.aclose()


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Leave `collector_build` tests (minutes of Go build when cold) out unless asked for.

    They run when the -m expression names the marker (`make collector-build`) or with
    RUN_COLLECTOR_BUILD=1; otherwise they are reported as deselected, never as passed.
    """
    if "collector_build" in (config.option.markexpr or "") or os.environ.get("RUN_COLLECTOR_BUILD") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("collector_build")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("collector_build")]
