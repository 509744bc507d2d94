"""The README's commands and API example are the ones that work."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README, flags=re.DOTALL)


def test_each_api_example_runs_and_prints_what_the_readme_says(tmp_path: Path) -> None:
    """Each python block of the README runs and prints the text block that follows it."""
    examples = _blocks("python")
    outputs = _blocks("text")
    assert len(examples) == len(outputs) == 2
    for index, (example, expected) in enumerate(zip(examples, outputs, strict=True)):
        script = tmp_path / f"example{index}.py"
        script.write_text(example, encoding="utf-8")
        done = subprocess.run(
            [sys.executable, str(script)], capture_output=True, text=True, check=False, cwd=ROOT
        )
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected


def test_ci_runs_exactly_the_readme_test_command() -> None:
    install, test = _blocks("bash")
    assert install.strip() == "pip install -e '.[test]' && turnloom replay"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci
    assert "python -m pip install -e '.[test]'" in ci
    assert ci.strip().splitlines()[-1] == test.strip()
