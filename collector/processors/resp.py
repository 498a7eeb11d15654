"""One round trip of Redis commands for the hot path: packed by hiredis, read back in one go.

The per-batch Redis work (apply spans, compare-and-set decisions, settle, mark published)
is hundreds of commands per batch. redis-py's pipeline packs each command in Python,
opens a timeout context per reply and checks ``SCRIPT EXISTS`` before every pipeline
that holds a script: about half of what this process spent on talking to Redis. Here a
``Commands`` is packed by hiredis as it is built, sent with one write (``send``), and its
replies are read under one deadline for the whole round trip (``InFlight.replies``), on a
connection borrowed from the client's own pool (so authentication, TLS and the database are
the client's). Several round trips can be in flight at once (each on its own connection):
Redis works on one while this process prepares the next. ``execute`` is send + replies.

Semantics kept from a non-transactional pipeline: replies come back in order, error
replies are returned in place (``raise_on_error`` raises the first after every reply is
read, so the connection stays in step), and an EVALSHA of a script the server no longer
has (a restarted or flushed Redis) loads the batch's scripts and sends exactly the
commands that were refused once more (they did not run; the others keep their replies:
the commands of one round trip are independent, as in a non-transactional pipeline). A
connection or timeout error closes the borrowed connection and raises redis-py's own error
type, which the service treats as retriable (the batch is replayed from its first offset).

**Redis Cluster** (a ``RedisCluster`` client): every command is routed by the slot of its
first key (every key of one trace, session or expectation shares a hash tag, and every
script touches one key), so a round trip becomes one write per primary, all in flight
together, and the replies are put back in the order the commands were added. A ``MOVED``
reply (resharding, failover) refreshes the client's slot map and re-sends exactly the
redirected commands; an ``ASK`` reply (a slot being migrated) re-sends them to the named
node behind ``ASKING``; ``TRYAGAIN`` / ``CLUSTERDOWN`` re-send after a short pause. At most
``REDIRECTS`` times, after which the error reply stays in place.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
from collections.abc import Awaitable, Callable, Sequence
from typing import Any, Protocol

import hiredis
from redis.asyncio import Redis, RedisCluster
from redis.asyncio.cluster import ClusterNode
from redis.commands.core import AsyncScript
from redis.crc import key_slot
from redis.exceptions import (
    AskError,
    ClusterDownError,
    MovedError,
    NoScriptError,
    RedisError,
    ResponseError,
    TryAgainError,
)
from redis.exceptions import TimeoutError as RedisTimeoutError

Arg = str | bytes | int | float
#: the service's Redis: one server (or a primary with replicas) or a Redis Cluster.
RedisClient = Redis | RedisCluster
#: how often one command follows MOVED / ASK / TRYAGAIN before its error reply is kept.
REDIRECTS = 5
#: pause before re-sending after TRYAGAIN or CLUSTERDOWN (a migration or a failover in progress).
RETRY_PAUSE_S = 0.05


def _pack(args: tuple[Arg, ...]) -> bytes:
    # hiredis's stub types the tuple as one element; it takes any number.
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]
    return packed


def _key_bytes(key: Arg) -> bytes:
    return key if isinstance(key, bytes) else str(key).encode()


class Commands:
    """Commands for one round trip, packed (RESP) as they are added.

    The first key of each command is kept for Redis Cluster routing: ``add`` takes it to be
    the first argument after the command name (true of every command this service sends
    with ``add``: GET, SET, HSET, PEXPIRE, ZADD, ...); ``evalsha`` takes the script's first key.
    """

    __slots__ = ("_keys", "_parts", "_scripts")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._keys: list[Arg | None] = []
        self._scripts: dict[str, AsyncScript] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, *args: Arg) -> None:
        self._parts.append(_pack(args))
        self._keys.append(args[1] if len(args) > 1 else None)

    def evalsha(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Arg]) -> None:
        sha = script.sha
        if not sha:
            raise RuntimeError("script used before it was loaded (TraceStateStore.start)")
        self._scripts[sha] = script
        self._parts.append(_pack(("EVALSHA", sha, len(keys), *keys, *args)))
        self._keys.append(keys[0] if keys else None)

    def packed(self) -> bytes:
        return b"".join(self._parts)

    def subset(self, indices: Sequence[int]) -> Commands:
        """The commands at ``indices`` (in that order), with the scripts they may need."""
        sub = Commands()
        sub._parts = [self._parts[i] for i in indices]
        sub._keys = [self._keys[i] for i in indices]
        sub._scripts = self._scripts
        return sub


class InFlight:
    """Commands written to a borrowed connection whose replies are not read yet (``send``)."""

    __slots__ = ("_commands", "_conn", "_deadline", "_redis", "_release", "_timeout")

    def __init__(
        self,
        redis: RedisClient,
        commands: Commands,
        conn: Any,
        timeout: float,
        release: Callable[[Any], Awaitable[None]],
    ) -> None:
        self._redis = redis
        self._commands = commands
        self._conn = conn
        self._timeout = timeout
        self._release = release
        self._deadline = asyncio.get_running_loop().time() + timeout

    async def _read(self, n: int) -> list[Any]:
        conn = self._conn
        replies: list[Any] = []
        try:
            try:
                async with asyncio.timeout_at(self._deadline):
                    for _ in range(n):
                        try:
                            # No per-reply timeout context (math.inf): the round trip has one deadline.
                            replies.append(await conn.read_response(timeout=math.inf))
                        except ResponseError as exc:  # an error reply, fully read: keep going
                            replies.append(exc)
            except TimeoutError:
                await conn.disconnect(nowait=True)
                raise RedisTimeoutError(f"Redis did not answer {n} command(s) within {self._timeout:g}s") from None
            except BaseException:
                await conn.disconnect(nowait=True)
                raise
            return replies
        finally:
            self._conn = None
            await self._release(conn)

    async def abandon(self) -> None:
        """Never read: close the connection (its replies would be out of step) and return it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)
            await self._release(conn)

    async def replies(self, *, raise_on_error: bool = True) -> list[Any]:
        """Read every reply, in order (the connection goes back to the pool).

        With ``raise_on_error`` the first error reply is raised (after all replies are read);
        otherwise errors are returned in place.
        """
        commands = self._commands
        replies = await self._read(len(commands))
        refused = [i for i, r in enumerate(replies) if isinstance(r, NoScriptError)]
        if refused and commands._scripts:
            for script in commands._scripts.values():
                await self._redis.script_load(script.script)
            retried = await execute(self._redis, commands.subset(refused), self._timeout, raise_on_error=False)
            for i, r in zip(refused, retried, strict=True):
                replies[i] = r
        if raise_on_error:
            raise_first(replies)
        return replies


def raise_first(replies: list[Any]) -> None:
    for r in replies:
        if isinstance(r, ResponseError):
            raise r


async def _send_on(
    redis: RedisClient, commands: Commands, conn: Any, timeout: float, release: Callable[[Any], Awaitable[None]]
) -> InFlight:
    try:
        async with asyncio.timeout(timeout):
            await conn.send_packed_command(commands.packed())
    except TimeoutError:
        await conn.disconnect(nowait=True)
        await release(conn)
        raise RedisTimeoutError(f"Redis did not take {len(commands)} command(s) within {timeout:g}s") from None
    except BaseException:
        await conn.disconnect(nowait=True)
        await release(conn)
        raise
    return InFlight(redis, commands, conn, timeout, release)


class _Reader(Protocol):
    async def replies(self, *, raise_on_error: bool = True) -> list[Any]: ...

    async def abandon(self) -> None: ...


Parts = list[tuple[list[int], _Reader]]  # (indices of the commands, their round trip)


class ClusterInFlight:
    """One round trip on a Redis Cluster: a write per node in flight, replies put back in order."""

    __slots__ = ("_commands", "_parts", "_redis", "_timeout")

    def __init__(self, redis: RedisCluster, commands: Commands, parts: Parts, timeout: float) -> None:
        self._redis = redis
        self._commands = commands
        self._parts = parts
        self._timeout = timeout

    async def abandon(self) -> None:
        for _, f in self._parts:
            await f.abandon()

    async def replies(self, *, raise_on_error: bool = True) -> list[Any]:
        commands = self._commands
        replies: list[Any] = [None] * len(commands)
        await self._read_into(replies, self._parts)
        for _ in range(REDIRECTS):
            moved = [i for i, r in enumerate(replies) if isinstance(r, MovedError | TryAgainError | ClusterDownError)]
            asked = [i for i, r in enumerate(replies) if type(r) is AskError]
            if not moved and not asked:
                break
            if moved:
                if any(not isinstance(replies[i], MovedError) for i in moved):
                    await asyncio.sleep(RETRY_PAUSE_S)  # a migration step or a failover under way
                # The slot map changed (or is changing): learn it again, then route afresh.
                await self._redis.nodes_manager.initialize()
            again: Parts = []
            try:
                again.extend(await _route(self._redis, commands, moved, self._timeout))
                for i in asked:
                    again.append(([i], await _ask(self._redis, commands, i, replies[i], self._timeout)))
            except BaseException:
                for _, f in again:
                    await f.abandon()
                raise
            await self._read_into(replies, again)
        if raise_on_error:
            raise_first(replies)
        return replies

    async def _read_into(self, replies: list[Any], parts: Parts) -> None:
        """Read every part to its end (or close its connection), then put each reply in place."""
        results = await asyncio.gather(*(f.replies(raise_on_error=False) for _, f in parts), return_exceptions=True)
        for res in results:
            if isinstance(res, BaseException):
                if isinstance(res, RedisError):
                    # A node went away or did not answer: route the next round trip on a fresh map.
                    with contextlib.suppress(RedisError, OSError, TimeoutError):
                        await asyncio.wait_for(self._redis.nodes_manager.initialize(), self._timeout)
                raise res
        for (indices, _), res in zip(parts, results, strict=True):
            assert isinstance(res, list)
            for i, r in zip(indices, res, strict=True):
                replies[i] = r


def _node_release(node: ClusterNode) -> Callable[[Any], Awaitable[None]]:
    async def release(conn: Any) -> None:
        node.release(conn)

    return release


async def _route(redis: RedisCluster, commands: Commands, indices: Sequence[int], timeout: float) -> Parts:
    """Send the commands at ``indices``, one write per primary owning their keys' slots."""
    if not redis.nodes_manager.slots_cache:
        await redis.initialize()
    by_node: dict[str, tuple[ClusterNode, list[int]]] = {}
    keys = commands._keys
    for i in indices:
        key = keys[i]
        node = (
            redis.nodes_manager.get_node_from_slot(key_slot(_key_bytes(key)))
            if key is not None
            else redis.get_default_node()
        )
        by_node.setdefault(node.name, (node, []))[1].append(i)
    sent: Parts = []
    try:
        for node, idx in by_node.values():
            sub = commands.subset(idx) if len(idx) != len(commands) else commands
            sent.append((idx, await _send_on(redis, sub, node.acquire_connection(), timeout, _node_release(node))))
    except BaseException:
        for _, f in sent:
            await f.abandon()
        raise
    return sent


async def _ask(redis: RedisCluster, commands: Commands, i: int, err: AskError, timeout: float) -> _Reader:
    """Command ``i`` sent to the node an ASK reply named, behind ASKING (its reply is dropped)."""
    node = redis.nodes_manager.get_node(err.host, err.port)
    if node is None:
        await redis.nodes_manager.initialize()
        node = redis.nodes_manager.get_node(err.host, err.port)
        if node is None:
            raise ClusterDownError(f"ASK to {err.node_addr}, a node the cluster does not list")
    asking = Commands()
    asking.add("ASKING")
    asking._parts.append(commands._parts[i])
    asking._keys.append(commands._keys[i])
    asking._scripts = commands._scripts
    inner = await _send_on(redis, asking, node.acquire_connection(), timeout, _node_release(node))
    return _Asked(inner)


class _Asked:
    """An ASKING + command round trip that reads as the command's reply alone."""

    __slots__ = ("_inner",)

    def __init__(self, inner: InFlight) -> None:
        self._inner = inner

    async def abandon(self) -> None:
        await self._inner.abandon()

    async def replies(self, *, raise_on_error: bool = True) -> list[Any]:
        return (await self._inner.replies(raise_on_error=raise_on_error))[1:]


Pending = InFlight | ClusterInFlight


async def send(redis: RedisClient, commands: Commands, timeout: float) -> Pending:
    """Write ``commands`` in one write on a connection borrowed from the pool (one per primary on
    a cluster); read them later with ``replies`` (Redis works on them meanwhile). ``timeout``
    (seconds, from now) bounds the whole round trip."""
    if isinstance(redis, RedisCluster):
        parts = await _route(redis, commands, range(len(commands)), timeout)
        return ClusterInFlight(redis, commands, parts, timeout)
    pool = redis.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    return await _send_on(redis, commands, conn, timeout, pool.release)


async def execute(redis: RedisClient, commands: Commands, timeout: float, *, raise_on_error: bool = True) -> list[Any]:
    """Send ``commands`` in one write and return their replies in order (``send`` + ``replies``)."""
    if not len(commands):
        return []
    return await (await send(redis, commands, timeout)).replies(raise_on_error=raise_on_error)
