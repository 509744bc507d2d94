"""``turnloom loadtest``: many sessions in one Foundation, measured."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from turnloom.cli import main
from turnloom.errors import InputError
from turnloom.tools._stats import peak_rss_bytes
from turnloom.tools.loadtest import count_model_calls, loadtest
from turnloom.tools.trajectories import builtin_trajectories


def test_long_sessions_evict_and_a_small_queue_rejects() -> None:
    """40-turn sessions exceed the 32-turn default: each evicts 8 turns, oldest first."""
    trajectories = builtin_trajectories(3, turns=(40, 40))
    report = anyio.run(
        lambda: loadtest(trajectories, sessions=5, turns=40, max_pending_preparations=1)
    )
    assert (report.sessions, report.sessions_failed, report.errors) == (5, 0, ())
    assert (report.turns, report.prepares) == (200, 200)
    assert report.model_calls == count_model_calls(trajectories, sessions=5, turns=40)
    assert report.evicted_turns == 5 * (40 - 32)
    # All five sessions ask at once for the single slot: four are refused first.
    assert report.rejections >= 4
    assert report.prepare_p50_ms <= report.prepare_p95_ms <= report.prepare_p99_ms
    assert report.loop_lag_max_ms >= report.loop_lag_p99_ms
    assert 0 < report.peak_rss_bytes <= peak_rss_bytes()  # a peak never goes down


def test_loadtest_runs_on_trio_too() -> None:
    trajectories = builtin_trajectories(2, turns=(3, 3))
    report = anyio.run(lambda: loadtest(trajectories, sessions=4, turns=3), backend="trio")
    assert (report.turns, report.sessions_failed) == (12, 0)


def test_count_model_calls_cycles_and_truncates() -> None:
    trajectories = builtin_trajectories(2, turns=(5, 5))
    per = [sum(m["role"] == "assistant" for m in t.messages) for t in trajectories]
    assert count_model_calls(trajectories, sessions=3) == per[0] * 2 + per[1]
    assert count_model_calls(trajectories, sessions=1, turns=1) < per[0]


def test_bad_arguments_are_input_errors() -> None:
    with pytest.raises(InputError):
        anyio.run(lambda: loadtest([], sessions=1))
    with pytest.raises(InputError):
        anyio.run(lambda: loadtest(builtin_trajectories(1), sessions=0))


def test_the_cli_writes_a_json_report_and_serves_metrics(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report_path = tmp_path / "report.json"
    status = main(
        [
            "loadtest",
            "--sessions",
            "3",
            "--turns",
            "2",
            "--json",
            str(report_path),
            "--metrics-port",
            "0",
            "--no-progress",
        ]
    )
    assert status == 0
    report = json.loads(report_path.read_text())
    assert (report["sessions"], report["turns"], report["prepares"]) == (3, 6, 6)
    out, err = capsys.readouterr()
    assert "serving metrics at http://127.0.0.1:" in err
    assert out.startswith("sessions: 3  failed: 0  turns: 6  ")
    assert "prepares/s" in out and "event-loop lag: p99 " in out and "peak RSS: " in out
