"""The hosting page's example (docs/hosting.md): the config file and the host-built manager
work as shown, and the command line replays the sample clean with that file."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

from turnloom.runtime import ContextInitConfig, load_config

ROOT = Path(__file__).resolve().parents[1]
HOSTING = (ROOT / "docs" / "hosting.md").read_text(encoding="utf-8")
CLI = (ROOT / "docs" / "cli.md").read_text(encoding="utf-8")


def _block(info: str) -> str:
    blocks: list[str] = re.findall(rf"```{info}\n(.*?)```", HOSTING, flags=re.DOTALL)
    [block] = blocks
    return block


def test_the_readme_config_file_loads_with_the_runtime_defaults(tmp_path: Path) -> None:
    path = tmp_path / "host.yaml"
    path.write_text(_block("yaml"), encoding="utf-8")
    init = load_config(path).context.init_config
    assert init == ContextInitConfig(behavior_rules="Stay within the museum's visitor policy.")


def test_the_readme_host_example_runs_and_prints_what_it_says(tmp_path: Path) -> None:
    (tmp_path / "host.yaml").write_text(_block("yaml"), encoding="utf-8")
    script = tmp_path / "host.py"
    script.write_text(_block("python"), encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env=env,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == _block("text")


def test_the_readme_config_replays_the_sample_clean(tmp_path: Path) -> None:
    """``turnloom replay --sample --config host.yaml`` with the README's own file: the
    runtime-state pairs its behaviour rules add are set aside and counted, never
    compared with the transcript, so every session replays clean (status 0)."""
    (tmp_path / "host.yaml").write_text(_block("yaml"), encoding="utf-8")
    done = subprocess.run(
        [sys.executable, "-m", "turnloom", "replay", "--sample", "--config", "host.yaml"],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert (done.returncode, done.stderr) == (0, "")
    lines = done.stdout.splitlines()
    # Without the config: 1,488 items; each of the 73 inputs adds its turn's pair and
    # keeps the earlier turns' pairs, 626 items in all.
    assert (
        lines[0] == "sessions: 5  turns: 37  model calls prepared: 73  items: 2114  bytes: 1232949"
    )
    assert lines[2].split("wall:")[0] == "normalized: 17  added items: 626  errors: 0  "
    assert "`errors: 0` and `added items: 626`" in CLI.replace("\n", " ")
