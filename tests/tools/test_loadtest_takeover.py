"""``turnloom loadtest --processes N --takeover``: survivors finish a killed process's sessions.

Two ``turnloom loadtest`` processes share one store (SQLite, Redis), each with half of
eight sessions and ``--takeover-sessions 8`` (what ``--takeover`` gives each
child). One is killed (SIGKILL, by PID) while its sessions are mid-way. The
survivor, done with its own, claims the dead one's sessions once their
leases expire, restores them and replays their remaining turns. Invariants:
every session ends finished in the store (its newest turn is the script's
last), and every commit a flush acknowledged, in either process (each
writes an acknowledged-log line per acknowledged commit), is in the
restored history.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import anyio
import msgspec
import pytest
import redis

from tests.stores.conftest import REDIS_URL
from turnloom.cli import main
from turnloom.runtime import Foundation
from turnloom.stores import SQLiteContextStore, open_context_store
from turnloom.tools.loadtest import LoadtestReport
from turnloom.tools.trajectories import builtin_trajectories, check_trajectory
from turnloom.tools.transcript import Turn, walk

SESSIONS = 8
TURNS = 6


def child(k: int, store: str, folder: Path) -> subprocess.Popen[bytes]:
    argv = [
        sys.executable,
        "-m",
        "turnloom",
        "loadtest",
        "--sessions",
        str(SESSIONS // 2),
        "--first-session",
        str(k * SESSIONS // 2),
        "--takeover-sessions",
        str(SESSIONS),
        "--turns",
        str(TURNS),
        "--think-time",
        "0.3",
        "--store",
        store,
        "--lease-ttl",
        "1.0",
        "--run-id",
        "r:",
        "--acknowledged-log",
        str(folder / f"ack-{k}.log"),
        "--json",
        str(folder / f"report-{k}.json"),
        "--no-progress",
    ]
    return subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


@pytest.fixture(params=["sqlite", "redis"])
def fleet_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A store URL the two processes share: a SQLite file, or the Redis server (own prefix)."""
    if request.param == "sqlite":
        yield f"sqlite:{tmp_path / 'fleet.db'}"
        return
    prefix = f"tltest:{uuid.uuid4().hex[:12]}:"
    yield f"{REDIS_URL}?prefix={prefix}"
    client = redis.Redis.from_url(REDIS_URL)
    try:
        keys = list(client.scan_iter(match=f"{prefix}*"))
        if keys:
            client.delete(*keys)
    finally:
        client.close()


def test_a_killed_process_s_sessions_are_finished_by_the_survivor_with_nothing_lost(
    tmp_path: Path, fleet_store: str
) -> None:
    store = fleet_store
    survivor = child(0, store, tmp_path)
    doomed = child(1, store, tmp_path)
    try:
        log = tmp_path / "ack-1.log"
        deadline = time.monotonic() + 60  # the bound only ends a hang
        while not (log.exists() and len(log.read_text().splitlines()) >= 6):
            assert time.monotonic() < deadline, "the doomed process never acknowledged"
            assert doomed.poll() is None
            time.sleep(0.02)
        os.kill(doomed.pid, signal.SIGKILL)  # mid-way: 6 of its 24 commits acknowledged
        doomed.wait(10)
        _, stderr = survivor.communicate(timeout=120)
    finally:
        for process in (survivor, doomed):
            if process.poll() is None:
                process.kill()
                process.wait(10)
            if process.stderr is not None:
                process.stderr.close()
    assert doomed.returncode == -signal.SIGKILL
    assert survivor.returncode == 0, stderr.decode(errors="replace")[-2000:]
    report = msgspec.json.decode((tmp_path / "report-0.json").read_bytes(), type=LoadtestReport)
    assert (report.sessions_failed, report.errors) == (0, ())
    assert report.takeovers >= SESSIONS // 2  # the dead process's sessions, restored
    acknowledged: dict[str, list[str]] = {}
    for k in (0, 1):
        for line in (tmp_path / f"ack-{k}.log").read_text().splitlines():
            context_id, turn_id = line.split()
            acknowledged.setdefault(context_id, []).append(turn_id)
    scripts = builtin_trajectories(SESSIONS, turns=(TURNS, TURNS))

    async def check() -> None:
        async with (
            open_context_store(store) as opened,
            Foundation(store=opened, owner="checker") as foundation,
        ):
            manager = foundation.manager
            for number in range(SESSIONS):
                context_id = f"r:session-{number}"
                await manager.leases.claim(context_id)
                held = manager.history(context_id).turn_ids
                messages = check_trajectory(scripts[number % len(scripts)])
                assert isinstance(messages, list)
                script = [
                    step.turn_id
                    for step in walk(messages, max_turns=TURNS)
                    if isinstance(step, Turn)
                ]
                assert held == tuple(script)  # finished, every turn once
                assert set(acknowledged[context_id]) <= set(held)

    anyio.run(check, backend="asyncio")


def test_takeover_through_processes_finishes_every_session_and_keeps_contexts(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = f"sqlite:{tmp_path / 'fleet.db'}"
    argv = ["loadtest", "--sessions", "4", "--turns", "2", "--store", store]
    assert main([*argv, "--processes", "2", "--takeover", "--lease-ttl", "1"]) == 0
    out = capsys.readouterr().out
    assert "processes: 2  sessions: 4  failed: 0  turns: 8" in out

    async def kept() -> tuple[str, ...]:
        async with SQLiteContextStore(tmp_path / "fleet.db") as opened:
            return await opened.idle(0.0)

    assert len(anyio.run(kept)) == 4  # finished, released, kept for a survivor to see
    wrongs = (["--takeover"], ["--processes", "2", "--store", store, "--lease-ttl", "0"])
    for wrong in wrongs:
        assert main(["loadtest", "--sessions", "4", *wrong]) == 2
    err = capsys.readouterr().err
    assert "--takeover needs --processes 2 or more and a --store." in err
    assert "--lease-ttl must be a positive number of seconds, not 0.0." in err
