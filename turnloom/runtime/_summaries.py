"""``manager.summaries``: summary compaction and pruning of old tool output, run by the runtime.

The host gives a *summarizer* (an async callable: the messages to compact in,
the summary messages out) and a :class:`~turnloom.context.summaries.CompactionPolicy`
(when, down to what); turnloom never calls a model itself. At each safe point
(a commit, a record, the end of a model call, a retraction: never while a
model call is in flight) the runtime:

1. prunes old tool output when a :class:`~turnloom.context.summaries.PrunePolicy`
   is set;
2. applies a summary that arrived, when the history may change now;
3. starts a summarization when the policy says so and none runs for the
   context.

A summarization runs in its own task in the Foundation's task group, never
inside a prepare: a prepare never waits for a summarizer. It is given the
messages of the oldest turns (``_summary_ops.summary_range``, the previous
summary turn first) and bounded by the policy's ``timeout``. While it runs,
commits, records, prepares and evictions go on as without it. The summary
replaces exactly the turns it was given that are still held, atomically, at
the first safe point where the history may change
(``_summary_ops.changeable``: no model call in flight, the newest turn
answered, no turns held aside for a false start's retraction); turns evicted
meanwhile are covered by it and were counted as evicted. One summarization
per context at a time. A summarizer that raises, times out, is cancelled or
returns something that is not a summary changes nothing: the failure is
counted and handed to :attr:`Summaries.on_error` as a
:class:`~turnloom.errors.SummaryError`, and eviction goes on as without a
summarizer; the next safe point may try again. So does a summary written from
turns that changed while the summarizer ran (an output recorded late to one
of them): it would lose what it does not hold, so it is dropped (reason
``"stale"``) and the next summarization is given the turns as they are.
Pruning waits while a summary is being written.
"""

from __future__ import annotations

__all__ = ("Summaries", "Summarizer")

import time
from collections.abc import Callable, Sequence
from typing import Protocol

import anyio
import anyio.abc

from turnloom.context.history import (
    changeable,
    next_summary_id,
    range_snapshot,
    summary_range,
)
from turnloom.context.message import Message
from turnloom.context.summaries import (
    CompactionPolicy,
    PrunePolicy,
    check_summary,
    summary_due,
)
from turnloom.errors import (
    CapacityError,
    InputError,
    InvalidMessageError,
    SummaryError,
    TurnloomError,
    excerpt,
    what_type,
)
from turnloom.runtime._contexts import ContextState, ContextTable
from turnloom.runtime._counters import Counters


class Summarizer(Protocol):
    """The host's summarizer: the messages of the turns to compact in, the summary out.

    Called with the messages of the oldest turns, oldest first (the previous
    summary turn's messages first, when there is one), tool calls and their
    results whole. Returns the summary: ``user`` messages, then optionally
    ``assistant`` messages, text only
    (:func:`~turnloom.context.summaries.check_summary`). It may take seconds;
    it runs in the runtime's own task, cancelled past the policy's
    ``timeout``, when its context is removed and when the Foundation closes.
    """

    async def __call__(self, messages: tuple[Message, ...], /) -> Sequence[Message]:
        """The summary of ``messages``."""
        ...


class _Job:
    """One context's summarization: running, then holding its summary until applied."""

    __slots__ = ("scope", "snapshot", "state", "summary", "turn_ids")

    def __init__(
        self, state: ContextState, turn_ids: tuple[str, ...], snapshot: tuple[object, ...]
    ) -> None:
        self.state = state
        self.turn_ids = turn_ids
        self.snapshot = snapshot  # the turns as the summarizer was given them
        # cancel() cancels it; once cancel_called, whatever the summarizer returns is dropped.
        self.scope = anyio.CancelScope()
        self.summary: tuple[Message, ...] | None = None  # set once it arrived, valid


class Summaries:
    """Summary compaction and pruning of one manager; reach it as ``manager.summaries``.

    Configure it at any time: :attr:`summarizer` and :attr:`policy` together
    turn summary compaction on, :attr:`prune` turns pruning on (either
    without the other), :attr:`on_error` receives the failures. Each setting
    takes effect at the next safe point. Counters: ``manager.statistics().summaries``.
    """

    __slots__ = (
        "_counters",
        "_jobs",
        "_on_error",
        "_policy",
        "_prune",
        "_pruned",
        "_summarizer",
        "_table",
        "_task_group",
    )

    def __init__(self, table: ContextTable, counters: Counters) -> None:
        self._table = table
        self._counters = counters
        self._summarizer: Summarizer | None = None
        self._policy: CompactionPolicy | None = None
        self._prune: PrunePolicy | None = None
        self._on_error: Callable[[SummaryError], object] | None = None
        self._jobs: dict[str, _Job] = {}
        # Per context: the turns its last pruning pass found pruned (see prune_turns).
        self._pruned: dict[str, tuple[ContextState, dict[int, object]]] = {}
        self._task_group: anyio.abc.TaskGroup | None = None
        table.safe_point = self._safe_point
        table.left = self._left

    # -- settings ----------------------------------------------------------------------

    @property
    def summarizer(self) -> Summarizer | None:
        """The host's async summarizer (see :class:`Summarizer`), or None (default: off).

        Raises:
            InputError: (on assignment) not callable and not None.
        """
        return self._summarizer

    @summarizer.setter
    def summarizer(self, summarizer: Summarizer | None) -> None:
        if summarizer is not None and not callable(summarizer):
            raise InputError(f"summarizer must be callable or None, not {what_type(summarizer)}.")
        self._summarizer = summarizer

    @property
    def policy(self) -> CompactionPolicy | None:
        """When summaries are made and down to what (:class:`CompactionPolicy`), or None.

        Raises:
            InputError: (on assignment) not a CompactionPolicy and not None.
        """
        return self._policy

    @policy.setter
    def policy(self, policy: CompactionPolicy | None) -> None:
        if policy is not None and not isinstance(policy, CompactionPolicy):
            raise InputError(f"policy must be a CompactionPolicy or None, not {what_type(policy)}.")
        self._policy = policy

    @property
    def prune(self) -> PrunePolicy | None:
        """Which old tool output is pruned (:class:`PrunePolicy`), or None (default: off).

        Raises:
            InputError: (on assignment) not a PrunePolicy and not None.
        """
        return self._prune

    @prune.setter
    def prune(self, policy: PrunePolicy | None) -> None:
        if policy is not None and not isinstance(policy, PrunePolicy):
            raise InputError(f"prune must be a PrunePolicy or None, not {what_type(policy)}.")
        self._prune = policy

    @property
    def on_error(self) -> Callable[[SummaryError], object] | None:
        """The host's hook for failed summarizations, or None (default).

        Called on the event loop with each :class:`~turnloom.errors.SummaryError`
        (its ``reason``: ``"raised"``, ``"timeout"``, ``"cancelled"``,
        ``"invalid"``, ``"stale"``). What it returns is ignored; an exception it raises is
        swallowed.

        Raises:
            InputError: (on assignment) not callable and not None.
        """
        return self._on_error

    @on_error.setter
    def on_error(self, hook: Callable[[SummaryError], object] | None) -> None:
        if hook is not None and not callable(hook):
            raise InputError(f"on_error must be callable or None, not {what_type(hook)}.")
        self._on_error = hook

    # -- queries and control -----------------------------------------------------------

    def running(self, context_id: str) -> bool:
        """Whether a summarization of ``context_id`` runs or waits to be applied. O(1)."""
        return context_id in self._jobs

    def pending_turns(self, context_id: str) -> tuple[str, ...]:
        """The turn ids the context's summarization was given, oldest first; () without one."""
        job = self._jobs.get(context_id)
        return job.turn_ids if job is not None else ()

    def cancel(self, context_id: str) -> bool:
        """Cancel the summarization of ``context_id``; whether there was one.

        A running summarizer is cancelled (reason ``"cancelled"``, counted
        and reported when it ends; one that shields itself and returns anyway
        has its summary counted as discarded); a summary waiting to be
        applied is dropped (counted as failed, reported with reason
        ``"cancelled"``). The history is left as it is. Never waits: a
        summarizer still running counts as :meth:`running` until it ends, and
        no other summarization of the context starts before.
        """
        job = self._jobs.get(context_id)
        if job is None or job.scope.cancel_called:
            return job is not None
        if job.summary is None:
            job.scope.cancel()
        else:
            del self._jobs[context_id]
            self._fail(job, "cancelled", "its summary was dropped before it was applied")
        return True

    # -- the runtime's side -------------------------------------------------------------

    def _bind(self, task_group: anyio.abc.TaskGroup) -> None:
        """Run summarizations in the opening Foundation's task group from now on."""
        self._task_group = task_group

    def _close(self) -> None:
        """The Foundation closes: cancel every summarization, start no more."""
        self._task_group = None
        for context_id in tuple(self._jobs):
            self.cancel(context_id)

    def _left(self, state: ContextState) -> None:
        """A context left the manager (removed, unloaded): cancel its summarization, if any."""
        context_id = state.context_id
        pruned = self._pruned.get(context_id)
        if pruned is not None and pruned[0] is state:
            del self._pruned[context_id]
        job = self._jobs.get(context_id)
        if job is not None and job.state is state:
            self.cancel(context_id)

    def _safe_point(self, state: ContextState) -> None:
        """Prune, apply an arrived summary, start a summarization: see the module docstring."""
        history = state.history
        prune = self._prune
        job = self._jobs.get(state.context_id)
        # Not while a summary is being written: a pruned turn of its range would
        # make the summary stale (see _apply).
        if prune is not None and job is None and changeable(history):
            memo = self._pruned.get(state.context_id)
            if memo is None or memo[0] is not state:
                memo = self._pruned[state.context_id] = (state, {})
            self._table.prune(state, prune.keep_turns, prune.note, memo[1])
        if job is not None:
            # A job of a context that left (a new one took the id) settles by itself.
            if job.state is state and job.summary is not None:
                self._apply(job)
            return
        policy, summarizer, task_group = self._policy, self._summarizer, self._task_group
        if policy is None or summarizer is None or task_group is None:
            return
        turns, _, _, tokens, *_ = history.counts()
        if not summary_due(policy, turns, tokens):
            return
        turn_ids = summary_range(history, policy.keep_turns, policy.keep_tokens)
        if not turn_ids:
            return
        view = history.view()
        messages: list[Message] = []
        for turn_id in turn_ids:
            messages.extend(view.turn_messages(turn_id))
        snapshot = range_snapshot(history, turn_ids)
        job = self._jobs[state.context_id] = _Job(state, turn_ids, snapshot)
        self._counters.summaries_started += 1
        self._counters.summaries_running += 1
        task_group.start_soon(self._run, job, summarizer, policy, tuple(messages))

    async def _run(
        self,
        job: _Job,
        summarizer: Summarizer,
        policy: CompactionPolicy,
        messages: tuple[Message, ...],
    ) -> None:
        """Call the summarizer for ``job``; keep its summary, or report why there is none.

        Cancellation: the job's own scope (``cancel``) ends it as failed
        ("cancelled"); a cancellation from outside (the task group) does too,
        then propagates. The history changes only through :meth:`_apply`, at a
        safe point.
        """
        context_id = job.state.context_id
        reason = ""
        cause: BaseException | None = None
        summary: tuple[Message, ...] = ()
        started = time.perf_counter()
        try:
            with job.scope:
                with anyio.move_on_after(policy.timeout) as deadline:
                    try:
                        returned = await summarizer(messages)
                    except Exception as exc:  # cancellation is a BaseException: it passes
                        reason, cause = "raised", exc
                    else:
                        try:
                            given, answer = check_summary(returned, policy.max_summary_messages)
                            summary = (*given, *answer)
                        except Exception as exc:  # typed; anything else is the host's object's
                            reason, cause = "invalid", exc
                if deadline.cancelled_caught:
                    reason = "timeout"
            if job.scope.cancelled_caught:
                reason = "cancelled"
        except BaseException:
            reason = "cancelled"
            raise
        finally:
            self._counters.summaries_running -= 1
            self._counters.summary_latency.observe(time.perf_counter() - started)
            if reason:
                if self._jobs.get(context_id) is job:
                    del self._jobs[context_id]
                self._fail(job, reason, _why(reason, policy), cause)
        if reason:
            return
        if job.scope.cancel_called or self._table.contexts.get(context_id) is not job.state:
            # Cancelled, its context gone: it returned anyway (it ignored the cancellation).
            if self._jobs.get(context_id) is job:
                del self._jobs[context_id]
            self._counters.summaries_discarded += 1
            return
        job.summary = summary
        self._apply(job)

    def _apply(self, job: _Job) -> None:
        """Apply ``job``'s summary if the history may change now; else it waits."""
        state = job.state
        history = state.history
        if state.in_flight is not None or not changeable(history):
            return
        del self._jobs[state.context_id]
        summary = job.summary
        assert summary is not None
        try:
            applied = self._table.summarize(
                state, job.turn_ids, next_summary_id(history), summary, len(summary), job.snapshot
            )
        except (InvalidMessageError, CapacityError) as exc:
            # What the summarizer returned: too large for the history's limits, or an
            # id one of its messages holds is a held message's.
            self._fail(
                job, "invalid", "its summary is over the history's limits or holds a held id", exc
            )
            return
        except TurnloomError as exc:
            self._fail(job, "stale", "its summary no longer fits the history", exc)
            return
        counters = self._counters
        counters.summaries_finished += 1
        counters.turns_summarized += len(applied.replaced)
        counters.tokens_summarized += applied.tokens
        counters.summary_tokens += applied.summary_tokens

    def _fail(self, job: _Job, reason: str, why: str, cause: BaseException | None = None) -> None:
        self._counters.summaries_failed += 1
        context_id = job.state.context_id
        error = SummaryError(
            f"The summarization of context {excerpt(context_id)} (turns "
            f"{excerpt(list(job.turn_ids))}) gave no summary: {why}; the history is left as it "
            "was.",
            context_id=context_id,
            reason=reason,
        )
        error.__cause__ = cause
        hook = self._on_error
        if hook is not None:
            try:
                hook(error)
            except Exception:  # documented: the hook's failure is swallowed
                pass


def _why(reason: str, policy: CompactionPolicy) -> str:
    if reason == "timeout":
        return f"the summarizer ran past the policy's timeout of {policy.timeout} seconds"
    if reason == "raised":
        return "the summarizer raised"
    if reason == "invalid":
        return "the summarizer returned something that is not a summary"
    return "the summarization was cancelled"
