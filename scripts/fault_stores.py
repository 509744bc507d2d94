"""Fault runs: the context stores under the faults a fleet meets, counted.

Every run uses real servers on loopback only: a ``redis-server`` this script
starts on a free port (persistence off, stopped by PID) behind the tests'
TCP fault proxy, and SQLite files in a temporary directory. Scenarios:

* ``cut``: 6 contexts written and flushed in a loop while the proxy cuts
  every connection every 20-150 ms (for ``--seconds``); history limits that
  evict and compact all the time.
* ``drop``: the reply of one append or compaction script thrown away after
  the server ran it (the client retries), per trial.
* ``oom``: the server filled past ``maxmemory`` (``noeviction``), flushed,
  emptied, flushed again, per trial.
* ``readonly``: the server demoted to a replica of an empty one: writes
  refused (READONLY), then promoted again, per trial.
* ``pause``: the server SIGSTOPped for longer than the store's time bound
  while a flush waits, then SIGCONTed, per trial.
* ``restart``: the server restarted without persistence between two owners
  of one context: the stale owner must be fenced, per trial.
* ``garbage``: one context's log key overwritten with a string while it is
  held; the other contexts must flush, per trial.
* ``damage``: a random byte of a random stored record flipped, or a record
  deleted (SQLite and Redis), then the context claimed: a typed error or
  the identical history, never another one, per trial.

For each: trials, acknowledged turns, acknowledged turns lost (acknowledged
by a flush, then missing or different after a restore), typed errors
(``TurnloomError``), untyped errors or hangs (anything else, or a call that
outlived ten store time bounds). Exit status 1 when anything acknowledged
was lost, or an untyped error or a hang happened.

Usage: PYTHONPATH=$PWD python scripts/fault_stores.py [--trials N] [--seconds S] [--seed K]
(defaults: 20 trials per scenario, 30 s of cuts; about three minutes on a loaded 2-core machine.)
"""

from __future__ import annotations

import argparse
import random
import sqlite3
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import anyio

from tests.runtime.helpers import assistant, user
from tests.stores.faults import FaultProxy
from tests.stores.servers import RedisServer
from turnloom.context.history import HistoryLimits
from turnloom.errors import StaleLeaseError, TurnloomError
from turnloom.runtime import ContextManager, Foundation, TurnSnapshot
from turnloom.stores import RedisContextStore, open_context_store

BOUND = 0.5  # the Redis store's time bound in these runs, seconds
HANG = 10 * BOUND
PREFIX = "f:"


@dataclass
class Tally:
    trials: int = 0
    acknowledged: int = 0
    lost: int = 0
    typed: int = 0
    untyped: int = 0


def turn(manager: ContextManager, context_id: str, i: int) -> None:
    manager.accept_turn(
        TurnSnapshot(context_id=context_id, turn_id=f"t{i}", input=(user(f"question {i}"),))
    )
    manager.record(context_id, f"t{i}", [assistant(f"answer {i} of {context_id}")])


def store_on(url: str) -> RedisContextStore:
    return RedisContextStore(url, prefix=PREFIX, timeout=BOUND, socket_timeout=0.2)


async def guarded(tally: Tally, call: object) -> bool:
    """Await ``call``; count its failure as typed or not. True when it returned."""
    try:
        with anyio.fail_after(HANG):
            await call  # type: ignore[misc]
        return True
    except TurnloomError:
        tally.typed += 1
    except TimeoutError:
        tally.untyped += 1  # a hang
    except Exception:
        tally.untyped += 1
    return False


async def lost_turns(url: str, expected: dict[str, tuple[str, ...]], limits: HistoryLimits) -> int:
    """Acknowledged turns missing or different when another host restores them."""
    lost = 0
    async with store_on(url) as store, Foundation(store=store, history_limits=limits) as check:
        for context_id, turn_ids in expected.items():
            await check.manager.leases.claim(context_id)
            view = check.manager.history(context_id)
            for turn_id in turn_ids:
                i = int(turn_id[1:])
                want = (user(f"question {i}"), assistant(f"answer {i} of {context_id}"))
                if turn_id not in view.turn_ids or view.turn_messages(turn_id) != want:
                    lost += 1
    return lost


async def run_cut(server: RedisServer, seconds: float, rng: random.Random) -> Tally:
    tally = Tally(trials=1)
    limits = HistoryLimits(max_turns=3)
    proxy = FaultProxy(server.port)
    ids = [f"c{i}" for i in range(6)]
    acknowledged: dict[str, list[str]] = {c: [] for c in ids}
    async with anyio.create_task_group() as group:
        await group.start(proxy.run)

        cutting = anyio.CancelScope()

        async def cutter() -> None:
            with cutting:
                while True:
                    await anyio.sleep(rng.uniform(0.02, 0.15))
                    await proxy.cut()

        async with store_on(proxy.url) as store:
            async with Foundation(store=store, history_limits=limits) as foundation:
                manager = foundation.manager
                for c in ids:
                    while not await guarded(tally, manager.leases.claim(c)):
                        pass
                group.start_soon(cutter)

                async def writer(context_id: str) -> None:
                    i = 0
                    deadline = anyio.current_time() + seconds
                    while anyio.current_time() < deadline:
                        turn(manager, context_id, i)
                        while not await guarded(tally, manager.leases.flush(context_id)):
                            if anyio.current_time() > deadline + 30:
                                return
                        acknowledged[context_id].append(f"t{i}")
                        i += 1

                async with anyio.create_task_group() as writers:
                    for c in ids:
                        writers.start_soon(writer, c)
                cutting.cancel()  # then the close releases every lease
        await proxy.stop()
    tally.acknowledged = sum(len(v) for v in acknowledged.values())
    tally.lost = await lost_turns(
        server.url, {c: tuple(v[-3:]) for c, v in acknowledged.items()}, limits
    )
    return tally


async def run_trials(kind: str, server: RedisServer, trials: int, rng: random.Random) -> Tally:
    tally = Tally()
    limits = HistoryLimits(max_turns=1000)
    with server.client() as client:
        client.flushall()
    for trial in range(trials):
        tally.trials += 1
        cid = f"{kind}{trial}"
        expected: list[str] = []
        others: dict[str, tuple[str, ...]] = {}
        if kind == "restart":
            await fenced(server, cid, tally)
            tally.acknowledged += 1  # B's turn
            async with (
                store_on(server.url) as store,
                Foundation(store=store, history_limits=limits) as check,
            ):
                await check.manager.leases.claim(cid)
                if check.manager.history(cid).turn_ids != ("t100",):
                    tally.lost += 1  # B's turn missing, or A's stale turn landed in it
            continue
        async with (
            store_on(server.url) as store,
            Foundation(store=store, history_limits=limits) as foundation,
        ):
            manager = foundation.manager
            if not await guarded(tally, manager.leases.claim(cid)):
                continue
            turn(manager, cid, 0)
            if await guarded(tally, manager.leases.flush()):
                expected.append("t0")
            turn(manager, cid, 1)
            if kind == "oom":
                with server.client() as client:
                    junk = [f"junk:{i}" for i in range(100)]
                    for key in junk:
                        client.set(key, b"x" * 4096)
                    client.config_set(
                        "maxmemory", int(client.info("memory")["used_memory"]) - 200_000
                    )
                await guarded(tally, manager.leases.flush())
                with server.client() as client:
                    client.delete(*junk)
                    client.config_set("maxmemory", 0)
            elif kind == "pause":
                server.pause()
                try:
                    await guarded(tally, manager.leases.flush())
                    await anyio.sleep(rng.uniform(0, BOUND))
                finally:
                    server.resume()
            elif kind == "readonly":
                empty = RedisServer(Path(tempfile.mkdtemp()))
                empty.start()
                try:
                    with server.client() as client:
                        with empty.client() as e:  # the empty one gets our data first
                            e.replicaof("127.0.0.1", server.port)
                            while e.info("replication")["master_link_status"] != "up":
                                time.sleep(0.01)
                            e.replicaof("NO", "ONE")
                        client.replicaof("127.0.0.1", empty.port)
                        await guarded(tally, manager.leases.flush())
                        client.replicaof("NO", "ONE")
                finally:
                    empty.stop()
            elif kind == "garbage":
                await guarded(tally, manager.leases.claim(cid + "-other"))
                turn(manager, cid + "-other", 0)
                with server.client() as client:
                    client.delete(f"{PREFIX}ctx:{cid}:log")
                    client.set(f"{PREFIX}ctx:{cid}:log", "garbage")
                if await guarded(tally, manager.leases.flush(cid + "-other")):
                    others = {cid + "-other": ("t0",)}
                await guarded(tally, manager.leases.flush(cid))
                expected = []  # the damaged log is the operator's to repair
            elif kind == "drop":
                pass  # run by run_drop
            for _ in range(3):  # the store is back: the queued changes go
                if await guarded(tally, manager.leases.flush()):
                    if kind != "garbage":
                        expected.append("t1")
                    break
        if expected:
            others[cid] = tuple(expected)
        if others:
            tally.acknowledged += sum(len(v) for v in others.values())
            tally.lost += await lost_turns(server.url, others, limits)
    return tally


async def fenced(server: RedisServer, cid: str, tally: Tally) -> bool:
    """Two owners across a restart without data; True when the stale write was refused."""
    limits = HistoryLimits(max_turns=1000)
    async with store_on(server.url) as a_store, store_on(server.url) as b_store:
        async with Foundation(store=a_store, history_limits=limits, owner="a", lease_ttl=60) as a:
            await a.manager.leases.claim(cid)
            turn(a.manager, cid, 0)
            await a.manager.leases.flush()
            server.restart()
            async with Foundation(
                store=b_store, history_limits=limits, owner="b", lease_ttl=60
            ) as b:
                await guarded(tally, b.manager.leases.claim(cid))
                turn(b.manager, cid, 100)
                await guarded(tally, b.manager.leases.flush())
                turn(a.manager, cid, 1)
                try:
                    with anyio.fail_after(HANG):
                        await a.manager.leases.flush()
                except StaleLeaseError:
                    tally.typed += 1
                    return True
                except TurnloomError:
                    tally.typed += 1
                    return False
                except Exception:
                    tally.untyped += 1
                    return False
                tally.lost += 1  # the stale write was acknowledged: split brain
                return False


async def run_drop(server: RedisServer, trials: int, rng: random.Random) -> Tally:
    from tests.stores.test_redis_faults import converse_with_tools, sha
    from turnloom.stores import redis_contexts

    tally = Tally()
    limits = HistoryLimits(max_turns=3)
    proxy = FaultProxy(server.port)
    async with anyio.create_task_group() as group:
        await group.start(proxy.run)
        for trial in range(trials):
            tally.trials += 1
            cid = f"drop{trial}"
            source = rng.choice([redis_contexts._APPEND, redis_contexts._REPLACE])
            with server.client() as client:
                client.script_load(redis_contexts._PRELUDE + source)
            async with (
                store_on(proxy.url) as store,
                Foundation(store=store, history_limits=limits) as foundation,
            ):
                manager = foundation.manager
                await guarded(tally, manager.leases.claim(cid))
                converse_with_tools(manager, cid, range(10))
                await guarded(tally, manager.leases.flush())
                proxy.drop_reply(b"EVALSHA", sha(source))
                converse_with_tools(manager, cid, range(10, rng.randint(20, 30)))
                ok = await guarded(tally, manager.leases.flush())
                if not ok:
                    ok = await guarded(tally, manager.leases.flush())
                held = manager.history(cid)
            if ok:
                tally.acknowledged += len(held.turn_ids)
                async with (
                    store_on(server.url) as check_store,
                    Foundation(store=check_store, history_limits=limits) as check,
                ):
                    await check.manager.leases.claim(cid)
                    restored = check.manager.history(cid)
                    tally.lost += sum(
                        1
                        for t in held.turn_ids
                        if t not in restored.turn_ids
                        or restored.turn_messages(t) != held.turn_messages(t)
                    )
        await proxy.stop()
    return tally


async def run_damage(
    url: str, trials: int, rng: random.Random, server: RedisServer | None
) -> Tally:
    tally = Tally()
    limits = HistoryLimits(max_turns=1000)
    for trial in range(trials):
        tally.trials += 1
        cid = f"damage{trial}"
        async with (
            open_context_store(url) as store,
            Foundation(store=store, history_limits=limits, owner="writer") as foundation,
        ):
            await foundation.manager.leases.claim(cid)
            for i in range(4):
                turn(foundation.manager, cid, i)
            await foundation.manager.leases.flush()
            held = foundation.manager.history(cid)
        if url.startswith("sqlite:"):
            with sqlite3.connect(url.removeprefix("sqlite:")) as db:
                rows = db.execute(
                    "SELECT position, data FROM turnloom_records WHERE context_id = ?", (cid,)
                ).fetchall()
                position, data = rng.choice(rows)
                if rng.random() < 0.5:
                    flipped = bytearray(data)
                    flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
                    db.execute(
                        "UPDATE turnloom_records SET data = ? "
                        "WHERE context_id = ? AND position = ?",
                        (bytes(flipped), cid, position),
                    )
                else:
                    db.execute(
                        "DELETE FROM turnloom_records WHERE context_id = ? AND position = ?",
                        (cid, position),
                    )
        else:
            assert server is not None
            key = f"{PREFIX}ctx:{cid}:log"
            with server.client() as client:
                records = client.lrange(key, 0, -1)
                index = rng.randrange(len(records) - 1)  # a Redis tail cut is a lost write
                if rng.random() < 0.5:
                    flipped = bytearray(records[index])
                    flipped[rng.randrange(len(flipped))] ^= 1 << rng.randrange(8)
                    client.lset(key, index, bytes(flipped))
                else:
                    client.lset(key, index, "--deleted--")
                    client.lrem(key, 1, "--deleted--")
        async with (
            open_context_store(url) as store,
            Foundation(store=store, history_limits=limits, owner="reader") as foundation,
        ):
            if await guarded(tally, foundation.manager.leases.claim(cid)):
                restored = foundation.manager.history(cid)
                tally.acknowledged += len(held.turn_ids)
                same = restored.turn_ids == held.turn_ids and all(
                    restored.turn_messages(t) == held.turn_messages(t) for t in held.turn_ids
                )
                tally.lost += 0 if same else len(held.turn_ids)
            else:
                tally.acknowledged += len(held.turn_ids)  # refused, typed: nothing misread
    return tally


async def main_async(args: argparse.Namespace) -> int:
    rng = random.Random(args.seed)
    rows: list[tuple[str, Tally]] = []
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp) / "redis", "--maxmemory-policy", "noeviction")
        server.start()
        try:
            rows.append(("cut (redis)", await run_cut(server, args.seconds, rng)))
            rows.append(("drop (redis)", await run_drop(server, args.trials, rng)))
            for kind in ("oom", "readonly", "pause", "restart", "garbage"):
                rows.append((f"{kind} (redis)", await run_trials(kind, server, args.trials, rng)))
            with server.client() as client:
                client.flushall()
            rows.append(
                (
                    "damage (redis)",
                    await run_damage(f"{server.url}?prefix={PREFIX}", args.trials, rng, server),
                )
            )
            rows.append(
                (
                    "damage (sqlite)",
                    await run_damage(f"sqlite:{tmp}/damage.db", args.trials, rng, None),
                )
            )
        finally:
            server.stop()
    print(
        "| scenario | trials | acknowledged turns | acknowledged lost | typed errors "
        "| untyped errors or hangs |"
    )
    print("|---|---|---|---|---|---|")
    for name, t in rows:
        print(f"| {name} | {t.trials} | {t.acknowledged} | {t.lost} | {t.typed} | {t.untyped} |")
    bad = sum(t.lost + t.untyped for _, t in rows)
    return 1 if bad else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trials", type=int, default=20, help="trials per scenario")
    parser.add_argument("--seconds", type=float, default=30.0, help="seconds of cut connections")
    parser.add_argument("--seed", type=int, default=27)
    args = parser.parse_args()
    began = time.perf_counter()
    status = anyio.run(main_async, args, backend="asyncio")
    print(f"({time.perf_counter() - began:.0f} s)")
    return status


if __name__ == "__main__":
    sys.exit(main())
