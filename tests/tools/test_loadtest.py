"""``turnloom loadtest``: many sessions in one Foundation, measured."""

from __future__ import annotations

import json
import math
from pathlib import Path

import anyio
import msgspec
import pytest
from hypothesis import given
from hypothesis import strategies as st

import turnloom.tools.loadtest as loadtest_module
from turnloom.cli import main
from turnloom.errors import InputError
from turnloom.runtime import ContextManager
from turnloom.tools._stats import peak_rss_bytes
from turnloom.tools.loadtest import (
    _SustainedSearch,
    count_model_calls,
    loadtest,
    sustained_sessions,
)
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


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_sessions_start_one_per_loop_iteration(backend: str) -> None:
    """Invariant: sessions arrive one per event-loop iteration, as a server accepts
    connections, so the first model call comes before most sessions have committed
    their first turn (were all first steps run in one iteration, every context would
    exist by then, and the loop would stall for sessions x a first step)."""
    sessions = 40
    managers: list[ContextManager] = []
    held_at_first_call: list[int] = []

    def on_model_call() -> None:
        if not held_at_first_call:
            held_at_first_call.append(len(managers[0].context_ids()))

    report = anyio.run(
        lambda: loadtest(
            builtin_trajectories(2, turns=(3, 3)),
            sessions=sessions,
            turns=3,
            on_open=lambda foundation: managers.append(foundation.manager),
            on_model_call=on_model_call,
        ),
        backend=backend,
    )
    assert (report.sessions, report.sessions_failed) == (sessions, 0)
    assert 1 <= held_at_first_call[0] <= 4


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


def test_think_time_pauses_between_turns_and_is_reported() -> None:
    """Each session pauses ``think_time`` before each turn after its first (and
    starts within one think time): 3 turns at 0.05 s take at least 0.1 s."""
    trajectories = builtin_trajectories(2, turns=(3, 3))
    report = anyio.run(lambda: loadtest(trajectories, sessions=2, turns=3, think_time=0.05))
    assert (report.turns, report.prepares, report.sessions_failed) == (6, 6, 0)
    assert report.think_time == 0.05
    assert report.seconds >= 0.1


@pytest.mark.parametrize("think_time", [-0.5, math.inf, math.nan])
def test_a_bad_think_time_is_an_input_error(think_time: float) -> None:
    with pytest.raises(InputError, match="think_time must be a finite number >= 0"):
        anyio.run(lambda: loadtest(builtin_trajectories(1), sessions=1, think_time=think_time))


def test_sustained_search_doubles_up_to_the_cap_when_every_run_holds() -> None:
    """The search doubles from ``start`` and never runs more than ``max_sessions``."""
    trajectories = builtin_trajectories(2, turns=(2, 2))
    result = anyio.run(
        lambda: sustained_sessions(
            trajectories, start=1, turns=2, think_time=0.0, p99_limit_ms=math.inf, max_sessions=5
        )
    )
    assert [run.sessions for run in result.runs] == [1, 2, 4, 5]
    assert (result.sessions, result.think_time) == (5, 0.0)


def test_sustained_search_halves_to_zero_when_no_run_holds() -> None:
    """A limit no run meets (p99 < 0 ms): start, then halving to one session, result 0."""
    trajectories = builtin_trajectories(1, turns=(1, 1))
    result = anyio.run(
        lambda: sustained_sessions(trajectories, start=4, turns=1, think_time=0.0, p99_limit_ms=0.0)
    )
    assert [run.sessions for run in result.runs] == [4, 2, 1]
    assert result.sessions == 0


def test_sustained_search_bisects_between_the_holding_and_the_missing_count(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Doubling 10, 20, 40, 80 (misses), then bisecting 60, 50, 45, 47, 48: the
    result is the largest count that held, within ``precision`` of one that missed.

    The runs are replaced by a model whose p99 in milliseconds is the session count.
    """
    template = anyio.run(lambda: loadtest(builtin_trajectories(1), sessions=1, turns=1))

    async def model(trajectories: object, *, sessions: int, **options: object) -> object:
        return msgspec.structs.replace(template, sessions=sessions, prepare_p99_ms=float(sessions))

    monkeypatch.setattr(loadtest_module, "loadtest", model)
    result = anyio.run(
        lambda: sustained_sessions(
            builtin_trajectories(1), start=10, p99_limit_ms=48.5, precision=1.01
        )
    )
    assert [run.sessions for run in result.runs] == [10, 20, 40, 80, 60, 50, 45, 47, 48, 49]
    assert result.sessions == 48


def test_sustained_search_by_default_brackets_the_result_within_ten_percent(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The default precision (1.1) bisects until the count that missed is at most
    10% above the one that held, and the report gives both: 1,000 holds, 2,000
    misses, then 1,500 (holds), 1,750 (misses), 1,625 (holds): the limit is p99
    under 50 ms, the model's p99 is sessions / 34 ms, so 1,699 is the true count.

    At 1.25 the search would stop at 1,500 / 1,750, too coarse to tell a 1.5x
    change between two searches.
    """
    template = anyio.run(lambda: loadtest(builtin_trajectories(1), sessions=1, turns=1))

    async def model(trajectories: object, *, sessions: int, **options: object) -> object:
        return msgspec.structs.replace(
            template, sessions=sessions, prepare_p99_ms=float(sessions) / 34
        )

    monkeypatch.setattr(loadtest_module, "loadtest", model)
    result = anyio.run(lambda: sustained_sessions(builtin_trajectories(1), start=1000))
    assert [run.sessions for run in result.runs] == [1000, 2000, 1500, 1750, 1625]
    assert (result.sessions, result.missed) == (1625, 1750)


@given(
    start=st.integers(1, 5000),
    extra=st.integers(0, 5000),
    limit=st.integers(0, 12000),
    precision=st.floats(1.01, 4.0),
)
def test_sustained_search_plan_ends_between_the_last_count_held_and_the_first_missed(
    start: int, extra: int, limit: int, precision: float
) -> None:
    """Oracle: with monotone verdicts (every count up to ``limit`` holds), the plan
    ends with ``good <= limit < bad`` and ``bad`` within ``precision`` of ``good``
    (or ``good + 1``); with no miss, ``good`` is the cap. Every count planned lies
    in ``[1, max_sessions]``, strictly between the bracket so far, and none twice.
    """
    cap = start + extra
    search = _SustainedSearch(start=start, precision=precision, max_sessions=cap)
    planned: list[int] = []
    while search.next is not None:
        count = search.next
        assert 1 <= count <= cap
        assert search.good < count and (not search.bad or count < search.bad)
        planned.append(count)
        search.record(count <= limit)
    assert len(planned) == len(set(planned))
    assert search.good == max((c for c in planned if c <= limit), default=0)
    assert search.bad == min((c for c in planned if c > limit), default=0)
    if not search.bad:
        assert search.good == cap <= limit
    else:
        assert search.good <= limit < search.bad
        assert search.bad <= max(search.good * precision, search.good + 1)
    with pytest.raises(RuntimeError, match="the sustained search is over"):
        search.record(True)


def test_sustained_search_refuses_bad_arguments() -> None:
    trajectories = builtin_trajectories(1, turns=(1, 1))
    with pytest.raises(InputError, match="precision must be above 1"):
        anyio.run(lambda: sustained_sessions(trajectories, precision=1.0))
    with pytest.raises(InputError, match="start must be between 1 and max_sessions"):
        anyio.run(lambda: sustained_sessions(trajectories, start=0))


def test_the_cli_reports_sustained_sessions(capsys: pytest.CaptureFixture[str]) -> None:
    status = main(
        [
            "loadtest",
            "--sessions",
            "2",
            "--turns",
            "1",
            "--think-time",
            "0.01",
            "--sustained",
            "--no-progress",
        ]
    )
    assert status == 0
    out, err = capsys.readouterr()
    assert out.startswith("sustained: ")
    assert "sessions at prepare p99 < 50 ms with a 0.01 s think time (backend asyncio, " in out
    assert "     2 sessions: prepare p99 " in err


def test_the_cli_refuses_a_negative_think_time(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["loadtest", "--think-time", "-1"])
    assert exit_info.value.code == 2
    assert "-1.0 is not a finite number of seconds >= 0" in capsys.readouterr().err


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
