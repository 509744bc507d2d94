"""Hostile metrics: many contexts created, churned and removed, scraped over loopback.

Contracts (turnloom/runtime/metrics.py, docs/observability.md): counters never go
down, gauges of what is held return to their idle values once every context is
removed, and labels are bounded ("labelled by strategy name only").
"""

from __future__ import annotations

import urllib.request

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.context.history import HistoryLimits
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.metrics import serve_metrics

pytestmark = pytest.mark.anyio

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def _scrape(url: str) -> tuple[Samples, dict[str, str]]:
    with urllib.request.urlopen(url, timeout=10) as response:
        text = response.read().decode()
    samples: Samples = {}
    types: dict[str, str] = {}
    for family in text_string_to_metric_families(text):
        types[family.name] = family.type
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples, types


async def _churn(manager, prefix: str, contexts: int) -> None:  # type: ignore[no-untyped-def]
    for i in range(contexts):
        cid = f"{prefix}-{i}"
        for t in range(4):
            snap = TurnSnapshot(
                context_id=cid,
                turn_id=f"t{t}",
                input=(user(f"question {t} of {cid}"),),
                instructions=(SYSTEM,) if t == 0 else (),
            )
            manager.accept_turn(snap)
            await manager.prepare(ContextPrepareRequest(context_id=cid, turn_id=f"t{t}"))
            manager.record(cid, f"t{t}", [assistant(f"answer {t}"), assistant(" ")])
        manager.remove_context(cid)
        manager.record(cid, "t3", [assistant("late")])  # dropped: the context is gone


async def test_counters_never_go_down_and_held_gauges_return_to_idle_after_removals() -> None:
    # Holds on the current code.
    async with Foundation(history_limits=HistoryLimits(max_turns=2)) as foundation:
        manager = foundation.manager
        server = serve_metrics(manager.statistics)
        try:
            idle, types = await anyio.to_thread.run_sync(_scrape, server.url)
            previous = idle
            for round_ in range(3):
                await _churn(manager, f"r{round_}", 40)
                now, types = await anyio.to_thread.run_sync(_scrape, server.url)
                for key, value in now.items():
                    base = key[0].removesuffix("_total").removesuffix("_bucket")
                    base = base.removesuffix("_count").removesuffix("_sum")
                    if types.get(base) in ("counter", "histogram") and key in previous:
                        assert value >= previous[key], key
                previous = now
        finally:
            server.close()
    for gauge in (
        "turnloom_contexts",
        "turnloom_history_turns",
        "turnloom_history_items",
        "turnloom_history_bytes",
        "turnloom_history_tokens",
        "turnloom_preparations_pending",
        "turnloom_invocations_in_flight",
        "turnloom_areas_attached",
    ):
        assert previous[(gauge, ())] == idle[(gauge, ())] == 0, gauge
    assert previous[("turnloom_preparations_total", (("outcome", "prepared"),))] == 3 * 40 * 4
    assert previous[("turnloom_dropped_late_outputs_total", ())] == 3 * 40
    assert previous[("turnloom_dropped_blank_outputs_total", ())] == 3 * 40 * 4
    # Bounded label sets: no context id reaches a label.
    labels = {value for key in previous for _, value in key[1]}
    assert not any(label.startswith(("r0-", "r1-", "r2-")) for label in labels)
