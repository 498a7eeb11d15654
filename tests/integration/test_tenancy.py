"""Tenancy (issue 9): a tenant's expectations only ever read that tenant's evidence.

The tenant of a span record comes from the Kafka header or the resource attribute that the
service config names (TenantConfig; the header wins). This stack maps them to NON-default
names (header ``x-org``, resource attribute ``org.id``), so the default names
(``toolwitness-tenant`` / ``toolwitness.tenant``) must be ignored -- such records belong to the
default tenant.

Tenants ``acme`` and ``globex`` write spans into the SAME trace id T:
- globex (header): a root, ``search`` and -- in a record whose resource attribute says acme but
  whose header says globex -- ``header_wins``;
- acme (resource attribute): a root and ``lookup``;
- a record using the default header/attribute names for acme: a ``wrong_mapping`` execution,
  which is the default tenant's.
Asserted: acme's "search was called" is not TRUE although globex called search in T; globex's
marker does not complete acme's trace; after acme's own marker it is FALSE and stays FALSE;
acme's observation holds only acme's executions; globex and default get their own verdicts;
a session id shared by both tenants does not leak either. Redis keys (SCAN on the stack's
prefix) carry the tenant: the trace has one state per tenant.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Awaitable, Sequence
from datetime import timedelta

import pytest

from scoring.models import SessionScorable, TraceScorable
from tests.integration.harness import (
    control_client,
    drop_stack,
    expectation_bytes,
    expects,
    header,
    make_agent,
    make_config,
    new_span_id,
    new_trace_id,
    otlp_request,
    otlp_span,
    raw_producer,
    read_all,
    redis_keys,
    running_service,
    until,
    verdict,
)

pytestmark = pytest.mark.integration

HEADER, RESOURCE = "x-org", "org.id"


def record(trace_id: str, tools: Sequence[str], t0: int, *, resource: dict[str, str] | None = None,
           root: bool = True, session: str | None = None) -> tuple[bytes, int]:
    root_id = new_span_id()
    spans = []
    if root:
        spans.append(otlp_span(trace_id, span_id=root_id, name="agent", start_ms=t0, end_ms=t0 + 100))
    for i, tool in enumerate(tools):
        attrs = {"gen_ai.conversation.id": session} if session else None
        spans.append(otlp_span(trace_id, parent=root_id if root else b"", name=f"execute_tool {tool}",
                               tool=tool, start_ms=t0 + 10 + i, end_ms=t0 + 11 + i, attrs=attrs))
    req = otlp_request(spans)
    for k, v in (resource or {}).items():
        req.resource_spans[0].resource.attributes.add(key=k).value.string_value = v
    return req.SerializeToString(), len(spans)


async def test_tenants_never_read_each_others_evidence(kafka_bootstrap: str, redis_url: str) -> None:
    started = time.monotonic()
    cfg = make_config(kafka_bootstrap, redis_url, tenant={"header": HEADER, "resource_attribute": RESOURCE})
    topics = cfg.kafka.topics
    t0 = int(time.time() * 1000) - 60_000
    trace = new_trace_id()
    session_trace = new_trace_id()
    globex_1, n_g1 = record(trace, ["search"], t0)
    globex_2, n_g2 = record(trace, ["header_wins"], t0 + 200, resource={RESOURCE: "acme"}, root=False)
    acme_1, n_a1 = record(trace, ["lookup"], t0 + 300, resource={RESOURCE: "acme"})
    default_1, n_d1 = record(trace, ["wrong_mapping"], t0 + 400, resource={"toolwitness.tenant": "acme"},
                             root=False)
    globex_session, _ = record(session_trace, ["search"], t0 + 500, session="shared-session")
    # acme's trace in the same session has the SAME trace id as globex's, without search.
    acme_session, n_as = record(session_trace, ["lookup"], t0 + 600, session="shared-session",
                                resource={RESOURCE: "acme"})
    spans = [
        (globex_1, [(HEADER, b"globex")]),
        (globex_2, [(HEADER, b"globex")]),  # header wins over the resource attribute
        (acme_1, None),
        (default_1, [("toolwitness-tenant", b"acme")]),  # not the configured names: default tenant
        (globex_session, [(HEADER, b"globex")]),
        (acme_session, None),
    ]
    # (tenant, expectation id, tool) -> verdict
    plan = {
        ("acme", "acme-search", "search"): "false",
        ("acme", "acme-lookup", "lookup"): "true",
        ("acme", "acme-header-wins", "header_wins"): "false",
        ("acme", "acme-wrong-mapping", "wrong_mapping"): "false",
        ("globex", "globex-search", "search"): "true",
        ("globex", "globex-header-wins", "header_wins"): "true",
        ("globex", "globex-lookup", "lookup"): "false",
        ("default", "default-wrong-mapping", "wrong_mapping"): "true",
        ("default", "default-search", "search"): "false",
    }
    try:
        async with raw_producer(cfg) as producer, running_service(cfg) as service, \
                control_client(cfg, tenant="acme") as acme, control_client(cfg, tenant="globex") as globex, \
                control_client(cfg) as default:
            clients = {"acme": acme, "globex": globex, "default": default}
            for value, hdrs in spans:
                await producer.send_and_wait(topics.spans, value=value, key=trace.encode(), headers=hdrs)
            for (tenant, eid, tool), _ in plan.items():
                await producer.send_and_wait(topics.control, key=eid.encode(),
                                             value=expectation_bytes(eid, [trace], expects(tool), tenant=tenant))
            # Session scope: both tenants watch "shared-session" (one trace each, same trace id); only
            # globex's calls search.
            acme_session_id = await acme.expect(SessionScorable(session_id="shared-session"), expects("search"))
            globex_session_id = await globex.expect(SessionScorable(session_id="shared-session"), expects("search"))

            # Every TRUE arrives; acme's "search" does not, although globex called search in trace T.
            trues = [(t, e) for (t, e, _), v in plan.items() if v == "true"]
            await asyncio.gather(*[clients[t].wait_for(e, timeout=30) for t, e in trues],
                                 globex.wait_for(globex_session_id, timeout=30))
            acme_key = service.store.k.expectation("acme", "acme-search")
            await until(lambda: service.redis.exists(acme_key))
            async with service.batch_lock:
                pass
            await service.sweep()
            assert acme.events("acme-search") == [], "acme's expectation read globex's evidence"
            assert acme.events(acme_session_id) == [], "acme's session read globex's evidence"

            # globex declares trace T complete: acme's view of T is still incomplete.
            await globex.mark_complete(trace, span_count=n_g1 + n_g2)
            await globex.wait_for("globex-lookup", timeout=30)
            async with service.batch_lock:
                pass
            await service.sweep()
            assert acme.events("acme-search") == [], "globex's marker completed acme's trace"

            # acme's own marker: FALSE, from acme's evidence only.
            await acme.mark_complete(trace, span_count=n_a1)
            await default.mark_complete(trace, span_count=n_d1)
            await acme.mark_complete(session_trace, span_count=n_as)
            await acme.mark_session_complete("shared-session")
            rest = [(t, e) for (t, e, _), v in plan.items() if v == "false"]
            await asyncio.gather(*[clients[t].wait_for(e, timeout=30) for t, e in rest],
                                 acme.wait_for(acme_session_id, timeout=30))
            for (tenant, eid, _), want in plan.items():
                (ev,) = clients[tenant].events(eid)
                assert verdict(ev) == want and ev.tenant == tenant, (eid, verdict(ev), ev.tenant, ev.rationale)
            (acme_false,) = acme.events("acme-search")
            obs = await acme.get_observation(acme_false.observation_ids[0])
            assert {e.name for e in obs.tool_executions} == {"lookup"}, obs.tool_executions
            assert verdict(acme.events(acme_session_id)[0]) == "false"
            assert verdict(globex.events(globex_session_id)[0]) == "true"

            # Later globex spans in T never change acme's verdict.
            late, _ = record(trace, ["delete_db", "search"], t0 + 900, root=False)
            await producer.send_and_wait(topics.spans, value=late, key=trace.encode(), headers=[(HEADER, b"globex")])

            async def globex_spans() -> int:
                raw = await service.redis.get(service.store.k.state("globex", trace))
                return 0 if raw is None else int(json.loads(raw)["n"])

            await until(lambda: _at_least(globex_spans(), n_g1 + n_g2 + 2))
            async with service.batch_lock:
                pass
            await service.sweep()
            assert [verdict(e) for e in acme.events("acme-search")] == ["false"]

            # Redis: one state per tenant for the same trace id, every key carrying its tenant.
            states = await redis_keys(cfg, f"{{*:{trace}}}:s")
            prefix = cfg.redis.key_prefix
            assert states == sorted(f"{prefix}:{{{t}:{trace}}}:s" for t in ("acme", "default", "globex")), states
            tenants_in_keys = {k.split("{", 1)[1].split(":", 1)[0] for k in await redis_keys(cfg, "{*")}
            assert tenants_in_keys == {"acme", "globex", "default"}, tenants_in_keys
            for t in ("acme", "globex"):
                assert await redis_keys(cfg, f"{{{t}:s:shared-session}}:*"), f"no session keys for {t}"
            for t in ("acme", "globex"):
                members = await service.redis.smembers(service.store.k.session_traces(t, "shared-session"))
                assert members == {session_trace.encode()}, (t, members)
            assert len(await redis_keys(cfg, f"{{*:{session_trace}}}:s")) == 2
        print(f"\n[tenancy] {len(plan) + 2} expectations over tenants acme/globex/default on one trace id and one "
              f"session id; {len(await redis_keys(cfg))} Redis keys, each with its tenant; "
              f"{time.monotonic() - started:.1f}s")
    finally:
        await drop_stack(cfg)


async def _at_least(value: Awaitable[int], n: int) -> bool:
    return await value >= n


@pytest.mark.parametrize("output_format", ["protobuf", "json"])
async def test_score_records_are_keyed_by_tenant_and_id_and_say_their_tenant(
    kafka_bootstrap: str, redis_url: str, output_format: str
) -> None:
    """Two tenants may use one expectation id: their score records must stay two keys (a key-based
    view such as a compacted topic or a KTable kept only one), and carry their tenant and encoding."""
    cfg = make_config(kafka_bootstrap, redis_url, kafka={"output_format": output_format})
    try:
        async with running_service(cfg), control_client(cfg, tenant="acme") as acme, \
                control_client(cfg, tenant="globex") as globex:
            for client in (acme, globex):
                await client.expect(SessionScorable(session_id=f"s-{client.tenant}"), expects("search"),
                                    expectation_id="run-1", deadline=timedelta(seconds=1))
            await asyncio.gather(acme.wait_for("run-1", timeout=30), globex.wait_for("run-1", timeout=30))
        records = await read_all(kafka_bootstrap, cfg.kafka.topics.scores)
        want_type = "application/json" if output_format == "json" else "application/x-protobuf"
        got = sorted((r.key, header(r, "toolwitness-tenant"), header(r, "content-type")) for r in records)
        assert got == [(b"acme/run-1", "acme", want_type), (b"globex/run-1", "globex", want_type)]
        observations = await read_all(kafka_bootstrap, cfg.kafka.topics.observations)
        assert observations and all(header(r, "content-type") == want_type for r in observations)
    finally:
        await drop_stack(cfg)


async def test_the_otel_exporter_stamps_the_header_the_service_reads(kafka_bootstrap: str, redis_url: str) -> None:
    """A deployment that renamed ``tenant.header``: KafkaSpanExporter(tenant=...) wrote the
    hard-coded ``toolwitness-tenant`` header, so its spans went to the default tenant and the
    tenant's expectation never saw them. ``tenant_header`` names the configured header."""
    cfg = make_config(kafka_bootstrap, redis_url, tenant={"header": HEADER, "resource_attribute": ""})
    try:
        async with running_service(cfg), control_client(cfg, tenant="acme") as acme:
            agent = make_agent(cfg, tenant="acme")  # KafkaSpanExporter(tenant="acme", tenant_header=HEADER)
            try:
                trace = await asyncio.to_thread(agent.trace, "search")
                eid = await acme.expect(TraceScorable(trace_ids=(trace,)), expects("search"))
                await acme.mark_complete(trace, span_count=agent.counter.count(trace))
                assert verdict(await acme.wait_for(eid, timeout=30)) == "true"
            finally:
                await asyncio.to_thread(agent.close)
        records = await read_all(kafka_bootstrap, cfg.kafka.topics.spans)
        assert records and all(list(r.headers) == [(HEADER, b"acme")] for r in records)
    finally:
        await drop_stack(cfg)
