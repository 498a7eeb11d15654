"""The service on a real three-primary Redis Cluster (``redis.cluster: true``).

Every key of a trace, session or expectation shares a hash tag and every script touches one
key, so the hot path's round trips are routed per slot (``collector.processors.resp``): these
tests check that it scores correctly with its keys spread over every primary, that it follows
a slot being migrated (ASK) and moved (MOVED), that a script flushed from one node is loaded
again, and that a data loss on ONE shard is noticed (per-primary epoch canaries).
"""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path

import pytest
from redis.asyncio import RedisCluster
from redis.crc import key_slot

from collector.config import ServiceConfig
from collector.pipeline.recovery import Recovery
from collector.pipeline.service import redis_client
from collector.processors.resp import Commands, execute
from collector.processors.trace_state import TraceStateStore
from scoring.models import TraceScorable
from tests.integration.harness import (
    control_client,
    expects,
    make_agent,
    make_config,
    running_service,
    settled,
    verdict,
)
from tests.integration.redis_cluster import RedisClusterNodes

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    nodes = RedisClusterNodes(Path(tmp_path_factory.mktemp("redis-cluster")))
    try:
        nodes.start()
        yield nodes
    finally:
        nodes.stop()


@pytest.fixture
async def client(cluster: RedisClusterNodes) -> AsyncIterator[RedisCluster]:
    cfg = ServiceConfig.model_validate({"redis": {"url": cluster.url, "cluster": True}})
    rc = redis_client(cfg.redis, None)
    assert isinstance(rc, RedisCluster)
    await rc.initialize()
    try:
        yield rc
    finally:
        await rc.aclose()


def _slot_owner_ports(cluster: RedisClusterNodes, keys: list[str]) -> set[int]:
    return {cluster.owner(key_slot(k.encode())) for k in keys}


async def test_seed_000_scored_with_keys_on_every_primary(kafka_bootstrap: str, cluster: RedisClusterNodes) -> None:
    cfg = make_config(kafka_bootstrap, cluster.url, redis={"cluster": True})
    agent = make_agent(cfg)
    async with running_service(cfg) as service, control_client(cfg) as tw:
        assert isinstance(service.redis, RedisCluster)
        k = service.store.k
        # The test proves routing only if the evidence really lives on every primary: traces (random
        # ids) are added until every primary holds some.
        traces = [agent.trace("my_tool_call") for _ in range(9)]
        while _slot_owner_ports(cluster, [k.state("default", t) for t in traces]) != set(cluster.ports):
            assert len(traces) < 100
            traces.append(agent.trace("my_tool_call"))
        neg_ids = _ids_on_every_primary(cluster, k.expectation, len(traces))

        positives = {t: await tw.expect(TraceScorable(trace_ids=(t,)), expects("my_tool_call")) for t in traces}
        for t, pos in positives.items():  # TRUE before any marker
            ev = await tw.wait_for(pos, timeout=30)
            assert verdict(ev) == "true", (t, ev.rationale)
            assert not ev.coverage.complete

        negatives = {
            t: await tw.expect(TraceScorable(trace_ids=(t,)), expects("summarize"), expectation_id=i)
            for t, i in zip(traces, neg_ids, strict=True)
        }
        for neg in negatives.values():
            await settled(service, "default", neg)
            assert tw.events(neg) == []  # absence is not FALSE before the marker
        exp_keys = [k.expectation("default", e) for e in negatives.values()]
        assert _slot_owner_ports(cluster, exp_keys) == set(cluster.ports)
        # Expectations read back by id across slots (a cross-slot MGET would be refused here).
        loaded = await service.store.load_expectations("default", list(negatives.values()))
        assert set(loaded) == set(negatives.values())

        for t in traces:
            await tw.mark_complete(t, span_count=agent.counter.count(t))
        for t, neg in negatives.items():
            ev = await tw.wait_for(neg, timeout=30)
            assert verdict(ev) == "false", (t, ev.rationale)
            assert ev.coverage.complete and ev.trigger == "marker" and ev.version == 1
        for ident in [*positives.values(), *negatives.values()]:
            assert len({e.score_id for e in tw.events(ident)}) == 1
    agent.close()


def _ids_on_every_primary(cluster: RedisClusterNodes, key_of: Callable[[str, str], str], n: int) -> list[str]:
    """``n`` expectation ids whose keys cover every primary (the first ones, one per primary)."""
    firsts: dict[int, str] = {}
    while len(firsts) < len(cluster.ports):
        i = uuid.uuid4().hex
        firsts.setdefault(cluster.owner(key_slot(key_of("default", i).encode())), i)
    ids = list(firsts.values())
    return ids + [uuid.uuid4().hex for _ in range(n - len(ids))]


def _key_in_slot_of(port: int, cluster: RedisClusterNodes, prefix: str) -> str:
    i = 0
    while cluster.owner(key_slot(f"{prefix}{i}".encode())) != port:
        i += 1
    return f"tc:{{{prefix}{i}}}:s"


async def test_round_trips_follow_ask_then_moved(cluster: RedisClusterNodes, client: RedisCluster) -> None:
    src, dst = cluster.ports[0], cluster.ports[1]
    run = uuid.uuid4().hex[:8]
    key = _key_in_slot_of(src, cluster, f"mig-{run}-")
    slot = key_slot(key[key.index("{") + 1 : key.index("}")].encode())
    other = _key_in_slot_of(cluster.ports[2], cluster, f"stay-{run}-")
    cmds = Commands()
    cmds.add("SET", key, b"v1")
    cmds.add("SET", other, b"w1")
    assert await execute(client, cmds, 5.0) == [b"OK", b"OK"]

    # Migrating: the key already moved, the client's slot map still names the source.
    s, d = cluster.node(src), cluster.node(dst)
    d.execute_command("CLUSTER", "SETSLOT", slot, "IMPORTING", cluster.node_id(src))
    s.execute_command("CLUSTER", "SETSLOT", slot, "MIGRATING", cluster.node_id(dst))
    s.execute_command("MIGRATE", "127.0.0.1", dst, "", 0, 5000, "KEYS", key)
    assert s.execute_command("CLUSTER", "COUNTKEYSINSLOT", slot) == 0
    cmds = Commands()
    cmds.add("GET", key)  # source answers ASK: re-sent to the target behind ASKING
    cmds.add("GET", other)
    assert await execute(client, cmds, 5.0) == [b"v1", b"w1"]
    assert client.nodes_manager.get_node_from_slot(slot).port == src  # ASK does not change the map

    # Moved for good: the source answers MOVED; the map is learnt again and the command re-sent.
    for port in cluster.ports:
        cluster.node(port).execute_command("CLUSTER", "SETSLOT", slot, "NODE", cluster.node_id(dst))
    cmds = Commands()
    cmds.add("SET", key, b"v2")
    cmds.add("GET", key)
    assert await execute(client, cmds, 5.0) == [b"OK", b"v2"]
    assert client.nodes_manager.get_node_from_slot(slot).port == dst
    assert d.get(key) == b"v2"


async def test_flushed_script_is_loaded_again_on_its_node(cluster: RedisClusterNodes, client: RedisCluster) -> None:
    script = client.register_script("return redis.call('INCR', KEYS[1])")
    script.sha = await client.script_load(script.script)
    run = uuid.uuid4().hex[:8]
    keys = [_key_in_slot_of(p, cluster, f"scr-{run}-") for p in cluster.ports]
    cluster.node(cluster.ports[1]).script_flush()
    cmds = Commands()
    for k in keys:
        cmds.evalsha(script, [k], [])
    assert await execute(client, cmds, 5.0) == [1, 1, 1]
    assert cluster.node(cluster.ports[1]).script_exists(script.sha) == [True]


async def test_data_loss_on_one_shard_is_noticed(kafka_bootstrap: str, cluster: RedisClusterNodes) -> None:
    cfg = make_config(kafka_bootstrap, cluster.url, redis={"cluster": True})
    rc = redis_client(cfg.redis, None)
    try:
        store = TraceStateStore(rc, cfg)
        await store.start()
        recovery = Recovery(cfg, store)
        await recovery.start()
        canaries = recovery.canary_keys()
        assert _slot_owner_ports(cluster, canaries) == set(cluster.ports)  # one per primary
        # asked every sweep: the slot map is walked again only when the topology changed
        plan = recovery._canary_plan
        assert recovery.canary_keys() == canaries and recovery._canary_plan is plan
        slots = rc.nodes_manager.slots_cache
        first_slot, first_node = plan[0][1], plan[0][2]
        other = next(nodes for nodes in slots.values() if nodes[0].name != first_node)
        saved = slots[first_slot]
        slots[first_slot] = other  # the client learnt (MOVED) that another primary serves it now
        try:
            moved = recovery.canary_keys()
            assert recovery._canary_plan is not plan and moved != canaries
        finally:
            slots[first_slot] = saved
        # still one canary per primary, each in a slot it serves (the moved plan stays valid)
        assert _slot_owner_ports(cluster, recovery.canary_keys()) == set(cluster.ports)
        assert not await recovery.check()
        # Lose the data of a shard that does NOT hold the main epoch key.
        main = cluster.owner(key_slot(store.k.epoch.encode()))
        victim = next(p for p in cluster.ports if p != main)
        cluster.node(victim).flushall()
        assert await recovery.check()
        await recovery.recover(None)
        assert not await recovery.check()  # a new epoch, on every canary
        assert recovery.lost_at_ms > 0
    finally:
        await rc.aclose()


async def test_traces_in_state_are_counted_with_the_counts_on_other_shards_than_the_states(
    cluster: RedisClusterNodes, client: RedisCluster
) -> None:
    """Each trace script touches only its trace's slot and returns the expiry moves; the per-tenant
    counts (their own slots) are moved by separate commands of the same round trips: no CROSSSLOT."""
    run = uuid.uuid4().hex[:8]
    cfg = ServiceConfig.model_validate(
        {"redis": {"url": cluster.url, "cluster": True, "key_prefix": f"tc{run}", "state_ttl_seconds": 60}}
    )
    store = TraceStateStore(client, cfg)
    await store.start()
    k = store.k
    tenants: list[str] = []  # until their counts live on every primary
    while not tenants or _slot_owner_ports(cluster, [k.live(t) for t in tenants]) != set(cluster.ports):
        assert len(tenants) < 100
        tenants.append(f"t{len(tenants)}-{run}")
    traces = {t: [uuid.uuid4().hex for _ in range(i % 4 + 1)] for i, t in enumerate(tenants)}
    fact = {"i": "s1", "p": "", "r": 0, "e": 1, "f": [], "x": False, "s": ""}
    groups = {(t, tr): [fact] for t, trs in traces.items() for tr in trs}
    try:
        await store.apply(groups, 0)
        # the next batch takes the moves along (its first round trip), then renews nothing: a replay
        await store.apply(dict(list(groups.items())[:1]), 0)
        assert not store._moves
        assert await store.count_traces() == {t: len(trs) for t, trs in traces.items()}
        await store.reclaim([(tenants[-1], traces[tenants[-1]][0])])  # a shorter life: moved, not lost
        assert await store.count_traces() == {t: len(trs) for t, trs in traces.items()}
    finally:
        for key in [k.live(t) for t in tenants] + [k.live_tenants]:
            await client.delete(key)
        for t, tr in groups:
            await client.delete(k.state(t, tr))
