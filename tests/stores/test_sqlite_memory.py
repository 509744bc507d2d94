"""The SQLite FTS5 memory source: BM25 ranking, isolation in the query, its errors."""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context.memory import MemorySource, TenantScope
from turnloom.errors import InvalidArgumentError, MemoryQueryError, MemoryStoreError
from turnloom.stores import SQLiteMemory, fts_text_query
from turnloom.stores.sqlite_memory import _SEARCH

ACME = TenantScope(tenant_id="acme")
GLOBEX = TenantScope(tenant_id="globex")


def test_sqlite_memory_is_a_memory_source() -> None:
    with SQLiteMemory() as memory:
        assert isinstance(memory, MemorySource)


def test_bm25_ranks_the_entry_with_more_query_words_first() -> None:
    with SQLiteMemory() as memory:
        memory.add("refund policy for cancelled flights", scope=ACME, entry_id="a")
        memory.add("baggage policy", scope=ACME, entry_id="b")
        memory.add("unrelated note about seats", scope=ACME, entry_id="c")
        found = memory.search_text("flight refund policy", scope=ACME, top_k=5)
    assert [e.id for e in found] == ["a", "b"]
    assert found[0].score > found[1].score
    assert found[0].source == ""


def test_top_k_bounds_the_results() -> None:
    with SQLiteMemory() as memory:
        memory.add_many([f"seat note {i}" for i in range(6)], scope=ACME, source="bulk")
        assert len(memory.search_text("seat", scope=ACME, top_k=4)) == 4
        assert memory.count(ACME) == 6


def test_a_sub_tenant_and_a_namespace_are_scopes_of_their_own() -> None:
    with SQLiteMemory() as memory:
        memory.add("window seat", scope=ACME, entry_id="t")
        memory.add("window seat", scope=TenantScope(tenant_id="acme", sub_tenant_id="u"))
        memory.add("window seat", scope=TenantScope(tenant_id="acme", namespace="n"))
        assert [e.id for e in memory.search_text("window", scope=ACME, top_k=9)] == ["t"]
        assert memory.count(TenantScope(tenant_id="acme", sub_tenant_id="u")) == 1


def test_adding_an_entry_id_again_replaces_its_text_in_the_index() -> None:
    with SQLiteMemory() as memory:
        memory.add("old words", scope=ACME, entry_id="x")
        memory.add("new text", scope=ACME, entry_id="x")
        assert memory.search_text("old", scope=ACME, top_k=3) == []
        assert [e.text for e in memory.search_text("new", scope=ACME, top_k=3)] == ["new text"]
        assert memory.count(ACME) == 1


def test_the_same_text_added_twice_is_one_entry() -> None:
    with SQLiteMemory() as memory:
        first = memory.add("same", scope=ACME)
        assert memory.add("same", scope=ACME) == first
        assert memory.count(ACME) == 1


def test_free_text_is_never_fts_syntax() -> None:
    """Operators, quotes and punctuation in a user's question cannot break the query."""
    assert fts_text_query('What\'s "NEAR" my flight? AND (OR*') == '"near" OR "flight"'
    assert fts_text_query("What is it?") == '"what" OR "is" OR "it"'  # nothing else is left
    assert fts_text_query(" ".join(f"w{n}" for n in range(40))).count(" OR ") == 15
    assert fts_text_query("?!") == ""
    with SQLiteMemory() as memory:
        memory.add("flight near gate", scope=ACME, entry_id="g")
        assert [e.id for e in memory.search_text('NEAR( "flight', scope=ACME, top_k=2)] == ["g"]
        assert memory.search_text("?!", scope=ACME, top_k=2) == []


def test_a_malformed_fts_query_is_a_typed_error_naming_the_query() -> None:
    with SQLiteMemory() as memory, pytest.raises(MemoryQueryError) as caught:
        memory.search_fts("flight AND (", scope=ACME, top_k=3)
    assert caught.value.query == "flight AND ("
    assert "malformed" in str(caught.value)


def test_an_empty_fts_query_is_a_typed_error() -> None:
    with SQLiteMemory() as memory, pytest.raises(MemoryQueryError):
        memory.search_fts("  ", scope=ACME, top_k=3)


def test_a_missing_database_is_an_error_when_not_creating(tmp_path: Path) -> None:
    path = tmp_path / "none.db"
    with pytest.raises(MemoryStoreError, match="No memory database"):
        SQLiteMemory(path, create=False)
    assert not path.exists()


def test_a_file_that_is_not_sqlite_is_a_store_error(tmp_path: Path) -> None:
    path = tmp_path / "junk.db"
    path.write_bytes(b"not a database" * 100)
    with pytest.raises(MemoryStoreError, match="not a usable memory database"):
        SQLiteMemory(path)


def test_entries_persist_in_a_file(tmp_path: Path) -> None:
    """A file database persists, in WAL mode so searches never block a writer."""
    path = tmp_path / "m.db"
    with SQLiteMemory(path) as memory:
        memory.add("aisle seat", scope=ACME, entry_id="s", source="crm")
    with sqlite3.connect(path) as connection:
        assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    with SQLiteMemory(path, create=False) as memory:
        [entry] = memory.search_text("aisle", scope=ACME, top_k=1)
    assert (entry.id, entry.text, entry.source) == ("s", "aisle seat", "crm")


def test_a_closed_store_refuses_calls_and_close_is_idempotent() -> None:
    memory = SQLiteMemory()
    memory.close()
    memory.close()
    assert memory.closed
    with pytest.raises(MemoryStoreError, match="closed"):
        memory.search_text("x", scope=ACME, top_k=1)


@pytest.mark.parametrize(
    ("call", "field"),
    [
        (lambda m: m.add(" ", scope=ACME), "texts[0]"),
        (lambda m: m.add("x", scope=None), "scope"),
        (lambda m: m.add("x", scope=ACME, entry_id=""), "entry_ids[0]"),
        (lambda m: m.add("\ud800", scope=ACME), "texts[0]"),
        (lambda m: m.search_text("x", scope=ACME, top_k=0), "top_k"),
        (lambda m: m.search_text(3, scope=ACME, top_k=1), "query"),
    ],
)
def test_bad_arguments_are_rejected_before_anything_is_stored(call: object, field: str) -> None:
    with SQLiteMemory() as memory:
        with pytest.raises(InvalidArgumentError) as caught:
            call(memory)  # type: ignore[operator]
        assert caught.value.field == field
        assert memory.count(ACME) == 0


def test_add_many_is_all_or_nothing() -> None:
    with SQLiteMemory() as memory:
        with pytest.raises(InvalidArgumentError):
            memory.add_many(["good", " "], scope=ACME)
        assert memory.count(ACME) == 0


def test_the_scope_filter_is_inside_the_search_statement() -> None:
    """Isolation in the query itself: the plan filters the scope before LIMIT."""
    assert "e.tenant_id = ?" in _SEARCH and _SEARCH.index("tenant_id") < _SEARCH.index("LIMIT")
    with SQLiteMemory() as memory:
        memory.add("flight", scope=ACME)
        memory.add("flight", scope=GLOBEX)
        memory.add("flight", scope=GLOBEX, entry_id="2")
        # With LIMIT 1 a filter applied afterwards could return nothing for acme.
        [only] = memory.search_text("flight", scope=ACME, top_k=1)
        assert only.text == "flight"


_tenants = st.sampled_from(["t0", "t1", "t2", "t3"])


@settings(max_examples=60)
@given(
    rows=st.lists(st.tuples(_tenants, st.integers(0, 5)), min_size=1, max_size=30),
    tenant=_tenants,
    k=st.integers(1, 10),
)
def test_a_search_returns_only_entries_of_its_own_tenant(
    rows: list[tuple[str, int]], tenant: str, k: int
) -> None:
    """Isolation: every entry found was stored in the searched scope, and all fit in top_k."""
    words = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"]
    with SQLiteMemory() as memory:
        owner: dict[str, str] = {}
        for n, (t, w) in enumerate(rows):
            entry_id = f"{t}-{n}"
            memory.add(f"{words[w]} note", scope=TenantScope(tenant_id=t), entry_id=entry_id)
            owner[entry_id] = t
        found = memory.search_text(" ".join(words), scope=TenantScope(tenant_id=tenant), top_k=k)
    assert all(owner[e.id] == tenant for e in found)
    assert len(found) == min(k, sum(1 for t, _ in rows if t == tenant))
