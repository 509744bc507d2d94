"""The ``Foundation``: the actor that owns the ContextManager and its resources.

A Foundation is opened with ``async with``; it
owns a task group (where preparations run), one :class:`anyio.CapacityLimiter`
for every worker thread it uses, and the :class:`ContextManager`.

Closing order (:meth:`Foundation.aclose`):

1. Stop accepting: every new call raises :class:`FoundationClosedError`, and
   preparations still waiting for their turn's commit fail with it.
2. Let owned preparations settle within :attr:`Foundation.close_grace_period`
   seconds (default 5).
3. Cancel the preparations that have not settled. A preparation that is
   rendering in a worker thread is not abandoned: its thread finishes first.
4. Close the manager: histories are released, no worker thread holds a token
   of the limiter.
"""

from __future__ import annotations

__all__ = ("Foundation",)

from types import TracebackType

import anyio
import anyio.abc
import anyio.lowlevel

from turnloom.context.gateway import Gateway, GatewayType
from turnloom.context.history import HistoryLimits
from turnloom.context.pairing import OpenCallPolicy
from turnloom.context.tokens import TokenCounter
from turnloom.errors import StateError
from turnloom.runtime._door import check_foundation_options
from turnloom.runtime.manager import ContextManager


class Foundation:
    """Owns the runtime's task group, worker-thread limiter and ContextManager.

    Args:
        gateway: the provider prepared inputs are rendered for.
        max_pending_preparations: the bound on pending preparations (default 16).
        worker_threads: the most worker threads rendering at once (default 4).
        history_limits: the bounds of each context's history.
        behavior_rules: application behaviour rules carried as data in each
            turn's runtime-state pair (see :mod:`turnloom.runtime.state`).
        open_calls: ``"exclude"`` (default) or ``"cancel"`` calls without a
            result in prepared inputs.
        close_grace_period: seconds :meth:`aclose` lets pending preparations
            settle before cancelling them (default 5.0; ``math.inf`` waits).
        token_counter: the one estimator of tokens
            (:class:`~turnloom.context.ApproxTokenCounter` by default): each
            message is counted once when it enters a history, and
            ``HistoryLimits.max_tokens``, the history statistics,
            ``PreparedContext.tokens`` and ``ContextManager.working_context``
            all use that count. It must count a list as the sum of its
            messages, as the built-in counters do. Counting runs in
            ``accept_turn`` and ``record``, on the event loop: about 2.5 us
            per tau-bench message for the approximate counter, 57 us for
            ``OpenAITokenCounter("o200k_base")`` (``scripts/bench_tokens.py``).

    Raises:
        InputError: a bound is not positive, ``history_limits`` is not a
            :class:`HistoryLimits`, or an unknown gateway or policy.
        InvalidArgumentError: ``token_counter`` has no ``count`` method.

    Example::

        async with Foundation() as foundation:
            manager = foundation.manager
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(msg,)))
            prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
    """

    def __init__(
        self,
        *,
        gateway: GatewayType | str | Gateway = GatewayType.openai_chat,
        max_pending_preparations: int = 16,
        worker_threads: int = 4,
        history_limits: HistoryLimits | None = None,
        behavior_rules: str | None = None,
        open_calls: OpenCallPolicy = "exclude",
        close_grace_period: float = 5.0,
        token_counter: TokenCounter | None = None,
    ) -> None:
        self._options = check_foundation_options(
            gateway=gateway,
            max_pending_preparations=max_pending_preparations,
            worker_threads=worker_threads,
            history_limits=history_limits,
            behavior_rules=behavior_rules,
            open_calls=open_calls,
            close_grace_period=close_grace_period,
            token_counter=token_counter,
        )
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

        Raises:
            StateError: the Foundation was never opened.
        """
        if self._limiter is None:
            raise StateError("The Foundation is not open; use 'async with Foundation() as f'.")
        return self._limiter

    @property
    def closed(self) -> bool:
        """True once :meth:`aclose` began."""
        return self._closing

    async def __aenter__(self) -> Foundation:
        """Open the task group, the limiter and the manager.

        Raises:
            StateError: the Foundation was already opened once (it is single-use).
        """
        if self._used:
            raise StateError("A Foundation can be opened only once; create a new one.")
        self._used = True
        limiter = anyio.CapacityLimiter(self._options.worker_threads)
        task_group = anyio.create_task_group()
        await task_group.__aenter__()
        try:
            self._manager = ContextManager(
                task_group=task_group, limiter=limiter, options=self._options.manager
            )
        except BaseException as exc:
            await task_group.__aexit__(type(exc), exc, exc.__traceback__)
            raise
        self._task_group = task_group
        self._limiter = limiter
        self._closed_event = anyio.Event()
        return self

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
            result = await self._task_group.__aexit__(exc_type, exc, tb)
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
                self._closed_event.set()
        # Deliver a cancellation that arrived while the cleanup was shielded.
        await anyio.lowlevel.checkpoint()
