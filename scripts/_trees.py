"""Import one tree's turnloom beside another's, in one process, for the A/B benches.

``bench_door.py`` and ``bench_steps.py`` time this tree against the tree at
``--against`` in one process: each tree's modules are imported fresh (every
``turnloom`` module already loaded dropped first) and kept, so a bench can
swap them back into ``sys.modules`` before running that tree's code.
"""

from __future__ import annotations

import importlib
import sys
from types import ModuleType


def _is_turnloom(name: str) -> bool:
    return name == "turnloom" or name.startswith("turnloom.")


def import_tree(path: str, names: list[str]) -> tuple[list[ModuleType], dict[str, ModuleType]]:
    """The modules ``names`` (dotted, under ``turnloom``) of the tree at ``path``, freshly imported.

    Returns them in order, with every ``turnloom`` module that import loaded
    (by name, for ``sys.modules.update`` later). ``path`` is on ``sys.path``
    only while importing.
    """
    for name in [n for n in sys.modules if _is_turnloom(n)]:
        del sys.modules[name]
    sys.path.insert(0, path)
    importlib.invalidate_caches()
    try:
        modules = [importlib.import_module(name) for name in names]
    finally:
        sys.path.remove(path)
    return modules, {n: m for n, m in sys.modules.items() if _is_turnloom(n)}
