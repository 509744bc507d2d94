"""``--config FILE`` on ``turnloom replay`` and ``turnloom loadtest``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnloom.cli import main


def _config(tmp_path: Path, turns: int) -> Path:
    path = tmp_path / "host.yaml"
    path.write_text(
        f"context:\n  plugin: default\n  init_config:\n    history_max_turns: {turns}\n",
        encoding="utf-8",
    )
    return path


def test_replay_builds_its_manager_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The config reaches the manager: one kept turn makes the multi-turn replay differ."""
    assert main(["replay", "--sessions", "2", "--config", str(_config(tmp_path, 1000))]) == 0
    assert "errors: 0" in capsys.readouterr().out
    assert main(["replay", "--sessions", "2", "--config", str(_config(tmp_path, 1))]) == 1
    out, err = capsys.readouterr()
    assert "errors: 2" in out
    assert err.count("the prepared input") == 2


def test_loadtest_builds_its_manager_from_the_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    report = tmp_path / "report.json"
    argv = ["loadtest", "--sessions", "2", "--turns", "3", "--no-progress", "--json", str(report)]
    assert main([*argv, "--config", str(_config(tmp_path, 1))]) == 0
    assert json.loads(report.read_text())["evicted_turns"] == 4  # 2 sessions x (3 - 1) turns
    assert main(argv) == 0
    assert json.loads(report.read_text())["evicted_turns"] == 0
    capsys.readouterr()


@pytest.mark.parametrize("command", [["replay"], ["loadtest", "--no-progress"]])
def test_a_bad_config_is_a_usage_error_naming_the_key(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: list[str]
) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("[context.init_config]\nhistory_max_turns = 'many'\n", encoding="utf-8")
    assert main([*command, "--config", str(bad)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"turnloom {command[0]}: error: In configuration key ")
    assert "'context.init_config.history_max_turns'" in err
