"""A hypothesis state machine driving the ContextManager on a live event loop.

Rules: accept turns (user text, or the result of the newest turn's open call:
an approval), record outputs (text, blank partials, calls, results, a reply
recorded twice, late outputs for evicted turns and for an earlier held turn, refused
when they would strand a later turn's results), prepare, prepare while the
gateway fails part-way through the render, park preparations waiting for a
future turn (up to twice the capacity: they hold no slot), prepare with
``prepare_nowait`` at once beside a capacity's worth of them, cancel
parked preparations, remove a context (its parked preparations settle with
ContextRemovedError), run invocations that commit a turn while in flight,
attach Context Areas (one-shot, pinned, sub-task) and route model output to
the area section.

Invariants: between rules nothing is admitted (pending 0: parked calls wait for
their turn's commit holding no slot, so they never starve a prepare) and
``waiting_for_turn`` equals the parked calls (no leaked waiter); each history
holds exactly the turns a plain model predicts (whole turns, oldest first, limits respected, no
eviction while an invocation is in flight); every prepared input passes the
gateway's ``validate()``, starts with the pinned instructions and holds, in
order, a cold render of the retained history up to the turn's input, the state
pair and the area section; every attached area is either still attached or
counted as collected.
"""

from __future__ import annotations

import time
from concurrent.futures import Future
from typing import Any

import anyio
import msgspec
import pytest
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from tests.runtime.stress import FlakyGateway, InjectedRenderError, cold_render
from turnloom.areas import OneShotNotice, PinnedNotice, SubtaskArea
from turnloom.context import Message, Role
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    AreaCallbackError,
    ContextRemovedError,
    DuplicateIdError,
    PairedTurnsTooLargeError,
    StrandedResultsError,
    TurnTooLargeError,
)
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot

LIMITS = HistoryLimits(low_water=1.0, max_turns=3, max_items=7)
CAPACITY = 1  # parked calls reach it often: prepares beside them must not wait
CONTEXTS = ("a", "b")


class _Model:
    """What one context's history should hold."""

    def __init__(self) -> None:
        self.turns: list[tuple[str, int]] = []  # (turn id, items, its kept state pair included)
        self.kept: dict[str, int] = {}  # turn id -> items of its kept state pair
        self.grown = False  # a pair was kept since the last eviction point
        self.evicted: list[str] = []
        self.next = 0
        self.open_call: str | None = None
        # The newest turn ends with a step whose calls are open (no result yet):
        # an assistant text continues it, so its calls stay open.
        self.in_step = False
        self.tied: set[str] = set()  # turns whose input answered the turn before (approvals)

    def evict(self) -> None:
        """Oldest first, a turn with the approvals tied to it; never reaching the newest."""
        while len(self.turns) > 1 and (
            len(self.turns) > LIMITS.max_turns or sum(n for _, n in self.turns) > LIMITS.max_items
        ):
            end = 1
            while end < len(self.turns) and self.turns[end][0] in self.tied:
                end += 1
            if end >= len(self.turns):
                break
            for _ in range(end):
                self.evicted.append(self.turns.pop(0)[0])
        self.grown = False

    def add(self, items: int) -> None:
        turn_id, n = self.turns[-1]
        self.turns[-1] = (turn_id, n + items)


class ManagerMachine(RuleBasedStateMachine):
    backend = "asyncio"

    def __init__(self) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal(self.backend)
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self.gateway = FlakyGateway(rate=0.0, seed=0)
        self.foundation = Foundation(
            gateway=self.gateway,
            history_limits=LIMITS,
            max_pending_preparations=CAPACITY,
            worker_threads=2,
        )
        self._foundation_cm = self.portal.wrap_async_context_manager(self.foundation)
        self._foundation_cm.__enter__()
        self.manager = self.foundation.manager
        self.models = {c: _Model() for c in CONTEXTS}
        self.parked: list[tuple[str, str, Future[PreparedContext]]] = []
        self.rejected = 0
        self.attached = 0
        self.dropped_with_removal = 0  # attached areas that left with a removed context
        self.routed_calls = 0
        self.replies = 0

    def teardown(self) -> None:
        try:
            for _, _, future in self.parked:
                future.cancel()
            self._foundation_cm.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)

    # -- helpers -----------------------------------------------------------------

    def _check_prepared(
        self,
        prepared: PreparedContext,
        context_id: str,
        captured: tuple[list[Any], ...] = (),
    ) -> None:
        """Check a prepared input; ``captured`` lists the cold renders of the histories
        it may have captured (default: the history as it is now)."""
        assert CHAT.validate(prepared.items) == []
        assert prepared.items[0] == {"role": "system", "content": SYSTEM.text}
        assert prepared.bytes == sum(len(msgspec.json.encode(i)) for i in prepared.items)
        assert prepared.item_count == len(prepared.items)
        # the retained history up to the turn's input, exactly as a cold render
        # gives it, then the state pair, then the area section
        if not captured:
            captured = (self.portal.call(cold_render, self.manager, context_id, prepared.turn_id),)
        [expected] = [e for e in captured if list(prepared.items[: len(e)]) == e][:1]
        pair = 0 if prepared.state_call_id is None else 2
        assert prepared.area_start == len(expected) + pair
        assert prepared.item_count == prepared.area_start + prepared.area_items
        if pair:
            call = prepared.items[prepared.turn_start + 1]
            assert call["tool_calls"][0]["id"] == prepared.state_call_id

    def _settle(self) -> None:
        deadline = time.monotonic() + 10
        while True:
            stats = self.portal.call(self.manager.statistics).preparations
            if (stats.pending, stats.waiting_for_turn) == (0, len(self.parked)):
                break
            assert time.monotonic() < deadline, "a preparation never settled"
            time.sleep(0.002)

    def _accept(self, context_id: str, approve: bool = False) -> str:
        model = self.models[context_id]
        turn_id = f"t{model.next}"
        first = model.next == 0
        answer = model.open_call if approve and model.turns else None
        if answer is not None:
            try:
                self.portal.call(
                    self.manager.accept_turn,
                    TurnSnapshot(
                        context_id=context_id,
                        turn_id=turn_id,
                        input=(result(answer, "approved"),),
                        instructions=(SYSTEM,) if first else None,
                    ),
                )
            except PairedTurnsTooLargeError:
                # The answered turn (split calls make it longer) and this one cannot
                # fit the limits together: refused, nothing committed; ask instead.
                answer = None
        if answer is None:
            self.portal.call(
                self.manager.accept_turn,
                TurnSnapshot(
                    context_id=context_id,
                    turn_id=turn_id,
                    input=(user(f"question {model.next}"),),
                    instructions=(SYSTEM,) if first else None,
                ),
            )
        model.next += 1
        model.turns.append((turn_id, 1))
        if answer is not None:
            model.tied.add(turn_id)
        model.open_call = None
        model.in_step = False
        return turn_id

    # -- rules -------------------------------------------------------------------

    @rule(context_id=st.sampled_from(CONTEXTS), approve=st.booleans())
    def accept(self, context_id: str, approve: bool) -> None:
        """A new turn: user text, or (approve) the result of the open call as its input."""
        turn_id = self._accept(context_id, approve)
        self.models[context_id].evict()
        for entry in [p for p in self.parked if p[:2] == (context_id, turn_id)]:
            self.parked.remove(entry)
            self._check_prepared(entry[2].result(timeout=10), context_id)

    @precondition(lambda self: any(m.turns for m in self.models.values()))
    @rule(
        context_id=st.sampled_from(CONTEXTS),
        kind=st.sampled_from(
            ["text", "blank", "call", "result", "late", "twice", "split", "split_open"]
        ),
    )
    def record(self, context_id: str, kind: str) -> None:
        model = self.models[context_id]
        if not model.turns:
            return
        turn_id = model.turns[-1][0]
        outputs: list[Message]
        if kind == "late":
            if not model.evicted:
                return
            before = self.portal.call(self.manager.statistics).history.dropped_late_outputs_total
            assert (
                self.portal.call(
                    self.manager.record, context_id, model.evicted[0], [assistant("late")]
                )
                == 0
            )
            after = self.portal.call(self.manager.statistics).history.dropped_late_outputs_total
            assert after == before + 1
            return
        if kind == "twice":
            self.replies += 1
            reply = Message(role=Role.assistant, content="a reply", id=f"reply-{self.replies}")
            assert self.portal.call(self.manager.record, context_id, turn_id, [reply]) == 1
            # An interrupted reply committed again: kept once, counted.
            assert self.portal.call(self.manager.record, context_id, turn_id, [reply]) == 0
            changed = msgspec.structs.replace(reply, content="another reply")
            with pytest.raises(DuplicateIdError):
                self.portal.call(self.manager.record, context_id, turn_id, [changed])
            model.add(1)
            self._after_text(model)
            model.evict()
            return
        self.replies += 1
        fresh = f"call-{model.next}-{len(model.turns)}-{self.replies}"
        saved = (model.open_call, model.in_step)
        if kind == "text":
            outputs = [assistant("an answer")]
            self._after_text(model)
        elif kind == "blank":
            outputs = [assistant("  ")]
        elif kind == "call":
            model.open_call = fresh
            outputs = [call(model.open_call)]
            model.in_step = True
        elif kind == "split":  # one message per parallel call, results out of call order
            outputs = [
                call(f"{fresh}a"),
                call(f"{fresh}b"),
                result(f"{fresh}b"),
                result(f"{fresh}a"),
            ]
            model.open_call, model.in_step = None, False
        elif kind == "split_open":  # the same, results still to come (the last call's)
            outputs = [call(f"{fresh}a"), call(f"{fresh}b")]
            model.open_call = f"{fresh}b"
            model.in_step = True
        else:
            if model.open_call is None:
                return
            outputs = [result(model.open_call, "done")]
            model.open_call, model.in_step = None, False
        if len(outputs) > 1:
            # A batch may not fit the turn (or the turns tied to it): refused, nothing changed.
            held = self.portal.call(self.manager.history, context_id).messages()
            try:
                self.portal.call(self.manager.record, context_id, turn_id, outputs)
            except TurnTooLargeError:
                assert self.portal.call(self.manager.history, context_id).messages() == held
                model.open_call, model.in_step = saved
                return
            model.add(len(outputs))
            model.evict()
            return
        recorded = self.portal.call(self.manager.record, context_id, turn_id, outputs)
        expected = 0 if kind == "blank" else len(outputs)
        assert recorded == expected
        model.add(expected)
        model.evict()

    @staticmethod
    def _after_text(model: _Model) -> None:
        """An assistant text output: it continues a step with open calls, else ends the group."""
        if not model.in_step:
            model.open_call = None

    @precondition(lambda self: any(len(m.turns) > 1 for m in self.models.values()))
    @rule(context_id=st.sampled_from(CONTEXTS), back=st.integers(1, 2))
    def late_output_to_an_earlier_turn(self, context_id: str, back: int) -> None:
        """A model output that arrives after the next turn was committed: recorded to its
        earlier turn, or refused (StrandedResultsError, nothing changed) when a later turn's results
        answer that turn's calls and the output would leave them answering nothing."""
        model = self.models[context_id]
        if len(model.turns) <= back:
            return
        index = len(model.turns) - 1 - back
        turn_id, items = model.turns[index]
        before = self.portal.call(self.manager.history, context_id).messages()
        try:
            recorded = self.portal.call(
                self.manager.record, context_id, turn_id, [assistant("a late answer")]
            )
        except StrandedResultsError as refused:
            assert refused.turn_id == turn_id
            assert refused.stranded_turn_id in [t for t, _ in model.turns[index + 1 :]]
            assert self.portal.call(self.manager.history, context_id).messages() == before
            return
        assert recorded == 1
        model.turns[index] = (turn_id, items + 1)
        model.evict()

    @precondition(lambda self: any(m.turns for m in self.models.values()))
    @rule(context_id=st.sampled_from(CONTEXTS), contribution=st.booleans())
    def prepare(self, context_id: str, contribution: bool) -> None:
        model = self.models[context_id]
        if not model.turns:
            return
        request = ContextPrepareRequest(
            context_id=context_id,
            turn_id=model.turns[-1][0],
            loop_budget=4 if contribution else None,
        )
        prepared = self.portal.call(self.manager.prepare, request)
        self._check_prepared(prepared, context_id)
        assert (prepared.state_call_id is not None) is contribution
        self._kept(context_id, 2 if contribution else 0)

    def _kept(self, context_id: str, items: int) -> None:
        """A delivered unscoped prepare of the newest turn: its pair (or none) is kept."""
        model = self.models[context_id]
        turn_id = model.turns[-1][0]
        model.add(items - model.kept.get(turn_id, 0))
        model.kept[turn_id] = items  # counted from now on; the next change evicts
        model.grown = True

    @precondition(lambda self: any(m.turns for m in self.models.values()))
    @rule(context_id=st.sampled_from(CONTEXTS), fail_in=st.integers(0, 6))
    def prepare_with_a_failing_render(self, context_id: str, fail_in: int) -> None:
        """The gateway raises at a chosen render call of the worker; the next prepare
        still equals a cold render."""
        model = self.models[context_id]
        if not model.turns:
            return
        request = ContextPrepareRequest(context_id=context_id, turn_id=model.turns[-1][0])
        self.gateway.fail_in = fail_in
        try:
            self._check_prepared(self.portal.call(self.manager.prepare, request), context_id)
        except (InjectedRenderError, AreaCallbackError):
            pass
        finally:
            self.gateway.fail_in = None
        self._check_prepared(self.portal.call(self.manager.prepare, request), context_id)
        self._kept(context_id, 0)

    @precondition(lambda self: any(m.turns for m in self.models.values()))
    @rule(context_id=st.sampled_from(CONTEXTS))
    def remove(self, context_id: str) -> None:
        """The caller hangs up: parked preparations of the context settle at once."""
        if not self.models[context_id].turns:
            return
        before = self.portal.call(self.manager.statistics).areas.attached
        self.portal.call(self.manager.remove_context, context_id)
        self.dropped_with_removal += (
            before - self.portal.call(self.manager.statistics).areas.attached
        )
        for entry in [p for p in self.parked if p[0] == context_id]:
            self.parked.remove(entry)
            with pytest.raises(ContextRemovedError):
                entry[2].result(timeout=10)
        self.models[context_id] = _Model()
        self._settle()

    @precondition(lambda self: len(self.parked) < 2 * CAPACITY)
    @rule(context_id=st.sampled_from(CONTEXTS))
    def park(self, context_id: str) -> None:
        """A prepare for the next, not yet committed, turn waits for its commit (no slot)."""
        turn_id = f"t{self.models[context_id].next}"
        if any(p[:2] == (context_id, turn_id) for p in self.parked):
            return
        request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
        future = self.portal.start_task_soon(self.manager.prepare, request)
        self.parked.append((context_id, turn_id, future))
        self._settle()

    @precondition(
        lambda self: len(self.parked) >= CAPACITY and any(m.turns for m in self.models.values())
    )
    @rule(context_id=st.sampled_from(CONTEXTS))
    def nowait_beside_parked(self, context_id: str) -> None:
        """A capacity's worth (or more) of parked calls hold no slot: prepare_nowait of
        a committed turn takes one at once (no QueueFullError) and is delivered."""
        model = self.models[context_id]
        if not model.turns:
            return
        request = ContextPrepareRequest(context_id=context_id, turn_id=model.turns[-1][0])
        prepared = self.portal.call(self.manager.prepare_nowait, request)
        self._check_prepared(prepared, context_id)
        self._kept(context_id, 0)
        assert (
            self.portal.call(self.manager.statistics).preparations.rejected_total == self.rejected
        )

    @precondition(lambda self: bool(self.parked))
    @rule(index=st.integers(0, 2 * CAPACITY - 1))
    def cancel_parked(self, index: int) -> None:
        entry = self.parked.pop(index % len(self.parked))
        entry[2].cancel()
        self._settle()

    @precondition(lambda self: any(m.turns for m in self.models.values()))
    @rule(context_id=st.sampled_from(CONTEXTS), cancel=st.booleans())
    def invocation_commits_a_turn(self, context_id: str, cancel: bool) -> None:
        """No eviction while the model call is in flight; it happens at exit."""
        model = self.models[context_id]
        if not model.turns or len(model.turns) < 1:
            return
        turn_id = model.turns[-1][0]
        held_before: list[Any] = []
        in_flight: list[list[Any]] = []  # the cold render while the call is in flight

        async def run() -> None:
            with anyio.CancelScope() as scope:
                async with self.manager.invocation(context_id, turn_id) as invocation:
                    invocation.record([assistant(" " if cancel else "partial answer")])
                    held_before.extend(self.manager.history(context_id).turn_ids)
                    self.manager.accept_turn(
                        TurnSnapshot(
                            context_id=context_id,
                            turn_id=f"t{model.next}",
                            input=(user("while in flight"),),
                        )
                    )
                    # Nothing was evicted while the call is in flight.
                    assert self.manager.history(context_id).turn_ids == (
                        *held_before,
                        f"t{model.next}",
                    )
                    in_flight.append(cold_render(self.manager, context_id, f"t{model.next}"))
                    if cancel:
                        scope.cancel()
                        await anyio.sleep(1)

        self.portal.call(run)
        model.add(0 if cancel else 1)
        model.turns.append((f"t{model.next}", 1))
        model.next += 1
        model.open_call = None
        model.in_step = False
        model.evict()
        new_turn = model.turns[-1][0]
        after = self.portal.call(cold_render, self.manager, context_id, new_turn)
        for entry in [p for p in self.parked if p[:2] == (context_id, new_turn)]:
            self.parked.remove(entry)
            # Captured at the commit (in flight) or after the eviction at exit.
            self._check_prepared(entry[2].result(timeout=10), context_id, (*in_flight, after))

    @precondition(lambda self: any(m.turns for m in self.models.values()))
    @rule(
        context_id=st.sampled_from(CONTEXTS),
        kind=st.sampled_from(["one_shot", "pinned", "subtask", "route_text", "route_pair"]),
    )
    def areas(self, context_id: str, kind: str) -> None:
        if not self.models[context_id].turns:
            return
        manager = self.manager
        if kind.startswith("route"):
            messages = [assistant("routed work")]
            if kind == "route_pair":
                self.routed_calls += 1
                call_id = f"routed-{self.routed_calls}"
                messages = [call(call_id), result(call_id, "routed result")]
            for message in messages:
                for item in CHAT.render(message):
                    self.portal.call(manager.areas.route, context_id, item)
            return
        area: OneShotNotice | PinnedNotice | SubtaskArea
        if kind == "one_shot":
            area = OneShotNotice("a one-shot notice")
        elif kind == "pinned":
            area = PinnedNotice("a pinned notice")
        else:
            area = SubtaskArea("a sub-task", done=lambda a: True, summary="its summary")
        self.portal.call(manager.areas.attach, context_id, area)
        self.attached += 1

    # -- invariants ----------------------------------------------------------------

    @invariant()
    def attached_areas_are_held_or_collected(self) -> None:
        stats = self.portal.call(self.manager.statistics)
        assert stats.areas.registered_total == self.attached
        assert stats.areas.attached == (
            self.attached - stats.areas.collected_total - self.dropped_with_removal
        )

    @invariant()
    def queue_is_bounded_and_nothing_leaks(self) -> None:
        stats = self.portal.call(self.manager.statistics)
        assert stats.preparations.pending == 0
        assert stats.preparations.waiting_for_turn == len(self.parked)
        assert stats.preparations.waiting_for_slot == 0
        assert stats.invocations == 0

    @invariant()
    def histories_hold_the_predicted_whole_turns(self) -> None:
        for context_id, model in self.models.items():
            if not model.turns:
                continue
            view = self.portal.call(self.manager.history, context_id)
            assert view.turn_ids == tuple(t for t, _ in model.turns)
            items = sum(len(view.turn_messages(t)) + len(view.turn_state(t)) for t in view.turn_ids)
            assert items == sum(n for _, n in model.turns)
            assert len(model.turns) <= LIMITS.max_turns
            # Keeping a pair does not evict: the next commit or record does.
            assert len(model.turns) == 1 or items <= LIMITS.max_items or model.grown
            assert view.pinned == (SYSTEM,)


class TrioManagerMachine(ManagerMachine):
    backend = "trio"


_settings = settings(
    max_examples=20,
    stateful_step_count=25,
)
TestManagerOnAsyncio = ManagerMachine.TestCase
TestManagerOnAsyncio.settings = _settings
TestManagerOnTrio = TrioManagerMachine.TestCase
TestManagerOnTrio.settings = _settings
