"""The command line: ``turnloom replay`` on good and malformed input."""

from __future__ import annotations

import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from turnloom.cli import main
from turnloom.context import gateway as gateway_module

GOOD = [
    {"role": "system", "content": "Be helpful."},
    {"role": "user", "content": "Hi"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    {"role": "assistant", "content": "It is 42."},
]


def _write_jsonl(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("turnloom replay: error:")]


def test_replay_of_the_builtin_workload_succeeds(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["replay", "--sessions", "3"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert out.startswith("sessions: 3  turns: ")
    assert "prepare latency: p50 " in out
    assert "errors: 0" in out


def test_replay_writes_every_prepared_input(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = _write_jsonl(tmp_path / "good.jsonl", [json.dumps(GOOD), json.dumps({"traj": GOOD})])
    out = tmp_path / "inputs.jsonl"
    assert main(["replay", str(source), "--out", str(out)]) == 0
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted((r["session"], r["turn"], r["call"]) for r in records) == [
        ("0:good.jsonl#0", 0, 0),
        ("0:good.jsonl#0", 0, 1),
        ("1:good.jsonl#1", 0, 0),
        ("1:good.jsonl#1", 0, 1),
    ]
    by_call = {(r["session"], r["call"]): r["messages"] for r in records}
    assert by_call[("0:good.jsonl#0", 0)] == GOOD[:2]
    assert by_call[("0:good.jsonl#0", 1)] == GOOD[:4]
    assert "sessions: 2  turns: 2  model calls prepared: 4" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("bad_line", "message_index", "reason"),
    [
        (json.dumps(GOOD)[:-30] + '{"role": }]', 4, "invalid JSON"),
        (json.dumps([*GOOD[:2], {"role": "wizard", "content": "x"}]), 2, "unknown role 'wizard'"),
        (
            json.dumps([*GOOD[:2], {"role": "tool", "tool_call_id": "zz", "content": "x"}]),
            2,
            "answers call 'zz'",
        ),
    ],
)
def test_a_malformed_trajectory_is_one_error_line_and_the_others_complete(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    bad_line: str,
    message_index: int,
    reason: str,
) -> None:
    source = _write_jsonl(tmp_path / "mixed.jsonl", [json.dumps(GOOD), bad_line, json.dumps(GOOD)])
    assert main(["replay", str(source)]) == 1
    out, err = capsys.readouterr()
    [line] = _errors(err)
    assert line.startswith(
        f"turnloom replay: error: {source}, trajectory 1, message {message_index}: "
    )
    assert reason in line
    assert "sessions: 2  turns: 2  model calls prepared: 4" in out
    assert "errors: 1" in out


def test_invalid_json_in_a_list_file_keeps_the_trajectories_before_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    good = json.dumps({"task_id": 0, "traj": GOOD})
    broken = json.dumps({"task_id": 1, "traj": GOOD}).replace('"content": "42"', '"content": 42,,')
    source = tmp_path / "list.json"
    source.write_text(f"[{good},\n{broken},\n{good}]", encoding="utf-8")
    assert main(["replay", str(source)]) == 1
    out, err = capsys.readouterr()
    [line] = _errors(err)
    assert line.startswith(
        f"turnloom replay: error: {source}, trajectory 1, message 3: invalid JSON"
    )
    assert "sessions: 1  " in out


def test_an_unreadable_file_is_one_line_and_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["replay", str(tmp_path / "missing.json")]) == 2
    [line] = _errors(capsys.readouterr().err)
    assert "missing.json: cannot read the file" in line


def test_a_gateway_missing_from_the_build_is_a_clean_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(gateway_module, "_FACTORIES", {})
    monkeypatch.setattr(gateway_module, "_INSTANCES", {})
    assert main(["replay", "--gateway", "gemini"]) == 2
    assert capsys.readouterr().err == (
        "turnloom replay: error: Gateway 'gemini' is not available in this build.\n"
    )


def test_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as info:
        main(["replay", "--concurrency", "0"])
    assert info.value.code == 2
    with pytest.raises(SystemExit):
        main(["replay", "--gateway", "nope"])
    capsys.readouterr()


def test_python_dash_m_turnloom_runs_the_same_command_line() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "turnloom", "replay", "--sessions", "2"],
        capture_output=True,
        text=True,
        check=False,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sessions: 2  ")


def test_an_empty_file_is_reported_as_holding_no_trajectories(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    source = tmp_path / "empty.jsonl"
    source.write_text("\n")
    assert main(["replay", str(source)]) == 2
    [line] = _errors(capsys.readouterr().err)
    assert line == f"turnloom replay: error: {source}: the file holds no trajectories."


def test_trio_backend_without_trio_is_a_clean_usage_error(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, *args: Any) -> Any:
        return None if name == "trio" else real(name, *args)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    assert main(["replay", "--sessions", "1", "--backend", "trio"]) == 2
    assert capsys.readouterr() == (
        "",
        "turnloom replay: error: the trio backend needs the 'trio' package (pip install trio).\n",
    )


def test_every_door_problem_is_reported_before_anything_runs(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Gateway, backend and output are checked together: one line each, exit 2, no run."""
    monkeypatch.setattr(gateway_module, "_FACTORIES", {})
    monkeypatch.setattr(gateway_module, "_INSTANCES", {})
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None)
    out = tmp_path / "nowhere" / "x.jsonl"
    assert main(["replay", "--gateway", "gemini", "--backend", "trio", "--out", str(out)]) == 2
    assert capsys.readouterr() == (
        "",
        "turnloom replay: error: Gateway 'gemini' is not available in this build.\n"
        "turnloom replay: error: the trio backend needs the 'trio' package (pip install trio).\n"
        f"turnloom replay: error: cannot write --out {out}: the folder {out.parent} does not "
        "exist.\n",
    )
