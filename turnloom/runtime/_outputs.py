"""The output streams a ContextManager consumes, each in its own task, drained at close.

A stream is an :class:`anyio.abc.ObjectReceiveStream`-like memory object
stream or any async iterable of :class:`~turnloom.runtime.OutputRecord`. Its
consumer runs in the Foundation's task group and records each record through
the manager's ``record`` (the same door); a record refused with a typed error
is counted and handed to the stream's ``on_error``, and the consumer goes on.

Close (:meth:`OutputStreams.aclose`), after the manager stopped intake:

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

from collections.abc import AsyncIterable, Callable
from typing import Any

import anyio
import anyio.abc
from anyio.streams.memory import MemoryObjectReceiveStream

from turnloom.errors import TurnloomError
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
    """The consumers of one manager's output streams, and their counters."""

    def __init__(
        self, task_group: anyio.abc.TaskGroup, record: Callable[[OutputRecord], int]
    ) -> None:
        self._task_group = task_group
        self._record = record
        self._consumers: list[_Consumer] = []
        self.active = 0  # consumers running
        self.records = 0
        self.drained = 0
        self.rejected = 0

    def start(
        self, source: AsyncIterable[OutputRecord], on_error: OutputErrorHandler | None
    ) -> None:
        """Consume ``source`` in a new task of the Foundation's task group."""
        consumer = _Consumer(source, on_error)
        self._consumers = [c for c in self._consumers if not c.ended]
        self._consumers.append(consumer)
        self.active += 1
        self._task_group.start_soon(self._consume, consumer)

    def statistics(self) -> OutputStatistics:
        """The streams consumed now and the running totals; O(1), safe from another thread."""
        return OutputStatistics(
            streams=self.active,
            records_total=self.records,
            drained_total=self.drained,
            rejected_total=self.rejected,
        )

    def _take(self, consumer: _Consumer, record: Any) -> bool:
        """Record one record; count it; a refused one goes to ``on_error``."""
        try:
            self._record(record)
        except TurnloomError as exc:
            self.rejected += 1
            if consumer.on_error is not None:
                consumer.on_error(record, exc)
            return False
        self.records += 1
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
            self.active -= 1
            consumer.done.set()

    async def aclose(self, grace_period: float) -> None:
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
                self.drained += 1
