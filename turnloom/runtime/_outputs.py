"""``OutputStreams``: the output streams a ContextManager consumes, reached as ``manager.outputs``.

A stream is an :class:`anyio.abc.ObjectReceiveStream`-like memory object
stream or any async iterable of :class:`~turnloom.runtime.OutputRecord`. Its
consumer runs in the Foundation's task group and records each record through
the manager's ``record`` (the same door); a record refused with a typed error
is counted and handed to the stream's ``on_error``, and the consumer goes on.

Close (``OutputStreams._aclose``), after the manager stopped intake:

1. Streams that are not memory object streams are given up to the grace
   period to end (their producers stop first and close them); then their
   consumers are cancelled.
2. The consumers of memory object streams are cancelled, and what the stream
   still holds (its buffer, then the items of senders blocked on it) is
   recorded, in order, by the closing task; then the receive stream is
   closed, so a producer still sending gets :class:`anyio.BrokenResourceError`.

No record is lost between the two: a cancelled ``receive()`` of a memory
object stream takes no item (anyio hands an item only to a receiver without a
pending cancellation, and does not interrupt one it already woke), and a
consumer records each received record before its next checkpoint.
"""

from __future__ import annotations

__all__ = ("OutputErrorHandler", "OutputStreams")

from collections.abc import AsyncIterable, Callable, Sequence
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from turnloom.context.message import Message
from turnloom.errors import InputError, InvalidMessageError, TurnloomError, what_type
from turnloom.runtime._lifecycle import Lifecycle
from turnloom.runtime.schemas import OutputRecord, OutputStatistics

OutputErrorHandler = Callable[[object, TurnloomError], None]
"""Called with a refused record (whatever the stream yielded) and its typed error."""


class _Consumer:
    __slots__ = ("done", "ended", "on_error", "scope", "source")

    def __init__(
        self, source: AsyncIterable[OutputRecord], on_error: OutputErrorHandler | None
    ) -> None:
        self.source = source
        self.on_error = on_error
        self.scope = anyio.CancelScope()
        self.done = anyio.Event()
        self.ended = False  # the stream ended by itself; nothing is left to drain


class OutputStreams:
    """The output streams a manager consumes. Reach it as ``manager.outputs``.

    Every method must be called from the Foundation's event loop; its
    counters are also in ``manager.statistics().outputs``.
    """

    __slots__ = (
        "_active",
        "_consumers",
        "_drained",
        "_dropped",
        "_life",
        "_record",
        "_records",
        "_rejected",
        "_task_group",
    )

    def __init__(
        self, life: Lifecycle, record: Callable[[str, str, Sequence[Message]], int]
    ) -> None:
        self._life = life
        self._record = record  # the manager's record
        self._task_group: anyio.abc.TaskGroup | None = None  # the Foundation's, once open
        self._consumers: list[_Consumer] = []
        self._active = 0  # consumers running
        self._records = 0
        self._drained = 0
        self._rejected = 0
        self._dropped = 0

    def _bind(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group

    def consume(
        self,
        stream: AsyncIterable[OutputRecord],
        *,
        on_error: OutputErrorHandler | None = None,
    ) -> None:
        """Consume an output stream in the manager's own task, recording each record.

        The stream form of ``manager.record``: an anyio memory object stream
        (``anyio.create_memory_object_stream[OutputRecord]``; pass its receive
        side) or any async iterable of :class:`OutputRecord`. Each record is
        recorded exactly as ``record(context_id, turn_id, outputs)`` would,
        through the same checks, in the order the stream yields them; push
        calls to ``record`` may be mixed in. Several streams may be consumed
        at once. A record is recorded when its consumer runs, after the
        send: one for a turn that a later ``accept_turn`` evicted meanwhile
        is dropped as late, as ``record`` drops it (counted in
        ``statistics().dropped_total`` and the history's late outputs).

        A record refused with a typed error (not an OutputRecord, unknown
        context or turn, a malformed or instruction message ...) records
        nothing, is counted in ``statistics().rejected_total`` and is
        passed to ``on_error(record, error)`` when given; the consumer goes
        on. An exception the stream itself raises (or ``on_error`` raises)
        ends the consumer and propagates out of the Foundation's task group;
        raised while the close drains, it leaves after every other stream was
        drained and every stream closed.

        Close order (the Foundation's ``aclose``): intake stops first; a
        memory object stream is then drained at once -- what it still holds,
        senders blocked on it included, is recorded in order -- and its
        receive side closed (a producer still sending gets
        :class:`anyio.BrokenResourceError`); any other stream is given up to
        the grace period to end (its producer stops and ends it), then its
        consumer is cancelled and its ``aclose()``, if any, awaited. Only then
        do preparations settle and the manager close: everything sent before
        the close is in ``manager.history`` afterwards and, with a durable
        store, written by the close (also when the Foundation's task group
        was cancelled or failed), or its write failure reported to
        ``manager.leases.on_error``.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
            InputError: ``stream`` is not an async iterable, or ``on_error`` is
                not callable.

        Cancellation:
            The consumer belongs to the Foundation's task group: cancelling
            the scope the Foundation was opened in cancels it without losing a
            record of a memory object stream (the close drains it).
        """
        self._life.check_open()
        if not isinstance(stream, AsyncIterable):
            raise InputError(
                f"consume takes an async iterable of OutputRecord (for example an "
                f"anyio memory object receive stream), not {what_type(stream)}."
            )
        if on_error is not None and not callable(on_error):
            raise InputError(f"on_error must be callable, not {what_type(on_error)}.")
        assert self._task_group is not None  # bound before the lifecycle opens
        consumer = _Consumer(stream, on_error)
        self._consumers = [c for c in self._consumers if not c.ended]
        self._consumers.append(consumer)
        self._active += 1
        self._task_group.start_soon(self._consume, consumer)

    def statistics(self) -> OutputStatistics:
        """The streams consumed now and the running totals; O(1), safe from another thread."""
        return OutputStatistics(
            streams=self._active,
            records_total=self._records,
            drained_total=self._drained,
            rejected_total=self._rejected,
            dropped_total=self._dropped,
        )

    def _take(self, consumer: _Consumer, record: Any) -> bool:
        """Record one record; count it; a refused one goes to ``on_error``."""
        try:
            if not isinstance(record, OutputRecord):
                raise InvalidMessageError(
                    f"An output stream yielded {what_type(record)}, not an OutputRecord."
                )
            recorded = self._record(record.context_id, record.turn_id, record.outputs)
        except TurnloomError as exc:
            self._rejected += 1
            if consumer.on_error is not None:
                consumer.on_error(record, exc)
            return False
        self._records += 1
        if not recorded and record.outputs:
            self._dropped += 1  # for a turn no longer held, a duplicate, or blank
        return True

    async def _consume(self, consumer: _Consumer) -> None:
        source = consumer.source
        try:
            with consumer.scope:
                async for record in source:
                    self._take(consumer, record)  # before the next checkpoint
                consumer.ended = True
        finally:
            if isinstance(source, MemoryObjectReceiveStream):
                if consumer.ended:
                    source.close()
            else:
                # An async generator is finalized here, on its own task.
                aclose = getattr(source, "aclose", None)
                if aclose is not None:
                    with anyio.CancelScope(shield=True):
                        await aclose()
            self._active -= 1
            consumer.done.set()

    async def _aclose(self, grace_period: float) -> None:
        """Drain and close every stream in the documented order.

        Not shielded: the manager's close runs in the Foundation's shielded scope.

        Raises:
            whatever a stream's ``on_error`` raised while its stream drained
            (the first such error), after every stream was drained and closed.
        """
        consumers = tuple(self._consumers)
        others = [c for c in consumers if not isinstance(c.source, MemoryObjectReceiveStream)]
        with anyio.move_on_after(grace_period):
            for consumer in others:
                await consumer.done.wait()
        for consumer in consumers:
            consumer.scope.cancel()
        for consumer in consumers:
            await consumer.done.wait()
        # An on_error that raises while its stream drains ends that stream
        # only: every other stream is still drained and every one closed (a
        # blocked sender is never left waiting); then the first error leaves.
        error: BaseException | None = None
        for consumer in consumers:
            source = consumer.source
            if isinstance(source, MemoryObjectReceiveStream) and not consumer.ended:
                try:
                    self._drain(consumer, source)
                except BaseException as exc:
                    error = error or exc
                finally:
                    source.close()
        if error is not None:
            raise error

    def _drain(self, consumer: _Consumer, stream: MemoryObjectReceiveStream[OutputRecord]) -> None:
        while True:
            try:
                record = stream.receive_nowait()
            except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                return
            if self._take(consumer, record):
                self._drained += 1
