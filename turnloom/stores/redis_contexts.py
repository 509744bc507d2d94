"""The fleet context store: a Redis server shared by every host (``redis`` asyncio client).

Keys, under a prefix (default ``"turnloom:"``): ``<prefix>ctx:<id>:log`` (a
list of records), ``<prefix>ctx:<id>:lease`` (``"<token> <owner>"`` with a
``PX`` expiry), ``<prefix>ctx:<id>:fence`` (the token counter; it outlives
the context by a day after :meth:`~RedisContextStore.forget`, far longer than
any lease, so a token is never issued twice while a holder may live) and
``<prefix>used`` (a sorted set: context id by the server time of its last
write, in milliseconds). Every check-and-write runs as one Lua
script on the server, so a write with a stale token is refused by Redis
itself; lease expiry uses the server's clock, so hosts' clocks do not matter.
A batch of appends to many contexts is one pipelined round trip.

Durability: an append that returned is in the server's memory and survives
any crash of the client processes. Whether it survives a crash or restart
of the Redis server is the server's configuration: with ``appendonly yes``
and ``appendfsync always`` it does; with ``appendfsync everysec`` up to a
second of writes can be lost; with persistence off (as on the machines
that run this project's tests) a server restart loses every log.

Connection failures are retried by the client (``retries`` times with
exponential backoff capped at ``backoff_cap`` seconds), then raised as
:class:`~turnloom.errors.StoreUnavailableError`. Retried appends never
duplicate (see the protocol's idempotent appends).

The ``redis`` asyncio client runs on asyncio only: using this store from trio
raises :class:`~turnloom.errors.StoreError`.
"""

from __future__ import annotations

__all__ = ("RedisContextStore",)

from collections.abc import Mapping, Sequence
from typing import Any, Self, TypeAlias

import sniffio

from turnloom.errors import (
    InputError,
    LeaseHeldError,
    MissingDependencyError,
    StoreError,
    StoreUnavailableError,
    excerpt,
)

# (context_id, token, start, records): see turnloom.runtime.store.LogWrite.
_LogWrite: TypeAlias = tuple[str, int, int, tuple[bytes, ...]]

_ACQUIRE = """
local current = redis.call('GET', KEYS[1])
if current then
  local holder = string.sub(current, string.find(current, ' ', 1, true) + 1)
  if holder ~= ARGV[1] then
    return {0, holder, redis.call('PTTL', KEYS[1])}
  end
end
local token = redis.call('INCR', KEYS[2])
redis.call('PERSIST', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {token, '', 0}
"""

# KEYS: lease. ARGV: token, ttl ms. 1 when extended, 0 when not held with token.
_RENEW = """
local current = redis.call('GET', KEYS[1])
if current and string.match(current, '^%d+') == ARGV[1] then
  redis.call('PEXPIRE', KEYS[1], ARGV[2])
  return 1
end
return 0
"""

_RELEASE = """
local current = redis.call('GET', KEYS[1])
if current and string.match(current, '^%d+') == ARGV[1] then
  redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease, log, used. ARGV: token, start, context id, records...
# Returns the log's new length, -1 when refused, -2 for a gap.
_APPEND = """
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then
  return -1
end
local length = redis.call('LLEN', KEYS[2])
local start = tonumber(ARGV[2])
if start > length then
  return -2
end
for i = 4 + length - start, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[3], now[1] * 1000 + math.floor(now[2] / 1000), ARGV[3])
return redis.call('LLEN', KEYS[2])
"""

# KEYS: lease, log, used. ARGV: token, expected length, context id, records...
_REPLACE = """
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then
  return 0
end
if redis.call('LLEN', KEYS[2]) ~= tonumber(ARGV[2]) then
  return 0
end
redis.call('DEL', KEYS[2])
for i = 4, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[3], now[1] * 1000 + math.floor(now[2] / 1000), ARGV[3])
return 1
"""

# KEYS: lease, log, used, fence. ARGV: token, context id.
_FORGET = """
local current = redis.call('GET', KEYS[1])
if not current or string.match(current, '^%d+') ~= ARGV[1] then
  return 0
end
redis.call('PEXPIRE', KEYS[4], 86400000)
redis.call('DEL', KEYS[2])
redis.call('ZREM', KEYS[3], ARGV[2])
return 1
"""


def _library() -> str:
    try:
        return sniffio.current_async_library()
    except sniffio.AsyncLibraryNotFoundError:
        return ""


class RedisContextStore:
    """A :class:`~turnloom.runtime.store.ContextStore` on a Redis server.

    Args:
        url: a ``redis://`` or ``rediss://`` URL (``redis://127.0.0.1:6379/0``).
        prefix: prepended to every key (default ``"turnloom:"``), so several
            deployments or tests can share one database.
        retries: how many times a failed command is retried after a
            connection error (default 3).
        backoff_cap: the longest wait between two retries, in seconds
            (default 0.5); waits start at 0.05 s and double.
        max_connections: the most connections open at once (default 32);
            more concurrent calls wait for a free one.

    Raises:
        InputError: not a ``redis://``/``rediss://``/``unix://`` URL, an empty
            prefix, a negative retry count or a non-positive connection bound.
        MissingDependencyError: the ``redis`` package is not installed (extra
            ``redis``).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "turnloom:",
        retries: int = 3,
        backoff_cap: float = 0.5,
        max_connections: int = 32,
    ) -> None:
        if not isinstance(url, str) or not url.startswith(("redis://", "rediss://", "unix://")):
            raise InputError(f"A Redis store needs a redis:// URL, not {excerpt(url)}.")
        if not isinstance(prefix, str) or not prefix:
            raise InputError("A Redis store's key prefix must be a non-empty str.")
        if not isinstance(max_connections, int) or max_connections < 1:
            raise InputError(
                f"max_connections must be a positive integer, not {max_connections!r}."
            )
        if not isinstance(retries, int) or retries < 0:
            raise InputError(f"retries must be a non-negative integer, not {retries!r}.")
        try:
            import redis.asyncio
            from redis.asyncio.retry import Retry
            from redis.backoff import ExponentialBackoff
        except ImportError as exc:
            raise MissingDependencyError(
                "The Redis context store needs the 'redis' package: pip install 'turnloom[redis]'.",
                package="redis",
                extra="redis",
            ) from exc
        import redis.exceptions

        self._url = url
        self._prefix = prefix
        self._errors: tuple[type[BaseException], ...] = (
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
        )
        self._response_error = redis.exceptions.ResponseError
        retry = Retry(ExponentialBackoff(cap=backoff_cap, base=0.05), retries)
        # A bounded pool that waits for a free connection: a thousand sessions
        # claiming at once queue for connections rather than opening one each.
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=None,
            retry=retry,
            retry_on_error=list(self._errors),
        )
        self._pool: Any = pool
        self._client: Any = redis.asyncio.Redis(
            connection_pool=pool, retry=retry, retry_on_error=list(self._errors)
        )
        self._acquire = self._client.register_script(_ACQUIRE)
        self._renew = self._client.register_script(_RENEW)
        self._release = self._client.register_script(_RELEASE)
        self._append = self._client.register_script(_APPEND)
        self._forget = self._client.register_script(_FORGET)
        self._replace = self._client.register_script(_REPLACE)
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisContextStore({self._url!r}, prefix={self._prefix!r})"

    def _key(self, context_id: str, what: str) -> str:
        return f"{self._prefix}ctx:{context_id}:{what}"

    def _check(self) -> None:
        if self._closed:
            raise StoreError(f"{self!r} is closed.")
        library = _library()
        if library != "asyncio":
            raise StoreError(
                f"{self!r} runs on asyncio only (the redis client is asyncio-based), not "
                f"{library or 'no event loop'!r}: run the host on asyncio, or use a "
                "sqlite: store on trio."
            )

    async def _call(self, coroutine: Any) -> Any:
        try:
            return await coroutine
        except self._errors as exc:
            raise StoreUnavailableError(f"{self!r} is unreachable: {exc}") from exc

    async def _pipeline(self, calls: Sequence[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        async with self._client.pipeline(transaction=False) as pipe:
            for script, keys, args in calls:
                await script(keys=keys, args=args, client=pipe)
            result: list[Any] = await self._call(pipe.execute())
            return result

    # -- the protocol -------------------------------------------------------------

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        """See :meth:`ContextStore.acquire` (server clock, ``PX`` expiry)."""
        self._check()
        keys = [self._key(context_id, "lease"), self._key(context_id, "fence")]
        token, holder, left = await self._call(
            self._acquire(keys=keys, args=[owner, max(1, round(ttl * 1000))])
        )
        if not token:
            raise LeaseHeldError(
                f"Context {context_id!r} is leased by {holder.decode()!r} for another "
                f"{left / 1000:.3f} seconds.",
                context_id=context_id,
            )
        return int(token)

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        """See :meth:`ContextStore.renew`: one pipelined round trip."""
        self._check()
        if not leases:
            return frozenset()
        ttl_ms = max(1, round(ttl * 1000))
        ids = tuple(leases)
        replies = await self._pipeline(
            [(self._renew, [self._key(c, "lease")], [leases[c], ttl_ms]) for c in ids]
        )
        return frozenset(c for c, reply in zip(ids, replies, strict=True) if not reply)

    async def release(self, leases: Mapping[str, int]) -> None:
        """See :meth:`ContextStore.release`: one pipelined round trip."""
        self._check()
        if leases:
            await self._pipeline(
                [(self._release, [self._key(c, "lease")], [t]) for c, t in leases.items()]
            )

    async def append(self, writes: Sequence[_LogWrite]) -> frozenset[str]:
        """See :meth:`ContextStore.append`: one pipelined round trip, one script per context.

        Raises:
            StoreError: a write starts after the end of its log (a gap).
        """
        self._check()
        if not writes:
            return frozenset()
        used = f"{self._prefix}used"
        calls = [
            (
                self._append,
                [self._key(c, "lease"), self._key(c, "log"), used],
                [token, start, c, *records],
            )
            for c, token, start, records in writes
        ]
        replies = await self._pipeline(calls)
        refused: set[str] = set()
        for (context_id, _, start, _), reply in zip(writes, replies, strict=True):
            if reply == -1:
                refused.add(context_id)
            elif reply == -2:
                raise StoreError(
                    f"A write to context {context_id!r} starts at record {start}, after the "
                    "end of its log."
                )
        return frozenset(refused)

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        """See :meth:`ContextStore.replace`: one script."""
        self._check()
        keys = [
            self._key(context_id, "lease"),
            self._key(context_id, "log"),
            f"{self._prefix}used",
        ]
        reply = await self._call(
            self._replace(keys=keys, args=[token, length, context_id, *records])
        )
        return bool(reply)

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        """See :meth:`ContextStore.load`."""
        self._check()
        records = await self._call(self._client.lrange(self._key(context_id, "log"), 0, -1))
        return tuple(records)

    async def forget(self, context_id: str, token: int) -> bool:
        """See :meth:`ContextStore.forget`."""
        self._check()
        keys = [
            self._key(context_id, "lease"),
            self._key(context_id, "log"),
            f"{self._prefix}used",
            self._key(context_id, "fence"),
        ]
        return bool(await self._call(self._forget(keys=keys, args=[token, context_id])))

    async def idle(self, seconds: float) -> tuple[str, ...]:
        """See :meth:`ContextStore.idle` (server clock)."""
        self._check()
        now_s, now_us = await self._call(self._client.time())
        bound = now_s * 1000 + now_us // 1000 - round(seconds * 1000)
        found = await self._call(self._client.zrangebyscore(f"{self._prefix}used", "-inf", bound))
        ids = [member.decode() for member in found]
        if not ids:
            return ()
        leased = await self._call(self._client.mget([self._key(c, "lease") for c in ids]))
        return tuple(c for c, lease in zip(ids, leased, strict=True) if lease is None)

    async def __aenter__(self) -> Self:
        """The store itself; :meth:`aclose` runs when the block exits."""
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        """Close the store (see :meth:`aclose`)."""
        await self.aclose()

    async def aclose(self) -> None:
        """Close the client's connections; idempotent."""
        if self._closed:
            return
        self._closed = True
        if _library() == "asyncio":  # elsewhere every call was refused: nothing is open
            try:
                await self._client.aclose()
            finally:
                await self._pool.disconnect()
