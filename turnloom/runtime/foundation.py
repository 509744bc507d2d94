"""The ``Foundation``: the actor that owns the ContextManager and its resources.

A Foundation is opened with ``async with``; it
owns a task group (for its own tasks: output-stream consumers, the durable
writer; a preparation runs in its requester's task), one
:class:`anyio.CapacityLimiter` for every worker thread it uses, one render
thread that renders every preparation in batches (started with the first
render), its collector policy (:class:`~turnloom.runtime.CollectorPolicy`),
and the :class:`ContextManager`.

Closing order (:meth:`Foundation.aclose`), the seed's lifecycle:

1. Stop intake: every call that starts work (``accept_turn``, ``prepare``,
   ``build``, ``invocation``, areas, new output streams) raises
   :class:`FoundationClosedError`; the host's producers stop here.
2. Drain the record consumers: what the manager's output streams still hold
   is recorded (see :meth:`~turnloom.runtime.OutputStreams.consume`);
   ``record`` is still accepted until the manager closes.
3. Let owned preparations settle within :attr:`Foundation.close_grace_period`
   seconds (default 5; shared with step 2), then cancel the rest (failing
   with :class:`FoundationClosedError`; preparations still waiting for their
   turn's commit fail with it at once). A preparation that is rendering in a
   worker thread is not abandoned: its thread finishes first. Then the
   render thread, which finished every render handed to it (a render whose
   requester left before it began is skipped), is joined.
4. With a durable store: write what is queued (within the grace period),
   again until nothing is (a ``record`` accepted during a write is written by
   the next), then release every lease; from then on ``record`` raises
   :class:`FoundationClosedError`. A store failure during these writes ends
   them; it goes once to ``manager.leases.on_error`` (so does a failed
   release, whose leases then expire by themselves) and the close goes on:
   what stayed unwritten is what a crash would lose. The store itself stays open (its opener
   closes it).
5. Close the manager: ``record`` raises :class:`FoundationClosedError`;
   histories are released, each context's final history staying readable
   through :meth:`ContextManager.history`; no worker thread holds a token of
   the limiter. ``history``, ``context_ids``, ``statistics`` and the
   manager's properties still answer. The collector policy stops and
   unfreezes what it froze.

A memory source bound to the manager is borrowed and is never closed by the
Foundation.
"""

from __future__ import annotations

__all__ = ("Foundation",)

from collections.abc import Callable
from datetime import datetime
from types import TracebackType
from typing import Unpack

import anyio
import anyio.abc
import anyio.lowlevel

from turnloom.errors import InputError, StateError, what_type
from turnloom.runtime._collector import CollectorPolicy, FrozenCollector, check_policy
from turnloom.runtime._door import check_foundation_options
from turnloom.runtime._options import ManagerKwargs
from turnloom.runtime.manager import ContextManager

_DEFAULT_COLLECTOR = CollectorPolicy()


class Foundation:
    """Owns the runtime's task group, worker-thread limiter and ContextManager.

    Two ways to make one: bind a manager the host built first (the seed's
    construction order; building a manager needs no Foundation service), or
    let the Foundation build one from the manager's keyword arguments.

    Args:
        manager: a :class:`ContextManager` built by the host (for example
            with :func:`~turnloom.runtime.build_context_manager` from a
            configuration file), not yet bound to a Foundation; the Foundation
            owns it from then on. None (default): built from the keyword
            arguments below.
        worker_threads: the most worker threads of work other than renders
            (store I/O, the bridge's token counts) at once, and how many
            renders may be in the render thread while a small prepare still
            renders inline (default 4). Renders go to the Foundation's one
            render thread, which holds at most ``max_pending_preparations``
            (each holds its preparation's slot).
        close_grace_period: seconds :meth:`aclose` lets pending preparations
            settle before cancelling them (default 5.0; ``math.inf`` waits).
        collector: the collector policy (default ``CollectorPolicy()``): while
            open, the Foundation periodically collects what changed and
            freezes what lives (``gc.freeze``), so full collections stop
            walking the retained histories; what the process holds at the
            open is frozen then, uncollected; unfrozen again at the close.
            Process-wide; see :class:`~turnloom.runtime.CollectorPolicy` for
            what a host gives up. ``None`` turns it off.
        clock: returns the current time as a timezone-aware datetime; read
            once per preparation whose :class:`~turnloom.runtime.Perception`
            gives no time (default ``datetime.now(UTC)``; inject one in tests).
            A clock that raises fails that preparation with
            :class:`~turnloom.errors.HostCallbackError` (its exception the
            ``__cause__``); one that returns a naive datetime or another
            type, with :class:`~turnloom.errors.InvalidMessageError`.
        **options: the manager's options when ``manager`` is None, each
            documented once with its default on
            :class:`~turnloom.runtime.ManagerSettings` (the gateway, bounds,
            policies, token counter, assembly strategy and memory source,
            per-tenant fairness, the durable store and its leases, the prompt
            cache); none may be given with ``manager``.

    Raises:
        InputError: ``collector`` is not a CollectorPolicy or None, a bound
            is not positive, ``history_limits`` is not a
            :class:`HistoryLimits`, an unknown gateway or policy, ``manager``
            is not a ContextManager, ``manager`` is given together with a
            manager option, ``clock`` is not callable, or a store option is
            malformed (see :class:`ContextManager`).
        InvalidArgumentError: ``token_counter`` has no ``count`` method.

    Exceptions leaving ``async with``: an exception raised in the body (a
    :class:`~turnloom.errors.TurnloomError`, an ``OSError``, a
    ``KeyboardInterrupt``) leaves as it was raised, not wrapped in an
    ``ExceptionGroup``, when it is the only one; ``except TurnloomError``
    catches it. Only if the Foundation's own tasks failed as well does a
    ``BaseExceptionGroup`` holding all of them leave; ``except*`` handles
    both cases.

    Example::

        async with Foundation() as foundation:
            manager = foundation.manager
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(msg,)))
            prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
    """

    def __init__(
        self,
        manager: ContextManager | None = None,
        *,
        worker_threads: int = 4,
        close_grace_period: float = 5.0,
        clock: Callable[[], datetime] | None = None,
        collector: CollectorPolicy | None = _DEFAULT_COLLECTOR,
        **options: Unpack[ManagerKwargs],
    ) -> None:
        if manager is None:
            manager = ContextManager(**options)
        elif not isinstance(manager, ContextManager):
            raise InputError(f"manager must be a ContextManager, not {what_type(manager)}.")
        elif options:
            raise InputError(
                f"Foundation got a manager and its option(s) {', '.join(options)}; "
                "build the manager with them instead."
            )
        if clock is not None and not callable(clock):
            raise InputError(f"clock must be callable, not {what_type(clock)}.")
        self._clock = clock
        self._policy = check_policy(collector)
        self._collector: FrozenCollector | None = None
        self._collecting: anyio.CancelScope | None = None  # made on the loop, when opened
        self._options = check_foundation_options(
            manager=manager.options,
            worker_threads=worker_threads,
            close_grace_period=close_grace_period,
        )
        self._built = manager
        self._task_group: anyio.abc.TaskGroup | None = None
        self._limiter: anyio.CapacityLimiter | None = None
        self._manager: ContextManager | None = None
        self._closing = False
        self._closed_event: anyio.Event | None = None
        self._used = False

    @property
    def close_grace_period(self) -> float:
        """Seconds :meth:`aclose` lets pending preparations settle before cancelling."""
        return self._options.close_grace_period

    @property
    def manager(self) -> ContextManager:
        """The ContextManager.

        Raises:
            StateError: the Foundation was never opened.
        """
        if self._manager is None:
            raise StateError("The Foundation is not open; use 'async with Foundation() as f'.")
        return self._manager

    @property
    def limiter(self) -> anyio.CapacityLimiter:
        """The limiter every worker thread of this Foundation goes through.

        Renders do not: they go to the Foundation's one render thread, bounded
        by the pending queue; its ``total_tokens`` at the open is the inline
        gate's ``worker_threads``.

        Raises:
            StateError: the Foundation was never opened.
        """
        if self._limiter is None:
            raise StateError("The Foundation is not open; use 'async with Foundation() as f'.")
        return self._limiter

    @property
    def collector(self) -> FrozenCollector | None:
        """The collector policy's runner (None: opened without one, or never opened).

        Its ``statistics()`` say how many steps it took and what they cost.
        """
        return self._collector

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` began."""
        return self._closing

    async def __aenter__(self) -> Foundation:
        """Open the task group, the limiter and the manager.

        Raises:
            StateError: the Foundation was already opened once (it is single-use),
                or its manager is already bound to another Foundation.
        """
        if self._used:
            raise StateError("A Foundation can be opened only once; create a new one.")
        self._used = True
        self._built._life.check_unbound()
        limiter = anyio.CapacityLimiter(self._options.worker_threads)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        try:
            self._built._bind(task_group=task_group, limiter=limiter, clock=self._clock)
            self._manager = self._built
        except BaseException as exc:
            await task_group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._task_group = task_group
        self._limiter = limiter
        self._closed_event = anyio.Event()
        if self._policy is not None:
            manager = self._built

            def live() -> tuple[int, int]:  # the live state that explains growth
                statistics = manager.statistics()
                return (statistics.contexts, statistics.history.items)

            collector = self._collector = FrozenCollector(self._policy, live)
            self._collecting = anyio.CancelScope()
            task_group.start_soon(self._collect, collector, self._collecting)
        return self

    @staticmethod
    async def _collect(collector: FrozenCollector, scope: anyio.CancelScope) -> None:
        with scope:
            await collector.run()

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> bool | None:
        """Close (see :meth:`aclose`), then leave the task group.

        Cancellation:
            As :meth:`aclose`: the cleanup completes, then the cancellation
            propagates.
        """
        try:
            await self.aclose()
        finally:
            assert self._task_group is not None
            try:
                result = await self._task_group.__aexit__(exc_type, exc, tb)
            except BaseExceptionGroup as group:
                # The task group wraps the body's own exception; when it is the
                # only one, let it leave as it was raised (a false result
                # re-raises ``exc`` with its own traceback).
                if exc is None or list(group.exceptions) != [exc]:
                    raise
                result = False
        return result

    async def aclose(self) -> None:
        """Close the Foundation in the documented order; idempotent.

        A second call waits until the first has finished. Calling it on a
        Foundation that was never opened does nothing.

        Cancellation:
            Cleanup is shielded: a cancelled ``aclose`` still completes every
            step (bounded by the grace period plus the longest running render),
            then the cancellation is delivered. A cancelled second call likewise
            returns only after the first call's cleanup, then is cancelled.
        """
        if self._manager is None or self._closed_event is None:
            return
        if self._closing:
            with anyio.CancelScope(shield=True):
                await self._closed_event.wait()
            # As below: a cancellation that arrived while waiting is delivered now.
            await anyio.lowlevel.checkpoint()
            return
        self._closing = True
        manager = self._manager
        with anyio.CancelScope(shield=True):
            try:
                await manager._aclose(self._options.close_grace_period)
            finally:
                if self._collecting is not None:
                    self._collecting.cancel()
                if self._collector is not None:
                    self._collector.close()
                self._closed_event.set()
        # Deliver a cancellation that arrived while the cleanup was shielded.
        await anyio.lowlevel.checkpoint()
