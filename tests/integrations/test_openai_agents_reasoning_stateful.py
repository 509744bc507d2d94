"""A hypothesis state machine: reasoning items, parallel calls and one-item batches.

It extends the list-model machine of ``test_openai_agents_stateful`` (a
``TurnloomSession`` on a real SQLite store, asyncio and trio) with the items
a reasoning model's run stores: a ``reasoning`` item before its calls or its
reply, parallel calls, and a host that stores one item per ``add_items``
call (a reasoning item may be the newest item held, with its output not
added yet).

Invariants after every step: ``pop_item`` returns the newest item added and
not popped, and the session then holds every other item; ``get_items()``
hands out the model's items without a reasoning item that no output item
follows (yet), made complete (``complete_window``); the store restores the
same history.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from hypothesis import strategies as st
from hypothesis.stateful import invariant, precondition, rule

pytest.importorskip("agents")

from tests.integrations.test_openai_agents_stateful import Session, run_machine
from turnloom.context import join_steps
from turnloom.integrations.openai_agents import TurnloomSession, complete_window
from turnloom.runtime._records import replay

_FOLLOWS = ("function_call", "message", "web_search_call")  # output items of a response


def shown(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """``items`` without a reasoning item that no output item directly follows (the
    gateway's rule: a reasoning item must be followed by an output item of its response)."""
    return [
        item
        for item, after in zip(items, [*items[1:], {}], strict=False)
        if item.get("type") != "reasoning" or after.get("type") in _FOLLOWS
    ]


class ReasoningSession(Session):
    def _reasoning(self) -> dict[str, Any]:
        n = self._next()
        return {
            "type": "reasoning",
            "id": f"rs_{n}",
            "summary": [{"type": "summary_text", "text": f"Think {n}."}],
            "encrypted_content": f"enc-{n}",
        }

    def _add_each(self, items: list[dict[str, Any]], one_by_one: bool) -> None:
        for batch in [[i] for i in items] if one_by_one else [items]:
            self._add(batch)

    @precondition(lambda self: bool(self.model) and self._open_call() is None)
    @rule(calls=st.integers(0, 3), one_by_one=st.booleans(), reply=st.booleans())
    def add_reasoning_step(self, calls: int, one_by_one: bool, reply: bool) -> None:
        """A reasoning item, then its parallel calls and their outputs (answered in
        reverse order), or its reply."""
        made = [self._call() for _ in range(calls)]
        items = [*made, *(self._output(c) for c in reversed(made))]
        if reply or not calls:
            items += [self._reasoning(), self._reply()]
        if calls:
            items.insert(0, self._reasoning())
        self._add_each(items, one_by_one)

    @precondition(
        lambda self: (
            bool(self.model)
            and self._open_call() is None
            and self.model[-1].get("type") != "reasoning"
        )  # the gateway keeps one, not a run
    )
    @rule()
    def add_lone_reasoning(self) -> None:
        """A reasoning item stored on its own: its output item is not added yet."""
        self._add([self._reasoning()])

    @invariant()
    def the_session_holds_the_model(self) -> None:
        if not hasattr(self, "session"):
            return
        assert self.portal.call(self.session.get_items) == complete_window(shown(self.model))

    @invariant()
    def the_store_restores_the_model(self) -> None:
        if not hasattr(self, "session"):
            return
        log = self.portal.call(self.store.load, "s")
        assert _restored(self.session, log) == shown(self.model)


def _restored(session: TurnloomSession, log: list[bytes]) -> list[dict[str, Any]]:
    """The items a session restored from ``log`` hands out, steps joined as it joins them."""
    if not log:
        return []
    manager = session._manager
    view = replay("s", log, manager.history_limits).view()
    items: list[dict[str, Any]] = []
    for turn_id in view.turn_ids:
        for message in join_steps(view.turn_messages(turn_id), "reasoning"):
            items.extend(manager.gateway.render(message))
    return items


@pytest.mark.parametrize(
    ("backend", "max_turns"), [("asyncio", 32), ("trio", 32), ("asyncio", 3), ("trio", 3)]
)
def test_reasoning_pops_and_one_item_batches_match_a_list(
    backend: str, max_turns: int, tmp_path: Path
) -> None:
    """Runs the state machine above on asyncio and trio (SQLite)."""

    run_machine(ReasoningSession, backend, max_turns, tmp_path, max_examples=25)
