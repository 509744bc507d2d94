"""The one error hierarchy of turnloom.

Every error turnloom raises on purpose derives from :class:`TurnloomError`.
The subclasses are grouped by how a caller reacts:

* :class:`InputError` -- the caller handed over something invalid. Nothing was
  changed; fix the input and try again.
* :class:`CapacityError` -- a bound was reached (pending preparations, an item
  over the per-item byte cap). Back off, or wait instead of using ``*_nowait``.
* :class:`ProviderRuleError` -- an input would break a provider's documented
  structural rule. It carries every :class:`Violation`.
* :class:`StateError` -- the call does not fit the current state of an object
  (unknown context or turn, a turn evicted, an invocation already in flight;
  :class:`StrandedResultsError`: a late record would strand a later turn's
  results).
* :class:`AreaCallbackError` -- a caller-supplied Context Area raised; the
  CoopContext and its Context were left as they were before the call.
* :class:`HostCallbackError` -- a callback the host supplied (a token
  counter, a clock) raised or returned a value turnloom cannot use; nothing
  was changed. Fix the callback.
* :class:`MemoryStoreError` -- a memory source failed (a missing database,
  SQLite failing, malformed results); the store was not changed. Retry, or
  serve the turn without memory.
* :class:`MissingDependencyError` -- an optional feature needs a package that
  is not installed; install the named extra.
* :class:`LeaseError` (a :class:`StateError`) -- a context is owned by another
  host, or this host's ownership ended; claim it again (which restores it from
  the store) or leave it to its owner.
* :class:`StoreError` -- the durable context store failed: unreachable within
  its time bound (:class:`StoreUnavailableError`, try again later; nothing
  acknowledged was lost), reachable but refusing writes for now
  (:class:`StoreRefusedError`, a kind of :class:`StoreUnavailableError`: out
  of memory, a read-only replica), a stored record is damaged or cannot be
  decoded (:class:`StoreRecordError`, the context cannot be restored), or a
  key of one context holds what turnloom did not write
  (:class:`StoreKeyError`; an operator must repair or delete it).

* :class:`FoundationClosedError` -- the Foundation is closing or closed; stop
  producing. It is also an :class:`anyio.ClosedResourceError`, so it is defined
  in :mod:`turnloom.runtime.errors` and this module hands it out on first use:
  ``from turnloom.errors import FoundationClosedError`` works, while
  ``import turnloom.errors`` (which ``turnloom.context`` does) still never
  imports an event-loop library.
"""

from __future__ import annotations

__all__ = (
    "EXCERPT_LIMIT",
    "TYPE_NAME_LIMIT",
    "AmbiguousStepError",
    "AreaCallbackError",
    "CapacityError",
    "ConfigError",
    "ContextRemovedError",
    "DuplicateAreaError",
    "DuplicateIdError",
    "FoundationClosedError",
    "FrozenValueError",
    "HostCallbackError",
    "InputError",
    "InstructionMessageError",
    "InvalidAreaError",
    "InvalidArgumentError",
    "InvalidMessageError",
    "InvalidTextError",
    "ItemTooLargeError",
    "LeaseError",
    "LeaseHeldError",
    "MemoryQueryError",
    "MemoryStoreError",
    "MissingDependencyError",
    "NotClaimedError",
    "OpenToolCallError",
    "OutOfOrderTurnError",
    "PairedTurnsTooLargeError",
    "PlayedTextMismatchError",
    "PositionalScopeError",
    "ProviderRuleError",
    "QueueFullError",
    "StaleLeaseError",
    "StateError",
    "StoreError",
    "StoreKeyError",
    "StoreRecordError",
    "StoreRefusedError",
    "StoreUnavailableError",
    "StrandedResultsError",
    "SummaryError",
    "TurnTooLargeError",
    "TurnloomError",
    "UnknownAreaError",
    "UnknownContextError",
    "UnknownPluginError",
    "UnknownStrategyError",
    "UnknownTurnError",
    "UnpairedResultError",
    "Violation",
    "excerpt",
    "type_name",
    "what_type",
)

import reprlib
from collections.abc import Sequence
from typing import TYPE_CHECKING

import msgspec

from turnloom._root_error import TurnloomError

if TYPE_CHECKING:
    from turnloom.runtime.errors import FoundationClosedError


def __getattr__(name: str) -> object:
    """``FoundationClosedError``, imported from :mod:`turnloom.runtime.errors` on first use.

    Raises:
        AttributeError: ``name`` is not a lazily provided error.
    """
    if name == "FoundationClosedError":
        from turnloom.runtime.errors import FoundationClosedError

        return FoundationClosedError
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class Violation(msgspec.Struct, frozen=True, kw_only=True):
    """One breach of a provider's structural rule (carried by :class:`ProviderRuleError`).

    Attributes:
        index: position of the offending item in the checked sequence.
        rule: a short stable name of the rule (``"tool_result_without_call"``).
        message: a full sentence naming the offending id or field.
    """

    index: int
    rule: str
    message: str


EXCERPT_LIMIT = 80
"""The most characters of a value an error message quotes (see :func:`excerpt`)."""

_repr = reprlib.Repr()
_repr.maxstring = 60
_repr.maxother = 60
_repr.maxlong = 40
_repr.maxlevel = 2
_repr.maxdict = _repr.maxlist = _repr.maxtuple = _repr.maxset = _repr.maxfrozenset = 4


def excerpt(value: object) -> str:
    """A short, escaped excerpt of ``value`` for an error message.

    Every turnloom error that quotes a value the caller handed over quotes it
    through this function, so a huge value (a 1 MiB id) gives a short message
    and control characters (a newline that would forge a log line, a lone
    surrogate, a bidi override) appear escaped, as in ``repr``.

    Returns:
        at most :data:`EXCERPT_LIMIT` characters: the value's ``repr``, with the
        middle of long strings, the tail of long containers and nested levels
        elided (``...``). Costs O(:data:`EXCERPT_LIMIT`), not O(len(value)),
        for strings, bytes and containers.
    """
    if type(value) is str and len(value) <= _repr.maxstring:
        # The common case, a short id: reprlib would return this very repr.
        text = repr(value)
        if len(text) <= _repr.maxstring:
            return text
    if isinstance(value, bytes | bytearray | memoryview):
        text = repr(bytes(value[: _repr.maxstring]))
        if len(value) > _repr.maxstring:
            text += "..."
    else:
        try:
            text = _repr.repr(value)
        except Exception:  # a foreign __repr__ that fails, an int too long to print
            text = f"<{type(value).__name__}...>"
    if len(text) > EXCERPT_LIMIT:
        text = text[: EXCERPT_LIMIT - 3] + "..."
    return text


TYPE_NAME_LIMIT = 40
"""The longest type name an error message prints as it is (see :func:`type_name`)."""


def type_name(value: object) -> str:
    """The name of ``value``'s type as an error message prints it.

    A plain identifier of at most :data:`TYPE_NAME_LIMIT` characters (``int``,
    ``list_iterator``, a host's ``MyCounter``) is printed as it is. Any other
    name -- a class the host built with ``type()`` under a long name or one
    holding a newline -- is quoted through :func:`excerpt`, so it can neither
    flood nor forge a log line.
    """
    name = type(value).__name__
    if len(name) <= TYPE_NAME_LIMIT and name.isidentifier():
        return name
    return excerpt(name)


def what_type(value: object) -> str:
    """What ``value`` is, for an error message that refuses it: ``"an object of type int"``.

    Every turnloom message that names the type of a value it refuses says it
    with this phrase (``"store must be a ContextStore, not an object of type
    int."``): it reads correctly whatever the type's name (no "a int"), and
    the name is printed by :func:`type_name`.
    """
    return f"an object of type {type_name(value)}"


def not_a_message(where: str, value: object) -> str:
    """The message refusing ``value`` where a turnloom ``Message`` belongs.

    ``"<where> is an object of type int, not a turnloom Message."``; for a
    mapping (a provider-native item such as ``{"role": "user", ...}``) it adds
    how to get a Message: build one, or convert the item with the gateway's
    ``parse``.
    """
    text = f"{where} is {what_type(value)}, not a turnloom Message."
    if isinstance(value, dict):
        text += (
            " Build one with Message(role=Role.user, content=...), or convert a"
            " provider-native item with manager.gateway.parse(item)."
        )
    return text


class InputError(TurnloomError, ValueError):
    """Bad input, rejected at the door before any state changed."""


class InvalidMessageError(InputError):
    """A message or part is malformed: unknown role, empty id, wrong field type.

    Attributes:
        field: dotted path of the offending field (``"content[2].call_id"``),
            or ``""`` when the whole value is at fault.
    """

    def __init__(self, message: str, *, field: str = "") -> None:
        super().__init__(message)
        self.field = field


class AmbiguousStepError(InvalidMessageError):
    """A model step split over several messages in a shape that cannot be paired without guessing.

    A step is what the model emitted in one response, however the host split
    it into messages (see :class:`~turnloom.context.CallTracker`). Refused:
    an assistant message repeating a call id of the step it continues (which
    call would a result with that id answer?), a turn starting with an
    assistant message that would continue the step the turn before it ends
    with (a step belongs to one turn), and a result answering a call whose
    step a later model message ended (a call recorded after a result of its
    step starts another step, leaving the earlier calls unanswered; a result
    whose group a ``user`` message ended is an :class:`UnpairedResultError`).

    Attributes:
        field: the offending message (``"Turn 't1' output[3]"``).
        call_id: its call at fault (``""`` for a message without calls).
        reason: ``"duplicate_call_id"``, ``"across_turns"`` or ``"closed_call"``.
    """

    def __init__(self, message: str, *, field: str, call_id: str, reason: str) -> None:
        super().__init__(message, field=field)
        self.call_id = call_id
        self.reason = reason


class UnpairedResultError(InvalidMessageError):
    """A tool result that answers no call open where it would be stored.

    Pairing (:class:`~turnloom.context.CallTracker`) would leave such a
    result out of every model input, since no provider accepts a result
    without its call. Its call was never recorded, was answered already (a
    result recorded twice without a message id), was closed by a later
    message (a ``user`` message ends a call group), or belongs to an evicted
    turn. Raised only where no call recorded later can answer it (see
    ``TurnHistory.commit`` and ``record``; ``ContextManager.build`` and
    ``request_*`` for a continuation; ``manager.areas.route``). Nothing was
    stored.

    Attributes:
        field: the offending message (``"Turn 't1' output[2]"``, ``"Turn 't1'
            input[0]"``, ``"continuation[0]"``, ``"item"``).
        call_id: the result's call id.
    """

    def __init__(self, message: str, *, field: str, call_id: str) -> None:
        super().__init__(message, field=field)
        self.call_id = call_id


class PlayedTextMismatchError(InvalidMessageError):
    """The played text of an interrupted output does not match the output's text.

    Raised by ``record_interrupted(..., played_text=...)`` when fewer than
    half of the played words match words of the output's text by the rule of
    :func:`~turnloom.context.played_count` (the host passed the transcript of
    another reply, or of something else entirely); nothing was recorded.

    Attributes:
        field: ``"played_text"``.
        words: how many words the played text has.
        matched: how many of them matched.
    """

    def __init__(self, message: str, *, words: int, matched: int) -> None:
        super().__init__(message, field="played_text")
        self.words = words
        self.matched = matched


class InvalidTextError(InvalidMessageError):
    """Text that cannot be sent: invalid UTF-8 or a lone surrogate."""


class InstructionMessageError(InvalidMessageError):
    """A ``system`` or ``developer`` message where only conversation may go.

    Pinned instructions change only through a committed turn's
    ``instructions``; a model output, a tool result or a continuation can never
    carry one (it would land mid-history).

    Attributes:
        field: the offending message (``"outputs[2]"``, ``"continuation[0]"``).
        role: its role, ``"system"`` or ``"developer"``.
    """

    def __init__(self, message: str, *, field: str, role: str) -> None:
        super().__init__(message, field=field)
        self.role = role


class ConfigError(InputError):
    """A configuration file or mapping that cannot configure the runtime.

    Raised before anything is built: the file cannot be read or parsed, a key
    is unknown or missing, or a value has the wrong type or range.

    Attributes:
        key: dotted path of the offending key (``"context.init_config.history_max_turns"``),
            or ``""`` when the whole document is at fault.
    """

    def __init__(self, message: str, *, key: str) -> None:
        super().__init__(message)
        self.key = key


class UnknownPluginError(ConfigError, LookupError):
    """A configuration names a context plugin that is neither built in nor registered.

    Attributes:
        plugin: the name asked for.
        known: the names that would have resolved, sorted.
    """

    def __init__(self, message: str, *, key: str, plugin: str, known: Sequence[str]) -> None:
        super().__init__(message, key=key)
        self.plugin = plugin
        self.known = tuple(known)


class DuplicateIdError(InputError):
    """An id that must be unique was used twice (call id, turn id, item id)."""


class OutOfOrderTurnError(InputError):
    """A turn arrived after a turn that should have followed it (its sequence is not newer)."""


class UnknownContextError(InputError, LookupError):
    """A context id that the manager does not know."""


class UnknownTurnError(InputError, LookupError):
    """A turn id that the context does not know, or no longer holds."""


class CapacityError(TurnloomError):
    """A configured bound was reached."""


class ItemTooLargeError(CapacityError, InputError):
    """One item is larger than the per-item byte cap.

    Attributes:
        size: serialized size of the item, in bytes.
        limit: the cap, in bytes.
    """

    def __init__(self, message: str, *, size: int, limit: int) -> None:
        super().__init__(message)
        self.size = size
        self.limit = limit


class TurnTooLargeError(CapacityError, InputError):
    """A batch of messages (a turn's input, a record, a continuation) is over a limit.

    Checked on the whole batch before any message of it is checked, so a
    batch far over the limit is refused in O(1) for items and in
    O(limit) for bytes.

    Attributes:
        unit: ``"items"`` or ``"bytes"``.
        size: the batch's size in that unit (for bytes: at least this much; the
            count stops at the first message over the limit).
        limit: the limit, in that unit.
    """

    def __init__(self, message: str, *, unit: str, size: int, limit: int) -> None:
        super().__init__(message)
        self.unit = unit
        self.size = size
        self.limit = limit


class PairedTurnsTooLargeError(TurnTooLargeError):
    """The turns that eviction keeps together would be over a history limit.

    A turn whose input answers tool calls of the turn before it (an approval
    flow: the model asks, a person approves, the results arrive as the next
    turn's input) is evicted only with that turn, so the newest turn and the
    turns its input answers must fit the history's limits together. Raised
    when committing such a turn (any limit) or recording to one (items,
    bytes) would not fit; nothing was changed.

    Attributes:
        unit: ``"turns"``, ``"items"``, ``"bytes"`` or ``"tokens"``.
        size: the size of the turns kept together, in that unit.
        limit: the history's limit, in that unit.
        turn_id: the turn committed, or recorded to.
        first_turn_id: the oldest of the turns kept together with
            ``turn_id`` (for a commit, the turn holding the calls the input
            answers, or an earlier turn those calls' turn is tied to).
    """

    def __init__(
        self,
        message: str,
        *,
        unit: str,
        size: int,
        limit: int,
        turn_id: str,
        first_turn_id: str,
    ) -> None:
        super().__init__(message, unit=unit, size=size, limit=limit)
        self.turn_id = turn_id
        self.first_turn_id = first_turn_id


class QueueFullError(CapacityError):
    """Every preparation slot is taken; ``prepare_nowait`` refuses instead of waiting.

    Attributes:
        capacity: the bound on pending preparations.
    """

    def __init__(self, message: str, *, capacity: int) -> None:
        super().__init__(message)
        self.capacity = capacity


class StateError(TurnloomError):
    """The call does not fit the current state of the object it was made on."""


class StrandedResultsError(StateError):
    """A late record to an earlier turn would strand results a later turn holds.

    An approval flow gives the results of a turn's tool calls as a later
    turn's input. An output recorded to the earlier turn afterwards lands
    before those results: an assistant message or another result for the same
    call ends the call group they answered (or answers the call first), and
    pairing would then drop them from every later model input. Such a record
    is refused before anything changes; it is a :class:`StateError` because it
    contradicts what the model was already shown, not because the output is
    malformed.

    Attributes:
        turn_id: the earlier turn the outputs were recorded to.
        stranded_turn_id: the first later turn holding a result that would
            answer no call.
        call_ids: the call ids of that turn's results that would answer no
            call, in the order the turn holds them.
    """

    def __init__(
        self, message: str, *, turn_id: str, stranded_turn_id: str, call_ids: Sequence[str]
    ) -> None:
        super().__init__(message)
        self.turn_id = turn_id
        self.stranded_turn_id = stranded_turn_id
        self.call_ids = tuple(call_ids)


class ProviderRuleError(TurnloomError):
    """An input breaks a provider's documented structural rules.

    Attributes:
        violations: every violation found, in input order.
    """

    def __init__(self, message: str, violations: Sequence[Violation] = ()) -> None:
        super().__init__(message)
        self.violations = tuple(violations)


class InvalidAreaError(InputError, TypeError):
    """An object handed over as a Context Area does not satisfy the area protocol.

    Raised by ``CoopContext.register()`` before anything is registered.

    Attributes:
        missing: names of the protocol members the object lacks or has in a
            wrong form (``("promote", "gc_prologue")``); empty when the object
            is unhashable.
    """

    def __init__(self, message: str, *, missing: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.missing = tuple(missing)


class DuplicateAreaError(DuplicateIdError):
    """The same Context Area instance was registered twice with one CoopContext."""


class AreaCallbackError(TurnloomError):
    """A Context Area raised (or returned a wrong value) from one of its callbacks.

    The CoopContext and its Context are exactly as they were before the
    ``render()`` call; the original exception is the ``__cause__``.

    Attributes:
        area: the area whose callback failed.
        phase: which member failed: ``"life_state"``, ``"flow_state"``,
            ``"observe"``, ``"render"``, ``"promote"`` or ``"gc_prologue"``;
            ``"register"`` when an area attached to a ContextManager no
            longer passes registration at its first area pass (it is dropped).
    """

    def __init__(self, message: str, *, area: object, phase: str) -> None:
        super().__init__(message)
        self.area = area
        self.phase = phase


class HostCallbackError(TurnloomError):
    """A callback the host supplied raised, or returned a value turnloom cannot use.

    The callbacks are a token counter's ``count`` (it must return an int in
    ``[0, MAX_TOKEN_COUNT]``, see :func:`turnloom.context.tokens.count_tokens`)
    and the Foundation's ``clock``. Raised where the callback's answer is
    taken, before anything changed: the commit, record or preparation that
    asked left every state as it was. An exception the callback raised is the
    ``__cause__`` (a :class:`TurnloomError` it raised passes unchanged).

    Attributes:
        callback: which callback failed: ``"token_counter"`` or ``"clock"``.
    """

    def __init__(self, message: str, *, callback: str) -> None:
        super().__init__(message)
        self.callback = callback


class SummaryError(HostCallbackError):
    """The host's summarizer gave no summary turnloom can use (summary compaction).

    Never raised to a caller: the runtime hands it to the host's hook
    (``manager.summaries.on_error``) and counts it. The history is left as it
    was: the turns the summarizer was given stay, and eviction goes on as
    without a summarizer. An exception the summarizer raised is the
    ``__cause__``.

    Attributes:
        callback: ``"summarizer"``.
        context_id: the context whose turns were being summarized.
        reason: ``"raised"`` (the summarizer raised), ``"timeout"`` (it ran
            past the policy's ``timeout``), ``"cancelled"`` (the summarization
            was cancelled: the context removed, ``manager.summaries.cancel``,
            the Foundation closing) or ``"invalid"`` (it returned something
            that is not a summary: see
            :func:`turnloom.context.summaries.check_summary`, a sequence that
            raises when read included; or a summary over the history's limits
            or holding an id a held message has) or ``"stale"`` (the
            summarized turns changed while it ran: an output recorded late to
            one of them).
    """

    def __init__(self, message: str, *, context_id: str, reason: str) -> None:
        super().__init__(message, callback="summarizer")
        self.context_id = context_id
        self.reason = reason


class OpenToolCallError(StateError):
    """The Context ends with a tool call whose result has not been appended yet.

    Nothing may be placed between a call and its result (every provider
    rejects it), so areas cannot render until the result is pushed.

    Attributes:
        call_ids: the ids of the open calls, in call order.
    """

    def __init__(self, message: str, *, call_ids: Sequence[str]) -> None:
        super().__init__(message)
        self.call_ids = tuple(call_ids)


class UnknownAreaError(InputError, LookupError):
    """An area that is not registered with the CoopContext it was looked up in."""


class ContextRemovedError(StateError):
    """The context a preparation waited for was removed (``remove_context``) or lost.

    Lost: with a store, another host took the context's lease, so it left
    this manager.

    A context created again with the same id is a new conversation: it never
    serves a request made for the removed one.

    Attributes:
        context_id: the removed context.
        turn_id: the turn the preparation waited for.
    """

    def __init__(self, message: str, *, context_id: str, turn_id: str) -> None:
        super().__init__(message)
        self.context_id = context_id
        self.turn_id = turn_id


class InvalidArgumentError(InputError):
    """An argument of a value-layer call has the wrong type or value.

    Raised by the WorkingContext family (contexts, prefixes, journals, scopes,
    token counters) before anything changed.

    Attributes:
        field: the name of the offending argument or field (``"limit"``,
            ``"scratchpad['']"``, ``"scopes[1]"``).
    """

    def __init__(self, message: str, *, field: str) -> None:
        super().__init__(message)
        self.field = field


class PositionalScopeError(InputError, TypeError):
    """A positional scope was asked about one message alone.

    A positional scope (``LastNTurns``, or a combinator holding one) measures
    from the end of the list, so ``matches(message, index)`` cannot answer;
    select with ``indices(messages)`` or ``WorkingContext.slice`` instead.
    """


class FrozenValueError(StateError, TypeError):
    """A write into a frozen snapshot value (a scratchpad mapping of a FrozenContext)."""


class MissingDependencyError(TurnloomError, ImportError):
    """An optional feature needs a package that is not installed.

    Attributes:
        package: the distribution that is missing (``"bpe-openai"``).
        extra: the turnloom extra that installs it (``"tokens"``).
    """

    def __init__(self, message: str, *, package: str, extra: str) -> None:
        super().__init__(message)
        self.package = package
        self.extra = extra


class LeaseError(StateError):
    """A context's ownership does not allow the call (durable stores only).

    Attributes:
        context_id: the context.
    """

    def __init__(self, message: str, *, context_id: str) -> None:
        super().__init__(message)
        self.context_id = context_id


class LeaseHeldError(LeaseError):
    """Another owner holds the context's lease and it has not expired."""


class StaleLeaseError(LeaseError):
    """This owner's lease of the context is no longer current.

    The store refused a write carrying an old fencing token (the lease expired
    and another owner acquired it), or a renewal found the lease gone. What
    this owner wrote before is kept; what it had not yet written was refused.
    """


class NotClaimedError(LeaseError):
    """A manager with a durable store was asked to change a context it has not claimed."""


class StoreError(TurnloomError):
    """The durable context store failed."""


class StoreUnavailableError(StoreError):
    """The store could not be reached, or did not answer, within its time bound.

    Nothing acknowledged was lost; writes not yet acknowledged stay queued and
    are retried by the next flush.
    """


class StoreRefusedError(StoreUnavailableError):
    """The store answered but refuses the call for now; retrying later can succeed.

    Examples: a Redis server at ``maxmemory`` with ``noeviction`` (``OOM``), a
    server demoted to a read-only replica by a failover (``READONLY``), a
    server still loading its data (``LOADING``), a script cache emptied
    under the call (``NOSCRIPT``). As for every
    :class:`StoreUnavailableError`, nothing acknowledged was lost and
    unacknowledged writes stay queued.

    Attributes:
        reason: the store's own error code (``"OOM"``, ``"READONLY"``).
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class StoreKeyError(StoreError):
    """A key the store keeps for one context holds a value turnloom did not write.

    A lease without its owner, a fencing counter that is not an integer, a
    log of the wrong type (Redis ``WRONGTYPE``): the context cannot be
    claimed or written until an operator deletes or repairs the key. Other
    contexts are not affected.

    Attributes:
        context_id: the context.
        key: the store's name of the damaged key.
    """

    def __init__(self, message: str, *, context_id: str, key: str) -> None:
        super().__init__(message)
        self.context_id = context_id
        self.key = key


class StoreRecordError(StoreError):
    """A stored record of a context is damaged, missing or cannot be decoded.

    Damaged: its checksum does not match its bytes, or it does not sit at the
    position it was written at (a record missing before it); cannot be
    decoded: corrupt, or written by a newer schema.

    Attributes:
        context_id: the context whose record failed.
        index: the record's position in the context's log (0 is the oldest).
    """

    def __init__(self, message: str, *, context_id: str, index: int) -> None:
        super().__init__(message)
        self.context_id = context_id
        self.index = index


class UnknownStrategyError(InputError, LookupError):
    """An assembly strategy name that no strategy is registered under.

    Attributes:
        name: the name asked for (cut to 64 characters).
        known: the registered names, sorted.
    """

    def __init__(self, message: str, *, name: str, known: Sequence[str]) -> None:
        super().__init__(message)
        self.name = name
        self.known = tuple(known)


class MemoryQueryError(InputError):
    """A memory query the store cannot run (for example malformed FTS5 syntax).

    Attributes:
        query: the query (cut to 64 characters).
    """

    def __init__(self, message: str, *, query: str) -> None:
        super().__init__(message)
        self.query = query


class MemoryStoreError(TurnloomError):
    """A memory source failed: a missing or unreadable database, or malformed results.

    Nothing was changed in the store by the failing call. The cause, when a
    foreign error, is the ``__cause__``.
    """
