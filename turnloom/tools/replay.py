"""Replay recorded agent transcripts through one Foundation (``turnloom replay``).

Each trajectory (a list of OpenAI Chat messages) is one session, one context,
walked into turns by :func:`turnloom.tools.transcript.walk`:

* every turn is committed and ``prepare`` builds the input of its first
  model call;
* every ``assistant`` reply is one model call: its input is the prefix
  (first call of the turn) or ``build(prefix, continuation)`` (later calls);
  the recorded reply is then recorded as the turn's output inside an
  invocation, and so are the ``tool`` results.

For OpenAI Chat the prepared input of every model call is checked against the
trajectory itself: it must equal, message for message, the messages before
that assistant reply. With an assembly strategy (``strategy="jit"`` or
``"stratified"`` and a memory source) every session acts for one tenant
scope; the assembled system prompt (the first item) and the runtime-state
pair carrying the recalled memory are what the strategy adds, and the rest
must still equal the trajectory. So with a host configuration
(``--config``): its behaviour rules add the runtime-state pair to every input
(and each earlier turn keeps its pair under ``earlier_state="keep"``), its
areas add the area section; the replay compares the input less these
additions with the trajectory and counts the items it set aside
(``added_items``). Three documented normalizations are allowed, and
counted as ``normalized``: what the gateway round trip changes (for example an
empty text part is never emitted), calls left without a result, which are
excluded, and call ids reused from an earlier call, which are renamed so that
each request carries every call id once (:mod:`turnloom.context.callids`).
For the other gateways the item list of every request
body (``request_body``) must pass the gateway's ``validate()``.

A trajectory that is malformed (not JSON, an unknown role, a tool message
that answers no preceding call) is reported with its file, trajectory index
and message index; the other sessions still run.
"""

from __future__ import annotations

__all__ = (
    "REPLAY_LIMITS",
    "ReplayError",
    "ReplaySummary",
    "Trajectory",
    "builtin_trajectories",
    "load_trajectories",
    "replay",
    "session_ids",
)

import json
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, BinaryIO

import anyio
import msgspec

from turnloom.context.callids import rename_call_ids
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, get_gateway, step_join
from turnloom.context.history import HistoryLimits
from turnloom.context.memory import MemorySource, TenantScope, check_tenant_scope
from turnloom.context.message import Message
from turnloom.context.pairing import complete_pairs
from turnloom.errors import InputError, TurnloomError
from turnloom.runtime.config import RuntimeConfig, build_context_manager
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.manager import ContextManager
from turnloom.runtime.schemas import ContextPrepareRequest, PreparedContext
from turnloom.runtime.state import state_call_id
from turnloom.tools._stats import percentile
from turnloom.tools.trajectories import (
    ReplayError,
    Trajectory,
    builtin_trajectories,
    check_trajectory,
    load_trajectories,
)
from turnloom.tools.transcript import Reply, Turn, snapshot, turn_ids, walk

_encoder = msgspec.json.Encoder()
_CHAT = GatewayType.openai_chat

REPLAY_LIMITS = HistoryLimits(
    max_turns=100_000, max_items=1_000_000, max_bytes=1 << 40, max_item_bytes=64 << 20
)
"""The history bounds of a replay: no recorded session is ever evicted (eviction
would change the inputs the replay checks) and one message may be up to 64 MiB.
The library's defaults (:class:`~turnloom.context.history.HistoryLimits`, used
by ``loadtest``) are far lower."""


def session_ids(trajectories: Sequence[Trajectory]) -> list[str]:
    """The context id of each trajectory in a replay, unique by position.

    ``"<position>:<file name>#<index>"``: ``position`` is the trajectory's
    place in the replayed sequence, so the same file given twice, or two
    files with one name in different folders, never share a context.
    """
    return [
        f"{position}:{Path(t.source).name}#{t.index}" for position, t in enumerate(trajectories)
    ]


class ReplaySummary(msgspec.Struct, frozen=True, kw_only=True):
    """What a replay did.

    Attributes:
        sessions: sessions replayed to the end.
        turns: turns committed.
        model_calls: model inputs prepared (one per recorded assistant reply).
        items: native items over all prepared inputs.
        bytes: serialized bytes over all prepared inputs (sum of item sizes).
        normalized: inputs equal to the trajectory only after a documented
            normalization (OpenAI Chat only).
        errors: trajectories that failed, with where and why.
        prepare_p50_ms, prepare_p99_ms: ``prepare`` latency percentiles, in
            milliseconds (nearest rank).
        seconds: wall time of the replay, in seconds.
        strategy: the assembly strategy's name, or None.
        hydrated_entries: memory entries the strategy recalled.
        prefix_reuse: share of each previous prepared input of a session
            that the next one reused byte for byte (1.0 when none compared).
        prefix_reuse_tokens: the same share in tokens (estimated by byte
            share per prefix, see ``PreparedContext.reused_tokens``).
        added_items: items of the documented additions -- the assembled
            system prompt, runtime-state pairs (the turn's and earlier turns'
            kept ones), the area section -- set aside before an input was
            compared with the trajectory, summed over model calls (OpenAI
            Chat only).
    """

    sessions: int
    turns: int
    model_calls: int
    items: int
    bytes: int
    normalized: int
    errors: tuple[ReplayError, ...]
    prepare_p50_ms: float
    prepare_p99_ms: float
    seconds: float
    strategy: str | None = None
    hydrated_entries: int = 0
    prefix_reuse: float = 1.0
    prefix_reuse_tokens: float = 1.0
    added_items: int = 0


# -- replaying ---------------------------------------------------------------------


class _Totals:
    __slots__ = (
        "added",
        "calls",
        "items",
        "latencies",
        "normalized",
        "sessions",
        "total_bytes",
        "turns",
    )

    def __init__(self) -> None:
        self.sessions = self.turns = self.calls = self.items = self.total_bytes = 0
        self.normalized = self.added = 0
        self.latencies: list[float] = []


def _expected(chat: Gateway, messages: Sequence[Message]) -> list[NativeContent]:
    out: list[NativeContent] = []
    for message in complete_pairs(messages, join=step_join(chat)):
        out.extend(chat.render(message))
    return rename_call_ids(chat.type, out)


async def _replay_one(
    foundation: Foundation,
    trajectory: Trajectory,
    context_id: str,
    chat: Gateway,
    totals: _Totals,
    emit: Callable[[bytes], None] | None,
    scope: TenantScope | None = None,
) -> ReplayError | None:
    parsed = check_trajectory(trajectory)
    if isinstance(parsed, ReplayError):
        return parsed
    manager = foundation.manager
    gateway = manager.gateway
    verify_exact = gateway.type is _CHAT
    prefix: PreparedContext | None = None
    continuation: list[Message] = []
    turn_id = ""
    turn_number = -1
    call_index = 0
    turns = calls = items_total = bytes_total = normalized = added = 0
    # The state-pair call ids of the session's turns so far (earlier turns keep theirs).
    state_ids: set[str] = set()
    latencies: list[float] = []
    index = 0

    def fail(index: int, reason: str) -> ReplayError:
        return ReplayError(
            source=trajectory.source, trajectory=trajectory.index, message=index, reason=reason
        )

    try:
        for step in walk(parsed, ids=turn_ids("turn-")):
            index = step.index
            if isinstance(step, Turn):
                turn_id, turn_number = step.turn_id, step.number
                state_ids.add(state_call_id(context_id, turn_id))
                manager.accept_turn(snapshot(context_id, step))
                turns += 1
                started = time.perf_counter()
                prefix = await manager.prepare(
                    ContextPrepareRequest(context_id=context_id, turn_id=turn_id, tenant=scope)
                )
                latencies.append(time.perf_counter() - started)
                continuation = []
                call_index = 0
                continue
            assert prefix is not None
            message = step.message
            if isinstance(step, Reply):
                items = manager.build(prefix, continuation) if continuation else prefix.items
                size = prefix.bytes + sum(
                    len(_encoder.encode(i)) for i in items[prefix.item_count :]
                )
                if verify_exact:
                    core = _without_additions(prefix, items, state_ids)
                    added += len(items) - len(core)
                    if core != trajectory.messages[:index]:
                        if core != _expected(chat, parsed[:index]):
                            return fail(index, _first_difference(core, trajectory.messages[:index]))
                        normalized += 1
                else:
                    # The provider's rules apply to the request body, where
                    # the gateway lifts instructions and merges adjacent turns.
                    body = gateway.request_body(items)
                    violations = gateway.validate(body[gateway.items_field])
                    if violations:
                        return fail(
                            index,
                            f"the prepared input breaks a {gateway.type.value} rule: "
                            f"{violations[0].message}",
                        )
                calls += 1
                items_total += len(items)
                bytes_total += size
                if emit is not None:
                    emit(
                        _encoder.encode(
                            {
                                "session": context_id,
                                "turn": turn_number,
                                "call": call_index,
                                **(
                                    {"messages": items}
                                    if verify_exact
                                    else {"request": gateway.request_body(items)}
                                ),
                            }
                        )
                        + b"\n"
                    )
                call_index += 1
                async with manager.invocation(context_id, turn_id) as invocation:
                    invocation.record([message])
            else:
                manager.record(context_id, turn_id, [message])
            continuation.append(message)
    except TurnloomError as exc:
        return fail(index, str(exc))
    finally:
        try:
            manager.remove_context(context_id)
        except TurnloomError:
            pass
    totals.sessions += 1
    totals.turns += turns
    totals.calls += calls
    totals.items += items_total
    totals.total_bytes += bytes_total
    totals.normalized += normalized
    totals.added += added
    totals.latencies.extend(latencies)
    return None


def _without_additions(
    prefix: PreparedContext, items: Sequence[NativeContent], state_ids: set[str]
) -> list[NativeContent]:
    """OpenAI Chat ``items`` without what the runtime documents adding to a transcript.

    That is the assembled system prompt of a strategy (``items[0]``), the area
    section (``area_items`` items from ``area_start``) and every runtime-state
    pair: the turn's own, right before ``area_start``, and the pairs earlier
    turns keep (``earlier_state="keep"``), found by their call ids
    (``state_ids``: :func:`~turnloom.runtime.state.state_call_id` of each
    turn so far; the door reserves those ids for the pairs).
    """
    core = list(items)
    del core[prefix.area_start : prefix.area_start + prefix.area_items]
    if prefix.assembled is not None and prefix.assembled.system_prompt is not None:
        del core[0]
    if not state_ids:
        return core
    return [item for item in core if not _is_state_item(item, state_ids)]


def _is_state_item(item: NativeContent, state_ids: set[str]) -> bool:
    """True for the Chat call or result of a runtime-state pair (by its call id)."""
    if item.get("role") == "tool":
        return item.get("tool_call_id") in state_ids
    calls = item.get("tool_calls") if item.get("role") == "assistant" else None
    return bool(calls) and all(c.get("id") in state_ids for c in calls)  # type: ignore[union-attr]


def _first_difference(items: Sequence[NativeContent], expected: Sequence[Any]) -> str:
    for position, (got, want) in enumerate(zip(items, expected, strict=False)):
        if got != want:
            return (
                f"the prepared input differs from the trajectory at message {position}: "
                f"prepared {json.dumps(got)[:120]}, recorded {json.dumps(want)[:120]}."
            )
    return (
        f"the prepared input has {len(items)} messages; the trajectory has "
        f"{len(expected)} before this reply."
    )


async def replay(
    trajectories: Sequence[Trajectory],
    *,
    gateway: GatewayType | str = GatewayType.openai_chat,
    concurrency: int = 8,
    out: BinaryIO | None = None,
    history_limits: HistoryLimits | None = None,
    load_errors: Sequence[ReplayError] = (),
    on_session: Callable[[], None] | None = None,
    config: RuntimeConfig | None = None,
    strategy: str | None = None,
    memory: MemorySource | None = None,
    scope: TenantScope | None = None,
) -> ReplaySummary:
    """Replay ``trajectories`` through one Foundation, ``concurrency`` sessions at a time.

    Args:
        trajectories: the sessions to replay.
        gateway: the provider to prepare inputs for.
        concurrency: sessions replayed at once.
        out: where to write every prepared input as JSONL (``session``,
            ``turn``, ``call``, and ``messages`` for OpenAI Chat or the
            gateway's ``request`` body for the others), or None.
        history_limits: the history bounds (default :data:`REPLAY_LIMITS`:
            no eviction, messages up to 64 MiB).
        load_errors: errors from loading, carried into the summary.
        strategy: the assembly strategy (``"jit"`` or ``"stratified"``), or None.
        memory: the memory source the strategy searches (borrowed: not closed).
        scope: the tenant every session acts for.
        on_session: called on the event loop after each session ends,
            replayed or failed (drives a progress bar).
        config: a host configuration (``turnloom replay --config FILE``):
            the manager is built from its ``context`` section before the
            Foundation is bound, and ``history_limits`` is not used.

    Each session's context id is its :func:`session_ids` entry, so no two
    sessions share a context and one session's failure never touches another.

    Returns:
        the summary; failed sessions are listed in ``errors``, never raised.

    Raises:
        InputError: ``gateway`` is unknown or not available,
            ``concurrency`` is not positive, a bad strategy, memory or scope,
            or ``strategy`` together with ``config`` (the configured plugin
            builds the manager).
        UnknownStrategyError: ``strategy`` names no known strategy.
        ConfigError: ``config`` names a plugin that no longer resolves or
            builds no ContextManager.

    Cancellation:
        Cancelling the replay cancels the sessions and closes the Foundation;
        records already handed to ``out`` are written.
    """
    get_gateway(gateway)
    check_tenant_scope(scope)
    if concurrency < 1:
        raise InputError(f"concurrency must be a positive integer, not {concurrency}.")
    limits = history_limits or REPLAY_LIMITS
    ids = session_ids(trajectories)
    chat = get_gateway(_CHAT)
    totals = _Totals()
    errors: list[ReplayError] = list(load_errors)
    started = time.perf_counter()
    results: list[ReplayError | None] = [None] * len(trajectories)
    next_index = 0
    lock = anyio.Lock()

    if config is not None:
        if strategy is not None or memory is not None:
            raise InputError(
                "A replay with a config builds its manager with the configured plugin; "
                "strategy and memory cannot be added to it."
            )
        manager = build_context_manager(config, gateway=gateway)
    else:
        manager = ContextManager(
            gateway=gateway,
            history_limits=limits,
            max_pending_preparations=max(16, concurrency),
            strategy=strategy,
            memory=memory,
        )
    async with Foundation(manager) as foundation:

        async def worker() -> None:
            nonlocal next_index
            while next_index < len(trajectories):
                position = next_index
                next_index += 1
                records: list[bytes] = []
                results[position] = await _replay_one(
                    foundation,
                    trajectories[position],
                    ids[position],
                    chat,
                    totals,
                    records.append if out is not None else None,
                    scope,
                )
                if on_session is not None:
                    on_session()
                if out is not None and records:
                    # One session's records stay together; the file is written
                    # off the event loop.
                    async with lock:
                        await anyio.to_thread.run_sync(out.writelines, records)

        async with anyio.create_task_group() as workers:
            for _ in range(min(concurrency, max(1, len(trajectories)))):
                workers.start_soon(worker)
        statistics = foundation.manager.statistics()
    errors.extend(e for e in results if e is not None)
    return ReplaySummary(
        sessions=totals.sessions,
        turns=totals.turns,
        model_calls=totals.calls,
        items=totals.items,
        bytes=totals.total_bytes,
        normalized=totals.normalized,
        errors=tuple(errors),
        prepare_p50_ms=percentile(totals.latencies, 50) * 1000,
        prepare_p99_ms=percentile(totals.latencies, 99) * 1000,
        seconds=time.perf_counter() - started,
        strategy=statistics.assembly.strategy,
        hydrated_entries=statistics.assembly.entries_total,
        prefix_reuse=(
            statistics.prefix.reused_bytes_total / statistics.prefix.bytes_total
            if statistics.prefix.bytes_total
            else 1.0
        ),
        prefix_reuse_tokens=(
            statistics.prefix.reused_tokens_total / statistics.prefix.tokens_total
            if statistics.prefix.tokens_total
            else 1.0
        ),
        added_items=totals.added,
    )
