"""The door checks of the Foundation and its ContextManager: pure and synchronous.

Each function validates one call's input completely and raises a typed error
from :mod:`turnloom.errors` before any state changes; none touches a context.
"""

from __future__ import annotations

__all__ = (
    "DurableOptions",
    "FoundationOptions",
    "ManagerOptions",
    "check_durable_options",
    "check_foundation_options",
    "check_manager_options",
    "check_outputs",
    "check_renderable",
    "check_request",
    "check_routed_item",
    "check_snapshot",
    "reject_state",
)

import math
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import msgspec

from turnloom.context.cache import PromptCache
from turnloom.context.gateway import Gateway, NativeContent, get_gateway
from turnloom.context.history import (
    HistoryLimits,
    TurnHistory,
    check_id,
    reject_instructions,
)
from turnloom.context.memory import MemorySource, check_tenant_scope
from turnloom.context.message import (
    _PINNED_ROLES,
    Message,
    admit_message,
    is_blank_part,
)
from turnloom.context.pairing import (
    OpenCallPolicy,
    complete_pairs,
    holds_results,
    is_pairing_part,
)
from turnloom.context.scope import check_scope
from turnloom.context.tokens import ApproxTokenCounter, TokenCounter
from turnloom.errors import (
    InputError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    TurnloomError,
    excerpt,
    what_type,
)
from turnloom.runtime._options import ManagerSettings
from turnloom.runtime._strategies import make_strategy
from turnloom.runtime.assembly import AssemblyStrategy, StrategyOptions
from turnloom.runtime.schemas import ContextPrepareRequest, TurnSnapshot
from turnloom.runtime.state import (
    STATE_TOOL_NAME,
    EarlierStatePolicy,
    check_contributions,
    check_perception,
    is_state_message,
)
from turnloom.runtime.store import ContextStore

_encoder = msgspec.json.Encoder()


class DurableOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The checked store options of a ContextManager (see :class:`~turnloom.runtime.Foundation`).

    Attributes:
        store: the :class:`~turnloom.runtime.store.ContextStore`.
        owner: this manager's name in leases.
        lease_ttl: seconds a lease lasts unless renewed.
        idle_after: seconds of disuse after which a context leaves memory.
        history_limits: the history limits (a restore rebuilds with them).
        token_counter: the token counter (a restore counts with it).
    """

    store: Any
    owner: str
    lease_ttl: float
    idle_after: float
    history_limits: HistoryLimits
    token_counter: Any


class ManagerOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The checked options of a ContextManager (see :class:`~turnloom.runtime.Foundation`)."""

    gateway: Gateway
    max_pending_preparations: int
    history_limits: HistoryLimits
    behavior_rules: str | None
    open_calls: OpenCallPolicy
    tenant_limit: int
    token_counter: TokenCounter
    durable: DurableOptions | None = None
    strategy: AssemblyStrategy | None = None
    earlier_state: EarlierStatePolicy = "keep"
    prompt_cache: PromptCache | None = None


class FoundationOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The checked options of a Foundation: its manager's, the threads, the grace period."""

    manager: ManagerOptions
    worker_threads: int
    close_grace_period: float


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_manager_options(settings: ManagerSettings) -> ManagerOptions:
    """Validate every option of a ContextManager once; return them checked and frozen.

    Raises:
        InputError: ``max_pending_preparations`` or ``max_tenant_preparations``
            is not a positive integer, ``history_limits`` is not a
            :class:`HistoryLimits`, an unknown gateway, ``open_calls`` or
            ``earlier_state`` policy, behaviour rules that are not valid text or alone exceed
            the per-item cap (``ItemTooLargeError``), a ``strategy``
            that is neither a name nor an AssemblyStrategy, ``memory`` or
            ``strategy_options`` without a named strategy, or bad strategy
            options, a ``prompt_cache`` that is not a
            :class:`~turnloom.context.cache.PromptCache` or whose salt is not
            bytes of at most 64; and the store options' errors (see
            :func:`check_durable_options`).
        UnknownStrategyError: ``strategy`` names no registered strategy.
        InvalidArgumentError: ``token_counter`` has no ``count`` method.
    """
    gateway, token_counter = settings.gateway, settings.token_counter
    max_pending_preparations = settings.max_pending_preparations
    history_limits, open_calls = settings.history_limits, settings.open_calls
    earlier_state, prompt_cache = settings.earlier_state, settings.prompt_cache
    max_tenant_preparations = settings.max_tenant_preparations
    if token_counter is None:
        token_counter = ApproxTokenCounter()
    elif not callable(getattr(token_counter, "count", None)):
        raise InvalidArgumentError(
            "token_counter must have a count(messages) method; "
            f"{what_type(token_counter)} has none.",
            field="token_counter",
        )
    if history_limits is not None and not isinstance(history_limits, HistoryLimits):
        raise InputError(
            f"history_limits must be a HistoryLimits, not {what_type(history_limits)}."
        )
    if not _positive_int(max_pending_preparations):
        raise InputError(
            "max_pending_preparations must be a positive integer, not "
            f"{excerpt(max_pending_preparations)}."
        )
    if open_calls not in ("exclude", "cancel"):
        raise InputError(f"open_calls must be 'exclude' or 'cancel', not {excerpt(open_calls)}.")
    if earlier_state not in ("keep", "drop"):
        raise InputError(f"earlier_state must be 'keep' or 'drop', not {excerpt(earlier_state)}.")
    if prompt_cache is not None and (
        not isinstance(prompt_cache, PromptCache)
        or not isinstance(prompt_cache.key_salt, bytes)
        or len(prompt_cache.key_salt) > 64
    ):
        raise InputError(
            "prompt_cache must be a PromptCache whose key_salt is bytes of at most 64, not "
            f"{excerpt(prompt_cache)}."
        )
    limits = history_limits if history_limits is not None else HistoryLimits()
    check_behavior_rules(settings.behavior_rules, limits.max_item_bytes)
    if max_tenant_preparations is None:
        tenant_limit = (max_pending_preparations + 1) // 2
    elif _positive_int(max_tenant_preparations):
        tenant_limit = min(max_tenant_preparations, max_pending_preparations)
    else:
        raise InputError(
            "max_tenant_preparations must be a positive integer or None, not "
            f"{excerpt(max_tenant_preparations)}."
        )
    checked_gateway = gateway if isinstance(gateway, Gateway) else get_gateway(gateway)
    checked_strategy = _strategy(
        settings.strategy,
        checked_gateway,
        settings.memory,
        settings.strategy_options,
        token_counter,
    )
    return ManagerOptions(
        gateway=checked_gateway,
        max_pending_preparations=max_pending_preparations,
        history_limits=limits,
        behavior_rules=settings.behavior_rules,
        open_calls="cancel" if open_calls == "cancel" else "exclude",
        earlier_state="drop" if earlier_state == "drop" else "keep",
        prompt_cache=prompt_cache,
        strategy=checked_strategy,
        tenant_limit=tenant_limit,
        token_counter=token_counter,
        durable=check_durable_options(
            store=settings.store,
            lease_ttl=settings.lease_ttl,
            idle_after=settings.idle_after,
            owner=settings.owner,
            history_limits=limits,
            token_counter=token_counter,
        ),
    )


def check_foundation_options(
    *,
    manager: ManagerOptions,
    worker_threads: int,
    close_grace_period: float,
) -> FoundationOptions:
    """Validate the Foundation's own options once; return them with its manager's, frozen.

    Raises:
        InputError: ``worker_threads`` is not a positive integer, or the grace
            period is not a non-negative number.
    """
    if not _positive_int(worker_threads):
        raise InputError(
            f"worker_threads must be a positive integer, not {excerpt(worker_threads)}."
        )
    if not (isinstance(close_grace_period, int | float) and close_grace_period >= 0) or (
        math.isnan(close_grace_period)
    ):
        raise InputError(
            f"close_grace_period must be a non-negative number of seconds, not "
            f"{excerpt(close_grace_period)}."
        )
    return FoundationOptions(
        manager=manager,
        worker_threads=worker_threads,
        close_grace_period=float(close_grace_period),
    )


def _seconds(value: object) -> bool:
    return (
        isinstance(value, int | float)
        and not isinstance(value, bool)
        and not math.isnan(value)
        and value > 0
    )


def check_durable_options(
    *,
    store: object,
    lease_ttl: float,
    idle_after: float,
    owner: str | None,
    history_limits: HistoryLimits,
    token_counter: TokenCounter,
) -> DurableOptions | None:
    """Validate the store options of a Foundation; None when there is no store.

    Raises:
        InputError: ``store`` is not a ContextStore (a URL string included:
            the runtime never opens stores), a time that is not a positive
            number of seconds (``idle_after`` may be ``math.inf``;
            ``lease_ttl`` must be finite), or a malformed owner.
    """
    if store is None:
        return None
    if not (_seconds(lease_ttl) and math.isfinite(lease_ttl)):
        raise InputError(
            f"lease_ttl must be a positive number of seconds, not {excerpt(lease_ttl)}."
        )
    if not _seconds(idle_after):
        raise InputError(
            f"idle_after must be a positive number of seconds, not {excerpt(idle_after)}."
        )
    if owner is None:
        owner = f"turnloom-{uuid.uuid4().hex}"
    elif not isinstance(owner, str) or not owner or " " in owner or len(owner) > 256:
        raise InputError(
            f"owner must be a non-empty str without spaces, at most 256 characters, not "
            f"{excerpt(owner)}."
        )
    if isinstance(store, str):
        raise InputError(
            f"store must be a ContextStore, not the URL {excerpt(store[:80])}: open it with "
            "'async with turnloom.stores.open_context_store(url) as store'."
        )
    if not isinstance(store, ContextStore):
        raise InputError(f"store must be a ContextStore, not {what_type(store)}.")
    return DurableOptions(
        store=store,
        owner=owner,
        lease_ttl=float(lease_ttl),
        idle_after=float(idle_after),
        history_limits=history_limits,
        token_counter=token_counter,
    )


def _strategy(
    strategy: object,
    gateway: Gateway,
    memory: MemorySource | None,
    options: StrategyOptions | None,
    token_counter: TokenCounter,
) -> AssemblyStrategy | None:
    if isinstance(strategy, str):
        return make_strategy(
            strategy, gateway=gateway, memory=memory, options=options, token_counter=token_counter
        )
    if memory is not None or options is not None:
        raise InputError(
            "memory and strategy_options configure a strategy chosen by name; pass "
            "strategy='jit' or strategy='stratified' (a strategy object brings its own)."
        )
    if strategy is None:
        return None
    if not isinstance(strategy, AssemblyStrategy):
        raise InputError(
            f"strategy must be a strategy name or an AssemblyStrategy, not {what_type(strategy)}."
        )
    return strategy


def reject_state(messages: Sequence[Message], where: str) -> None:
    """Runtime state never enters history: reject messages carrying any turn's state pair.

    Any turn's state call id (this turn's included) is in the reserved form
    :func:`~turnloom.runtime.state.is_state_message` recognises, so no
    turn's id needs computing here.

    Raises:
        InvalidMessageError: ``messages[i]`` carries a runtime-state call or result.
    """
    for i, message in enumerate(messages):
        if isinstance(message, Message) and is_state_message(message):
            raise InvalidMessageError(
                f"{where}[{i}] carries a runtime-state call or result (tool "
                f"{excerpt(STATE_TOOL_NAME)}, or a reserved 'tlrs_' call id); runtime state "
                "never enters history."
            )


def check_renderable(
    gateway: Gateway,
    messages: Sequence[Message] | None,
    where: str,
    history: TurnHistory,
    *,
    turn_id: str | None = None,
    pinned: bool = False,
) -> None:
    """Check a batch (its limits first), then render each message once at the door.

    The batch is checked and rendered by ``history.check_batch`` (its length
    in O(1), then each message and the running bytes, then the renders), so
    provider rules and limits fail here, not at prepare. A message the
    gateway cannot carry would otherwise be committed and then fail every
    later prepare of its context. The renders seed the history's render
    cache when the batch is committed or recorded
    (``history.rendered_items()`` counts their native items).

    Args:
        turn_id: the held turn the batch is added to (a record), if any.
        pinned: the batch is a turn's new pinned instructions.

    Raises:
        TurnTooLargeError: the turn would be over the history's limits.
        ItemTooLargeError: a message is over the per-item byte cap.
        InvalidMessageError, InvalidTextError: a malformed message.
        ProviderRuleError: the gateway cannot render a message.
    """
    if messages:
        history.check_batch(messages, where, turn_id=turn_id, pinned=pinned, gateway=gateway)


def check_outputs(
    gateway: Gateway,
    turn_id: str,
    outputs: Sequence[Message],
    history: TurnHistory,
    *,
    id_checked: bool = False,
) -> None:
    """Validate the outputs of a turn to record (see ``ContextManager.record``).

    ``id_checked``: ``turn_id`` passed :func:`check_id` already (an
    invocation's, checked when it began).

    Raises:
        InvalidMessageError, InvalidTextError: a malformed turn id or message,
            not a sequence of Messages, or a runtime-state call or result.
        InstructionMessageError: a ``system`` or ``developer`` message.
        ProviderRuleError: the gateway cannot render a message.
    """
    if not id_checked:
        check_id(turn_id, "turn id")
    kind = type(outputs)
    if (
        kind is not list
        and kind is not tuple
        and (isinstance(outputs, Message) or not isinstance(outputs, Sequence))
    ):
        raise InvalidMessageError("record takes a sequence of Messages, oldest first.")
    if not outputs:
        return
    outputs = _check_named(history, outputs, gateway, "Output of turn {}", turn_id, turn_id=turn_id)
    for message in outputs:  # one pass for both rules; they name the message when one fails
        if message.role in _PINNED_ROLES or is_state_message(message):
            where = f"Output of turn {excerpt(turn_id)}"
            reject_state(outputs, where)
            reject_instructions(outputs, "outputs", where)


def _check_named(
    history: TurnHistory,
    messages: Sequence[Message],
    gateway: Gateway,
    label: str,
    named: str,
    *,
    turn_id: str | None = None,
    pinned: bool = False,
) -> tuple[Message, ...]:
    """``history.check_batch`` of ``messages``; errors name it ``label.format(excerpt(named))``.

    Returns the messages the history admitted for them (``history.admitted()``),
    which the checks after the door read.

    The label is built only when the check fails (an excerpt per call would be
    work on every success): the check is pure (it writes its memo only when it
    passes, and normalises messages idempotently), so a failed check runs again,
    labelled, and raises the very error named.

    Raises:
        as ``history.check_batch``.
    """
    try:
        history.check_batch(messages, "", turn_id=turn_id, pinned=pinned, gateway=gateway)
        return history.admitted()
    except TurnloomError as exc:
        failed = exc
    where = label.format(excerpt(named))
    history.check_batch(messages, where, turn_id=turn_id, pinned=pinned, gateway=gateway)
    raise failed  # not reached: the labelled run raises (unless a gateway changed its mind)


def check_snapshot(
    snapshot: TurnSnapshot, gateway: Gateway, history_of: Callable[[str], TurnHistory]
) -> str:
    """Validate a turn to commit (everything but what the history checks); return its context id.

    ``history_of(context_id)`` gives the context's history (an empty one for
    a new context): its limits bound the turn, checked on the batch first.

    Raises:
        InvalidMessageError, InvalidTextError, ProviderRuleError: as
            :meth:`~turnloom.runtime.ContextManager.accept_turn`.
    """
    if not isinstance(snapshot, TurnSnapshot):
        raise InvalidMessageError(f"accept_turn takes a TurnSnapshot, not {what_type(snapshot)}.")
    context_id = check_id(snapshot.context_id, "context id")
    input, instructions = snapshot.input, snapshot.instructions
    if type(input) is not tuple or (instructions is not None and type(instructions) is not tuple):
        for what, value in (("input", input), ("instructions", instructions)):
            if value is not None and not isinstance(value, (tuple, list)):
                raise InvalidMessageError(
                    f"Turn {excerpt(snapshot.turn_id)} {what} must be a tuple or list of "
                    f"Messages, not {what_type(value)}.",
                    field=what,
                )
    turn_id = check_id(snapshot.turn_id, "turn id")
    history = history_of(context_id)
    rendered = 0
    if input:
        input = _check_named(history, input, gateway, "Turn {} input", turn_id)
        rendered = history.rendered_items()
        for message in input:
            if is_state_message(message):
                reject_state(input, f"Turn {excerpt(turn_id)} input")
    # The prepared input holds what pairing keeps (complete_pairs: no blank
    # text, even where a gateway's layout would re-emit it, no result without
    # its call), so the input must hold content after it too. Its results
    # pair with the calls the kept history leaves open (none on a first
    # turn), as the render pairs them; a result answering one ties this turn
    # to the calls' turn, so eviction keeps that call (see TurnHistory).
    # Without results the open calls cannot matter: they are not walked for.
    if not rendered or not _renders_content(input, history):
        raise InvalidMessageError(
            f"Turn {excerpt(snapshot.turn_id)} of context {excerpt(context_id)} has no input that "
            "renders to content (empty, only blank text, or only tool results answering no "
            "call the context's kept turns leave open); every provider rejects a model input "
            "without it.",
            field="input",
        )
    if instructions:
        _check_named(history, instructions, gateway, "Turn {} instructions", turn_id, pinned=True)
    return context_id


def _renders_content(input: Sequence[Message], history: TurnHistory) -> bool:
    """True when the checked ``input`` keeps content after pairing (``complete_pairs``).

    Without a call or a result, pairing only drops blank text parts (and the
    messages they empty), so the input keeps content exactly when a part of
    it is not blank (:func:`~turnloom.context.is_blank_part`): decided
    without pairing's copy. Otherwise pairing decides, against the calls the
    kept history leaves open when the input holds results.
    """
    content = False
    for message in input:
        for part in message.parts:
            if is_pairing_part(part):
                results = any(holds_results(m) for m in input)
                carried = history.open_calls() if results else ()
                return bool(complete_pairs(input, carried=carried))
            if not content and not is_blank_part(part):
                content = True
    return content


def check_carried(carried: int, max_item_bytes: int, what: str, turn_id: str | None = None) -> None:
    """The runtime-state result is one item under the per-item cap: refuse early.

    ``carried`` counts the characters of the texts the result carries; its
    encoding is at least that many bytes (UTF-8 bytes >= characters), so
    this bound fails before anything is encoded. The exact size is checked
    in the worker. The error names ``what``, followed by the excerpt of
    ``turn_id`` when given (built only then).

    Raises:
        ItemTooLargeError: ``carried`` exceeds ``max_item_bytes``.
    """
    if carried > max_item_bytes:
        if turn_id is not None:
            what = f"{what} {excerpt(turn_id)}"
        raise ItemTooLargeError(
            f"{what} carries at least {carried} bytes, over the per-item cap of "
            f"{max_item_bytes} bytes.",
            size=carried,
            limit=max_item_bytes,
        )


def check_behavior_rules(behavior_rules: str | None, max_item_bytes: int) -> None:
    """Default behaviour rules: valid text that fits the runtime-state result.

    Raises:
        InvalidTextError: text that is not valid UTF-8.
        ItemTooLargeError: the rules alone exceed ``max_item_bytes``, so every
            turn's runtime-state result would.
    """
    check_contributions((), behavior_rules, None)
    check_carried(len(behavior_rules or ""), max_item_bytes, "behavior_rules")


def check_request(request: ContextPrepareRequest, max_item_bytes: int) -> ContextPrepareRequest:
    """Validate a request; return it with its contributions frozen in a tuple.

    The copy is what the preparation captures, so a list (or a perception's
    source dict) the caller changes after the call can neither bypass
    validation nor change state. The perception's time is converted to UTC.

    Raises:
        InvalidMessageError, InvalidTextError, DuplicateIdError: a malformed
            request (ids, contributions, behaviour rules, loop budget, perception).
        InvalidArgumentError: ``scope`` is neither None nor a scope (an object
            with a callable ``matches``); ``field`` is ``"scope"``.
        ItemTooLargeError: the carried texts alone exceed ``max_item_bytes``.
    """
    if not isinstance(request, ContextPrepareRequest):
        raise InvalidMessageError(
            f"prepare takes a ContextPrepareRequest, not {what_type(request)}."
        )
    check_id(request.context_id, "context id")
    check_id(request.turn_id, "turn id")
    if request.scope is not None:
        check_scope(request.scope)
    contributions = request.contributions
    if type(contributions) is not tuple and isinstance(contributions, list):
        contributions = tuple(contributions)
    check_contributions(contributions, request.behavior_rules, request.loop_budget)
    perception = request.perception
    if perception is not None:
        perception = check_perception(perception)
    check_tenant_scope(request.tenant, "tenant")
    if not isinstance(request.auto_hydrate, bool):
        raise InvalidMessageError(
            f"auto_hydrate must be a bool, not {what_type(request.auto_hydrate)}.",
            field="auto_hydrate",
        )
    carried = sum(len(c.name) + len(c.content) for c in contributions)
    carried += len(request.behavior_rules or "")
    if perception is not None:
        carried += len(perception.modality or "")
        carried += sum(len(k) + len(v) for k, v in perception.source.items())
    check_carried(carried, max_item_bytes, "The runtime state of turn", request.turn_id)
    if contributions is request.contributions and perception is None:
        return request
    return msgspec.structs.replace(request, contributions=contributions, perception=perception)


def check_routed_item(
    gateway: Gateway, max_item_bytes: int, context_id: str, item: NativeContent
) -> tuple[NativeContent, Message]:
    """Validate one item routed to an area section; return a private copy and its Message.

    ``item`` is left as it is; the copy is decoded from its JSON encoding and
    the Message is the one :func:`~turnloom.context.admit_message` holds for
    the gateway's parse of the copy, so neither shares anything with ``item``.

    Raises:
        InvalidMessageError: not a JSON object of the gateway, or it carries a
            runtime-state call or result.
        InvalidTextError: its text is not valid UTF-8.
        ItemTooLargeError: its JSON encoding is over ``max_item_bytes``.
    """
    if not isinstance(item, dict):
        raise InvalidMessageError(
            f"An item routed to context {excerpt(context_id)} must be a native item (dict), "
            f"not {what_type(item)}."
        )
    try:
        encoded = _encoder.encode(item)
    except UnicodeEncodeError as exc:
        raise InvalidTextError(
            f"The item routed to context {excerpt(context_id)} holds text that is not valid "
            f"UTF-8 (a lone surrogate): {exc}."
        ) from exc
    except (TypeError, ValueError, OverflowError, RecursionError) as exc:
        raise InvalidMessageError(
            f"The item routed to context {excerpt(context_id)} is not JSON data: "
            f"{excerpt(str(exc))}."
        ) from None
    if len(encoded) > max_item_bytes:
        raise ItemTooLargeError(
            f"The item routed to context {excerpt(context_id)} is {len(encoded)} bytes, over the "
            f"per-item cap of {max_item_bytes} bytes.",
            size=len(encoded),
            limit=max_item_bytes,
        )
    copy: NativeContent = msgspec.json.decode(encoded)
    # Admitted again whatever the gateway's parse did: a host's own gateway
    # may return a message it did not check, or one it keeps.
    message = admit_message(
        gateway.parse(copy), where=f"item routed to context {excerpt(context_id)}"
    )[0]
    if is_state_message(message):
        raise InvalidMessageError(
            f"The item routed to context {excerpt(context_id)} carries a runtime-state call or "
            f"result (tool {excerpt(STATE_TOOL_NAME)}, or a reserved 'tlrs_' call id); the "
            "runtime supplies that pair itself."
        )
    return copy, message
