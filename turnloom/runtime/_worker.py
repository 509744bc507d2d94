"""One persistent render thread per Foundation, fed in batches.

``anyio.to_thread.run_sync`` costs one thread wake-up, two GIL transfers and
one wake-up of the event loop per call: 50-150 us of CPU on the machines this
was measured on (``scripts/bench_floors.py``), as much as a render. A
:class:`RenderWorker` pays them once per *batch*: the event loop appends a
job to a deque and wakes the thread only when it sleeps; the thread takes
every job queued, runs each, and hands the whole batch back with one call of
``anyio.from_thread.run_sync`` (one wake-up of the loop, on asyncio and on
trio alike). Jobs queued while it works form the next batch.

The worker knows nothing of preparations: a job is a function to run in the
thread and one to run on the loop with what it returned. Who queues jobs
bounds them (the pending-preparation queue and the Foundation's limiter do).

Lifecycle: the thread starts with the first job and runs until
:meth:`RenderWorker.aclose`, which lets it finish every job queued, hand
their results back, and joins it: no thread outlives the Foundation.
"""

from __future__ import annotations

__all__ = ("RenderWorker",)

import logging
import threading
from collections import deque
from collections.abc import Callable
from typing import Any

import anyio
import anyio.from_thread
import anyio.lowlevel
import anyio.to_thread

_log = logging.getLogger("turnloom.runtime.worker")

Job = tuple[Callable[[Any], Any], Callable[[Any, Any], None] | None, Any]
"""``(work, done, item)``: ``work(item)`` runs in the thread; ``done(item,
result)`` runs on the event loop with what it returned, or with the exception
it raised. A job without ``done`` is not handed back (a batch of only such
jobs wakes the loop not at all); an exception it raises is logged."""


class RenderWorker:
    """A persistent thread that runs jobs in batches, one event-loop wake-up per batch.

    Made on the event loop that will receive the results (its token is read
    at the first :meth:`submit`). ``name`` names the thread.

    ``batches`` and ``jobs`` count what the thread handed back (read on the
    loop: they change only there).
    """

    __slots__ = (
        "_closed",
        "_jobs",
        "_lock",
        "_name",
        "_sleeping",
        "_stopping",
        "_thread",
        "_token",
        "_wake",
        "batches",
        "jobs",
    )

    def __init__(self, name: str = "turnloom-render") -> None:
        self._name = name
        self._lock = threading.Lock()
        self._wake = threading.Condition(self._lock)
        self._jobs: deque[Job] = deque()
        self._sleeping = False  # the thread waits on ``_wake`` (guarded by ``_lock``)
        self._stopping = False
        self._closed = False
        self._thread: threading.Thread | None = None
        self._token: anyio.lowlevel.EventLoopToken | None = None
        self.batches = 0
        self.jobs = 0

    @property
    def alive(self) -> bool:
        """True while the thread runs (from the first job until :meth:`aclose`)."""
        thread = self._thread
        return thread is not None and thread.is_alive()

    def submit(
        self, work: Callable[[Any], Any], done: Callable[[Any, Any], None] | None, item: Any
    ) -> None:
        """Queue ``work(item)`` for the thread; ``done(item, result)`` then runs on the loop.

        ``done`` receives what ``work`` returned, or the ``BaseException`` it
        raised (the thread keeps serving); it runs on the event loop, in
        batch order, once per job, and must not raise (an exception it
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
            self._token = anyio.lowlevel.current_token()
            self._thread = threading.Thread(target=self._serve, name=self._name, daemon=True)
            self._thread.start()
        with self._lock:
            self._jobs.append((work, done, item))
            if self._sleeping:
                self._sleeping = False
                self._wake.notify()

    def _serve(self) -> None:
        """The thread: take every queued job, run them, hand them back in one call."""
        token = self._token
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
                anyio.from_thread.run_sync(self._hand_back, results, token=token)
            except anyio.RunFinishedError:
                return  # the event loop is gone: nobody is left to receive results
            except Exception:
                _log.exception("A render job's completion raised; the worker keeps serving.")
            del results

    def _hand_back(self, results: list[tuple[Callable[[Any, Any], None], Any, Any]]) -> None:
        """On the loop: deliver one batch."""
        self.batches += 1
        self.jobs += len(results)
        failed: Exception | None = None
        for done, item, result in results:
            try:
                done(item, result)
            except Exception as exc:  # every other job of the batch is still handed back
                failed = failed or exc
        if failed is not None:
            raise failed

    async def aclose(self) -> None:
        """Let the thread finish every queued job and hand it back, then join it; idempotent.

        Call it once nothing will be submitted again (after the pending
        queue settled). The thread ends after the batch it runs and any jobs
        queued before this call; their results are handed back first (this
        call waits on the loop meanwhile, so that they can be).

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
            # The join waits in a helper thread: the worker may still need the
            # loop to hand back its last batch.
            await anyio.to_thread.run_sync(thread.join)
