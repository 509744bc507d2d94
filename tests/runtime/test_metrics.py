"""Prometheus metrics: a real scrape of the endpoint over loopback."""

from __future__ import annotations

import urllib.request

import anyio
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.areas import OneShotNotice
from turnloom.context.history import HistoryLimits
from turnloom.context.tokens import ApproxTokenCounter
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.metrics import serve_metrics

pytestmark = pytest.mark.anyio


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_the_metrics_endpoint_serves_the_manager_statistics() -> None:
    async with Foundation(history_limits=HistoryLimits(max_turns=1)) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(user("a"),), instructions=(SYSTEM,))
        )
        # A two-message notice is rendered by the first prepare, then routed
        # output lands after it; the second prepare's Collector reclaims all 3.
        manager.areas.attach("c", OneShotNotice((user("notice 1"), user("notice 2"))))
        first = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert first.area_items == 2
        manager.areas.route("c", {"role": "assistant", "content": "routed"})
        manager.record("c", "t1", [assistant("A"), assistant(" ")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("b"),)))
        second = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        manager.record("c", "t1", [assistant("late")])
        # t1 is held aside (t2's retraction would restore it) until t2 changes.
        assert manager.statistics().history.evicted_turns_total == 0
        manager.record("c", "t2", [assistant(" ")])  # blank: nothing changes
        assert manager.statistics().history.evicted_turns_total == 0
        manager.record("c", "t2", [assistant("B")])
        server = serve_metrics(manager.statistics)
        try:
            assert server.host == "127.0.0.1"
            samples = await anyio.to_thread.run_sync(_scrape, server.url)
        finally:
            server.close()
    stats = manager.statistics()
    expected_reused = len(b'{"role":"system","content":"You are an airline agent."}')
    assert second.reused_bytes == expected_reused  # t1 was evicted after the system prompt
    assert samples[("turnloom_preparations_total", (("outcome", "prepared"),))] == 2
    assert samples[("turnloom_preparations_total", (("outcome", "failed"),))] == 0
    assert samples[("turnloom_preparations_capacity", ())] == 16
    assert samples[("turnloom_preparations_pending", ())] == 0
    assert samples[("turnloom_prepare_latency_seconds_count", ())] == 2
    assert samples[("turnloom_render_seconds_count", ())] == 2
    assert samples[("turnloom_prepare_latency_seconds_bucket", (("le", "+Inf"),))] == 2
    assert samples[("turnloom_history_turns", ())] == 1
    assert samples[("turnloom_history_items", ())] == 2
    held = ApproxTokenCounter().count([user("b"), assistant("B")])
    assert samples[("turnloom_history_tokens", ())] == held == 5 + 7
    assert samples[("turnloom_evicted_turns_total", ())] == 1
    assert samples[("turnloom_evicted_items_total", ())] == 2
    assert samples[("turnloom_dropped_late_outputs_total", ())] == 1
    assert samples[("turnloom_dropped_blank_outputs_total", ())] == 2
    assert samples[("turnloom_prefix_compared_bytes_total", ())] == first.bytes
    assert samples[("turnloom_prefix_reused_bytes_total", ())] == expected_reused
    assert samples[("turnloom_prefix_stability_ratio", ())] == pytest.approx(
        expected_reused / first.bytes
    )
    assert stats.prefix.reused_bytes_total == expected_reused
    assert second.area_items == 0
    assert samples[("turnloom_areas_registered_total", ())] == 1
    assert samples[("turnloom_areas_attached", ())] == 0
    assert samples[("turnloom_area_renders_total", ())] == 2
    assert samples[("turnloom_area_passes_reused_total", ())] == 0
    assert samples[("turnloom_areas_collected_total", ())] == 1
    assert samples[("turnloom_area_items_reclaimed_total", ())] == 3  # 2 notice items + 1 routed
    assert samples[("turnloom_area_items_promoted_total", ())] == 0
    assert stats.areas.items_reclaimed_total == 3


async def test_assembly_metrics_are_labelled_by_strategy_only() -> None:
    """Assembly latency and hydrated entries per strategy; no tenant or context label."""
    from turnloom.context import TenantScope
    from turnloom.stores import SQLiteMemory

    scope = TenantScope(tenant_id="acme")
    with SQLiteMemory() as memory:
        memory.add("window seat preference", scope=scope)
        memory.add("window upgrade request", scope=scope)
        async with Foundation(strategy="stratified", memory=memory) as foundation:
            manager = foundation.manager
            for n in (1, 2):
                manager.accept_turn(
                    TurnSnapshot(context_id=f"c{n}", turn_id="t1", input=(user("window"),))
                )
                request = ContextPrepareRequest(context_id=f"c{n}", turn_id="t1", tenant=scope)
                await manager.prepare(request)
                await manager.prepare(request)
            server = serve_metrics(manager.statistics)
            try:
                samples = await anyio.to_thread.run_sync(_scrape, server.url)
            finally:
                server.close()
    label = (("strategy", "stratified"),)
    assert samples[("turnloom_assemblies_total", label)] == 2
    assert samples[("turnloom_assembly_reused_total", label)] == 2
    assert samples[("turnloom_hydrated_entries_total", label)] == 4
    assert samples[("turnloom_hydrate_context_calls_total", label)] == 0
    assert samples[("turnloom_assembly_failures_total", label)] == 0
    assert samples[("turnloom_assembly_latency_seconds_count", label)] == 2
    labels = {
        key for name, labels in samples for key, _ in labels if name.startswith("turnloom_assem")
    }
    assert labels <= {"strategy", "le"}


async def test_no_assembly_families_without_a_strategy() -> None:
    async with Foundation() as foundation:
        server = serve_metrics(foundation.manager.statistics)
        try:
            samples = await anyio.to_thread.run_sync(_scrape, server.url)
        finally:
            server.close()
    assert not any(name.startswith("turnloom_assembl") for name, _ in samples)


def _refuses_connections(host: str, port: int) -> bool:
    import socket

    try:
        socket.create_connection((host, port), timeout=5).close()
    except ConnectionRefusedError:
        return True
    return False


async def test_async_with_serves_inside_the_block_and_releases_the_port_on_exit() -> None:
    """``async with serve_metrics(...)`` scrapes inside; on exit the server is closed."""
    async with Foundation() as foundation:
        async with serve_metrics(foundation.manager.statistics) as server:
            assert not server.closed
            samples = await anyio.to_thread.run_sync(_scrape, server.url)
        assert server.closed
        assert await anyio.to_thread.run_sync(_refuses_connections, server.host, server.port)
        await server.aclose()  # idempotent
        assert server.closed
    assert samples[("turnloom_preparations_pending", ())] == 0


async def test_with_closes_the_server_even_when_the_block_raises() -> None:
    """The synchronous ``with`` form closes the server when its body raises."""
    async with Foundation() as foundation:
        with pytest.raises(KeyError), serve_metrics(foundation.manager.statistics) as server:
            samples = await anyio.to_thread.run_sync(_scrape, server.url)
            raise KeyError("boom")
        assert server.closed
        assert await anyio.to_thread.run_sync(_refuses_connections, server.host, server.port)
        server.close()  # idempotent
    assert samples[("turnloom_preparations_capacity", ())] == 16
