"""The summary state machine of ``test_summaries_stateful`` on a SQLite store.

Same rules (commits, answers, tool pairs and open calls, model calls, false
starts and their retraction, a summarizer that finishes, raises or is
cancelled, pruning on or off; histories past their limit), every gateway,
asyncio and trio, with the Foundation writing to a real SQLite store.

Invariant added after every step: once the store acknowledged every write
(``manager.leases.flush``), the history a restart restores from the store
(the log replayed) is the live history: the same turn ids (the summary turn
first), the same pinned instructions, the same input and messages of each
turn. (The inherited ``prepare`` rule checks that the live history's input
validates and equals a cold render of it: so does the restored one's.)
"""

from __future__ import annotations

import tempfile
import uuid
from pathlib import Path
from typing import Any

from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import initialize, invariant

from tests.runtime.test_summaries_stateful import Controlled, SummaryMachine
from turnloom.context import CompactionPolicy, GatewayType, PrunePolicy, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.runtime import Foundation
from turnloom.runtime._records import replay
from turnloom.stores import open_context_store

_DIRECTORY = Path(tempfile.mkdtemp(prefix="turnloom-summary-store-"))


class StoreSummaryMachine(SummaryMachine):
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
        path = _DIRECTORY / f"{uuid.uuid4().hex}.db"
        self.store_url = f"sqlite:{path}"
        store_cm = self.portal.wrap_async_context_manager(open_context_store(self.store_url))
        self.store = store_cm.__enter__()
        self._entered.append(store_cm)
        self.options: dict[str, Any] = {
            "gateway": kind,
            "history_limits": self.limits,
            "earlier_state": "drop",
            "worker_threads": 1,
        }
        self.foundation = Foundation(**self.options, store=self.store)
        self.cold = Foundation(**self.options)
        for foundation in (self.foundation, self.cold):
            cm = self.portal.wrap_async_context_manager(foundation)
            cm.__enter__()
            self._entered.append(cm)
        self.manager = self.foundation.manager
        self.portal.call(self.manager.leases.claim, "c")
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

    @invariant()
    def the_store_restores_the_live_history(self) -> None:
        if not hasattr(self, "store"):
            return
        manager = self.manager
        if "c" not in self.portal.call(manager.context_ids):
            return
        self.portal.call(manager.leases.flush, "c")
        live = self.portal.call(manager.history, "c")
        log = self.portal.call(self.store.load, "c")
        restored = replay("c", log, self.limits).view()
        assert restored.turn_ids == live.turn_ids
        assert restored.pinned == live.pinned
        for turn_id in live.turn_ids:
            assert restored.turn_messages(turn_id) == live.turn_messages(turn_id), turn_id
            assert restored.turn_input(turn_id) == live.turn_input(turn_id), turn_id


class TrioStoreSummaryMachine(StoreSummaryMachine):
    BACKEND = "trio"


_SETTINGS = settings(max_examples=15, stateful_step_count=30, deadline=None)
StoreSummaryMachine.TestCase.settings = _SETTINGS
TrioStoreSummaryMachine.TestCase.settings = _SETTINGS
test_summaries_on_a_store_asyncio = StoreSummaryMachine.TestCase
test_summaries_on_a_store_trio = TrioStoreSummaryMachine.TestCase
