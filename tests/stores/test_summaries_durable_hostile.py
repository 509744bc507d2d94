"""Hostile hosts where summary compaction meets the durable stores (hunt11).

Real SQLite files (asyncio and trio) and the real Redis at 127.0.0.1:6379 under a
unique key prefix (asyncio), through the ``store_url`` fixture. What must hold
(docs/compaction.md "Durable", docs/durable.md): nothing acknowledged is lost; a
restored history is the one it was written from, message for message, and renders
byte-identically; every prepared input passes the gateway's ``validate()``; typed
errors where documented. Tests under "findings" fail on the code they were written
against; those under "attacks that held" pass.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Sequence

import anyio
import pytest
import redis

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.conftest import REDIS_URL
from tests.stores.helpers import expire_lease, hosting
from tests.stores.test_durable_hostile import FailOnNth, GateStore
from turnloom.context import CompactionPolicy, Message, PrunePolicy, TextPart
from turnloom.context.history import HistoryLimits
from turnloom.context.summaries import is_summary_turn
from turnloom.errors import StoreError, StoreRecordError, SummaryError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio


class Gated:
    """A slow summarizer: waits for ``gate``; one user message naming every text it read."""

    def __init__(self) -> None:
        self.gate = anyio.Event()
        self.entered = anyio.Event()
        self.calls: list[tuple[Message, ...]] = []

    async def __call__(self, messages: tuple[Message, ...]) -> Sequence[Message]:
        self.calls.append(messages)
        self.entered.set()
        await self.gate.wait()
        texts = [p.text for m in messages for p in m.parts if isinstance(p, TextPart)]
        return [user("Summary: " + " | ".join(texts))]


async def quick(messages: tuple[Message, ...]) -> Sequence[Message]:
    texts = [p.text for m in messages for p in m.parts if isinstance(p, TextPart)]
    return [user("Summary: " + " | ".join(texts))]


async def _until(predicate: object, timeout: float = 10) -> None:
    with anyio.fail_after(timeout):
        while not predicate():  # type: ignore[operator]
            await anyio.sleep(0.005)


def _turn(manager: ContextManager, n: int, *, tool: bool = False, cid: str = "s") -> None:
    """Commit t<n> and record its answer (a call and its result first, with ``tool``)."""
    manager.accept_turn(
        TurnSnapshot(
            context_id=cid,
            turn_id=f"t{n}",
            input=(user(f"question {n}"),),
            instructions=(SYSTEM,) if n == 0 else None,
        )
    )
    outputs: list[Message] = []
    if tool:
        outputs += [call(f"k{n}"), result(f"k{n}", f"found {n} " + "x" * 40)]
    outputs.append(assistant(f"answer {n}"))
    manager.record(cid, f"t{n}", outputs)


def _held(manager: ContextManager, cid: str = "s") -> tuple[object, ...]:
    """Everything a restore must give back: pinned, turn ids, each turn's messages."""
    view = manager.history(cid)
    return (view.pinned, view.turn_ids, tuple(view.turn_messages(t) for t in view.turn_ids))


async def _items(manager: ContextManager, cid: str = "s") -> tuple[object, ...]:
    """The prepared input of the newest turn; it passes the gateway's validate()."""
    newest = manager.history(cid).turn_ids[-1]
    prepared = await manager.prepare(ContextPrepareRequest(context_id=cid, turn_id=newest))
    assert manager.gateway.validate(list(prepared.items)) == []
    return tuple(prepared.items)


async def _restored(store_url: str, cid: str = "s", **options: object) -> tuple[object, ...]:
    """Another host claims ``cid`` (after the lease expired): (held, prepared items)."""
    expire_lease(store_url, cid)
    async with hosting(store_url, lease_ttl=30, owner="host-b", **options) as taker:  # type: ignore[arg-type]
        with anyio.fail_after(10):
            assert await taker.manager.leases.claim(cid) is True
        return _held(taker.manager, cid), await _items(taker.manager, cid)


# -- findings ---------------------------------------------------------------------------


async def test_a_prune_note_changed_mid_conversation_restores(store_url: str) -> None:
    """Contract (``manager.summaries``: "Configure it at any time ... Each setting takes
    effect at the next safe point"; docs/compaction.md "Durable": "a pruning
    (``TurnsPruned``) [is a record] of the context's log"; docs/durable.md: a host that
    takes over "replays its log and prepares exactly what the dead host would have").

    The live pass skips turns it found pruned before (its memo), so with a new note
    only the newly old turn is pruned and logged; the replay prunes without that memo,
    re-prunes the turn pruned under the old note, and the claim refuses the
    acknowledged log as corrupt (StoreRecordError)."""
    async with hosting(store_url, lease_ttl=30, owner="host-a") as owner:
        manager = owner.manager
        await manager.leases.claim("s")
        manager.summaries.prune = PrunePolicy(keep_turns=1, note="[pruned A]")
        for n in range(3):
            _turn(manager, n, tool=True)
        manager.summaries.prune = PrunePolicy(keep_turns=1, note="[pruned B]")
        for n in range(3, 5):
            _turn(manager, n, tool=True)
        await manager.leases.flush()
        expected = _held(manager), await _items(manager)
        try:
            got: object = await _restored(store_url)
        except StoreRecordError:
            # Was: "Record 6 ... prunes turns ['t3'] ... ['t0', 't3']".
            got = "StoreRecordError"
    assert got == expected


# -- attacks that held ------------------------------------------------------------------


def _log(store_url: str, cid: str = "s") -> list[bytes]:
    """The context's stored records, oldest first, read behind the store's back."""
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(store_url.removeprefix("sqlite:")) as db:
            rows = db.execute(
                "SELECT data FROM turnloom_records WHERE context_id = ? ORDER BY position", (cid,)
            ).fetchall()
        return [bytes(r[0]) for r in rows]
    prefix = store_url.split("prefix=")[1]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        return list(client.lrange(f"{prefix}ctx:{cid}:log", 0, -1))
    finally:
        client.close()


def _cut(store_url: str, keep: int, *, count: bool = True, cid: str = "s") -> None:
    """A process killed mid-write, as the store shows it: the log ends after ``keep``
    records (SQLite: the stored length follows when ``count``)."""
    if store_url.startswith("sqlite:"):
        with sqlite3.connect(store_url.removeprefix("sqlite:")) as db:
            db.execute(
                "DELETE FROM turnloom_records WHERE context_id = ? AND position >= ?", (cid, keep)
            )
            if count:
                db.execute(
                    "UPDATE turnloom_contexts SET length = ? WHERE context_id = ?", (keep, cid)
                )
        return
    prefix = store_url.split("prefix=")[1]
    client = redis.Redis.from_url(REDIS_URL)
    try:
        client.ltrim(f"{prefix}ctx:{cid}:log", 0, keep - 1)
    finally:
        client.close()


async def test_a_summary_whose_write_failed_is_written_by_the_next_flush(
    store_url: str,
) -> None:
    """Contract (docs/durable.md): a failed write reaches the host at ``flush``, "the
    changes stay queued (the next flush ... retries them)"; "never loses" an
    acknowledged change. The summary applied while the append fails, then more turns:
    the next flush writes all of it and another host restores the live history (summary
    first) and the same prepared input, which validates."""
    store = FailOnNth(open_context_store(store_url), "append", 0)
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as owner:
            manager = owner.manager
            manager.summaries.summarizer = quick
            manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=2)
            await manager.leases.claim("s")
            for n in range(3):
                _turn(manager, n, tool=True)
            await manager.leases.flush()
            reported: list[StoreError] = []
            manager.leases.on_error = reported.append
            store.nth = store.count + 1  # the next append fails
            _turn(manager, 3, tool=True)
            await _until(lambda: not manager.summaries.running("s"))
            assert is_summary_turn(manager.history("s").turn_ids[0])
            try:
                with anyio.fail_after(10):
                    await manager.leases.flush()
            except StoreError as exc:
                reported.append(exc)
            # The failure reached the host (the writer's own cycle, or this flush).
            assert "append failed once" in str(reported[0])
            _turn(manager, 4, tool=True)
            await _until(lambda: not manager.summaries.running("s"))
            with anyio.fail_after(10):
                await manager.leases.flush()
            expected = _held(manager), await _items(manager)
            got = await _restored(store_url)
        assert got == expected
    finally:
        await store.aclose()


async def test_a_summary_applied_while_an_append_hangs_then_released(store_url: str) -> None:
    """Contract (docs/durable.md, ``leases.release``): "writes what is queued, releases
    the lease and drops the context from memory, and the next claim anywhere restores
    it". A summary and more turns arrive while an append of earlier turns hangs; the
    release writes them all; the other host's history and input are the live ones."""
    store = GateStore(open_context_store(store_url))
    try:
        async with Foundation(store=store, lease_ttl=30, owner="host-a") as owner:
            manager = owner.manager
            summarizer = Gated()
            manager.summaries.summarizer = summarizer
            manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=2)
            await manager.leases.claim("s")
            entered, gate = store.arm("append")  # the first write of these turns hangs
            for n in range(4):
                _turn(manager, n, tool=True)
            await summarizer.entered.wait()
            async with anyio.create_task_group() as group:
                group.start_soon(manager.leases.flush)
                with anyio.fail_after(5):
                    await entered.wait()
                summarizer.gate.set()  # the summary lands while that write hangs
                await _until(lambda: not manager.summaries.running("s"))
                _turn(manager, 4, tool=True)
                await _until(lambda: not manager.summaries.running("s"))
                assert is_summary_turn(manager.history("s").turn_ids[0])
                expected = _held(manager), await _items(manager)
                gate.set()
            with anyio.fail_after(10):
                assert await manager.leases.release("s") is True
            got = await _restored(store_url)
        assert got == expected
    finally:
        await store.aclose()


async def test_a_slow_summary_over_evicted_and_retracted_turns_restores(
    store_url: str,
) -> None:
    """Contract (docs/compaction.md): "When the summarizer is slow, eviction happens as
    without one ... and the summary, when it arrives, covers what was evicted"; "a
    retraction still restores what its commit evicted"; and "Durable": a takeover
    replays to the owner's history. Turns arrive and evict while the summarizer runs,
    a false start is retracted; another host restores the live history exactly."""
    limits = HistoryLimits(max_turns=5)
    async with hosting(store_url, lease_ttl=30, owner="host-a", history_limits=limits) as owner:
        manager = owner.manager
        summarizer = Gated()
        manager.summaries.summarizer = summarizer
        manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=1)
        await manager.leases.claim("s")
        for n in range(4):
            _turn(manager, n, tool=True)
        await summarizer.entered.wait()
        given = manager.summaries.pending_turns("s")
        for n in range(4, 8):
            _turn(manager, n, tool=True)
        manager.accept_turn(TurnSnapshot(context_id="s", turn_id="t8", input=(user("uh"),)))
        manager.voice.retract_turn("s", "t8")
        assert manager.statistics().history.evicted_turns_total > 0
        summarizer.gate.set()
        await _until(lambda: not manager.summaries.running("s"))
        ids = manager.history("s").turn_ids
        assert is_summary_turn(ids[0]) and not set(given) & set(ids)
        _turn(manager, 9, tool=True)
        await _until(lambda: not manager.summaries.running("s"))  # a second one, at once
        await manager.leases.flush()
        expected = _held(manager), await _items(manager)
        got = await _restored(store_url, history_limits=limits)
    assert got == expected


async def test_a_summary_never_splits_a_call_from_the_turn_that_answers_it(
    store_url: str,
) -> None:
    """Contract (docs/compaction.md "Pairs whole"): "A summarized range ends where
    eviction could cut (a call and the turn whose input answers it stay together)";
    every prepared input stays valid. The turns' calls are answered by the next turn's
    input; the live and restored inputs validate and are equal."""
    async with hosting(store_url, lease_ttl=30, owner="host-a", gateway="anthropic") as owner:
        manager = owner.manager
        manager.summaries.summarizer = quick
        manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=2)
        await manager.leases.claim("s")
        for n in range(7):
            given: tuple[Message, ...] = (user(f"question {n}"),)
            if n and n % 2 == 0:
                given = (result(f"k{n - 1}", f"found {n - 1}"),)
            manager.accept_turn(
                TurnSnapshot(
                    context_id="s",
                    turn_id=f"t{n}",
                    input=given,
                    instructions=(SYSTEM,) if n == 0 else None,
                )
            )
            manager.record("s", f"t{n}", [call(f"k{n}")] if n % 2 else [assistant(f"a{n}")])
            await _until(lambda: not manager.summaries.running("s"))
        assert manager.statistics().summaries.finished_total >= 1
        await manager.leases.flush()
        expected = _held(manager), await _items(manager)
        got = await _restored(store_url, gateway="anthropic")
    assert got == expected


async def test_idle_unloading_between_a_summary_request_and_its_apply(store_url: str) -> None:
    """Contract (docs/durable.md): contexts unused for ``idle_after`` "leave memory and
    come back on the next claim"; ``Summarizer``: cancelled "when its context is
    removed"; a cancelled summarizer "changes nothing". The context unloads while its
    summarizer runs: the late summary is dropped, the restored history is the
    acknowledged one, and summarizing resumes after the claim."""
    errors: list[SummaryError] = []
    async with hosting(store_url, lease_ttl=30, owner="host-a", idle_after=0.3) as owner:
        manager = owner.manager
        summarizer = Gated()
        manager.summaries.summarizer = summarizer
        manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=2)
        manager.summaries.on_error = errors.append
        await manager.leases.claim("s")
        for n in range(4):
            _turn(manager, n, tool=True)
        await summarizer.entered.wait()
        await manager.leases.flush()
        acknowledged = _held(manager)
        await _until(lambda: manager.context_ids() == ())
        await _until(lambda: not manager.summaries.running("s"))
        summarizer.gate.set()
        assert [e.reason for e in errors] == ["cancelled"]
        assert await manager.leases.claim("s") is True
        assert _held(manager) == acknowledged
        _turn(manager, 4, tool=True)
        await _until(lambda: not manager.summaries.running("s"))
        assert is_summary_turn(manager.history("s").turn_ids[0])
        await manager.leases.flush()
        expected = _held(manager), await _items(manager)
        got = await _restored(store_url)
    assert got == expected


async def test_a_foundation_closed_while_its_summarizer_runs(store_url: str) -> None:
    """Contract (``Summarizer``: cancelled "when the Foundation closes"; docs/durable.md
    "The close writes what is queued"): the close ends in bounded time with a summarizer
    that would never return; what was accepted before it is restored elsewhere, without
    a summary."""
    errors: list[SummaryError] = []
    summarizer = Gated()
    with anyio.fail_after(15):
        async with hosting(store_url, lease_ttl=30, owner="host-a") as owner:
            manager = owner.manager
            manager.summaries.summarizer = summarizer
            manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=2)
            manager.summaries.on_error = errors.append
            await manager.leases.claim("s")
            for n in range(4):
                _turn(manager, n, tool=True)
            await summarizer.entered.wait()
            _turn(manager, 4, tool=True)  # queued, not flushed: the close writes it
            expected = _held(manager), await _items(manager)
    assert [e.reason for e in errors] == ["cancelled"]
    assert await _restored(store_url) == expected


async def test_a_log_cut_after_the_summary_record_restores_whole(store_url: str) -> None:
    """Contract (docs/compaction.md "Durable"): "A host killed mid-compaction leaves the
    old turns or the summary, never both or neither"; docs/durable.md: a log cut at its
    tail "looks like writes that never happened" (SQLite counts its records: a cut
    without the count is a StoreRecordError). The log is cut right after the summary
    record, and right before it: each restores to what the owner held at that point."""
    async with hosting(store_url, lease_ttl=30, owner="host-a") as owner:
        manager = owner.manager
        manager.summaries.summarizer = quick
        manager.summaries.policy = CompactionPolicy(trigger_turns=3, keep_turns=2)
        await manager.leases.claim("s")
        for n in range(3):
            _turn(manager, n, tool=True)
        await manager.leases.flush()
        before = _held(manager), await _items(manager)
        _turn(manager, 3, tool=True)
        await _until(lambda: not manager.summaries.running("s"))
        await manager.leases.flush()
        after = _held(manager), await _items(manager)
        written = len(_log(store_url))
        for n in range(4, 6):
            _turn(manager, n, tool=True)
            await _until(lambda: not manager.summaries.running("s"))
        await manager.leases.flush()
        log = _log(store_url)
    marks = [i for i, data in enumerate(log) if b"summarize" in data]
    assert marks[0] == written - 1  # the first summary's record ended that flush
    if store_url.startswith("sqlite:"):
        _cut(store_url, marks[0] + 1, count=False)
        with pytest.raises(StoreRecordError):
            await _restored(store_url)
    _cut(store_url, marks[0] + 1)
    assert await _restored(store_url) == after
    _cut(store_url, marks[0])
    got_before = await _restored(store_url)
    # The summary's own commit (t3) precedes its record: cut there, t3 is held unsummarized.
    assert got_before[0][1] == (*before[0][1], "t3")  # type: ignore[index]
    assert not any(is_summary_turn(t) for t in got_before[0][1])  # type: ignore[index, union-attr]
