"""The runtime's data: turns, preparation requests, prepared contexts, statistics.

All are frozen msgspec Structs with keyword-only fields. Construction does not
validate; the :class:`~turnloom.runtime.ContextManager` validates at its door
(``accept_turn``, ``prepare``) and raises typed errors before changing state.
"""

# Contract: seed 004 (TurnSnapshot, ContextContribution, ContextPrepareRequest,
# the prepared prefix).

from __future__ import annotations

__all__ = (
    "AreaPass",
    "AreaStatistics",
    "AssemblyStatistics",
    "ContextContribution",
    "ContextPrepareRequest",
    "HistoryTotals",
    "LatencyHistograms",
    "ManagerStatistics",
    "OutputRecord",
    "OutputStatistics",
    "Perception",
    "PrefixStatistics",
    "PreparationStatistics",
    "PreparedContext",
    "StoreStatistics",
    "SummaryStatistics",
    "TurnSnapshot",
)

from datetime import datetime
from typing import Any, Literal, TypeAlias

import msgspec

from turnloom.context.gateway import GatewayType, NativeContent
from turnloom.context.items import TAKEN_ITEMS, NativeItems
from turnloom.context.memory import TenantScope
from turnloom.context.message import Message
from turnloom.context.scope import ContextScope
from turnloom.runtime.assembly import AssembledContext


class TurnSnapshot(msgspec.Struct, frozen=True, kw_only=True):
    """One committed turn: its input, and optionally new pinned instructions.

    Attributes:
        context_id: the conversation the turn belongs to (created on its first turn).
        turn_id: the turn's id, unique within the context.
        input: the turn's input messages, oldest first (usually one ``user``
            message). Never ``system`` or ``developer``.
        instructions: the pinned ``system``/``developer`` messages from this
            turn on, or None to keep the current ones. Pinned instructions are
            never evicted and never counted against history limits.
        sequence: optional; when given it must be greater than the sequence of
            the context's previous turn, so turns that arrive out of order are
            rejected.
    """

    context_id: str
    turn_id: str
    input: tuple[Message, ...]
    instructions: tuple[Message, ...] | None = None
    sequence: int | None = None


class ContextContribution(msgspec.Struct, frozen=True, kw_only=True):
    """One named section of per-turn state, carried as escaped data.

    Attributes:
        name: an identifier: a letter, then up to 63 letters, digits, ``_``,
            ``-`` or ``.``. Unique within one request.
        content: the section's text. It is data: it is JSON-escaped into the
            runtime-state tool result and never becomes an instruction.
    """

    name: str
    content: str


class Perception(msgspec.Struct, frozen=True, kw_only=True):
    """What the host perceived around one turn: when, through what, from where.

    Captured once per preparation and carried as escaped data in the turn's
    runtime-state pair (key ``"perception"``), so it is byte-identical in
    every model call of the turn and never becomes an instruction.

    Attributes:
        time: when the turn happened, a timezone-aware datetime (converted to
            UTC); None: the Foundation's clock when the preparation captures
            its state (after the turn's commit).
        modality: how the input arrived, an identifier (``"text"``,
            ``"voice"``, ``"video"`` ...), or None.
        source: free-form properties of the input's source (``channel``,
            ``locale``, ``device`` ...): identifier keys, text values; carried
            sorted by key.
    """

    time: datetime | None = None
    modality: str | None = None
    source: dict[str, str] = msgspec.field(default_factory=dict)


class ContextPrepareRequest(msgspec.Struct, frozen=True, kw_only=True):
    """A request to prepare the model input of one committed turn.

    Attributes:
        context_id: the conversation.
        turn_id: the turn whose input is prepared; ``prepare`` waits until it
            is committed.
        contributions: named state sections for this turn (memory, perception,
            time), in order.
        behavior_rules: behaviour rules that may come from a client (for example
            client metadata). Carried only as escaped data in the runtime-state
            pair, never promoted to system or developer instructions.
        loop_budget: the static budget of model calls for this turn, if any;
            carried in the runtime-state pair, never rewritten per model call.
        scope: a :class:`~turnloom.context.ContextScope` (for example
            ``LastNTurns(4)`` for a realtime voice model) that slices the
            history this input shows: it selects among the messages of the
            earlier turns and the turn's input, indexed from 0 in that order;
            the pinned instructions and the turn's input are always kept, and
            call/result pairs are completed after slicing. ``None`` (default)
            prepares the whole history. A scoped prepare changes nothing the
            unscoped ones reuse: history, render caches, the prefix that
            ``reused_bytes`` compares with, the area section (shown as it
            stands, without a pass: ``area_pass == "reused_scoped"``).
        perception: the turn's time, modality and source properties, or None
            for none (see :class:`Perception`).
        tenant: the tenant the turn acts for. It always reaches the assembled
            prompt and the memory source (when the Foundation has an assembly
            strategy) and decides the tenant's share of preparation slots: a
            tenant (its ``tenant_id``) holds at most the manager's
            ``tenant_limit`` at once, a freed slot goes to the waiting request
            whose tenant holds the fewest slots (then the longest waiting), and
            requests without a tenant share one bucket.
        auto_hydrate: whether the assembly strategy recalls memory for this
            turn; the only switch of hydration (the tenant is identity, not
            policy).
        intent_verdict: an optional classifier verdict handed to the
            strategy's ``assemble`` as is (the built-in strategies ignore
            it). The turn's first prepare decides; later prepares of the turn
            reuse its assembly.
    """

    context_id: str
    turn_id: str
    contributions: tuple[ContextContribution, ...] = ()
    behavior_rules: str | None = None
    loop_budget: int | None = None
    scope: ContextScope | None = None
    perception: Perception | None = None
    tenant: TenantScope | None = None
    auto_hydrate: bool = True
    intent_verdict: Any = None


class OutputRecord(msgspec.Struct, frozen=True, kw_only=True):
    """Model outputs of one turn, as an output stream carries them.

    The stream form of :meth:`~turnloom.runtime.ContextManager.record`: a
    manager consuming a stream (``manager.outputs.consume``) records each record as
    ``record(context_id, turn_id, outputs)`` would.

    Attributes:
        context_id: the conversation.
        turn_id: the turn the outputs answer.
        outputs: model messages and tool results, oldest first.
    """

    context_id: str
    turn_id: str
    outputs: tuple[Message, ...]


AreaPass: TypeAlias = Literal[
    "none", "rendered", "reused_invocation", "reused_undelivered", "reused_scoped"
]
"""How a preparation got its area section (see ``ContextManager``).

* ``"none"`` -- the context has no area section (no area attached, nothing routed).
* ``"rendered"`` -- an area pass ran: collection, then one unfold pass.
* ``"reused_invocation"`` -- a model call of the context was in flight when
  the preparation captured its state, so no collection was allowed; the
  previous area section was reused as it was.
* ``"reused_undelivered"`` -- the previous area pass never reached a
  requester (its preparation was cancelled or discarded), so its section was
  reused instead of rendering over it.
* ``"reused_scoped"`` -- a scoped prepare (``ContextPrepareRequest.scope``)
  shows the area section as it stands and never runs a pass.

The area section of a context:

* **Safe points.** Every preparation that renders is a safe point for its
  context's areas: in the worker thread, after the history is rendered, the
  manager appends the items routed since the last pass, runs
  ``coop.render()`` (collection, then one unfold pass) and appends the whole
  area section after the turn's input and its runtime-state pair. An area
  that fails (:class:`~turnloom.errors.AreaCallbackError`) or a routed tool
  call still waiting for its result (:class:`~turnloom.errors.OpenToolCallError`)
  fails the preparation; the CoopContext and its Context are as they were
  (routed items wait for the next pass), its slot is freed and history is
  unchanged. A failing area fails every pass until it recovers; remove the
  context to drop it.
* **Threads.** A CoopContext is used by one thread at a time: each context's
  is guarded by a :class:`threading.Lock` taken only in worker threads, so
  two preparations of one context render their area passes one after the
  other (the second holds its worker token while it waits). The event loop
  never touches a CoopContext: ``areas.attach`` checks the area with the same
  checks as ``CoopContext.register`` and queues it, ``route`` checks and
  queues the item; the next pass enrols both.
* **Model calls in flight.** No collection happens while an invocation of the
  context is in flight. A preparation that captures its state while one is in
  flight does not wait for it (a host may prepare the next turn while the
  model still answers, or from inside its invocation block): it skips the
  pass and reuses the previous area section as it is
  (``area_pass == "reused_invocation"``); queued areas and routed items wait
  for the next pass.
* **Undelivered sections.** A pass changes the areas (a
  :class:`~turnloom.areas.OneShotNotice` retires when it renders), so a
  section no requester received would be lost: when a preparation is
  cancelled or discarded after its pass ran, the next preparation reuses that
  section instead of running a pass (``"reused_undelivered"``), and the pass
  after that collects.
* **Cost.** A pass costs what ``CoopContext.render()`` costs plus one copy and
  one JSON size count of the area section, which collection keeps short; the
  history part stays incremental.
"""


class PreparedContext(msgspec.Struct, frozen=True, kw_only=True, weakref=True):
    """The prepared, cache-stable prefix of a turn's model input.

    Attributes:
        context_id: the conversation.
        turn_id: the turn it was prepared for.
        gateway: the provider the items are rendered for.
        items: tuple of NativeContent, oldest first: the assembled system
            prompt (with an assembly strategy), pinned instructions, the
            earlier turns (each its input, its kept runtime-state pair under
            ``earlier_state="keep"``, then its outputs), the turn's input,
            the runtime-state pair when there is one (directly after the
            input), then the area section
            (``area_items`` items from ``area_start``). Each read returns a
            new tuple of new dicts and lists, shared with nothing turnloom
            keeps and with no other read (strings may be shared: they are
            immutable): change them freely, no later input sees it. When the
            host read the items of a long enough previous prefix of the
            context (512 items or more),
            the first read takes a copy made ahead in the render worker (O(1)
            here); any other read makes one on the reading thread, O(items):
            the earlier turns decoded from their kept JSON bytes in one
            C-speed call, the rest copied container by container (read once
            and keep the tuple). These are items, not a request: send
            ``manager.gateway.request_body(items)`` (or the body of
            :meth:`ContextManager.build`'s result). For Anthropic
            and Gemini that body moves the instructions to their top-level
            field (``system``, ``systemInstruction``) and merges adjacent
            turns; only the body is guaranteed to pass the gateway's
            ``validate()``. A property: the earlier turns are held encoded
            (``native_items``); reads and ``build`` copy them from those
            bytes and keep no decoded tuple. Turnloom's own readers of the
            decoded items (``request_bytes`` of a prefix without a cached
            body) decode them once per prefix: by the prepare (in its worker
            thread, or inline for a small prefix) once such a read decoded
            the context's previous prefix, else on the first read, on the
            reading thread (C-speed JSON decoding of the items the context's
            previous prefix did not decode); the decoded items are shared
            with that prefix. :meth:`ContextManager.request_bytes` with a
            cached body never decodes them.
        native_items: the same items, the earlier turns still JSON-encoded
            (:class:`~turnloom.context.items.NativeItems`).
        item_count: ``len(items)``.
        bytes: serialized size of ``items``, in bytes (JSON).
        tokens: tokens of the messages ``items`` render, by the Foundation's
            token counter: each history message as counted when it entered
            (the number the history's limits and statistics use; earlier
            turns' kept pairs included), plus the runtime-state pair and the
            area section.
        turn_start: index in ``items`` of the turn's first input item.
        area_start: index in ``items`` of the area section's first item (right
            after the runtime-state pair, or after the turn's input when there
            is no pair; also when the section is empty).
        area_items: how many items the area section holds.
        area_pass: how the area section was obtained (see :data:`AreaPass`).
        state_call_id: the call id of the runtime-state pair, or None when the
            prefix has none.
        reserved_ids: ids a continuation may not repeat: the state call id and
            the message ids of the turn's input.
        reused_bytes: bytes at the start of ``items`` equal to the previous
            prepared prefix of the same context (prefix stability); 0 for a
            scoped prepare, which is not compared. The context's previous
            input is the last prefix delivered for it (its ``build`` calls
            only append to that prefix): this is the share of the input a
            provider's prefix cache could serve, compared item by item (each
            item's encoded bytes are kept, so nothing is encoded again), in
            the worker thread that rendered the prefix.
        reused_tokens: the tokens of that shared prefix, estimated as
            ``tokens`` of the previous prefix times the reused share of its
            bytes (rounded down): turnloom keeps tokens per message, not per
            item, so this is the byte share applied to tokens, never more
            than the previous prefix's tokens; 0 when ``reused_bytes`` is 0.
        prompt_cache_key: the context's OpenAI ``prompt_cache_key`` (a salted
            hash of the context id, :func:`~turnloom.context.cache.prompt_cache_key`)
            when the manager has a ``prompt_cache`` with ``cache_key`` and its
            gateway is OpenAI Chat or Responses; else None.
            ``manager.request_body`` and ``request_bytes`` send it.
        queued_seconds: time from the request to the start of rendering, in
            seconds (waiting for a slot, the turn's commit and a worker thread).
        render_seconds: time spent rendering in the worker thread, in seconds.
        assembled: what the Foundation's assembly strategy assembled for the
            turn (the same object for every preparation of the turn), or None
            without a strategy. Its system prompt is ``items[0]``; its
            recalled memory is in the runtime-state pair.
    """

    context_id: str
    turn_id: str
    gateway: GatewayType
    native_items: NativeItems
    item_count: int
    bytes: int
    tokens: int
    turn_start: int
    area_start: int = 0
    area_items: int = 0
    area_pass: AreaPass = "none"
    state_call_id: str | None = None
    reserved_ids: tuple[str, ...] = ()
    reused_bytes: int = 0
    reused_tokens: int = 0
    prompt_cache_key: str | None = None
    queued_seconds: float = 0.0
    render_seconds: float = 0.0
    assembled: AssembledContext | None = None

    @property
    def items(self) -> tuple[NativeContent, ...]:
        """A new copy of the prefix's items (see the class docstring): made ahead, or here."""
        return self.native_items.materialize(TAKEN_ITEMS)


class PreparationStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The bounded preparation queue of a :class:`~turnloom.runtime.ContextManager`.

    Attributes:
        capacity: the bound on pending preparations.
        pending: preparations admitted (each holding a slot) and not yet
            settled: waiting for their assembly or rendering. A call waiting
            for its turn's commit is not admitted and not counted here.
        waiting_for_slot: ``prepare`` calls waiting for a free slot.
        waiting_for_turn: ``prepare``/``prepare_nowait`` calls waiting for
            their turn's commit, before taking a slot (they hold none; a
            mistyped context or turn id waits here until the caller's
            deadline).
        prepared_total: preparations delivered to their requester.
        failed_total: preparations that ended with an error.
        discarded_total: preparations whose requester was cancelled, even
            after the render finished, or whose context was removed while
            they were in flight; their result, if any, was dropped (an area
            section it held goes to the next preparation).
        rejected_total: ``prepare_nowait`` calls refused for lack of a slot.
    """

    capacity: int
    pending: int
    waiting_for_slot: int
    prepared_total: int
    failed_total: int
    discarded_total: int
    rejected_total: int
    waiting_for_turn: int = 0


class HistoryTotals(msgspec.Struct, frozen=True, kw_only=True):
    """The histories of every context of a manager, summed.

    Attributes:
        turns, items, bytes: held across all contexts (bytes of serialized
            messages; pinned instructions excluded).
        evicted_turns_total, evicted_items_total: evicted from histories
            for good (removed contexts included): turns evicted since a
            context's newest commit count once they can no longer be
            restored by its retraction (``voice.retract_turn``), at the
            context's next change or removal, so a restored turn never counts.
        dropped_late_outputs_total: outputs recorded for turns no longer held
            (evicted, retracted, or of a removed context), dropped.
        dropped_blank_outputs_total: empty or whitespace-only outputs not recorded.
        duplicate_outputs_total: outputs recorded again with an id and content
            their turn already held, not stored again.
        retracted_turns_total: turns taken back with ``retract_turn``.
        tokens: tokens of the messages held across all contexts (pinned
            instructions excluded), by the Foundation's token counter.
        unrendered_messages_total: messages committed or recorded (turn
            inputs and outputs) that say something yet render to no native
            item on the Foundation's gateway, so every input it prepares
            leaves them out: a native item only another provider carries, such
            as an OpenAI Chat audio reference without a transcript on
            Anthropic, Gemini or OpenAI Responses (see
            :meth:`~turnloom.context.TurnHistory.left_out`). Each is held,
            counted once, and logged at WARNING by the gateway at each render.
    """

    turns: int
    items: int
    bytes: int
    evicted_turns_total: int
    evicted_items_total: int
    dropped_late_outputs_total: int
    dropped_blank_outputs_total: int
    duplicate_outputs_total: int = 0
    retracted_turns_total: int = 0
    tokens: int = 0
    unrendered_messages_total: int = 0


class PrefixStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Prefix stability: how much of each context's previous prefix the next one reused.

    Attributes:
        bytes_total: bytes of previous prefixes compared for stability.
        reused_bytes_total: of those, bytes reused byte for byte.
        tokens_total: tokens of the previous prefixes compared.
        reused_tokens_total: of those, the tokens of the reused parts
            (``PreparedContext.reused_tokens``, an estimate by byte share).
        gateway: the manager's gateway (``GatewayType`` value), the label of
            the cache-share metrics.
    """

    bytes_total: int
    reused_bytes_total: int
    tokens_total: int = 0
    reused_tokens_total: int = 0
    gateway: str = ""


class LatencyHistograms(msgspec.Struct, frozen=True, kw_only=True):
    """Cumulative histograms of prepare latency and render time.

    Attributes:
        bounds: bucket upper bounds, in seconds; each count tuple has one
            more entry, the ``+Inf`` bucket.
        prepare_counts: cumulative counts of end-to-end prepare latency.
        prepare_sum: sum of those latencies, in seconds.
        render_counts: cumulative counts of worker-thread render time.
        render_sum: sum of render times, in seconds.
    """

    bounds: tuple[float, ...]
    prepare_counts: tuple[int, ...]
    prepare_sum: float
    render_counts: tuple[int, ...]
    render_sum: float


class AreaStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The Context Areas of every context of a manager.

    Attributes:
        attached: areas attached across contexts and not yet collected
            (including those waiting for their first area pass).
        registered_total: successful ``areas.attach`` calls.
        renders_total: area passes run (collection, then one unfold pass).
        passes_reused_total: preparations that reused the previous area
            section instead of running a pass (a model call was in flight, or
            the previous section was never delivered).
        collected_total: areas removed by the Collector.
        items_reclaimed_total: native items the Collector detached from area
            sections (the collected areas' tails, routed outputs inside them
            included).
        items_promoted_total: native items appended for promoted messages.
    """

    attached: int = 0
    registered_total: int = 0
    renders_total: int = 0
    passes_reused_total: int = 0
    collected_total: int = 0
    items_reclaimed_total: int = 0
    items_promoted_total: int = 0


class OutputStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The output streams a manager consumes.

    Attributes:
        streams: streams being consumed now.
        records_total: records recorded from streams (by their consumers and
            by the close's drain).
        drained_total: of those, records the close drained from a stream.
        rejected_total: records refused with a typed error (bad record,
            unknown context or turn, a malformed or instruction message);
            nothing of a refused record was recorded.
        dropped_total: of ``records_total``, records accepted of which no
            message was stored, by the history's rules: for a turn no longer
            held (evicted or retracted), a reply recorded twice, or blank
            (the history's statistics count them by kind).
    """

    streams: int = 0
    records_total: int = 0
    drained_total: int = 0
    rejected_total: int = 0
    dropped_total: int = 0


class AssemblyStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The assembly strategy of a manager: turns assembled, memory recalled, latency.

    Attributes:
        strategy: the strategy's name, or None without one.
        assemblies_total: turns assembled (the strategy ran).
        reused_total: preparations that reused their turn's assembly.
        failed_total: assemblies that raised (a memory source or the token counter failed).
        hydrations_total: assemblies that recalled memory.
        entries_total: memory entries recalled, by assemblies and by
            ``hydrate_context`` calls.
        tool_calls_total: ``hydrate_context`` calls answered.
        breakpoints_skipped_total: delivered prefixes whose assembled system
            prompt went without its Anthropic ``cache_control`` breakpoint
            because the host's own marks in the input already used the
            budget of 4 (the request would have been refused with a fifth).
        bounds: latency bucket upper bounds, in seconds (``+Inf`` implied).
        latency_counts: cumulative counts of assembly latency.
        latency_sum: sum of assembly latencies, in seconds.
    """

    strategy: str | None = None
    assemblies_total: int = 0
    reused_total: int = 0
    failed_total: int = 0
    hydrations_total: int = 0
    entries_total: int = 0
    tool_calls_total: int = 0
    breakpoints_skipped_total: int = 0
    bounds: tuple[float, ...] = ()
    latency_counts: tuple[int, ...] = ()
    latency_sum: float = 0.0


class SummaryStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """Summary compaction and pruning of a manager (``manager.summaries``).

    Attributes:
        running: summarizations in flight (at most one per context).
        started_total: summarizations started (the summarizer was called).
        finished_total: summaries applied to their context's history.
        failed_total: summarizations that gave no summary: the summarizer
            raised, timed out, was cancelled or returned no valid summary, or
            the summary no longer fit the history (stale) (each also handed to
            ``manager.summaries.on_error``).
        discarded_total: summaries that arrived after their context left
            this manager (removed, unloaded): dropped, nothing changed.
        turns_summarized_total: held turns summary turns replaced.
        tokens_summarized_total: tokens those turns held.
        summary_tokens_total: tokens the summary turns applied hold.
        turns_pruned_total: turn prunings (a turn whose tool output was pruned).
        bounds: latency bucket upper bounds, in seconds (``+Inf`` implied).
        latency_counts: cumulative counts of summarizer latency (each call
            that returned or raised).
        latency_sum: sum of those latencies, in seconds.
    """

    running: int = 0
    started_total: int = 0
    finished_total: int = 0
    failed_total: int = 0
    discarded_total: int = 0
    turns_summarized_total: int = 0
    tokens_summarized_total: int = 0
    summary_tokens_total: int = 0
    turns_pruned_total: int = 0
    bounds: tuple[float, ...] = ()
    latency_counts: tuple[int, ...] = ()
    latency_sum: float = 0.0


class StoreStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """The durable store side of a manager (see ``Foundation(store=...)``).

    Attributes:
        claimed: contexts whose lease this manager holds.
        pending_records: changes logged and not yet written to the store.
        batches_total: write batches sent to the store (appends and forgets).
        records_written_total: records the store accepted.
        write_failures_total: batches that failed (store unreachable after
            the bounded retry); their records stayed queued.
        claims_total: leases taken by :meth:`~turnloom.runtime.Leases.claim`.
        takeovers_total: claims that restored a stored context.
        leases_lost_total: leases lost (a refused write or a failed renewal).
        idle_unloads_total: contexts that left memory idle.
        compactions_total: logs replaced by a checkpoint of their history.
    """

    claimed: int
    pending_records: int
    batches_total: int
    records_written_total: int
    write_failures_total: int
    claims_total: int
    takeovers_total: int
    leases_lost_total: int
    idle_unloads_total: int
    compactions_total: int


class ManagerStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """A frozen snapshot of a :class:`~turnloom.runtime.ContextManager`'s counters.

    Counters ending in ``_total`` only grow.

    Attributes:
        closed: the manager no longer accepts calls.
        contexts: contexts held.
        invocations: model calls in flight.
        preparations: the bounded queue and how preparations settled.
        history: the histories held, and what left them.
        prefix: prefix stability.
        latency: prepare-latency and render-time histograms.
        areas: Context Areas attached, passes run, areas collected.
        outputs: output streams consumed and their records.
        assembly: the assembly strategy's counters.
        store: the durable store side; None without a store.
        summaries: summary compaction and pruning.
    """

    closed: bool
    contexts: int
    invocations: int
    preparations: PreparationStatistics
    history: HistoryTotals
    prefix: PrefixStatistics
    latency: LatencyHistograms
    areas: AreaStatistics
    outputs: OutputStatistics = msgspec.field(default_factory=OutputStatistics)
    assembly: AssemblyStatistics = AssemblyStatistics()
    store: StoreStatistics | None = None
    summaries: SummaryStatistics = SummaryStatistics()
