"""``TurnloomSession.pop_item`` with a store: the stored history is always whole.

``pop_item`` rebuilds the context without its newest item. It used to delete
the stored log (``clear_session``) and then write the kept items again
(``add_items``): a process killed between the two writes restored an empty
session (measured: 33 of 50 SIGKILLs on SQLite, 32 of 50 on Redis). Now the
rebuild is one ``manager.leases.rewriting`` block and the store gets it as one
atomic replace. These tests watch every state the stored log passes through
during pops, on SQLite (asyncio, trio) and Redis (asyncio).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from tests.stores.conftest import REDIS_URL, redis_prefix  # noqa: F401 (a fixture)
from tests.stores.recording import Recording
from turnloom.errors import StoreUnavailableError
from turnloom.integrations.openai_agents import TurnloomSession
from turnloom.runtime import Foundation
from turnloom.runtime._records import replay
from turnloom.stores import open_context_store

pytestmark = pytest.mark.anyio

ITEMS: list[dict[str, Any]] = [
    {"role": "user", "content": "Find the invoice."},
    {
        "type": "function_call",
        "call_id": "c1",
        "name": "search",
        "arguments": '{"q": "invoice"}',
        "id": "fc_1",
        "status": "completed",
    },
    {"type": "function_call_output", "call_id": "c1", "output": "invoice 42"},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_1",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Invoice 42.", "annotations": []}],
    },
    {"role": "user", "content": "Pay it."},
    {
        "type": "message",
        "role": "assistant",
        "id": "msg_2",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Paid.", "annotations": []}],
    },
]


@pytest.fixture(
    params=[
        pytest.param(("sqlite", "asyncio"), id="sqlite-asyncio"),
        pytest.param(("sqlite", "trio"), id="sqlite-trio"),
        pytest.param(("redis", "asyncio"), id="redis-asyncio"),
    ]
)
def kind(request: pytest.FixtureRequest) -> tuple[str, str]:
    value: tuple[str, str] = request.param
    return value


@pytest.fixture
def anyio_backend(kind: tuple[str, str]) -> str:
    return kind[1]


@pytest.fixture
def store_url(kind: tuple[str, str], tmp_path: Path, redis_prefix: str) -> str:  # noqa: F811
    if kind[0] == "sqlite":
        return f"sqlite:{tmp_path / 'contexts.db'}"
    return f"{REDIS_URL}?prefix={redis_prefix}"


def _stored_items(session: TurnloomSession, log: Sequence[bytes]) -> list[dict[str, Any]]:
    """The items a session restored from ``log`` would hold (the gateway's render)."""
    if not log:
        return []
    manager = session._manager
    view = replay(session.session_id, log, manager.history_limits).view()
    items: list[dict[str, Any]] = []
    for turn_id in view.turn_ids:
        for message in view.turn_messages(turn_id):
            items.extend(manager.gateway.render(message))
    return items


async def test_every_stored_state_during_pops_is_a_whole_history(store_url: str) -> None:
    """Invariant: while a session pops its items one by one, each state the stored
    log passes through restores ITEMS[:n] for the n held before or after a pop
    (never an empty or partial history), and after each pop returns the store
    holds exactly the session's items.

    Mutant tried: pop_item rebuilding as clear_session then add_items (the old
    code): the store passes through an empty log: fails."""
    async with open_context_store(store_url) as inner:
        store = Recording(inner, "s1")
        async with Foundation(gateway="openai_responses", store=store) as foundation:
            session = TurnloomSession("s1", foundation.manager)
            await session.add_items(list(ITEMS))  # type: ignore[arg-type]
            for n in range(len(ITEMS), 0, -1):
                store.states.clear()
                assert await session.pop_item() == ITEMS[n - 1]
                assert session._all_items() == ITEMS[: n - 1]  # held (an open call too)
                for state in store.states:
                    assert _stored_items(session, state) in (ITEMS[:n], ITEMS[: n - 1])
                assert _stored_items(session, await inner.load("s1")) == ITEMS[: n - 1]
            assert await session.pop_item() is None


async def test_a_pop_whose_store_write_fails_is_retried_by_the_next_flush(
    store_url: str,
) -> None:
    """Invariant: when the store fails the pop's replace, pop_item raises
    StoreUnavailableError with the item taken out in memory and queued; the next
    flush writes it, and a new host restores the session without the item."""
    async with open_context_store(store_url) as inner:
        store = Recording(inner, "s1")
        async with Foundation(gateway="openai_responses", store=store) as foundation:
            session = TurnloomSession("s1", foundation.manager)
            await session.add_items(list(ITEMS))  # type: ignore[arg-type]
            store.replace_fault = "before"
            with pytest.raises(StoreUnavailableError):
                await session.pop_item()
            assert await session.get_items() == ITEMS[:-1]
            assert _stored_items(session, await inner.load("s1")) == ITEMS
            await foundation.manager.leases.flush("s1")
            assert _stored_items(session, await inner.load("s1")) == ITEMS[:-1]
    async with open_context_store(store_url) as inner:
        async with Foundation(gateway="openai_responses", store=inner) as foundation:
            session = TurnloomSession("s1", foundation.manager)
            assert await session.get_items() == ITEMS[:-1]
