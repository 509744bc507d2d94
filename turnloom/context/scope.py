"""Scopes: which messages of a list a sliced view keeps.

A scope answers either per message, through ``matches(message, index)``
(:class:`ContextScope`), or over a whole list, through ``indices(messages)``
(:class:`PositionalScope`). :class:`LastNTurns` needs the whole list: whether
a message is among the last turns depends on where the list ends, so its
``matches`` refuses with :class:`~turnloom.errors.PositionalScopeError`
rather than guess.

The combinators :class:`AllOf`, :class:`AnyOf` and :class:`Not` compose in
index-set algebra -- intersection, union and complement of what their parts
select over the same list -- so a positional part keeps its window inside
them: ``AllOf(RoleFilter("user"), LastNTurns(2))`` is the user messages of
the last two turns, never "the last two turns of the user messages".
:func:`scope_indices` is that one selection rule; ``WorkingContext.slice``
uses it.
"""

from __future__ import annotations

__all__ = (
    "AllOf",
    "AnyOf",
    "ContextScope",
    "LastNTurns",
    "Not",
    "PositionalScope",
    "RoleFilter",
    "Since",
    "Tagged",
    "scope_indices",
)

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from turnloom.context.message import Message, Role
from turnloom.errors import InvalidArgumentError, PositionalScopeError, excerpt, what_type

_PINNED = (Role.system, Role.developer)


@runtime_checkable
class ContextScope(Protocol):
    """A predicate over messages: True keeps the message in the sliced view."""

    def matches(self, message: Message, index: int) -> bool:
        """Whether ``message``, at ``index`` of the ORIGINAL list, is kept.

        Raises:
            PositionalScopeError: the scope cannot answer for one message
                alone (see :class:`PositionalScope`).
        """
        ...


@runtime_checkable
class PositionalScope(ContextScope, Protocol):
    """A scope that selects over a whole list at once.

    Scopes whose answer depends on the end of the list (:class:`LastNTurns`)
    implement this, and so do the combinators, which build their selection
    from their parts'.
    """

    def indices(self, messages: Sequence[Message]) -> frozenset[int]:
        """The indices of ``messages`` the scope keeps."""
        ...


def check_scope(scope: object, field: str = "scope") -> ContextScope:
    """Return ``scope`` when it has a callable ``matches``.

    Raises:
        InvalidArgumentError: it does not (``field`` names it).
    """
    if not callable(getattr(scope, "matches", None)):
        raise InvalidArgumentError(
            f"{field} must be a scope with a matches(message, index) method, "
            f"not {what_type(scope)}.",
            field=field,
        )
    return scope  # type: ignore[return-value]


def scope_indices(scope: ContextScope, messages: Sequence[Message]) -> frozenset[int]:
    """The indices of ``messages`` that ``scope`` keeps.

    A :class:`PositionalScope` selects over the whole list; any other scope
    is asked ``matches(message, index)`` for each message.

    Raises:
        PositionalScopeError: a user scope without ``indices`` delegates to a
            positional scope's ``matches``.
    """
    indices = getattr(scope, "indices", None)
    if callable(indices):
        return frozenset(indices(messages))
    return frozenset(i for i, m in enumerate(messages) if scope.matches(m, i))


@dataclass(frozen=True, init=False)
class RoleFilter:
    """Keeps messages whose role is one of ``roles``.

    Raises:
        InvalidArgumentError: a role that is not a :class:`Role` value.
    """

    roles: frozenset[Role]

    def __init__(self, *roles: Role | str) -> None:
        normalized: set[Role] = set()
        for i, role in enumerate(roles):
            try:
                normalized.add(Role(role))
            except ValueError:
                raise InvalidArgumentError(
                    f"RoleFilter role {excerpt(role)} is not a role.", field=f"roles[{i}]"
                ) from None
        object.__setattr__(self, "roles", frozenset(normalized))

    def matches(self, message: Message, index: int) -> bool:
        """True when the message's role is one of ``roles``."""
        return message.role in self.roles


@dataclass(frozen=True)
class Tagged:
    """Keeps messages whose ``name`` (their participant) equals ``tag``.

    Raises:
        InvalidArgumentError: ``tag`` is not a non-empty string.
    """

    tag: str

    def __post_init__(self) -> None:
        if not isinstance(self.tag, str) or not self.tag:
            raise InvalidArgumentError("Tagged tag must be a non-empty string.", field="tag")

    def matches(self, message: Message, index: int) -> bool:
        """True when ``message.name == tag``."""
        return message.name == self.tag


@dataclass(frozen=True)
class Since:
    """Keeps messages at index ``checkpoint_index`` or later.

    The checkpoint is an absolute index the caller already holds, so
    ``matches`` answers exactly and the scope is not positional.

    Raises:
        InvalidArgumentError: ``checkpoint_index`` is not an int >= 0.
    """

    checkpoint_index: int

    def __post_init__(self) -> None:
        _require_count(self.checkpoint_index, "checkpoint_index", minimum=0)

    def matches(self, message: Message, index: int) -> bool:
        """True when ``index >= checkpoint_index``."""
        return index >= self.checkpoint_index


@dataclass(frozen=True)
class LastNTurns:
    """Keeps the last ``n`` turns, and every system and developer message.

    A turn starts at a user message that carries no tool result and holds
    everything up to the next such message (the assistant's replies, its tool
    calls and their results), so a kept turn never splits a tool call from
    its result. Messages before the first user message belong to the first
    turn. With ``n`` or fewer turns everything is kept; with ``n <= 0`` only
    the pinned system and developer messages are.

    Raises:
        InvalidArgumentError: ``n`` is not an int.
    """

    n: int

    def __post_init__(self) -> None:
        _require_count(self.n, "n", minimum=None)

    def matches(self, message: Message, index: int) -> bool:
        """Refuses: membership depends on where the list ends.

        Raises:
            PositionalScopeError: always.
        """
        raise PositionalScopeError(
            f"LastNTurns({self.n}) cannot decide message {index} alone; "
            "use indices(messages) or WorkingContext.slice()."
        )

    def indices(self, messages: Sequence[Message]) -> frozenset[int]:
        """The pinned messages, plus every message from the n-th last turn's start."""
        pinned = {i for i, m in enumerate(messages) if m.role in _PINNED}
        if self.n <= 0:
            return frozenset(pinned)
        # Walk back from the end to the n-th last turn start: the cost follows
        # the kept turns, not the whole list.
        cut, found = 0, 0
        for i in range(len(messages) - 1, -1, -1):
            message = messages[i]
            if message.role is Role.user and not message.tool_results:
                found += 1
                if found == self.n:
                    cut = i
                    break
        return frozenset(pinned.union(range(cut, len(messages))))


def _require_count(value: object, field: str, *, minimum: int | None) -> None:
    if type(value) is not int or (minimum is not None and value < minimum):
        bound = f" >= {minimum}" if minimum is not None else ""
        raise InvalidArgumentError(
            f"{field} must be an int{bound}, not {excerpt(value)}.", field=field
        )


def _check_parts(scopes: tuple[object, ...]) -> tuple[ContextScope, ...]:
    return tuple(check_scope(s, f"scopes[{i}]") for i, s in enumerate(scopes))


@dataclass(frozen=True, init=False)
class AllOf:
    """Keeps the messages every part keeps (intersection; all messages when empty).

    Raises:
        InvalidArgumentError: a part is not a scope.
    """

    scopes: tuple[ContextScope, ...]

    def __init__(self, *scopes: ContextScope) -> None:
        object.__setattr__(self, "scopes", _check_parts(scopes))

    def matches(self, message: Message, index: int) -> bool:
        """True when every part matches.

        Raises:
            PositionalScopeError: a part is positional.
        """
        return all(s.matches(message, index) for s in self.scopes)

    def indices(self, messages: Sequence[Message]) -> frozenset[int]:
        """The intersection of the parts' selections over ``messages``."""
        kept = frozenset(range(len(messages)))
        for scope in self.scopes:
            kept &= scope_indices(scope, messages)
        return kept


@dataclass(frozen=True, init=False)
class AnyOf:
    """Keeps the messages any part keeps (union; none when empty).

    Raises:
        InvalidArgumentError: a part is not a scope.
    """

    scopes: tuple[ContextScope, ...]

    def __init__(self, *scopes: ContextScope) -> None:
        object.__setattr__(self, "scopes", _check_parts(scopes))

    def matches(self, message: Message, index: int) -> bool:
        """True when some part matches.

        Raises:
            PositionalScopeError: a part is positional.
        """
        return any(s.matches(message, index) for s in self.scopes)

    def indices(self, messages: Sequence[Message]) -> frozenset[int]:
        """The union of the parts' selections over ``messages``."""
        kept: frozenset[int] = frozenset()
        for scope in self.scopes:
            kept |= scope_indices(scope, messages)
        return kept


@dataclass(frozen=True)
class Not:
    """Keeps the messages ``scope`` drops (complement over the same list).

    Raises:
        InvalidArgumentError: ``scope`` is not a scope.
    """

    scope: ContextScope

    def __post_init__(self) -> None:
        check_scope(self.scope, "scope")

    def matches(self, message: Message, index: int) -> bool:
        """True when ``scope`` does not match.

        Raises:
            PositionalScopeError: ``scope`` is positional.
        """
        return not self.scope.matches(message, index)

    def indices(self, messages: Sequence[Message]) -> frozenset[int]:
        """Every index of ``messages`` that ``scope`` does not select."""
        return frozenset(range(len(messages))) - scope_indices(self.scope, messages)
