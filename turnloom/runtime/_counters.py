"""The ContextManager's counters: running totals, two histograms, the statistics snapshot.

Synchronous and loop-free. Every total is updated where the counted thing
changes (a commit, a record, an eviction, a removal, a settled preparation,
an area pass), so :meth:`Counters.snapshot` costs O(1) in the number of
contexts: a scrape never walks the contexts.

Written only on the event loop; :meth:`Counters.snapshot` may run on a
scraping thread and reads each field atomically (the snapshot may mix values
of two adjacent moments).
"""

from __future__ import annotations

__all__ = ("LATENCY_BOUNDS", "Counters", "Histogram", "QueueDepths")

from bisect import bisect_left
from typing import Protocol

from turnloom.context.history import HistoryCounts
from turnloom.runtime.schemas import (
    AreaStatistics,
    AssemblyStatistics,
    HistoryTotals,
    LatencyHistograms,
    ManagerStatistics,
    OutputStatistics,
    PrefixStatistics,
    PreparationStatistics,
    PreparedContext,
    StoreStatistics,
    SummaryStatistics,
)


class QueueDepths(Protocol):
    """What :meth:`Counters.snapshot` reads of the preparation queue (``_queue``'s)."""

    @property
    def pending(self) -> int: ...
    @property
    def waiting_for_slot(self) -> int: ...
    @property
    def waiting_for_turn(self) -> int: ...


LATENCY_BOUNDS: tuple[float, ...] = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
)
"""Upper bounds, in seconds, of the prepare-latency and render-time histograms."""


class Histogram:
    """Bucket counts over :data:`LATENCY_BOUNDS` and their sum, in seconds."""

    __slots__ = ("counts", "sum")

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BOUNDS) + 1)
        self.sum = 0.0

    def observe(self, seconds: float) -> None:
        """Count one observation, in seconds; the last bucket is ``+Inf``."""
        # The first bound not below it (bounds ascend); NaN is below none: +Inf.
        index = bisect_left(LATENCY_BOUNDS, seconds) if seconds == seconds else len(LATENCY_BOUNDS)
        self.counts[index] += 1
        self.sum += seconds

    def cumulative(self) -> tuple[int, ...]:
        """The cumulative bucket counts, ``+Inf`` last."""
        total = 0
        out: list[int] = []
        for count in self.counts:
            total += count
            out.append(total)
        return tuple(out)


class Counters:
    """Every counter of one manager, kept as running totals.

    ``turns``, ``items`` and ``bytes`` are what the contexts hold now (a
    removed context's are subtracted); the ``_total`` counters only grow.
    """

    __slots__ = (
        "area_items_promoted",
        "area_items_reclaimed",
        "area_renders",
        "area_reused",
        "areas_attached",
        "areas_collected",
        "areas_registered",
        "assemblies",
        "assembly_entries",
        "assembly_failed",
        "assembly_latency",
        "assembly_reused",
        "blank",
        "breakpoints_skipped",
        "bytes",
        "discarded",
        "duplicates",
        "evicted_items",
        "evicted_turns",
        "failed",
        "gateway",
        "hydrate_calls",
        "hydrations",
        "invocations",
        "items",
        "late",
        "latency",
        "left_out",
        "prefix_bytes",
        "prefix_reused",
        "prefix_reused_tokens",
        "prefix_tokens",
        "prepared",
        "rejected",
        "render",
        "retracted",
        "strategy",
        "summaries_discarded",
        "summaries_failed",
        "summaries_finished",
        "summaries_running",
        "summaries_started",
        "summary_latency",
        "summary_tokens",
        "tokens",
        "tokens_summarized",
        "turns",
        "turns_pruned",
        "turns_summarized",
    )

    def __init__(self, strategy: str | None = None, gateway: str = "") -> None:
        self.gateway = gateway  # the Foundation's one gateway: the prefix metrics' label
        self.invocations = 0
        self.prepared = self.failed = self.discarded = self.rejected = 0
        self.turns = self.items = self.bytes = self.tokens = 0
        self.evicted_turns = self.evicted_items = self.late = self.blank = 0
        self.duplicates = self.retracted = 0
        self.left_out = 0  # messages held that the gateway renders to nothing
        self.prefix_bytes = self.prefix_reused = 0
        self.prefix_tokens = self.prefix_reused_tokens = 0
        self.latency = Histogram()
        self.render = Histogram()
        self.areas_attached = self.areas_registered = 0
        self.area_renders = self.area_reused = self.areas_collected = 0
        self.area_items_reclaimed = self.area_items_promoted = 0
        self.strategy = strategy  # the assembly strategy's name, or None
        self.assemblies = self.assembly_reused = self.assembly_failed = 0
        self.hydrations = self.assembly_entries = self.hydrate_calls = 0
        self.breakpoints_skipped = 0
        self.assembly_latency = Histogram()
        self.summaries_running = self.summaries_started = self.summaries_finished = 0
        self.summaries_failed = self.summaries_discarded = 0
        self.turns_summarized = self.tokens_summarized = self.summary_tokens = 0
        self.turns_pruned = 0
        self.summary_latency = Histogram()

    def history_changed(self, before: HistoryCounts, after: HistoryCounts) -> None:
        """Add what one history's change (commit, record, eviction) did to the totals."""
        turns, items, size, tokens, evicted_turns, evicted_items, late, blank, dup, retracted = (
            before
        )
        self.turns += after[0] - turns
        self.items += after[1] - items
        self.bytes += after[2] - size
        self.tokens += after[3] - tokens
        self.evicted_turns += after[4] - evicted_turns
        self.evicted_items += after[5] - evicted_items
        self.late += after[6] - late
        self.blank += after[7] - blank
        self.duplicates += after[8] - dup
        self.retracted += after[9] - retracted

    def history_removed(self, held: HistoryCounts) -> None:
        """A history was released: what it held is no longer held (its totals stay)."""
        self.turns -= held[0]
        self.items -= held[1]
        self.bytes -= held[2]
        self.tokens -= held[3]

    def delivered(
        self, compared: int, prepared: PreparedContext, latency: float, compared_tokens: int = 0
    ) -> None:
        """Count a delivered prefix: ``compared`` bytes (``compared_tokens`` tokens) of the
        previous one, latency in seconds."""
        self.prefix_bytes += compared
        self.prefix_reused += prepared.reused_bytes
        self.prefix_tokens += compared_tokens
        self.prefix_reused_tokens += prepared.reused_tokens
        self.latency.observe(latency)
        self.render.observe(prepared.render_seconds)

    def assembled(self, entries: int | None, seconds: float) -> None:
        """Count one assembly: ``entries`` recalled (None: no hydration), ``seconds`` spent."""
        self.assemblies += 1
        self.assembly_latency.observe(seconds)
        if entries is not None:
            self.hydrations += 1
            self.assembly_entries += entries

    def snapshot(
        self,
        *,
        closed: bool,
        contexts: int,
        capacity: int,
        queue: QueueDepths | None,
        outputs: OutputStatistics,
        store: StoreStatistics | None,
    ) -> ManagerStatistics:
        """The frozen statistics, O(1): the running totals and the queue's state.

        ``queue`` is None before the manager is bound; ``store`` without a store.
        """
        pending = queue.pending if queue is not None else 0
        waiting_for_slot = queue.waiting_for_slot if queue is not None else 0
        waiting_for_turn = queue.waiting_for_turn if queue is not None else 0
        return ManagerStatistics(
            closed=closed,
            contexts=contexts,
            invocations=self.invocations,
            preparations=PreparationStatistics(
                capacity=capacity,
                pending=pending,
                waiting_for_slot=waiting_for_slot,
                waiting_for_turn=waiting_for_turn,
                prepared_total=self.prepared,
                failed_total=self.failed,
                discarded_total=self.discarded,
                rejected_total=self.rejected,
            ),
            history=HistoryTotals(
                turns=self.turns,
                items=self.items,
                bytes=self.bytes,
                evicted_turns_total=self.evicted_turns,
                evicted_items_total=self.evicted_items,
                dropped_late_outputs_total=self.late,
                dropped_blank_outputs_total=self.blank,
                duplicate_outputs_total=self.duplicates,
                retracted_turns_total=self.retracted,
                unrendered_messages_total=self.left_out,
                tokens=self.tokens,
            ),
            prefix=PrefixStatistics(
                bytes_total=self.prefix_bytes,
                reused_bytes_total=self.prefix_reused,
                tokens_total=self.prefix_tokens,
                reused_tokens_total=self.prefix_reused_tokens,
                gateway=self.gateway,
            ),
            latency=LatencyHistograms(
                bounds=LATENCY_BOUNDS,
                prepare_counts=self.latency.cumulative(),
                prepare_sum=self.latency.sum,
                render_counts=self.render.cumulative(),
                render_sum=self.render.sum,
            ),
            areas=AreaStatistics(
                attached=self.areas_attached,
                registered_total=self.areas_registered,
                renders_total=self.area_renders,
                passes_reused_total=self.area_reused,
                collected_total=self.areas_collected,
                items_reclaimed_total=self.area_items_reclaimed,
                items_promoted_total=self.area_items_promoted,
            ),
            outputs=outputs,
            store=store,
            assembly=AssemblyStatistics(
                strategy=self.strategy,
                assemblies_total=self.assemblies,
                reused_total=self.assembly_reused,
                failed_total=self.assembly_failed,
                hydrations_total=self.hydrations,
                entries_total=self.assembly_entries,
                tool_calls_total=self.hydrate_calls,
                breakpoints_skipped_total=self.breakpoints_skipped,
                bounds=LATENCY_BOUNDS,
                latency_counts=self.assembly_latency.cumulative(),
                latency_sum=self.assembly_latency.sum,
            ),
            summaries=SummaryStatistics(
                running=self.summaries_running,
                started_total=self.summaries_started,
                finished_total=self.summaries_finished,
                failed_total=self.summaries_failed,
                discarded_total=self.summaries_discarded,
                turns_summarized_total=self.turns_summarized,
                tokens_summarized_total=self.tokens_summarized,
                summary_tokens_total=self.summary_tokens,
                turns_pruned_total=self.turns_pruned,
                bounds=LATENCY_BOUNDS,
                latency_counts=self.summary_latency.cumulative(),
                latency_sum=self.summary_latency.sum,
            ),
        )
