"""Continuing prepared prefixes: the prefixes a manager issued, and ``build``.

Synchronous. A prefix that :meth:`ContextManager.prepare` delivered is
registered here with the call-id renaming state after its items; ``build``
continues only registered prefixes (an O(1) identity lookup, no hashing of the
items) and checks each continuation message once, however many model calls
of the turn repeat it; the turn's recorded outputs, looked up in the history
of the prefix's context while it is held, are not checked or rendered again.
What is kept for a prefix goes when the prefix is collected.
"""

from __future__ import annotations

__all__ = ("CheckedContinuation", "IssuedPrefixes", "check_continuation")

import operator
import weakref
from collections.abc import Callable, Container, Mapping, Sequence
from typing import TYPE_CHECKING, Any

import msgspec

from turnloom.context._fresh import fresh_items
from turnloom.context.body import (
    EncodedBody,
    encode_fields,
    kept_body,
    reserved_fields,
    with_fields,
)
from turnloom.context.cache import PromptCache, content_blocks, place_breakpoints
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, step_join
from turnloom.context.history import (
    HistoryLimits,
    TurnHistory,
    check_batch_length,
    reject_instructions,
)
from turnloom.context.items import TAKEN_BUILD, NativeItems
from turnloom.context.message import (
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
    is_blank_part,
)
from turnloom.context.pairing import (
    CallTracker,
    OpenCallPolicy,
    check_steps,
    complete_pairs,
    steps_may_conflict,
)
from turnloom.errors import (
    DuplicateIdError,
    InvalidArgumentError,
    InvalidMessageError,
    excerpt,
    what_type,
)
from turnloom.runtime.schemas import PreparedContext
from turnloom.runtime.state import is_state_message

if TYPE_CHECKING:
    from turnloom.runtime._contexts import ContextState


class _Issued(weakref.ref[PreparedContext]):
    """A delivered prefix, weakly, with what ``build`` keeps for it while it lives.

    Two objects per live prefix (the weak reference itself, and one to the
    context it came from), so a host that holds many prefixes adds two
    tracked objects each to what a full collection visits.
    """

    __slots__ = ("body", "call_ids", "checked", "key", "origin", "settled")

    key: int  # id() of the prefix
    # The context it was prepared from, weakly (a removed context goes): its
    # recorded outputs are that context's, never those of one created again
    # with the same id.
    origin: weakref.ref[ContextState] | None
    call_ids: CallIdRenamer  # the call-id renaming state after the prefix's items
    checked: CheckedContinuation | None  # the continuation last checked for it
    body: EncodedBody | None  # its request body, closed turns kept encoded (None: encode whole)
    settled: _Settled | None  # the settled head of the continuation last built on it


class IssuedPrefixes:
    """Every prefix a manager delivered that is still alive, and what ``build`` keeps for it."""

    __slots__ = (
        "_forget",
        "_gateway",
        "_histories",
        "_issued",
        "_kind",
        "_limits",
        "_open_calls",
        "_place_marks",
        "_reserved",
        "refill",
    )

    def __init__(
        self,
        gateway: Gateway,
        limits: HistoryLimits,
        open_calls: OpenCallPolicy,
        histories: Callable[[str], TurnHistory | None],
        prompt_cache: PromptCache | None = None,
    ) -> None:
        self._gateway = gateway
        # context id -> its history while it is held (else None).
        self._histories = histories
        self._limits = limits
        self._open_calls = open_calls
        # id -> the live prefix with that id, weakly, and what is kept for it.
        self._issued: dict[int, _Issued] = {}
        # Set by the runtime when bound: asks its worker to make a prefix's next
        # host copy ahead (NativeItems.make_copies) after ``build`` took one.
        self.refill: Callable[[NativeItems], None] | None = None
        # One callback for every prefix (not a bound method per prefix).
        self._forget: Callable[[_Issued], None] = self._collected
        self._reserved = reserved_fields(gateway)
        self._kind = gateway.type  # which rewriter renames call ids (read once)
        # Anthropic with PromptCache.breakpoints: request bodies get place_breakpoints' marks.
        self._place_marks = (
            prompt_cache is not None
            and prompt_cache.breakpoints
            and self._kind is GatewayType.anthropic
        )

    def add(
        self,
        prefix: PreparedContext,
        call_ids: CallIdRenamer,
        body: EncodedBody | None = None,
        origin: ContextState | None = None,
    ) -> None:
        """Register a delivered prefix; what is kept for it goes when it is collected.

        ``origin`` is the context it was prepared from; without it, ``build``
        adds no recorded outputs.
        """
        entry = _Issued(prefix, self._forget)
        entry.key = id(prefix)
        entry.origin = weakref.ref(origin) if origin is not None else None
        entry.call_ids = call_ids
        entry.checked = None
        entry.body = body
        entry.settled = None
        self._issued[entry.key] = entry

    def _collected(self, entry: _Issued) -> None:
        # The prefix died: its id may be reused only after this runs.
        if self._issued.get(entry.key) is entry:
            del self._issued[entry.key]

    def _origin(self, entry: _Issued, context_id: str) -> TurnHistory | None:
        """The history of the context ``entry``'s prefix came from, while it is still held
        (not removed, unloaded or released since), else None."""
        history = self._histories(context_id)
        origin = entry.origin() if entry.origin is not None else None
        return history if origin is not None and origin.history is history else None

    def _get(self, key: int) -> PreparedContext | None:
        """The live prefix with ``id()`` ``key`` that this manager delivered, or None."""
        entry = self._issued.get(key)
        return entry() if entry is not None else None

    def check(self, prefix: PreparedContext) -> None:
        """Raise :class:`InvalidMessageError` unless ``prefix`` was delivered by this manager."""
        check_continuation(prefix, (), self._get, self._limits)

    def with_recorded(
        self,
        prefix: PreparedContext,
        continuation: Sequence[Message],
        recorded: object = True,
        method: str = "build",
    ) -> Sequence[Message]:
        """The turn's recorded outputs (the very objects the history holds), then ``continuation``.

        ``continuation`` alone when ``recorded`` is False. No outputs when the
        prefix's turn or context is no longer held. A prefix this manager did
        not deliver is returned with ``continuation`` unchanged, for
        :meth:`build` to refuse.

        Raises:
            InvalidArgumentError: ``recorded`` is not a bool (``method`` names
                the manager's method in the message).
        """
        if recorded is False:
            return continuation
        if recorded is not True:
            raise InvalidArgumentError(
                f"{method}'s recorded must be True or False, not {what_type(recorded)}.",
                field="recorded",
            )
        entry = self._issued.get(id(prefix)) if isinstance(prefix, PreparedContext) else None
        if entry is None or entry() is not prefix:
            return continuation
        history = self._origin(entry, prefix.context_id)
        held = _held_outputs(history, prefix.turn_id) if history is not None else ()
        if not held:
            return continuation
        kind = type(continuation)
        if kind is not list and kind is not tuple:
            if isinstance(continuation, Message) or not isinstance(continuation, Sequence):
                return continuation  # refused by check_continuation
        return held + tuple(continuation) if continuation else held

    def build(
        self, prefix: PreparedContext, continuation: Sequence[Message]
    ) -> tuple[NativeContent, ...]:
        """The prefix's items, then the continuation rendered (see ``ContextManager.build``).

        The continuation messages that are the turn's recorded outputs in the
        held history of the prefix's context (the very objects) were checked
        and rendered at the door, so they are not checked again and their
        cached renders are used.
        """
        added = self._continue(prefix, continuation)  # checks the prefix first
        native = prefix.native_items
        # New containers throughout: the kept prefix and renders are never handed out.
        items = native.take_copy(TAKEN_BUILD)
        if items is None:
            items = native.fresh()  # none made ahead: O(items) here, a C-speed decode
        refill = self.refill
        if refill is not None:
            refill(native)  # the next build's copy, made in the worker
        return items + fresh_items(added) if added else items

    def request_bytes(
        self,
        prefix: PreparedContext,
        continuation: Sequence[Message],
        fields: Mapping[str, Any] | None = None,
    ) -> bytes:
        """The encoded request body of :meth:`build`'s items (see ``ContextManager.request_bytes``).

        Equal to ``msgspec.json.encode({**fields,
        **gateway.request_body(build(...))})``; from the prefix's cached body
        when it has one. ``fields`` are checked before the continuation.
        """
        if self._place_marks:
            # The marks change blocks the cached body holds encoded: encode it whole.
            return _encoder.encode(self.request_body(prefix, continuation, fields))
        members = encode_fields(fields, self._reserved) if fields is not None else b""
        key = prefix.prompt_cache_key
        if key is not None and (fields is None or "prompt_cache_key" not in fields):
            # After the host's fields, as request_body writes it.
            own = encode_fields({"prompt_cache_key": key}, self._reserved)
            members = b",".join((members, own)) if members else own
        added = self._continue(prefix, continuation)
        entry = self._issued.get(id(prefix))
        body = entry.body if entry is not None else None
        if body is None:
            items = (*prefix.native_items._shared(), *added)
            encoded = _encoder.encode(kept_body(self._gateway, items))  # encoded at once: no copy
            return with_fields(encoded, members)
        return body.extend(added).encode(members)

    def request_body(
        self,
        prefix: PreparedContext,
        continuation: Sequence[Message],
        fields: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """The request body of :meth:`build`'s items with ``fields`` and the prompt-cache policy.

        ``{**fields, "prompt_cache_key": ..., **gateway.request_body(items)}``
        (the key only with one, see ``PreparedContext.prompt_cache_key``),
        then, for Anthropic with ``PromptCache.breakpoints``, the marks of
        :func:`~turnloom.context.cache.place_breakpoints`. New containers
        throughout but the values of ``fields``, which are the host's.
        """
        if fields is not None:
            encode_fields(fields, self._reserved)  # checked before anything is built
        items = self.build(prefix, continuation)
        body = {**self._fields(prefix, fields), **kept_body(self._gateway, items)}
        if self._place_marks:
            place_breakpoints(body, _closed_blocks(items, prefix.turn_start))
        return body

    @staticmethod
    def _fields(prefix: PreparedContext, fields: Mapping[str, Any] | None) -> dict[str, Any]:
        """The host's fields, then the context's prompt cache key unless they set one."""
        out = dict(fields) if fields is not None else {}
        if prefix.prompt_cache_key is not None and "prompt_cache_key" not in out:
            out["prompt_cache_key"] = prefix.prompt_cache_key
        return out

    def _continue(
        self, prefix: PreparedContext, continuation: Sequence[Message]
    ) -> list[NativeContent]:
        """Check ``continuation`` against ``prefix``; its items, call ids continued.

        Incremental: the items of the continuation's settled head (see
        :func:`_settled_count`) are kept on the prefix's entry with the
        renaming state after them, so a later call that starts with the same
        message objects completes, renders and renames only the messages
        after that head. The result equals completing, rendering and renaming
        the whole continuation at once.
        """
        gateway = self._gateway
        entry = self._issued.get(id(prefix))
        # Else check_continuation raises.
        kind = type(continuation)
        valid = (
            entry is not None
            and entry() is prefix
            and (
                kind is list
                or kind is tuple
                or (isinstance(continuation, Sequence) and not isinstance(continuation, Message))
            )
        )
        settled = entry.settled if valid and entry is not None else None
        if settled is not None and not _starts_with(continuation, settled.messages):
            settled = None
        start = settled.count if settled is not None else 0
        history = self._origin(entry, prefix.context_id) if valid and entry is not None else None
        renamed: dict[int, list[tuple[str, str]]] = {}
        renders = (
            history.output_renders(prefix.turn_id, gateway, len(continuation) - start, renamed)
            if history is not None
            else {}
        )
        checked = check_continuation(
            prefix,
            continuation,
            self._get,
            self._limits,
            entry.checked if entry is not None else None,
            renders,
        )
        assert entry is not None  # check_continuation raised otherwise
        entry.checked = checked
        items: list[NativeContent] = []
        if settled is not None:
            items.extend(settled.items)
            call_ids = settled.call_ids
        else:
            call_ids = entry.call_ids
        held = checked.held  # the messages checked for the caller's: rendered in their place
        tail = held[start:] if start else held
        plain = _plain_steps(tail)  # then it completes as it stands, settled whole
        cut = len(tail) if plain else _settled_count(tail)
        if cut:
            # The head of the tail is final whatever follows: keep it.
            if settled is None:
                call_ids = call_ids.copy()  # the prefix's own state stays as delivered
            else:
                # The longer head replaces this one, so its state is advanced in
                # place; forgotten first, so a failure leaves no half-advanced head.
                entry.settled = None
            head = tail[:cut] if cut < len(tail) else tail
            items.extend(self._render(head, renders, call_ids, plain, renamed))
            # The message after the cut is part of what made it final.
            end = start + cut + (cut < len(tail))
            seen = checked.messages if end == len(continuation) else tuple(continuation[:end])
            entry.settled = _Settled(seen, start + cut, tuple(items), call_ids)
            tail = tail[cut:]
        if tail:
            items.extend(self._render(tail, renders, call_ids.copy(), False, renamed))
        return items

    def _render(
        self,
        messages: Sequence[Message],
        renders: Mapping[int, Sequence[NativeContent]],
        call_ids: CallIdRenamer,
        plain: bool = False,
        renamed: Mapping[int, list[tuple[str, str]]] | None = None,
    ) -> list[NativeContent]:
        """``messages`` completed as one whole input, rendered, renamed from ``call_ids``.

        ``plain``: the caller found them plain steps (:func:`_plain_steps`),
        which complete as they stand. ``call_ids`` is advanced past the items
        (a caller's copy: on an error it is dropped, whatever it saw).
        ``renamed``: the (own id, sent id) of the calls of held outputs whose
        ``renders`` carry the sent ids: a result after such a call answering
        its own id is rendered with the sent one (until a call reuses the id).
        """
        gateway = self._gateway
        items: list[NativeContent] = []
        completed = (
            messages
            if plain
            else complete_pairs(messages, open_calls=self._open_calls, join=step_join(gateway))
        )
        sent: dict[str, str] = {}  # own id -> the id its held call is sent with
        for message in completed:
            native = renders.get(id(message))
            if native is not None:
                if renamed:
                    pairs = renamed.get(id(message))
                    if pairs is not None:
                        sent.update(pairs)
                items.extend(native)
                continue
            if sent:
                message = _answering_sent(message, sent)
            items.extend(gateway.render(message))
        # One pass over all the items: renaming is sequential, so equal to renaming each message's.
        return rename_call_ids(self._kind, items, call_ids)


def _answering_sent(message: Message, sent: dict[str, str]) -> Message:
    """``message`` with each result answering a held call sent renamed (``sent``: own id
    -> sent id) carrying the sent id; a call of ``message`` reusing such an id ends that
    (later results answer it). ``message`` itself when nothing changes."""
    parts = message.parts
    changed: list[Part] | None = None
    for at, part in enumerate(parts):
        kind = type(part)
        if kind is ToolCallPart:
            sent.pop(part.call_id, None)  # type: ignore[union-attr]
        elif kind is ToolResultPart:
            new_id = sent.get(part.call_id)  # type: ignore[union-attr]
            if new_id is not None:
                if changed is None:
                    changed = list(parts)
                changed[at] = msgspec.structs.replace(part, call_id=new_id)
    if changed is None:
        return message
    return msgspec.structs.replace(message, content=tuple(changed))


def _held_outputs(history: TurnHistory, turn_id: str) -> tuple[Message, ...]:
    """The output messages ``history`` holds for ``turn_id`` (the objects, not copies), or ().

    Reads the history's turns directly (as its ``output_renders`` does): the
    view's ``turn_messages`` hands out copies, which would defeat the
    identity checks that let ``build`` skip checking and rendering them.
    """
    for turn in reversed(history._turns):
        if turn.turn_id == turn_id:
            return tuple(entry.message for entry in turn.outputs)
    return ()


class _Settled:
    """A continuation's settled head for one prefix: its items and the renaming state after them.

    ``messages`` starts the continuations it applies to (identity); its
    first ``count`` messages are the head (one more was needed to settle it
    when ``messages`` is longer).
    """

    __slots__ = ("call_ids", "count", "items", "messages")

    def __init__(
        self,
        messages: tuple[Message, ...],
        count: int,
        items: tuple[NativeContent, ...],
        call_ids: CallIdRenamer,
    ) -> None:
        self.messages = messages
        self.count = count
        self.items = items
        self.call_ids = call_ids


# Bound once: an Enum member looked up on its class goes through the metaclass.
_TOOL, _USER, _ASSISTANT = Role.tool, Role.user, Role.assistant


def _settled_count(messages: Sequence[Message]) -> int:
    """How many of ``messages`` complete the same whatever follows them.

    The largest ``j`` such that ``complete_pairs(messages + later) ==
    complete_pairs(messages[:j]) + complete_pairs((messages + later)[j:])``
    for every ``later`` (same policy, a whole input each, steps joined for
    any gateway): no call is open after ``messages[:j]`` (what follows can
    neither answer nor drop one of them), or ``messages[j]`` is a message
    that closes every open call as the input's end does (an assistant
    message that starts a step, or one that is neither a tool result nor a
    user message carrying results); and ``messages[j - 1]`` is no
    assistant message of reasoning alone (it joins the message after it,
    see :func:`~turnloom.context.join_steps`). 0 when there is none.
    """
    tracker = CallTracker()
    cut = 0
    lone = False  # the message before is reasoning alone
    for j, message in enumerate(messages):
        role = message.role
        if not lone and (
            not tracker.open
            or not (
                role is _TOOL
                or (role is _USER and message.tool_results)
                or tracker.continues(message)
            )
        ):
            cut = j
        lone = _reasoning_alone(message)
        tracker.feed(message)
    return len(messages) if not tracker.open and not lone else cut


def _reasoning_alone(message: Message) -> bool:
    """True for an assistant message whose parts are all reasoning (it may join the next)."""
    return (
        message.role is Role.assistant
        and bool(message.parts)
        and all(type(p) is ReasoningPart or type(p) is OpaquePart for p in message.parts)
    )


def _plain_steps(messages: Sequence[Message]) -> bool:
    """True when ``messages`` pair as they stand: a cheap sufficient test, O(their parts).

    That is when each message is a user message of text, an assistant
    message of text and tool calls (none with extras) after a message of
    another role, with no call of an earlier step still open, or a tool
    message of results each answering a call of the current step still
    open, no text blank, and no call open at the end. Then, for either
    open-call policy and any step join, :func:`complete_pairs` returns the
    messages as they are (nothing to drop, close, clean, sign or join),
    :func:`_settled_count` is ``len(messages)``, and :func:`check_steps` of
    them after messages whose last is no assistant message cannot raise
    (every result answers a call of its own step, no assistant message
    continues a step). False tells nothing.
    """
    open_ids: set[str] = set()
    after_assistant = False
    for message in messages:
        role = message.role
        parts = message.parts
        if not parts:
            return False
        if role is _ASSISTANT:
            if after_assistant or open_ids:
                return False
            for part in parts:
                kind = type(part)
                if kind is ToolCallPart:
                    call_id = part.call_id  # type: ignore[union-attr]
                    if part.extras is not None or call_id in open_ids:  # type: ignore[union-attr]
                        return False
                    open_ids.add(call_id)
                elif kind is not TextPart or is_blank_part(part):
                    return False
            after_assistant = True
            continue
        after_assistant = False
        if role is _TOOL:
            for part in parts:
                if type(part) is not ToolResultPart or part.call_id not in open_ids:
                    return False
                open_ids.discard(part.call_id)
        elif role is _USER and not open_ids:
            for part in parts:
                if type(part) is not TextPart or is_blank_part(part):
                    return False
        else:
            return False
    return not open_ids


_encoder = msgspec.json.Encoder()


class CheckedContinuation:
    """The continuation messages already checked against one prefix.

    ``messages`` (the caller's objects) passed every check of
    :func:`check_continuation`; ``held`` are the messages checked and
    rendered for them, one each (:func:`~turnloom.context.admit_message`:
    the caller's object, or a new one holding the door's private copies);
    ``ids`` holds the prefix's reserved ids and theirs. A later continuation
    that starts with the same message objects needs only its new messages
    checked. The next check extends ``ids`` in place and returns a new object
    sharing it: keep only the latest one.
    """

    __slots__ = ("held", "ids", "messages")

    def __init__(
        self, messages: tuple[Message, ...], ids: set[str], held: tuple[Message, ...]
    ) -> None:
        self.messages = messages
        self.ids = ids
        self.held = held


def check_continuation(
    prefix: PreparedContext,
    continuation: Sequence[Message],
    issued: Callable[[int], PreparedContext | None],
    limits: HistoryLimits,
    checked: CheckedContinuation | None = None,
    held: Container[int] = (),
) -> CheckedContinuation:
    """Validate a prefix and its continuation (see ``ContextManager.build``).

    Args:
        issued: looks up, by ``id()``, a live prefix the manager's prepare
            returned (None for any other id).
        limits: the history's limits; a continuation is one turn's messages.
        checked: what an earlier call returned for the same prefix: when the
            continuation starts with those very message objects, only the
            messages after them are checked (each message is checked once).
        held: ``id()`` of message objects that passed the door's checks (a
            history's recorded outputs): they are not checked again.

    Returns:
        what to pass as ``checked`` to the next call for this prefix; its
        ``held`` are the messages to render (the caller's objects are left
        as they are).

    Raises:
        InvalidMessageError, InvalidTextError: ``prefix`` is not one of
            ``issued``, ``continuation`` is not a sequence of Messages, a
            malformed message, or one carrying a runtime-state call or result.
        InstructionMessageError: a ``system`` or ``developer`` message.
        DuplicateIdError: a message repeats an id of the prefix's turn or of
            an earlier continuation message.
        AmbiguousStepError: a message continues a model step in a shape
            that cannot be paired without guessing (see
            :func:`~turnloom.context.check_steps`).
    """
    if not isinstance(prefix, PreparedContext):
        raise InvalidMessageError(f"build takes a PreparedContext prefix, not {what_type(prefix)}.")
    if issued(id(prefix)) is not prefix:
        raise InvalidMessageError(
            f"The prefix of turn {excerpt(prefix.turn_id)} of context "
            f"{excerpt(prefix.context_id)} was "
            "not prepared by this manager (built by hand, copied or changed, or "
            "prepared by another Foundation); build only continues prefixes that this "
            "manager's prepare returned."
        )
    kind = type(continuation)
    if (
        kind is not list
        and kind is not tuple
        and (isinstance(continuation, Message) or not isinstance(continuation, Sequence))
    ):
        raise InvalidMessageError("build takes a sequence of continuation Messages, oldest first.")
    check_batch_length(len(continuation), limits, "The continuation")
    start = 0
    admitted: list[Message] = []  # the messages to render, one per message of continuation
    if checked is not None and _starts_with(continuation, checked.messages):
        # Those very (frozen) messages passed every check below.
        start = len(checked.messages)
        reserved = checked.ids
        admitted.extend(checked.held)
    else:
        reserved = set(prefix.reserved_ids)
    reject_instructions(continuation, "continuation", "continuation", start)
    added: set[str] = set()  # ids of the new messages, joined to ``reserved`` once all pass
    for i in range(start, len(continuation)):
        message = continuation[i]
        if id(message) not in held:
            message = admit_message(message, where=f"continuation[{i}]")[0]
        admitted.append(message)
        if is_state_message(message, prefix.state_call_id):
            raise InvalidMessageError(
                f"continuation[{i}] carries a runtime-state call or result; the turn's "
                "pair is already in the prefix and is never repeated."
            )
        if message.id is not None:
            if message.id in reserved or message.id in added:
                raise DuplicateIdError(
                    f"continuation[{i}] repeats id {excerpt(message.id)} of the prefix's turn or "
                    "of an earlier continuation message."
                )
            added.add(message.id)
    # The turn's recorded outputs lead (``recorded=True``): the history let
    # them in, results answering a call the prefix closed included (a turn
    # whose input answered some of an earlier turn's calls takes the others'
    # results; they pair from the next turn on). The host's own messages
    # after them must pair within the continuation.
    own = start
    while own < len(continuation) and id(continuation[own]) in held:
        own += 1
    # The checks below read the messages to render (admitted), not the caller's.
    # ``steps_may_conflict`` False, or plain steps after no assistant message:
    # check_steps cannot raise (the record's fast path; see _plain_steps).
    if (
        own > start
        and steps_may_conflict(admitted[start:own], admitted[start - 1] if start else None)
        and not _plain_after(admitted, start, own)
    ):
        check_steps(
            admitted[start:own],
            "continuation",
            before=admitted[:start],
            indices=range(start, own),
            unpaired=True,
        )
    if (
        own < len(admitted)
        and steps_may_conflict(admitted[own:], admitted[own - 1] if own else None)
        and not _plain_after(admitted, own, len(admitted))
    ):
        check_steps(
            admitted[own:],
            "continuation",
            before=admitted[:own],  # check_steps reads back only its last step
            indices=range(own, len(admitted)),
        )
    # ``checked`` is replaced by the result: its set is extended, not copied.
    reserved |= added
    given = tuple(continuation)
    return CheckedContinuation(
        given, reserved, given if all(map(operator.is_, admitted, given)) else tuple(admitted)
    )


def _plain_after(messages: Sequence[Message], start: int, stop: int) -> bool:
    """True when ``messages[start:stop]`` are plain steps (:func:`_plain_steps`) after no
    assistant message: :func:`check_steps` of them after ``messages[:start]`` cannot raise."""
    return (not start or messages[start - 1].role is not _ASSISTANT) and _plain_steps(
        messages[start:stop]
    )


def _starts_with(messages: Sequence[Message], head: tuple[Message, ...]) -> bool:
    """True when ``messages`` starts with the very objects of ``head`` (identity)."""
    if len(messages) < len(head):
        return False
    return all(map(operator.is_, head, messages))


def _closed_blocks(items: Sequence[NativeContent], turn_start: int) -> int:
    """Anthropic message blocks of the closed history: the items before the turn's input.

    The leading run of system items goes to the body's ``system`` field;
    merging adjacent turns and renaming call ids keep every block, in order.
    """
    lead = 0
    while lead < turn_start and items[lead].get("role") == "system":
        lead += 1
    return sum(content_blocks(item) for item in items[lead:turn_start])
