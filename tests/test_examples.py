"""Each example in ``examples/`` runs offline and prints what its docstring promises.

An example skips when its framework is not installed (the adapters' extras).
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

EXPECTED = {
    "openai_agents_session.py": (
        "agents",
        "agent: Answer 2 (I saw 3 items).\n"
        "agent: Answer 3 (I saw 5 items).\n"
        "items held: ['user', 'function_call', 'function_call_output', 'message', 'user', "
        "'message']\n"
        "after hang-up: []\n",
    ),
    "livekit_voice_agent.py": (
        "livekit.agents",
        "user ['Where is my bag?']\n"
        "assistant ['ToolCallPart']\n"
        "tool ['ToolResultPart']\n"
        "assistant ['Your bag is at gate 4.']\n"
        "user ['Anything else?']\n"
        "assistant ['You can also ']\n"
        "contexts after hang-up: ()\n",
    ),
    "pipecat_pipeline.py": (
        "pipecat",
        # The instructions reach the LLM service, never a message of Pipecat's context.
        "LLM: Be brief. + ['user']\n"
        "LLM: Be brief. + ['user', 'assistant', 'tool']\n"
        "LLM: Be brief. + ['user', 'assistant', 'tool', 'assistant', 'user']\n"
        "user ['Where is my bag?']\n"
        "assistant ['ToolCallPart']\n"
        "tool ['ToolResultPart']\n"
        "assistant ['Your bag is at gate 4.']\n"
        "user ['Anything else?']\n"
        "assistant ['You can also']\n"
        "contexts after hang-up: ()\n",
    ),
    "daemon.py": (
        "anyio",
        "calls: 200, at most 20 at once: True\n"
        "model calls cancelled by a hang-up: 20\n"
        "turns retracted as false starts: 180\n"
        "prepares: 200\n"
        "contexts held now: 0, model calls in flight: 0\n"
        "context logs left in the store: 0\n"
        "the cut reply, as every call's history holds it: ['Your bag costs $25 to send on.']\n",
    ),
}


def _installed(module: str) -> bool:
    try:
        return importlib.util.find_spec(module) is not None
    except ModuleNotFoundError:  # a parent package is absent
        return False


def host_lines(path: Path) -> int:
    """Non-blank, non-comment lines between the example's host-code markers."""
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("# --- host code"))
    end = next(i for i, line in enumerate(lines) if line.startswith("# --- end of host code"))
    body = (line.strip() for line in lines[start + 1 : end])
    return sum(1 for line in body if line and not line.startswith("#"))


def test_every_example_is_checked() -> None:
    assert sorted(p.name for p in (ROOT / "examples").glob("*.py")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_example_runs_offline_and_prints_what_it_did(name: str) -> None:
    framework, expected = EXPECTED[name]
    if not _installed(framework):
        pytest.skip(f"{framework} is not installed (the example's extra)")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / name)],
        capture_output=True,
        text=True,
        env=env,
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_the_examples_host_code_is_at_most_twenty_lines(name: str) -> None:
    """Issue 28's bar: the voice scenario in at most 20 lines of host code per adapter."""
    assert host_lines(ROOT / "examples" / name) <= 20


def test_the_daemon_runs_on_trio_with_the_same_output() -> None:
    """The daemon example uses anyio only: ``--backend trio`` does and prints the same."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "daemon.py"), "--backend", "trio"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == EXPECTED["daemon.py"][1]


def test_the_daemon_answers_help_without_running() -> None:
    """``--help`` prints the usage and the backend choice, and runs no call."""
    done = subprocess.run(
        [sys.executable, str(ROOT / "examples" / "daemon.py"), "--help"],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("usage: daemon.py [-h] [--backend {asyncio,trio}]")
    assert "calls:" not in done.stdout
