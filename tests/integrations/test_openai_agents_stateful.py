"""A hypothesis state machine: the OpenAI Agents session against a plain list of items.

A ``TurnloomSession`` on a real SQLite store (asyncio and trio, in a blocking
portal) is driven as the SDK and its users drive one: batches of new items (a
user input with a tool call, its output and a reply; outputs only, joining the
newest turn; a call left open; the output answering it), ``pop_item`` (an
undo, which rebuilds the context in one atomic write), ``clear_session``, and
reads with and without a limit. The model is the list of items added, minus
those popped, by turn; with ``max_turns=3`` the oldest whole turns leave it
as they leave the history (eviction at each commit past the limit).

Invariants after every step: the session holds exactly the model's items
(``_all_items``); ``get_items()`` is ``complete_window`` of them and
``get_items(limit)`` of their newest ``limit``; the store's log restores the
same items (every write was acknowledged before the call returned).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

pytest.importorskip("agents")

from tests._portal import PortalFoundation
from turnloom.context.history import HistoryLimits
from turnloom.integrations.openai_agents import TurnloomSession, complete_window
from turnloom.runtime._records import replay


class Session(RuleBasedStateMachine):
    backend = "asyncio"
    max_turns = 32
    directory: Path

    def __init__(self) -> None:
        super().__init__()
        self.host: PortalFoundation | None = None
        self.turns: list[list[dict[str, Any]]] = []  # each turn's items, oldest first
        self.serial = 0

    @property
    def model(self) -> list[dict[str, Any]]:
        """The items the session must hold: every turn's, oldest first."""
        return [item for turn in self.turns for item in turn]

    @initialize()
    def start(self) -> None:
        self.host = PortalFoundation(
            self.backend,
            self.directory,
            gateway="openai_responses",
            lease_ttl=60.0,
            history_limits=HistoryLimits(max_turns=self.max_turns),
        )
        self.portal, self.store, self.manager = self.host.portal, self.host.store, self.host.manager
        self.session = TurnloomSession("s", self.manager)

    def teardown(self) -> None:
        if self.host is not None:
            self.host.close()

    # -- items ------------------------------------------------------------------

    def _next(self) -> int:
        self.serial += 1
        return self.serial

    def _user(self) -> dict[str, Any]:
        return {"role": "user", "content": f"Question {self._next()}."}

    def _reply(self) -> dict[str, Any]:
        n = self._next()
        return {
            "type": "message",
            "role": "assistant",
            "id": f"msg_{n}",
            "status": "completed",
            "content": [{"type": "output_text", "text": f"Answer {n}.", "annotations": []}],
        }

    def _call(self) -> dict[str, Any]:
        n = self._next()
        return {
            "type": "function_call",
            "call_id": f"call_{n}",
            "name": "lookup",
            "arguments": f'{{"n": {n}}}',
            "id": f"fc_{n}",
            "status": "completed",
        }

    @staticmethod
    def _output(call: dict[str, Any]) -> dict[str, Any]:
        return {"type": "function_call_output", "call_id": call["call_id"], "output": "found"}

    def _add(self, items: list[dict[str, Any]]) -> None:
        added: list[Any] = [dict(i) for i in items]  # plain dicts for the SDK's item types
        self.portal.call(self.session.add_items, added)
        if items[0].get("role") == "user":
            self.turns.append(list(items))
            del self.turns[: -self.max_turns]  # whole turns evicted, oldest first
        else:
            self.turns[-1].extend(items)

    def _open_call(self) -> dict[str, Any] | None:
        """The newest turn's call without an output, if the items end inside its step."""
        answered = {i["call_id"] for i in self.model if i.get("type") == "function_call_output"}
        for item in reversed(self.model):
            if item.get("role") == "user":
                return None
            if item.get("type") == "function_call" and item["call_id"] not in answered:
                return item
        return None

    # -- rules ------------------------------------------------------------------

    @rule(tool=st.booleans(), reply=st.booleans())
    def add_turn(self, tool: bool, reply: bool) -> None:
        items = [self._user()]
        if tool:
            call = self._call()
            items += [call, self._output(call)]
        if reply or not tool:
            items.append(self._reply())
        self._add(items)

    @precondition(lambda self: bool(self.model) and self._open_call() is None)
    @rule(kind=st.sampled_from(["reply", "pair", "open call"]))
    def add_outputs(self, kind: str) -> None:
        if kind == "reply":
            self._add([self._reply()])
        elif kind == "pair":
            call = self._call()
            self._add([call, self._output(call)])
        else:
            self._add([self._call()])

    @precondition(lambda self: self._open_call() is not None)
    @rule()
    def answer_open_call(self) -> None:
        call = self._open_call()
        assert call is not None
        self._add([self._output(call)])

    @rule()
    def pop(self) -> None:
        popped = self.portal.call(self.session.pop_item)
        expected = self.turns[-1].pop() if self.turns else None
        if self.turns and not self.turns[-1]:
            self.turns.pop()
        assert popped == expected

    @rule()
    def clear(self) -> None:
        self.portal.call(self.session.clear_session)
        self.turns.clear()

    # -- invariants ---------------------------------------------------------------

    @invariant()
    def the_session_holds_the_model(self) -> None:
        if self.host is None:
            return
        held = self.portal.call(_held, self.session)
        assert held == self.model
        window = complete_window(self.model)
        assert self.portal.call(self.session.get_items) == window
        assert self.portal.call(self.session.get_items, 3) == complete_window(self.model[-3:])

    @invariant()
    def the_store_restores_the_model(self) -> None:
        if self.host is None:
            return
        log = self.portal.call(self.store.load, "s")
        assert _restored(self.session, log) == self.model


async def _held(session: TurnloomSession) -> list[dict[str, Any]]:
    return session._all_items()


def _restored(session: TurnloomSession, log: Sequence[bytes]) -> list[dict[str, Any]]:
    """The items a session restored from ``log`` would hold."""
    if not log:
        return []
    manager = session._manager
    view = replay("s", log, manager.history_limits).view()
    items: list[dict[str, Any]] = []
    for turn_id in view.turn_ids:
        for message in view.turn_messages(turn_id):
            items.extend(manager.gateway.render(message))
    return items


@pytest.mark.parametrize(
    ("backend", "max_turns"), [("asyncio", 32), ("trio", 32), ("asyncio", 3), ("trio", 3)]
)
def test_the_session_matches_a_list_of_items(backend: str, max_turns: int, tmp_path: Path) -> None:
    """Runs the state machine above on asyncio and trio (SQLite).

    Mutant tried: pop_item rebuilding without its rewriting block (remove, then
    add the kept items): the store still restores the model between steps (the
    flush waits for both writes), so only the crash tests catch it; pop_item
    returning items[-2]: fails."""

    run_machine(Session, backend, max_turns, tmp_path, max_examples=20)


def run_machine(
    machine: type[Session], backend: str, max_turns: int, directory: Path, *, max_examples: int
) -> None:
    """Run a subclass of ``machine`` on ``backend`` with ``max_turns``, its stores in
    ``directory``: ``max_examples`` examples of up to 25 steps, no deadline."""

    class Machine(machine):  # type: ignore[valid-type,misc]
        pass

    Machine.backend = backend
    Machine.max_turns = max_turns
    Machine.directory = directory
    run = Machine.TestCase
    run.settings = settings(
        max_examples=max_examples,
        stateful_step_count=25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
    )
    run().runTest()
