"""Kill a host with SIGKILL while its OpenAI Agents session pops items; count lost histories.

A worker process (this script with ``--worker``) holds one
``TurnloomSession`` on a real store (a SQLite file, or a ``redis-server`` this
script starts on a free port with persistence off and stops by PID), adds
``--items`` items, then pops them one by one, printing ``POPPED k`` after the
k-th ``pop_item`` returned. The parent kills it at a random moment, ends its
lease in the store (as a stalled host's lease ends), restores the session in
a fresh Foundation and compares what the store holds with what was
acknowledged: after k acknowledged pops the session must hold the first
``items - k`` items, or ``items - k - 1`` (the pop in flight landed). Anything
else (fewer items, an empty session) is a *lost* history.

Two ways to pop run side by side in one run, on each store:

* ``atomic``: ``pop_item`` as shipped (one ``manager.leases.rewriting`` block,
  one atomic replace of the stored log);
* ``clear-then-add``: the rebuild ``pop_item`` did before (``clear_session``,
  then ``add_items`` of the kept items): two writes, the baseline.

Usage: PYTHONPATH=$PWD python scripts/fault_pops.py [--kills N] [--items N] [--seed K]
[--ways clear-then-add atomic] [--stores sqlite redis]
(defaults: 50 kills per store and way; about six minutes on a loaded 2-core machine.)
Exit status 1 when the atomic way lost a history, or a run went wrong.
"""

from __future__ import annotations

import argparse
import os
import random
import sqlite3
import subprocess
import sys
import tempfile
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
import redis

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from tests.stores.servers import RedisServer  # noqa: E402
from turnloom.integrations.openai_agents import TurnloomSession  # noqa: E402
from turnloom.runtime import Foundation  # noqa: E402
from turnloom.stores import open_context_store  # noqa: E402

SESSION = "s"


def items(count: int) -> list[dict[str, Any]]:
    """A conversation of ``count`` Responses items: user, tool call, its output, reply, ..."""
    out: list[dict[str, Any]] = []
    turn = 0
    while len(out) < count:
        out.append({"role": "user", "content": f"Question {turn}: " + "x" * (turn % 40)})
        out.append(
            {
                "type": "function_call",
                "call_id": f"c{turn}",
                "name": "lookup",
                "arguments": f'{{"q": {turn}}}',
                "id": f"fc_{turn}",
                "status": "completed",
            }
        )
        out.append({"type": "function_call_output", "call_id": f"c{turn}", "output": f"r{turn}"})
        out.append(
            {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{turn}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"Answer {turn}.", "annotations": []}],
            }
        )
        turn += 1
    return out[:count]


async def _old_pop(session: TurnloomSession) -> None:
    """The rebuild pop_item made before the atomic one: two writes."""
    held = session._all_items()
    await session.clear_session()
    await session.add_items(held[:-1])  # type: ignore[arg-type]


async def worker(url: str, way: str, count: int) -> None:
    async with open_context_store(url) as store:
        async with Foundation(gateway="openai_responses", store=store, lease_ttl=60.0) as f:
            session = TurnloomSession(SESSION, f.manager)
            await session.add_items(items(count))  # type: ignore[arg-type]
            print("READY", flush=True)
            for popped in range(1, count):
                if way == "atomic":
                    await session.pop_item()
                else:
                    await _old_pop(session)
                print(f"POPPED {popped}", flush=True)
            await anyio.sleep_forever()


async def held_after_restore(url: str) -> list[dict[str, Any]]:
    async with open_context_store(url) as store:
        async with Foundation(gateway="openai_responses", store=store) as f:
            session = TurnloomSession(SESSION, f.manager)
            await session._claim()
            return session._all_items()


def end_lease(url: str, prefix: str) -> None:
    if url.startswith("sqlite:"):
        with sqlite3.connect(url.removeprefix("sqlite:")) as db:
            db.execute(
                "UPDATE turnloom_contexts SET expires_at = 0 WHERE context_id = ?", (SESSION,)
            )
    else:
        client = redis.Redis.from_url(url.split("?")[0])
        client.delete(f"{prefix}ctx:{SESSION}:lease")
        client.close()


def trial(url: str, prefix: str, way: str, count: int, rng: random.Random) -> tuple[str, int]:
    """One kill; returns (outcome, acknowledged pops); outcome is whole, lost or error."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    process = subprocess.Popen(
        [sys.executable, __file__, "--worker", url, way, str(count)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert process.stdout is not None
    acked = 0
    try:
        line = process.stdout.readline()
        if line.strip() != "READY":
            return "error", 0
        deadline = time.monotonic() + rng.uniform(0.0, 0.25)
        os.set_blocking(process.stdout.fileno(), False)
        while time.monotonic() < deadline:
            time.sleep(0.001)
        process.kill()
        process.wait()
        rest = process.stdout.read() or ""
        for text in rest.splitlines():
            if text.startswith("POPPED "):
                acked = int(text.split()[1])
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    end_lease(url, prefix)
    held = anyio.run(held_after_restore, url)
    written = items(count)
    if held in (written[: count - acked], written[: count - acked - 1]):
        return "whole", acked
    return "lost", acked


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--kills", type=int, default=50, help="kills per store and way")
    parser.add_argument("--items", type=int, default=60, help="items the session holds")
    parser.add_argument("--seed", type=int, default=1)
    ways = ["clear-then-add", "atomic"]
    stores = ["sqlite", "redis"]
    parser.add_argument("--ways", nargs="+", default=ways, choices=ways)
    parser.add_argument("--stores", nargs="+", default=stores, choices=stores)
    parser.add_argument(
        "--worker", nargs=3, metavar=("URL", "WAY", "ITEMS"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.worker:
        url, way, count = args.worker
        anyio.run(worker, url, way, int(count))
        return 0
    rng = random.Random(args.seed)
    failed = False
    with tempfile.TemporaryDirectory() as tmp:
        server = RedisServer(Path(tmp)).start()
        try:
            print(f"{'store':8} {'way':15} {'kills':>5} {'lost':>5} {'whole':>5} {'errors':>6}")
            for store in args.stores:
                for way in args.ways:
                    tally = {"whole": 0, "lost": 0, "error": 0}
                    for index in range(args.kills):
                        prefix = f"pops:{uuid.uuid4().hex[:8]}:"
                        if store == "sqlite":
                            url = f"sqlite:{Path(tmp) / f'{way}-{index}.db'}"
                        else:
                            url = f"{server.url}?prefix={prefix}"
                        outcome, _ = trial(url, prefix, way, args.items, rng)
                        tally[outcome] += 1
                    print(
                        f"{store:8} {way:15} {args.kills:>5} {tally['lost']:>5} "
                        f"{tally['whole']:>5} {tally['error']:>6}",
                        flush=True,
                    )
                    failed |= tally["error"] > 0 or (way == "atomic" and tally["lost"] > 0)
        finally:
            server.stop()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
