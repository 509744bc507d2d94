"""OpenTelemetry spans (the ``otel`` extra): names, parents, bounded attributes, cancellation.

Spans are read with the SDK's ``InMemorySpanExporter``. Each test gives
``turnloom.runtime._tracing`` a tracer of its own provider (the process's
global provider is left alone); one subprocess test goes through the global
provider, as a host configures it, and one runs without ``opentelemetry`` at
all. Invariants: a prepare is one trace ``turnloom.prepare`` with its phases
as children (the render's parent passed to the worker thread explicitly); a
cancelled prepare ends its span with status ERROR and ``error.type``
``cancelled``; no span carries message text, tenant or turn ids, and a
context id only hashed.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest

pytest.importorskip("opentelemetry.sdk")

from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode

from tests.runtime.helpers import SYSTEM, BlockingGateway, assistant, call, result, user
from turnloom.errors import InvalidMessageError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot, _tracing
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]
SECRET = "my card number is 4111"  # message text: must appear in no span
CONTEXT = "caller-42"
CONTEXT_HASH = hashlib.sha256(CONTEXT.encode()).hexdigest()[:16]
PREPARE_PHASES = ["turnloom.prepare.queue", "turnloom.render", "turnloom.prepare.deliver"]


@pytest.fixture
def spans(monkeypatch: pytest.MonkeyPatch) -> Iterator[InMemorySpanExporter]:
    """turnloom's tracer replaced by one exporting to memory, for this test only."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(_tracing, "TRACER", provider.get_tracer("turnloom"))
    yield exporter
    provider.shutdown()


def _by_name(exporter: InMemorySpanExporter) -> dict[str, list[ReadableSpan]]:
    found: dict[str, list[ReadableSpan]] = {}
    for span in exporter.get_finished_spans():
        found.setdefault(span.name, []).append(span)
    return found


def _one(found: dict[str, list[ReadableSpan]], name: str) -> ReadableSpan:
    assert len(found[name]) == 1, found[name]
    return found[name][0]


def _parent_id(span: ReadableSpan) -> int | None:
    return span.parent.span_id if span.parent is not None else None


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    span_id: int = span.context.span_id
    return span_id


def _no_text_in(exporter: InMemorySpanExporter) -> None:
    """No attribute of any span holds message text, the raw context id or a turn id."""
    for span in exporter.get_finished_spans():
        for value in dict(span.attributes or {}).values():
            assert not (isinstance(value, str) and (SECRET in value or CONTEXT in value))
            assert value not in ("t1", "t2")
        assert not span.events  # no exception event: its message could quote host data


def _commit(manager: object, turn_id: str = "t1") -> None:
    manager.accept_turn(  # type: ignore[attr-defined]
        TurnSnapshot(
            context_id=CONTEXT, turn_id=turn_id, input=(user(SECRET),), instructions=(SYSTEM,)
        )
    )


async def test_a_worker_thread_prepare_is_one_span_with_its_phases_as_children(
    spans: InMemorySpanExporter,
) -> None:
    """queue -> render (in the worker thread, parent passed explicitly) -> deliver; the
    prepare's parent is the host's span; exact attributes; phases in time order."""
    async with Foundation(gateway=BlockingGateway()) as foundation:
        manager = foundation.manager
        _commit(manager)
        tracer = _tracing.TRACER
        assert tracer is not None
        with tracer.start_as_current_span("host.turn") as host:
            prepared = await manager.prepare(
                ContextPrepareRequest(context_id=CONTEXT, turn_id="t1")
            )
    found = _by_name(spans)
    assert sorted(found) == sorted(["host.turn", "turnloom.prepare", *PREPARE_PHASES])
    prepare = _one(found, "turnloom.prepare")
    assert _parent_id(prepare) == host.get_span_context().span_id
    for name in PREPARE_PHASES:
        phase = _one(found, name)
        assert _parent_id(phase) == _span_id(prepare), name
        assert phase.context is not None and prepare.context is not None
        assert phase.context.trace_id == prepare.context.trace_id
    assert dict(prepare.attributes or {}) == {
        "turnloom.gateway": "openai_chat",
        "turnloom.context.hash": CONTEXT_HASH,
        "turnloom.items": prepared.item_count,
        "turnloom.bytes": prepared.bytes,
        "turnloom.inline": False,
    }
    assert prepared.item_count == 2  # the system instructions, the user message
    render = _one(found, "turnloom.render")
    assert dict(render.attributes or {}) == {
        "turnloom.gateway": "openai_chat",
        "turnloom.inline": False,
    }
    queue, deliver = _one(found, "turnloom.prepare.queue"), _one(found, "turnloom.prepare.deliver")
    assert prepare.start_time is not None and prepare.end_time is not None
    assert queue.start_time is not None and queue.end_time is not None
    assert render.start_time is not None and render.end_time is not None
    assert deliver.start_time is not None and deliver.end_time is not None
    assert prepare.start_time <= queue.start_time <= queue.end_time <= render.start_time
    assert render.end_time == deliver.start_time <= deliver.end_time <= prepare.end_time
    assert {s.status.status_code for s in spans.get_finished_spans()} == {StatusCode.UNSET}
    _no_text_in(spans)


async def test_an_inline_prepare_marks_its_render_inline(spans: InMemorySpanExporter) -> None:
    """A built-in gateway and a short history render on the loop: ``turnloom.inline`` True."""
    async with Foundation(gateway="anthropic") as foundation:
        manager = foundation.manager
        _commit(manager)
        prepared = await manager.prepare(ContextPrepareRequest(context_id=CONTEXT, turn_id="t1"))
    found = _by_name(spans)
    assert sorted(found) == sorted(["turnloom.prepare", *PREPARE_PHASES])
    assert dict(_one(found, "turnloom.render").attributes or {}) == {
        "turnloom.gateway": "anthropic",
        "turnloom.inline": True,
    }
    assert dict(_one(found, "turnloom.prepare").attributes or {}) == {
        "turnloom.gateway": "anthropic",
        "turnloom.context.hash": CONTEXT_HASH,
        "turnloom.items": prepared.item_count,
        "turnloom.bytes": prepared.bytes,
        "turnloom.inline": True,
    }
    _no_text_in(spans)


async def test_a_prepare_cancelled_mid_render_ends_its_span_as_cancelled(
    spans: InMemorySpanExporter,
) -> None:
    """The prepare span ends when the requester leaves (ERROR, ``error.type`` cancelled);
    the render span ends when the worker thread returns, still the prepare's child;
    nothing is delivered."""
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        _commit(manager)
        gateway.hold = True
        with anyio.CancelScope() as scope:

            async def cancel_when_rendering() -> None:
                await anyio.to_thread.run_sync(gateway.entered.wait, 10)
                scope.cancel()

            async with anyio.create_task_group() as group:
                group.start_soon(cancel_when_rendering)
                # A loop budget renders the state pair: the render calls the gateway.
                await manager.prepare(
                    ContextPrepareRequest(context_id=CONTEXT, turn_id="t1", loop_budget=1)
                )
        assert scope.cancelled_caught
        prepare = _one(_by_name(spans), "turnloom.prepare")
        assert "turnloom.render" not in _by_name(spans)  # the thread still renders
        gateway.hold = False
        gateway.release.set()
        with anyio.fail_after(10):
            while manager.statistics().preparations.pending:
                await anyio.sleep(0.005)
    found = _by_name(spans)
    assert sorted(found) == ["turnloom.prepare", "turnloom.prepare.queue", "turnloom.render"]
    assert prepare.status.status_code is StatusCode.ERROR
    assert prepare.status.description == "cancelled"
    assert dict(prepare.attributes or {}) == {
        "turnloom.gateway": "openai_chat",
        "turnloom.context.hash": CONTEXT_HASH,
        "error.type": "cancelled",
    }
    render = _one(found, "turnloom.render")
    assert _parent_id(render) == _span_id(prepare)
    assert render.status.status_code is StatusCode.UNSET
    assert render.end_time is not None and prepare.end_time is not None
    assert render.end_time > prepare.end_time
    _no_text_in(spans)


async def test_a_prepare_cancelled_waiting_for_its_turn_ends_as_cancelled(
    spans: InMemorySpanExporter,
) -> None:
    """A turn never committed: only the prepare span, ERROR, no phase began."""
    async with Foundation() as foundation:
        with anyio.move_on_after(0.05):
            await foundation.manager.prepare(
                ContextPrepareRequest(context_id=CONTEXT, turn_id="t2")
            )
    found = _by_name(spans)
    assert sorted(found) == ["turnloom.prepare"]
    prepare = found["turnloom.prepare"][0]
    assert prepare.status.status_code is StatusCode.ERROR
    assert dict(prepare.attributes or {})["error.type"] == "cancelled"


async def test_a_refused_request_ends_its_span_with_the_error_type_and_no_hash(
    spans: InMemorySpanExporter,
) -> None:
    """A context id that is not a str: the typed error still comes first, the span names
    its class, and nothing of the bad value is hashed or recorded."""
    async with Foundation() as foundation:
        with pytest.raises(InvalidMessageError):
            await foundation.manager.prepare(
                ContextPrepareRequest(context_id=7, turn_id="t1")  # type: ignore[arg-type]
            )
    prepare = _one(_by_name(spans), "turnloom.prepare")
    assert dict(prepare.attributes or {}) == {
        "turnloom.gateway": "openai_chat",
        "error.type": "turnloom.errors.InvalidMessageError",
    }
    assert prepare.status.description == "turnloom.errors.InvalidMessageError"


async def test_build_and_request_bytes_spans_count_items_and_bytes(
    spans: InMemorySpanExporter,
) -> None:
    async with Foundation(gateway="gemini") as foundation:
        manager = foundation.manager
        _commit(manager)
        prefix = await manager.prepare(ContextPrepareRequest(context_id=CONTEXT, turn_id="t1"))
        spans.clear()
        continuation = [call("c1"), result("c1", SECRET), assistant("done")]
        items = manager.build(prefix, continuation)
        body = manager.request_bytes(prefix, continuation)
    found = _by_name(spans)
    assert sorted(found) == ["turnloom.build", "turnloom.request_bytes"]
    assert dict(_one(found, "turnloom.build").attributes or {}) == {
        "turnloom.gateway": "gemini",
        "turnloom.continuation": 3,
        "turnloom.items": len(items),
    }
    assert dict(_one(found, "turnloom.request_bytes").attributes or {}) == {
        "turnloom.gateway": "gemini",
        "turnloom.continuation": 3,
        "turnloom.bytes": len(body),
    }
    _no_text_in(spans)


async def test_an_assembly_is_a_child_span_of_its_prepare(spans: InMemorySpanExporter) -> None:
    async with Foundation(strategy="stratified") as foundation:
        manager = foundation.manager
        _commit(manager)
        await manager.prepare(ContextPrepareRequest(context_id=CONTEXT, turn_id="t1"))
    found = _by_name(spans)
    assert sorted(found) == sorted(["turnloom.prepare", "turnloom.assembly", *PREPARE_PHASES])
    prepare, assembly = _one(found, "turnloom.prepare"), _one(found, "turnloom.assembly")
    assert _parent_id(assembly) == _span_id(prepare)
    assert dict(assembly.attributes or {}) == {"turnloom.strategy": "stratified"}
    assert dict(prepare.attributes or {})["turnloom.strategy"] == "stratified"
    assert dict(prepare.attributes or {})["turnloom.inline"] is False


async def test_store_claim_flush_and_write_spans(
    spans: InMemorySpanExporter, tmp_path: Path
) -> None:
    """claim and flush are the host's spans; the writer's batch is a root span of its own."""
    async with (
        open_context_store(f"sqlite:{tmp_path}/contexts.db") as store,
        Foundation(store=store) as foundation,
    ):
        manager = foundation.manager
        assert await manager.leases.claim(CONTEXT) is True
        _commit(manager)
        await manager.leases.flush(CONTEXT)
    found = _by_name(spans)
    claim = _one(found, "turnloom.store.claim")
    assert dict(claim.attributes or {}) == {
        "db.system.name": "sqlite",
        "turnloom.context.hash": CONTEXT_HASH,
        "turnloom.store.acquired": True,
    }
    flush = _one(found, "turnloom.store.flush")
    assert dict(flush.attributes or {}) == {
        "db.system.name": "sqlite",
        "turnloom.context.hash": CONTEXT_HASH,
    }
    writes = found["turnloom.store.write"]
    assert all(w.parent is None for w in writes)
    assert sum(dict(w.attributes or {})["turnloom.store.records"] for w in writes) == 1  # type: ignore[misc]
    assert {dict(w.attributes or {})["db.system.name"] for w in writes} == {"sqlite"}
    _no_text_in(spans)


async def test_without_a_tracer_nothing_is_traced_and_prepare_works(
    spans: InMemorySpanExporter, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The no-op path the package's absence takes (``TRACER`` None)."""
    monkeypatch.setattr(_tracing, "TRACER", None)
    async with Foundation(gateway=BlockingGateway()) as foundation:
        manager = foundation.manager
        _commit(manager)
        prepared = await manager.prepare(ContextPrepareRequest(context_id=CONTEXT, turn_id="t1"))
        manager.build(prepared, [assistant("ok")])
    assert prepared.item_count == 2
    assert spans.get_finished_spans() == ()


_GLOBAL_PROVIDER = """
import anyio
import turnloom  # imported before the host configures tracing
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

exporter = InMemorySpanExporter()
provider = TracerProvider()
provider.add_span_processor(SimpleSpanProcessor(exporter))
trace.set_tracer_provider(provider)

async def main():
    async with turnloom.Foundation() as foundation:
        m = foundation.manager
        m.accept_turn(turnloom.TurnSnapshot(context_id="c", turn_id="t1",
            input=(turnloom.Message(role="user", content="hi"),)))
        await m.prepare(turnloom.ContextPrepareRequest(context_id="c", turn_id="t1"))

anyio.run(main, backend=BACKEND)
spans = exporter.get_finished_spans()
print(sorted(s.name for s in spans), {s.instrumentation_scope.name for s in spans})
"""

_ABSENT = """
import sys
sys.modules["opentelemetry"] = None  # as if the otel extra were not installed
import anyio
import turnloom
from turnloom.runtime import _tracing

async def main():
    async with turnloom.Foundation() as foundation:
        m = foundation.manager
        m.accept_turn(turnloom.TurnSnapshot(context_id="c", turn_id="t1",
            input=(turnloom.Message(role="user", content="hi"),)))
        p = await m.prepare(turnloom.ContextPrepareRequest(context_id="c", turn_id="t1"))
        print(_tracing.ENABLED, _tracing.TRACER, p.item_count)

anyio.run(main, backend=BACKEND)
"""


def _python(code: str, backend: str) -> str:
    done = subprocess.run(
        [sys.executable, "-c", code.replace("BACKEND", repr(backend))],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        timeout=120,
    )
    assert (done.returncode, done.stderr) == (0, "")
    return done.stdout


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_spans_go_to_the_global_provider_even_one_set_after_import(backend: str) -> None:
    assert _python(_GLOBAL_PROVIDER, backend) == (
        "['turnloom.prepare', 'turnloom.prepare.deliver', 'turnloom.prepare.queue', "
        "'turnloom.render'] {'turnloom'}\n"
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_without_the_package_turnloom_imports_and_prepares(backend: str) -> None:
    assert _python(_ABSENT, backend) == "False None 1\n"


def test_the_api_proxy_without_a_provider_is_not_asked_for_spans(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With ``opentelemetry-api`` and no provider set, the proxy tracer would hand out
    non-recording spans: the span helpers skip it (no span is started), and a provider
    set later is used at once (the proxy then records)."""
    from opentelemetry import trace

    proxy = trace.ProxyTracer("turnloom")
    monkeypatch.setattr(_tracing, "TRACER", proxy)
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", None)
    asked: list[str] = []
    start_span = trace.ProxyTracer.start_span

    def counted(self: trace.ProxyTracer, name: str, *args: object, **kwargs: object) -> object:
        asked.append(name)
        return start_span(self, name, *args, **kwargs)

    monkeypatch.setattr(trace.ProxyTracer, "start_span", counted)
    assert _tracing.prepare_span("openai_chat", None, None) is _tracing._NO_PREPARE
    assert _tracing.span("turnloom.assembly", {}) is _tracing._NO_SPAN
    assert asked == []

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    monkeypatch.setattr(trace, "_TRACER_PROVIDER", provider)
    with _tracing.span("turnloom.assembly", {"turnloom.strategy": "jit"}):
        pass
    assert asked == ["turnloom.assembly"]
    assert [span.name for span in exporter.get_finished_spans()] == ["turnloom.assembly"]
