"""OpenTelemetry spans of the runtime: the one module that imports ``opentelemetry``.

Optional (the ``otel`` extra installs ``opentelemetry-api`` only). Without the
package every call here is a no-op costing one attribute test; with it and no
SDK configured, each traced operation asks the API for a span, finds it does
not record and does nothing more. Spans go to the global tracer provider the
host configures (``opentelemetry.trace.set_tracer_provider``), even one set
after turnloom was imported; the instrumentation scope is ``turnloom``.

The spans (kind INTERNAL), their parents and their attributes:

=============================  ====================================  ===========================
span                           covers                                attributes
=============================  ====================================  ===========================
``turnloom.prepare``           one ``prepare``/``prepare_nowait``    gateway, context hash,
                               call, in the requester's task         strategy; at the end items,
                                                                     bytes, inline
``turnloom.prepare.queue``     child: from the call until the turn   --
                               is held (a slot, the commit)
``turnloom.assembly``          child: the strategy's ``assemble``    strategy, memory entries
``turnloom.render``            child: the render, in a worker        gateway, inline
                               thread or inline on the loop
``turnloom.prepare.deliver``   child: from the render's end until    --
                               the requester resumes with it
``turnloom.build``             ``build``                             gateway, continuation
                                                                     messages, items
``turnloom.request_bytes``     ``request_bytes``                     gateway, continuation
                                                                     messages, bytes
``turnloom.request_body``      ``request_body``                      gateway, continuation
                                                                     messages
``turnloom.store.claim``       ``manager.leases.claim``              db.system.name, context
                                                                     hash, acquired
``turnloom.store.flush``       ``manager.leases.flush``              db.system.name, context
                                                                     hash (when one is named)
``turnloom.store.write``       one batch of the store's writer       db.system.name, records
                               task (a root span: it serves every
                               flush waiting for it)
=============================  ====================================  ===========================

Attribute names: ``turnloom.gateway``, ``turnloom.strategy``,
``turnloom.context.hash``, ``turnloom.items``, ``turnloom.bytes``,
``turnloom.continuation``, ``turnloom.inline``, ``turnloom.assembly.entries``,
``turnloom.store.acquired``, ``turnloom.store.records``, ``turnloom.handed_off``
(on an inline render that found more work than the loop may take: a worker
thread's render span follows it) and the semantic conventions'
``db.system.name`` and ``error.type``. Every value is bounded: a
name from a fixed set, a count or a bool. Message text, tool arguments,
tenant and turn ids never go into a span; a context id only as
``turnloom.context.hash``, the first 16 hex digits of its SHA-256 (a
pseudonym that joins the spans of one conversation: an id an attacker can
guess can be confirmed against it, so do not treat it as a secret).

A span that ends by an exception has status ERROR and ``error.type`` the
exception's qualified class name (its message is not recorded: it may quote
host data); a cancelled operation has ``error.type`` ``cancelled`` on both
backends (asyncio's ``CancelledError``, trio's ``Cancelled``).

Threads: the render span is started in the worker thread as a child of the
prepare span, whose context is passed to the thread explicitly; it is never
made current there, so nothing leaks into the thread's context. A render
whose requester was cancelled keeps its span until the thread returns.
"""

from __future__ import annotations

__all__ = (
    "ENABLED",
    "NO_SPAN",
    "PrepareTrace",
    "build_span",
    "current_prepare",
    "hashed",
    "prepare_span",
    "queued",
    "render_span",
    "span",
    "store_span",
    "store_system",
)

import contextvars
import hashlib
import time
from collections.abc import Mapping, Sized
from types import TracebackType
from typing import TYPE_CHECKING

import anyio

from turnloom._version import __version__

try:
    from opentelemetry import context as otel_context
    from opentelemetry import trace
except ImportError:  # the otel extra is not installed: every span is a no-op
    otel_context = None  # type: ignore[assignment]
    trace = None  # type: ignore[assignment]

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer

    from turnloom.context.gateway import Gateway
    from turnloom.runtime.schemas import PreparedContext

_PROXY_TRACER: type | None = trace.ProxyTracer if trace is not None else None

ENABLED = trace is not None
"""Whether ``opentelemetry-api`` is importable (the ``otel`` extra)."""

TRACER: Tracer | None = trace.get_tracer("turnloom", __version__) if trace is not None else None
"""The tracer of every span; None without the extra. A proxy of the global
provider's, so a provider set later is used (replaced in tests and benchmarks)."""

Attributes = Mapping[str, str | bool | int]

_PREPARE: contextvars.ContextVar[PrepareTrace | None] = contextvars.ContextVar(
    "turnloom_prepare_trace", default=None
)


def hashed(context_id: str) -> str:
    """The ``turnloom.context.hash`` of a context id: 16 hex digits of its SHA-256."""
    return hashlib.sha256(context_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def _with_context(attributes: dict[str, str | bool | int], context_id: object) -> None:
    """Add ``turnloom.context.hash`` when ``context_id`` is a str (checked later, typed)."""
    if isinstance(context_id, str):
        attributes["turnloom.context.hash"] = hashed(context_id)


def store_span(
    name: str, store: object, context_id: object = None, *, root: bool = False
) -> _Span | _NoSpan:
    """A ``turnloom.store.*`` span: ``db.system.name``, and the context's hash when named."""
    started = _started(name, root=root)
    if started is None:
        return _NO_SPAN
    attributes: dict[str, str | bool | int] = {"db.system.name": store_system(store)}
    _with_context(attributes, context_id)
    started.set_attributes(attributes)
    return _Span(started)


def build_span(name: str, gateway: Gateway, continuation: object) -> _Span | _NoSpan:
    """A ``turnloom.build``, ``request_bytes`` or ``request_body`` span: gateway, continuation.

    ``continuation`` is as given (checked after, typed): its length is
    recorded when it has one.
    """
    started = _started(name)
    if started is None:
        return _NO_SPAN
    started.set_attribute("turnloom.gateway", gateway.type)
    if isinstance(continuation, Sized):
        started.set_attribute("turnloom.continuation", len(continuation))
    return _Span(started)


def store_system(store: object) -> str:
    """``db.system.name`` of a context store: ``sqlite``, ``redis``, or its class name."""
    name = type(store).__name__
    lowered = name.lower()
    for system in ("sqlite", "redis"):
        if system in lowered:
            return system
    return name


def _error_type(exc: BaseException) -> str:
    if isinstance(exc, anyio.get_cancelled_exc_class()):
        return "cancelled"
    kind = type(exc)
    return f"{kind.__module__}.{kind.__qualname__}"


def _fail(span: Span, exc: BaseException) -> None:
    """Mark ``span`` as ended by ``exc``: status ERROR, ``error.type``; no message."""
    assert trace is not None
    error = _error_type(exc)
    span.set_attribute("error.type", error)
    span.set_status(trace.Status(trace.StatusCode.ERROR, error))


class _NoSpan:
    """What a traced operation holds when nothing records: every call does nothing."""

    __slots__ = ()

    def __enter__(self) -> _NoSpan:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        return None

    def set(self, key: str, value: str | bool | int) -> None:
        """Nothing records: nothing to set."""


_NO_SPAN = _NoSpan()
NO_SPAN = _NO_SPAN  # (the one no-op span: a caller that sees it may skip the block's span calls)


class _Ended:
    """A recording span ended when its ``with`` block exits: the shared ``__exit__``.

    An exception leaving the block marks the span failed (:func:`_fail`);
    :meth:`_end` then ends it, whatever happened. Subclasses add their own
    ``__enter__`` and extend :meth:`_end` with what they undo first.
    """

    __slots__ = ("_span",)

    def __init__(self, span: Span) -> None:
        self._span = span

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        try:
            if exc is not None:
                _fail(self._span, exc)
        finally:
            self._end()

    def _end(self) -> None:
        self._span.end()

    def set(self, key: str, value: str | bool | int) -> None:
        """Set one bounded attribute."""
        self._span.set_attribute(key, value)


class _Span(_Ended):
    """A recording span made current in the calling task until it ends."""

    __slots__ = ("_token",)

    def __init__(self, span: Span) -> None:
        super().__init__(span)
        self._token: object = None

    def __enter__(self) -> _Span:
        assert trace is not None and otel_context is not None
        self._token = otel_context.attach(trace.set_span_in_context(self._span))
        return self

    def _end(self) -> None:
        assert otel_context is not None
        otel_context.detach(self._token)  # type: ignore[arg-type]
        super()._end()


def span(name: str, attributes: Attributes, *, root: bool = False) -> _Span | _NoSpan:
    """A span named ``name``, child of the current one, current in the task while held.

    Use as ``with span(...) as held: ...; held.set(key, value)``; an exception
    leaving the block (a cancellation included) ends it with status ERROR.
    ``root``: a span of its own trace (a background task's work), whatever
    the task's context holds.
    """
    started = _started(name, root=root)
    if started is None:
        return _NO_SPAN
    started.set_attributes(attributes)
    return _Span(started)


def _unset(tracer: Tracer) -> bool:
    """True when ``tracer`` is the API's proxy and no provider was set: it records nothing.

    Such a proxy would hand out non-recording spans (about 0.8 us each) until
    the host sets a provider; this check costs two attribute reads. Any
    other tracer (a provider's, a test's) is asked for its span as usual.
    """
    return (
        type(tracer) is _PROXY_TRACER
        and getattr(tracer, "_real_tracer", True) is None
        and getattr(trace, "_TRACER_PROVIDER", True) is None
    )


def _started(name: str, *, root: bool = False) -> Span | None:
    """A recording span just started, or None when nothing records (no attributes are
    computed for a span that records nothing: the cost without an SDK is this call)."""
    tracer = TRACER
    if tracer is None or _unset(tracer):
        return None
    parent = None
    if root:
        assert otel_context is not None
        parent = otel_context.Context()
    started = tracer.start_span(name, context=parent)
    return started if started.is_recording() else None


class PrepareTrace(_Ended):
    """The spans of one prepare: its own (current in the requester's task) and its phases.

    Created by :func:`prepare_span`; the phases are found through
    :func:`current_prepare` in the requester's task, and the render's is
    handed to the worker thread explicitly.
    """

    __slots__ = (
        "_current",
        "_token",
        "context",
        "held",
        "inline",
        "rendered_ns",
        "started_ns",
    )

    def __init__(self, prepare: Span) -> None:
        assert trace is not None
        super().__init__(prepare)
        self._token: object = None
        self._current: contextvars.Token[PrepareTrace | None] | None = None
        self.context: Context = trace.set_span_in_context(prepare)
        self.started_ns = time.time_ns()
        self.rendered_ns: int | None = None  # set by the render span when it ends
        self.inline = False  # ... and whether it rendered on the loop
        self.held = False  # the queue phase ended (once: an inline try may precede the worker)

    def __enter__(self) -> PrepareTrace:
        assert otel_context is not None
        self._token = otel_context.attach(self.context)
        self._current = _PREPARE.set(self)
        return self

    def _end(self) -> None:
        assert otel_context is not None
        if self._current is not None:
            _PREPARE.reset(self._current)
        otel_context.detach(self._token)  # type: ignore[arg-type]
        super()._end()

    def set(self, key: str, value: str | bool | int) -> None:
        """Set one bounded attribute of the prepare span."""
        self._span.set_attribute(key, value)

    def _phase(self, name: str, start_ns: int, end_ns: int | None = None) -> None:
        assert TRACER is not None
        phase = TRACER.start_span(name, context=self.context, start_time=start_ns)
        phase.end(end_time=end_ns)

    def delivered(self, prepared: PreparedContext) -> None:
        """The requester resumed with ``prepared``: the deliver phase, the result's sizes."""
        self._phase("turnloom.prepare.deliver", self.rendered_ns or time.time_ns())
        span = self._span
        span.set_attribute("turnloom.items", prepared.item_count)
        span.set_attribute("turnloom.bytes", prepared.bytes)
        span.set_attribute("turnloom.inline", self.inline)


class _NoPrepare(_NoSpan):
    __slots__ = ()

    def __enter__(self) -> _NoPrepare:
        return self

    def delivered(self, prepared: PreparedContext) -> None:
        """Nothing records: nothing to end."""


_NO_PREPARE = _NoPrepare()


def prepare_span(gateway: str, request: object, strategy: str | None) -> PrepareTrace | _NoPrepare:
    """The ``turnloom.prepare`` span of one call; enter it in the requester's task.

    ``request`` is the request as given (checked after, typed): its context
    id is hashed when it is a str.
    """
    started = _started("turnloom.prepare")
    if started is None:
        return _NO_PREPARE
    attributes: dict[str, str | bool | int] = {"turnloom.gateway": gateway}
    _with_context(attributes, getattr(request, "context_id", None))
    if strategy is not None:
        attributes["turnloom.strategy"] = strategy
    started.set_attributes(attributes)
    return PrepareTrace(started)


def current_prepare() -> PrepareTrace | None:
    """The prepare being traced in this task, or None (to hand to a worker thread)."""
    return _PREPARE.get()


def queued() -> None:
    """The turn is held: end the queue phase of the prepare traced in this task."""
    prepare = _PREPARE.get()
    if prepare is not None and not prepare.held:
        prepare.held = True
        prepare._phase("turnloom.prepare.queue", prepare.started_ns, time.time_ns())


class _RenderSpan(_Ended):
    """The render phase of a prepare, in whichever thread renders; never made current."""

    __slots__ = ("_inline", "_prepare")

    def __init__(self, prepare: PrepareTrace, inline: bool, gateway: str) -> None:
        assert TRACER is not None
        super().__init__(
            TRACER.start_span(
                "turnloom.render",
                context=prepare.context,
                attributes={"turnloom.gateway": gateway, "turnloom.inline": inline},
            )
        )
        self._prepare = prepare
        self._inline = inline

    def __enter__(self) -> _RenderSpan:
        return self

    def _end(self) -> None:
        ended = time.time_ns()
        self._prepare.rendered_ns = ended
        self._prepare.inline = self._inline
        self._span.end(end_time=ended)


def render_span(
    prepare: PrepareTrace | None, *, inline: bool, gateway: str
) -> _RenderSpan | _NoSpan:
    """The ``turnloom.render`` span, child of ``prepare`` (None: nothing is traced).

    Safe in a worker thread: the parent comes from ``prepare``, not from the
    thread's context, and the span is not made current.
    """
    if prepare is None:
        return _NO_SPAN
    return _RenderSpan(prepare, inline, gateway)
