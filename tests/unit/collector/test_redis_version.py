"""A Redis older than 7.0 is refused at start with one line that says so (the state scripts use
PEXPIRETIME and PEXPIRE ... GT, which such a server refuses as unknown commands / syntax)."""

from __future__ import annotations

from typing import Any

import pytest
from redis.exceptions import ResponseError

from collector.cli import _start_failure
from collector.config import ServiceConfig
from collector.processors.trace_state import RedisVersionError, TraceStateStore


class _OldRedis:
    """Answers PEXPIRETIME as Redis 6.2 does; nothing else is expected before it."""

    def __init__(self) -> None:
        self.calls: list[tuple[Any, ...]] = []

    async def execute_command(self, *args: Any) -> Any:
        self.calls.append(args)
        raise ResponseError(f"unknown command '{args[0]}', with args beginning with: '{args[1]}' ")


async def test_a_redis_without_pexpiretime_is_refused_at_start_naming_the_version() -> None:
    cfg = ServiceConfig()
    old = _OldRedis()
    store = TraceStateStore(old, cfg)  # type: ignore[arg-type]
    with pytest.raises(RedisVersionError, match=r"needs Redis 7\.0 or later.*unknown command 'PEXPIRETIME'") as info:
        await store.start()
    assert old.calls and old.calls[0][0] == "PEXPIRETIME"
    line = _start_failure(cfg, info.value)
    assert line.startswith("Redis at redis.url 'redis://") and "Redis 7.0 or later" in line


async def test_another_redis_error_at_the_version_probe_is_not_called_a_version_problem() -> None:
    class _Denied(_OldRedis):
        async def execute_command(self, *args: Any) -> Any:
            raise ResponseError("NOPERM this user has no permissions to run the 'pexpiretime' command")

    with pytest.raises(ResponseError, match="NOPERM") as info:
        await TraceStateStore(_Denied(), ServiceConfig()).start()  # type: ignore[arg-type]
    assert not isinstance(info.value, RedisVersionError)
