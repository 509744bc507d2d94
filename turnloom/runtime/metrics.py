"""Prometheus metrics of a ContextManager, read from its ``statistics()`` snapshots.

This is the only module of turnloom that imports ``prometheus_client``. A
:class:`ManagerCollector` turns each :class:`~turnloom.runtime.ManagerStatistics`
snapshot into metric families at scrape time, so the hot path keeps plain
counters and never touches a metrics library.

Metrics (all prefixed ``turnloom_``):

========================================  =========  ======================================
name                                      type       meaning
========================================  =========  ======================================
``preparations_pending``                  gauge      admitted, not yet settled
``preparations_capacity``                 gauge      the bound on pending preparations
``preparations_waiting_for_slot``         gauge      ``prepare`` calls waiting for a slot
``preparations_waiting_for_turn``         gauge      calls waiting for their turn's commit
                                                     (holding no slot)
``preparations_total{outcome}``           counter    settled: prepared, failed, discarded
``preparations_rejected_total``           counter    ``prepare_nowait`` refusals
``prepare_latency_seconds``               histogram  request to delivery, seconds
``render_seconds``                        histogram  worker-thread render time, seconds
``contexts``                              gauge      contexts held
``invocations_in_flight``                 gauge      model calls in flight
``history_turns`` / ``_items`` / ``_bytes``  gauge   held across contexts
``history_tokens``                        gauge      tokens held (the Foundation's counter)
``evicted_turns_total`` / ``_items_total``  counter  evicted from histories
``dropped_late_outputs_total``            counter    outputs for evicted turns, dropped
``dropped_blank_outputs_total``           counter    empty partial outputs, not recorded
``duplicate_outputs_total``               counter    outputs recorded again, stored once
``unrendered_messages_total``             counter    held messages the gateway renders to
                                                     nothing (another provider's item)
``retracted_turns_total``                 counter    turns taken back (false starts)
``prefix_compared_bytes_total``           counter    previous-prefix bytes compared
``prefix_reused_bytes_total``             counter    of those, reused byte for byte
``prefix_stability_ratio``                gauge      reused / compared (1.0 when none)
``prefix_compared_tokens_total``          counter    previous-prefix tokens compared
``prefix_reused_tokens_total``            counter    of those, reused (estimated by byte share)
``prompt_cache_share{gateway,unit}``      gauge      the share of previous inputs the next
                                                     input repeats: ``unit`` is ``bytes``
                                                     or ``tokens`` (1.0 when none)
``areas_attached``                        gauge      Context Areas attached, not collected
``areas_registered_total``                counter    ``areas.attach`` calls accepted
``area_renders_total``                    counter    area passes run (collect, then unfold)
``area_passes_reused_total``              counter    previous area section reused instead
``areas_collected_total``                 counter    areas removed by the Collector
``area_items_reclaimed_total``            counter    items reclaimed (detached) by the Collector
``area_items_promoted_total``             counter    items appended for promoted messages
``output_streams``                        gauge      output streams being consumed
``output_records_total{outcome}``         counter    stream records: recorded, dropped, rejected
``output_records_drained_total``          counter    of the recorded, drained at close
``assemblies_total{strategy}``            counter    turns assembled by the strategy
``assembly_reused_total{strategy}``       counter    preparations reusing their turn's assembly
``assembly_failures_total{strategy}``     counter    assemblies that raised
``assembly_latency_seconds{strategy}``    histogram  time in the strategy's ``assemble``
``hydrated_entries_total{strategy}``      counter    memory entries recalled (assemblies and
                                                     ``hydrate_context`` calls)
``hydrate_context_calls_total{strategy}`` counter    ``hydrate_context`` calls answered
``assembly_breakpoints_skipped_total{strategy}``  counter  prompts sent without their
                                                     Anthropic breakpoint (host marks used
                                                     the budget of 4)
``summarizations_running``                gauge      summarizations in flight
``summarizations_total{outcome}``         counter    started, finished, failed, discarded
``summarized_turns_total``                counter    held turns replaced by summary turns
``summarized_tokens_total``               counter    tokens those turns held
``summary_tokens_total``                  counter    tokens the applied summaries hold
``pruned_turns_total``                    counter    turns whose old tool output was pruned
``summarizer_latency_seconds``            histogram  time in the host's summarizer
========================================  =========  ======================================

The assembly families exist only when the Foundation has a strategy. Their
one label is the strategy's name (one per Foundation), never a tenant or a
context: the label set stays bounded.

The endpoint is served by ``prometheus_client``'s own WSGI server
(:func:`serve_metrics`), on the loopback interface by default.
"""

from __future__ import annotations

__all__ = ("ManagerCollector", "MetricsServer", "serve_metrics")

import threading
from collections.abc import Callable, Iterator
from types import TracebackType
from wsgiref.simple_server import WSGIServer

import anyio
from prometheus_client import start_http_server
from prometheus_client.core import (
    CounterMetricFamily,
    GaugeMetricFamily,
    HistogramMetricFamily,
    Metric,
)
from prometheus_client.registry import Collector, CollectorRegistry

from turnloom.runtime.schemas import ManagerStatistics, StoreStatistics, SummaryStatistics


def _buckets(bounds: tuple[float, ...], counts: tuple[int, ...]) -> list[tuple[str, float]]:
    labels = [repr(float(b)) for b in bounds] + ["+Inf"]
    return [(label, float(count)) for label, count in zip(labels, counts, strict=True)]


class ManagerCollector(Collector):
    """A Prometheus collector reading one manager's statistics at each scrape.

    Args:
        statistics: returns a fresh :class:`ManagerStatistics`, usually
            ``foundation.manager.statistics``. It is called from the scraping
            thread; the manager's ``statistics()`` only reads counters.
    """

    def __init__(self, statistics: Callable[[], ManagerStatistics]) -> None:
        self._statistics = statistics

    def collect(self) -> Iterator[Metric]:
        """Yield every turnloom metric family for the current snapshot."""
        s = self._statistics()
        yield GaugeMetricFamily(
            "turnloom_preparations_pending",
            "Preparations admitted and not settled.",
            s.preparations.pending,
        )
        yield GaugeMetricFamily(
            "turnloom_preparations_capacity",
            "Bound on pending preparations.",
            s.preparations.capacity,
        )
        yield GaugeMetricFamily(
            "turnloom_preparations_waiting_for_slot",
            "prepare calls waiting for a free slot.",
            s.preparations.waiting_for_slot,
        )
        yield GaugeMetricFamily(
            "turnloom_preparations_waiting_for_turn",
            "prepare calls waiting for their turn's commit (holding no slot).",
            s.preparations.waiting_for_turn,
        )
        settled = CounterMetricFamily(
            "turnloom_preparations", "Settled preparations by outcome.", labels=["outcome"]
        )
        settled.add_metric(["prepared"], s.preparations.prepared_total)
        settled.add_metric(["failed"], s.preparations.failed_total)
        settled.add_metric(["discarded"], s.preparations.discarded_total)
        yield settled
        yield CounterMetricFamily(
            "turnloom_preparations_rejected",
            "prepare_nowait calls refused for lack of a slot.",
            s.preparations.rejected_total,
        )
        yield HistogramMetricFamily(
            "turnloom_prepare_latency_seconds",
            "Time from a prepare request to its delivery, in seconds.",
            buckets=_buckets(s.latency.bounds, s.latency.prepare_counts),
            sum_value=s.latency.prepare_sum,
        )
        yield HistogramMetricFamily(
            "turnloom_render_seconds",
            "Time spent rendering a preparation in a worker thread, in seconds.",
            buckets=_buckets(s.latency.bounds, s.latency.render_counts),
            sum_value=s.latency.render_sum,
        )
        yield GaugeMetricFamily("turnloom_contexts", "Contexts held.", s.contexts)
        yield GaugeMetricFamily(
            "turnloom_invocations_in_flight", "Model calls in flight.", s.invocations
        )
        yield GaugeMetricFamily("turnloom_history_turns", "Turns held.", s.history.turns)
        yield GaugeMetricFamily("turnloom_history_items", "Messages held.", s.history.items)
        yield GaugeMetricFamily(
            "turnloom_history_bytes", "Serialized bytes of messages held.", s.history.bytes
        )
        yield GaugeMetricFamily(
            "turnloom_history_tokens",
            "Tokens of messages held, by the Foundation's token counter.",
            s.history.tokens,
        )
        yield CounterMetricFamily(
            "turnloom_evicted_turns", "Turns evicted from histories.", s.history.evicted_turns_total
        )
        yield CounterMetricFamily(
            "turnloom_evicted_items", "Messages evicted with them.", s.history.evicted_items_total
        )
        yield CounterMetricFamily(
            "turnloom_dropped_late_outputs",
            "Outputs recorded for turns no longer held, dropped.",
            s.history.dropped_late_outputs_total,
        )
        yield CounterMetricFamily(
            "turnloom_dropped_blank_outputs",
            "Empty or whitespace-only outputs not recorded.",
            s.history.dropped_blank_outputs_total,
        )
        yield CounterMetricFamily(
            "turnloom_duplicate_outputs",
            "Outputs recorded again with the same id and content, stored once.",
            s.history.duplicate_outputs_total,
        )
        yield CounterMetricFamily(
            "turnloom_unrendered_messages",
            "Messages held that the gateway renders to nothing, left out of every input.",
            s.history.unrendered_messages_total,
        )
        yield CounterMetricFamily(
            "turnloom_retracted_turns",
            "Turns taken back because they produced no answer.",
            s.history.retracted_turns_total,
        )
        yield CounterMetricFamily(
            "turnloom_prefix_compared_bytes",
            "Bytes of previous prefixes compared with the next prefix of the same context.",
            s.prefix.bytes_total,
        )
        yield CounterMetricFamily(
            "turnloom_prefix_reused_bytes",
            "Of those, bytes reused byte for byte.",
            s.prefix.reused_bytes_total,
        )
        ratio = s.prefix.reused_bytes_total / s.prefix.bytes_total if s.prefix.bytes_total else 1.0
        yield GaugeMetricFamily(
            "turnloom_prefix_stability_ratio",
            "Share of previous prefix bytes reused byte for byte.",
            ratio,
        )
        yield CounterMetricFamily(
            "turnloom_prefix_compared_tokens",
            "Tokens of previous prefixes compared with the next prefix of the same context.",
            s.prefix.tokens_total,
        )
        yield CounterMetricFamily(
            "turnloom_prefix_reused_tokens",
            "Of those, tokens of the reused parts (estimated by byte share).",
            s.prefix.reused_tokens_total,
        )
        share = GaugeMetricFamily(
            "turnloom_prompt_cache_share",
            "Share of each context's previous input that its next input repeats "
            "(what a provider's prefix cache could serve).",
            labels=["gateway", "unit"],
        )
        share.add_metric([s.prefix.gateway, "bytes"], ratio)
        tokens = s.prefix.tokens_total
        share.add_metric(
            [s.prefix.gateway, "tokens"], s.prefix.reused_tokens_total / tokens if tokens else 1.0
        )
        yield share
        yield GaugeMetricFamily(
            "turnloom_areas_attached",
            "Context Areas attached across contexts and not yet collected.",
            s.areas.attached,
        )
        yield CounterMetricFamily(
            "turnloom_areas_registered",
            "Context Areas attached with areas.attach.",
            s.areas.registered_total,
        )
        yield CounterMetricFamily(
            "turnloom_area_renders",
            "Area passes run (collection, then one unfold pass).",
            s.areas.renders_total,
        )
        yield CounterMetricFamily(
            "turnloom_area_passes_reused",
            "Preparations that reused the previous area section instead of running a pass.",
            s.areas.passes_reused_total,
        )
        yield CounterMetricFamily(
            "turnloom_areas_collected",
            "Context Areas removed by the Collector.",
            s.areas.collected_total,
        )
        yield CounterMetricFamily(
            "turnloom_area_items_reclaimed",
            "Native items reclaimed (detached) by the Collector.",
            s.areas.items_reclaimed_total,
        )
        yield CounterMetricFamily(
            "turnloom_area_items_promoted",
            "Native items appended for messages promoted by collected areas.",
            s.areas.items_promoted_total,
        )
        yield GaugeMetricFamily(
            "turnloom_output_streams", "Output streams being consumed.", s.outputs.streams
        )
        records = CounterMetricFamily(
            "turnloom_output_records", "Output stream records by outcome.", labels=["outcome"]
        )
        records.add_metric(["recorded"], s.outputs.records_total - s.outputs.dropped_total)
        records.add_metric(["dropped"], s.outputs.dropped_total)
        records.add_metric(["rejected"], s.outputs.rejected_total)
        yield records
        yield CounterMetricFamily(
            "turnloom_output_records_drained",
            "Output stream records recorded by the close's drain.",
            s.outputs.drained_total,
        )
        if s.store is not None:
            yield from _store_metrics(s.store)
        yield from _summary_metrics(s.summaries)
        a = s.assembly
        if a.strategy is None:
            return
        label = [a.strategy]
        for name, documentation, value in (
            ("turnloom_assemblies", "Turns assembled by the strategy.", a.assemblies_total),
            (
                "turnloom_assembly_reused",
                "Preparations that reused their turn's assembly.",
                a.reused_total,
            ),
            ("turnloom_assembly_failures", "Assemblies that raised.", a.failed_total),
            (
                "turnloom_hydrated_entries",
                "Memory entries recalled by assemblies and hydrate_context calls.",
                a.entries_total,
            ),
            (
                "turnloom_hydrate_context_calls",
                "hydrate_context calls answered.",
                a.tool_calls_total,
            ),
            (
                "turnloom_assembly_breakpoints_skipped",
                "Assembled prompts sent without their Anthropic cache breakpoint: "
                "the host's marks used the budget of 4.",
                a.breakpoints_skipped_total,
            ),
        ):
            family = CounterMetricFamily(name, documentation, labels=["strategy"])
            family.add_metric(label, value)
            yield family
        latency = HistogramMetricFamily(
            "turnloom_assembly_latency_seconds",
            "Time spent in the strategy's assemble, in seconds.",
            labels=["strategy"],
        )
        latency.add_metric(label, _buckets(a.bounds, a.latency_counts), sum_value=a.latency_sum)
        yield latency


def _summary_metrics(summaries: SummaryStatistics) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "turnloom_summarizations_running", "Summarizations in flight.", summaries.running
    )
    outcomes = CounterMetricFamily(
        "turnloom_summarizations",
        "Summarizations by outcome: started, finished (applied), failed, discarded.",
        labels=["outcome"],
    )
    outcomes.add_metric(["started"], summaries.started_total)
    outcomes.add_metric(["finished"], summaries.finished_total)
    outcomes.add_metric(["failed"], summaries.failed_total)
    outcomes.add_metric(["discarded"], summaries.discarded_total)
    yield outcomes
    for name, text, value in (
        (
            "turnloom_summarized_turns",
            "Held turns replaced by summary turns.",
            summaries.turns_summarized_total,
        ),
        (
            "turnloom_summarized_tokens",
            "Tokens the summarized turns held.",
            summaries.tokens_summarized_total,
        ),
        (
            "turnloom_summary_tokens",
            "Tokens the applied summaries hold.",
            summaries.summary_tokens_total,
        ),
        (
            "turnloom_pruned_turns",
            "Turns whose old tool output was pruned.",
            summaries.turns_pruned_total,
        ),
    ):
        yield CounterMetricFamily(name, text, value)
    latency = HistogramMetricFamily(
        "turnloom_summarizer_latency_seconds", "Time in the host's summarizer, in seconds."
    )
    latency.add_metric(
        [], _buckets(summaries.bounds, summaries.latency_counts), sum_value=summaries.latency_sum
    )
    yield latency


def _store_metrics(store: StoreStatistics) -> Iterator[Metric]:
    yield GaugeMetricFamily(
        "turnloom_store_contexts_claimed", "Contexts whose lease is held.", store.claimed
    )
    yield GaugeMetricFamily(
        "turnloom_store_pending_records",
        "Changes logged and not yet written to the store.",
        store.pending_records,
    )
    for name, text, value in (
        ("batches", "Write batches sent to the store.", store.batches_total),
        ("records_written", "Records the store accepted.", store.records_written_total),
        ("write_failures", "Write batches that failed.", store.write_failures_total),
        ("claims", "Leases taken.", store.claims_total),
        ("takeovers", "Claims that restored a stored context.", store.takeovers_total),
        ("leases_lost", "Leases lost to another owner or expiry.", store.leases_lost_total),
        ("idle_unloads", "Contexts that left memory idle.", store.idle_unloads_total),
        ("compactions", "Logs replaced by a checkpoint.", store.compactions_total),
    ):
        yield CounterMetricFamily(f"turnloom_store_{name}", text, value)


class MetricsServer:
    """A running ``/metrics`` endpoint; stop it with :meth:`close` or :meth:`aclose`.

    It is a context manager both ways: ``with serve_metrics(...) as server:``
    in synchronous code, ``async with serve_metrics(...) as server:`` on an
    event loop (asyncio or trio); leaving the block stops the server, and
    :meth:`aclose` waits for its thread in a worker thread so the loop keeps
    running meanwhile.

    Attributes:
        host: the address it listens on.
        port: the port it listens on (the real one when 0 was asked).
        registry: the registry it serves.
    """

    def __init__(
        self, server: WSGIServer, thread: threading.Thread, registry: CollectorRegistry
    ) -> None:
        self._server = server
        self._thread = thread
        self._closed = False
        self.registry = registry
        self.host = str(server.server_address[0])
        self.port = int(server.server_address[1])

    @property
    def url(self) -> str:
        """``http://host:port/metrics``."""
        return f"http://{self.host}:{self.port}/metrics"

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` or :meth:`aclose` has run; the port is then released."""
        return self._closed

    def close(self) -> None:
        """Stop serving and wait for the server thread (idempotent).

        Blocks up to about half a second (the server's polling interval); on
        an event loop use :meth:`aclose`.
        """
        if self._closed:
            return
        self._closed = True
        self._server.shutdown()
        self._server.server_close()
        self._thread.join()

    async def aclose(self) -> None:
        """Stop serving, waiting for the server thread in a worker thread (idempotent).

        Cancellation:
            Not cancellable once started: a cancelled caller still gets the
            server stopped and its port released before the cancellation
            is delivered.
        """
        await anyio.to_thread.run_sync(self.close)

    def __enter__(self) -> MetricsServer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    async def __aenter__(self) -> MetricsServer:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.aclose()


def serve_metrics(
    statistics: Callable[[], ManagerStatistics], *, port: int = 0, host: str = "127.0.0.1"
) -> MetricsServer:
    """Serve a manager's metrics over HTTP with prometheus-client's WSGI server.

    A fresh registry holds only the :class:`ManagerCollector`, so several
    Foundations in one process never clash.

    Args:
        statistics: the snapshot source, usually ``foundation.manager.statistics``.
        port: the TCP port; 0 picks a free one (see :attr:`MetricsServer.port`).
        host: the address to listen on; loopback by default.

    Returns:
        the running server; stop it with :meth:`MetricsServer.close` (or
        :meth:`~MetricsServer.aclose`), or use it as a context manager
        (``with`` or ``async with``).

    Raises:
        OSError: the address cannot be bound (for example, the port is taken).
    """
    registry = CollectorRegistry(auto_describe=False)
    registry.register(ManagerCollector(statistics))
    server, thread = start_http_server(port, addr=host, registry=registry)
    return MetricsServer(server, thread, registry)
