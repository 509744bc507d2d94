"""One persistent render thread per Foundation, fed in batches.

``anyio.to_thread.run_sync`` costs one thread wake-up, two GIL transfers and
one wake-up of the event loop per call: 50-150 us of CPU on the machines this
was measured on (``scripts/bench_floors.py``), as much as a render. A
:class:`RenderWorker` pays them once per *batch*: the event loop appends a
job to a deque and wakes the thread only when it sleeps; the thread takes
every job queued, runs each, and hands the whole batch back with one
thread-safe "call soon" of the loop (:mod:`turnloom.runtime._wakeup`: one
wake-up of the loop, on asyncio and on trio alike; the thread does not wait
for it and goes on with the jobs queued meanwhile, the next batch).

The worker knows nothing of preparations: a job is a function to run in the
thread and one to run on the loop with what it returned. Who queues jobs
bounds them (the bounded pending-preparation queue does).

Lifecycle: the thread starts with the first job and runs until
:meth:`RenderWorker.aclose`, which lets it finish every job queued, joins it,
and returns once their results were handed back: no thread outlives the
Foundation.
"""

from __future__ import annotations

__all__ = ("RenderWorker",)

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.to_thread

from turnloom.runtime._wakeup import LoopHooks, Signal, loop_hooks

_log = logging.getLogger("turnloom.runtime.worker")

Job = tuple[Callable[[Any], Any], Callable[[Any, Any], None] | None, Any]
"""``(work, done, item)``: ``work(item)`` runs in the thread; ``done(item,
result)`` runs on the event loop with what it returned, or with the exception
it raised. A job without ``done`` is not handed back (a batch of only such
jobs wakes the loop not at all); an exception it raises is logged."""


class RenderWorker:
    """A persistent thread that runs jobs in batches, one event-loop wake-up per batch.

    Made on the event loop that will receive the results (its hooks, unless
    given as ``hooks``, are read at the first :meth:`submit` or :meth:`signal`).
    ``name`` names the thread.

    ``batches`` and ``jobs`` count what the thread handed back (read on the
    loop: they change only there).
    """

    __slots__ = (
        "_closed",
        "_drained",
        "_hooks",
        "_jobs",
        "_lock",
        "_name",
        "_posted",
        "_sleeping",
        "_stopping",
        "_thread",
        "_wake",
        "batches",
        "jobs",
    )

    def __init__(self, name: str = "turnloom-render", hooks: LoopHooks | None = None) -> None:
        self._name = name
        self._hooks: LoopHooks | None = hooks
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: deque[Job] = deque()
        self._sleeping = False  # the thread waits on ``_wake`` (guarded by ``_lock``)
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._posted = 0  # batches the thread handed to the loop (read after the join)
        self._drained: Signal | None = None  # set when the last posted batch came back
        self.batches = 0
        self.jobs = 0

    @property
    def alive(self) -> bool:
        """True while the thread runs (from the first job until :meth:`aclose`)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def hooks(self) -> LoopHooks:
        """The primitives of the loop this worker serves (read once, on the loop)."""
        hooks = self._hooks
        if hooks is None:
            hooks = self._hooks = loop_hooks()
        return hooks

    def submit(
        self, work: Callable[[Any], Any], done: Callable[[Any, Any], None] | None, item: Any
    ) -> None:
        """Queue ``work(item)`` for the thread; ``done(item, result)`` then runs on the loop.

        ``done`` receives what ``work`` returned, or the ``BaseException`` it
        raised (the thread keeps serving); it runs on the event loop, in
        submission order, once per job, and must not raise (an exception it
        raises is logged on ``turnloom.runtime.worker``, the batch's other
        jobs are still handed back and the thread keeps serving). Called on
        the event loop (or, once :attr:`alive`, any thread). ``done=None``:
        nothing is handed back (see :data:`Job`).

        Raises:
            RuntimeError: the worker was closed (a bug in the caller: the
                Foundation stops intake before it closes the worker).
        """
        if self._closed:
            raise RuntimeError("The render worker is closed.")
        if self._thread is None:
            self.hooks()
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        with self._lock:
            self._jobs.append((work, done, item))
            if self._sleeping:
                self._sleeping = False
                self._wake.notify()

    def _serve(self) -> None:
        """The thread: take every queued job, run them, hand them back in one call."""
        hooks = self._hooks
        assert hooks is not None
        call_soon, gone = hooks.call_soon, hooks.gone
        jobs = self._jobs
        while True:
            with self._lock:
                while not jobs and not self._stopping:
                    self._sleeping = True
                    self._wake.wait()
                if not jobs:
                    return  # stopping, and nothing left to run
                batch = list(jobs)
                jobs.clear()
            results: list[tuple[Callable[[Any, Any], None], Any, Any]] = []
            for work, done, item in batch:
                try:
                    result = work(item)
                except BaseException as exc:  # handed to ``done``; the thread keeps serving
                    if done is None:
                        _log.exception("A worker job raised; the worker keeps serving.")
                        continue
                    result = exc
                if done is not None:
                    results.append((done, item, result))
            del batch
            if not results:
                continue  # nothing to hand back: the loop is not woken
            try:
                call_soon(self._hand_back, results)
            except gone:
                return  # the event loop is gone: nobody is left to receive results
            self._posted += 1
            del results

    def _hand_back(self, results: list[tuple[Callable[[Any, Any], None], Any, Any]]) -> None:
        """On the loop: deliver one batch; never raises (a raising ``done`` is logged)."""
        self.batches += 1
        self.jobs += len(results)
        for done, item, result in results:
            try:
                done(item, result)
            except Exception:  # every other job of the batch is still handed back
                _log.exception("A render job's completion raised; the worker keeps serving.")
        drained = self._drained
        if drained is not None and self.batches == self._posted:
            drained.set()

    async def aclose(self) -> None:
        """Let the thread finish every queued job and hand it back, then join it; idempotent.

        Call it once nothing will be submitted again (after the pending
        queue settled). The thread ends after the batch it runs and any jobs
        queued before this call; this call returns once their results were
        handed back (it waits on the loop meanwhile, so that they can be).

        Cancellation:
            Not cancellable: it shields itself, so the thread is joined
            even when the caller is cancelled (the wait is bounded by the
            jobs queued; the Foundation's close is shielded anyway).
        """
        self._closed = True
        thread = self._thread
        if thread is None:
            return
        with self._lock:
            self._stopping = True
            if self._sleeping:
                self._sleeping = False
                self._wake.notify()
        with anyio.CancelScope(shield=True):
            # The join waits in a helper thread, the loop free meanwhile to
            # receive the batches the thread hands back.
            await anyio.to_thread.run_sync(thread.join)
            # Joined: ``_posted`` is final. Wait for the batches still on their way.
            if self.batches < self._posted:
                self._drained = self.hooks().signal()
                await self._drained.wait()
