"""Hostile hosts against summary compaction (slow, failing, cancelled summarizers;
turns accepted and evicted meanwhile; restarts on SQLite and Redis; close mid-summary).

Each test's docstring names the invariant it checks (docs/compaction.md).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import anyio
import pytest

from tests.runtime.helpers import assistant, user
from tests.runtime.test_summaries import _turn
from tests.stores.conftest import REDIS_URL, redis_prefix  # noqa: F401 (a fixture)
from tests.stores.helpers import expire_lease, hosting
from turnloom.context import CompactionPolicy, Message, TextPart
from turnloom.context.history import HistoryLimits
from turnloom.context.summaries import is_summary_turn
from turnloom.errors import StaleLeaseError, SummaryError
from turnloom.runtime import Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

STORES = pytest.mark.parametrize(
    ("anyio_backend", "store"),
    [("asyncio", "sqlite"), ("trio", "sqlite"), ("asyncio", "redis")],
    ids=["sqlite-asyncio", "sqlite-trio", "redis-asyncio"],
)


def _url(store: str, tmp_path: Path, prefix: str) -> str:
    if store == "sqlite":
        return f"sqlite:{tmp_path / 'contexts.db'}"
    return f"{REDIS_URL}?prefix={prefix}"


class Gated:
    """A slow summarizer: waits for ``gate``, then one user message of every text it read."""

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


async def _settle() -> None:
    for _ in range(20):
        await anyio.sleep(0)


async def test_a_summary_too_large_for_the_history_is_reported_invalid_not_stale() -> None:
    """Invariant (docs/compaction.md, Summarizer docstring): a summarizer that returns
    something that is not a summary the history can hold changes nothing and is reported
    with reason "invalid"; "stale" is reserved for a summary written from turns that
    changed meanwhile. Here no turn changed while the summarizer ran: the summary is
    simply over the history's max_bytes."""
    errors: list[SummaryError] = []
    calls = 0

    async def huge(messages: tuple[Message, ...]) -> Sequence[Message]:
        nonlocal calls
        calls += 1
        return [user("x" * 200_000)]

    async with Foundation(history_limits=HistoryLimits(max_bytes=100_000)) as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = huge
        manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3)
        manager.summaries.on_error = errors.append
        for n in range(1, 8):
            _turn(manager, n)
        await _settle()
        assert manager.history("c").turn_ids == tuple(f"t{n}" for n in range(1, 8))
        assert calls == 1
        assert [e.reason for e in errors] == ["invalid"]


@STORES
@pytest.mark.parametrize("last", [9, 40])
async def test_a_slow_summary_over_evicted_and_compacted_turns_survives_a_restart(
    store: str,
    last: int,
    tmp_path: Path,
    redis_prefix: str,  # noqa: F811
) -> None:
    """Invariant (Durable): a summary that lands after a hard limit evicted part of its
    range, and after the log was compacted into a checkpoint meanwhile, restores on a
    restart exactly as the live history holds it (same turn ids, summary first, same
    messages per turn)."""
    url = _url(store, tmp_path, redis_prefix)
    limits = HistoryLimits(max_turns=6)
    fake = Gated()
    with anyio.fail_after(30):
        async with hosting(url, history_limits=limits) as owner:
            manager = owner.manager
            await manager.leases.claim("c")
            manager.summaries.summarizer = fake
            manager.summaries.policy = CompactionPolicy(trigger_turns=5, keep_turns=2)
            for n in range(1, 7):
                _turn(manager, n)
            await fake.entered.wait()
            assert manager.summaries.pending_turns("c") == ("t1", "t2", "t3", "t4")
            for n in range(7, last + 1):  # t1..t3 (or all) evicted while it runs
                _turn(manager, n)
                await manager.leases.flush("c")
            newest = tuple(f"t{n}" for n in range(last - 5, last + 1))
            assert manager.history("c").turn_ids == newest
            fake.gate.set()
            await _settle()
            while manager.summaries.running("c"):
                await anyio.sleep(0.001)
            live = manager.history("c")
            assert is_summary_turn(live.turn_ids[0])
            assert live.turn_ids[1:] == newest[1:]  # the summary turn counts toward max_turns
            store_statistics = manager.statistics().store
            assert store_statistics is not None
            compactions = store_statistics.compactions_total
            messages = {t: live.turn_messages(t) for t in live.turn_ids}
            await manager.leases.flush("c")
            assert (compactions > 0) == (last > 9)  # the long run compacted its log
        async with hosting(url, history_limits=limits) as taker:
            expire_lease(url, "c")
            assert await taker.manager.leases.claim("c") is True
            view = taker.manager.history("c")
            assert view.turn_ids == live.turn_ids
            assert {t: view.turn_messages(t) for t in view.turn_ids} == messages


@STORES
async def test_a_summary_landing_after_the_lease_was_taken_over_never_reaches_the_store(
    store: str,
    tmp_path: Path,
    redis_prefix: str,  # noqa: F811
) -> None:
    """Invariant (Durable, lease fencing): a host whose lease was taken over while its
    summarizer ran may apply the summary to its own copy, but the store keeps the new
    owner's history: a third host restores the taker's turns, with no summary turn."""
    url = _url(store, tmp_path, redis_prefix)
    limits = HistoryLimits(max_turns=20)
    fake = Gated()
    with anyio.fail_after(30):
        async with hosting(url, history_limits=limits) as owner:
            manager = owner.manager
            await manager.leases.claim("c")
            manager.summaries.summarizer = fake
            manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3)
            for n in range(1, 8):
                _turn(manager, n)
            await manager.leases.flush("c")
            await fake.entered.wait()
            expire_lease(url, "c")
            async with hosting(url, history_limits=limits) as taker:
                assert await taker.manager.leases.claim("c") is True
                _turn(taker.manager, 8)
                await taker.manager.leases.flush("c")
                expected = taker.manager.history("c")
                fake.gate.set()
                await _settle()
                with anyio.move_on_after(2), pytest.raises(StaleLeaseError):
                    await manager.leases.flush("c")  # the summary's write is refused
                _turn(taker.manager, 9)
                await taker.manager.leases.flush("c")
                expected = taker.manager.history("c")
                assert expected.turn_ids == tuple(f"t{n}" for n in range(1, 10))
                messages = {t: expected.turn_messages(t) for t in expected.turn_ids}
        async with hosting(url, history_limits=limits) as third:
            expire_lease(url, "c")
            assert await third.manager.leases.claim("c") is True
            view = third.manager.history("c")
            assert view.turn_ids == expected.turn_ids
            assert {t: view.turn_messages(t) for t in view.turn_ids} == messages


async def test_close_mid_summary_does_not_hang_and_changes_nothing() -> None:
    """Invariant: the Foundation's close cancels a running summarizer (reason "cancelled",
    counted once) without hanging, and a summary that arrived but waits for a safe point
    (a model call in flight) is dropped, never half-applied."""
    fake = Gated()
    errors: list[SummaryError] = []
    with anyio.fail_after(5):
        async with Foundation() as foundation:
            manager = foundation.manager
            manager.summaries.summarizer = fake
            manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3)
            manager.summaries.on_error = errors.append
            for n in range(1, 8):
                _turn(manager, n)
            await fake.entered.wait()
    assert [e.reason for e in errors] == ["cancelled"]
    stats = manager.statistics().summaries
    assert (stats.started_total, stats.finished_total, stats.failed_total, stats.running) == (
        1,
        0,
        1,
        0,
    )

    fake = Gated()
    errors.clear()
    with anyio.fail_after(5):
        async with Foundation() as foundation:
            manager = foundation.manager
            manager.summaries.summarizer = fake
            manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3)
            manager.summaries.on_error = errors.append
            for n in range(1, 8):
                _turn(manager, n)
            await fake.entered.wait()
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t8", input=(user("q8"),)))
            async with manager.invocation("c", "t8") as invocation:
                fake.gate.set()
                await _settle()
                assert manager.summaries.running("c")  # arrived, waits: a call is in flight
                invocation.record([assistant("answer 8")])
            view = manager.history("c")
            assert is_summary_turn(view.turn_ids[0])  # applied when the call ended
            assert view.turn_ids[1:] == ("t5", "t6", "t7", "t8")
    assert errors == []


async def test_a_summarizer_ignoring_cancellation_at_close_is_discarded() -> None:
    """Invariant: a summarizer that swallows the close's cancellation and returns a summary
    anyway does not change the history after close began (counted as discarded or failed,
    never finished)."""
    entered = anyio.Event()

    async def stubborn(messages: tuple[Message, ...]) -> Sequence[Message]:
        entered.set()
        try:
            await anyio.sleep_forever()
        except BaseException:
            pass
        return [user("a summary after all")]

    with anyio.fail_after(5):
        async with Foundation() as foundation:
            manager = foundation.manager
            manager.summaries.summarizer = stubborn
            manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3)
            for n in range(1, 8):
                _turn(manager, n)
            await entered.wait()
    stats = manager.statistics().summaries
    assert stats.finished_total == 0
    assert stats.discarded_total + stats.failed_total == 1
    assert manager.history("c").turn_ids == tuple(f"t{n}" for n in range(1, 8))


class _RaisingSequence(Sequence[Message]):
    """Garbage a buggy summarizer returns: a Sequence whose items cannot be read."""

    def __len__(self) -> int:
        return 1

    def __getitem__(self, index: object) -> Message:  # type: ignore[override]
        raise RuntimeError("garbage summary")


@pytest.mark.parametrize("garbage", ["raising-sequence", "text-none"])
async def test_a_garbage_summary_is_reported_invalid_and_the_foundation_keeps_running(
    garbage: str,
) -> None:
    """Invariant (docs/compaction.md: "A summarizer that fails ... changes nothing (it is
    counted and handed to on_error)"; Summaries docstring: "returns something that is not
    a summary changes nothing"): a summarizer returning garbage (a Sequence whose items
    raise when read; a Message whose TextPart text is None: msgspec does not check types
    on construction) is reported once with reason "invalid", the history is left as it
    was, and the Foundation keeps serving: the next turn is accepted."""
    errors: list[SummaryError] = []

    async def summarizer(messages: tuple[Message, ...]) -> Sequence[Message]:
        if garbage == "raising-sequence":
            return _RaisingSequence()
        return [Message(role=user("x").role, content=(TextPart(text=None),))]  # type: ignore[arg-type]

    outcome = "body not finished"
    turn_ids: tuple[str, ...] = ()
    with anyio.fail_after(5):
        try:
            async with Foundation() as foundation:
                manager = foundation.manager
                manager.summaries.summarizer = summarizer
                manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3)
                manager.summaries.on_error = errors.append
                for n in range(1, 8):
                    _turn(manager, n)
                await _settle()
                _turn(manager, 8)
                turn_ids = manager.history("c").turn_ids
                outcome = "served"
        except BaseException as exc:  # what escapes the Foundation's task group
            outcome = f"Foundation raised {type(exc).__name__}"
    assert (outcome, [e.reason for e in errors][:1]) == ("served", ["invalid"])
    assert turn_ids[-4:] == ("t5", "t6", "t7", "t8")
