"""A hypothesis state machine: a checkpoint taken at any point replays into the live history.

Rules: commit turns (user text, or results answering the newest turn's open
calls), record outputs (text, calls, results; late ones for earlier turns),
keep state pairs of any size (none, small, large) on the newest or an earlier
turn, evict, and retract the newest turn (a false start). Limits on turns,
items, bytes or tokens (the runtime's 1,024 remembered evicted ids).

Invariant: after every step, replaying a checkpoint of the history and the
records :func:`~turnloom.runtime._records.compacted` logs after it (while
turns are held aside for a retraction: their eviction, then the newest turn's
kept state when it changed since) rebuilds the live history: its turns, pinned
instructions, held, message and remembered ids, ties, turns held aside, and
the renders of the newest turn on every gateway; and retracting the newest turn
in both gives the same history again. The replay's observations include the
count of forgotten evicted ids.

:class:`SummaryCheckpointMachine` adds summaries (``summary_range``,
``apply_summary``, logged as the runtime logs them), prunings, and a false
start run as one rule with the invariant checked at each step: commit, evict,
grow the newest turn's kept state (its own call id, as the runtime's state
pairs have), evict again (dropping a held summary turn once only it is left)
and maybe retract; so the invariant holds with a summary turn held, while
turns are held aside, in history order.
"""

from __future__ import annotations

import contextlib
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.context.test_history import SYSTEM, _answer
from tests.context.test_history_evict_stateful import assistant, call, result, user
from turnloom.context import GatewayType, get_gateway
from turnloom.context.history import (
    HistoryLimits,
    TurnHistory,
    apply_summary,
    next_summary_id,
    prune_turns,
    summary_range,
)
from turnloom.errors import StateError, TurnloomError, UnknownTurnError
from turnloom.runtime._records import (
    OutputsRecorded,
    Record,
    StateKept,
    TurnCommitted,
    TurnRetracted,
    TurnsEvicted,
    TurnsPruned,
    TurnsSummarized,
    checkpoint,
    compacted,
    encode_record,
    replay,
)

LIMITS = (
    HistoryLimits(max_turns=3),
    HistoryLimits(max_items=12),
    HistoryLimits(max_bytes=2400),
    HistoryLimits(max_tokens=40),
)


def _observe(history: TurnHistory) -> dict[str, Any]:
    """What a replay must rebuild (not the counters of what left before the checkpoint)."""
    view = history.view()
    return {
        "turns": [
            (t, view.turn_messages(t), view.turn_state(t), view.turn_input(t))
            for t in view.turn_ids
        ],
        "pinned": view.pinned,
        "open_calls": history.open_calls(),
        "over_limits": history.over_limits(),
        "sequence": history.sequence,
        "ids": set(history._ids),
        "message_ids": {k: v[1] for k, v in history._message_ids.items()},
        "linked": {
            view.turn_ids.index(t)
            for t in view.turn_ids
            if history.turn_serial(t) in history._linked
        },
        "remembered": history.evicted_ids,
        "forgotten": history._forgotten,
        "restorable": history.restorable_ids,
        "items": history.statistics().items,
        "bytes": history.statistics().bytes,
        "tokens": history.statistics().tokens,
        "restorable_turns": history.statistics().restorable_turns,
    }


def _renders(history: TurnHistory) -> list[Any]:
    view = history.view()
    if not view.turn_ids:
        return []
    newest = view.turn_ids[-1]
    return [list(view.render(get_gateway(kind), newest).items) for kind in GatewayType]


class CheckpointMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.history = TurnHistory(HistoryLimits())
        self.turn = 0
        self.limits = LIMITS[0]
        self.log: list[Record] = []  # every change, as a durable store logs it

    @initialize(limits=st.sampled_from(LIMITS))
    def start(self, limits: HistoryLimits) -> None:
        self.limits = limits
        self.history = TurnHistory(limits)
        self.history.commit("t0", [user("u0")], instructions=[SYSTEM])
        self.log = [TurnCommitted(turn_id="t0", input=(user("u0"),), instructions=(SYSTEM,))]

    def _committed(self, before: tuple[str, ...]) -> None:
        view = self.history.view()
        if view.turn_ids and view.turn_ids[-1] not in before:
            turn_id = view.turn_ids[-1]
            self.log.append(TurnCommitted(turn_id=turn_id, input=view.turn_input(turn_id)))

    @rule(n=st.integers(0, 5), approve=st.booleans())
    def commit(self, n: int, approve: bool) -> None:
        history = self.history
        before = history.turn_ids
        with contextlib.suppress(TurnloomError):
            if not (approve and _answer(history, n)):
                self.turn += 1
                history.commit(f"t{self.turn}", [user(f"u{self.turn}")] * (n % 2 + 1))
        self._committed(before)

    @rule(kind=st.sampled_from(["text", "call", "pair", "late"]), n=st.integers(0, 8))
    def record(self, kind: str, n: int) -> None:
        history = self.history
        turns = history.turn_ids
        if not turns:
            return
        cid = f"k{n % 3}"
        if kind == "text":
            outputs = [assistant(f"a{n}")]
        elif kind == "call":
            outputs = [call(cid)]
        elif kind == "pair":
            outputs = [call(cid), result(cid, f"r{n}")]
        else:
            outputs = [assistant(f"late{n}")]
        target = turns[n % len(turns)] if kind == "late" else turns[-1]
        with contextlib.suppress(TurnloomError):
            if history.record(target, outputs):
                self.log.append(OutputsRecorded(turn_id=target, outputs=tuple(outputs)))

    @rule(
        n=st.integers(0, 8),
        size=st.sampled_from([0, 1, 40, 400]),
        newest=st.booleans(),
        reuse=st.booleans(),
    )
    def keep_state(self, n: int, size: int, newest: bool, reuse: bool) -> None:
        history = self.history
        turns = history.turn_ids
        if not turns:
            return
        tag = f"s{n}"
        # ``reuse``: the pair's call id is one the outputs use (a turn held aside may send it).
        cid = f"k{n % 3}" if reuse else f"tlrs_{tag}"
        pair = [call(cid, "turnloom_runtime_context"), result(cid, tag * size)] if size else []
        target = turns[-1] if newest else turns[n % len(turns)]
        with contextlib.suppress(TurnloomError):
            if history.keep_state(target, pair):
                self.log.append(StateKept(turn_id=target, state=tuple(pair)))

    @rule()
    def evict(self) -> None:
        evicted = self.history.evict()
        if evicted:
            self.log.append(TurnsEvicted(turn_ids=evicted))

    @rule()
    def retract(self) -> None:
        history = self.history
        if len(history.turn_ids) < 2:
            return
        newest = history.turn_ids[-1]
        with contextlib.suppress(StateError, UnknownTurnError):
            history.retract(newest)
            self.log.append(TurnRetracted(turn_id=newest))

    @invariant()
    def a_checkpoint_replays_into_the_live_history(self) -> None:
        history = self.history
        if not history.turn_ids:
            return
        view, evicted, tail = compacted(history)
        log = [checkpoint(view, evicted, history.sequence), *map(encode_record, tail)]
        replayed = replay("c", log, self.limits)
        assert _observe(replayed) == _observe(history)
        assert _renders(replayed) == _renders(history)
        newest = history.turn_ids[-1]
        if len(history.turn_ids) < 2 or history.view().turn_messages(
            newest
        ) != history.view().turn_input(newest):
            return
        # Both retract the newest turn alike (a copy of the live history: its whole log).
        live = replay("c", [encode_record(r) for r in self.log], self.limits)
        assert _observe(live) == _observe(history)
        live.retract(newest)
        replayed.retract(newest)
        assert _observe(replayed) == _observe(live)
        assert _renders(replayed) == _renders(live)


class SummaryCheckpointMachine(CheckpointMachine):
    """The same with summaries and prunings: false starts run with a summary turn held."""

    @rule(keep=st.integers(1, 3), size=st.sampled_from([1, 40, 400]))
    def summarize(self, keep: int, size: int) -> None:
        """Summarize the oldest turns (after an answer, as a summary waits for one)."""
        history = self.history
        turns = history.turn_ids
        if not turns:
            return
        answer = (assistant(f"before s{keep}"),)
        with contextlib.suppress(TurnloomError):
            if history.record(turns[-1], answer):
                self.log.append(OutputsRecorded(turn_id=turns[-1], outputs=answer))
        with contextlib.suppress(TurnloomError):
            turn_ids = summary_range(history, keep)
            if turn_ids:
                summary_id = next_summary_id(history)
                summary = (user("s" * size),)
                applied = apply_summary(history, turn_ids, summary_id, summary)
                self.log.append(
                    TurnsSummarized(
                        turn_ids=turn_ids,
                        summary_id=summary_id,
                        summary=summary,
                        replaced=applied.replaced,
                    )
                )

    @rule(
        n=st.integers(0, 5),
        size=st.sampled_from([1, 40, 400]),
        retract=st.booleans(),
        summarized=st.booleans(),
    )
    def false_start(self, n: int, size: int, retract: bool, summarized: bool) -> None:
        """A false start: maybe summarize first; commit, evict, grow the kept state, evict again.

        The second eviction may drop the summary turn; then maybe a retraction.
        The invariant is checked after each step: while the turns are held aside too.
        """
        if summarized:
            self.summarize(keep=n % 3 + 1, size=1)
        before = self.history.turn_ids
        self.commit(n, approve=False)
        if self.history.turn_ids == before:
            return  # refused (the newest turn's calls are open)
        for step in (self.evict, lambda: self._keep_own_state(size), self.evict):
            self.a_checkpoint_replays_into_the_live_history()
            step()
        if retract:
            self.a_checkpoint_replays_into_the_live_history()
            self.retract()

    def _keep_own_state(self, size: int) -> None:
        """Keep a state pair on the newest turn with its own call id, as the runtime's are."""
        turn_id = self.history.turn_ids[-1]
        cid = f"tlrs_{turn_id}"
        pair = (call(cid, "turnloom_runtime_context"), result(cid, "s" * size))
        with contextlib.suppress(TurnloomError):
            if self.history.keep_state(turn_id, pair):
                self.log.append(StateKept(turn_id=turn_id, state=pair))

    @rule(keep=st.integers(1, 3))
    def prune(self, keep: int) -> None:
        with contextlib.suppress(TurnloomError):
            pruned = prune_turns(self.history, keep, "[pruned]")
            if pruned:
                self.log.append(TurnsPruned(turn_ids=pruned, keep=keep, note="[pruned]"))


CheckpointMachine.TestCase.settings = settings(
    max_examples=300, stateful_step_count=30, deadline=None
)
test_a_checkpoint_replays_into_the_live_history = CheckpointMachine.TestCase
SummaryCheckpointMachine.TestCase.settings = settings(
    max_examples=200, stateful_step_count=30, deadline=None
)
test_a_checkpoint_replays_into_the_live_history_with_summaries = SummaryCheckpointMachine.TestCase
