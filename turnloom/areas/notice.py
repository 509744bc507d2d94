"""Notices: rendered once, then retired (``OneShotNotice``) or kept (``PinnedNotice``)."""

# Contract: seed 000 (the minimal OneShotNoticeArea example, made reusable).

from __future__ import annotations

__all__ = ("OneShotNotice", "PinnedNotice")

from collections.abc import Sequence

from turnloom.areas._content import MessageContent, as_messages
from turnloom.context.area import AreaFlowState, AreaLifeState
from turnloom.context.gateway import NativeContent
from turnloom.context.message import Message, Role
from turnloom.errors import StateError


class _Notice:
    """What both notices share: checked messages, a yielded cursor, nothing promoted."""

    __slots__ = ("_messages", "_rendered")

    def __init__(self, content: MessageContent, role: Role, where: str) -> None:
        self._messages = as_messages(content, role=role, where=where)
        self._rendered = False

    @property
    def flow_state(self) -> AreaFlowState:
        """Always ``yielded``."""
        return AreaFlowState.yielded

    @property
    def messages(self) -> tuple[Message, ...]:
        """The notice's messages, oldest first."""
        return self._messages

    @property
    def rendered(self) -> bool:
        """Whether the notice has been rendered."""
        return self._rendered

    def promote(self) -> tuple[Message, ...]:
        """Nothing: a one-shot notice leaves nothing behind, and a pinned one never retires
        (so it is never asked)."""
        return ()

    def gc_prologue(self) -> None:
        """No external resources to release."""


class OneShotNotice(_Notice):
    """Renders its messages once, retires at once, and promotes nothing.

    Use it for a one-time, authoritative notice ("the repository state is the
    source of truth"). It yields the cursor, so later areas render in the
    same pass. Because it retires on its first render, the Collector reclaims
    its tail (the notice and everything after it) at the first later safe
    point where every area whose range overlaps it *or lies after it* has
    retired (the Collector reclaims only whole runs of components from the
    Context tail backward); nothing survives. An area that keeps rendering
    after the notice, or a :class:`PinnedNotice` registered after it, keeps
    the notice in the Context for as long as it is retained.

    A failed ``CoopContext.render()`` rolls the Context back but cannot roll
    back the notice's own state: if an area later in the same pass fails, the
    notice's items are removed while the notice stays retired, and the next
    safe point removes it without rendering it again (a retired area never
    renders). The notice is then lost; after an
    :class:`~turnloom.errors.AreaCallbackError`, ``notice.rendered`` true while
    the notice has no EffectRange identifies this, and a new notice can be
    registered.

    Args:
        content: text (one message of ``role``), a message, or messages,
            oldest first.
        role: the role of a text notice. Default ``user``: the notice is data
            for the model, never promoted to an instruction.

    Raises:
        InputError: ``content`` is empty, not text / messages, or holds a
            message with no content (only blank text, which no gateway
            renders); ``role`` is not a Role or is ``tool``.
        InvalidMessageError, InvalidTextError, DuplicateIdError: a message is
            malformed; raised here, never at render time.
    """

    __slots__ = ("_life_state",)

    def __init__(self, content: MessageContent, *, role: Role = Role.user) -> None:
        super().__init__(content, role, "OneShotNotice content")
        self._life_state = AreaLifeState.retain

    @property
    def life_state(self) -> AreaLifeState:
        """``retain`` until the first render, then ``retired``."""
        return self._life_state

    def observe(self, context: Sequence[NativeContent]) -> None:
        """Ignore the range (a retired notice is never observed)."""
        del context

    def render(self) -> list[Message]:
        """The notice's messages (a new list, oldest first); retires the area.

        Raises:
            StateError: called a second time (a CoopContext never does).
        """
        if self._rendered:
            raise StateError("A OneShotNotice was rendered a second time.")
        self._rendered = True
        self._life_state = AreaLifeState.retired
        return list(self._messages)


class PinnedNotice(_Notice):
    """Renders its messages once and never retires.

    The notice stays in the Context for the CoopContext's lifetime. Its
    EffectRange covers exactly its own items, so it never blocks a range
    that starts after it. It does block collection: the component its items
    belong to is never reclaimable, and because the Collector reclaims only
    a run of components from the tail backward, no component *before* the
    pin can be reclaimed either. A retired area whose range reaches across
    the pin (it started before the pin and rendered again after it) is kept
    forever with its whole tail. Register pinned notices before long-running
    areas, or use a OneShotNotice when the text need not stay.

    Args:
        content: text (one message of ``role``), a message, or messages,
            oldest first.
        role: the role of a text notice. Default ``user``.

    Raises:
        InputError: ``content`` is empty, not text / messages, or holds a
            message with no content (only blank text, which no gateway
            renders); ``role`` is not a Role or is ``tool``.
        InvalidMessageError, InvalidTextError, DuplicateIdError: a message is
            malformed; raised here, never at render time.
    """

    __slots__ = ("_kept",)

    def __init__(self, content: MessageContent, *, role: Role = Role.user) -> None:
        super().__init__(content, role, "PinnedNotice content")
        self._kept = False

    @property
    def life_state(self) -> AreaLifeState:
        """Always ``retain``."""
        return AreaLifeState.retain

    def observe(self, context: Sequence[NativeContent]) -> None:
        """Learn that the rendered items were kept (the area owns an EffectRange)."""
        del context
        self._kept = True

    def render(self) -> list[Message]:
        """The messages (a new list, oldest first) until they are known kept, then ``[]``.

        A CoopContext observes an area before rendering it again exactly when
        the area owns an EffectRange. A render without that observation means
        the previous items are not in the Context (a later failure rolled the
        render back), so the messages are rendered again. The empty renders
        leave the EffectRange where the first kept one put it.
        """
        if self._kept:
            return []
        self._rendered = True
        return list(self._messages)
