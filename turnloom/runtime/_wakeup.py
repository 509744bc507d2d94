"""The two event-loop primitives of the render handoff, bare, behind one small abstraction.

A preparation handed to the render thread waits for one wake-up, and the
thread hands each batch back with one call onto the loop. anyio's portable
forms of both cost more than the work they carry at small histories
(``scripts/bench_floors.py``): an ``anyio.Event`` is a backend event plus a
wrapper, each wait a parking lot or a deque of futures; ``anyio.from_thread.
run_sync`` blocks the thread until the loop ran the call. So, per backend:

* :class:`Signal`: one task waits, once, for one :meth:`Signal.set`. On
  asyncio a bare future of the running loop; on trio the task is parked
  with ``wait_task_rescheduled`` and rescheduled by :meth:`Signal.set`.
* :func:`loop_hooks`: the running loop's thread-safe "call this soon" (asyncio's
  ``call_soon_threadsafe``, trio's ``TrioToken.run_sync_soon``), which does not
  wait for the call, and the exceptions it raises once the loop is gone.

Event-loop only, except the returned ``call_soon``, which any thread may call.
"""

from __future__ import annotations

__all__ = ("LoopHooks", "Signal", "loop_hooks")

import asyncio
import types
from collections.abc import Awaitable, Callable, Generator
from types import TracebackType
from typing import Any, Protocol

import anyio
import anyio.lowlevel
import sniffio

_trio: Any = None  # the trio module, imported by the first loop_hooks() on trio


class Signal(Protocol):
    """One task waits, once, until :meth:`set` is called (on the loop).

    ``set`` before ``wait`` makes ``wait`` return at once; ``set`` after the
    waiter was cancelled does nothing. Not reusable, one waiter only.
    """

    def set(self) -> None:
        """Wake the waiter (idempotent; never raises; loop thread only)."""

    def wait(self) -> Awaitable[None]:
        """Wait for :meth:`set`: await what this returns, once.

        Cancellation: cancellable while it waits (the signal is then spent:
        a later ``set`` is a no-op).
        """


class _FutureSignal:
    """asyncio: a bare future of the running loop."""

    __slots__ = ("_future",)

    def __init__(self) -> None:
        self._future: asyncio.Future[None] = asyncio.get_running_loop().create_future()

    def set(self) -> None:
        future = self._future
        if not future.done():  # a cancelled waiter cancelled it
            future.set_result(None)

    def wait(self) -> Awaitable[None]:
        return self._future  # awaited directly: no coroutine frame per wait


@types.coroutine
def _ready() -> Generator[None, None, None]:
    """An awaitable that returns at once, without yielding (a set signal's wait)."""
    return
    yield  # a generator: what ``types.coroutine`` makes awaitable


class _TrioSignal:
    """trio: the waiting task parked by ``wait_task_rescheduled``."""

    __slots__ = ("_is_set", "_task")

    def __init__(self) -> None:
        self._task: Any = None  # the parked task, while it waits
        self._is_set = False

    def set(self) -> None:
        self._is_set = True
        task, self._task = self._task, None
        if task is not None:
            _trio.lowlevel.reschedule(task)

    def _abort(self, _: object) -> Any:
        self._task = None  # cancelled: a later set() finds nobody to wake
        return _trio.lowlevel.Abort.SUCCEEDED

    def wait(self) -> Awaitable[None]:
        # The task is the caller's, which awaits what this returns at once:
        # trio's own wait, without a coroutine of ours around it.
        if self._is_set:
            return _ready()
        self._task = _trio.lowlevel.current_task()
        result: Awaitable[None] = _trio.lowlevel.wait_task_rescheduled(self._abort)
        return result


class LoopHooks:
    """The running loop's primitives: ``signal()`` makes a :class:`Signal`;
    ``call_soon(fn, arg)`` runs ``fn(arg)`` on the loop, from any thread,
    without waiting; it raises one of ``gone`` once the loop has finished.

    And the loop's own forms of the anyio calls made per prepare and per
    model call, without anyio's look-up of the running backend on each call
    where the loop has its own: ``now()`` is ``anyio.current_time()``
    (seconds, the loop's clock), ``checkpoint()`` is
    ``anyio.lowlevel.checkpoint()`` (a cancellation point and a yield to the
    loop), ``checkpoint_if_cancelled()`` is
    ``anyio.lowlevel.checkpoint_if_cancelled()`` (raises the cancellation
    when the caller is cancelled, else returns without yielding), and
    ``cancel_scope()`` makes a cancel scope with ``cancel()``, usable as a
    ``with`` block in a task of this loop exactly as an
    ``anyio.CancelScope()`` (on trio, trio's own, which anyio's wraps).
    """

    __slots__ = (
        "call_soon",
        "cancel_scope",
        "checkpoint",
        "checkpoint_if_cancelled",
        "gone",
        "now",
        "signal",
    )

    def __init__(
        self,
        signal: Callable[[], Signal],
        call_soon: Callable[[Callable[[Any], object], Any], object],
        gone: tuple[type[BaseException], ...],
        now: Callable[[], float],
        checkpoint: Callable[[], Awaitable[None]],
        cancel_scope: Callable[[], CancelScope],
        checkpoint_if_cancelled: Callable[[], Awaitable[None]],
    ) -> None:
        self.signal = signal
        self.call_soon = call_soon
        self.gone = gone
        self.now = now
        self.checkpoint = checkpoint
        self.cancel_scope = cancel_scope
        self.checkpoint_if_cancelled = checkpoint_if_cancelled


class CancelScope(Protocol):
    """What :attr:`LoopHooks.cancel_scope` makes: a cancel scope of the running loop."""

    def cancel(self) -> None:
        """Cancel what runs in the scope (idempotent; loop thread only)."""

    def __enter__(self) -> object: ...

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> bool | None: ...


@types.coroutine
def _asyncio_checkpoint() -> Generator[None, None, None]:
    # What ``asyncio.sleep(0)`` awaits, without its coroutine around it: one
    # bare yield, so the task steps again at the loop's next iteration (and
    # a pending cancellation is thrown in here).
    yield


def loop_hooks() -> LoopHooks:
    """The hooks of the event loop running this call (asyncio or trio).

    Raises:
        RuntimeError: no supported event loop runs in this thread.
    """
    library = sniffio.current_async_library()
    if library == "trio":
        global _trio
        import trio

        _trio = trio
        token = trio.lowlevel.current_trio_token()
        return LoopHooks(
            _TrioSignal,
            token.run_sync_soon,
            (trio.RunFinishedError,),
            trio.current_time,
            trio.lowlevel.checkpoint,
            trio.CancelScope,
            trio.lowlevel.checkpoint_if_cancelled,
        )
    if library != "asyncio":
        raise RuntimeError(f"Unsupported event loop {library!r}: asyncio or trio.")
    loop = asyncio.get_running_loop()
    # call_soon_threadsafe raises RuntimeError once the loop is closed; anyio's
    # current_time and checkpoint on asyncio are the loop's time and sleep(0);
    # anyio.CancelScope() makes its backend's class, made here directly; a
    # cancellation check reads anyio's own cancel scopes (no asyncio form):
    # its backend's own, without the look-up of the running backend per call.
    return LoopHooks(
        _FutureSignal,
        loop.call_soon_threadsafe,
        (RuntimeError,),
        loop.time,
        _asyncio_checkpoint,
        type(anyio.CancelScope()),
        _backend_checkpoint_if_cancelled(),
    )


def _backend_checkpoint_if_cancelled() -> Callable[[], Awaitable[None]]:
    """The running anyio backend's ``checkpoint_if_cancelled`` (what anyio's calls)."""
    try:
        from anyio._core._eventloop import get_async_backend
    except ImportError:  # anyio moved it: its public form does the same
        return anyio.lowlevel.checkpoint_if_cancelled
    check: Callable[[], Awaitable[None]] = get_async_backend().checkpoint_if_cancelled
    return check
