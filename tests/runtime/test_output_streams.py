"""Outputs as a stream: consumed in the manager's own task, drained at close, in order."""

from __future__ import annotations

from collections.abc import AsyncIterator

import anyio
import pytest
from anyio.streams.memory import MemoryObjectSendStream
from prometheus_client import CollectorRegistry

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.errors import (
    InputError,
    InstructionMessageError,
    InvalidMessageError,
    StateError,
    TurnloomError,
    UnknownTurnError,
)
from turnloom.runtime import (
    ContextManager,
    Foundation,
    FoundationClosedError,
    OutputRecord,
    OutputStatistics,
    TurnSnapshot,
)
from turnloom.runtime.metrics import ManagerCollector

pytestmark = pytest.mark.anyio


def _turn(turn_id: str = "t1") -> TurnSnapshot:
    return TurnSnapshot(context_id="c", turn_id=turn_id, input=(user("hi"),))


def _out(text: str, turn_id: str = "t1") -> OutputRecord:
    return OutputRecord(context_id="c", turn_id=turn_id, outputs=(assistant(text),))


def _texts(manager: ContextManager, turn_id: str = "t1") -> list[str]:
    return [m.text for m in manager.history("c").turn_messages(turn_id)[1:]]


async def test_a_memory_stream_is_recorded_in_order_beside_push_records() -> None:
    send, receive = anyio.create_memory_object_stream[OutputRecord](8)
    async with Foundation() as foundation, send:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(receive)
        await send.send(_out("one"))
        await anyio.wait_all_tasks_blocked()
        manager.record("c", "t1", [assistant("pushed")])
        await send.send(_out("two"))
        await anyio.wait_all_tasks_blocked()
        assert _texts(manager) == ["one", "pushed", "two"]
        assert manager.statistics().outputs == OutputStatistics(streams=1, records_total=2)


async def test_outputs_sent_just_before_close_are_all_in_history_after_it() -> None:
    """Close order: the consumer's record, then the drained buffer, in send order."""
    send, receive = anyio.create_memory_object_stream[OutputRecord](100)
    async with Foundation() as foundation, send:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(receive)
        await anyio.wait_all_tasks_blocked()  # the consumer waits in receive()
        for i in range(20):
            send.send_nowait(_out(f"u{i}"))  # the first wakes the consumer, 19 are buffered
        await foundation.aclose()
        assert _texts(manager) == [f"u{i}" for i in range(20)]
        assert manager.statistics().outputs == OutputStatistics(
            streams=0, records_total=20, drained_total=19
        )
        with pytest.raises(anyio.BrokenResourceError):
            send.send_nowait(_out("too late"))  # the close closed the receive side
        with pytest.raises(FoundationClosedError):
            manager.record("c", "t1", [assistant("too late")])
    assert _texts(manager) == [f"u{i}" for i in range(20)]


async def test_a_sender_blocked_on_an_unbuffered_stream_is_drained_at_close() -> None:
    """What is in the stream includes a blocked sender's record; its next send is refused."""
    send, receive = anyio.create_memory_object_stream[OutputRecord](0)
    refused: list[bool] = []

    async def producer() -> None:
        with send:
            await send.send(_out("blocked"))
            try:
                await send.send(_out("after close"))
            except anyio.BrokenResourceError:
                refused.append(True)

    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        async with anyio.create_task_group() as producers:
            producers.start_soon(producer)
            await anyio.wait_all_tasks_blocked()  # no receiver yet: the producer waits in send
            manager.outputs.consume(receive)
            await foundation.aclose()  # the consumer never took it: the drain does
        assert refused == [True]
        assert _texts(manager) == ["blocked"]
        assert manager.statistics().outputs == OutputStatistics(records_total=1, drained_total=1)


async def test_output_stream_metrics_follow_the_statistics() -> None:
    registry = CollectorRegistry()
    send, receive = anyio.create_memory_object_stream[object](8)
    async with Foundation() as foundation, send:
        manager = foundation.manager
        registry.register(ManagerCollector(manager.statistics))
        manager.accept_turn(_turn())
        manager.outputs.consume(receive)  # type: ignore[arg-type]
        await send.send(_out("a"))
        await send.send("not a record")
        await send.send(_out(""))  # blank: taken, nothing stored
        await anyio.wait_all_tasks_blocked()
        assert registry.get_sample_value("turnloom_output_streams") == 1
        send.send_nowait(_out("b"))  # to the waiting consumer
        send.send_nowait(_out("c"))  # buffered: drained by the close
        await foundation.aclose()
    value = registry.get_sample_value
    assert value("turnloom_output_streams") == 0
    assert value("turnloom_output_records_total", {"outcome": "recorded"}) == 3
    assert value("turnloom_output_records_total", {"outcome": "dropped"}) == 1
    assert value("turnloom_output_records_total", {"outcome": "rejected"}) == 1
    assert value("turnloom_output_records_drained_total") == 1


async def test_a_stream_whose_producer_closed_ends_and_is_closed() -> None:
    send, receive = anyio.create_memory_object_stream[OutputRecord](4)
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(receive)
        async with send:
            await send.send(_out("last words"))
        await anyio.wait_all_tasks_blocked()
        assert manager.statistics().outputs.streams == 0
        with pytest.raises(anyio.ClosedResourceError):
            receive.receive_nowait()
        assert _texts(manager) == ["last words"]


async def test_an_async_iterable_is_given_the_grace_period_to_end_at_close() -> None:
    async def utterances() -> AsyncIterator[OutputRecord]:
        for i in range(5):
            await anyio.sleep(0)
            yield _out(f"g{i}")

    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(utterances())
        await foundation.aclose()  # at once: the generator still has records to yield
        assert _texts(manager) == [f"g{i}" for i in range(5)]
        assert manager.statistics().outputs.drained_total == 0


async def test_record_is_accepted_while_the_close_drains() -> None:
    """Intake stops first; outputs of committed turns are still recorded until the close ends."""
    release = anyio.Event()
    seen: list[bool] = []

    async def stream() -> AsyncIterator[OutputRecord]:
        await release.wait()
        yield _out("streamed")

    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(stream())

        async def late_producer() -> None:
            await anyio.wait_all_tasks_blocked()
            seen.append(manager.closed)
            with pytest.raises(FoundationClosedError):
                manager.accept_turn(_turn("t2"))
            assert manager.record("c", "t1", [assistant("pushed while closing")]) == 1
            release.set()

        async with anyio.create_task_group() as group:
            group.start_soon(late_producer)
            await foundation.aclose()
        assert seen == [True]
        assert _texts(manager) == ["pushed while closing", "streamed"]


async def test_refused_records_go_to_on_error_and_the_consumer_goes_on() -> None:
    errors: list[tuple[object, type[TurnloomError]]] = []
    send, receive = anyio.create_memory_object_stream[object](8)
    async with Foundation() as foundation, send:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(receive, on_error=lambda r, e: errors.append((r, type(e))))  # type: ignore[arg-type]
        bad = [
            "not a record",
            _out("for a turn never committed", turn_id="t9"),
            OutputRecord(context_id="c", turn_id="t1", outputs=(assistant("ok"), SYSTEM)),
        ]
        for item in [*bad, _out("good")]:
            await send.send(item)
        await anyio.wait_all_tasks_blocked()
        send.send_nowait(_out("", turn_id="t9"))  # refused again, this time by the close's drain
        send.send_nowait(_out("drained"))
        await foundation.aclose()
    assert [type_ for _, type_ in errors] == [
        InvalidMessageError,
        UnknownTurnError,
        InstructionMessageError,
        UnknownTurnError,
    ]
    assert [record for record, _ in errors[:3]] == bad
    assert _texts(manager) == ["good", "drained"]
    assert manager.statistics().outputs == OutputStatistics(
        records_total=2, drained_total=1, rejected_total=4
    )


async def test_cancelling_the_foundations_scope_still_drains_the_stream() -> None:
    """Cancellation: the consumer is cancelled with the host's scope; the close drains."""
    send, receive = anyio.create_memory_object_stream[OutputRecord](16)
    with send, anyio.CancelScope() as scope:
        async with Foundation() as foundation:
            manager = foundation.manager
            manager.accept_turn(_turn())
            manager.outputs.consume(receive)
            await anyio.wait_all_tasks_blocked()
            for i in range(6):
                send.send_nowait(_out(f"c{i}"))
            scope.cancel()
            await anyio.sleep(1)  # cancelled here; never completes
    assert scope.cancelled_caught
    assert _texts(manager) == [f"c{i}" for i in range(6)]
    assert manager.statistics().outputs.records_total == 6


async def test_a_stream_that_never_ends_is_cancelled_after_the_grace_period() -> None:
    """Cancellation: a consumer waiting on a stream that never ends is cancelled, no record
    half-taken, and the async generator is finalized on the consumer's task."""
    finalized: list[bool] = []
    never = anyio.Event()

    async def endless() -> AsyncIterator[OutputRecord]:
        try:
            yield _out("first")
            await never.wait()
            yield _out("never sent")
        finally:
            finalized.append(True)

    async with Foundation(close_grace_period=0) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(endless())
        await anyio.wait_all_tasks_blocked()
        await foundation.aclose()
        assert finalized == [True]
        assert _texts(manager) == ["first"]
        assert manager.statistics().outputs == OutputStatistics(records_total=1)


async def test_a_cancelled_aclose_still_drains_then_delivers_the_cancellation() -> None:
    send, receive = anyio.create_memory_object_stream[OutputRecord](8)
    async with Foundation() as foundation, send:
        manager = foundation.manager
        manager.accept_turn(_turn())
        manager.outputs.consume(receive)
        await anyio.wait_all_tasks_blocked()
        send.send_nowait(_out("a"))
        send.send_nowait(_out("b"))
        with anyio.CancelScope() as scope:
            scope.cancel()
            await foundation.aclose()
        assert scope.cancelled_caught
        assert _texts(manager) == ["a", "b"]


async def test_consume_outputs_checks_its_arguments_and_the_lifecycle() -> None:
    manager = ContextManager()
    send, receive = anyio.create_memory_object_stream[OutputRecord](1)
    with send, receive:
        with pytest.raises(StateError, match="not bound"):
            manager.outputs.consume(receive)
        async with Foundation(manager) as foundation:
            with pytest.raises(InputError, match="async iterable"):
                manager.outputs.consume([_out("x")])  # type: ignore[arg-type]
            with pytest.raises(InputError, match="on_error must be callable"):
                manager.outputs.consume(receive, on_error="log")  # type: ignore[arg-type]
            assert manager.statistics().outputs.streams == 0
            await foundation.aclose()
            with pytest.raises(FoundationClosedError):
                manager.outputs.consume(receive)


class _HostBug(Exception):
    """An ``on_error`` handler that fails."""


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for inner in exc.exceptions for leaf in _leaves(inner)]
    return [exc]


async def test_an_on_error_raising_at_close_still_drains_and_closes_every_other_stream() -> None:
    """Close order holds for every stream when one stream's ``on_error`` raises in the drain.

    Two unbuffered streams, each with a sender blocked in ``send``; stream
    a's record is refused and its ``on_error`` raises. Stream b's record is
    still recorded, both receive sides are closed (each producer's next send
    is refused, none is left waiting), and the handler's error leaves the
    Foundation. Before: the close stopped at stream a, b's record was lost
    and b's producer waited until it was cancelled.
    """
    send_a, receive_a = anyio.create_memory_object_stream[OutputRecord](0)
    send_b, receive_b = anyio.create_memory_object_stream[OutputRecord](0)
    outcome: dict[str, str] = {}

    def refuse(record: object, error: TurnloomError) -> None:
        raise _HostBug("on_error failed")

    async def producer(name: str, send: MemoryObjectSendStream[OutputRecord]) -> None:
        refused = OutputRecord(context_id="gone", turn_id="t1", outputs=())
        with send:
            try:
                await send.send(_out(name) if name == "b" else refused)
            except anyio.get_cancelled_exc_class():
                outcome[name] = "never taken"
                raise
            try:
                send.send_nowait(_out("after close"))
                outcome[name] = "taken after close"
            except anyio.WouldBlock:
                outcome[name] = "still open"
            except anyio.BrokenResourceError:
                outcome[name] = "refused"

    with pytest.raises(BaseException) as caught:
        async with Foundation() as foundation:
            manager = foundation.manager
            manager.accept_turn(_turn())
            async with anyio.create_task_group() as producers:
                producers.start_soon(producer, "a", send_a)
                producers.start_soon(producer, "b", send_b)
                await anyio.wait_all_tasks_blocked()  # both producers wait in send
                manager.outputs.consume(receive_a, on_error=refuse)
                manager.outputs.consume(receive_b)
                await foundation.aclose()  # the consumers never ran: the drain takes both
    assert [type(e) for e in _leaves(caught.value)] == [_HostBug]
    assert outcome == {"a": "refused", "b": "refused"}
    assert _texts(manager) == ["b"]
    assert manager.statistics().outputs == OutputStatistics(
        records_total=1, drained_total=1, rejected_total=1
    )
