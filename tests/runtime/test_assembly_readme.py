"""The assembly page's examples (docs/assembly.md) run and print what they claim."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SECTION = (ROOT / "docs" / "assembly.md").read_text(encoding="utf-8")
EXAMPLES = re.findall(r"```python\n(.*?)```", SECTION, flags=re.DOTALL)


def test_the_section_has_one_example_per_strategy() -> None:
    assert [("stratified" in e, "jit" in e) for e in EXAMPLES] == [(True, False), (False, True)]


@pytest.mark.parametrize(
    ("index", "expected"),
    [(0, "1 ['messages', 'system']\n"), (1, "hydrate_context False\n")],
)
def test_each_assembly_example_runs(tmp_path: Path, index: int, expected: str) -> None:
    script = tmp_path / "example.py"
    script.write_text(EXAMPLES[index], encoding="utf-8")
    done = subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == expected
