"""``turnloom loadtest --store URL --processes N``: durable sessions, spread over processes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import msgspec
import redis

from turnloom.cli import main
from turnloom.stores import SQLiteContextStore
from turnloom.tools.fleet import FleetReport, aggregate
from turnloom.tools.loadtest import LoadtestReport, loadtest
from turnloom.tools.trajectories import builtin_trajectories


def test_a_loadtest_with_a_store_acknowledges_every_turn_and_cleans_up(tmp_path: Path) -> None:
    trajectories = builtin_trajectories(3, turns=(4, 4))
    path = tmp_path / "load.db"

    async def run() -> tuple[LoadtestReport, tuple[str, ...], tuple[bytes, ...]]:
        report = await loadtest(
            trajectories, sessions=6, turns=4, store=f"sqlite:{path}", run_id="r1:"
        )
        store = SQLiteContextStore(path)
        try:
            return report, await store.idle(0.0), await store.load("r1:session-3")
        finally:
            await store.aclose()

    report, idle, log = anyio.run(run)
    assert (report.sessions_failed, report.errors) == (0, ())
    assert (report.turns, report.prepares, report.takeovers) == (24, 24, 0)
    assert report.store == f"sqlite:{path}"
    assert (idle, log) == ((), ())  # every session removed its context from the store


def test_two_processes_share_one_redis_store_and_their_reports_add_up(tmp_path: Path) -> None:
    prefix = f"tltest:{uuid.uuid4().hex[:12]}:"
    out = tmp_path / "fleet.json"
    try:
        status = main(
            [
                "loadtest",
                "--sessions",
                "5",
                "--turns",
                "3",
                "--processes",
                "2",
                "--store",
                f"redis://127.0.0.1:6379/0?prefix={prefix}",
                "--json",
                str(out),
            ]
        )
        assert status == 0
        report = json.loads(out.read_text())
        assert (report["processes"], report["sessions"], report["sessions_failed"]) == (2, 5, 0)
        assert (report["turns"], report["prepares"]) == (15, 15)
        assert len(report["peak_rss_bytes"]) == 2
        assert report["store"].startswith("redis://127.0.0.1:6379/0")
    finally:
        client = redis.Redis.from_url("redis://127.0.0.1:6379/0")
        keys = list(client.scan_iter(match=f"{prefix}*"))
        logs = [k for k in keys if k.endswith(b":log")]
        if keys:
            client.delete(*keys)
        client.close()
    assert logs == []  # sessions removed their logs; only fence counters were left


def _report(**values: object) -> LoadtestReport:
    base: dict[str, object] = {
        "sessions": 2,
        "sessions_failed": 0,
        "turns": 10,
        "model_calls": 20,
        "prepares": 10,
        "seconds": 2.0,
        "prepares_per_second": 5.0,
        "prepare_p50_ms": 1.0,
        "prepare_p95_ms": 2.0,
        "prepare_p99_ms": 3.0,
        "loop_lag_p99_ms": 1.0,
        "loop_lag_max_ms": 4.0,
        "gc_full_collections": 0,
        "gc_pause_max_ms": 0.0,
        "peak_rss_bytes": 100,
        "rejections": 1,
        "evicted_turns": 0,
        "errors": (),
        "store": "sqlite:x",
        "takeovers": 0,
    }
    base.update(values)
    return msgspec.convert(base, LoadtestReport)


def test_the_aggregate_sums_counts_and_takes_the_longest_wall_and_worst_latency() -> None:
    fleet = aggregate(
        [
            _report(),
            _report(seconds=4.0, prepares=30, prepare_p99_ms=9.0, peak_rss_bytes=200, takeovers=2),
        ]
    )
    assert (fleet.processes, fleet.sessions, fleet.prepares, fleet.seconds) == (2, 4, 40, 4.0)
    assert fleet.prepares_per_second == 10.0
    assert (fleet.prepare_p99_ms, fleet.peak_rss_bytes, fleet.takeovers) == (9.0, (100, 200), 2)


# Per-process measures a fleet report leaves out: percentiles and GC figures
# of different processes do not add up, and the rest are run settings or
# timings the fleet does not report.
_PER_PROCESS_ONLY = {
    "prepare_p95_ms",
    "loop_lag_p99_ms",
    "gc_full_collections",
    "gc_pause_max_ms",
    "think_time",
    "render_seconds",
    "cpu_seconds",
}


def test_every_process_report_field_is_carried_by_the_fleet_report_or_named_as_left_out() -> None:
    """Invariant: FleetReport declares LoadtestReport's fields under the same names
    (aggregate() sums or takes the worst of each), so a field added to the process
    report cannot silently miss the fleet's: it is added there, or named above."""
    process = set(LoadtestReport.__struct_fields__)
    fleet = set(FleetReport.__struct_fields__)
    assert fleet - process == {"processes"}
    assert process - fleet == _PER_PROCESS_ONLY
