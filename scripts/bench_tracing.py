"""What OpenTelemetry tracing costs a prepare (and a build), measured in one run.

Three modes, taking turns round-robin (the order rotating each round) so
load elsewhere on the machine affects them alike:

* ``absent``: the path turnloom takes when ``opentelemetry`` is not installed
  (``_tracing.TRACER`` is None: every span a no-op);
* ``api``: the ``otel`` extra installed and no SDK configured (the API's proxy
  tracer hands out non-recording spans);
* ``sdk``: an SDK ``TracerProvider`` exporting every span to memory through a
  ``SimpleSpanProcessor`` (the exporter is emptied between rounds).

Two contexts of 1,000 history items: one on the built-in OpenAI Chat gateway
(a prepare renders inline on the loop) and one on a subclass of it (not a
built-in gateway, so it renders in a worker thread: the render span crosses
the thread).
Each round commits a turn, times ``prepare`` end to end, times ``build`` of a
three-message continuation, and records the turn. Medians are printed, with
each mode's ratio to ``absent``.

Usage: python scripts/bench_tracing.py [--rounds R] [--backend asyncio|trio]
"""

from __future__ import annotations

import argparse
import statistics
import time
from contextlib import AsyncExitStack

import anyio
from bench_prepare import bench_turn
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from turnloom.context import Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.context.gateways import OpenAIChatGateway
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextPrepareRequest, Foundation, _tracing

SIZE = 1_000
MODES = ("absent", "api", "sdk")


class _WorkerChat(OpenAIChatGateway):
    """OpenAI Chat, not a built-in gateway: its prepares render in a worker thread."""


def _outputs(n: int) -> list[Message]:
    call_id = f"call_{n}"
    return [
        Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id=call_id, name="lookup", arguments=f'{{"id": {n}}}'),),
        ),
        Message(
            role=Role.tool,
            content=(ToolResultPart(call_id=call_id, content=(TextPart(text=f'{{"row": {n}}}'),)),),
        ),
        Message(role=Role.assistant, content=f"Row {n} is fine."),
    ]


class _Context:
    """One Foundation holding one context of SIZE items (the oldest turn evicted)."""

    def __init__(self, where: str, foundation: Foundation) -> None:
        self.where = where
        self.manager = foundation.manager
        self.turn = 0
        self.samples: dict[str, list[tuple[float, float]]] = {mode: [] for mode in MODES}

    async def one_turn(self) -> tuple[float, float]:
        manager = self.manager
        turn_id = f"t{self.turn}"
        manager.accept_turn(bench_turn(self.turn, ask="Check row", system="Be brief."))
        began = time.perf_counter()
        prefix = await manager.prepare(ContextPrepareRequest(context_id="bench", turn_id=turn_id))
        prepared = time.perf_counter()
        outputs = _outputs(self.turn)
        manager.build(prefix, outputs)
        built = time.perf_counter()
        manager.record("bench", turn_id, outputs)
        self.turn += 1
        return prepared - began, built - prepared


async def measure(rounds: int) -> tuple[dict[str, dict[str, tuple[float, float]]], int]:
    """Median (prepare, build) seconds per render path and mode; the spans the SDK exported."""
    api_tracer = _tracing.TRACER
    assert api_tracer is not None, "needs the otel extra: pip install 'turnloom[otel]'"
    assert isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider), (
        "a tracer provider is already configured: the api mode would not be 'no SDK'"
    )
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracers = {"absent": None, "api": api_tracer, "sdk": provider.get_tracer("turnloom")}
    exported = 0
    async with AsyncExitStack() as stack:
        contexts = []
        limits = HistoryLimits(max_turns=SIZE, max_items=SIZE, max_bytes=1 << 40)
        for where, gateway in (("inline", "openai_chat"), ("worker thread", _WorkerChat())):
            foundation = await stack.enter_async_context(
                Foundation(gateway=gateway, history_limits=limits)
            )
            context = _Context(where, foundation)
            _tracing.TRACER = None
            while context.manager.statistics().history.items < SIZE:
                await context.one_turn()
            contexts.append(context)
        for warm_up in (True, False):
            for round_ in range(20 if warm_up else rounds):
                # The order rotates each round: no mode always follows the SDK's garbage.
                for mode in MODES[round_ % 3 :] + MODES[: round_ % 3]:
                    _tracing.TRACER = tracers[mode]
                    for context in contexts:
                        sample = await context.one_turn()
                        if not warm_up:
                            context.samples[mode].append(sample)
                    exported += len(exporter.get_finished_spans())
                    exporter.clear()
        _tracing.TRACER = api_tracer
    provider.shutdown()
    return {
        context.where: {
            mode: (
                statistics.median(s[0] for s in samples),
                statistics.median(s[1] for s in samples),
            )
            for mode, samples in context.samples.items()
        }
        for context in contexts
    }, exported


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=500)
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    args = parser.parse_args()
    results, exported = anyio.run(measure, args.rounds, backend=args.backend)
    print(
        f"backend {args.backend}, {SIZE:,} history items, {args.rounds} rounds per mode, "
        f"medians; spans exported: {exported:,}"
    )
    for where, modes in results.items():
        base_prepare, base_build = modes["absent"]
        for mode, (prepare, build) in modes.items():
            print(
                f"{where:>13} {mode:>6}: prepare {prepare * 1e6:8.1f} us "
                f"({prepare / base_prepare:.2f}x)   build {build * 1e6:7.1f} us "
                f"({build / base_build:.2f}x)"
            )


if __name__ == "__main__":
    main()
