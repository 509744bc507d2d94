"""Real stores for the store tests: SQLite files, the Redis server on 127.0.0.1:6379,
and Redis servers a test starts on its own ports (``redis_servers``).

Each Redis test gets its own key prefix, and its keys are deleted afterwards.
The Redis client is asyncio-based, so Redis runs on asyncio only; SQLite runs
on asyncio and trio.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis

from tests.stores.servers import RedisServer

REDIS_URL = "redis://127.0.0.1:6379/0"

KINDS = [
    pytest.param(("sqlite", "asyncio"), id="sqlite-asyncio"),
    pytest.param(("sqlite", "trio"), id="sqlite-trio"),
    pytest.param(("redis", "asyncio"), id="redis-asyncio"),
]


@pytest.fixture
def redis_prefix() -> Iterator[str]:
    """A key prefix unique to the test; its keys are deleted when the test ends."""
    prefix = f"tltest:{uuid.uuid4().hex[:12]}:"
    yield prefix
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*", count=1000))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    """(store, event loop): SQLite on both loops, Redis on asyncio."""
    value: tuple[str, str] = request.param
    return value


@pytest.fixture
def anyio_backend(kind: tuple[str, str]) -> str:
    return kind[1]


@pytest.fixture
def store_url(kind: tuple[str, str], tmp_path: Path, redis_prefix: str) -> str:
    """A URL of an empty store of the test's kind."""
    if kind[0] == "sqlite":
        return f"sqlite:{tmp_path / 'contexts.db'}"
    return f"{REDIS_URL}?prefix={redis_prefix}"


@pytest.fixture
def redis_servers(tmp_path: Path) -> Iterator[Callable[..., RedisServer]]:
    """Start Redis servers of the test's own: ``start(*args, appendonly=False)``; all stop after."""
    started: list[RedisServer] = []

    def start(*args: str, appendonly: bool = False) -> RedisServer:
        server = RedisServer(tmp_path / f"redis{len(started)}", *args, appendonly=appendonly)
        started.append(server)
        return server.start()

    try:
        yield start
    finally:
        for server in started:
            server.stop()
