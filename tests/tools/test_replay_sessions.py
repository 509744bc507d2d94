"""One session's failure never touches another: context ids are unique by position."""

from __future__ import annotations

import anyio
import pytest

from turnloom.context.history import HistoryLimits
from turnloom.tools.replay import replay, session_ids
from turnloom.tools.trajectories import Trajectory

pytestmark = pytest.mark.anyio

_CAP = 2_000  # bytes: the per-item cap of these replays
_GOOD = [
    {"role": "system", "content": "Be brief."},
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "user", "content": "Bye"},
    {"role": "assistant", "content": "Goodbye."},
]
# Fails in its second turn, after its first prepare: the message is over the cap.
_FAILING = [*_GOOD[:3], {"role": "user", "content": "x" * (2 * _CAP)}, _GOOD[4]]


def test_session_ids_are_unique_by_position_even_for_one_trajectory_twice() -> None:
    twice = Trajectory(source="/a/one.json", index=0, messages=_GOOD)
    other_folder = Trajectory(source="/b/one.json", index=0, messages=_GOOD)
    assert session_ids([twice, twice, other_folder]) == [
        "0:one.json#0",
        "1:one.json#0",
        "2:one.json#0",
    ]


async def test_a_session_failing_mid_run_beside_a_copy_of_itself_hangs_nothing() -> None:
    """The same trajectories given twice, run at once: each copy fails or succeeds alone.

    With one id per trajectory (the old rule) the failing copy removed the
    context its twin was preparing in, and the run never ended.
    """
    failing = Trajectory(source="f.json", index=0, messages=_FAILING)
    good = Trajectory(source="g.json", index=0, messages=_GOOD)
    limits = HistoryLimits(max_item_bytes=_CAP)
    with anyio.fail_after(60):  # a guard against the hang, not a timing assertion
        summary = await replay([failing, failing, good, good], concurrency=4, history_limits=limits)
    assert (summary.sessions, summary.turns, summary.model_calls) == (2, 4, 4)
    assert [(e.source, e.trajectory, e.message) for e in summary.errors] == [
        ("f.json", 0, 3),
        ("f.json", 0, 3),
    ]
    assert all(f"over the per-item cap of {_CAP} bytes" in e.reason for e in summary.errors)
