"""A hypothesis state machine of summary compaction racing everything else, both backends.

Rules: commit turns, record answers and tool call/result pairs (some calls left
open to a later record), run model calls (invocations), prepare, accept a false
start and retract it, and drive the host's summarizer: let a summarization
finish, raise, or cancel it; pruning of old tool output on or off. The
summarizer's summary names the turns it was given (and the previous summary's
names), so the machine can tell which turns a summary covers. Histories are
small (4 to 7 turns) and the policy triggers one turn below the limit, so
summaries race evictions. Every gateway; asyncio and trio.

Invariants after every step: the held history has at most one summary turn,
and it comes first (after the pinned instructions); every turn committed and
not retracted is held, or covered by the summary, or evicted (counted), or
held aside for a false start's retraction, and no turn is both held and
covered; every prepared input is valid on its gateway and equals the prepare of
a cold manager given the same pinned instructions, summary and retained turns.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any

import anyio
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests.runtime.helpers import SYSTEM, assistant, call, user
from turnloom.context import (
    CompactionPolicy,
    GatewayType,
    Message,
    PrunePolicy,
    Role,
    TextPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.context.history import HistoryLimits
from turnloom.context.summaries import is_summary_turn
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot


class Boom(RuntimeError):
    """The summarizer's injected failure."""


def _result(call_id: str) -> Message:
    return Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id=call_id, name="lookup", content=(TextPart(text="found " * 9),)),
        ),
    )


def _named(messages: Sequence[Message]) -> set[str]:
    text = " ".join(p.text for m in messages for p in m.parts if isinstance(p, TextPart))
    return set(re.findall(r"\[(t\d+)\]", text))


class Controlled:
    """A summarizer the machine finishes or fails by hand, one call at a time."""

    def __init__(self) -> None:
        self.go: anyio.Event | None = None
        self.outcome = "finish"
        self.calls = 0

    async def __call__(self, messages: tuple[Message, ...]) -> Sequence[Message]:
        self.calls += 1
        self.go = anyio.Event()
        await self.go.wait()
        if self.outcome == "raise":
            raise Boom("summarizer")
        ids = set(_named(messages))
        ids.update(re.findall(r"question \[(t\d+)\]", " ".join(str(m.content) for m in messages)))
        names = " ".join(f"[{t}]" for t in sorted(ids, key=lambda t: int(t[1:])))
        return [user(f"Summary of {names}"), assistant("Noted.")]

    def release(self, outcome: str) -> None:
        self.outcome = outcome
        if self.go is not None:
            self.go.set()
            self.go = None


class SummaryMachine(RuleBasedStateMachine):
    BACKEND = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal(self.BACKEND)
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self._entered: list[Any] = []
        self.turn = 0
        self.alive: list[str] = []  # committed, not retracted, oldest first
        self.open_call: str | None = None
        self.answered: set[str] = set()  # turns with a text answer: no model call after it
        self.colds = 0

    @initialize(
        kind=st.sampled_from(list(GatewayType)),
        max_turns=st.integers(4, 7),
        keep=st.integers(1, 2),
        prune=st.booleans(),
    )
    def start(self, kind: GatewayType, max_turns: int, keep: int, prune: bool) -> None:
        self.kind = kind
        self.gateway = get_gateway(kind)
        self.limits = HistoryLimits(max_turns=max_turns)
        options: dict[str, Any] = {
            "gateway": kind,
            "history_limits": self.limits,
            "earlier_state": "drop",
            "worker_threads": 1,
        }
        self.foundation = Foundation(**options)
        self.cold = Foundation(**options)
        for foundation in (self.foundation, self.cold):
            cm = self.portal.wrap_async_context_manager(foundation)
            cm.__enter__()
            self._entered.append(cm)
        self.manager = self.foundation.manager
        self.summarizer = Controlled()
        self.errors: list[BaseException] = []
        summaries = self.manager.summaries
        summaries.summarizer = self.summarizer
        summaries.policy = CompactionPolicy(
            trigger_turns=max_turns - 1, keep_turns=keep, timeout=60.0
        )
        summaries.on_error = self.errors.append
        if prune:
            summaries.prune = PrunePolicy(keep_turns=1, note="[pruned]")

    def teardown(self) -> None:
        try:
            for cm in reversed(self._entered):
                self.portal.call(self.summarizer.release, "finish")
                cm.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)

    # -- helpers -----------------------------------------------------------------------

    def _settle(self) -> None:
        async def passes() -> None:
            for _ in range(6):
                await anyio.sleep(0)

        self.portal.call(passes)

    def _newest(self) -> str | None:
        return self.alive[-1] if self.alive else None

    def _commit(self) -> str:
        turn_id = f"t{self.turn}"
        self.turn += 1
        first = not self.alive and self.turn == 1
        self.portal.call(
            self.manager.accept_turn,
            TurnSnapshot(
                context_id="c",
                turn_id=turn_id,
                input=(user(f"question [{turn_id}]"),),
                instructions=(SYSTEM,) if first else None,
            ),
        )
        self.alive.append(turn_id)
        self.open_call = None
        return turn_id

    # -- rules -------------------------------------------------------------------------

    @rule()
    def commit(self) -> None:
        self._commit()
        self._settle()

    @rule(tools=st.booleans())
    def answered_turn(self, tools: bool) -> None:
        turn_id = self._commit()
        outputs = [assistant(f"answer to [{turn_id}]")]
        if tools:
            call_id = f"k{self.turn}t"
            outputs = [call(call_id), _result(call_id), *outputs]
        self.portal.call(self.manager.record, "c", turn_id, outputs)
        self.answered.add(turn_id)
        self._settle()

    @rule()
    def answered_turn_then_summary(self) -> None:
        self.answered_turn(False)
        self.summarizer_returns("finish")

    @rule(kind=st.sampled_from(["answer", "pair", "open", "close"]), invoke=st.booleans())
    def record(self, kind: str, invoke: bool) -> None:
        newest = self._newest()
        if newest is None or not self.portal.call(self.manager.history, "c").turn_ids:
            return
        if newest not in self.portal.call(self.manager.history, "c").turn_ids:
            return
        if kind == "answer":
            outputs = [assistant(f"answer to [{newest}]")]
        elif newest in self.answered:
            # A model call after the turn's text answer, with no input between, is a
            # shape Gemini refuses whether or not anything was summarized.
            return
        elif kind == "pair":
            call_id = f"k{self.turn}x"
            outputs = [call(call_id), _result(call_id)]
        elif kind == "open" and self.open_call is None:
            self.open_call = f"k{self.turn}o"
            outputs = [call(self.open_call)]
        elif kind == "close" and self.open_call is not None:
            outputs = [_result(self.open_call)]
            self.open_call = None
        else:
            return
        if kind == "answer":
            self.answered.add(newest)
        if invoke:

            async def invoked() -> None:
                async with self.manager.invocation("c", newest) as invocation:
                    invocation.record(outputs)

            self.portal.call(invoked)
        else:
            self.portal.call(self.manager.record, "c", newest, outputs)
        self._settle()

    @rule()
    def false_start(self) -> None:
        if not self.alive:
            return
        turn_id = self._commit()
        self._settle()
        self.portal.call(self.manager.voice.retract_turn, "c", turn_id)
        self.alive.pop()
        self._settle()

    @rule(outcome=st.sampled_from(["finish", "finish", "raise"]))
    def summarizer_returns(self, outcome: str) -> None:
        self.portal.call(self.summarizer.release, outcome)  # on the loop's thread
        self._settle()

    @rule()
    def cancel(self) -> None:
        self.portal.call(self.manager.summaries.cancel, "c")
        self._settle()

    @rule()
    def prepare(self) -> None:
        newest = self._newest()
        view = self.portal.call(self.manager.history, "c") if self.alive else None
        if newest is None or view is None or newest not in view.turn_ids:
            return
        prepared = self.portal.call(
            self.manager.prepare, ContextPrepareRequest(context_id="c", turn_id=newest)
        )
        items = list(prepared.items)
        assert self.gateway.validate(items) == []
        # The cold render: a fresh context given the same instructions, summary and turns.
        cold_id = f"cold{self.colds}"
        self.colds += 1
        manager = self.cold.manager
        for i, turn_id in enumerate(view.turn_ids):
            given = view.turn_input(turn_id)
            self.portal.call(
                manager.accept_turn,
                TurnSnapshot(
                    context_id=cold_id,
                    turn_id=turn_id,
                    input=given,
                    instructions=view.pinned if i == 0 else None,
                ),
            )
            outputs = view.turn_messages(turn_id)[len(given) :]
            if outputs:
                self.portal.call(manager.record, cold_id, turn_id, outputs)
        cold = self.portal.call(
            manager.prepare, ContextPrepareRequest(context_id=cold_id, turn_id=newest)
        )
        assert list(cold.items) == items
        self.portal.call(manager.remove_context, cold_id)

    # -- invariants ---------------------------------------------------------------------

    @invariant()
    def summaries_cover_what_left(self) -> None:
        if not hasattr(self, "manager") or not self.alive:
            return
        state = self.portal.call(lambda: self.manager._table.contexts.get("c"))
        if state is None:
            return
        history = state.history
        view = history.view()
        held = view.turn_ids
        summary_ids = [t for t in held if is_summary_turn(t)]
        assert len(summary_ids) <= 1
        covered: set[str] = set()
        if summary_ids:
            assert held[0] == summary_ids[0]
            covered = _named(view.turn_messages(summary_ids[0]))
        evicted = set(history.evicted_ids)
        aside = set(history.restorable_ids)
        for turn_id in self.alive:
            present = turn_id in held
            assert not (present and turn_id in covered), turn_id
            assert present or turn_id in covered or turn_id in evicted or turn_id in aside, turn_id
        stats = self.manager.statistics().summaries
        assert stats.running <= 1
        assert stats.started_total == (
            stats.finished_total
            + stats.failed_total
            + stats.discarded_total
            + stats.running
            + (1 if self.manager.summaries.running("c") and stats.running == 0 else 0)
        )
        assert all(getattr(e, "context_id", None) == "c" for e in self.errors)


class TrioSummaryMachine(SummaryMachine):
    BACKEND = "trio"


_SETTINGS = settings(max_examples=25, stateful_step_count=40, deadline=None)
SummaryMachine.TestCase.settings = _SETTINGS
TrioSummaryMachine.TestCase.settings = _SETTINGS
test_summaries_race_everything_asyncio = SummaryMachine.TestCase
test_summaries_race_everything_trio = TrioSummaryMachine.TestCase
