"""``collector.processors.resp``: the hot path's own round trips, against the real Redis."""

from __future__ import annotations

import pytest
from redis.asyncio import Redis
from redis.exceptions import ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

from collector.processors.resp import Commands, execute, send

_ECHO_LUA = "redis.call('INCR', KEYS[1]); return ARGV[1] .. ':' .. redis.call('GET', KEYS[1])"


async def test_replies_come_back_in_order_with_their_types(redis_client: Redis, redis_key_prefix: str) -> None:
    k = redis_key_prefix
    cmds = Commands()
    cmds.add("SET", k + "a", b"\x00\xffbytes")
    cmds.add("GET", k + "a")
    cmds.add("INCRBY", k + "n", 41)
    cmds.add("ZADD", k + "z", 1.5, "m1", 2, "m2")
    cmds.add("ZRANGE", k + "z", 0, -1)
    cmds.add("GET", k + "missing")
    assert await execute(redis_client, cmds, 5.0) == [b"OK", b"\x00\xffbytes", 41, 2, [b"m1", b"m2"], None]


async def test_an_error_reply_is_raised_after_every_reply_is_read(redis_client: Redis, redis_key_prefix: str) -> None:
    k = redis_key_prefix
    await redis_client.set(k + "s", "text")
    cmds = Commands()
    cmds.add("INCR", k + "counter")
    cmds.add("INCR", k + "s")  # WRONGTYPE-ish: not an integer
    cmds.add("INCR", k + "counter")
    with pytest.raises(ResponseError, match="not an integer"):
        await execute(redis_client, cmds, 5.0)
    # every command ran (no pipeline abort) and the connection is still in step
    assert int(await redis_client.get(k + "counter")) == 2
    replies = await execute(redis_client, cmds, 5.0, raise_on_error=False)
    assert replies[0] == 3 and isinstance(replies[1], ResponseError) and replies[2] == 4
    again = Commands()
    again.add("GET", k + "counter")
    assert await execute(redis_client, again, 5.0) == [b"4"]


async def test_a_flushed_script_is_loaded_and_only_the_refused_commands_are_sent_again(
    redis_client: Redis, redis_key_prefix: str
) -> None:
    k = redis_key_prefix
    script = redis_client.register_script(_ECHO_LUA)
    script.sha = await redis_client.script_load(_ECHO_LUA)
    await redis_client.script_flush()  # as after a Redis restart without persistence of scripts
    cmds = Commands()
    cmds.add("INCR", k + "plain")
    cmds.evalsha(script, [k + "a"], ["first"])
    cmds.evalsha(script, [k + "a"], ["second"])
    assert await execute(redis_client, cmds, 5.0) == [1, b"first:1", b"second:2"]
    assert int(await redis_client.get(k + "plain")) == 1  # ran once, not re-sent
    assert await redis_client.script_exists(script.sha) == [True]


async def test_a_round_trip_past_its_deadline_raises_and_the_pool_recovers(
    redis_client: Redis, redis_key_prefix: str
) -> None:
    cmds = Commands()
    cmds.add("BLPOP", redis_key_prefix + "empty", 5)  # Redis holds the reply for 5 s
    with pytest.raises(RedisTimeoutError, match="did not answer 1 command"):
        await execute(redis_client, cmds, 0.2)
    ping = Commands()
    ping.add("PING")
    assert await execute(redis_client, ping, 5.0) == [b"PONG"]  # the timed-out connection was closed


async def test_several_round_trips_in_flight_and_an_abandoned_one(redis_client: Redis, redis_key_prefix: str) -> None:
    k = redis_key_prefix
    inflight = []
    for i in range(3):
        cmds = Commands()
        cmds.add("RPUSH", k + "order", i)
        cmds.add("LLEN", k + "order")
        inflight.append(await send(redis_client, cmds, 5.0))
    lost = Commands()
    lost.add("SET", k + "lost", 1)
    abandoned = await send(redis_client, lost, 5.0)
    await abandoned.abandon()
    assert [await f.replies() for f in inflight] == [[1, 1], [2, 2], [3, 3]]
    assert await redis_client.lrange(k + "order", 0, -1) == [b"0", b"1", b"2"]
    assert redis_client.connection_pool._in_use_connections == set()  # every connection went back


async def test_a_script_used_before_it_is_loaded_is_refused_clearly(redis_client: Redis) -> None:
    script = redis_client.register_script("return 1")
    script.sha = ""
    with pytest.raises(RuntimeError, match="before it was loaded"):
        Commands().evalsha(script, [], [])
