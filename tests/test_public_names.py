"""The names a user reaches for are where they look, and cost nothing until used."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import turnloom
import turnloom.context
import turnloom.errors
import turnloom.runtime
import turnloom.runtime.errors
import turnloom.runtime.metrics
import turnloom.stores

ROOT = Path(__file__).resolve().parents[1]

_HOMES = (turnloom.context, turnloom.runtime, turnloom.runtime.metrics, turnloom.stores)


@pytest.mark.parametrize("name", [n for n in turnloom.__all__ if n != "__version__"])
def test_each_top_level_name_is_the_object_its_layer_defines(name: str) -> None:
    """``turnloom.X`` is the very object of the subpackage that exports ``X``."""
    value = getattr(turnloom, name)
    homes = [m for m in (*_HOMES, turnloom.errors) if name in m.__all__]
    assert homes, f"{name} is in no layer's __all__"
    assert all(getattr(m, name) is value for m in homes)


def test_the_main_entry_points_are_top_level_names() -> None:
    wanted = {
        "Foundation",
        "ContextManager",
        "Message",
        "Role",
        "ContextPrepareRequest",
        "PreparedContext",
        "TurnSnapshot",
        "get_gateway",
        "HistoryView",
        "FoundationClosedError",
        "TurnloomError",
        "serve_metrics",
        "MetricsServer",
    }
    assert wanted <= set(turnloom.__all__)
    assert list(turnloom.__all__) == sorted(turnloom.__all__, key=lambda n: (n.islower(), n))


def test_an_unknown_top_level_name_raises_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'turnloom' has no attribute 'Foundatoin'"):
        turnloom.Foundatoin  # noqa: B018


def test_importing_turnloom_loads_no_layer_until_a_name_is_used() -> None:
    """``import turnloom`` loads only the errors module (and the root error it re-exports,
    ``_root_error``) and the version: no anyio, no runtime."""
    code = (
        "import sys, turnloom\n"
        "print(sorted(m for m in sys.modules if m.startswith(('turnloom', 'anyio', 'trio'))))\n"
        "turnloom.Foundation\n"
        "print('turnloom.runtime' in sys.modules)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=ROOT
    )
    loaded = "['turnloom', 'turnloom._root_error', 'turnloom._version', 'turnloom.errors']"
    assert done.stdout == f"{loaded}\nTrue\n"


def test_foundation_closed_error_is_in_turnloom_errors_and_at_its_old_path() -> None:
    """One class, three import paths; still an anyio ClosedResourceError."""
    import anyio

    from turnloom.errors import FoundationClosedError

    assert FoundationClosedError is turnloom.runtime.errors.FoundationClosedError
    assert FoundationClosedError is turnloom.runtime.FoundationClosedError
    assert "FoundationClosedError" in turnloom.errors.__all__
    assert issubclass(FoundationClosedError, turnloom.errors.TurnloomError)
    assert issubclass(FoundationClosedError, anyio.ClosedResourceError)
    with pytest.raises(AttributeError, match="has no attribute 'NoSuchError'"):
        turnloom.errors.NoSuchError  # noqa: B018


def test_star_import_of_the_errors_module_gives_every_listed_name() -> None:
    namespace: dict[str, object] = {}
    exec("from turnloom.errors import *", namespace)
    assert set(turnloom.errors.__all__) <= set(namespace)


def test_history_view_is_exported_and_is_what_history_returns() -> None:
    import inspect

    from turnloom.context import HistoryView

    assert "HistoryView" in turnloom.context.__all__
    signature = inspect.signature(turnloom.runtime.ContextManager.history)
    assert signature.return_annotation in ("HistoryView", HistoryView)


def test_context_managers_first_docstring_line_says_it_is_not_a_python_one() -> None:
    doc = turnloom.runtime.ContextManager.__doc__
    assert doc is not None
    assert doc.splitlines()[0].startswith("Not a Python context manager:")


def test_the_licence_file_is_mit_as_the_package_says() -> None:
    import tomllib

    licence = (ROOT / "LICENSE").read_text(encoding="utf-8")
    assert licence.splitlines()[0] == "MIT License"
    assert "Copyright (c) 2026 the turnloom authors" in licence
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert project["license"] == {"text": "MIT"}
