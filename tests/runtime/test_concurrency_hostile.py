"""Hostile concurrency: ~20 tasks hammering one Foundation on a few shared contexts.

Each task runs a seeded random sequence of operations (commits, prepares with
tiny deadlines or cancelled scopes, invocations recording calls and results,
records, builds and request bytes on held prefixes, retractions, removals of
contexts others use, area attaches and routes) against a Foundation with 2-4
preparation slots and small history limits. Every exception a call raises
must be one its docstring documents; nothing may hang; afterwards the
statistics must be consistent, every held context's next prepare must pass
its gateway's ``validate()``, and the Foundation must close.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest

from turnloom.areas import OneShotNotice, PinnedNotice
from turnloom.context import GatewayType, Message, Role, TextPart, ToolCallPart, ToolResultPart
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    AmbiguousStepError,
    ContextRemovedError,
    DuplicateAreaError,
    DuplicateIdError,
    FoundationClosedError,
    InstructionMessageError,
    InvalidArgumentError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    OutOfOrderTurnError,
    PairedTurnsTooLargeError,
    ProviderRuleError,
    QueueFullError,
    StateError,
    StrandedResultsError,
    TurnTooLargeError,
    UnknownContextError,
    UnknownTurnError,
    UnpairedResultError,
)
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

GATEWAYS = [g.value for g in GatewayType]
SYSTEM = Message(role=Role.system, content="You are a hostile-test agent.")

# The exceptions each call's docstring documents (store/lease/strategy errors
# cannot arise here: no store, no strategy, no token counter).
ACCEPT = (
    FoundationClosedError,
    InvalidMessageError,
    UnpairedResultError,
    InvalidTextError,
    ItemTooLargeError,
    TurnTooLargeError,
    PairedTurnsTooLargeError,
    DuplicateIdError,
    AmbiguousStepError,
    ProviderRuleError,
    OutOfOrderTurnError,
)
RECORD = (
    StateError,
    FoundationClosedError,
    UnknownContextError,
    UnknownTurnError,
    DuplicateIdError,
    InvalidMessageError,
    InvalidTextError,
    InstructionMessageError,
    AmbiguousStepError,
    UnpairedResultError,
    ItemTooLargeError,
    TurnTooLargeError,
    ProviderRuleError,
    StrandedResultsError,
)
PREPARE = (
    FoundationClosedError,
    InvalidMessageError,
    InvalidTextError,
    DuplicateIdError,
    InvalidArgumentError,
    ItemTooLargeError,
    UnknownTurnError,
    ContextRemovedError,
    ProviderRuleError,
    StateError,
)
PREPARE_NOWAIT = (*PREPARE, QueueFullError)
INVOCATION = (
    FoundationClosedError,
    InvalidMessageError,
    UnknownContextError,
    UnknownTurnError,
    StateError,
)
BUILD = (
    FoundationClosedError,
    InvalidMessageError,
    InvalidTextError,
    InstructionMessageError,
    DuplicateIdError,
    AmbiguousStepError,
    UnpairedResultError,
    ProviderRuleError,
    TurnTooLargeError,
    InvalidArgumentError,
)
RETRACT = (
    StateError,
    FoundationClosedError,
    InvalidMessageError,
    UnknownContextError,
    UnknownTurnError,
)
REMOVE = (FoundationClosedError, InvalidMessageError, UnknownContextError)
ATTACH = (
    StateError,
    FoundationClosedError,
    InvalidMessageError,
    UnknownContextError,
    DuplicateAreaError,
)
ROUTE = (
    StateError,
    FoundationClosedError,
    UnknownContextError,
    InvalidMessageError,
    UnpairedResultError,
    InvalidTextError,
    ItemTooLargeError,
)


def text(role: Role, body: str) -> Message:
    return Message(role=role, content=body)


def tool_call(call_id: str) -> Message:
    return Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name="lookup", arguments='{"q": 1}'),),
    )


def tool_result(call_id: str) -> Message:
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, content=(TextPart(text="found"),)),),
    )


def pick(rng: random.Random, turns: list[str]) -> str:
    """Mostly one of the newest turns (older ones are soon evicted), sometimes any."""
    return rng.choice(turns[-2:] if rng.random() < 0.8 else turns)


@dataclass
class Tally:
    """What the tasks saw: unexpected exceptions, and prepares by outcome."""

    findings: list[str] = field(default_factory=list)
    prepare_calls: int = 0
    delivered: int = 0
    raised: dict[str, int] = field(default_factory=dict)


@dataclass
class Held:
    """One task's view: turns it committed and prefixes it holds, per context."""

    turns: dict[str, list[str]] = field(default_factory=dict)
    prefixes: list[Any] = field(default_factory=list)
    epoch: dict[str, int] = field(default_factory=dict)


def guarded(tally: Tally, op: str, allowed: tuple[type[BaseException], ...]) -> Callable[..., Any]:
    """Decorate nothing: a helper that classifies one raised exception."""

    def classify(exc: BaseException) -> None:
        name = type(exc).__name__
        tally.raised[f"{op}:{name}"] = tally.raised.get(f"{op}:{name}", 0) + 1
        if not isinstance(exc, allowed):
            tally.findings.append(f"{op}: undocumented {name}: {exc!r}")

    return classify


async def worker(
    manager: Any,
    rng: random.Random,
    index: int,
    contexts: list[str],
    tally: Tally,
    ops: int,
    epochs: dict[str, int],
) -> None:
    held = Held()
    gateway = manager.gateway
    counter = 0

    def new_id(kind: str) -> str:
        nonlocal counter
        counter += 1
        return f"w{index}-{kind}{counter}"

    async def do_prepare(context_id: str, turn_id: str) -> None:
        request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
        mode = rng.random()
        nowait = rng.random() < 0.2
        classify = guarded(
            tally, "prepare_nowait" if nowait else "prepare", PREPARE_NOWAIT if nowait else PREPARE
        )
        tally.prepare_calls += 1
        call = manager.prepare_nowait if nowait else manager.prepare
        try:
            # A prepare must never wait past this bound: every turn prepared here
            # was committed to the context's current incarnation.
            with anyio.fail_after(10):
                if mode < 0.25:
                    with anyio.move_on_after(rng.choice((0, 0.0001, 0.001))):
                        prefix = await call(request)
                        tally.delivered += 1
                        held.prefixes.append(prefix)
                elif mode < 0.35:
                    with anyio.CancelScope() as scope:
                        scope.cancel()
                        prefix = await call(request)
                        tally.delivered += 1
                        held.prefixes.append(prefix)
                else:
                    prefix = await call(request)
                    tally.delivered += 1
                    held.prefixes.append(prefix)
        except Exception as exc:
            classify(exc)
        if len(held.prefixes) > 6:
            held.prefixes.pop(0)

    for _ in range(ops):
        context_id = rng.choice(contexts)
        # Turns committed since the context's last removal: a prepare issued after a
        # removal waits for a commit to a new context of that id (documented), so a
        # turn of a removed context is never prepared here.
        if held.epoch.get(context_id) != epochs[context_id]:
            held.turns[context_id] = []
            held.epoch[context_id] = epochs[context_id]
        mine = held.turns.setdefault(context_id, [])
        op = rng.random()
        try:
            if op < 0.22 or not mine:
                turn_id = new_id("t")
                messages: tuple[Message, ...] = (
                    text(Role.user, f"hello from {turn_id} " * rng.randint(1, 4)),
                )
                snapshot = TurnSnapshot(
                    context_id=context_id,
                    turn_id=turn_id,
                    input=messages,
                    instructions=(SYSTEM,) if rng.random() < 0.1 else None,
                )
                try:
                    manager.accept_turn(snapshot)
                    mine.append(turn_id)
                except Exception as exc:
                    guarded(tally, "accept_turn", ACCEPT)(exc)
            elif op < 0.42:
                await do_prepare(context_id, pick(rng, mine))
            elif op < 0.55:
                turn_id = pick(rng, mine)
                classify = guarded(tally, "invocation", INVOCATION + RECORD)
                try:
                    async with manager.invocation(context_id, turn_id) as invocation:
                        call_id = new_id("c")
                        if rng.random() < 0.5:
                            invocation.record([tool_call(call_id)])
                            await anyio.sleep(rng.choice((0, 0, 0.001)))
                            if rng.random() < 0.8:
                                invocation.record([tool_result(call_id)])
                        else:
                            await anyio.sleep(0)
                            invocation.record([text(Role.assistant, f"reply {call_id}")])
                except Exception as exc:
                    classify(exc)
            elif op < 0.63:
                turn_id = pick(rng, mine)
                call_id = new_id("c")
                batch = (
                    [tool_call(call_id), tool_result(call_id)]
                    if rng.random() < 0.5
                    else [text(Role.assistant, f"late reply {call_id}")]
                )
                try:
                    manager.record(context_id, turn_id, batch)
                except Exception as exc:
                    guarded(tally, "record", RECORD)(exc)
            elif op < 0.75:
                if held.prefixes:
                    prefix = rng.choice(held.prefixes)
                    continuation: list[Message] = []
                    if rng.random() < 0.5:
                        call_id = new_id("k")
                        continuation = [tool_call(call_id), tool_result(call_id)]
                    recorded = rng.random() < 0.5
                    if rng.random() < 0.5:
                        try:
                            items = manager.build(prefix, continuation, recorded=recorded)
                            problems = gateway.validate(
                                list(gateway.request_body(items)[gateway.items_field])
                            )
                            if problems:
                                tally.findings.append(f"build: invalid input {problems!r}")
                        except Exception as exc:
                            guarded(tally, "build", BUILD)(exc)
                    else:
                        try:
                            manager.request_bytes(
                                prefix, continuation, fields={"model": "m"}, recorded=recorded
                            )
                        except Exception as exc:
                            guarded(tally, "request_bytes", BUILD)(exc)
            elif op < 0.81:
                try:
                    manager.voice.retract_turn(context_id, mine[-1])
                except Exception as exc:
                    guarded(tally, "retract_turn", RETRACT)(exc)
            elif op < 0.85:
                try:
                    manager.remove_context(context_id)
                    epochs[context_id] += 1
                except Exception as exc:
                    guarded(tally, "remove_context", REMOVE)(exc)
            elif op < 0.93:
                area = (
                    OneShotNotice(f"notice {new_id('n')}")
                    if rng.random() < 0.7
                    else PinnedNotice(f"pinned {new_id('n')}")
                )
                try:
                    manager.areas.attach(context_id, area)
                except Exception as exc:
                    guarded(tally, "areas.attach", ATTACH)(exc)
            else:
                item = gateway.render(text(Role.assistant, f"routed {new_id('r')}"))[0]
                try:
                    manager.areas.route(context_id, item)
                except Exception as exc:
                    guarded(tally, "areas.route", ROUTE)(exc)
        except Exception as exc:  # a harness bug or an error outside the guarded calls
            tally.findings.append(f"harness: {type(exc).__name__}: {exc!r}")
        await anyio.sleep(0)


async def run_stress(gateway: str, seed: int, *, tasks: int = 20, ops: int = 60) -> Tally:
    rng = random.Random(seed)
    capacity = rng.randint(2, 4)
    limits = HistoryLimits(
        max_turns=rng.randint(4, 8), max_items=rng.randint(12, 30), low_water=rng.choice((1.0, 0.5))
    )
    contexts = [f"ctx{n}" for n in range(6)]
    tally = Tally()
    epochs = dict.fromkeys(contexts, 0)
    with anyio.fail_after(60):
        async with Foundation(
            gateway=gateway, max_pending_preparations=capacity, history_limits=limits
        ) as foundation:
            manager = foundation.manager
            async with anyio.create_task_group() as group:
                for index in range(tasks):
                    group.start_soon(
                        worker,
                        manager,
                        random.Random(rng.getrandbits(64)),
                        index,
                        contexts,
                        tally,
                        ops,
                        epochs,
                    )
            # Quiesced: the statistics must be consistent.
            stats = manager.statistics()
            prep = stats.preparations
            assert prep.pending == 0, prep
            assert prep.waiting_for_slot == 0, prep
            assert prep.waiting_for_turn == 0, prep
            assert stats.invocations == 0, stats
            assert stats.areas.attached >= 0, stats.areas
            for name in ("prepared_total", "failed_total", "discarded_total", "rejected_total"):
                assert getattr(prep, name) >= 0, prep
            for name in (
                "turns",
                "items",
                "bytes",
                "evicted_turns_total",
                "dropped_late_outputs_total",
            ):
                assert getattr(stats.history, name) >= 0, stats.history
            # Every delivered prepare was counted as prepared; no call settles twice.
            assert prep.prepared_total == tally.delivered, (prep, tally.delivered)
            settled = prep.prepared_total + prep.failed_total + prep.discarded_total
            assert settled + prep.rejected_total <= tally.prepare_calls, (prep, tally.prepare_calls)
            assert stats.contexts == len(manager.context_ids())
            # Every held context's next prepare passes the provider's rules.
            gw = manager.gateway
            for context_id in manager.context_ids():
                manager.accept_turn(
                    TurnSnapshot(
                        context_id=context_id, turn_id="final", input=(text(Role.user, "final"),)
                    )
                )
                prefix = await manager.prepare(
                    ContextPrepareRequest(context_id=context_id, turn_id="final")
                )
                body = manager.request_body(prefix, recorded=True)
                problems = gw.validate(list(body[gw.items_field]))
                assert problems == [], (context_id, problems)
        # The close terminated (inside fail_after).
        assert manager.closed
    return tally


@pytest.mark.parametrize("gateway", GATEWAYS)
@pytest.mark.parametrize("seed", [1, 7, 2024])
async def test_hostile_concurrency_stress(gateway: str, seed: int) -> None:
    tally = await run_stress(gateway, seed)
    assert tally.findings == [], tally.findings[:10]
    assert tally.delivered > 0


# -- findings, shrunk ----------------------------------------------------------
