"""Open a context store from a URL: ``sqlite:PATH``, ``sqlite::memory:``, ``redis://...``."""

from __future__ import annotations

__all__ = ("check_context_store", "open_context_store")

import os
from urllib.parse import parse_qs, urlsplit, urlunsplit

from turnloom.errors import InputError, StoreUnavailableError, excerpt, what_type
from turnloom.stores.redis_contexts import RedisContextStore
from turnloom.stores.sqlite_contexts import SQLiteContextStore


def open_context_store(url: str) -> SQLiteContextStore | RedisContextStore:
    """The context store a URL names; no I/O happens until its first call.

    Args:
        url: ``sqlite:PATH`` (a file, created when missing; ``?synchronous=NORMAL``
            trades power-loss durability for speed), ``sqlite::memory:``,
            or ``redis://HOST:PORT/DB`` (also ``rediss://``, ``unix://``); a
            ``prefix`` query parameter sets the Redis key prefix
            (``redis://127.0.0.1:6379/0?prefix=app1:``), ``timeout`` and
            ``socket_timeout`` its time bounds in seconds
            (``?timeout=1.5&socket_timeout=0.3``; see
            :class:`RedisContextStore`).

    Raises:
        InputError: any other URL, ``sqlite:`` without a path, or a malformed
            Redis URL (a port that is not a number from 0 to 65535, a
            bracketed host left open).
        MissingDependencyError: a Redis URL without the ``redis`` package.
    """
    if not isinstance(url, str):
        raise InputError(f"A store URL must be a str, not {what_type(url)}.")
    if url.startswith("sqlite:"):
        path, _, query = url.removeprefix("sqlite:").partition("?")
        if path.startswith("//"):
            path = path[2:]
        if not path:
            raise InputError("A sqlite: store URL needs a path: sqlite:PATH or sqlite::memory:.")
        options = parse_qs(query, keep_blank_values=True)
        synchronous = options.pop("synchronous", ["FULL"])[-1].upper()
        if options:
            raise InputError(f"Unknown sqlite: store URL parameter {sorted(options)[0]!r}.")
        if synchronous not in ("FULL", "NORMAL"):
            raise InputError(f"synchronous must be FULL or NORMAL, not {synchronous[:20]!r}.")
        return SQLiteContextStore(path, synchronous="NORMAL" if synchronous == "NORMAL" else "FULL")
    if url.startswith(("redis://", "rediss://", "unix://")):
        try:
            parts = urlsplit(url)
            parts.port  # noqa: B018  (read to check it: a bad or out-of-range port raises)
        except ValueError as exc:
            raise InputError(f"Malformed store URL {excerpt(url)}: {exc}.") from None
        params = parse_qs(parts.query, keep_blank_values=True)
        prefix = params.pop("prefix", ["turnloom:"])[-1]
        bounds: dict[str, float] = {}
        for name in ("timeout", "socket_timeout"):
            if name in params:
                text = params.pop(name)[-1]
                try:
                    bounds[name] = float(text)
                except ValueError:
                    raise InputError(
                        f"{name} must be a number of seconds, not {text[:20]!r}."
                    ) from None
        rest = "&".join(f"{k}={v}" for k, values in params.items() for v in values)
        return RedisContextStore(
            urlunsplit(parts._replace(query=rest)),
            prefix=prefix,
            timeout=bounds.get("timeout", 2.0),
            socket_timeout=bounds.get("socket_timeout"),
        )
    raise InputError(
        f"Unknown store URL {excerpt(url)}: use sqlite:PATH, sqlite::memory: or "
        "redis://HOST:PORT/DB."
    )


def check_context_store(url: str, *, backend: str = "asyncio", timeout: float = 2.0) -> None:
    """Check, before a run starts, that the store ``url`` names can serve it.

    Synchronous and short: a ``sqlite:`` file's folder must exist (the file
    itself is created on first use); a Redis store needs the asyncio backend
    (its client runs on asyncio only) and a server that answers ``PING``
    within ``timeout`` seconds. Nothing is written.

    Args:
        url: the store URL (see :func:`open_context_store`).
        backend: the event loop the run uses, ``"asyncio"`` or ``"trio"``.
        timeout: how long to wait for the Redis server, in seconds.

    Raises:
        InputError: the URL is unknown or malformed, its folder does not
            exist, its path is a folder, or a Redis store with the trio
            backend.
        MissingDependencyError: a Redis URL without the ``redis`` package.
        StoreUnavailableError: the Redis server does not answer.
    """
    store = open_context_store(url)
    if isinstance(store, SQLiteContextStore):
        path = store._path  # the same package
        folder = os.path.dirname(path) or "."
        if path != ":memory:" and not os.path.isdir(folder):
            raise InputError(
                f"The store {excerpt(url)} cannot be created: the folder {excerpt(folder)} "
                "does not exist."
            )
        if os.path.isdir(path):
            raise InputError(f"The store {excerpt(url)} names a folder, not a file.")
        return
    if backend != "asyncio":
        raise InputError(
            f"The store {excerpt(url)} runs on asyncio only (the redis client is "
            f"asyncio-based), not {excerpt(backend)}: use the asyncio backend, or a "
            "sqlite: store."
        )
    import redis
    import redis.exceptions

    client = redis.Redis.from_url(
        store._url,  # the same package
        socket_connect_timeout=timeout,
        socket_timeout=timeout,
    )
    try:
        client.ping()
    except (redis.exceptions.ConnectionError, redis.exceptions.TimeoutError, OSError) as exc:
        raise StoreUnavailableError(
            f"The store {excerpt(url)} is unreachable: {excerpt(str(exc))}."
        ) from None
    finally:
        client.close()
