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
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Sequence
from typing import Any

import hiredis
from redis.asyncio import Redis
from redis.commands.core import AsyncScript
from redis.exceptions import NoScriptError, ResponseError
from redis.exceptions import TimeoutError as RedisTimeoutError

Arg = str | bytes | int | float


def _pack(args: tuple[Arg, ...]) -> bytes:
    # hiredis's stub types the tuple as one element; it takes any number.
    packed: bytes = hiredis.pack_command(args)  # type: ignore[arg-type]
    return packed


class Commands:
    """Commands for one round trip, packed (RESP) as they are added."""

    __slots__ = ("_parts", "_scripts")

    def __init__(self) -> None:
        self._parts: list[bytes] = []
        self._scripts: dict[str, AsyncScript] = {}

    def __len__(self) -> int:
        return len(self._parts)

    def add(self, *args: Arg) -> None:
        self._parts.append(_pack(args))

    def evalsha(self, script: AsyncScript, keys: Sequence[str], args: Sequence[Arg]) -> None:
        sha = script.sha
        if not sha:
            raise RuntimeError("script used before it was loaded (TraceStateStore.start)")
        self._scripts[sha] = script
        self._parts.append(_pack(("EVALSHA", sha, len(keys), *keys, *args)))

    def packed(self) -> bytes:
        return b"".join(self._parts)


class InFlight:
    """Commands written to a borrowed connection whose replies are not read yet (``send``)."""

    __slots__ = ("_commands", "_conn", "_deadline", "_redis", "_timeout")

    def __init__(self, redis: Redis, commands: Commands, conn: Any, timeout: float) -> None:
        self._redis = redis
        self._commands = commands
        self._conn = conn
        self._timeout = timeout
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
            await self._redis.connection_pool.release(conn)

    async def abandon(self) -> None:
        """Never read: close the connection (its replies would be out of step) and return it."""
        conn, self._conn = self._conn, None
        if conn is not None:
            await conn.disconnect(nowait=True)
            await self._redis.connection_pool.release(conn)

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
            again = Commands()
            again._parts = [commands._parts[i] for i in refused]
            retried = await execute(self._redis, again, self._timeout, raise_on_error=False)
            for i, r in zip(refused, retried, strict=True):
                replies[i] = r
        if raise_on_error:
            for r in replies:
                if isinstance(r, ResponseError):
                    raise r
        return replies


async def send(redis: Redis, commands: Commands, timeout: float) -> InFlight:
    """Write ``commands`` in one write on a connection borrowed from the pool; read them later
    with ``InFlight.replies`` (Redis works on them meanwhile). ``timeout`` (seconds, from now)
    bounds the whole round trip."""
    pool = redis.connection_pool
    conn = await pool.get_connection()  # type: ignore[no-untyped-call]
    try:
        async with asyncio.timeout(timeout):
            await conn.send_packed_command(commands.packed())
    except TimeoutError:
        await conn.disconnect(nowait=True)
        await pool.release(conn)
        raise RedisTimeoutError(f"Redis did not take {len(commands)} command(s) within {timeout:g}s") from None
    except BaseException:
        await conn.disconnect(nowait=True)
        await pool.release(conn)
        raise
    return InFlight(redis, commands, conn, timeout)


async def execute(redis: Redis, commands: Commands, timeout: float, *, raise_on_error: bool = True) -> list[Any]:
    """Send ``commands`` in one write and return their replies in order (``send`` + ``replies``)."""
    if not len(commands):
        return []
    return await (await send(redis, commands, timeout)).replies(raise_on_error=raise_on_error)
