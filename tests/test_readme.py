"""The README's and the guide pages' commands and programs are the ones that work.

The README keeps the two commands, the main example and a map; the long
sections are pages under ``docs/`` (built strict by ``tests/test_docs.py``).
Every python block of the README and of those pages runs here as a program
and prints the text block that follows it.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from turnloom.context.gateway import GatewayType
from turnloom.tools.trajectories import SAMPLE

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text(encoding="utf-8")
# The guide pages the README's long sections moved to (mkdocs.yml's "Guide").
GUIDE = (
    "cli",
    "guide",
    "voice",
    "compaction",
    "guarantees",
    "hosting",
    "working-contexts",
    "durable",
    "assembly",
    "observability",
    "benchmarks",
    "layout",
    "prompt-cache",
)
PAGES = {
    "README.md": README,
    **{
        f"docs/{name}.md": (ROOT / "docs" / f"{name}.md").read_text(encoding="utf-8")
        for name in GUIDE
    },
}


def _blocks(language: str, text: str = README) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", text, flags=re.DOTALL)


def _every_page(language: str) -> list[str]:
    return [block for text in PAGES.values() for block in _blocks(language, text)]


def _run_python(script: Path, code: str) -> subprocess.CompletedProcess[str]:
    """Run ``code`` as a fresh program in the script's own folder, so files it
    writes (``contexts.db``, ``memory.db``) start absent and stay out of the clone."""
    script.write_text(code, encoding="utf-8")
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH")))),
    }
    return subprocess.run(
        [sys.executable, str(script)],
        capture_output=True,
        text=True,
        check=False,
        cwd=script.parent,
        env=env,
    )


@pytest.mark.parametrize("page", list(PAGES))
def test_each_example_runs_and_prints_what_its_page_says(tmp_path: Path, page: str) -> None:
    """Each python block of the page runs and prints the text block that follows it; a
    page's yaml block is the ``host.yaml`` its program reads (docs/hosting.md)."""
    text = PAGES[page]
    examples = _blocks("python", text)
    outputs = _blocks("text", text)
    assert len(examples) == len(outputs)
    configs = _blocks("yaml", text)
    assert len(configs) <= 1
    for index, (example, expected) in enumerate(zip(examples, outputs, strict=True)):
        folder = tmp_path / f"example{index}"
        folder.mkdir()
        for config in configs:
            (folder / "host.yaml").write_text(config, encoding="utf-8")
        done = _run_python(folder / "example.py", example)
        assert done.returncode == 0, done.stderr
        assert done.stdout == expected


def test_no_example_was_lost_when_the_readme_was_shortened() -> None:
    """The eight programs the long README ran (the forty-line example first) still run:
    one in the README, seven in the guide pages; the README adds one since (summary
    compaction, whose guide page is docs/compaction.md)."""
    assert len(_blocks("python")) == 2
    assert len(_every_page("python")) == len(_every_page("text")) == 11


def test_every_docs_page_with_a_python_block_is_run_by_this_suite() -> None:
    """A page added under docs/ with a program is not left unchecked (docs/prompt-cache.md
    held two fragments that did not run before it was listed here)."""
    with_python = {
        f"docs/{page.name}"
        for page in (ROOT / "docs").glob("*.md")
        if "```python" in page.read_text(encoding="utf-8")
    }
    assert with_python <= set(PAGES)


# What the forty-line example prints on each gateway, as the README says below it.
_EVERY_GATEWAY = {
    GatewayType.openai_chat: "messages 3\nmessages 5\n",
    GatewayType.openai_responses: "input 3\ninput 5\n",
    GatewayType.anthropic: "messages 1\nmessages 3\n",
    GatewayType.gemini: "contents 2\ncontents 4\n",
}


@pytest.mark.parametrize("gateway", list(GatewayType), ids=lambda g: g.value)
def test_the_forty_line_example_is_gateway_neutral(tmp_path: Path, gateway: GatewayType) -> None:
    """Only the gateway name changes: the example reads the body's items_field."""
    example = _blocks("python")[0]
    assert example.count('gateway="openai_chat"') == 1
    done = _run_python(
        tmp_path / "example.py", example.replace('gateway="openai_chat"', f'gateway="{gateway}"')
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == _EVERY_GATEWAY[gateway]
    first, second = (line.split() for line in _EVERY_GATEWAY[gateway].splitlines())
    if gateway is not GatewayType.openai_chat:
        claim = f"`{' '.join(first)}` and `{' '.join(second)}`"
        assert claim in " ".join(README.split())


def test_ci_runs_exactly_the_readme_test_command() -> None:
    install, test = _blocks("bash")
    assert install.strip() == "pip install -e '.[test]' && turnloom replay"
    ci = (ROOT / ".ci" / "run").read_text(encoding="utf-8")
    assert "set -euo pipefail" in ci
    # CI installs the test extra and the optional extras whose tests it runs.
    assert re.search(r"^python -m pip install -e '\.\[test(,[a-z-]+)*\]'$", ci, re.M)
    assert ci.strip().splitlines()[-1] == test.strip()


def _console(command: str) -> tuple[list[str], list[str]]:
    """The README's console block that runs ``command``: its argv and its output lines."""
    for block in _blocks("console"):
        lines = block.strip().splitlines()
        if lines[0].startswith(f"$ {command}"):
            return shlex.split(lines[0][2:]), lines[1:]
    raise AssertionError(f"no console block runs {command!r}")


def test_the_sample_replay_prints_the_readme_figures(tmp_path: Path) -> None:
    """``turnloom replay --sample`` on a fresh clone: the shipped data, the README's counts."""
    argv, expected = _console("turnloom replay --sample")
    done = subprocess.run(
        [sys.executable, "-m", *argv],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},  # this checkout, from another folder
    )
    assert (done.returncode, done.stderr) == (0, "")
    got = done.stdout.splitlines()
    assert got[0] == expected[0]  # sessions, turns, model calls, items, bytes
    assert got[2].split("wall:")[0] == expected[2].split("wall:")[0]  # normalized, errors
    assert (tmp_path / "inputs.jsonl").stat().st_size > 0


def test_the_sample_ships_with_its_licence_and_source_and_is_package_data() -> None:
    folder = SAMPLE.parent
    assert sorted(p.name for p in folder.iterdir()) == [
        "LICENSE",
        "SOURCE.md",
        "tau-bench-airline-5.json",
    ]
    assert "Copyright (c) 2024 Sierra" in (folder / "LICENSE").read_text(encoding="utf-8")
    source = (folder / "SOURCE.md").read_text(encoding="utf-8")
    assert "sierra-research/tau-bench" in source and "MIT License" in source
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert '"tools/data/*.json", "tools/data/*.md", "tools/data/LICENSE"' in pyproject


def test_what_the_readme_commands_write_is_ignored_by_git() -> None:
    """``--out inputs.jsonl`` and ``--json report.json`` never show up as new files."""
    patterns = [
        line.strip()
        for line in (ROOT / ".gitignore").read_text(encoding="utf-8").splitlines()
        if line.strip() and not line.startswith("#")
    ]
    written = re.findall(r"--(?:out|json) (\S+)", "\n".join(_every_page("console")))
    assert sorted(written) == ["inputs.jsonl", "report.json"]
    for name in written:
        assert any(fnmatch.fnmatch(name, pattern) for pattern in patterns), name


@pytest.mark.parametrize("page", list(PAGES))
def test_every_code_block_is_a_language_the_suite_runs_or_checks(page: str) -> None:
    """No fragment hides in an unchecked block: each fence is python (run, output
    compared), text (that output), yaml (the host example's config), console or
    bash (commands checked above)."""
    fences = re.findall(r"^```(.*)$", PAGES[page], flags=re.MULTILINE)
    languages = set(fences[0::2])
    assert languages <= {"python", "text", "yaml", "console", "bash"}
    python = _blocks("python", PAGES[page])
    assert all("\n..." not in block and "    ...  #" not in block for block in python)


def test_what_the_readme_points_to_is_in_the_clone() -> None:
    """Every relative link resolves inside the repository, and the only files named
    outside it are the real-input data the README says stays outside."""
    prose = re.sub(r"```.*?```", "", README, flags=re.DOTALL)
    targets = re.findall(r"\]\(([^)#:\s]+)(?:#[^)]*)?\)", prose)
    assert "docs/design.md" in targets
    missing = [t for t in targets if not (ROOT / t).exists()]
    assert missing == []
    outside = set(re.findall(r"\.\./[\w./-]+", README))
    assert {p for p in outside if not p.startswith("../shared/data/")} == set()
    assert (ROOT / "LICENSE").is_file()


def _slug(heading: str) -> str:
    """The anchor Python-Markdown's toc (MkDocs) and GitHub give a heading."""
    text = re.sub(r"[^\w\s-]", "", heading.replace("`", "")).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def test_every_readme_link_into_docs_names_a_page_and_anchor_that_exist() -> None:
    """The strict docs build checks links inside docs/; this checks the README's, with
    their anchors, and that every guide page is linked from the README's map."""
    prose = re.sub(r"```.*?```", "", README, flags=re.DOTALL)
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", prose)
    assert {page for page, _ in links} >= {f"docs/{name}.md" for name in GUIDE}
    for page, anchor in links:
        text = (ROOT / page).read_text(encoding="utf-8")
        if anchor:
            headings = re.findall(
                r"^#+ (.+)$", re.sub(r"```.*?```", "", text, flags=re.DOTALL), re.M
            )
            assert anchor in {_slug(h) for h in headings}, (page, anchor)
    own = {_slug(h) for h in re.findall(r"^#+ (.+)$", prose, flags=re.MULTILINE)}
    assert set(re.findall(r"\]\(#([^)\s]+)\)", prose)) <= own


def test_the_readme_stays_short_and_keeps_its_places() -> None:
    """The two commands, the main example, a map; the places other work adds to."""
    assert len(README.splitlines()) <= 240
    headings = re.findall(r"^## (.+)$", README, flags=re.MULTILINE)
    assert headings == [
        "Try it",
        "The API in forty lines",
        "Voice hosts",
        "Prompt cache",
        "Long conversations",
        "Documentation",
        "License",
    ]
