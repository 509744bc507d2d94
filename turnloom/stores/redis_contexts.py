"""The fleet context store: a Redis server shared by every host (``redis`` asyncio client).

Keys, under a prefix (default ``"turnloom:"``): ``<prefix>ctx:<id>:log`` (a
list of framed records: position and checksum, see ``_frames``),
``<prefix>ctx:<id>:lease`` (``"<token> <epoch> <owner>"`` with a ``PX``
expiry), ``<prefix>ctx:<id>:fence`` (the token counter), ``<prefix>epoch``
(the store's epoch: a random id the first claim of an empty store writes)
and ``<prefix>used`` (a sorted set: context id by the server time of its
last write, in milliseconds). Every check-and-write runs as one Lua script
on the server, so a write with a stale lease is refused by Redis itself;
lease expiry uses the server's clock, so hosts' clocks do not matter. A
batch of appends to many contexts is one pipelined round trip, and each
context's outcome in it is its own.

Expiry: a lease expires ``lease_ttl`` after its last renewal; a context's
fencing counter expires a day after :meth:`~RedisContextStore.forget`
(``remove_context``), far longer than any lease; a log never expires by
itself: :meth:`~RedisContextStore.forget` deletes it, and
:meth:`~RedisContextStore.prune` deletes the logs of contexts nobody wrote
for a given time.

Fencing holds across a server that lost its data (a restart without
persistence, a failover to a replica that had not caught up): a write
carries its token, the owner that took it and the store epoch it was
issued in, and the script compares all three, so a reset counter that
issues the same token again, to another owner or in a new epoch, never lets
a stale owner's write through (:class:`~turnloom.errors.StaleLeaseError`).

Durability: an append that returned is in the server's memory and survives
any crash of the client processes. Whether it survives a crash or restart
of the Redis server is the server's configuration: with ``appendonly yes``
and ``appendfsync always`` it does; with ``appendfsync everysec`` up to a
second of writes can be lost; with persistence off (as on the machines
that run this project's tests) a server restart loses every log.

The time bound: every call returns, or raises
:class:`~turnloom.errors.StoreUnavailableError`, within ``timeout`` seconds
(default 2.0), however the server or the network hangs. Within it the
client sets socket timeouts (``socket_timeout``, 0.5 s) and retries a
failed command (``retries`` times, exponential backoff capped at
``backoff_cap``: redis-py's ``Retry`` and ``ExponentialBackoff``); retried
writes never duplicate and a retried compaction answers that it was
applied. Error replies are typed: ``OOM``, ``READONLY``, ``LOADING``,
``NOSCRIPT`` and the like are :class:`~turnloom.errors.StoreRefusedError`
(retry later), a key holding what turnloom did not write is
:class:`~turnloom.errors.StoreKeyError`; no redis exception leaves the store.

The ``redis`` asyncio client runs on asyncio only: using this store from trio
raises :class:`~turnloom.errors.StoreError`.
"""

from __future__ import annotations

__all__ = ("RedisContextStore",)

import math
import uuid
from collections.abc import Mapping, Sequence
from typing import Any, Self, TypeAlias

import anyio
import sniffio

from turnloom.errors import (
    InputError,
    LeaseHeldError,
    MissingDependencyError,
    StoreError,
    StoreKeyError,
    StoreRefusedError,
    StoreUnavailableError,
    excerpt,
)
from turnloom.stores._frames import frames, unframe_log
from turnloom.stores._holds import Holds
from turnloom.stores._prune import check_older_than

# (context_id, token, start, records): see turnloom.runtime.store.LogWrite.
_LogWrite: TypeAlias = tuple[str, int, int, tuple[bytes, ...]]

# Shared by every script. A lease is "<token> <epoch> <owner>"; the epoch is the
# store's (KEYS of acquire: "<prefix>epoch"), created by the first claim of an
# empty store, so a store that lost its data never shares it with one that did not.
_PRELUDE = """
local function kind_ok(key, wanted)
  local kind = redis.call('TYPE', key).ok
  return kind == 'none' or kind == wanted
end
-- 1: held with token, epoch and owner; 0: not held; -3: not a lease.
local function holds(key, token, epoch, owner)
  local kind = redis.call('TYPE', key).ok
  if kind == 'none' then return 0 end
  if kind ~= 'string' then return -3 end
  local current = redis.call('GET', key)
  local tk, ep, holder = string.match(current, '^(%d+) (%x+) (.+)$')
  if not tk then
    if string.match(current, '^%d+ %S+$') then return 0 end  -- written before epochs
    return -3
  end
  if tk == token and ep == epoch and holder == owner then return 1 end
  return 0
end
"""

# KEYS: lease, fence, epoch. ARGV: owner, ttl ms, a fresh epoch for an empty store.
# {token, epoch, 0} when taken; {0, holder, ms left} when held; {-3, key} for garbage.
_ACQUIRE = """
local kind = redis.call('TYPE', KEYS[1]).ok
if kind ~= 'none' then
  if kind ~= 'string' then return {-3, KEYS[1]} end
  local current = redis.call('GET', KEYS[1])
  local _, _, holder = string.match(current, '^(%d+) (%x+) (.+)$')
  if not holder then _, holder = string.match(current, '^(%d+) (%S+)$') end
  if not holder then return {-3, KEYS[1]} end
  if holder ~= ARGV[1] then
    return {0, holder, redis.call('PTTL', KEYS[1])}
  end
end
if not kind_ok(KEYS[2], 'string') or (redis.call('EXISTS', KEYS[2]) == 1
    and not string.match(redis.call('GET', KEYS[2]), '^%d+$')) then
  return {-3, KEYS[2]}
end
if not kind_ok(KEYS[3], 'string') then return {-3, KEYS[3]} end
redis.call('SET', KEYS[3], ARGV[3], 'NX')
local epoch = redis.call('GET', KEYS[3])
if not string.match(epoch, '^%x+$') then return {-3, KEYS[3]} end
local token = redis.call('INCR', KEYS[2])
redis.call('PERSIST', KEYS[2])
redis.call('SET', KEYS[1], token .. ' ' .. epoch .. ' ' .. ARGV[1], 'PX', ARGV[2])
return {token, epoch, 0}
"""

# KEYS: lease. ARGV: token, epoch, owner, ttl ms. 1 when extended, 0 when not held.
_RENEW = """
if holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) == 1 then
  redis.call('PEXPIRE', KEYS[1], ARGV[4])
  return 1
end
return 0
"""

# KEYS: lease. ARGV: token, epoch, owner.
_RELEASE = """
if holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3]) == 1 then
  redis.call('DEL', KEYS[1])
end
return 0
"""

# KEYS: lease, log, used. ARGV: token, epoch, owner, start, context id, records...
# {1, length after} when written (records already at their positions are
# skipped: a retry), {-1, 0} when not held, {-2, length} for a gap, {-4, length}
# when the records at already written positions differ, {-3, key} for garbage.
_APPEND = """
local held = holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if held == -3 then return {-3, KEYS[1]} end
if held == 0 then return {-1, 0} end
if not kind_ok(KEYS[2], 'list') then return {-3, KEYS[2]} end
if not kind_ok(KEYS[3], 'zset') then return {-3, KEYS[3]} end
local length = redis.call('LLEN', KEYS[2])
local start = tonumber(ARGV[4])
if start > length then return {-2, length} end
local overlap = math.min(length - start, #ARGV - 5)
if overlap > 0 then
  local there = redis.call('LRANGE', KEYS[2], start, start + overlap - 1)
  for i = 1, overlap do
    if there[i] ~= ARGV[5 + i] then return {-4, length} end
  end
end
for i = 6 + overlap, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[3], now[1] * 1000 + math.floor(now[2] / 1000), ARGV[5])
return {1, redis.call('LLEN', KEYS[2])}
"""

# KEYS: lease, log, used. ARGV: token, epoch, owner, expected length, context id, records...
# {1} replaced; {2} the log is these records already (a retry of an applied
# replace); {0} not held; {-2, length} another length; {-3, key} for garbage.
_REPLACE = """
local held = holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if held == -3 then return {-3, KEYS[1]} end
if held == 0 then return {0} end
if not kind_ok(KEYS[2], 'list') then return {-3, KEYS[2]} end
if not kind_ok(KEYS[3], 'zset') then return {-3, KEYS[3]} end
local length = redis.call('LLEN', KEYS[2])
local n = #ARGV - 5
if length ~= tonumber(ARGV[4]) then
  if length == n then
    local there = redis.call('LRANGE', KEYS[2], 0, -1)
    for i = 1, n do
      if there[i] ~= ARGV[5 + i] then return {-2, length} end
    end
    return {2}
  end
  return {-2, length}
end
redis.call('DEL', KEYS[2])
for i = 6, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
local now = redis.call('TIME')
redis.call('ZADD', KEYS[3], now[1] * 1000 + math.floor(now[2] / 1000), ARGV[5])
return {1}
"""

# KEYS: lease, log, used, fence. ARGV: token, epoch, owner, context id.
_FORGET = """
local held = holds(KEYS[1], ARGV[1], ARGV[2], ARGV[3])
if held == -3 then return -3 end
if held == 0 then return 0 end
redis.call('PEXPIRE', KEYS[4], 86400000)
redis.call('DEL', KEYS[2])
if kind_ok(KEYS[3], 'zset') then redis.call('ZREM', KEYS[3], ARGV[4]) end
return 1
"""

# KEYS: lease, log, fence, used. ARGV: context id, bound (server ms). 1 when deleted.
_PRUNE = """
if redis.call('EXISTS', KEYS[1]) == 1 then return 0 end
local score = redis.call('ZSCORE', KEYS[4], ARGV[1])
if score and tonumber(score) > tonumber(ARGV[2]) then return 0 end
redis.call('DEL', KEYS[2], KEYS[3])
redis.call('ZREM', KEYS[4], ARGV[1])
return 1
"""

# Error replies that say "not now": retrying later can succeed.
_REFUSALS = (
    "OOM",
    "READONLY",
    "NOSCRIPT",
    "LOADING",
    "BUSY",
    "MASTERDOWN",
    "TRYAGAIN",
    "CLUSTERDOWN",
    "NOREPLICAS",
    "MISCONF",
)


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
        timeout: the time bound, in seconds, of every call of this store
            (default 2.0): a call that has not completed by then (a paused or
            partitioned server, a pool whose connections all hang) raises
            :class:`~turnloom.errors.StoreUnavailableError`.
        socket_timeout: seconds one read, write or connect waits for the
            server (default 0.5, or ``timeout`` when shorter) before it
            counts as a failure the client retries; at most ``timeout``.
        retries: how many times the client retries a command after a
            connection failure or a socket timeout, within ``timeout``
            (default 2; redis-py's ``Retry``).
        backoff_cap: the longest wait between two retries, in seconds
            (default 0.25); waits start at 0.05 s and double (redis-py's
            ``ExponentialBackoff``).
        max_connections: the most connections open at once (default 32);
            more concurrent calls wait for a free one (within ``timeout``).

    Raises:
        InputError: not a ``redis://``/``rediss://``/``unix://`` URL, an empty
            prefix, a non-positive time, a negative retry count or a
            non-positive connection bound.
        MissingDependencyError: the ``redis`` package is not installed (extra
            ``redis``).
    """

    def __init__(
        self,
        url: str,
        *,
        prefix: str = "turnloom:",
        timeout: float = 2.0,
        socket_timeout: float | None = None,
        retries: int = 2,
        backoff_cap: float = 0.25,
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
        if socket_timeout is None and isinstance(timeout, int | float):
            socket_timeout = min(0.5, timeout)
        for name, value in (
            ("timeout", timeout),
            ("socket_timeout", socket_timeout),
            ("backoff_cap", backoff_cap),
        ):
            if not isinstance(value, int | float) or not 0 < value < math.inf:
                raise InputError(f"{name} must be a positive number of seconds, not {value!r}.")
        if socket_timeout > timeout:
            raise InputError(
                f"socket_timeout ({socket_timeout!r} s) must not exceed timeout ({timeout!r} s)."
            )
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
        self._timeout = float(timeout)
        self._exceptions = redis.exceptions
        errors: list[type[Exception]] = [
            redis.exceptions.ConnectionError,
            redis.exceptions.TimeoutError,
        ]
        retry = Retry(ExponentialBackoff(cap=backoff_cap, base=0.05), retries)
        # A bounded pool that waits for a free connection: a thousand sessions
        # claiming at once queue for connections rather than opening one each.
        pool = redis.asyncio.BlockingConnectionPool.from_url(
            url,
            max_connections=max_connections,
            timeout=self._timeout,
            retry=retry,
            retry_on_error=errors,
            socket_timeout=socket_timeout,
            socket_connect_timeout=socket_timeout,
        )
        self._pool: Any = pool
        self._client: Any = redis.asyncio.Redis(
            connection_pool=pool, retry=retry, retry_on_error=errors
        )
        self._acquire = self._client.register_script(_PRELUDE + _ACQUIRE)
        self._renew = self._client.register_script(_PRELUDE + _RENEW)
        self._release = self._client.register_script(_PRELUDE + _RELEASE)
        self._append = self._client.register_script(_PRELUDE + _APPEND)
        self._forget = self._client.register_script(_PRELUDE + _FORGET)
        self._replace = self._client.register_script(_PRELUDE + _REPLACE)
        self._prune = self._client.register_script(_PRUNE)
        self._holds = Holds()
        self._closed = False

    def __repr__(self) -> str:
        return f"RedisContextStore({self._url!r}, prefix={self._prefix!r})"

    @property
    def timeout(self) -> float:
        """The time bound of every call, in seconds."""
        return self._timeout

    def _key(self, context_id: str, what: str) -> str:
        return f"{self._prefix}ctx:{context_id}:{what}"

    def _fence(self, context_id: str, token: int) -> list[Any]:
        """The lease a write presents: token, epoch and owner (see ``_holds``)."""
        return [
            token,
            self._holds.epoch(context_id, token),
            self._holds.owner(context_id, token),
        ]

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

    def _error(
        self, exc: BaseException, context_id: str | None = None, key: str | None = None
    ) -> StoreError:
        """The typed error of a client exception (or an error reply in a pipeline)."""
        errors = self._exceptions
        if isinstance(exc, errors.ConnectionError | errors.TimeoutError):
            return StoreUnavailableError(f"{self!r} is unreachable: {exc}")
        where = f" for context {excerpt(context_id)}" if context_id is not None else ""
        known = (
            (errors.OutOfMemoryError, "OOM"),
            (errors.ReadOnlyError, "READONLY"),
            (errors.NoScriptError, "NOSCRIPT"),
            (errors.BusyLoadingError, "LOADING"),
        )
        text = str(exc)
        for kind, code in known:
            if isinstance(exc, kind):
                return StoreRefusedError(
                    f"{self!r} refused a call{where} for now ({code}: {text}).", reason=code
                )
        if isinstance(exc, errors.ResponseError):
            code = text.split(" ", 1)[0]
            if code in _REFUSALS:
                return StoreRefusedError(
                    f"{self!r} refused a call{where} for now ({text}).", reason=code
                )
            if code == "WRONGTYPE" and context_id is not None:
                key = key or self._key(context_id, "log")
                return StoreKeyError(
                    f"Key {excerpt(key)} of context {excerpt(context_id)} in {self!r} holds a "
                    f"value of another type than turnloom writes ({text}).",
                    context_id=context_id,
                    key=key,
                )
        return StoreError(f"{self!r} failed{where}: {type(exc).__name__}: {text}")

    def _garbage(self, context_id: str, key: Any) -> StoreKeyError:
        name = key.decode(errors="replace") if isinstance(key, bytes) else str(key)
        return StoreKeyError(
            f"Key {excerpt(name)} of context {excerpt(context_id)} in {self!r} holds a value "
            "turnloom did not write; delete or repair it.",
            context_id=context_id,
            key=name,
        )

    async def _call(
        self, coroutine: Any, context_id: str | None = None, key: str | None = None
    ) -> Any:
        try:
            with anyio.fail_after(self._timeout):
                return await coroutine
        except TimeoutError as exc:
            raise StoreUnavailableError(
                f"{self!r} did not answer within its time bound of {self._timeout} s."
            ) from exc
        except self._exceptions.RedisError as exc:
            raise self._error(exc, context_id, key) from exc

    async def _pipeline(self, calls: Sequence[tuple[Any, list[str], list[Any]]]) -> list[Any]:
        """Run scripts in one round trip; an error reply is returned in its place."""

        async def run() -> list[Any]:
            async with self._client.pipeline(transaction=False) as pipe:
                for script, keys, args in calls:
                    await script(keys=keys, args=args, client=pipe)
                result: list[Any] = await pipe.execute(raise_on_error=False)
                return result

        replies: list[Any] = await self._call(run())
        return replies

    # -- the protocol -------------------------------------------------------------

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        """See :meth:`ContextStore.acquire` (server clock, ``PX`` expiry).

        Raises:
            StoreKeyError: the lease, the fencing counter or the store's epoch
                key holds what turnloom did not write.
        """
        self._check()
        keys = [
            self._key(context_id, "lease"),
            self._key(context_id, "fence"),
            f"{self._prefix}epoch",
        ]
        args: list[Any] = [owner, max(1, round(ttl * 1000)), uuid.uuid4().hex]
        reply = await self._call(self._acquire(keys=keys, args=args), context_id)
        if reply[0] == -3:
            raise self._garbage(context_id, reply[1])
        token, holder, left = reply
        if not token:
            raise LeaseHeldError(
                f"Context {context_id!r} is leased by {holder.decode()!r} for another "
                f"{left / 1000:.3f} seconds.",
                context_id=context_id,
            )
        self._holds.issued(context_id, int(token), owner, holder.decode())
        return int(token)

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        """See :meth:`ContextStore.renew`: one pipelined round trip."""
        self._check()
        if not leases:
            return frozenset()
        ttl_ms = max(1, round(ttl * 1000))
        ids = tuple(leases)
        replies = await self._pipeline(
            [
                (self._renew, [self._key(c, "lease")], [*self._fence(c, leases[c]), ttl_ms])
                for c in ids
            ]
        )
        for c, reply in zip(ids, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._error(reply, c)
        lost = frozenset(c for c, reply in zip(ids, replies, strict=True) if not reply)
        for c in lost:
            self._holds.drop(c, leases[c])
        return lost

    async def release(self, leases: Mapping[str, int]) -> None:
        """See :meth:`ContextStore.release`: one pipelined round trip."""
        self._check()
        if leases:
            calls = [
                (self._release, [self._key(c, "lease")], self._fence(c, t))
                for c, t in leases.items()
            ]
            for c, t in leases.items():
                self._holds.drop(c, t)
            await self._pipeline(calls)

    async def append(self, writes: Sequence[_LogWrite]) -> dict[str, int | StoreError]:
        """See :meth:`ContextStore.append`: one pipelined round trip, one script per context.

        Each context's outcome is its own: a gap, records that differ from
        the ones at their positions, a damaged key (:class:`StoreKeyError`) or
        an error reply (``OOM``: :class:`StoreRefusedError`) of one context
        leave the others written.
        """
        self._check()
        if not writes:
            return {}
        used = f"{self._prefix}used"
        calls = [
            (
                self._append,
                [self._key(c, "lease"), self._key(c, "log"), used],
                [*self._fence(c, token), start, c, *frames(start, records)],
            )
            for c, token, start, records in writes
        ]
        replies = await self._pipeline(calls)
        outcome: dict[str, int | StoreError] = {}
        for (context_id, token, start, _), reply in zip(writes, replies, strict=True):
            if isinstance(reply, Exception):
                outcome[context_id] = self._error(reply, context_id)
                continue
            code, value = reply
            if code == 1:
                outcome[context_id] = int(value)
            elif code == -1:
                outcome[context_id] = -1
                self._holds.drop(context_id, token)
            elif code == -3:
                outcome[context_id] = self._garbage(context_id, value)
            elif code == -2:
                outcome[context_id] = StoreError(
                    f"A write to context {context_id!r} starts at record {start}, after the "
                    f"end of its log ({value} records)."
                )
            else:
                outcome[context_id] = StoreError(
                    f"A write to context {context_id!r} from record {start} differs from the "
                    "records its log holds there."
                )
        return outcome

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        """See :meth:`ContextStore.replace`: one script; a retry of an applied one is True.

        Raises:
            StoreKeyError: a key of the context holds what turnloom did not write.
        """
        self._check()
        keys = [
            self._key(context_id, "lease"),
            self._key(context_id, "log"),
            f"{self._prefix}used",
        ]
        args = [*self._fence(context_id, token), length, context_id, *frames(0, records)]
        reply = await self._call(self._replace(keys=keys, args=args), context_id)
        if reply[0] == -3:
            raise self._garbage(context_id, reply[1])
        return bool(reply[0] > 0)

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        """See :meth:`ContextStore.load`; every record's frame is checked.

        Raises:
            StoreRecordError: a record is damaged or out of place.
            StoreKeyError: the log key holds another type than a list.
        """
        self._check()
        key = self._key(context_id, "log")
        records = await self._call(self._client.lrange(key, 0, -1), context_id, key)
        return unframe_log(context_id, records)

    async def forget(self, context_id: str, token: int) -> bool:
        """See :meth:`ContextStore.forget`: the fencing counter expires a day later."""
        self._check()
        keys = [
            self._key(context_id, "lease"),
            self._key(context_id, "log"),
            f"{self._prefix}used",
            self._key(context_id, "fence"),
        ]
        reply = await self._call(
            self._forget(keys=keys, args=[*self._fence(context_id, token), context_id]),
            context_id,
        )
        if reply == -3:
            raise self._garbage(context_id, keys[0])
        return bool(reply)

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

    async def prune(self, older_than: float) -> int:
        """Delete the logs and fencing counters of contexts unwritten for ``older_than`` seconds.

        Only contexts nobody leases (server clock); run it from a
        maintenance job with ``older_than`` far longer than any lease (a day,
        say). A pruned context claimed again starts empty; a stale owner of
        one is still refused (writes carry the owner and the store epoch).
        A forgotten context (``remove_context``) keeps only its fencing
        counter, which expires by itself a day later.

        Returns:
            the number of contexts deleted.

        Raises:
            InputError: ``older_than`` is not a non-negative number.
        """
        check_older_than(older_than)
        self._check()
        used = f"{self._prefix}used"
        now_s, now_us = await self._call(self._client.time())
        bound = now_s * 1000 + now_us // 1000 - round(older_than * 1000)
        found = await self._call(self._client.zrangebyscore(used, "-inf", bound))
        ids = [member.decode() for member in found]
        if not ids:
            return 0
        replies = await self._pipeline(
            [
                (
                    self._prune,
                    [self._key(c, "lease"), self._key(c, "log"), self._key(c, "fence"), used],
                    [c, bound],
                )
                for c in ids
            ]
        )
        for c, reply in zip(ids, replies, strict=True):
            if isinstance(reply, Exception):
                raise self._error(reply, c)
        return sum(1 for reply in replies if reply == 1)

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
