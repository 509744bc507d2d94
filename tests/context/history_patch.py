"""Replace a name in every module of the ``turnloom.context.history`` package that binds it.

The history is a package whose files import what they call by name (a
``from x import f`` binds ``f`` in each file that uses it), so a test that
makes a step fail replaces the name in each of them, not in one.
"""

from __future__ import annotations

import contextlib
import importlib
import pkgutil
from collections.abc import Iterator
from types import ModuleType

import turnloom.context.history as history_package


def history_modules() -> list[ModuleType]:
    """Every module of the history package, its ``__init__`` first."""
    names = [info.name for info in pkgutil.iter_modules(history_package.__path__)]
    return [
        history_package,
        *(importlib.import_module(f"{history_package.__name__}.{n}") for n in sorted(names)),
    ]


@contextlib.contextmanager
def patched(name: str, replacement: object) -> Iterator[int]:
    """Bind ``name`` to ``replacement`` in every history module that binds it, for the block.

    Yields how many modules were patched.

    Raises:
        AssertionError: no module binds ``name`` (the test would patch nothing).
    """
    modules = [m for m in history_modules() if hasattr(m, name)]
    assert modules, f"no module of turnloom.context.history binds {name!r}"
    saved = [(m, getattr(m, name)) for m in modules]
    for module in modules:
        setattr(module, name, replacement)
    try:
        yield len(modules)
    finally:
        for module, value in saved:
            setattr(module, name, value)
