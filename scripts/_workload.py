"""The load test's built-in workload, for the scripts that replay it."""

from __future__ import annotations

from turnloom.context.message import Message
from turnloom.tools.trajectories import Trajectory, builtin_trajectories, check_trajectory


def builtin_workload(turns: int, count: int = 64) -> tuple[list[Trajectory], list[list[Message]]]:
    """``count`` built-in trajectories of ``turns`` turns each, and each one checked, as messages.

    Raises:
        AssertionError: a built-in trajectory fails its check (a bug of the tools).
    """
    trajectories = builtin_trajectories(count, turns=(turns, turns))
    scripts = []
    for trajectory in trajectories:
        checked = check_trajectory(trajectory)
        assert isinstance(checked, list), checked
        scripts.append(checked)
    return trajectories, scripts
