"""Declared dependencies match imports: each extra, installed alone in a fresh venv, works.

Invariant: ``pip install turnloom`` (and ``turnloom[redis]``, ``turnloom[tokens]``,
``turnloom[otel]``),
on a machine with nothing else, imports every module it promises. The test
builds a wheel from a copy of this tree (the checkout stays clean), makes one
``python -m venv`` per extra, installs the wheel with that extra (its
dependencies from the package index, as a user's pip does), and imports from
outside the tree with ``PYTHONPATH`` unset. The ``test`` extra that the suite
runs under installs far more, so only this test can see an undeclared import
(``sniffio`` was one). It needs the package index and takes about a minute:
marked ``packaging``; CI runs it with the rest of the suite.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# What each extra promises, checked in the fresh venv. The framework adapters
# (turnloom.integrations.<framework>) are each promised by their own extra.
BASE = """
import importlib, pkgutil, turnloom
names = [
    m.name
    for m in pkgutil.walk_packages(turnloom.__path__, "turnloom.")
    if not m.name.startswith("turnloom.integrations.")
]
for name in names:
    importlib.import_module(name)
from turnloom.stores import open_context_store
open_context_store("sqlite::memory:")
from turnloom.cli import main
print(len(names))
"""
REDIS = """
from turnloom.stores import RedisContextStore
RedisContextStore("redis://127.0.0.1:1/0")  # imports redis.asyncio; no I/O
print("redis")
"""
TOKENS = """
from turnloom.context.tokens import OpenAITokenCounter
assert OpenAITokenCounter().count_text("hello world") == 2
print("tokens")
"""
MISSING = """
from turnloom.errors import MissingDependencyError
from turnloom.stores import RedisContextStore
try:
    RedisContextStore("redis://127.0.0.1:1/0")
except MissingDependencyError as exc:
    assert exc.extra == "redis"
else:
    raise AssertionError("redis is not installed in the base venv")
from turnloom.runtime import _tracing
assert not _tracing.ENABLED and _tracing.TRACER is None  # spans are no-ops without otel
print("missing")
"""
OTEL = """
import importlib.util
from turnloom.runtime import _tracing
assert _tracing.ENABLED and _tracing.TRACER is not None
assert importlib.util.find_spec("opentelemetry.sdk") is None  # the API only
print("otel")
"""


def _run(args: list[str], cwd: Path) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    env["PIP_DISABLE_PIP_VERSION_CHECK"] = "1"
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f"{args[:4]} failed:\n{done.stdout[-2000:]}\n{done.stderr[-4000:]}"
    return done.stdout


@pytest.mark.packaging
def test_each_extra_installed_alone_in_a_fresh_venv_imports_what_it_promises(
    tmp_path: Path,
) -> None:
    tree = tmp_path / "tree"
    shutil.copytree(
        ROOT / "turnloom", tree / "turnloom", ignore=shutil.ignore_patterns("__pycache__")
    )
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, tree / name)
    wheels = tmp_path / "wheels"
    _run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(tree), "-w", str(wheels)],
        tmp_path,
    )
    (wheel,) = wheels.glob("turnloom-*.whl")
    outside = tmp_path / "elsewhere"
    outside.mkdir()
    extras = (("", (BASE, MISSING)), ("redis", (REDIS,)), ("tokens", (TOKENS,)), ("otel", (OTEL,)))

    def install_and_check(extra: str, checks: tuple[str, ...]) -> None:
        # A venv without pip (ensurepip is most of a venv's cost); this pip installs
        # into it (``--python``), resolving the extra as the venv's own pip would.
        home = tmp_path / f"venv-{extra or 'base'}"
        venv.create(home, with_pip=False)
        python = str(home / "bin" / "python")
        spec = f"turnloom[{extra}] @ {wheel.as_uri()}" if extra else f"turnloom @ {wheel.as_uri()}"
        _run([sys.executable, "-m", "pip", "--python", python, "install", "-q", spec], outside)
        for check in checks:
            assert _run([python, "-c", check], outside).strip()

    # The venvs are independent: installed and checked side by side (mostly waiting on
    # the package index); each failure is raised here.
    with ThreadPoolExecutor(max_workers=len(extras)) as pool:
        for done in [pool.submit(install_and_check, *extra) for extra in extras]:
            done.result()
