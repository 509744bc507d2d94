"""Many concurrent sessions through one Foundation (``turnloom loadtest``).

Each session replays a trajectory (built-in generated, or read from a file),
walked into turns by :func:`turnloom.tools.transcript.walk`, through the full
flow: ``accept_turn``, ``prepare_nowait`` (falling back to ``prepare`` when the
queue is full, which counts as a rejection), one
invocation per model call recording the reply, ``record`` for tool results
and ``build`` for every later model call of the turn. Histories keep their
default limits, so long sessions evict. A ticker task measures event-loop lag:
it sleeps a fixed interval and records how late it wakes.
"""

from __future__ import annotations

__all__ = (
    "LoadtestReport",
    "LoadtestSamples",
    "RunFigures",
    "SustainedReport",
    "count_model_calls",
    "loadtest",
    "sustained_sessions",
)

import gc
import math
import time
from collections.abc import Callable, Sequence
from typing import TextIO

import anyio
import msgspec

from turnloom.context.gateway import GatewayType
from turnloom.context.history import HistoryLimits
from turnloom.context.message import Message
from turnloom.errors import InputError, LeaseHeldError, QueueFullError, TurnloomError
from turnloom.runtime import CollectorPolicy
from turnloom.runtime._collector import FrozenCollector
from turnloom.runtime.config import RuntimeConfig, build_context_manager
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.manager import ContextManager
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext
from turnloom.stores import open_context_store
from turnloom.tools._stats import peak_rss_bytes, percentile
from turnloom.tools.trajectories import ReplayError, Trajectory, check_trajectory
from turnloom.tools.transcript import Reply, Turn, snapshot, walk

_TICK = 0.005
_DEFAULT_COLLECTOR = CollectorPolicy()


class RunFigures(msgspec.Struct, frozen=True, kw_only=True):
    """The figures a load test reports, whether one process ran it or several.

    :class:`LoadtestReport` (one process) and
    :class:`~turnloom.tools.fleet.FleetReport` (several, added up) carry them
    all; each field is written here once.

    Attributes:
        sessions: sessions run concurrently.
        sessions_failed: sessions that stopped on an error.
        turns: turns committed.
        model_calls: model inputs produced (prepares plus builds).
        prepares: ``prepare`` calls delivered.
        seconds: wall time, in seconds.
        prepares_per_second: ``prepares / seconds``.
        prepare_p50_ms, prepare_p95_ms, prepare_p99_ms: prepare latency,
            milliseconds, nearest rank.
        loop_lag_p99_ms, loop_lag_max_ms: event-loop lag measured by a ticker
            waking every 5 ms, in milliseconds.
        gc_full_collections: CPython generation-2 garbage collections during
            the run.
        gc_pause_max_ms: the longest garbage-collection pause, in milliseconds
            (a full collection walks every live object, so with a large
            retained history it is what sets ``loop_lag_max_ms``).
        gc_full_cpu_max_ms: the longest full collection's CPU time on the
            thread that ran it, in milliseconds (the lag it causes, without
            the machine's other load), the collector policy's steps left out.
        gc_full_steady: full collections after the ramp-up (once every
            session's first prepare was delivered), the policy's steps left out.
        collector_steps, collector_thorough_steps: steps the Foundation's
            collector policy took (each is one full collection of what was
            not frozen, counted in ``gc_full_collections`` too), and how many
            of them were thorough (see :class:`~turnloom.runtime.CollectorPolicy`).
        collector_step_cpu_max_ms: the longest pause the collector policy made
            on the loop's thread, CPU milliseconds: a step (its collection,
            freeze and read of the allocated blocks).
        rejections: ``prepare_nowait`` calls refused because the queue was full.
        evicted_turns: turns evicted from histories.
        errors: the first few error messages.
        think_time: seconds each session paused between its turns (a user
            reading and typing); 0 runs the sessions saturated.
        render_seconds: worker-thread render time of the delivered prepares
            (``PreparedContext.render_seconds``), summed, in seconds.
        cpu_seconds: CPU time of the whole process during the run (every
            thread), in seconds.
        store: the store URL sessions were kept in (``""``: memory only). With
            a store each session claims its context, every turn's commit is
            acknowledged by a flush before its prepare, and the context is
            removed from the store when the session ends.
        takeovers: claims that restored a context another owner had stored.
        prefix_reuse: the share of the bytes of each context's previous
            prepared input that its next one repeated (what a provider's
            prefix cache could serve; ``statistics().prefix``); 1.0 when none
            was compared.
        prefix_reuse_tokens: the same share in tokens (estimated by byte
            share per prefix, see ``PreparedContext.reused_tokens``).
    """

    sessions: int
    sessions_failed: int
    turns: int
    model_calls: int
    prepares: int
    seconds: float
    prepares_per_second: float
    prepare_p50_ms: float
    prepare_p95_ms: float
    prepare_p99_ms: float
    loop_lag_p99_ms: float
    loop_lag_max_ms: float
    gc_full_collections: int
    gc_pause_max_ms: float
    rejections: int
    evicted_turns: int
    errors: tuple[str, ...]
    think_time: float = 0.0
    render_seconds: float = 0.0
    cpu_seconds: float = 0.0
    store: str = ""
    takeovers: int = 0
    prefix_reuse: float = 1.0
    prefix_reuse_tokens: float = 1.0
    gc_full_cpu_max_ms: float = 0.0
    gc_full_steady: int = 0
    collector_steps: int = 0
    collector_thorough_steps: int = 0
    collector_step_cpu_max_ms: float = 0.0


class LoadtestReport(RunFigures, frozen=True, kw_only=True):
    """The figures of one load test (one process): :class:`RunFigures`, and its memory.

    Attributes:
        peak_rss_bytes: the process's peak resident set size, in bytes.
    """

    peak_rss_bytes: int


class LoadtestSamples(msgspec.Struct, kw_only=True):
    """The raw measurements of one load test, each with its time (for ``--plot``).

    Pass one to :func:`loadtest` (``samples=``) and it is filled as the run
    goes. Times are seconds since the sessions started; durations are seconds.

    Attributes:
        prepare_at: when each delivered prepare returned, in order.
        prepare_latency: each prepare's latency, matching ``prepare_at``.
        lag_at: when each ticker wake-up happened.
        lag: how late each wake-up was (the event-loop lag).
        gc_at: when each garbage collection ended.
        gc_pause: each collection's pause.
        gc_generation: each collection's generation (2: a full collection).
        seconds: the run's wall time.
    """

    prepare_at: list[float] = msgspec.field(default_factory=list)
    prepare_latency: list[float] = msgspec.field(default_factory=list)
    lag_at: list[float] = msgspec.field(default_factory=list)
    lag: list[float] = msgspec.field(default_factory=list)
    gc_at: list[float] = msgspec.field(default_factory=list)
    gc_pause: list[float] = msgspec.field(default_factory=list)
    gc_generation: list[int] = msgspec.field(default_factory=list)
    seconds: float = 0.0


def count_model_calls(
    trajectories: Sequence[Trajectory], *, sessions: int, turns: int | None = None
) -> int:
    """How many model calls :func:`loadtest` will make with these arguments.

    Counts the assistant replies after the first user message of each
    session's (truncated) trajectory; for sizing a progress bar.
    """
    per: list[int] = []
    for trajectory in trajectories:
        seen = calls = 0
        for message in trajectory.messages:
            role = message.get("role") if isinstance(message, dict) else None
            if role == "user":
                seen += 1
                if turns is not None and seen > turns:
                    break
            elif role == "assistant" and seen:
                calls += 1
        per.append(calls)
    return sum(per[i % len(per)] for i in range(sessions)) if per else 0


async def loadtest(
    trajectories: Sequence[Trajectory],
    *,
    sessions: int,
    turns: int | None = None,
    gateway: GatewayType | str = GatewayType.openai_chat,
    history_limits: HistoryLimits | None = None,
    max_pending_preparations: int = 16,
    on_model_call: Callable[[], None] | None = None,
    on_open: Callable[[Foundation], None] | None = None,
    config: RuntimeConfig | None = None,
    think_time: float = 0.0,
    store: str | None = None,
    first_session: int = 0,
    run_id: str = "",
    takeover_sessions: int | None = None,
    lease_ttl: float = 10.0,
    acknowledged_log: TextIO | None = None,
    samples: LoadtestSamples | None = None,
    collector: CollectorPolicy | None = _DEFAULT_COLLECTOR,
) -> LoadtestReport:
    """Run ``sessions`` concurrent sessions over ``trajectories`` (cycled).

    Args:
        trajectories: the sessions' scripts; session ``i`` replays
            ``trajectories[i % len(trajectories)]``.
        sessions: how many sessions run at once. They start one per
            event-loop iteration, as a server accepts connections.
        turns: replay at most this many turns of each trajectory.
        gateway: the provider to prepare for.
        history_limits: per-context bounds (turnloom's defaults when None).
        max_pending_preparations: the pending-queue bound.
        on_model_call: called on the event loop after every model input
            (drives a progress bar).
        on_open: called with the open Foundation before sessions start (for
            example to serve its metrics).
        config: a host configuration (``turnloom loadtest --config FILE``):
            the manager is built from its ``context`` section before the
            Foundation is bound; ``history_limits`` and
            ``max_pending_preparations`` are not used.
        think_time: seconds a session pauses before each turn after its first
            (a user between turns). With a think time the sessions' first
            turns are spread evenly over one think time, so they do not all
            arrive at once. 0 (the default): no pause, the runtime saturated.
        store: a store URL (``sqlite:PATH``, ``redis://HOST:PORT/DB``) to keep
            the sessions in, opened here and closed after the run; see
            :attr:`LoadtestReport.store`.
        first_session: the number of the first session (several processes
            share one workload: process ``k`` runs sessions
            ``first_session .. first_session + sessions - 1``).
        run_id: prefixed to every context id, so runs sharing a store never
            meet.
        takeover_sessions: with a store, the number of sessions of the whole
            fleet (``turnloom loadtest --processes N --takeover``): after its
            own, this process claims every other session of
            ``0 .. takeover_sessions - 1`` once its lease is free (released
            by a process that finished, or expired with one that died),
            restores it and replays its remaining turns, after the newest
            committed one; a session found finished is left as it is.
            Sessions keep their contexts in the store (a finished session is
            released, not removed), so a survivor can tell them from sessions
            never started. None (default): each process runs its own range
            and removes its contexts.
        lease_ttl: seconds a lease lasts unless renewed (the store's lease;
            a dead process's sessions are free after it).
        acknowledged_log: a text file to write ``"<context id> <turn id>"``
            lines to, one per commit a flush acknowledged, written at once
            (a test checks the store against it after killing the process).
        samples: filled with every measurement and its time
            (:class:`LoadtestSamples`), for a plot of the run.
        collector: the Foundation's collector policy (its default; None: off).

    Returns:
        the report.

    Raises:
        InputError: no trajectories, ``sessions`` not positive, a malformed
            trajectory (by :func:`~turnloom.tools.trajectories.check_trajectory`,
            the rule ``replay`` uses), or an unknown or unavailable gateway.
        ConfigError: ``config`` names a plugin that no longer resolves or
            builds no ContextManager.

    Cancellation:
        Cancelling stops every session and closes the Foundation in order.
    """
    if not trajectories:
        raise InputError("loadtest needs at least one trajectory.")
    if sessions < 1:
        raise InputError(f"sessions must be a positive integer, not {sessions}.")
    if not (math.isfinite(think_time) and think_time >= 0):
        raise InputError(f"think_time must be a finite number >= 0, not {think_time!r}.")
    if config is not None and store is not None:
        raise InputError("loadtest takes a store or a config, not both.")
    if takeover_sessions is not None and (store is None or takeover_sessions < sessions):
        raise InputError("takeover_sessions needs a store and at least the process's own sessions.")
    scripts: list[list[Message]] = []
    for trajectory in trajectories:
        parsed = check_trajectory(trajectory)
        if isinstance(parsed, ReplayError):
            raise InputError(str(parsed))
        scripts.append(parsed)

    recorded = samples if samples is not None else LoadtestSamples()
    latencies = recorded.prepare_latency
    lags = recorded.lag
    gc_pauses: list[tuple[int, float]] = []
    # Full collections: (perf_counter when it ended, CPU seconds of the thread
    # that ran it). A collection runs wholly on one thread, one at a time.
    gc_full: list[tuple[float, float]] = []
    gc_started = [0.0, 0.0]
    stepping: list[FrozenCollector] = []  # the Foundation's collector policy, once open
    origin = [time.perf_counter()]  # reset when the sessions start

    def on_gc(phase: str, info: dict[str, int]) -> None:
        now = time.perf_counter()
        if phase == "start":
            gc_started[0] = now
            gc_started[1] = time.thread_time()
        else:
            gc_pauses.append((info["generation"], now - gc_started[0]))
            if info["generation"] == 2 and not (stepping and stepping[0].stepping):
                gc_full.append((now, time.thread_time() - gc_started[1]))
            recorded.gc_at.append(now - origin[0])
            recorded.gc_pause.append(now - gc_started[0])
            recorded.gc_generation.append(info["generation"])

    opened = open_context_store(store) if store is not None else None
    gc.callbacks.append(on_gc)
    try:
        if config is not None:
            manager = build_context_manager(config, gateway=gateway)
        else:
            manager = ContextManager(
                gateway=gateway,
                history_limits=history_limits,
                max_pending_preparations=max_pending_preparations,
                store=opened,
                lease_ttl=lease_ttl,
            )
        return await _run(
            scripts,
            sessions=sessions,
            turns=turns,
            manager=manager,
            on_model_call=on_model_call,
            on_open=on_open,
            store=store,
            first_session=first_session,
            run_id=run_id,
            latencies=latencies,
            lags=lags,
            gc_pauses=gc_pauses,
            gc_full=gc_full,
            stepping=stepping,
            think_time=think_time,
            takeover_sessions=takeover_sessions,
            acknowledged_log=acknowledged_log,
            recorded=recorded,
            origin=origin,
            collector=collector,
        )
    finally:
        gc.callbacks.remove(on_gc)
        if opened is not None:
            with anyio.CancelScope(shield=True):
                await opened.aclose()


async def _run(
    scripts: list[list[Message]],
    *,
    sessions: int,
    turns: int | None,
    manager: ContextManager,
    on_model_call: Callable[[], None] | None,
    on_open: Callable[[Foundation], None] | None,
    store: str | None,
    first_session: int,
    run_id: str,
    latencies: list[float],
    lags: list[float],
    gc_pauses: list[tuple[int, float]],
    gc_full: list[tuple[float, float]],
    stepping: list[FrozenCollector],
    think_time: float,
    takeover_sessions: int | None,
    acknowledged_log: TextIO | None,
    recorded: LoadtestSamples,
    origin: list[float],
    collector: CollectorPolicy | None,
) -> LoadtestReport:
    errors: list[str] = []
    counts = {"turns": 0, "calls": 0, "failed": 0}
    rendering = [0.0]
    first_prepares = [0, math.inf]  # sessions past their first prepare, when all were
    started = time.perf_counter()
    origin[0] = started
    cpu_started = time.process_time()

    async with Foundation(manager, collector=collector) as foundation:
        if foundation.collector is not None:
            stepping.append(foundation.collector)
        if on_open is not None:
            on_open(foundation)

        async def session(number: int, delay: float = 0.0) -> None:
            script = scripts[number % len(scripts)]
            context_id = f"{run_id}session-{number}"
            prefix: PreparedContext | None = None
            continuation: list[Message] = []
            turn_id = ""
            prefix_count = 0
            if delay:
                await anyio.sleep(delay)
            try:
                steps = list(walk(script, max_turns=turns))
                if takeover_sessions is not None:
                    await _claim_when_free(manager, context_id)
                    done = _committed(manager, context_id)
                    final = [step.turn_id for step in steps if isinstance(step, Turn)]
                    if final and done == final[-1]:
                        await manager.leases.release(context_id)  # finished by its owner
                        return
                    if done:  # resume after the newest committed turn
                        steps = steps[_after(steps, done) :]
                elif store is not None:
                    await manager.leases.claim(context_id)
                for step in steps:
                    if isinstance(step, Turn):
                        if think_time and turn_id:
                            await anyio.sleep(think_time)
                        turn_id = step.turn_id
                        manager.accept_turn(snapshot(context_id, step))
                        counts["turns"] += 1
                        if store is not None:
                            await manager.leases.flush(context_id)  # the commit is acknowledged
                            if acknowledged_log is not None:
                                acknowledged_log.write(f"{context_id} {turn_id}\n")
                                acknowledged_log.flush()
                        request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                        begin = time.perf_counter()
                        try:
                            prefix = await manager.prepare_nowait(request)
                        except QueueFullError:
                            # Wait outside the handler: awaiting inside it would
                            # keep the exception and its traceback alive.
                            prefix = None
                        if prefix is None:
                            prefix = await manager.prepare(request)
                        end = time.perf_counter()
                        latencies.append(end - begin)
                        recorded.prepare_at.append(end - started)
                        if prefix_count == 0:  # the session's first prepare
                            first_prepares[0] += 1
                            if first_prepares[0] == sessions:
                                first_prepares[1] = end
                        rendering[0] += prefix.render_seconds
                        prefix_count += 1
                        continuation = []
                    elif prefix is None:
                        continue
                    elif isinstance(step, Reply):
                        if continuation:
                            manager.build(prefix, continuation)
                        counts["calls"] += 1
                        if on_model_call is not None:
                            on_model_call()
                        async with manager.invocation(context_id, turn_id) as invocation:
                            # The model answers: give other sessions the loop.
                            await anyio.lowlevel.checkpoint()
                            invocation.record([step.message])
                        continuation.append(step.message)
                    else:
                        manager.record(context_id, turn_id, [step.message])
                        continuation.append(step.message)
                if takeover_sessions is not None:
                    await manager.leases.release(context_id)  # kept: a survivor sees it finished
                elif store is not None:
                    manager.remove_context(context_id)
                    await manager.leases.flush(context_id)
            except TurnloomError as exc:
                counts["failed"] += 1
                if len(errors) < 10:
                    errors.append(f"{context_id}: {exc}")

        async def ticker(stop: anyio.Event) -> None:
            while not stop.is_set():
                expected = anyio.current_time() + _TICK
                await anyio.sleep(_TICK)
                lags.append(max(0.0, anyio.current_time() - expected))
                recorded.lag_at.append(time.perf_counter() - started)

        stop = anyio.Event()
        # What the process held before the sessions (modules, the scripts) is
        # never garbage: keep full collections from walking it, so their
        # pauses follow what the sessions allocate.
        gc.freeze()
        try:
            async with anyio.create_task_group() as outer:
                outer.start_soon(ticker, stop)
                async with anyio.create_task_group() as group:
                    for number in range(sessions):
                        delay = think_time * number / sessions
                        group.start_soon(session, first_session + number, delay)
                        # Sessions arrive one per loop iteration, as a server
                        # accepts connections; all first steps in one
                        # iteration would stall the loop for sessions x a step.
                        await anyio.lowlevel.checkpoint()
                if takeover_sessions is not None:
                    # Then every other process's sessions, once their leases are free.
                    own = range(first_session, first_session + sessions)
                    async with anyio.create_task_group() as group:
                        for number in range(takeover_sessions):
                            if number not in own:
                                group.start_soon(session, number)
                                await anyio.lowlevel.checkpoint()
                stop.set()
        finally:
            gc.unfreeze()
        stats = manager.statistics()
        takeovers = manager.leases.takeovers
        steps = foundation.collector.statistics() if foundation.collector else None
    seconds = time.perf_counter() - started
    recorded.seconds = seconds
    cpu_seconds = time.process_time() - cpu_started
    return LoadtestReport(
        sessions=sessions,
        sessions_failed=counts["failed"],
        turns=counts["turns"],
        model_calls=counts["calls"],
        prepares=stats.preparations.prepared_total,
        seconds=seconds,
        prepares_per_second=stats.preparations.prepared_total / seconds if seconds else 0.0,
        prepare_p50_ms=percentile(latencies, 50) * 1000,
        prepare_p95_ms=percentile(latencies, 95) * 1000,
        prepare_p99_ms=percentile(latencies, 99) * 1000,
        loop_lag_p99_ms=percentile(lags, 99) * 1000,
        loop_lag_max_ms=max(lags, default=0.0) * 1000,
        gc_full_collections=sum(1 for generation, _ in gc_pauses if generation == 2),
        gc_pause_max_ms=max((pause for _, pause in gc_pauses), default=0.0) * 1000,
        peak_rss_bytes=peak_rss_bytes(),
        rejections=stats.preparations.rejected_total,
        evicted_turns=stats.history.evicted_turns_total,
        errors=tuple(errors),
        store=store or "",
        takeovers=takeovers,
        think_time=think_time,
        render_seconds=rendering[0],
        cpu_seconds=cpu_seconds,
        gc_full_cpu_max_ms=max((cpu for _, cpu in gc_full), default=0.0) * 1000,
        gc_full_steady=sum(1 for at, _ in gc_full if at >= first_prepares[1]),
        collector_steps=steps.steps if steps is not None else 0,
        collector_thorough_steps=steps.thorough_steps if steps is not None else 0,
        collector_step_cpu_max_ms=steps.step_cpu_max_seconds * 1000 if steps is not None else 0.0,
        prefix_reuse=_share(stats.prefix.reused_bytes_total, stats.prefix.bytes_total),
        prefix_reuse_tokens=_share(stats.prefix.reused_tokens_total, stats.prefix.tokens_total),
    )


def _share(part: int, whole: int) -> float:
    return part / whole if whole else 1.0


async def _claim_when_free(manager: ContextManager, context_id: str) -> None:
    """Claim a session's context, waiting while another process holds its lease."""
    while True:
        try:
            await manager.leases.claim(context_id)
            return
        except LeaseHeldError:
            await anyio.sleep(0.1)


def _committed(manager: ContextManager, context_id: str) -> str:
    """The newest turn a claimed context holds, or ``""``."""
    if context_id not in manager.context_ids():
        return ""
    held = manager.history(context_id).turn_ids
    return held[-1] if held else ""


def _after(steps: Sequence[object], turn_id: str) -> int:
    """The index of the first turn after ``turn_id`` in a session's steps (their end if none)."""
    seen = False
    for index, step in enumerate(steps):
        if isinstance(step, Turn):
            if seen:
                return index
            seen = step.turn_id == turn_id
    return len(steps)


class SustainedReport(msgspec.Struct, frozen=True, kw_only=True):
    """How many sessions one process sustains (see :func:`sustained_sessions`).

    Attributes:
        sessions: the most sessions run whose prepare p99 stayed under the
            limit with no failed session (0 when even the first run missed).
        p99_limit_ms: the prepare-latency limit, in milliseconds.
        think_time: the sessions' pause between turns, in seconds.
        runs: every run made, in order.
        missed: the fewest sessions run that missed (p99 at or over the
            limit, or a failed session); 0 when no run missed (every run up
            to ``max_sessions`` held). The sustained count lies between
            ``sessions`` and ``missed``.
    """

    sessions: int
    p99_limit_ms: float
    think_time: float
    runs: tuple[LoadtestReport, ...]
    missed: int = 0


class _SustainedSearch:
    """The plan of the sustained search: the session count to run next, from the verdicts so far.

    Pure: it runs nothing. :attr:`next` is the count to run (``None``: the
    search is over); :meth:`record` takes that run's verdict. Runs double
    from ``start`` while they hold (never past ``max_sessions``), or halve
    from it while they miss (down to 1), then bisect between the largest
    count that held (:attr:`good`, 0 when none did) and the smallest that
    missed (:attr:`bad`, 0 when none did) until ``bad`` is at most
    ``precision`` times ``good`` (or ``good + 1``). When verdicts are
    monotone (every count up to some ``h`` holds, none above it does), the
    result is ``good <= h < bad``, ``bad`` within that bound of ``good``.
    """

    def __init__(self, *, start: int, precision: float, max_sessions: int) -> None:
        if not 1 <= start <= max_sessions:
            raise InputError(f"start must be between 1 and max_sessions, not {start}.")
        if not precision > 1:
            raise InputError(f"precision must be above 1, not {precision!r}.")
        self._precision = precision
        self._max = max_sessions
        self.good = 0
        self.bad = 0
        self.next: int | None = start

    def record(self, held: bool) -> None:
        """Take the verdict of the run of :attr:`next` and plan the one after it.

        Raises:
            RuntimeError: the search is over (:attr:`next` is ``None``).
        """
        if self.next is None:
            raise RuntimeError("the sustained search is over; there is no run to record.")
        if held:
            self.good = self.next
        else:
            self.bad = self.next
        self.next = self._plan()

    def _plan(self) -> int | None:
        good, bad = self.good, self.bad
        if not bad:  # every run held so far: double
            return min(good * 2, self._max) if good < self._max else None
        if not good:  # every run missed so far: halve
            return bad // 2 if bad > 1 else None
        middle = (good + bad) // 2
        if bad <= good * self._precision or middle == good:
            return None
        return middle


async def sustained_sessions(
    trajectories: Sequence[Trajectory],
    *,
    start: int = 100,
    turns: int | None = None,
    think_time: float = 2.0,
    p99_limit_ms: float = 50.0,
    precision: float = 1.1,
    max_sessions: int = 100_000,
    gateway: GatewayType | str = GatewayType.openai_chat,
    config: RuntimeConfig | None = None,
    on_run: Callable[[LoadtestReport], None] | None = None,
) -> SustainedReport:
    """The most concurrent sessions whose prepare p99 stays under ``p99_limit_ms``.

    Runs :func:`loadtest` with ``think_time``, doubling the session count from
    ``start`` until a run misses (p99 at or over the limit, or a failed
    session), or halving it when ``start`` already misses, then bisects
    between the last run that held and the first that missed until they are
    within a factor ``precision``. Each run is a fresh Foundation.

    Args:
        trajectories, turns, gateway, config: as :func:`loadtest`.
        start: the first session count.
        think_time: seconds each session pauses between turns.
        p99_limit_ms: the prepare p99 latency to stay under, milliseconds.
        precision: stop bisecting when the missing count is at most this
            factor above the holding one (> 1). The default, 1.1, brackets
            the result within 10%: two searches then tell a 1.5x change
            apart (at 1.25 their ratio could read anywhere from 1.2x to 1.9x).
        max_sessions: never run more sessions than this; when every run up
            to it holds, it is the result.
        on_run: called with each run's report as it finishes.

    Returns:
        the report; ``sessions`` is the largest count that held, ``missed``
        the smallest that missed.

    Raises:
        InputError: ``start`` not in ``[1, max_sessions]``, ``precision`` not above 1, or as
            :func:`loadtest`.
        ConfigError: as :func:`loadtest`.

    Cancellation:
        Cancelling stops the current run (as :func:`loadtest`); nothing is returned.
    """
    search = _SustainedSearch(start=start, precision=precision, max_sessions=max_sessions)
    runs: list[LoadtestReport] = []
    while search.next is not None:
        report = await loadtest(
            trajectories,
            sessions=search.next,
            turns=turns,
            gateway=gateway,
            config=config,
            think_time=think_time,
        )
        runs.append(report)
        if on_run is not None:
            on_run(report)
        search.record(not report.sessions_failed and report.prepare_p99_ms < p99_limit_ms)
    return SustainedReport(
        sessions=search.good,
        p99_limit_ms=p99_limit_ms,
        think_time=think_time,
        runs=tuple(runs),
        missed=search.bad,
    )
