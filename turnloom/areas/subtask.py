"""``SubtaskArea``: holds the cursor over several model calls, then leaves a summary.

An area that needs several model turns stays exclusive, then yields and
retires; ``promote()`` keeps what must survive reclamation.
"""

# Contract: seed 000 (multi-turn areas); the built-in area is issue 3's.

from __future__ import annotations

__all__ = ("SubtaskArea", "SubtaskPredicate", "SubtaskSummary")

from collections.abc import Callable, Sequence
from typing import TypeAlias

from turnloom.areas._content import MessageContent, as_messages, text_role
from turnloom.context.area import AreaFlowState, AreaLifeState
from turnloom.context.gateway import NativeContent
from turnloom.context.message import Message, Role, admit_message
from turnloom.errors import InputError, StateError, what_type

SubtaskPredicate: TypeAlias = "Callable[[SubtaskArea], bool]"
"""Called with the area after each observation; ``True`` when the sub-task is done.

An exception it raises propagates from ``observe()``: the CoopContext rolls the
render back and raises ``AreaCallbackError`` with phase ``observe``.
"""

SubtaskSummary: TypeAlias = "MessageContent | Callable[[SubtaskArea], MessageContent]"
"""The summary to promote, or a callback producing it from the finished area."""


class SubtaskArea:
    """Runs a sub-task across several model calls and reclaims its intermediate items.

    Lifecycle, driven by a :class:`~turnloom.context.coop.CoopContext`:

    1. First render: the instruction messages; the area is ``exclusive``, so
       ``CoopContext.render()`` returns right after it and the model works on
       the sub-task alone.
    2. The host routes the model's outputs for the sub-task with
       :meth:`route` (and pushes them to the Context as usual). At every
       following ``render()`` the area is at the cursor: it observes its
       EffectRange (kept as :attr:`observed`) and evaluates ``done(self)``.
       While that is false its render adds nothing and it keeps the cursor.
    3. When ``done`` holds (checked inside ``observe()``, as the seed asks
       for state changes), the area yields and retires; its render is
       skipped and later areas render in the same pass. At the next safe
       point where every area whose range overlaps the sub-task's range or
       lies after it has retired, the Collector reclaims the tail from the
       instruction onward (the model's intermediate outputs included) and
       appends the summary from :meth:`promote`. A retained area that renders
       after the sub-task (for example in the pass where it retires) keeps
       the whole tail, intermediate items included, until it retires too.

    Note the one-call lag this implies: the model call made right after
    completion still sees the intermediate items; the summary replaces them
    from the following ``render()`` on.

    Args:
        instruction: the sub-task's instruction: text (one message of
            ``role``), a message, or messages, oldest first.
        done: the completion predicate; reads :attr:`routed` and
            :attr:`observed`.
        summary: what survives: text, message(s), or a callback called once,
            from ``promote()``, with the finished area.
        role: the role of text given as instruction or summary. Default ``user``.

    Raises:
        InputError: ``instruction`` or a fixed ``summary`` is empty, not text /
            messages, or holds a message with no content (only blank text: an
            instruction that renders to nothing would never be observed and
            would hold the cursor forever); ``done`` is not callable; ``role``
            is not a Role or is ``tool``.
        InvalidMessageError, InvalidTextError, DuplicateIdError: a message of
            them is malformed.
    """

    __slots__ = (
        "_collected",
        "_done",
        "_flow_state",
        "_instruction",
        "_kept",
        "_life_state",
        "_observed",
        "_role",
        "_routed",
        "_summary",
    )

    def __init__(
        self,
        instruction: MessageContent,
        *,
        done: SubtaskPredicate,
        summary: SubtaskSummary,
        role: Role = Role.user,
    ) -> None:
        if not callable(done):
            raise InputError(f"SubtaskArea done must be callable, not {what_type(done)}.")
        self._instruction = as_messages(instruction, role=role, where="SubtaskArea instruction")
        self._summary: tuple[Message, ...] | Callable[[SubtaskArea], MessageContent]
        if callable(summary):
            self._summary = summary
        else:
            self._summary = as_messages(summary, role=role, where="SubtaskArea summary")
        self._done = done
        self._role = text_role(role, where="SubtaskArea")
        self._life_state = AreaLifeState.retain
        self._flow_state = AreaFlowState.exclusive
        self._kept = False
        self._collected = False
        self._routed: list[Message] = []
        self._observed: Sequence[NativeContent] = ()

    # -- what the host and the predicate read --------------------------------

    @property
    def life_state(self) -> AreaLifeState:
        """``retain`` while the sub-task runs, ``retired`` once ``done`` held."""
        return self._life_state

    @property
    def flow_state(self) -> AreaFlowState:
        """``exclusive`` while the sub-task runs, then ``yielded``."""
        return self._flow_state

    @property
    def instruction(self) -> tuple[Message, ...]:
        """The instruction messages, oldest first."""
        return self._instruction

    @property
    def routed(self) -> tuple[Message, ...]:
        """Model outputs routed to the sub-task with :meth:`route`, oldest first."""
        return tuple(self._routed)

    @property
    def observed(self) -> Sequence[NativeContent]:
        """The latest snapshot of the area's EffectRange (empty before the first).

        A read-only Sequence of NativeContent, oldest first; the items are the
        Context's own (shared, not copied) and must not be mutated.
        """
        return self._observed

    @property
    def collected(self) -> bool:
        """Whether ``gc_prologue()`` ran: the Collector selected the area for removal.

        A render that collected the area and then failed leaves it registered
        (with ``collected`` true) until the next ``render()`` removes it.
        """
        return self._collected

    def route(self, output: Message | Sequence[Message]) -> None:
        """Hand model output that belongs to the sub-task to the area.

        Routing does not change the area's state; ``done`` is evaluated at the
        next observation.

        Args:
            output: one message, or messages oldest first.

        Raises:
            StateError: the area has retired; nothing was recorded.
            InputError: ``output`` is neither a Message nor a sequence of
                them (text included); nothing was recorded.
            InvalidMessageError, InvalidTextError, DuplicateIdError: a message
                is malformed; nothing was recorded.
        """
        if self._life_state is AreaLifeState.retired:
            raise StateError("Output was routed to a SubtaskArea that has already finished.")
        if isinstance(output, Message):
            messages: tuple[Message, ...] = (output,)
        elif isinstance(output, Sequence) and not isinstance(output, str | bytes):
            messages = tuple(output)
        else:
            raise InputError(
                "SubtaskArea.route() takes a Message or a sequence of Messages, "
                f"not {what_type(output)}."
            )
        self._routed.extend(
            [admit_message(m, where=f"routed output[{i}]")[0] for i, m in enumerate(messages)]
        )

    # -- the area protocol ---------------------------------------------------

    def observe(self, context: Sequence[NativeContent]) -> None:
        """Keep the snapshot and retire (yielding the cursor) when ``done`` holds.

        Errors raised by ``done`` propagate (the CoopContext reports them as
        an ``observe`` failure and rolls back).
        """
        self._observed = context
        self._kept = True  # observed: the instruction's items are in the Context
        if self._done(self):
            self._flow_state = AreaFlowState.yielded
            self._life_state = AreaLifeState.retired

    def render(self) -> list[Message]:
        """The instruction (a new list, oldest first) until it is known kept, then ``[]``.

        A CoopContext observes an area before rendering it again exactly when
        the area owns an EffectRange, so a render without that observation
        means the instruction is not in the Context (a failed render rolled
        it back) and it is rendered again. Then the area keeps the cursor.
        """
        if self._kept:
            return []
        return list(self._instruction)

    def promote(self) -> tuple[Message, ...]:
        """The summary messages, oldest first (the callback's result when one was given).

        A CoopContext calls it once per area, even when the render that
        collected the area failed later and was rolled back: the summary is
        kept, so the callback never sees the area after ``gc_prologue()``.

        Raises:
            InputError, InvalidMessageError: the callback produced empty or
                malformed content.
            Exception: whatever the summary callback raises, unchanged (the
                CoopContext reports it as a ``promote`` failure).
        """
        summary = self._summary
        if callable(summary):
            return as_messages(summary(self), role=self._role, where="SubtaskArea summary")
        return summary

    def gc_prologue(self) -> None:
        """Mark the area collected and drop the routed outputs and snapshot."""
        self._collected = True
        self._routed.clear()
        self._observed = ()
