"""The API reference builds from the docstrings with warnings as errors.

``mkdocs build --strict`` (the ``docs`` extra) fails on a cross-reference
that names nothing documented, so a renamed or removed object that a
docstring still points to breaks this test. Without the extra the build tests
skip, except under CI (``CI`` set), where a missing extra is a failure.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _convert_roles() -> Callable[[str], str]:
    """``docs/griffe_roles.py``'s converter (it imports griffe, part of the docs extra)."""
    _need_mkdocs()
    spec = importlib.util.spec_from_file_location("griffe_roles", ROOT / "docs" / "griffe_roles.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    convert: Callable[[str], str] = module.convert_roles
    return convert


def _need_mkdocs() -> None:
    missing = [
        name
        for name in ("mkdocs", "mkdocstrings", "mkdocstrings_handlers.python")
        if importlib.util.find_spec(name.split(".")[0]) is None
        or importlib.util.find_spec(name) is None
    ]
    if missing and os.environ.get("CI"):
        pytest.fail(f"CI must install the docs extra (pip install -e '.[docs]'): {missing}")
    if missing:
        pytest.skip(f"the docs extra is not installed: {missing}")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
        capture_output=True,
        text=True,
        check=False,
        cwd=config.parent,
    )


def test_the_api_reference_builds_strict_and_documents_the_entry_points(tmp_path: Path) -> None:
    _need_mkdocs()
    done = _build(ROOT / "mkdocs.yml", tmp_path / "site")
    assert done.returncode == 0, done.stderr
    assert "WARNING" not in done.stderr
    page = (tmp_path / "site" / "reference" / "runtime" / "index.html").read_text("utf-8")
    for anchor in ("turnloom.runtime.Foundation", "turnloom.runtime.ContextManager.prepare"):
        assert f'id="{anchor}"' in page
    top = (tmp_path / "site" / "reference" / "turnloom" / "index.html").read_text("utf-8")
    assert 'id="turnloom.Foundation"' in top
    # The Sphinx roles naming the Foundation in docstrings became links to its anchor.
    assert page.count('href="#turnloom.runtime.Foundation"') >= 3


def test_a_docstring_pointing_at_a_missing_object_fails_the_build(tmp_path: Path) -> None:
    """The strict build is not vacuous: one broken role is enough to fail it."""
    _need_mkdocs()
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "__init__.py").write_text(
        '"""A module.\n\nSee :class:`~turnloom.runtime.NoSuchThing`.\n"""\n', encoding="utf-8"
    )
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "index.md").write_text("# pkg\n\n::: pkg\n", encoding="utf-8")
    config = tmp_path / "mkdocs.yml"
    config.write_text(
        textwrap.dedent(
            f"""\
            site_name: pkg
            strict: true
            plugins:
              - mkdocstrings:
                  handlers:
                    python:
                      paths: [.]
                      options:
                        extensions:
                          - {ROOT / "docs" / "griffe_roles.py"}:SphinxRoles
            """
        ),
        encoding="utf-8",
    )
    done = _build(config, tmp_path / "site")
    assert done.returncode == 1
    assert "Could not find cross-reference target 'turnloom.runtime.NoSuchThing'" in done.stderr


@pytest.mark.parametrize(
    ("role", "markdown"),
    [
        (":class:`~turnloom.runtime.Foundation`", "[`Foundation`][turnloom.runtime.Foundation]"),
        (
            ":meth:`turnloom.runtime.Leases.claim`",
            "[`turnloom.runtime.Leases.claim`][turnloom.runtime.Leases.claim]",
        ),
        (
            ":func:`~turnloom.context.check_message()`",
            "[`check_message`][turnloom.context.check_message]",
        ),
        (":class:`StateError`", "`StateError`"),
        (":meth:`~.HistoryView.render`", "`render`"),
        ("``plain``", "``plain``"),
    ],
)
def test_sphinx_roles_become_cross_references_or_inline_code(role: str, markdown: str) -> None:
    assert _convert_roles()(f"See {role}.") == f"See {markdown}."
