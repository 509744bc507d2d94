"""Layering rules of DESIGN.md, checked on the source.

Imports point down: ``context`` (synchronous, pure) <- ``areas`` <- ``runtime``
(async) <- ``tools`` <- ``cli``; ``stores`` (I/O adapters) sit under
``runtime``, which defines their protocols. Every import of every module is resolved to
its full dotted name (relative imports against the module's own package, and
imports under ``if TYPE_CHECKING`` included), so a rule on
``turnloom.runtime`` catches ``from ..runtime import x`` as well as
``import turnloom.runtime.manager``.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "turnloom"
EVENT_LOOPS = ("anyio", "trio", "asyncio")


def _module_name(path: Path) -> str:
    parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def imported_modules(path: Path) -> set[str]:
    """The full dotted names of every module ``path`` imports (relative ones resolved).

    ``from a.b import c`` yields ``a.b`` and ``a.b.c`` (``c`` may be a module).
    """
    module = _module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                if node.level - 1 >= len(parts):
                    raise AssertionError(f"{module}: relative import beyond the top package")
                base = ".".join(parts[: len(parts) - (node.level - 1)])
                source = f"{base}.{node.module}" if node.module else base
            else:
                assert node.module is not None
                source = node.module
            names.add(source)
            names.update(f"{source}.{alias.name}" for alias in node.names)
    return names


def _under(name: str, prefixes: tuple[str, ...]) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


def _offenders(folder: str, forbidden: tuple[str, ...]) -> dict[str, list[str]]:
    root = PACKAGE / folder if folder else PACKAGE
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*.py")):
        bad = sorted(n for n in imported_modules(path) if _under(n, forbidden))
        if bad:
            found[str(path.relative_to(PACKAGE))] = bad
    return found


def test_only_the_metrics_module_imports_prometheus_client() -> None:
    users = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(_under(n, ("prometheus_client",)) for n in imported_modules(p))
    }
    assert users == {"runtime/metrics.py"}


def test_the_context_layer_imports_no_event_loop_and_nothing_above_it() -> None:
    forbidden = (*EVENT_LOOPS, "turnloom.areas", "turnloom.runtime", "turnloom.tools")
    assert _offenders("context", (*forbidden, "turnloom.cli")) == {}


def test_areas_import_only_the_context_layer() -> None:
    forbidden = (*EVENT_LOOPS, "turnloom.runtime", "turnloom.tools", "turnloom.cli")
    assert _offenders("areas", forbidden) == {}


def test_stores_import_nothing_above_them() -> None:
    """Stores are adapters behind the runtime's protocols: they never import the runtime."""
    forbidden = ("turnloom.runtime", "turnloom.areas", "turnloom.tools", "turnloom.cli")
    assert _offenders("stores", forbidden) == {}


def test_the_lower_layers_never_import_the_stores() -> None:
    assert _offenders("context", ("turnloom.stores",)) == {}
    assert _offenders("areas", ("turnloom.stores",)) == {}


def test_only_the_stores_talk_to_redis_and_sqlite() -> None:
    users = {
        str(p.relative_to(PACKAGE)).split("/")[0]
        for p in PACKAGE.rglob("*.py")
        if any(_under(n, ("redis", "sqlite3")) for n in imported_modules(p))
    }
    assert users == {"stores"}


def test_the_runtime_never_imports_the_command_line_jobs() -> None:
    assert _offenders("runtime", ("turnloom.tools", "turnloom.cli", "tqdm")) == {}


def test_stores_import_only_the_context_layer_and_errors() -> None:
    """Stores are I/O adapters behind the context layer's protocols: they import
    ``turnloom.context`` and ``turnloom.errors`` of turnloom, and anyio only to reach
    a worker thread (no other event-loop library)."""
    forbidden = (
        "trio",
        "asyncio",
        "turnloom.runtime",
        "turnloom.areas",
        "turnloom.tools",
        "turnloom.cli",
    )
    assert _offenders("stores", forbidden) == {}
    allowed = ("turnloom.context", "turnloom.errors", "turnloom.stores")
    outside = {
        str(path.relative_to(PACKAGE)): sorted(
            n for n in imported_modules(path) if _under(n, ("turnloom",)) and not _under(n, allowed)
        )
        for path in sorted((PACKAGE / "stores").rglob("*.py"))
    }
    assert {k: v for k, v in outside.items() if v} == {}


def test_the_runtime_knows_stores_only_through_the_memory_protocol() -> None:
    assert _offenders("runtime", ("turnloom.stores",)) == {}
    assert _offenders("context", ("turnloom.stores",)) == {}


def test_only_the_plot_module_imports_matplotlib() -> None:
    """matplotlib is the ``plot`` extra: one module imports it, and only inside a call."""
    users = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(_under(n, ("matplotlib",)) for n in imported_modules(p))
    }
    assert users == {"tools/plot.py"}
    code = "import sys, turnloom.cli\nprint('matplotlib' in sys.modules)\n"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=PACKAGE.parent
    )
    assert done.stdout == "False\n"


def test_only_the_command_line_imports_tqdm() -> None:
    users = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(_under(n, ("tqdm",)) for n in imported_modules(p))
    }
    assert users == {"cli.py"}


@pytest.mark.parametrize(
    ("where", "source", "expected"),
    [
        ("context/pairing.py", "from ..runtime import Foundation", "turnloom.runtime"),
        ("context/pairing.py", "from . import coop", "turnloom.context.coop"),
        ("context/gateways/gemini.py", "from ...areas import notice", "turnloom.areas.notice"),
        ("context/__init__.py", "from .history import TurnHistory", "turnloom.context.history"),
        ("areas/notice.py", "import turnloom.runtime.manager", "turnloom.runtime.manager"),
    ],
)
def test_imports_resolve_to_full_dotted_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str, source: str, expected: str
) -> None:
    """The resolver the rules rely on: relative imports are resolved against the
    importing module's package, and nothing is cut to its top-level name."""
    fake = tmp_path / "turnloom" / where
    fake.parent.mkdir(parents=True, exist_ok=True)
    fake.write_text(source + "\n", encoding="utf-8")
    monkeypatch.setattr(f"{__name__}.PACKAGE", tmp_path / "turnloom")
    assert expected in imported_modules(fake)


def test_importing_the_context_layer_loads_no_event_loop_library() -> None:
    """The WorkingContext lock imports anyio lazily: ``import turnloom.context`` never does."""
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


FRAMEWORKS = {
    "integrations/openai_agents.py": "agents",
    "integrations/livekit.py": "livekit",
    "integrations/pipecat.py": "pipecat",
}


def test_the_core_never_imports_the_integrations_or_a_framework() -> None:
    """Adapters sit on top: nothing outside ``integrations/`` imports them or their frameworks."""
    forbidden = ("turnloom.integrations", *FRAMEWORKS.values())
    found = _offenders("", forbidden)
    assert {k: v for k, v in found.items() if not k.startswith("integrations/")} == {}


def test_each_adapter_is_the_only_module_importing_its_framework() -> None:
    """``integrations/__init__.py`` imports no framework; an adapter imports only its own."""
    users = {
        str(path.relative_to(PACKAGE)): sorted(
            {f for f in FRAMEWORKS.values() if any(_under(n, (f,)) for n in imported_modules(path))}
        )
        for path in sorted(PACKAGE.rglob("*.py"))
    }
    held = {k: v for k, v in users.items() if v}
    assert held == {k: [v] for k, v in FRAMEWORKS.items() if (PACKAGE / k).exists()}
    assert "integrations/__init__.py" not in held


def test_only_the_tracing_module_imports_opentelemetry() -> None:
    """OpenTelemetry is the ``otel`` extra: one module imports it (and degrades without it)."""
    users = {
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if any(_under(n, ("opentelemetry",)) for n in imported_modules(p))
    }
    assert users == {"runtime/_tracing.py"}


def _modules() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(PACKAGE.rglob("*.py"))}


def import_graph() -> dict[str, set[str]]:
    """Each turnloom module -> the turnloom modules it imports, by any import statement.

    Imports under ``if TYPE_CHECKING``, inside functions and at the top all
    count. ``from a.b import c`` names the module ``a.b.c`` when there is one,
    else ``a.b``; the packages above a named module (whose ``__init__`` Python
    runs first) are not counted, or every module of a package re-exporting its
    files would close a loop through that ``__init__``.
    """
    modules = _modules()
    graph: dict[str, set[str]] = {}
    for module, path in modules.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                targets.update(a.name for a in node.names if a.name in modules)
            elif isinstance(node, ast.ImportFrom):
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - (node.level - 1)])
                    source = f"{base}.{node.module}" if node.module else base
                else:
                    source = node.module or ""
                for alias in node.names:
                    named = f"{source}.{alias.name}"
                    if named in modules:
                        targets.add(named)
                    elif source in modules:
                        targets.add(source)
        graph[module] = targets - {module}
    return graph


def import_circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles of ``graph``: its strongly connected parts of two or more
    modules (Tarjan's algorithm), each sorted, largest first."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            part: list[str] = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                part.append(top)
                if top == node:
                    break
            if len(part) > 1:
                circles.append(sorted(part))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return sorted(circles, key=lambda c: (-len(c), c))


def test_the_package_has_no_import_circle() -> None:
    """Imports point one way: no module reaches itself through imports, typing-only
    (``if TYPE_CHECKING``) and function-local ones included. A circle works only
    by the order Python happens to load its modules in, and means no file of it
    can be read, tested or moved without the others."""
    assert import_circles(import_graph()) == []


def test_the_circle_finder_finds_a_circle_and_only_circles() -> None:
    """The finder the rule relies on: a loop through three modules and a self-import
    are told apart from a chain (a self-import is no circle of modules)."""
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": {"d"}, "e": {"a"}}
    assert import_circles(graph) == [["a", "b", "c"]]
    assert import_circles({"a": {"b"}, "b": set()}) == []
