"""Hostile memory sources and assembly strategies, as real hosts build them.

Each test quotes the contract it checks. Tests marked FINDING fail on the
code they were written against.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.runtime.helpers import SYSTEM, user
from turnloom.context import MemoryEntry, TenantScope, ToolCallPart
from turnloom.errors import MemoryStoreError
from turnloom.runtime import (
    ContextPrepareRequest,
    Foundation,
    PreparedContext,
    StrategyOptions,
    TurnSnapshot,
)
from turnloom.stores import SQLiteMemory

pytestmark = pytest.mark.anyio

ACME = TenantScope(tenant_id="acme")


def _turn(manager: Any, turn_id: str, text: str) -> None:
    manager.accept_turn(
        TurnSnapshot(
            context_id="c",
            turn_id=turn_id,
            input=(user(text),),
            instructions=(SYSTEM,) if turn_id == "t1" else None,
        )
    )


def _request(turn_id: str = "t1") -> ContextPrepareRequest:
    return ContextPrepareRequest(context_id="c", turn_id=turn_id, tenant=ACME)


class ScriptedMemory:
    """A host memory source returning whatever ``answer`` yields, call by call."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.calls = 0

    async def search(self, query: str, *, scope: TenantScope, top_k: int) -> Any:
        answer = self.answers[min(self.calls, len(self.answers) - 1)]
        self.calls += 1
        if isinstance(answer, BaseException):
            raise answer
        return answer() if callable(answer) else answer


async def _still_serves(foundation: Foundation, turn_id: str) -> PreparedContext:
    """A later turn of the same Foundation prepares (the Foundation survived)."""
    _turn(foundation.manager, turn_id, "another question")
    return await foundation.manager.prepare(
        ContextPrepareRequest(context_id="c", turn_id=turn_id, tenant=ACME, auto_hydrate=False)
    )


# -- wrong types inside entries ------------------------------------------------


@pytest.mark.parametrize(
    "entry",
    [
        MemoryEntry(id="a", text=None, score=1.0, source="s"),  # type: ignore[arg-type]
        MemoryEntry(id="a", text="t", score="high", source="s"),  # type: ignore[arg-type]
    ],
    ids=["text-none", "score-str"],
)
@pytest.mark.parametrize("strategy", ["stratified"])
async def test_entry_with_wrong_field_types_is_a_store_error(
    entry: MemoryEntry, strategy: str
) -> None:
    # FINDING. AssemblyStrategy.assemble / manager.prepare: "Raises: MemoryStoreError:
    # the memory source failed or returned malformed entries". MemoryEntry is a
    # msgspec Struct, not validated on construction, so a host may build one with
    # text=None or score="high"; it passes _recall's isinstance check.
    async with Foundation(strategy=strategy, memory=ScriptedMemory([entry])) as foundation:
        _turn(foundation.manager, "t1", "window seat")
        with pytest.raises(MemoryStoreError):
            await foundation.manager.prepare(_request())
        await _still_serves(foundation, "t2")


async def test_jit_hydrate_with_wrong_field_types_is_a_store_error() -> None:
    # FINDING. Assembly.hydrate_context: "Raises: ... MemoryStoreError: the memory
    # source failed." (and _recall: "or returned something malformed").
    entry = MemoryEntry(id="a", text=None, score=1.0, source="s")  # type: ignore[arg-type]
    async with Foundation(strategy="jit", memory=ScriptedMemory([entry])) as foundation:
        manager = foundation.manager
        _turn(manager, "t1", "refund")
        prefix = await manager.prepare(_request())
        call = ToolCallPart(call_id="c1", name="hydrate_context", arguments='{"query": "refund"}')
        with pytest.raises(MemoryStoreError):
            await manager.assembly.hydrate_context(prefix, call)


# -- lone surrogates ---------------------------------------------------------------


async def test_stratified_entry_with_a_lone_surrogate_is_a_store_error_and_reassembled() -> None:
    # FINDING. manager.prepare: "MemoryStoreError: the strategy's memory source failed
    # or returned malformed entries; the next prepare of the turn assembles again."
    # Observed: UnicodeEncodeError from the render thread (state.py encode), and the
    # poisoned assembly is cached, so every later prepare of the turn fails the same
    # way without searching again.
    bad = [MemoryEntry(id="a", text="seat \ud800 window", score=1.0, source="s")]
    good = [MemoryEntry(id="b", text="seat window", score=1.0, source="s")]
    memory = ScriptedMemory(bad, good)
    async with Foundation(strategy="stratified", memory=memory) as foundation:
        manager = foundation.manager
        _turn(manager, "t1", "window seat")
        with pytest.raises(MemoryStoreError):
            await manager.prepare(_request())
        prefix = await manager.prepare(_request())
        assert memory.calls == 2
        assert manager.gateway.validate(prefix.items) == []


async def test_jit_hydrate_with_a_lone_surrogate_is_a_store_error() -> None:
    # FINDING. Assembly.hydrate_context: "Raises: ... MemoryStoreError: the memory
    # source failed." Observed: UnicodeEncodeError from the result's JSON encoding.
    entry = MemoryEntry(id="a", text="refund \udfff ok", score=1.0, source="s")
    async with Foundation(strategy="jit", memory=ScriptedMemory([entry])) as foundation:
        manager = foundation.manager
        _turn(manager, "t1", "refund")
        prefix = await manager.prepare(_request())
        call = ToolCallPart(call_id="c1", name="hydrate_context", arguments='{"query": "refund"}')
        with pytest.raises(MemoryStoreError):
            await manager.assembly.hydrate_context(prefix, call)


# -- what search returns, and how it is iterated ----------------------------------------


def _exploding() -> Iterator[MemoryEntry]:
    yield MemoryEntry(id="a", text="t", score=1.0, source="s")
    raise RuntimeError("cursor lost")


async def test_iterable_that_raises_while_iterated_is_a_store_error() -> None:
    # FINDING. _recall: "Raises: MemoryStoreError: the source raised it, raised another
    # error (kept as the __cause__ ...), or returned something malformed."
    # Observed: the RuntimeError escapes prepare untyped (only TypeError is caught).
    async with Foundation(strategy="stratified", memory=ScriptedMemory(_exploding)) as foundation:
        _turn(foundation.manager, "t1", "window seat")
        with pytest.raises(MemoryStoreError) as caught:
            await foundation.manager.prepare(_request())
        assert isinstance(caught.value.__cause__, RuntimeError)
        await _still_serves(foundation, "t2")


async def test_an_oversized_iterable_is_not_consumed_past_top_k() -> None:
    # FINDING. _recall: "Search memory and check what it returned (at most top_k
    # entries)"; "nothing hangs". tuple(found)[:top_k] drains the whole iterable on
    # the event loop: an endless generator blocks the Foundation forever. Bounded
    # here at 10_000 so the test terminates; top_k is 5.
    consumed = 0

    def many() -> Iterator[MemoryEntry]:
        nonlocal consumed
        for n in range(10_000):
            consumed += 1
            yield MemoryEntry(id=str(n), text="t", score=1.0, source="s")

    async with Foundation(strategy="stratified", memory=ScriptedMemory(many)) as foundation:
        _turn(foundation.manager, "t1", "window seat")
        prefix = await foundation.manager.prepare(_request())
    assert prefix.assembled is not None
    assert prefix.assembled.metadata.entries_count == 5
    assert consumed <= 6


async def test_a_source_raising_another_turnloom_error_is_a_store_error() -> None:
    # FINDING. _recall: "MemoryStoreError: the source raised it, raised another error
    # (kept as the __cause__ ...)". Observed: `except TurnloomError: raise` lets a
    # host's StateError through, which prepare documents as "a custom strategy
    # returned something that is not an AssembledContext".
    from turnloom.errors import StateError

    memory = ScriptedMemory(StateError("my own pool is exhausted"))
    async with Foundation(strategy="stratified", memory=memory) as foundation:
        _turn(foundation.manager, "t1", "window seat")
        with pytest.raises(MemoryStoreError):
            await foundation.manager.prepare(_request())


# -- contracts that hold ------------------------------------------------------------------


async def test_holds_a_failing_source_never_takes_the_foundation_down() -> None:
    # HOLDS. prepare: "MemoryStoreError: the strategy's memory source failed ...; the
    # next prepare of the turn assembles again."
    good = [MemoryEntry(id="b", text="seat", score=1.0, source="s")]
    memory = ScriptedMemory(ValueError("boom"), good)
    async with Foundation(strategy="stratified", memory=memory) as foundation:
        _turn(foundation.manager, "t1", "window seat")
        with pytest.raises(MemoryStoreError):
            await foundation.manager.prepare(_request())
        prefix = await foundation.manager.prepare(_request())
        assert memory.calls == 2
        assert prefix.assembled is not None and prefix.assembled.metadata.entries_count == 1


async def test_holds_two_prepares_of_a_turn_are_identical_though_the_source_changed() -> None:
    # HOLDS. assembly.py: "the ContextManager awaits [assemble] once per turn ...;
    # every later preparation and model call of that turn reuses the AssembledContext."
    one = [MemoryEntry(id="a", text="one", score=1.0, source="s")]
    two = [MemoryEntry(id="b", text="two", score=2.0, source="s")]
    memory = ScriptedMemory(one, two)
    async with Foundation(strategy="stratified", gateway="anthropic", memory=memory) as foundation:
        manager = foundation.manager
        _turn(manager, "t1", "window seat")
        first = await manager.prepare(_request())
        second = await manager.prepare(_request())
    assert memory.calls == 1
    assert second.items == first.items
    assert second.assembled == first.assembled
    assert manager.gateway.validate(second.items) == []


async def test_holds_duplicate_and_huge_entries_stay_capped_and_valid() -> None:
    # HOLDS. memory_payload: texts "capped at max_chars in total"; prepared input valid.
    huge = MemoryEntry(id="a", text="x" * 200_000, score=1.0, source="s")
    memory = ScriptedMemory([huge, huge, huge])
    options = StrategyOptions(max_memory_chars=100)
    async with Foundation(strategy="stratified", memory=memory, strategy_options=options) as f:
        _turn(f.manager, "t1", "window seat")
        prefix = await f.manager.prepare(_request())
        assert f.manager.gateway.validate(prefix.items) == []
    [pair] = [i for i in prefix.items if i.get("tool_call_id") == prefix.state_call_id]
    document = json.loads(pair["content"])
    assert sum(len(e["text"]) for e in document["memory"]["entries"]) == 100
    assert document["memory"]["omitted"] == 2


class HangingMemory:
    def __init__(self) -> None:
        self.entered = anyio.Event()

    async def search(self, query: str, *, scope: TenantScope, top_k: int) -> list[MemoryEntry]:
        self.entered.set()
        await anyio.sleep_forever()
        raise AssertionError


async def test_holds_cancelling_a_prepare_stuck_in_a_hanging_source_frees_its_slot() -> None:
    # HOLDS. prepare: "Cancelled later: the preparation is cancelled if it still waits
    # for its assembly (the strategy's memory I/O ...); the slot is freed".
    memory = HangingMemory()
    async with Foundation(strategy="stratified", memory=memory) as foundation:
        manager = foundation.manager
        _turn(manager, "t1", "window seat")
        with anyio.fail_after(5):
            async with anyio.create_task_group() as group:

                async def prepare() -> None:
                    await manager.prepare(_request())

                group.start_soon(prepare)
                await memory.entered.wait()
                group.cancel_scope.cancel()
        assert manager.statistics().preparations.pending == 0
        await _still_serves(foundation, "t2")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"top_k": 101},
        {"top_k": 0},
        {"max_memory_chars": -1},
        {"cache_min_tokens": 0},
        {"prompt_budget": 1 << 21},
        {"top_k": 5.0},
        {"top_k": True},
    ],
)
def test_holds_options_out_of_range_are_input_errors(kwargs: dict[str, Any]) -> None:
    # HOLDS. Foundation: "bad strategy options" raise InputError naming the field.
    from turnloom.errors import InputError

    with pytest.raises(InputError, match=rf"strategy_options\.{next(iter(kwargs))}"):
        Foundation(strategy="stratified", strategy_options=StrategyOptions(**kwargs))


# -- the SQLite store -----------------------------------------------------------------------


def test_holds_concurrent_writers_on_one_file_lose_nothing(tmp_path: Path) -> None:
    # HOLDS. sqlite_memory: "every method may be called from any thread"; add_many is
    # "one transaction (all or none)"; WAL + busy timeout for other connections.
    path = tmp_path / "m.db"
    stores = [SQLiteMemory(path), SQLiteMemory(path)]
    errors: list[BaseException] = []

    def write(store: SQLiteMemory, worker: int) -> None:
        try:
            for n in range(25):
                store.add_many(
                    [f"note {worker} {n} a", f"note {worker} {n} b"],
                    scope=ACME,
                    entry_ids=[f"{worker}-{n}-a", f"{worker}-{n}-b"],
                )
        except BaseException as exc:  # pragma: no cover - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(stores[w % 2], w)) for w in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == []
        assert stores[0].count(ACME) == stores[1].count(ACME) == 300
    finally:
        for store in stores:
            store.close()


def test_holds_a_corrupted_file_is_a_store_error(tmp_path: Path) -> None:
    # HOLDS. SQLiteMemory: "MemoryStoreError: ... the file is not a readable SQLite database."
    path = tmp_path / "bad.db"
    path.write_bytes(b"SQLite format 3\x00" + bytes(range(256)) * 16)
    with pytest.raises(MemoryStoreError):
        SQLiteMemory(path)


async def test_a_foreign_schema_file_is_a_store_error_not_a_malformed_query(tmp_path: Path) -> None:
    # FINDING. SQLiteMemory.search_fts: "MemoryQueryError: the expression is not valid
    # FTS5 syntax ... MemoryStoreError: the store is closed or SQLite failed." A file
    # whose memory_entries table lacks a column (another app's, or a damaged
    # migration) is opened; the valid query '"seat"' is then blamed as malformed
    # (MemoryQueryError, an InputError), and prepare raises it although its Raises
    # list names only MemoryStoreError for the memory source.
    path = tmp_path / "foreign.db"
    connection = sqlite3.connect(path)
    connection.execute(
        "CREATE TABLE memory_entries (id INTEGER PRIMARY KEY, tenant_id, sub_tenant_id, "
        "namespace, entry_id, text)"
    )
    connection.commit()
    connection.close()
    with SQLiteMemory(path) as memory:
        async with Foundation(strategy="stratified", memory=memory) as foundation:
            _turn(foundation.manager, "t1", "window seat")
            with pytest.raises(MemoryStoreError):
                await foundation.manager.prepare(_request())
