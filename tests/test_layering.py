"""Layering rules of DESIGN.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "turnloom"


def _imports(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module.split(".")[0])
    return names


def test_only_the_metrics_module_imports_prometheus_client() -> None:
    users = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if "prometheus_client" in _imports(p)
    }
    assert users == {"runtime/metrics.py"}


def test_the_context_layer_never_imports_an_event_loop() -> None:
    offenders = {
        str(p.relative_to(PACKAGE))
        for p in (PACKAGE / "context").rglob("*.py")
        if _imports(p) & {"anyio", "trio", "asyncio", "turnloom.runtime"}
        or "turnloom.runtime" in p.read_text(encoding="utf-8")
    }
    assert offenders == set()


def test_importing_the_context_layer_loads_no_event_loop_library() -> None:
    """The WorkingContext lock imports anyio lazily: ``import turnloom.context`` never does."""
    import subprocess
    import sys

    code = (
        "import sys, turnloom.context\n"
        "loaded = sorted({'anyio', 'trio', 'asyncio'} & set(sys.modules))\n"
        "print(','.join(loaded))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        check=True,
        cwd=PACKAGE.parent,
    )
    assert done.stdout.strip() == ""
