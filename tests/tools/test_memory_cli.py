"""``turnloom memory add|search`` and ``turnloom replay --strategy``: results and clear errors."""

from __future__ import annotations

import json
from pathlib import Path

import anyio
import pytest

from turnloom.cli import main
from turnloom.context import TenantScope
from turnloom.stores import SQLiteMemory
from turnloom.tools.replay import replay
from turnloom.tools.trajectories import load_trajectories


def _notes(tmp_path: Path) -> Path:
    path = tmp_path / "notes.txt"
    path.write_text(
        "Prefers a window seat\n\n  Refund requested for flight AB12  \nwindow seat\n",
        encoding="utf-8",
    )
    return path


def _lines(text: str) -> list[list[str]]:
    return [line.split("\t") for line in text.splitlines()]


def test_add_then_search_prints_the_tenants_entries_best_first(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "m.db")
    assert main(["memory", "add", "--db", db, "--tenant", "acme", str(_notes(tmp_path))]) == 0
    out, err = capsys.readouterr()
    assert (out, err) == ("stored 3 entries; tenant 'acme' holds 3.\n", "")
    assert main(["memory", "search", "--db", db, "--tenant", "acme", "window AND seat"]) == 0
    rows = _lines(capsys.readouterr().out)
    assert [row[3] for row in rows] == ["window seat", "Prefers a window seat"]
    assert {row[2] for row in rows} == {"notes.txt"}
    assert float(rows[0][0]) >= float(rows[1][0])


def test_search_with_text_reads_free_words(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = str(tmp_path / "m.db")
    main(["memory", "add", "--db", db, "--tenant", "acme", str(_notes(tmp_path))])
    capsys.readouterr()
    query = "What's up with my refund (AB12)?"
    assert main(["memory", "search", "--db", db, "--tenant", "acme", "--text", query]) == 0
    [row] = _lines(capsys.readouterr().out)
    assert row[3] == "Refund requested for flight AB12"


def test_another_tenant_sees_nothing(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    db = str(tmp_path / "m.db")
    main(["memory", "add", "--db", db, "--tenant", "acme", str(_notes(tmp_path))])
    capsys.readouterr()
    assert main(["memory", "search", "--db", db, "--tenant", "globex", "window"]) == 0
    assert capsys.readouterr().out == ""


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["memory", "search", "--db", "{tmp}/none.db", "--tenant", "a", "x"],
            "turnloom memory search: error: No memory database at '{tmp}/none.db'.\n",
        ),
        (
            ["memory", "search", "--db", "{tmp}/m.db", "--tenant", "a", "flight AND ("],
            "turnloom memory search: error: The FTS5 query 'flight AND (' is malformed: "
            'fts5: syntax error near "".\n',
        ),
        (
            ["memory", "add", "--db", "{tmp}/m.db", "--tenant", "a", "{tmp}/missing.txt"],
            "turnloom memory add: error: cannot read {tmp}/missing.txt: No such file or "
            "directory.\n",
        ),
        (
            ["memory", "search", "--db", "{tmp}/m.db", "--tenant", "a\tb", "x"],
            "turnloom memory search: error: scope.tenant_id 'a\\tb' holds a control or "
            "non-printable character.\n",
        ),
    ],
)
def test_each_error_is_one_clear_line_and_exit_status_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    SQLiteMemory(tmp_path / "m.db").close()
    argv = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    assert main(argv) == 2
    out, err = capsys.readouterr()
    assert (out, err) == ("", message.replace("{tmp}", str(tmp_path)))


def test_replay_with_a_strategy_reports_the_recalled_memory(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    db = tmp_path / "m.db"
    with SQLiteMemory(db) as memory:
        memory.add_many(
            ["business class upgrade costs 300 dollars", "flights to JFK leave hourly"],
            scope=TenantScope(tenant_id="shop"),
        )
    argv = ["replay", "--sessions", "3", "--memory", str(db), "--tenant", "shop"]
    assert main([*argv, "--strategy", "stratified"]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    assert "errors: 0" in out
    [line] = [line for line in out.splitlines() if line.startswith("strategy: ")]
    assert line.startswith("strategy: stratified  hydrated entries: ")
    assert int(line.split("hydrated entries: ")[1].split()[0]) > 0
    assert main([*argv, "--strategy", "jit"]) == 0
    assert "strategy: jit  hydrated entries: 0  prefix reuse: 100.0%" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (
            ["--strategy", "stratified", "--memory", "{tmp}/none.db"],
            "turnloom replay: error: No memory database at '{tmp}/none.db'.\n",
        ),
        (
            ["--memory", "{tmp}/m.db"],
            "turnloom replay: error: --memory needs --strategy jit or --strategy stratified.\n",
        ),
    ],
)
def test_replay_memory_errors_exit_2(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], extra: list[str], message: str
) -> None:
    SQLiteMemory(tmp_path / "m.db").close()
    argv = ["replay", "--sessions", "1", *(a.replace("{tmp}", str(tmp_path)) for a in extra)]
    assert main(argv) == 2
    assert capsys.readouterr().err == message.replace("{tmp}", str(tmp_path))


def test_replay_rejects_an_unknown_strategy_as_a_usage_error(
    capsys: pytest.CaptureFixture[str],
) -> None:
    with pytest.raises(SystemExit) as caught:
        main(["replay", "--strategy", "rag"])
    assert caught.value.code == 2
    assert "invalid choice: 'rag' (choose from 'jit', 'stratified')" in capsys.readouterr().err


@pytest.mark.parametrize("strategy", ["stratified", "jit"])
def test_tau_bench_replays_exactly_outside_what_the_strategy_adds(
    tau_bench_path: Path, strategy: str
) -> None:
    """Every prepared input, without the assembled prompt and the state pair, is
    the trajectory (up to the documented call-id renaming); stratified recalls
    real replies of other sessions for every turn."""
    trajectories, errors = load_trajectories(tau_bench_path)
    assert errors == []
    scope = TenantScope(tenant_id="airline")
    replies = [
        m["content"]
        for t in trajectories[100:]
        for m in t.messages
        if m["role"] == "assistant" and isinstance(m.get("content"), str) and m["content"]
    ]
    with SQLiteMemory() as memory:
        memory.add_many(replies, scope=scope, source="tau-bench")
        summary = anyio.run(
            lambda: replay(
                trajectories[:30], strategy=strategy, memory=memory, scope=scope, concurrency=2
            )
        )
    assert summary.errors == ()
    assert (summary.sessions, summary.strategy) == (30, strategy)
    # 3 of the 282 turns match fewer than top_k = 5 entries.
    assert summary.hydrated_entries == (1407 if strategy == "stratified" else 0)
    assert summary.turns == 282
    assert json.dumps(summary.prefix_reuse)  # a number


def test_replay_refuses_a_strategy_with_a_config(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    config = tmp_path / "turnloom.toml"
    config.write_text('[context]\nplugin = "default"\n', encoding="utf-8")
    code = main(["replay", "--sessions", "1", "--strategy", "jit", "--config", str(config)])
    assert code == 2
    assert capsys.readouterr().err == (
        "turnloom replay: error: --strategy cannot be combined with --config: the configured "
        "plugin builds the manager.\n"
    )
