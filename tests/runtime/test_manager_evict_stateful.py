"""A hypothesis state machine preparing inputs of evicting contexts on every gateway.

Rules: accept turns (user text, or an approval answering the newest turn's
open call), record outputs whose call ids come from a pool of three (reused
within a turn, across turns, across kept and evicted turns and across the two
contexts), retract the newest turn (a false start), accept a false start at the
limits (evicting), maybe prepare it (with a kept runtime-state pair, or failing
part-way) and retract it, and prepare: read as items, or as request bytes only
(the host never reads the items), and prepares whose render fails part-way (the
gateway raising in the worker on a chosen message).

Invariants: every prepare that returns equals a cold render of the retained
history: its items, ``build``, its request bytes, its byte count, and its
reused bytes (the common prefix, in bytes, with the context's previous prefix).
A false start's retraction gives back the history as it was before it was
accepted, and the statistics' totals but the evictions its acceptance let go
for good (exact values).
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec
from anyio.from_thread import BlockingPortal, start_blocking_portal
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from tests.context.test_history import plain_common_length
from tests.context.test_history_evict_stateful import POOLS
from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.context import (
    Gateway,
    GatewayType,
    Message,
    NativeContent,
    complete_pairs,
    get_gateway,
    open_call_ids,
)
from turnloom.context.callids import rename_call_ids
from turnloom.context.gateway import step_join
from turnloom.context.history import HistoryLimits
from turnloom.errors import TurnloomError
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot

CONTEXTS = ("a", "b")


class Injected(RuntimeError):
    """The injected failure."""


def _flaky(kind: GatewayType) -> Gateway:
    """The ``kind`` gateway, raising on the ``fail_in``-th render from now (any thread)."""
    base = type(get_gateway(kind))

    class Flaky(base):  # type: ignore[valid-type,misc]
        fail_in: int | None = None
        lock = threading.Lock()

        def render(self, message: Message) -> list[NativeContent]:
            with self.lock:
                fail = False
                if self.fail_in is not None:
                    fail = self.fail_in <= 0
                    self.fail_in = None if fail else self.fail_in - 1
            if fail:
                raise Injected("gateway render")
            out: list[NativeContent] = super().render(message)
            return out

    gateway: Gateway = Flaky()
    return gateway


class EvictingManagerMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self._portal_cm = start_blocking_portal("asyncio")
        self.portal: BlockingPortal = self._portal_cm.__enter__()
        self._foundation_cm: Any = None
        self.next = {c: 0 for c in CONTEXTS}
        self.previous: dict[str, tuple[NativeContent, ...]] = {}  # cold renders

    @initialize(
        pool=st.sampled_from(POOLS),
        kind=st.sampled_from(list(GatewayType)),
        max_turns=st.integers(2, 5),
        max_items=st.integers(8, 30),
        max_bytes=st.sampled_from([2500, 100_000]),
    )
    def start(
        self,
        pool: tuple[str, str, str],
        kind: GatewayType,
        max_turns: int,
        max_items: int,
        max_bytes: int,
    ) -> None:
        self.kind = kind
        self.pool = pool
        self.gateway = _flaky(kind)
        limits = HistoryLimits(max_turns=max_turns, max_items=max_items, max_bytes=max_bytes)
        self.foundation = Foundation(gateway=self.gateway, history_limits=limits, worker_threads=1)
        self._foundation_cm = self.portal.wrap_async_context_manager(self.foundation)
        self._foundation_cm.__enter__()
        self.manager = self.foundation.manager

    def teardown(self) -> None:
        try:
            if self._foundation_cm is not None:
                self._foundation_cm.__exit__(None, None, None)
        finally:
            self._portal_cm.__exit__(None, None, None)

    def _newest(self, context_id: str) -> str | None:
        if self.next[context_id] == 0:
            return None
        history = self.portal.call(self.manager.history, context_id)
        return history.turn_ids[-1] if history.turn_ids else None

    # -- rules ------------------------------------------------------------------

    @rule(context_id=st.sampled_from(CONTEXTS), n=st.integers(0, 5), approve=st.booleans())
    def accept(self, context_id: str, n: int, approve: bool) -> None:
        first = self.next[context_id] == 0
        inputs: tuple[Message, ...] = (user(f"question {n}"),)
        newest = self._newest(context_id)
        if approve and newest is not None:
            view = self.portal.call(self.manager.history, context_id)
            messages = (
                view.input_messages(newest)
                + view.turn_messages(newest)[len(view.turn_input(newest)) :]
            )
            open_ids = open_call_ids(messages)
            if open_ids:
                inputs = (result(open_ids[0], "approved"),)
        turn_id = f"t{self.next[context_id]}"
        self.next[context_id] += 1
        try:
            self.portal.call(
                self.manager.accept_turn,
                TurnSnapshot(
                    context_id=context_id,
                    turn_id=turn_id,
                    input=inputs,
                    instructions=(SYSTEM,) if first else None,
                ),
            )
        except TurnloomError:
            if first:
                self.next[context_id] = 0

    @rule(
        context_id=st.sampled_from(CONTEXTS),
        kind=st.sampled_from(["text", "pair", "pairs", "call", "result"]),
        n=st.integers(0, 8),
    )
    def record(self, context_id: str, kind: str, n: int) -> None:
        newest = self._newest(context_id)
        if newest is None:
            return
        a, b = self.pool[n % 3], self.pool[(n + 1) % 3]
        outputs = {
            "text": [assistant(f"a{n}")],
            "pair": [call(a), result(a, f"r{n}"), assistant(f"a{n}")],
            "pairs": [call(a), call(b), result(a, f"r{n}"), result(b, f"s{n}")],
            "call": [call(a)],
            "result": [result(a, f"late {n}")],
        }[kind]
        try:
            self.portal.call(self.manager.record, context_id, newest, outputs)
        except TurnloomError:
            pass

    @rule(
        context_id=st.sampled_from(CONTEXTS),
        calls=st.integers(0, 2),
        n=st.integers(0, 5),
        bytes_only=st.booleans(),
        contribution=st.booleans(),
    )
    def cycle(
        self, context_id: str, calls: int, n: int, bytes_only: bool, contribution: bool
    ) -> None:
        """The common path: calls reusing ids from the pool and a reply, a new turn
        (evicting), and a prepare of it."""
        newest = self._newest(context_id)
        if newest is not None:
            outputs: list[Message] = []
            for k in range(calls):
                call_id = self.pool[(n + k) % 3]
                outputs += [call(call_id), result(call_id, f"r{n}.{k}")]
            outputs.append(assistant(f"a{n}"))
            try:
                self.portal.call(self.manager.record, context_id, newest, outputs)
            except TurnloomError:
                pass
        self.accept(context_id, n, False)
        self.prepare(context_id, bytes_only, None, contribution)

    @rule(context_id=st.sampled_from(CONTEXTS))
    def false_start(self, context_id: str) -> None:
        newest = self._newest(context_id)
        if newest is None:
            return
        try:
            self.portal.call(self.manager.voice.retract_turn, context_id, newest)
        except TurnloomError:
            pass

    @rule(
        context_id=st.sampled_from(CONTEXTS),
        n=st.integers(0, 5),
        prepare=st.booleans(),
        fail_in=st.sampled_from([None, None, 0, 1, 2, 4]),
        contribution=st.booleans(),
    )
    def false_start_at_limit(
        self, context_id: str, n: int, prepare: bool, fail_in: int | None, contribution: bool
    ) -> None:
        """A false start accepted (evicting at the limits), maybe prepared, retracted."""
        newest = self._newest(context_id)
        if newest is None:
            return
        before = self.portal.call(self._observe, context_id)
        turn_id = f"t{self.next[context_id]}"
        self.next[context_id] += 1
        try:
            self.portal.call(
                self.manager.accept_turn,
                TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user(f"uh {n}"),)),
            )
        except TurnloomError:
            return
        if prepare:
            self.prepare(context_id, True, fail_in, contribution)
        self.portal.call(self.manager.voice.retract_turn, context_id, turn_id)
        after = self.portal.call(self._observe, context_id)
        turns, items = before["settled"]
        totals = before["totals"]
        assert after["totals"] == msgspec.structs.replace(
            totals,
            evicted_turns_total=totals.evicted_turns_total + turns,
            evicted_items_total=totals.evicted_items_total + items,
            retracted_turns_total=totals.retracted_turns_total + 1,
        )
        assert after["turns"] == before["turns"]
        assert after["settled"] == (0, 0)
        self.prepare(context_id, False, None)

    def _observe(self, context_id: str) -> dict[str, Any]:
        """The context's turns and the manager's history totals; on the event loop."""
        view = self.manager.history(context_id)
        history = self.manager._table.contexts[context_id].history
        held_aside, _ = history.before_evictions()
        aside = history.restorable_ids
        return {
            "turns": [
                (t, view.turn_messages(t), view.turn_state(t), history.turn_serial(t))
                for t in view.turn_ids
            ],
            "totals": self.manager.statistics().history,
            # What accepting a turn lets go of for good: counted evicted from then on.
            "settled": (
                len(aside),
                sum(
                    len(held_aside.turn_messages(t)) + len(held_aside.turn_state(t)) for t in aside
                ),
            ),
        }

    @rule(
        context_id=st.sampled_from(CONTEXTS),
        bytes_only=st.booleans(),
        fail_in=st.sampled_from([None, None, 0, 1, 2, 4]),
        contribution=st.booleans(),
    )
    def prepare(
        self, context_id: str, bytes_only: bool, fail_in: int | None, contribution: bool = False
    ) -> None:
        """A prepare (with a runtime-state pair when ``contribution``); with ``fail_in``,
        first one whose worker render fails at that message."""
        newest = self._newest(context_id)
        if newest is None:
            return
        request = ContextPrepareRequest(
            context_id=context_id, turn_id=newest, loop_budget=4 if contribution else None
        )
        if fail_in is not None:
            self.gateway.fail_in = fail_in  # type: ignore[attr-defined]
            try:
                # When no render reaches the failing one, it is a prepare like any other.
                self._check(self.portal.call(self.manager.prepare, request), context_id, False)
            except (Injected, TurnloomError):
                pass
            finally:
                self.gateway.fail_in = None  # type: ignore[attr-defined]
        prepared = self.portal.call(self.manager.prepare, request)
        self._check(prepared, context_id, bytes_only)

    def _check(self, prepared: PreparedContext, context_id: str, bytes_only: bool) -> None:
        view = self.portal.call(self.manager.history, context_id)
        base = get_gateway(self.kind)
        messages = complete_pairs(
            list(view.sent_messages(prepared.turn_id)),
            open_calls=self.manager.open_calls,
            join=step_join(base),
        )
        expected = rename_call_ids(self.kind, [i for m in messages for i in base.render(m)])
        # The items, read as a bytes-only host would not: each decoded alone, the
        # prefix's items never materialized.
        native = prepared.native_items
        got = [native.item(i) for i in range(len(native))]
        pair = 0 if prepared.state_call_id is None else 2
        assert prepared.item_count == len(got) == len(expected) + pair
        assert got[: len(expected)] == expected
        body = msgspec.json.encode(base.request_body(got))
        assert self.portal.call(self.manager.request_bytes, prepared) == body
        sizes = [len(msgspec.json.encode(i)) for i in got]
        assert prepared.bytes == sum(sizes)
        previous = self.previous.get(context_id)
        if previous is not None:
            common = plain_common_length(got, previous)
            assert prepared.reused_bytes == sum(sizes[:common])
        self.previous[context_id] = tuple(got)
        if not bytes_only:  # a host that reads the items (a bytes-only host never does)
            assert list(prepared.items) == got
            assert list(self.portal.call(self.manager.build, prepared)) == got


EvictingManagerMachine.TestCase.settings = settings(
    max_examples=25, stateful_step_count=30, deadline=None
)
test_evicting_contexts_prepare_as_cold = EvictingManagerMachine.TestCase
