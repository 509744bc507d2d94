"""Hostile hosts against the output streams' close: no record a host sent is lost, doubled or
reordered, by producers racing the close, a crashing consumer, a cancelled host, or (with a
durable store) a writer cancelled with the Foundation's task group."""

from __future__ import annotations

import random
from collections.abc import AsyncIterator
from pathlib import Path

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream

from tests.runtime.helpers import assistant, user
from tests.stores.test_close_writes_late_records import texts
from turnloom.errors import TurnloomError
from turnloom.runtime import (
    ContextManager,
    Foundation,
    OutputRecord,
    OutputStatistics,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio


def _turn(turn_id: str = "t1", context_id: str = "c") -> TurnSnapshot:
    return TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user("hi"),))


def _out(text: str, turn_id: str = "t1", context_id: str = "c") -> OutputRecord:
    return OutputRecord(context_id=context_id, turn_id=turn_id, outputs=(assistant(text),))


def _texts(manager: ContextManager, turn_id: str = "t1", context_id: str = "c") -> list[str]:
    return [m.text for m in manager.history(context_id).turn_messages(turn_id)[1:]]


@pytest.mark.parametrize("buffer", [0, 1, 3])
@pytest.mark.parametrize("seed", range(6))
async def test_producers_sending_while_the_foundation_closes_lose_nothing(
    buffer: int, seed: int
) -> None:
    """Every send that returned is recorded exactly once, in each producer's order; a send
    refused with BrokenResourceError is not recorded."""
    rng = random.Random(seed)
    send, receive = anyio.create_memory_object_stream[OutputRecord](buffer)
    sent: dict[str, list[str]] = {}
    refused: dict[str, list[str]] = {}
    n_producers = 3

    async def producer(name: str, stream: MemoryObjectSendStream[OutputRecord]) -> None:
        sent[name] = []
        refused[name] = []
        with stream:
            for i in range(200):
                text = f"{name}-{i}"
                try:
                    if rng.random() < 0.5:
                        await stream.send(_out(text))
                    else:
                        try:
                            stream.send_nowait(_out(text))
                        except anyio.WouldBlock:
                            await stream.send(_out(text))
                except anyio.BrokenResourceError:
                    refused[name].append(text)
                    return
                sent[name].append(text)
                for _ in range(rng.randrange(3)):
                    await anyio.lowlevel.checkpoint()

    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        async with anyio.create_task_group() as producers:
            for p in range(n_producers):
                producers.start_soon(producer, f"p{p}", send.clone())
            send.close()
            manager.outputs.consume(receive)
            for _ in range(rng.randrange(30)):
                await anyio.lowlevel.checkpoint()
            await foundation.aclose()
        texts = _texts(manager)
    expected_total = sum(len(v) for v in sent.values())
    assert len(texts) == len(set(texts))
    assert sorted(texts) == sorted(t for v in sent.values() for t in v)
    for name in sent:
        assert [t for t in texts if t.startswith(name + "-")] == sent[name]
    assert manager.statistics().outputs.records_total == expected_total


class _StreamBroke(Exception):
    pass


async def test_a_generator_raising_midway_leaves_memory_streams_drained() -> None:
    """A stream that raises ends the Foundation; another stream's buffered and blocked
    records are still recorded in order, each once."""
    send, receive = anyio.create_memory_object_stream[OutputRecord](2)
    gate = anyio.Event()
    blocked_done: list[str] = []

    async def broken() -> AsyncIterator[OutputRecord]:
        yield _out("g0", turn_id="t2")
        await gate.wait()
        yield _out("g1", turn_id="t2")
        raise _StreamBroke("midway")

    async def producer() -> None:
        with send:
            for i in range(6):
                try:
                    await send.send(_out(f"m{i}"))
                except anyio.BrokenResourceError:
                    blocked_done.append(f"refused m{i}")
                    return
                except anyio.get_cancelled_exc_class():
                    blocked_done.append(f"cancelled m{i}")
                    raise
                blocked_done.append(f"m{i}")

    with pytest.raises(BaseException) as caught:
        async with anyio.create_task_group() as outer:
            outer.start_soon(producer)
            async with Foundation() as foundation:
                manager = foundation.manager
                manager.accept_turn(_turn())
                manager.accept_turn(_turn("t2"))
                manager.outputs.consume(broken())
                await anyio.wait_all_tasks_blocked()
                # the memory stream is consumed only after the producer filled it
                manager.outputs.consume(receive)
                gate.set()
                await anyio.sleep(5)
    assert _StreamBroke in {type(e) for e in _leaves(caught.value)}
    sent = [t for t in blocked_done if not t.startswith(("refused", "cancelled"))]
    assert _texts(manager) == sent
    assert _texts(manager, "t2") == ["g0", "g1"]


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_cancelling_the_host_mid_close_still_drains_a_blocked_sender() -> None:
    """Cancellation of the host task while the close waits the grace period for an
    endless generator: the zero-buffer stream's blocked sender is still recorded."""
    send, receive = anyio.create_memory_object_stream[OutputRecord](0)
    never = anyio.Event()
    outcome: list[str] = []

    async def endless() -> AsyncIterator[OutputRecord]:
        yield _out("e0", turn_id="t2")
        await never.wait()
        yield _out("never")

    async def producer() -> None:
        with send:
            try:
                await send.send(_out("blocked"))
                outcome.append("sent")
                await send.send(_out("second"))
                outcome.append("sent second")
            except anyio.BrokenResourceError:
                outcome.append("refused")

    async with anyio.create_task_group() as outer:
        with anyio.CancelScope() as scope:
            async with Foundation(close_grace_period=0.2) as foundation:
                manager = foundation.manager
                manager.accept_turn(_turn())
                manager.accept_turn(_turn("t2"))
                manager.outputs.consume(endless())
                await anyio.wait_all_tasks_blocked()
                outer.start_soon(producer)
                await anyio.wait_all_tasks_blocked()
                manager.outputs.consume(receive)

                async def canceller() -> None:
                    await anyio.sleep(0.05)
                    scope.cancel()

                outer.start_soon(canceller)
                await foundation.aclose()
    assert outcome in (["sent", "sent second"], ["sent", "refused"])
    expected = ["blocked", "second"] if outcome == ["sent", "sent second"] else ["blocked"]
    assert _texts(manager) == expected
    assert _texts(manager, "t2") == ["e0"]


@pytest.mark.parametrize("crash", ["stream_raises", "on_error_raises"])
async def test_a_consumer_crash_with_a_sqlite_store_still_stores_the_streamed_records(
    tmp_path: Path, crash: str
) -> None:
    """Invariant: with a durable store, every record a consumer recorded (or the close
    drained) is in the store after the close, or its failure is reported to
    ``leases.on_error``; nothing the manager accepted is lost by the close.

    Attack: one consumed stream ends with an exception (an async generator raising
    mid-way, or an ``on_error`` that raises). That ends the Foundation's task group,
    which also cancels the durable writer; the close drains and records the memory
    stream, then writes the queue itself. (Before, it waited for the cancelled writer
    until the grace period ended and released the lease: stored ``["hi"]``, nothing
    reported.)
    """
    from turnloom.stores import open_context_store

    url = f"sqlite:{tmp_path / 'contexts.db'}"
    store = open_context_store(url)
    reported: list[BaseException] = []
    send, receive = anyio.create_memory_object_stream[OutputRecord](8)
    gate = anyio.Event()

    async def broken() -> AsyncIterator[OutputRecord]:
        await gate.wait()
        if crash == "stream_raises":
            raise _StreamBroke("the transcriber crashed")
        yield _out("for a turn never committed", turn_id="t9")  # refused: on_error raises

    def on_error(record: object, error: TurnloomError) -> None:
        raise _StreamBroke("the host's handler failed")

    try:
        with send, pytest.raises(BaseException) as caught:
            async with Foundation(store=store, lease_ttl=30, close_grace_period=0.5) as foundation:
                manager = foundation.manager
                manager.leases.on_error = reported.append
                assert await manager.leases.claim("c") is True
                manager.accept_turn(_turn())
                await manager.leases.flush()  # the turn is stored; the writer is idle
                manager.outputs.consume(broken(), on_error=on_error)
                manager.outputs.consume(receive)
                await anyio.wait_all_tasks_blocked()
                for i in range(3):
                    send.send_nowait(_out(f"m{i}"))  # the first to the consumer, 2 buffered
                gate.set()
                await anyio.sleep(5)  # cancelled: the crash ends the task group
        assert [type(e) for e in _leaves(caught.value)] == [_StreamBroke]
        assert _texts(manager) == ["m0", "m1", "m2"]  # recorded in memory
        assert manager.statistics().outputs.records_total == 3
        async with Foundation(store=store, lease_ttl=30) as other:
            assert await other.manager.leases.claim("c") is True
            stored = texts(other, "c")
        assert (stored, reported) == (["hi", "m0", "m1", "m2"], [])
    finally:
        await store.aclose()


async def test_cancelling_the_foundations_scope_with_a_sqlite_store_stores_the_drained_records(
    tmp_path: Path,
) -> None:
    """Invariant (``consume``'s Cancellation note, with a durable store): cancelling the
    scope the Foundation was opened in loses no record of a memory object stream -- the
    close drains it, and the drained records are in the store afterwards (or a failure
    is reported to ``leases.on_error``).

    The cancellation also reaches the durable writer in the Foundation's task group:
    the close writes the queue itself (before, it waited for the writer that was gone).
    """
    from turnloom.stores import open_context_store

    store = open_context_store(f"sqlite:{tmp_path / 'contexts.db'}")
    reported: list[BaseException] = []
    send, receive = anyio.create_memory_object_stream[OutputRecord](16)
    try:
        with send, anyio.CancelScope() as scope:
            async with Foundation(store=store, lease_ttl=30, close_grace_period=0.5) as foundation:
                manager = foundation.manager
                manager.leases.on_error = reported.append
                assert await manager.leases.claim("c") is True
                manager.accept_turn(_turn())
                await manager.leases.flush()
                manager.outputs.consume(receive)
                await anyio.wait_all_tasks_blocked()
                for i in range(4):
                    send.send_nowait(_out(f"c{i}"))
                scope.cancel()
                await anyio.sleep(1)  # cancelled here
        assert scope.cancelled_caught
        assert _texts(manager) == ["c0", "c1", "c2", "c3"]  # drained into memory
        async with Foundation(store=store, lease_ttl=30) as other:
            assert await other.manager.leases.claim("c") is True
            stored = texts(other, "c")
        assert (stored, reported) == (["hi", "c0", "c1", "c2", "c3"], [])
    finally:
        await store.aclose()


async def test_records_for_evicted_and_uncommitted_turns_are_each_accounted() -> None:
    """Every record is accounted once: recorded, refused (on_error + rejected_total), or
    dropped as late (dropped_late_outputs_total). A malformed message in the middle of a
    batch refuses the whole batch (none of it recorded)."""
    from turnloom.context import HistoryLimits, Message, Role

    errors: list[tuple[object, str]] = []
    send, receive = anyio.create_memory_object_stream[object](32)
    async with Foundation(history_limits=HistoryLimits(max_turns=2)) as foundation, send:
        manager = foundation.manager
        manager.accept_turn(_turn("t1"))
        manager.outputs.consume(receive, on_error=lambda r, e: errors.append((r, type(e).__name__)))  # type: ignore[arg-type]
        await send.send(_out("t1-a"))
        await anyio.wait_all_tasks_blocked()  # recorded before t1 is evicted
        manager.accept_turn(_turn("t2"))
        manager.accept_turn(_turn("t3"))  # t1 evicted
        bad_mid = OutputRecord(
            context_id="c",
            turn_id="t3",
            outputs=(
                assistant("ok1"),
                Message(role=Role.assistant, content="x\ud800"),
                assistant("ok2"),
            ),
        )
        for item in [
            _out("late for t1", "t1"),
            _out("early for t4", "t4"),
            bad_mid,
            _out("t3-a", "t3"),
        ]:
            await send.send(item)
        await anyio.wait_all_tasks_blocked()
        await foundation.aclose()
    assert [name for _, name in errors] == ["UnknownTurnError", "InvalidTextError"]
    assert _texts(manager, "t3") == ["t3-a"]
    statistics = manager.statistics()
    # The late record for t1 is taken and dropped: counted apart from those stored.
    assert statistics.outputs == OutputStatistics(
        records_total=3, rejected_total=2, dropped_total=1
    )
    assert statistics.history.dropped_late_outputs_total == 1


async def test_several_streams_feeding_one_context_record_each_once_in_stream_order() -> None:
    """Three streams (two memory streams, one generator) feeding one context
    concurrently, through the close: each record once, each stream's order kept."""
    streams = [anyio.create_memory_object_stream[OutputRecord](n) for n in (0, 4)]
    sent: dict[str, list[str]] = {"s0": [], "s1": []}

    async def producer(name: str, send: MemoryObjectSendStream[OutputRecord]) -> None:
        with send:
            for i in range(50):
                try:
                    await send.send(_out(f"{name}-{i}"))
                except anyio.BrokenResourceError:
                    return
                sent[name].append(f"{name}-{i}")

    async def generator() -> AsyncIterator[OutputRecord]:
        for i in range(30):
            await anyio.lowlevel.checkpoint()
            yield _out(f"g-{i}")

    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        async with anyio.create_task_group() as producers:
            for index, (send, receive) in enumerate(streams):
                producers.start_soon(producer, f"s{index}", send)
                manager.outputs.consume(receive)
            manager.outputs.consume(generator())
            for _ in range(7):
                await anyio.lowlevel.checkpoint()
            await foundation.aclose()
    texts = _texts(manager)
    assert len(texts) == len(set(texts))
    assert [t for t in texts if t.startswith("g-")] == [f"g-{i}" for i in range(30)]
    for name in sent:
        assert [t for t in texts if t.startswith(name + "-")] == sent[name]
    assert manager.statistics().outputs.records_total == len(texts)
