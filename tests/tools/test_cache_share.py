"""``turnloom replay`` and ``loadtest`` print the prompt cache share (issue 30).

The share is ``statistics().prefix``: of each context's previous prepared
input, the part its next input repeats, in bytes and (estimated) tokens.
"""

from __future__ import annotations

import anyio
import pytest

from turnloom.cli import main
from turnloom.context.history import HistoryLimits
from turnloom.tools.loadtest import loadtest
from turnloom.tools.replay import replay
from turnloom.tools.trajectories import SAMPLE, load_trajectories

_LINE = (
    "prompt cache share: {} of bytes, {} of tokens "
    "(each context's previous input repeated by its next)"
)


def test_replay_keeps_every_turn_so_the_whole_previous_input_is_repeated(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invariant: without eviction each prefix extends the previous one: a share of 100%."""
    trajectories, _ = load_trajectories(SAMPLE)
    summary = anyio.run(lambda: replay(trajectories, gateway="anthropic"))
    assert (summary.prefix_reuse, summary.prefix_reuse_tokens) == (1.0, 1.0)
    assert main(["replay", "--sample", "--no-progress"]) == 0
    assert _LINE.format("100.0%", "100.0%") in capsys.readouterr().out.splitlines()


def test_loadtest_reports_the_share_its_evictions_lower(
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Invariant: per-turn eviction breaks the prefix after the pinned instructions."""
    trajectories, _ = load_trajectories(SAMPLE)
    kept = anyio.run(lambda: loadtest(trajectories, sessions=5))
    evicting = anyio.run(
        lambda: loadtest(trajectories, sessions=5, history_limits=HistoryLimits(max_turns=2))
    )
    assert kept.evicted_turns == 0 and evicting.evicted_turns > 0
    assert kept.prefix_reuse == 1.0
    assert 0.0 < evicting.prefix_reuse < kept.prefix_reuse
    assert 0.0 < evicting.prefix_reuse_tokens < 1.0
    assert main(["loadtest", "--sessions", "3", "--source", "sample", "--no-progress"]) == 0
    [line] = [x for x in capsys.readouterr().out.splitlines() if x.startswith("prompt cache")]
    assert line.endswith(" of tokens (each context's previous input repeated by its next)")
