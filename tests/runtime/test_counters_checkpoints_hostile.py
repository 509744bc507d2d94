"""Hostile host token counters and damaged checkpoints: limits, typed errors, restores.

Runs on asyncio and trio (the root conftest's ``anyio_backend``), against the
real SQLite context store under ``tmp_path``.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.runtime.helpers import assistant, call, result, user
from turnloom.context import ApproxTokenCounter, HistoryLimits, Message, PrunePolicy
from turnloom.errors import HostCallbackError, StoreRecordError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio

APPROX = ApproxTokenCounter()
LONG_NOTE = "x" * 1000  # a valid PrunePolicy note (at most 1,024 characters)


class Counter:
    """Honest (ApproxTokenCounter) until ``bad`` is set: then answers it, or raises it."""

    def __init__(self) -> None:
        self.bad: Any = None

    def count(self, messages: Sequence[Message]) -> Any:
        if self.bad is None:
            return APPROX.count(messages)
        if isinstance(self.bad, BaseException):
            raise self.bad
        return self.bad


def _turn(manager: Any, context_id: str, i: int) -> None:
    manager.accept_turn(
        TurnSnapshot(context_id=context_id, turn_id=f"t{i}", input=(user(f"q{i}"),))
    )
    manager.record(context_id, f"t{i}", [call(f"c{i}"), result(f"c{i}", "ok"), assistant("a")])


# -- pruning grows a turn past max_tokens / max_bytes --------------------------------


async def test_pruning_never_leaves_the_history_over_max_tokens() -> None:
    """Contract (HistoryLimits.max_tokens): "most tokens of messages kept across all
    turns"; docs/guarantees.md: eviction "may drop more turns than a limit alone asks
    for, never keep more". A PrunePolicy note longer than the tool result it replaces
    (prune_turns' docstring: "their byte and token counts shrink") grows the earlier
    turn, and nothing evicts afterwards: the history stays over max_tokens.
    """
    limits = HistoryLimits(max_turns=100, max_tokens=200)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        manager.summaries.prune = PrunePolicy(keep_turns=1, note=LONG_NOTE)
        for i in range(4):
            _turn(manager, "c", i)
        tokens = manager.statistics().history.tokens
        assert manager.history("c").turn_ids[-1] == "t3"
        assert tokens <= 200, f"history holds {tokens} tokens, over max_tokens=200"


async def test_pruning_never_leaves_the_history_over_max_bytes() -> None:
    """Contract (HistoryLimits.max_bytes): "most bytes of serialized messages kept".
    Same path as above, measured in bytes.
    """
    probe = HistoryLimits(max_turns=100)
    async with Foundation(history_limits=probe) as foundation:
        _turn(foundation.manager, "c", 0)
        one_turn = foundation.manager.statistics().history.bytes
    limits = HistoryLimits(max_turns=100, max_bytes=one_turn * 2 + 100)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        manager.summaries.prune = PrunePolicy(keep_turns=1, note=LONG_NOTE)
        for i in range(4):
            _turn(manager, "c", i)
        held = manager.statistics().history.bytes
        assert held <= limits.max_bytes, f"history holds {held} bytes, over {limits.max_bytes}"


async def test_a_pruned_log_restores_the_history_its_owner_held(tmp_path: Path) -> None:
    """Contract (docs/durable.md / restore): a claim rebuilds the history its owner
    held, or raises StoreRecordError for a damaged log. The owner's own log, written
    with the same limits, counter and prune policy, must restore as it was held.
    """
    url = f"sqlite:{tmp_path / 'contexts.db'}"
    limits = HistoryLimits(max_turns=100, max_tokens=200)
    async with (
        open_context_store(url) as store,
        Foundation(store=store, history_limits=limits) as owner,
    ):
        manager = owner.manager
        manager.summaries.prune = PrunePolicy(keep_turns=1, note=LONG_NOTE)
        await manager.leases.claim("c")
        for i in range(4):
            _turn(manager, "c", i)
        await manager.leases.flush()
        held = manager.history("c")
        held_ids, held_messages = held.turn_ids, held.messages()
    async with (
        open_context_store(url) as store,
        Foundation(store=store, history_limits=limits) as taker,
    ):
        taker.manager.summaries.prune = PrunePolicy(keep_turns=1, note=LONG_NOTE)
        await taker.manager.leases.claim("c")
        restored = taker.manager.history("c")
        assert (restored.turn_ids, restored.messages()) == (held_ids, held_messages)


# -- a counter failing while a log is replayed ----------------------------------------


@pytest.mark.parametrize("bad", [OSError("tokenizer gone"), -1, float("nan"), True], ids=repr)
async def test_a_counter_failing_during_a_claim_releases_the_lease_and_serves_others(
    tmp_path: Path, bad: object
) -> None:
    """Holds. Contract (_durable_log.restore): "HostCallbackError: the token counter
    failed while the log was replayed"; "any failure ... releases" the lease. The
    Foundation keeps serving other contexts, and a later claim restores the log.
    """
    url = f"sqlite:{tmp_path / 'contexts.db'}"
    limits = HistoryLimits(max_turns=100)
    async with (
        open_context_store(url) as store,
        Foundation(store=store, history_limits=limits) as owner,
    ):
        await owner.manager.leases.claim("c")
        for i in range(3):
            _turn(owner.manager, "c", i)
        await owner.manager.leases.flush()
        expected = owner.manager.history("c").messages()
    counter = Counter()
    async with (
        open_context_store(url) as store,
        Foundation(store=store, history_limits=limits, token_counter=counter) as taker,
    ):
        manager = taker.manager
        counter.bad = bad
        with pytest.raises(HostCallbackError) as caught:
            await manager.leases.claim("c")
        assert caught.value.callback == "token_counter"
        assert "c" not in manager.context_ids()
        counter.bad = None
        await manager.leases.claim("other")
        _turn(manager, "other", 0)
        prepared = await manager.prepare(ContextPrepareRequest(context_id="other", turn_id="t0"))
        assert prepared.turn_id == "t0"
        await manager.leases.claim("c")  # the lease was released: claimable again
        assert manager.history("c").messages() == expected


# -- hand-edited checkpoint rows --------------------------------------------------------


def _rows(path: Path, context_id: str) -> list[tuple[int, bytes]]:
    with sqlite3.connect(path) as db:
        return [
            (int(p), bytes(d))
            for p, d in db.execute(
                "SELECT position, data FROM turnloom_records WHERE context_id = ? "
                "ORDER BY position",
                (context_id,),
            ).fetchall()
        ]


@pytest.mark.parametrize("edit", ["swap", "duplicate", "truncate_bytes"])
async def test_an_edited_log_is_a_store_record_error_or_the_same_history(
    tmp_path: Path, edit: str
) -> None:
    """Holds. Contract (restore): "StoreRecordError: a stored record does not decode or
    apply"; never a silently different history.
    """
    path = tmp_path / "contexts.db"
    url = f"sqlite:{path}"
    limits = HistoryLimits(max_turns=100)
    async with (
        open_context_store(url) as store,
        Foundation(store=store, history_limits=limits) as owner,
    ):
        await owner.manager.leases.claim("c")
        for i in range(3):
            _turn(owner.manager, "c", i)
        await owner.manager.leases.flush()
        expected = owner.manager.history("c").messages()
    rows = _rows(path, "c")
    assert len(rows) >= 3
    with sqlite3.connect(path) as db:
        if edit == "swap":
            (p1, d1), (p2, d2) = rows[1], rows[2]
            db.execute(
                "UPDATE turnloom_records SET data=? WHERE context_id='c' AND position=?", (d2, p1)
            )
            db.execute(
                "UPDATE turnloom_records SET data=? WHERE context_id='c' AND position=?", (d1, p2)
            )
        elif edit == "duplicate":
            p, d = rows[-1]
            db.execute("INSERT INTO turnloom_records VALUES ('c', ?, ?)", (p + 1, d))
            db.execute("UPDATE turnloom_contexts SET length = length + 1 WHERE context_id = 'c'")
        else:
            p, d = rows[1]
            db.execute(
                "UPDATE turnloom_records SET data=? WHERE context_id='c' AND position=?",
                (d[: len(d) // 2], p),
            )
    async with (
        open_context_store(url) as store,
        Foundation(store=store, history_limits=limits) as taker,
    ):
        try:
            await taker.manager.leases.claim("c")
        except StoreRecordError as exc:
            assert exc.context_id == "c"
            assert "c" not in taker.manager.context_ids()
        else:
            assert taker.manager.history("c").messages() == expected
