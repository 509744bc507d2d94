"""WorkingContext: an agent's in-flight reasoning state, on four axes.

* ``prefix`` -- :class:`PrefixContext`, the cache-stable head (system prompt,
  grounding messages, structured-output schema block). Frozen: changing it
  would invalidate every provider's prompt cache from that token on.
* ``messages`` -- the per-turn transcript tail, a list of checked messages.
* ``scratchpad`` -- cross-step notes, a dict with string keys; last write wins.
* ``journal`` -- a :class:`~turnloom.context.MutationJournal` of authored
  history with a commit watermark.

The axes never bleed into each other: message mutators touch only the tail,
notes only the scratchpad. The pure operations -- :meth:`~WorkingContext.fork`,
:meth:`~WorkingContext.merge`, :meth:`~WorkingContext.slice`,
:meth:`~WorkingContext.diff`, :meth:`~WorkingContext.freeze`,
:meth:`~WorkingContext.tokens` -- are synchronous and may run in a worker
thread. Compaction, retrieval and model calls are not here.

How each seam treats scratchpad values: ``fork()`` returns an independent live
copy and deep-copies them; ``merge()`` hands them over by reference (the
receiver owns them, last write wins); ``slice()`` returns a live view with a
fresh top-level dict and the same values; ``freeze()`` is the one result
nobody may write to, so it deep-freezes them (:func:`deep_freeze`).
"""

from __future__ import annotations

__all__ = (
    "ContextDiff",
    "FrozenContext",
    "FrozenDict",
    "PrefixContext",
    "WorkingContext",
    "deep_freeze",
)

import copy
import enum
import inspect
from collections.abc import Awaitable, Callable, Hashable, Iterable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, NoReturn, Self, TypeVar, overload

import msgspec

from turnloom.context.journal import MutationJournal
from turnloom.context.message import (
    ImagePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
)
from turnloom.context.scope import ContextScope, check_scope, scope_indices
from turnloom.context.tokens import ApproxTokenCounter, TokenCounter, count_tokens
from turnloom.errors import FrozenValueError, InvalidArgumentError, excerpt, what_type

T = TypeVar("T")


# -- message value keys ------------------------------------------------------


def _part_key(part: Part) -> Hashable:
    kind = type(part)
    if kind is TextPart:
        return ("text", part.text)  # type: ignore[union-attr]
    if kind is ToolCallPart:
        call: ToolCallPart = part  # type: ignore[assignment]
        return ("tool_call", call.call_id, call.name, call.arguments)
    if kind is ToolResultPart:
        result: ToolResultPart = part  # type: ignore[assignment]
        inner = tuple(_part_key(p) for p in result.content)
        return ("tool_result", result.call_id, result.is_error, result.name, inner)
    if kind is ImagePart:
        image: ImagePart = part  # type: ignore[assignment]
        return ("image", image.url, image.data, image.media_type, image.detail)
    if kind is ReasoningPart:
        reasoning: ReasoningPart = part  # type: ignore[assignment]
        return ("reasoning", reasoning.text, reasoning.signature, reasoning.encrypted_content)
    assert kind is OpaquePart
    return ("opaque", part.gateway)  # type: ignore[union-attr]


def _message_key(message: Message) -> Hashable:
    """A hashable key of the message's value, never raising.

    It reads a subset of the fields that ``Message.__eq__`` compares (it
    leaves out the ``extras``/``layout`` dicts, which make a Message
    unhashable), so equal messages have equal keys: a key picks a bucket and
    ``==`` decides. Union merge, diff and the hashes of prefixes and frozen
    contexts all use it. Two tool calls with one call id but different
    arguments have different keys and are different values.
    """
    return (message.role, message.id, message.name, tuple(_part_key(p) for p in message.parts))


class _MessagePool:
    """A multiset of messages by value (bucketed by :func:`_message_key`)."""

    __slots__ = ("_buckets",)

    def __init__(self, messages: Iterable[Message] = ()) -> None:
        self._buckets: dict[Hashable, list[Message]] = {}
        for message in messages:
            self.add(message)

    def add(self, message: Message) -> None:
        self._buckets.setdefault(_message_key(message), []).append(message)

    def __contains__(self, message: Message) -> bool:
        return any(m == message for m in self._buckets.get(_message_key(message), ()))

    def take(self, message: Message) -> bool:
        """Remove one message equal to ``message``; False when there is none."""
        bucket = self._buckets.get(_message_key(message))
        if bucket:
            for i, candidate in enumerate(bucket):
                if candidate == message:
                    del bucket[i]
                    return True
        return False


# -- deep freezing -----------------------------------------------------------


class FrozenDict(dict[str, Any]):
    """A dict that refuses writes; hashable when its values are.

    It is a ``dict`` for every reader (``isinstance``, ``json``, ``==``), pickles
    and deep-copies as itself, and raises
    :class:`~turnloom.errors.FrozenValueError` from every method that would
    change it.
    """

    __slots__ = ()

    def _refuse(self, *args: object, **kwargs: object) -> NoReturn:
        raise FrozenValueError("This mapping is a frozen snapshot value; build a new one instead.")

    __setitem__ = _refuse
    __delitem__ = _refuse
    __ior__ = _refuse
    clear = _refuse
    pop = _refuse
    popitem = _refuse
    setdefault = _refuse
    update = _refuse

    def __hash__(self) -> int:  # type: ignore[override]
        return hash(frozenset(self.items()))

    def __reduce__(self) -> tuple[type[FrozenDict], tuple[dict[str, Any]]]:
        return (FrozenDict, (dict(self),))

    def __copy__(self) -> FrozenDict:
        return self

    def __deepcopy__(self, memo: dict[int, Any]) -> FrozenDict:
        return FrozenDict({k: copy.deepcopy(v, memo) for k, v in self.items()})

    def __repr__(self) -> str:
        return f"FrozenDict({dict.__repr__(self)})"


_ATOMS = (str, bytes, int, float, complex, bool, type(None), enum.Enum, range, frozenset)


def deep_freeze(value: object) -> Any:
    """An immutable, un-aliased copy of a scratchpad value.

    Rules: ``dict`` (any mapping) becomes :class:`FrozenDict`, ``list`` and
    ``tuple`` become ``tuple``, ``set`` becomes ``frozenset``, ``bytearray``
    becomes ``bytes`` -- recursively. Strings, numbers, ``None``, enums,
    frozensets and frozen msgspec Structs (messages) are immutable already
    and kept. Any other object is deep-copied: un-aliased from the live
    value, but only as immutable as its own class makes it.

    Raises:
        InvalidArgumentError: the value holds a reference cycle.
    """
    return _freeze(value, set())


def _freeze(value: object, path: set[int]) -> object:
    if isinstance(value, _ATOMS):
        return value
    if isinstance(value, msgspec.Struct) and type(value).__struct_config__.frozen:
        return value
    if isinstance(value, FrozenDict):
        return value
    ident = id(value)
    if ident in path:
        raise InvalidArgumentError(
            "A scratchpad value holds a reference cycle; it cannot be frozen.",
            field="scratchpad",
        )
    path.add(ident)
    try:
        if isinstance(value, Mapping):
            return FrozenDict({k: _freeze(v, path) for k, v in value.items()})
        if isinstance(value, list | tuple):
            items = tuple(_freeze(v, path) for v in value)
            make = getattr(type(value), "_make", None)  # a namedtuple keeps its type
            return make(items) if isinstance(value, tuple) and make is not None else items
        if isinstance(value, set):
            return frozenset(_freeze(v, path) for v in value)
        if isinstance(value, bytearray):
            return bytes(value)
        return copy.deepcopy(value)
    finally:
        path.discard(ident)


# -- value checks at the door ------------------------------------------------


def _checked_messages(messages: object, field: str) -> list[Message]:
    if isinstance(messages, str | bytes) or not isinstance(messages, Iterable):
        raise InvalidArgumentError(
            f"{field} must be an iterable of Message, not {what_type(messages)}.",
            field=field,
        )
    return [admit_message(message, where=f"{field}[{i}]")[0] for i, message in enumerate(messages)]


def _check_key(key: object, field: str = "key") -> str:
    if not isinstance(key, str) or not key:
        raise InvalidArgumentError(
            f"A scratchpad key must be a non-empty string, not {excerpt(key)}.", field=field
        )
    return key


def _checked_scratchpad(scratchpad: object, field: str = "scratchpad") -> dict[str, Any]:
    if not isinstance(scratchpad, Mapping):
        raise InvalidArgumentError(
            f"{field} must be a mapping with string keys, not {what_type(scratchpad)}.",
            field=field,
        )
    for key in scratchpad:
        _check_key(key, f"{field}[{excerpt(key)}]")
    return dict(scratchpad)


# -- the prefix --------------------------------------------------------------


@dataclass(frozen=True)
class PrefixContext:
    """The cache-stable head: system prompt, grounding messages, schema block.

    Frozen and structurally equal: two prefixes built from the same values
    are equal and hash equal (a recall-cache key).

    Attributes:
        system_prompt: the pinned system prompt; ``""`` for none.
        grounding: grounding messages, in order (a list given is stored as a
            tuple).
        schema_block: the structured-output instructions, rendered as a
            system message after the grounding; ``None`` for none.

    Raises:
        InvalidArgumentError: a field has the wrong type.
        InvalidMessageError: a grounding message is malformed (and the other
            errors of :func:`~turnloom.context.check_message`).
    """

    system_prompt: str = ""
    grounding: tuple[Message, ...] = ()
    schema_block: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.system_prompt, str):
            raise InvalidArgumentError("system_prompt must be a string.", field="system_prompt")
        if self.schema_block is not None and not isinstance(self.schema_block, str):
            raise InvalidArgumentError(
                "schema_block must be a string or None.", field="schema_block"
            )
        object.__setattr__(self, "grounding", tuple(_checked_messages(self.grounding, "grounding")))

    def __hash__(self) -> int:
        return hash(
            (self.system_prompt, tuple(_message_key(m) for m in self.grounding), self.schema_block)
        )

    def as_messages(self) -> list[Message]:
        """The prefix as messages: system prompt, grounding in order, schema block.

        The system prompt and the schema block are system messages, each left
        out when empty. Returns a new list on every call.
        """
        out: list[Message] = []
        if self.system_prompt:
            out.append(Message(role=Role.system, content=self.system_prompt))
        out.extend(self.grounding)
        if self.schema_block:
            out.append(Message(role=Role.system, content=self.schema_block))
        return out


_EMPTY_PREFIX = PrefixContext()
_DEFAULT_COUNTER = ApproxTokenCounter()


# -- snapshots and diffs -----------------------------------------------------


@dataclass(frozen=True)
class ContextDiff:
    """What changed between two WorkingContexts: ``self`` minus ``other``.

    Attributes:
        messages_added: messages of ``self`` not in ``other`` (by value,
            counting repeats), in ``self``'s order.
        messages_removed: messages of ``other`` not in ``self``, in
            ``other``'s order.
        scratchpad_changes: each key whose value differs, with its value in
            ``self``; a key only ``other`` has maps to ``None``. Frozen: a
            :class:`FrozenDict` of deep-frozen values, so the whole diff is
            immutable, hashable and picklable.
        prefix_changed: the prefixes compare unequal.
    """

    messages_added: tuple[Message, ...]
    messages_removed: tuple[Message, ...]
    scratchpad_changes: dict[str, Any]
    prefix_changed: bool

    def __post_init__(self) -> None:
        changes = _checked_scratchpad(self.scratchpad_changes, "scratchpad_changes")
        object.__setattr__(self, "scratchpad_changes", deep_freeze(changes))
        object.__setattr__(self, "messages_added", tuple(self.messages_added))
        object.__setattr__(self, "messages_removed", tuple(self.messages_removed))

    def __hash__(self) -> int:
        return hash(
            (
                tuple(_message_key(m) for m in self.messages_added),
                tuple(_message_key(m) for m in self.messages_removed),
                frozenset(self.scratchpad_changes),
                self.prefix_changed,
            )
        )


@dataclass(frozen=True)
class FrozenContext:
    """An immutable snapshot of a WorkingContext, safe to share without locking.

    Attributes:
        prefix: the (frozen) prefix.
        messages: the tail, a tuple.
        scratchpad: ``(key, value)`` pairs sorted by key, each value
            deep-frozen and un-aliased from the live scratchpad
            (:func:`deep_freeze`); a mapping given is converted.
        journal_entries: the journal's entries, a tuple. The entries
            themselves are passed through by identity, not copied or frozen:
            they are the authored record whose identity attribution relies
            on, and copying every entry of a long journal on every snapshot
            would make ``freeze()`` cost O(journal) in copies.

    Equality is structural over all four fields. The hash covers the identity
    subset that is always hashable -- the prefix, the messages' values and
    the scratchpad keys -- so snapshots holding arbitrary (even unhashable)
    scratchpad values or journal entries can still key a cache; equal
    snapshots hash equal.

    Rehydrate with ``WorkingContext(prefix=f.prefix, messages=list(f.messages),
    scratchpad=dict(f.scratchpad))``: a live context whose top-level
    scratchpad is writable and whose nested values stay frozen.

    Raises:
        InvalidArgumentError: a field has the wrong type, a scratchpad key is
            not a non-empty string or repeats, or a value holds a cycle.
        InvalidMessageError: a message is malformed.
    """

    prefix: PrefixContext
    messages: tuple[Message, ...]
    scratchpad: tuple[tuple[str, object], ...]
    journal_entries: tuple[Any, ...] = field(default=())

    def __post_init__(self) -> None:
        if not isinstance(self.prefix, PrefixContext):
            raise InvalidArgumentError("prefix must be a PrefixContext.", field="prefix")
        messages = tuple(_checked_messages(self.messages, "messages"))
        raw = self.scratchpad
        if isinstance(raw, Mapping):
            pairs = list(raw.items())
        elif isinstance(raw, Iterable) and not isinstance(raw, str | bytes):
            pairs = list(raw)
        else:
            raise InvalidArgumentError(
                "scratchpad must be a mapping or (key, value) pairs.", field="scratchpad"
            )
        for i, pair in enumerate(pairs):
            if not isinstance(pair, tuple) or len(pair) != 2:
                raise InvalidArgumentError(
                    f"scratchpad[{i}] must be a (key, value) pair.", field=f"scratchpad[{i}]"
                )
        scratchpad = _checked_scratchpad(dict(pairs))
        if len(scratchpad) != len(pairs):
            raise InvalidArgumentError("scratchpad repeats a key.", field="scratchpad")
        entries = self.journal_entries
        if isinstance(entries, str | bytes) or not isinstance(entries, Iterable):
            raise InvalidArgumentError(
                "journal_entries must be an iterable of entries.", field="journal_entries"
            )
        _init_frozen(self, self.prefix, messages, scratchpad, tuple(entries))

    def __hash__(self) -> int:
        return hash(
            (
                self.prefix,
                tuple(_message_key(m) for m in self.messages),
                tuple(k for k, _ in self.scratchpad),
            )
        )


def _init_frozen(
    target: FrozenContext,
    prefix: PrefixContext,
    messages: tuple[Message, ...],
    scratchpad: Mapping[str, Any],
    journal_entries: tuple[Any, ...],
) -> None:
    pairs = tuple((k, deep_freeze(scratchpad[k])) for k in sorted(scratchpad))
    object.__setattr__(target, "prefix", prefix)
    object.__setattr__(target, "messages", messages)
    object.__setattr__(target, "scratchpad", pairs)
    object.__setattr__(target, "journal_entries", journal_entries)


# -- the working context -----------------------------------------------------

_MERGE_MODES = ("concat", "union")


class WorkingContext:
    """An agent's working memory: prefix, messages, scratchpad and journal.

    Args:
        prefix: the cache-stable head; ``PrefixContext()`` when none is set.
        messages: the transcript tail, oldest first; copied into a new list.
        scratchpad: cross-step notes; copied into a new dict.
        journal: authored history; a new empty journal by default.
        token_counter: counts :meth:`tokens`; :class:`ApproxTokenCounter`
            by default.
        limit: a token ceiling that :meth:`headroom` measures against;
            ``None`` for none. The caller's policy decides what to do at it.
        shared: True when several coroutines use the context as a
            blackboard. The single-step mutators are atomic either way (no
            await inside); sequences with awaits between writes go under
            :attr:`lock` or through :meth:`apply_locked`. Nothing locks
            automatically.

    Raises:
        InvalidArgumentError: a field has the wrong type or value (a limit
            below 0, a scratchpad key that is not a non-empty string, a
            counter without ``count``).
        InvalidMessageError: a message is malformed (and the other errors of
            :func:`~turnloom.context.check_message`).

    Mutators check their input completely before changing anything and
    return the context, so calls chain. Assigning to the attributes directly
    skips those checks.
    """

    __slots__ = (
        "_lock",
        "journal",
        "limit",
        "messages",
        "prefix",
        "scratchpad",
        "shared",
        "token_counter",
    )

    prefix: PrefixContext
    messages: list[Message]
    scratchpad: dict[str, Any]
    journal: MutationJournal[Any]
    token_counter: TokenCounter
    limit: int | None
    shared: bool

    def __init__(
        self,
        prefix: PrefixContext = _EMPTY_PREFIX,
        messages: Iterable[Message] = (),
        scratchpad: Mapping[str, Any] | None = None,
        journal: MutationJournal[Any] | None = None,
        token_counter: TokenCounter = _DEFAULT_COUNTER,
        limit: int | None = None,
        shared: bool = False,
    ) -> None:
        if not isinstance(prefix, PrefixContext):
            raise InvalidArgumentError("prefix must be a PrefixContext.", field="prefix")
        checked = _checked_messages(messages, "messages")
        pad = _checked_scratchpad({} if scratchpad is None else scratchpad)
        if journal is not None and not isinstance(journal, MutationJournal):
            raise InvalidArgumentError("journal must be a MutationJournal.", field="journal")
        if not callable(getattr(token_counter, "count", None)):
            raise InvalidArgumentError(
                "token_counter must have a count(messages) method.", field="token_counter"
            )
        if limit is not None and (type(limit) is not int or limit < 0):
            raise InvalidArgumentError(
                f"limit must be None or an int >= 0, not {excerpt(limit)}.", field="limit"
            )
        if type(shared) is not bool:
            raise InvalidArgumentError("shared must be a bool.", field="shared")
        self._init(
            prefix,
            checked,
            pad,
            MutationJournal() if journal is None else journal,
            token_counter,
            limit,
            shared,
        )

    def _init(
        self,
        prefix: PrefixContext,
        messages: list[Message],
        scratchpad: dict[str, Any],
        journal: MutationJournal[Any],
        token_counter: TokenCounter,
        limit: int | None,
        shared: bool,
    ) -> None:
        self.prefix = prefix
        self.messages = messages
        self.scratchpad = scratchpad
        self.journal = journal
        self.token_counter = token_counter
        self.limit = limit
        self.shared = shared
        self._lock: AbstractAsyncContextManager[None] | None = None

    @classmethod
    def _from_checked(
        cls, prefix: PrefixContext, messages: list[Message], token_counter: TokenCounter
    ) -> WorkingContext:
        """A context over messages checked already (a history's): no second door.

        For the runtime's bridge, which hands a retained history over; every
        message of a history was checked when it entered.
        """
        context = object.__new__(cls)
        context._init(prefix, messages, {}, MutationJournal(), token_counter, None, False)
        return context

    def _derived(
        self,
        messages: list[Message],
        scratchpad: dict[str, Any],
        journal: MutationJournal[Any],
    ) -> WorkingContext:
        # Built from values this context already checked: no second door.
        clone = object.__new__(WorkingContext)
        clone._init(
            self.prefix, messages, scratchpad, journal, self.token_counter, self.limit, self.shared
        )
        return clone

    def __repr__(self) -> str:
        return (
            f"WorkingContext(messages={len(self.messages)}, scratchpad={len(self.scratchpad)}, "
            f"journal={len(self.journal)}, limit={self.limit}, shared={self.shared})"
        )

    # -- mutators --------------------------------------------------------

    def append(self, message: Message) -> Self:
        """Append one message to the tail.

        Raises:
            InvalidMessageError: the message is malformed (nothing appended).
        """
        self.messages.append(admit_message(message, where="message")[0])
        return self

    def extend(self, messages: Iterable[Message]) -> Self:
        """Append messages to the tail, in order; all or none.

        Raises:
            InvalidArgumentError: ``messages`` is not an iterable.
            InvalidMessageError: a message is malformed (nothing appended).
        """
        self.messages.extend(_checked_messages(messages, "messages"))
        return self

    def note(self, key: str, value: Any) -> Self:
        """Set one scratchpad note (last write wins).

        Raises:
            InvalidArgumentError: ``key`` is not a non-empty string.
        """
        self.scratchpad[_check_key(key)] = value
        return self

    def update_scratchpad(self, notes: Mapping[str, Any]) -> Self:
        """Set several notes at once; all or none.

        Raises:
            InvalidArgumentError: ``notes`` is not a mapping, or a key is not
                a non-empty string (nothing set).
        """
        self.scratchpad.update(_checked_scratchpad(notes, "notes"))
        return self

    def get(self, key: str, default: Any = None) -> Any:
        """The note stored under ``key``, or ``default``."""
        return self.scratchpad.get(key, default)

    def record(self, entry: Any) -> Self:
        """Record one entry in the journal (uncommitted until marked)."""
        self.journal.record(entry)
        return self

    def set_prefix(self, prefix: PrefixContext) -> Self:
        """Replace the prefix (which invalidates provider prompt caches from its start).

        Raises:
            InvalidArgumentError: ``prefix`` is not a PrefixContext.
        """
        if not isinstance(prefix, PrefixContext):
            raise InvalidArgumentError("prefix must be a PrefixContext.", field="prefix")
        self.prefix = prefix
        return self

    # -- locking ---------------------------------------------------------

    @property
    def lock(self) -> AbstractAsyncContextManager[None]:
        """The context's ``anyio.Lock``, for multi-step atomicity across awaits.

        Take it (``async with ctx.lock:``) when two or more mutations with an
        await between them must look atomic to other coroutines, or for a
        read-modify-write across an await. Single-step mutators need no lock.
        Created at first use and bound to the event loop (asyncio or trio)
        that first awaits it; a fork gets a new one.
        """
        if self._lock is None:
            # Imported here so that the pure layer never loads anyio (see
            # turnloom._locking for why the lock lives there).
            from turnloom._locking import new_lock

            self._lock = new_lock()
        return self._lock

    @overload
    async def apply_locked(self, fn: Callable[[Self], Awaitable[T]]) -> T: ...
    @overload
    async def apply_locked(self, fn: Callable[[Self], T]) -> T: ...

    async def apply_locked(self, fn: Callable[[Self], Any]) -> Any:
        """Run ``fn(self)`` while holding :attr:`lock`; await its result if awaitable.

        Serialises ``fn`` against every other holder of the lock.

        Returns:
            What ``fn`` returned (awaited when it was awaitable).

        Raises:
            Whatever ``fn`` raises; the lock is released.

        Cancellation:
            Cancelled while waiting for the lock, ``fn`` has not run and the
            context is unchanged. Cancelled inside an awaiting ``fn``, the
            lock is released and the mutations ``fn`` made before its await
            stay: make each step of ``fn`` leave the context consistent.
        """
        async with self.lock:
            result = fn(self)
            if inspect.isawaitable(result):
                return await result
            return result

    # -- composition -----------------------------------------------------

    def fork(self) -> WorkingContext:
        """An independent copy: own tail, deep-copied scratchpad, new journal.

        The prefix is shared (it is frozen). The new journal is seeded with
        this journal's entries, which count as committed there. The counter,
        limit and shared flag are inherited; the lock is new.
        """
        return self._derived(
            list(self.messages),
            copy.deepcopy(self.scratchpad),
            MutationJournal(self.journal.view()),
        )

    def merge(self, other: WorkingContext, *, mode: Literal["concat", "union"] = "concat") -> Self:
        """Fold ``other``'s tail, notes and journal into this context.

        ``"concat"`` appends ``other``'s messages as they are. ``"union"``
        appends only those not already present by value (``==``), so a
        parent merging two siblings' tails holds each observation once; two
        tool-call messages with one call id but different arguments are
        different values and both stay. Either way the scratchpad takes
        ``other``'s notes (last write wins, values by reference) and the
        journal applies ``other``'s entries in order, unchanged.

        Raises:
            InvalidArgumentError: ``other`` is not a WorkingContext or
                ``mode`` is unknown (nothing changed).
        """
        if not isinstance(other, WorkingContext):
            raise InvalidArgumentError("other must be a WorkingContext.", field="other")
        if mode not in _MERGE_MODES:
            raise InvalidArgumentError(
                f"mode must be 'concat' or 'union', not {excerpt(mode)}.", field="mode"
            )
        incoming = list(other.messages)
        if mode == "union":
            seen = _MessagePool(self.messages)
            kept: list[Message] = []
            for message in incoming:
                if message not in seen:
                    seen.add(message)
                    kept.append(message)
            incoming = kept
        notes = dict(other.scratchpad)
        entries = other.journal.view()
        self.messages.extend(incoming)
        self.scratchpad.update(notes)
        self.journal.apply(entries)
        return self

    def slice(self, scope: ContextScope) -> WorkingContext:
        """A new context holding the messages ``scope`` keeps, in order.

        Selection follows :func:`~turnloom.context.scope_indices` over this
        context's tail (indices are positions in it). The prefix is shared,
        the scratchpad is a new dict holding the same values, and the journal
        is a copy with the same entries and watermark.

        Raises:
            InvalidArgumentError: ``scope`` is not a scope.
        """
        check_scope(scope)
        keep = scope_indices(scope, self.messages)
        messages = [m for i, m in enumerate(self.messages) if i in keep]
        return self._derived(messages, dict(self.scratchpad), self.journal.copy())

    def diff(self, other: WorkingContext) -> ContextDiff:
        """What ``self`` has that ``other`` has not, and the reverse.

        Messages compare by value and repeats count (``self`` holding a
        message twice and ``other`` once adds one). The journal is left out:
        it has its own watermark diff.

        Raises:
            InvalidArgumentError: ``other`` is not a WorkingContext.
        """
        if not isinstance(other, WorkingContext):
            raise InvalidArgumentError("other must be a WorkingContext.", field="other")
        theirs = _MessagePool(other.messages)
        added = tuple(m for m in self.messages if not theirs.take(m))
        mine = _MessagePool(self.messages)
        removed = tuple(m for m in other.messages if not mine.take(m))
        changes: dict[str, Any] = {
            k: v
            for k, v in self.scratchpad.items()
            if k not in other.scratchpad or other.scratchpad[k] != v
        }
        changes.update((k, None) for k in other.scratchpad if k not in self.scratchpad)
        return ContextDiff(
            messages_added=added,
            messages_removed=removed,
            scratchpad_changes=changes,
            prefix_changed=self.prefix != other.prefix,
        )

    def freeze(self) -> FrozenContext:
        """An immutable snapshot (:class:`FrozenContext`); equality is structural.

        Raises:
            InvalidArgumentError: a scratchpad value holds a reference cycle.
        """
        snapshot = object.__new__(FrozenContext)
        _init_frozen(
            snapshot, self.prefix, tuple(self.messages), self.scratchpad, self.journal.view()
        )
        return snapshot

    # -- measures --------------------------------------------------------

    def assembled(self) -> list[Message]:
        """The prefix's messages then the tail: a new list on every call."""
        out = self.prefix.as_messages()
        out.extend(self.messages)
        return out

    def size(self) -> int:
        """How many messages :meth:`assembled` returns (prefix and tail)."""
        return len(self.prefix.as_messages()) + len(self.messages)

    def tokens(self) -> int:
        """The tokens of :meth:`assembled`, by the configured counter.

        Raises:
            HostCallbackError: the counter raised or returned a count that is
                not an int in ``[0, MAX_TOKEN_COUNT]``
                (:func:`~turnloom.context.tokens.count_tokens`).
        """
        # Synchronous (the seed's is awaitable): counters here are local and
        # pure, and this layer must run in a worker thread without a loop.
        return count_tokens(self.token_counter, self.assembled())

    def headroom(self) -> int | None:
        """``limit`` minus :meth:`tokens` (negative when over); ``None`` without a limit.

        Raises:
            HostCallbackError: as :meth:`tokens`.
        """
        if self.limit is None:
            return None
        return self.limit - self.tokens()
