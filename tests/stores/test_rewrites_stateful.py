"""A hypothesis state machine: the durable writer under commits, rewrites and store faults.

A real Foundation on a real SQLite store runs in a blocking portal (asyncio
and trio); rules commit turns with outputs, rebuild the context inside
``manager.leases.rewriting`` (dropping its newest turns, or one in the
middle), arm a fault on the store's next append or replace (raised before
the store is reached, or after it applied the write: the reply lost), and
flush.

Invariants:

* every state the stored log passes through restores a history the context
  held after some step (never an empty, partial or mixed log: a process
  killed at any moment restores a history the host had);
* a flush that returns leaves the stored log restoring exactly the held
  history, and counts no pending record;
* at the end, once the faults are spent, a flush succeeds.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from tests._portal import PortalFoundation
from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.recording import Recording
from turnloom.context import Message
from turnloom.context.history import HistoryLimits
from turnloom.errors import StoreUnavailableError
from turnloom.runtime import TurnSnapshot
from turnloom.runtime._records import replay

History = list[tuple[str, list[Message]]]


def _restored(log: Sequence[bytes], limits: HistoryLimits) -> History:
    if not log:
        return []
    view = replay("c", log, limits).view()
    return [(t, list(view.turn_messages(t))) for t in view.turn_ids]


class Rewrites(RuleBasedStateMachine):
    backend = "asyncio"
    directory: Path

    def __init__(self) -> None:
        super().__init__()
        self.host: PortalFoundation | None = None
        self.turns = 0

    @initialize(max_turns=st.sampled_from([3, 32]))
    def start(self, max_turns: int) -> None:
        self.limits = HistoryLimits(max_turns=max_turns)
        self.host = PortalFoundation(
            self.backend,
            self.directory,
            wrap=lambda inner: Recording(inner, "c"),
            lease_ttl=60.0,
            history_limits=self.limits,
        )
        self.portal, self.manager = self.host.portal, self.host.manager
        self.inner, self.store = self.host.store, self.host.wrapped
        self.portal.call(self.manager.leases.claim, "c")
        self.seen: list[History] = [[]]

    def teardown(self) -> None:
        if self.host is None:
            return
        try:
            self.store.replace_fault = self.store.append_fault = None
            self._flush_until_written()
        finally:
            self.host.close()

    # -- helpers --------------------------------------------------------------

    def _held(self) -> History:
        def read() -> History:
            if "c" not in self.manager.context_ids():
                return []
            view = self.manager.history("c")
            return [(t, list(view.turn_messages(t))) for t in view.turn_ids]

        return self.portal.call(_sync, read)

    def _flush_until_written(self) -> None:
        for _ in range(20):
            try:
                self.portal.call(self.manager.leases.flush, "c")
                return
            except StoreUnavailableError:
                continue
        raise AssertionError("20 flushes in a row failed with the faults spent")

    def _after_step(self) -> None:
        self.seen.append(self._held())

    # -- rules ------------------------------------------------------------------

    @rule(kind=st.sampled_from(["text", "pair"]))
    def commit(self, kind: str) -> None:
        try:  # held, or claimed again after a rewrite that left no context
            self.portal.call(self.manager.leases.claim, "c")
        except StoreUnavailableError:
            return  # the forget queued before the claim met a fault
        index = self.turns
        self.turns += 1

        def change() -> None:
            first = "c" not in self.manager.context_ids()
            self.manager.accept_turn(
                TurnSnapshot(
                    context_id="c",
                    turn_id=f"t{index}",
                    input=(user(f"question {index}"),),
                    instructions=(SYSTEM,) if first else None,
                )
            )
            outputs = [assistant(f"answer {index}")]
            if kind == "pair":
                outputs = [call(f"k{index}"), result(f"k{index}", f"r{index}"), *outputs]
            self.manager.record("c", f"t{index}", outputs)

        self.portal.call(_sync, change)
        self._after_step()

    @rule(drop=st.integers(0, 3), middle=st.booleans())
    def rewrite(self, drop: int, middle: bool) -> None:
        def change() -> None:
            if "c" not in self.manager.context_ids():
                return
            view = self.manager.history("c")
            ids = list(view.turn_ids)
            if middle and len(ids) > 2:
                del ids[len(ids) // 2]
            elif drop:
                ids = ids[:-drop]
            pinned = view.pinned
            kept = [
                (t, view.turn_input(t), view.turn_messages(t)[len(view.turn_input(t)) :])
                for t in ids
            ]
            with self.manager.leases.rewriting("c"):
                self.manager.remove_context("c")
                for position, (turn_id, given, outputs) in enumerate(kept):
                    self.manager.accept_turn(
                        TurnSnapshot(
                            context_id="c",
                            turn_id=turn_id,
                            input=given,
                            instructions=pinned if position == 0 else None,
                        )
                    )
                    if outputs:
                        self.manager.record("c", turn_id, outputs)

        self.portal.call(_sync, change)
        self._after_step()

    @rule(where=st.sampled_from(["append", "replace"]), when=st.sampled_from(["before", "after"]))
    def fault(self, where: str, when: str) -> None:
        if where == "append":
            self.store.append_fault = when
        else:
            self.store.replace_fault = when

    @rule()
    def flush(self) -> None:
        try:
            self.portal.call(self.manager.leases.flush, "c")
        except StoreUnavailableError:
            return
        # Nothing changes between the flush's return and these reads: no step ran.
        held = self._held()
        assert _restored(self.portal.call(self.inner.load, "c"), self.limits) == held
        stats = self.manager.statistics().store
        assert stats is not None and stats.pending_records == 0

    @invariant()
    def every_stored_state_is_a_held_history(self) -> None:
        if self.host is None:
            return
        states, self.store.states = self.store.states, []
        for state in states:
            assert _restored(state, self.limits) in self.seen


async def _sync(function: Any) -> Any:
    return function()


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_the_writer_keeps_every_stored_state_whole(backend: str, tmp_path: Path) -> None:
    """Runs the state machine above on asyncio and trio (SQLite).

    Mutants tried: end_rewrite keeping the block's records (they are appended
    after the checkpoint); a rewrite that forgets the records logged before the
    block (``before = 0``): each fails. A second rewrite while a replace is in
    flight is left to test_rewrites.py, which holds the replace open."""

    class Machine(Rewrites):
        pass

    Machine.backend = backend
    Machine.directory = tmp_path
    run = Machine.TestCase
    run.settings = settings(
        max_examples=40,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    run().runTest()
