"""``turnloom loadtest --store URL --processes N``: durable sessions, spread over processes."""

from __future__ import annotations

import json
import uuid
from pathlib import Path

import anyio
import msgspec
import pytest
import redis

from turnloom.cli import main
from turnloom.stores import SQLiteContextStore
from turnloom.tools import fleet as fleet_module
from turnloom.tools.fleet import FleetReport, aggregate
from turnloom.tools.loadtest import LoadtestReport, RunFigures, loadtest
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


def test_the_aggregate_sums_cpu_and_collections_and_takes_the_worst_lag_and_pause() -> None:
    """Invariant: CPU and render seconds and full collections add up over the
    processes (so CPU per prepare is the fleet's); lag and pauses are the worst."""
    fleet = aggregate(
        [
            _report(cpu_seconds=2.0, render_seconds=0.5, gc_full_collections=3, think_time=2.0),
            _report(
                cpu_seconds=3.0,
                render_seconds=1.5,
                gc_full_collections=4,
                gc_pause_max_ms=7.0,
                loop_lag_p99_ms=6.0,
                prepare_p95_ms=5.0,
                think_time=2.0,
            ),
        ]
    )
    assert (fleet.cpu_seconds, fleet.render_seconds, fleet.gc_full_collections) == (5.0, 2.0, 7)
    assert (fleet.gc_pause_max_ms, fleet.loop_lag_p99_ms, fleet.prepare_p95_ms) == (7.0, 6.0, 5.0)
    assert fleet.think_time == 2.0


def test_the_aggregate_sums_collector_steps_and_takes_the_worst_full_collection() -> None:
    """Invariant: steady-state full collections and collector steps add up; the
    longest full collection's CPU is the worst process's."""
    fleet = aggregate(
        [
            _report(gc_full_steady=1, collector_steps=5, collector_thorough_steps=1),
            _report(
                gc_full_cpu_max_ms=3.5,
                gc_full_steady=2,
                collector_steps=7,
                collector_thorough_steps=2,
            ),
        ]
    )
    assert (fleet.gc_full_steady, fleet.collector_steps, fleet.collector_thorough_steps) == (
        3,
        12,
        3,
    )
    assert fleet.gc_full_cpu_max_ms == 3.5


def test_every_process_report_field_is_carried_by_the_fleet_report() -> None:
    """Invariant: FleetReport declares every LoadtestReport field under the same
    name (aggregate() sums or takes the worst of each), so a field added to the
    process report cannot silently miss the fleet's."""
    process = set(LoadtestReport.__struct_fields__)
    fleet = set(FleetReport.__struct_fields__)
    assert fleet - process == {"processes"}
    assert process - fleet == set()


def test_aggregate_says_how_every_figure_adds_up() -> None:
    """Invariant: each figure of a run (RunFigures, written once for both reports)
    is summed, taken from the worst or the lowest process, or computed by aggregate()
    by name, so none falls back to its default in a fleet's report."""
    computed = {"prepares", "seconds", "prepares_per_second", "think_time", "store", "errors"}
    rules = (set(fleet_module._SUMMED), set(fleet_module._WORST), set(fleet_module._LOWEST))
    assert set.union(*rules) | computed == set(RunFigures.__struct_fields__)
    assert sum(map(len, rules)) == len(set.union(*rules))  # each figure has one rule


def test_the_think_time_reaches_every_process(tmp_path: Path) -> None:
    """Invariant: ``--think-time`` is passed to each process of a fleet (it was
    once dropped, so a fleet ran saturated whatever was asked)."""
    out = tmp_path / "fleet.json"
    status = main(
        [
            "loadtest",
            "--sessions",
            "2",
            "--turns",
            "2",
            "--processes",
            "2",
            "--think-time",
            "0.25",
            "--json",
            str(out),
        ]
    )
    report = json.loads(out.read_text())
    assert (status, report["processes"], report["sessions_failed"]) == (0, 2, 0)
    assert (report["think_time"], report["turns"], report["prepares"]) == (0.25, 4, 4)
    assert report["seconds"] >= 0.25  # each session paused before its second turn
    assert report["cpu_seconds"] > 0 and report["render_seconds"] > 0


def test_options_of_one_process_are_refused_with_processes(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Bad input: ``--sustained`` and ``--metrics-port`` work in one process; with
    ``--processes`` they are refused (exit 2, nothing run, the JSON not written)."""
    out = tmp_path / "fleet.json"
    common = ["loadtest", "--sessions", "2", "--processes", "2", "--json", str(out)]
    assert main([*common, "--sustained"]) == 2
    assert main([*common, "--metrics-port", "0"]) == 2
    err = capsys.readouterr().err
    assert "--sustained runs in one process; it cannot be used with --processes." in err
    assert "--metrics-port runs in one process; it cannot be used with --processes." in err
    assert not out.exists()
