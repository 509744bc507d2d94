"""``Voice``: the history edits a voice host makes, reached as ``manager.voice``.

A spoken reply can be cut off by the user (a barge-in), and a committed turn
can turn out to be a false start (noise, a cough, words cut off). Both edits
go through the manager's ordinary doors: an interrupted output is recorded by
``manager.record`` as what was played, and a retraction is checked and
applied by the context table in one step.
"""

from __future__ import annotations

__all__ = ("Voice",)

from collections.abc import Callable, Sequence

from turnloom.context.interruption import interrupted_output
from turnloom.context.message import Message
from turnloom.runtime._contexts import ContextTable
from turnloom.runtime._leases import Leases
from turnloom.runtime._lifecycle import Lifecycle


class Voice:
    """Barge-ins and false starts of a manager's contexts. Reach it as ``manager.voice``.

    Every method must be called from the Foundation's event loop. Within an
    :meth:`~turnloom.runtime.ContextManager.invocation`,
    ``Invocation.record_interrupted`` binds an interrupted output to the
    very turn the model call answered.
    """

    __slots__ = ("_leases", "_life", "_record", "_table")

    def __init__(
        self,
        life: Lifecycle,
        table: ContextTable,
        leases: Leases,
        record: Callable[[str, str, Sequence[Message]], int],
    ) -> None:
        self._life = life
        self._table = table
        self._leases = leases
        self._record = record  # the manager's record

    def record_interrupted(
        self,
        context_id: str,
        turn_id: str,
        output: Message,
        *,
        played: int | None = None,
        played_text: str | None = None,
    ) -> int:
        """Record a model output interrupted while it was played (a voice barge-in).

        Only what the user heard is recorded, through ``manager.record``: the
        output's text up to what was played (see
        :func:`~turnloom.context.played_prefix`); its tool calls stay, and as
        they have no result the ``open_calls`` policy excludes or cancels them
        in the next input unless their results are recorded. An output cut
        before any text was played and without other parts is blank and not
        recorded. The output's own words are recorded, never the played
        transcript's.

        Args:
            context_id: the conversation.
            turn_id: the turn the output answered.
            output: the whole assistant message the model produced.
            played: how many characters of its text were played, in code
                points (what ``len(text)`` counts, not UTF-16 units or
                bytes), counted over its text parts in order.
            played_text: instead of ``played``, the text that was played as
                the host has it (the TTS's words, or a transcription of the
                audio sent): matched against the output's text by the rule
                of :func:`~turnloom.context.played_count` (words, case,
                punctuation and numbers normalised), so the TTS's
                normalisation does not move the cut.

        Returns:
            how many messages were recorded (0 or 1).

        Raises:
            InvalidMessageError: ``output`` is not an assistant Message, both
                or neither of ``played`` and ``played_text`` are given,
                ``played`` is not a non-negative int or ``played_text`` not a
                str; and as ``manager.record``.
            PlayedTextMismatchError: fewer than half of the played words
                match the output's (a transcript of something else); nothing
                was recorded. A host that prefers to record anyway catches it
                and records the played text as the reply.
            StateError, FoundationClosedError, UnknownContextError,
            UnknownTurnError, InvalidTextError, DuplicateIdError,
            ItemTooLargeError, TurnTooLargeError, ProviderRuleError,
            AmbiguousStepError, StrandedResultsError, NotClaimedError,
            StaleLeaseError, HostCallbackError: as ``manager.record``
            (outputs for a removed context are dropped and counted, as
            there).
        """
        self._life.check_recording()
        cut = interrupted_output(output, played, played_text)
        if not self._table.was_removed(context_id):
            self._table.get(context_id)
        return self._record(context_id, turn_id, [cut])

    def retract_turn(self, context_id: str, turn_id: str) -> None:
        """Take back the newest turn of a context that produced no answer (a false start).

        A voice host commits the user's speech as a turn; when it turns out
        to be a false start, retracting it keeps it out of every later input.
        The turns its commit evicted come back (see
        :meth:`~turnloom.context.TurnHistory.retract`: restored while the
        turn and its kept pair are all that changed since, oldest first), so
        the next prepare holds them as before the commit; they never counted
        in ``evicted_turns_total``. Its id stays used: outputs recorded for it
        later are dropped and counted, and a later prepare of it raises
        :class:`~turnloom.errors.UnknownTurnError`, as does one in flight
        (its result is discarded, counted as discarded; one rendering in a
        worker thread finishes first). Prefixes already delivered for it are
        unchanged. A durable store logs the retraction,
        and a host that restores the context before it restores the same
        turns; except a manager with ``earlier_state="drop"`` restoring a
        context a ``"keep"`` manager wrote: dropping the earlier turns' kept
        pairs is a change, so the turns evicted stay evicted.

        Raises:
            StateError: the manager is not bound to an open Foundation yet.
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: a malformed id.
            UnknownContextError: no such context.
            UnknownTurnError: the turn is not held.
            StateError: the turn is not the newest, outputs were recorded for
                it, or a model call of the context is in flight.
            NotClaimedError, StaleLeaseError: as ``manager.accept_turn``.

            Nothing changed when any of these is raised.
        """
        queue = self._life.check_open().queue
        self._leases._check_writable(context_id)
        state = self._table.get(context_id)
        self._table.retract(state, context_id, turn_id)
        queue.retract(context_id, turn_id, state)
