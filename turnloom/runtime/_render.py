"""The worker-thread render of one preparation and its prefix byte accounting.

Synchronous and loop-free: :func:`render_preparation` runs in a worker thread
on data the event loop captured (an immutable history view, the frozen
request, the context's last delivered prefix) and returns the prepared
prefix, what to keep for the next comparison, and the area step's result.
"""

from __future__ import annotations

__all__ = (
    "DeliveredPrefix",
    "Rendered",
    "assembled_prompt",
    "common_prefix",
    "render_preparation",
)

import gc
import time
from typing import overload

import msgspec

from turnloom.context._untrack import untrack_atoms, untrack_json
from turnloom.context.body import EncodedBody
from turnloom.context.cache import ANTHROPIC_MAX_BREAKPOINTS, prompt_cache_key
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.gateway import Gateway, GatewayType, NativeContent
from turnloom.context.history import HistoryView, RenderedHistory
from turnloom.context.items import (
    COPY_AHEAD_ITEMS,
    TAKEN_BUILD,
    TAKEN_ITEMS,
    NativeItems,
    common_prefix,
)
from turnloom.context.memory import memory_payload
from turnloom.context.message import Message, Role, TextPart
from turnloom.context.tokens import count_tokens
from turnloom.errors import ItemTooLargeError, OpenToolCallError, excerpt
from turnloom.runtime._area_section import (
    AreaSection,
    SectionResult,
    current_section,
    run_area_step,
)
from turnloom.runtime._door import ManagerOptions
from turnloom.runtime.assembly import AssembledContext
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext
from turnloom.runtime.state import state_call_id, state_messages

_encoder = msgspec.json.Encoder()
# A prefix whose items the host reads is decoded inline for up to this many
# items per item of a bounded render's budget: decoding it reuses the last
# prefix's items, so it is a C-speed copy of references (tens of ns each,
# against microseconds to render an item), which up to a few thousand items
# costs less than the thread handoff it saves.
_DECODE_PER_BUDGET_ITEM = 8
_CACHE_CONTROL = {"cache_control": {"type": "ephemeral"}}


class DeliveredPrefix:
    """A delivered prefix and how to count the bytes of any leading part of it.

    ``call_ids`` is the call-id renaming state after ``items``
    (:mod:`turnloom.context.callids`); ``build`` continues it, on a copy.
    ``state`` is what the prefix's turn keeps once it is delivered: its
    runtime-state pair (call, result), or () without one or when the pair
    carries recalled memory (tenant data; see :mod:`turnloom.runtime.state`).
    ``body`` is the request body of ``items`` with the history's closed
    turns kept encoded (None with an assembled system prompt before the
    history, or a gateway without a body writer).
    """

    __slots__ = (
        "body",
        "bytes",
        "call_ids",
        "extra_sizes",
        "items",
        "lead_sizes",
        "rendered",
        "skipped_breakpoint",
        "state",
        "tokens",
    )

    def __init__(
        self,
        items: NativeItems,
        total: int,
        rendered: RenderedHistory,
        extra_sizes: tuple[int, ...],
        call_ids: CallIdRenamer,
        lead_sizes: tuple[int, ...] = (),
        state: tuple[Message, ...] = (),
        body: EncodedBody | None = None,
        skipped_breakpoint: bool = False,
        tokens: int = 0,
    ) -> None:
        self.tokens = tokens  # the prefix's tokens, to estimate the next one's reused tokens
        self.items = items
        # The assembly's cache breakpoint was left out: the host's marks used the budget.
        self.skipped_breakpoint = skipped_breakpoint
        self.body = body
        self.bytes = total
        self.rendered = rendered
        self.extra_sizes = extra_sizes  # state pair + area section, after the history
        self.call_ids = call_ids
        self.lead_sizes = lead_sizes  # the assembled system prompt, before the history
        self.state = state
        if not any(map(gc.is_tracked, (items, rendered, call_ids, body))):
            # Its slots only ever hold tuples of ints, ``state`` (() or the
            # runtime-state pair state_messages made: gc=False messages of
            # turnloom's own text), and objects out of the collector by their
            # own proofs: its items and body (which then hold no area items),
            # its render and a CallIdRenamer. Nothing it refers to can lead
            # back to it, so it can be in no cycle (each context keeps its last).
            untrack_atoms(self)

    def bytes_before(self, count: int) -> int:
        """Serialized size of ``items[:count]``, in bytes."""
        lead = len(self.lead_sizes)
        if count <= lead:
            return sum(self.lead_sizes[:count])
        base = sum(self.lead_sizes)
        count -= lead
        history = self.rendered.item_count
        if count <= history:
            return base + self.rendered.bytes_before(count)
        return base + self.rendered.bytes + sum(self.extra_sizes[: count - history])


Rendered = tuple[PreparedContext, "DeliveredPrefix", SectionResult | None]
"""A render's result: the prepared prefix, what to keep for the next
comparison, and the area step's result (None without areas)."""


@overload
def render_preparation(
    options: ManagerOptions,
    view: HistoryView,
    request: ContextPrepareRequest,
    behavior_rules: str | None,
    last: DeliveredPrefix | None,
    queued: float,
    areas: AreaSection | None,
    run_pass: bool,
    assembled: AssembledContext | None = None,
    budget: None = None,
) -> Rendered: ...


@overload
def render_preparation(
    options: ManagerOptions,
    view: HistoryView,
    request: ContextPrepareRequest,
    behavior_rules: str | None,
    last: DeliveredPrefix | None,
    queued: float,
    areas: AreaSection | None,
    run_pass: bool,
    assembled: AssembledContext | None,
    budget: int,
) -> Rendered | None: ...


def render_preparation(
    options: ManagerOptions,
    view: HistoryView,
    request: ContextPrepareRequest,
    behavior_rules: str | None,
    last: DeliveredPrefix | None,
    queued: float,
    areas: AreaSection | None,
    run_pass: bool,
    assembled: AssembledContext | None = None,
    budget: int | None = None,
) -> Rendered | None:
    """Render one preparation: assembled prompt, history, runtime-state pair, area section.

    A request with a ``scope`` renders the sliced view
    (``HistoryView.render_scoped``) and shows the area section as it stands
    (:func:`current_section`): nothing the unscoped preparations reuse is
    read for it or changed by it, and its ``reused_bytes`` is 0.

    Args:
        queued: seconds from the request to the start of rendering.
        last: the context's last delivered prefix, to count reused bytes;
            once its items were read (decoded), the new prefix's items are
            decoded here, from its.
        assembled: the turn's assembly: its system prompt goes first, its
            recalled memory into the runtime-state pair.
        budget: with one, render only when the work is small and bounded
            (:meth:`HistoryView.render_bounded` of the history, counting
            the bytes reused from ``last`` in O(1) beyond it, and decoding
            items only for a prefix of a few times ``budget`` items), else return
            None with nothing that the caller keeps changed (an unscoped
            request without areas only). An assembly with an Anthropic
            breakpoint is never rendered this way: the host's marks are
            counted over the whole history (O(bytes), at C speed).

    Raises:
        ItemTooLargeError: the runtime-state result is over the per-item cap.
        ProviderRuleError: the gateway rejected a message.
        AreaCallbackError, OpenToolCallError: from the area step.
    """
    begin = time.perf_counter()
    if _decoding_too_costly(last, budget):
        return None  # the host reads items: decoding them copies O(history), in a worker
    if budget is not None and assembled is not None and assembled.cache_breakpoint:
        return None  # counting the host's marks reads the whole history: in a worker
    gateway = options.gateway
    counter = options.token_counter
    memory = _assembly_memory(assembled) if assembled is not None else None
    # The request was frozen at the door; its JSON encoding is CPU work.
    pair = state_messages(
        request.context_id,
        request.turn_id,
        contributions=request.contributions,
        behavior_rules=behavior_rules,
        loop_budget=request.loop_budget,
        perception=request.perception,
        memory=memory,
    )
    rendered = _render_history(options, view, request, budget)
    if rendered is None:
        return None
    # The pair and the area section continue the history's call-id renaming.
    call_ids = rendered.call_ids
    tokens = rendered.tokens
    reserved: list[str] = []
    call_id: str | None = None
    extra: tuple[NativeContent, ...] = ()
    if pair is not None:
        # The pair sits directly after the turn's input; the area section follows it.
        call_id = state_call_id(request.context_id, request.turn_id)
        reserved.append(call_id)
        extra, pair_tokens = _state_pair_items(options, request, pair, call_ids)
        tokens += pair_tokens
    pair_items = len(extra)
    section: SectionResult | None = None
    if areas is not None:
        section = _area_step(areas, request, run_pass)
        extra += tuple(rename_call_ids(gateway.type, section.items, call_ids))
        # Area items are native; each is counted as the message it parses to.
        tokens += count_tokens(counter, [gateway.parse(item) for item in section.items])
    encode = _encoder.encode
    extra_sizes = tuple([len(encode(item)) for item in extra]) if extra else ()
    items = rendered.native_items
    total = rendered.bytes
    if assembled is None:
        lead: tuple[NativeContent, ...] = ()
        lead_sizes: tuple[int, ...] = ()
        skipped = False
    else:
        lead, prompt, skipped = _assembly_lead(gateway, assembled, items, extra)
        tokens += count_tokens(counter, [prompt]) if prompt is not None else 0
        lead_sizes = tuple([len(encode(item)) for item in lead])
        items = items.prefixed(lead)
        total += sum(lead_sizes)
    if extra:
        items = items.extended(extra)
        total += sum(extra_sizes)
    reserved += [m.id for m in view.turn_input(request.turn_id) if m.id is not None]
    reused = _reuse_last(items, last, request, budget)
    if reused is None:
        return None  # comparing with another run's items costs their common length
    reused_tokens = last.tokens * reused // last.bytes if last is not None and last.bytes else 0
    prepared = PreparedContext(
        context_id=request.context_id,
        turn_id=request.turn_id,
        gateway=gateway.type,
        native_items=items,
        item_count=len(items),
        bytes=total,
        tokens=tokens,
        turn_start=len(lead) + rendered.turn_start,
        area_start=len(lead) + rendered.item_count + pair_items,
        area_items=len(section.items) if section is not None else 0,
        area_pass=section.outcome if section is not None else "none",
        state_call_id=call_id,
        reserved_ids=tuple(reserved),
        reused_bytes=reused,
        reused_tokens=reused_tokens,
        prompt_cache_key=_cache_key(options, request.context_id),
        queued_seconds=queued,
        render_seconds=time.perf_counter() - begin,
        assembled=assembled,
    )
    # The cached body starts at the history's pinned instructions: an
    # assembled prompt before them changes its leading fields, so such a
    # prefix is encoded whole (IssuedPrefixes.request_bytes).
    body = rendered.body.extend(extra) if rendered.body is not None and not lead else None
    return (
        prepared,
        DeliveredPrefix(
            items,
            total,
            rendered,
            extra_sizes,
            call_ids,
            lead_sizes,
            pair if pair is not None and memory is None else (),
            body,
            skipped,
            tokens,
        ),
        section,
    )


# The steps of a render, in order. Each returns what the next needs; a bounded
# render (``budget``) that would cost more than its bound returns None early,
# before anything the caller keeps is changed.


def _decoding_too_costly(last: DeliveredPrefix | None, budget: int | None) -> bool:
    """A bounded render whose host reads items would decode or copy too many items on the loop.

    Decoding reuses the last prefix's items (a copy of references): a few
    items per budget. Copies made ahead for a host that takes copies
    (:func:`_copies_wanted`, from :data:`~turnloom.context.items.COPY_AHEAD_ITEMS`
    items on) are made only in the worker.
    """
    if budget is None or last is None:
        return False
    count = len(last.items)
    if last.items.taken and count >= COPY_AHEAD_ITEMS:
        return True
    return last.items.decoded and count > budget * _DECODE_PER_BUDGET_ITEM


def _assembly_memory(assembled: AssembledContext | None) -> dict[str, object] | None:
    """The assembly's recalled memory, as the runtime-state pair carries it."""
    if assembled is None or assembled.memory_context is None:
        return None
    hydrated = assembled.memory_context
    entries, omitted = memory_payload(hydrated.entries, assembled.max_memory_chars)
    return {"query": hydrated.query, "entries": entries, "omitted": omitted}


def _assembly_lead(
    gateway: Gateway,
    assembled: AssembledContext | None,
    history: NativeItems,
    extra: tuple[NativeContent, ...],
) -> tuple[tuple[NativeContent, ...], Message | None, bool]:
    """The assembled system prompt's items, its message, and whether its breakpoint was left out.

    The assembly's Anthropic breakpoint is left out when the host's own marks
    in the history and the items after it already use the budget of 4.
    """
    if assembled is None:
        return (), None, False
    skipped = False
    if assembled.cache_breakpoint and _host_marks(history, extra) >= ANTHROPIC_MAX_BREAKPOINTS:
        # The host's own marks use Anthropic's whole budget: a fifth is refused.
        assembled = msgspec.structs.replace(assembled, cache_breakpoint=False)
        skipped = True
    return assembled_prompt(gateway, assembled), _prompt_message(assembled), skipped


def _render_history(
    options: ManagerOptions,
    view: HistoryView,
    request: ContextPrepareRequest,
    budget: int | None,
) -> RenderedHistory | None:
    """The history's render: bounded (None when over ``budget``), whole, or of the scope."""
    gateway, open_calls = options.gateway, options.open_calls
    if budget is not None:
        return view.render_bounded(gateway, request.turn_id, budget, open_calls=open_calls)
    if request.scope is None:
        return view.render(gateway, request.turn_id, open_calls=open_calls)
    return view.render_scoped(gateway, request.turn_id, request.scope, open_calls=open_calls)


def _state_pair_items(
    options: ManagerOptions,
    request: ContextPrepareRequest,
    pair: tuple[Message, Message],
    call_ids: CallIdRenamer,
) -> tuple[tuple[NativeContent, ...], int]:
    """The runtime-state pair rendered, its call ids continuing the history's, and its tokens.

    Raises:
        ItemTooLargeError: the result is over the per-item cap.
        HostCallbackError: the token counter failed (counted before the cap is checked).
    """
    gateway = options.gateway
    extra = tuple(
        rename_call_ids(
            gateway.type, [*gateway.render(pair[0]), *gateway.render(pair[1])], call_ids
        )
    )
    # Fresh JSON trees, read-only once prepared: out of the cyclic
    # collector, so a held prefix adds no tracked containers.
    untrack_json(extra)
    tokens = count_tokens(options.token_counter, pair)
    max_item_bytes = options.history_limits.max_item_bytes
    size = len(_encoder.encode(extra[-1]))
    if size > max_item_bytes:
        raise ItemTooLargeError(
            f"The runtime-state result of turn {excerpt(request.turn_id)} of context "
            f"{excerpt(request.context_id)} is {size} bytes, over the per-item cap of "
            f"{max_item_bytes} bytes.",
            size=size,
            limit=max_item_bytes,
        )
    return extra, tokens


def _area_step(areas: AreaSection, request: ContextPrepareRequest, run_pass: bool) -> SectionResult:
    """The area section: run its step, or as it stands for a scoped request.

    Raises:
        OpenToolCallError: the section ends with a routed call without its result.
        AreaCallbackError: from the area step.
    """
    try:
        if request.scope is not None:
            return current_section(areas)
        return run_area_step(areas, run_pass)
    except OpenToolCallError as exc:
        raise OpenToolCallError(
            f"The area section of context {excerpt(request.context_id)} ends with routed "
            f"tool call(s) {', '.join(map(repr, exc.call_ids))} whose result has not "
            f"been routed; turn {excerpt(request.turn_id)} cannot be prepared until it is.",
            call_ids=exc.call_ids,
        ) from exc


def _reuse_last(
    items: NativeItems,
    last: DeliveredPrefix | None,
    request: ContextPrepareRequest,
    budget: int | None,
) -> int | None:
    """The bytes ``items`` reuse from the last delivered prefix, adopting its decoded items.

    None for a bounded render whose comparison with another run's items would
    cost their common length (nothing changed).
    """
    if last is None or request.scope is not None:
        return 0
    if budget is not None and len(last.items) > budget and not items.same_run(last.items):
        return None
    wanted = _copies_wanted(last.items) if len(items) >= COPY_AHEAD_ITEMS else 0
    if wanted and budget is not None:
        return None  # copies are made ahead in the worker only
    reused = last.bytes_before(items.common_length(last.items))
    items.adopt(last.items)  # a host reading items decodes only the new ones
    if last.items.decoded:
        # Turnloom read the last prefix's kept items (``request_bytes``
        # without a cached body does; host copies are decoded from the bytes
        # and need none): decode them here, in the worker thread (inline only
        # for a small prefix, see above), not on the event loop at the first
        # read. Sticky per context: this prefix is decoded as well.
        items._shared()
    if wanted:
        # And the copies its first reads take, made here too (see _copies_wanted).
        items.make_copies(wanted, last.items)  # from a copy of the last that was not taken
    return reused


def _copies_wanted(last: NativeItems) -> int:
    """Host copies to make ahead for a context's next prefix: one per way the last was read.

    Sticky per context, as decoding is: one for the first ``build`` when
    the host built on the last prefix (each later one's is made after the
    build before it, :meth:`Preparer.refill`), one for ``PreparedContext.items``
    when it read that. 0 for a host that only sends ``request_bytes``.
    Each copy costs O(items) here, in the worker, so that the reads cost
    O(1) on the loop; the caller asks only for a prefix of at least
    :data:`~turnloom.context.items.COPY_AHEAD_ITEMS` items.
    """
    taken = last.taken
    return (taken & TAKEN_ITEMS != 0) + (taken & TAKEN_BUILD != 0)


_OPENAI = (GatewayType.openai_chat, GatewayType.openai_responses)


def _cache_key(options: ManagerOptions, context_id: str) -> str | None:
    """The context's OpenAI ``prompt_cache_key``, when the options ask for one."""
    cache = options.prompt_cache
    if cache is None or not cache.cache_key or options.gateway.type not in _OPENAI:
        return None
    return prompt_cache_key(context_id, cache.key_salt)


_MARK_KEY = b'"cache_control":'


def _host_marks(history: NativeItems, extra: tuple[NativeContent, ...]) -> int:
    """``cache_control`` marks in the history's items and the ones after it, counted at C speed.

    A key named ``cache_control`` inside a tool call's arguments counts too:
    the count errs high, so the assembly's mark is left out, never one too many.
    """
    return history.count_encoded(_MARK_KEY) + sum(
        _encoder.encode(item).count(_MARK_KEY) for item in extra
    )


def _prompt_message(assembled: AssembledContext) -> Message | None:
    if assembled.system_prompt is None:
        return None
    part = TextPart(
        text=assembled.system_prompt,
        extras=dict(_CACHE_CONTROL) if assembled.cache_breakpoint else None,
    )
    return Message(role=Role.system, content=(part,))


def assembled_prompt(gateway: Gateway, assembled: AssembledContext) -> tuple[NativeContent, ...]:
    """The native items of an assembly's system prompt (none without one).

    With ``cache_breakpoint`` the prompt's text block carries Anthropic's
    ``cache_control`` marker, so the cached prefix ends with it. Source:
    Anthropic prompt caching guide, ``cache_control`` on system text blocks.
    """
    message = _prompt_message(assembled)
    return () if message is None else tuple(gateway.render(message))
