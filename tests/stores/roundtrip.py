"""Durable round trips of real transcripts: drive a manager, release, claim elsewhere, compare.

A recorded tau-bench trajectory is played through a ContextManager on a
SQLite store, in its natural form (each user message a turn, the model's
calls and the tools' results recorded to it) or as an approval flow (the
tools' results given as the next turn's input), with small history limits
and the host's awkward moves mixed in, chosen by a seeded random generator:
a prepare with a contribution before a model call (its runtime-state pair is
kept, ``earlier_state="keep"``), a barge-in (``played=``), a false start
retracted, a model call cancelled before it answered, a model call still in
flight while the user barges in and the store compacts the log into a
checkpoint (its output is recorded late, to the earlier turn), a call id
reused by a later turn, and moves the manager refuses (a turn of results
answering nothing, a turn over ``max_items``, a late record stranding an
approval's results). Two contexts replay the same trajectory, so every id
is reused across contexts.

Each refusal must leave the history and the log as they were (nothing
queued for the store). At the end the host releases its contexts (closes);
another host claims them and its prepare of the newest turn must equal the
first host's, byte for byte (``request_bytes``).
"""

from __future__ import annotations

import functools
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import anyio

from tests.runtime.helpers import call, result
from tests.stores.helpers import hosting
from turnloom.context import GatewayType, Message, Role
from turnloom.context.history import HistoryLimits
from turnloom.errors import TurnloomError
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    TurnSnapshot,
    _durable,
)
from turnloom.tools.trajectories import Trajectory, check_trajectory

__all__ = ("Outcome", "round_trip", "transcripts")

FORMS = ("natural", "approval")
CONTEXTS = ("a", "b")


def transcripts(path: Path, count: int) -> list[list[Message]]:
    """The first ``count`` trajectories of the tau-bench file that check."""
    import json

    data = json.loads(path.read_text())
    out: list[list[Message]] = []
    for index, entry in enumerate(data):
        trajectory = Trajectory(source=str(path), index=index, messages=entry["traj"])
        checked = check_trajectory(trajectory)
        if isinstance(checked, list):
            out.append(checked)
        if len(out) == count:
            break
    return out


@dataclass
class Outcome:
    """What one round trip saw."""

    steps: int = 0
    refusals: dict[str, int] = field(default_factory=dict)
    refusals_that_changed: list[str] = field(default_factory=list)
    mismatches: list[str] = field(default_factory=list)
    compactions: int = 0

    def refused(self, what: str) -> None:
        self.refusals[what] = self.refusals.get(what, 0) + 1


def _request(context_id: str, turn_id: str, n: int) -> ContextPrepareRequest:
    return ContextPrepareRequest(
        context_id=context_id,
        turn_id=turn_id,
        contributions=(ContextContribution(name="memory", content=f"note {n}"),),
    )


class _Host:
    """One context's driver on one manager."""

    def __init__(
        self, manager: ContextManager, context_id: str, rng: random.Random, out: Outcome
    ) -> None:
        self.manager = manager
        self.cid = context_id
        self.rng = rng
        self.out = out
        self.turns: list[str] = []
        self.serial = 0

    def _snapshot(self) -> tuple[tuple[Message, ...], int]:
        stats = self.manager.statistics().store
        assert stats is not None
        return self.manager.history(self.cid).messages(), stats.pending_records

    def attempt(self, what: str, action: Callable[[], object]) -> bool:
        """Run ``action()``; a TurnloomError must leave history and log unchanged."""
        before = self._snapshot() if self.turns else None
        try:
            action()
        except TurnloomError as exc:
            self.out.refused(f"{what}:{type(exc).__name__}")
            if before is not None and self._snapshot() != before:
                self.out.refusals_that_changed.append(f"{self.cid} {what}: {exc}")
            return False
        self.out.steps += 1
        return True

    def commit(self, messages: Sequence[Message], instructions: Sequence[Message] | None) -> bool:
        self.serial += 1
        turn_id = f"t{self.serial}"
        snapshot = TurnSnapshot(
            context_id=self.cid,
            turn_id=turn_id,
            input=tuple(messages),
            instructions=tuple(instructions) if instructions is not None else None,
        )
        if self.attempt("commit", lambda: self.manager.accept_turn(snapshot)):
            self.turns.append(turn_id)
            return True
        return False

    def record(self, messages: Sequence[Message], turn_id: str | None = None) -> bool:
        target = turn_id or self.turns[-1]
        return self.attempt("record", lambda: self.manager.record(self.cid, target, messages))

    async def prepare(self) -> None:
        if not self.turns:
            return
        newest = self.turns[-1]
        try:
            await self.manager.prepare(_request(self.cid, newest, self.serial))
        except TurnloomError as exc:
            self.out.refused(f"prepare:{type(exc).__name__}")

    async def noise(self) -> None:
        """One of the awkward host moves, maybe."""
        rng, manager, cid = self.rng, self.manager, self.cid
        if not self.turns:
            return  # a false start evicted every turn before it, then left
        roll = rng.random()
        if roll < 0.08:  # a false start, retracted
            if self.commit([Message(role=Role.user, content="um")], None):
                turn_id = self.turns[-1]
                if self.attempt("retract", lambda: manager.voice.retract_turn(cid, turn_id)):
                    # Its retraction gave back the turns its commit evicted.
                    held = manager.history(cid).turn_ids
                    self.turns = [t for t in self.turns if t in held]
        elif roll < 0.16:  # a model call cancelled before it answered
            with anyio.move_on_after(0):
                async with manager.invocation(cid, self.turns[-1]):
                    await anyio.sleep(1)
        elif roll < 0.22:  # refused: a turn of results answering nothing
            self.commit([result("never-made", "x")], None)
        elif roll < 0.26:  # refused: a turn over max_items
            limit = manager.history_limits.max_items
            self.commit([Message(role=Role.user, content=f"q{i}") for i in range(limit + 1)], None)
        elif roll < 0.30:  # refused (or not): a late text to an earlier turn
            if len(self.turns) > 1:
                earlier = rng.choice(self.turns[:-1])
                late = Message(role=Role.assistant, content="a late aside")
                self.attempt("late", lambda: manager.record(cid, earlier, [late]))
        elif roll < 0.36:  # a call id reused across turns
            self.record([call("reused"), result("reused", f"again {self.serial}")])

    async def model_call(self, turn_id: str, outputs: Sequence[Message], barge: bool) -> None:
        """Record one model call's outputs through an invocation of ``turn_id``.

        With ``barge``, the user barges in while the call is in flight (a new
        turn is committed), the store writes and compacts, and the call's
        output lands late, to ``turn_id``.
        """
        manager, cid = self.manager, self.cid
        try:
            invocation_cm = manager.invocation(cid, turn_id)
            invocation = await invocation_cm.__aenter__()
        except TurnloomError as exc:
            self.out.refused(f"invocation:{type(exc).__name__}")
            return
        try:
            if barge:
                self.commit([Message(role=Role.user, content="wait, one more thing")], None)
                await manager.leases.flush(cid)
            message = outputs[0]
            text = message.text if message.role is Role.assistant else ""
            if (
                barge is False
                and text
                and not message.tool_calls
                and len(outputs) == 1
                and self.rng.random() < 0.15
            ):
                played = len(text) // 2
                self.attempt(
                    "interrupted",
                    lambda: invocation.record_interrupted(message, played=played),
                )
            else:
                self.attempt("invocation.record", lambda: invocation.record(list(outputs)))
        finally:
            await invocation_cm.__aexit__(None, None, None)


def _turns(messages: Sequence[Message]) -> tuple[list[Message], list[list[Message]]]:
    """Instructions, and the transcript cut at each user message."""
    pinned = [m for m in messages if m.role in (Role.system, Role.developer)]
    turns: list[list[Message]] = []
    for message in messages:
        if message.role in (Role.system, Role.developer):
            continue
        if message.role is Role.user or not turns:
            turns.append([message])
        else:
            turns[-1].append(message)
    return pinned, turns


async def _drive(host: _Host, messages: Sequence[Message], form: str) -> None:
    pinned, turns = _turns(messages)
    rng = host.rng
    first = True
    for turn in turns:
        if not host.commit(turn[:1], pinned if first else None):
            continue
        first = False
        outputs = turn[1:]
        i = 0
        while i < len(outputs):
            await host.noise()
            if not host.turns:
                break
            message = outputs[i]
            j = i + 1
            while j < len(outputs) and outputs[j].role is Role.tool:
                j += 1
            results = outputs[i + 1 : j]
            if rng.random() < 0.5:
                await host.prepare()
            barge = rng.random() < 0.1
            await host.model_call(host.turns[-1], [message], barge)
            if results:
                if form == "approval" and host.commit(results, None):
                    # The results are the next turn's input; a late text to the
                    # turn of their calls would strand them (refused).
                    if rng.random() < 0.3:
                        late = Message(role=Role.assistant, content="never mind")
                        calls_turn = host.turns[-2]
                        host.attempt(
                            "late",
                            functools.partial(host.manager.record, host.cid, calls_turn, [late]),
                        )
                else:
                    host.record(results)
            i = j
    await host.noise()


async def round_trip(
    path: Path,
    transcript: Sequence[Message],
    kind: GatewayType,
    limits: HistoryLimits,
    form: str,
    seed: int,
) -> Outcome:
    """Play ``transcript`` on two contexts, release, claim on another host, compare."""
    out = Outcome()
    url = f"sqlite:{path}"
    # Compact often, so restores start from checkpoints (some written while a
    # model call was in flight, its eviction held back).
    saved = _durable._COMPACT_MIN, _durable._COMPACT_PER_TURN
    _durable._COMPACT_MIN, _durable._COMPACT_PER_TURN = 6, 2
    try:
        return await _round_trip(url, transcript, kind, limits, form, seed, out)
    finally:
        _durable._COMPACT_MIN, _durable._COMPACT_PER_TURN = saved


async def _round_trip(
    url: str,
    transcript: Sequence[Message],
    kind: GatewayType,
    limits: HistoryLimits,
    form: str,
    seed: int,
    out: Outcome,
) -> Outcome:
    expected: dict[str, bytes] = {}
    newest: dict[str, tuple[str, int]] = {}
    async with hosting(url, gateway=kind, history_limits=limits) as first:
        manager = first.manager
        for n, cid in enumerate(CONTEXTS):
            await manager.leases.claim(cid)
            host = _Host(manager, cid, random.Random(seed * 2 + n), out)
            await _drive(host, transcript, form)
            if not host.turns:
                out.refused("empty-at-end")
                continue
            await manager.leases.flush()
            prepared = await manager.prepare(_request(cid, host.turns[-1], host.serial))
            expected[cid] = manager.request_bytes(prepared)
            newest[cid] = (host.turns[-1], host.serial)
        stats = manager.statistics().store
        assert stats is not None
        out.compactions = stats.compactions_total
    async with hosting(url, gateway=kind, history_limits=limits) as second:
        manager = second.manager
        for cid in expected:
            await manager.leases.claim(cid)
            turn_id, serial = newest[cid]
            prepared = await manager.prepare(_request(cid, turn_id, serial))
            if manager.request_bytes(prepared) != expected[cid]:
                out.mismatches.append(cid)
    return out
