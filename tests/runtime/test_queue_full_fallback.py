"""The ``prepare_nowait`` -> ``prepare`` fallback checks an unchanged request once."""

from __future__ import annotations

import anyio
import pytest

import turnloom.runtime._preparing as preparing
from tests.runtime.helpers import GatedStrategy, user
from turnloom.errors import InvalidMessageError, QueueFullError
from turnloom.runtime import (
    ContextContribution,
    ContextPrepareRequest,
    Foundation,
    PreparedContext,
    TurnSnapshot,
)
from turnloom.runtime._door import check_request

pytestmark = pytest.mark.anyio

_STATE = ContextContribution(name="cart", content="2 items")


async def _refused_then_prepared(
    monkeypatch: pytest.MonkeyPatch, first: ContextPrepareRequest, then: ContextPrepareRequest
) -> tuple[list[ContextPrepareRequest], PreparedContext | InvalidMessageError]:
    """Hold the only slot, refuse ``first`` (prepare_nowait), then prepare ``then``.

    Returns the requests check_request saw from the refusal on, and the prefix
    (or the door's error).
    """
    checked: list[ContextPrepareRequest] = []

    def spy(request: ContextPrepareRequest, max_item_bytes: int) -> ContextPrepareRequest:
        checked.append(request)
        return check_request(request, max_item_bytes)

    strategy = GatedStrategy()
    strategy.open("hi")
    async with Foundation(max_pending_preparations=1, strategy=strategy) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t0", input=(user("hi"),)))
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("go"),)))
        async with anyio.create_task_group() as group:
            # Admitted, its assembly waits at the closed gate of "go": it holds the only slot.
            group.start_soon(manager.prepare, ContextPrepareRequest(context_id="c", turn_id="t1"))
            await anyio.wait_all_tasks_blocked()
            assert manager.statistics().preparations.pending == 1
            monkeypatch.setattr(preparing, "check_request", spy)
            with pytest.raises(QueueFullError):
                await manager.prepare_nowait(first)
            result: list[PreparedContext | InvalidMessageError] = []

            async def fallback() -> None:
                try:
                    result.append(await manager.prepare(then))
                except InvalidMessageError as exc:
                    result.append(exc)

            group.start_soon(fallback)
            await anyio.wait_all_tasks_blocked()
            strategy.open("go")
        return checked, result[0]


async def test_the_fallback_with_the_same_request_does_not_check_it_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: a frozen request refused by prepare_nowait for a full queue is not
    checked again by the prepare that follows with that very object; the prefix is
    the one a checked request gives."""
    request = ContextPrepareRequest(context_id="c", turn_id="t0", contributions=(_STATE,))
    checked, prefix = await _refused_then_prepared(monkeypatch, request, request)
    assert checked == [request]
    assert isinstance(prefix, PreparedContext)
    assert (prefix.context_id, prefix.turn_id) == ("c", "t0")
    assert any("2 items" in str(item) for item in prefix.items)


async def test_a_request_that_may_change_is_checked_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: a request whose contributions are a list (the caller may change it)
    is checked again by the fallback, even as the same object."""
    request = ContextPrepareRequest(
        context_id="c",
        turn_id="t0",
        contributions=[_STATE],  # type: ignore[arg-type]
    )
    checked, _ = await _refused_then_prepared(monkeypatch, request, request)
    assert checked == [request, request]


async def test_another_request_after_a_refusal_is_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: only the very refused object skips the check: a different, bad
    request after a refusal is refused at the door, as it always is."""
    good = ContextPrepareRequest(context_id="c", turn_id="t0")
    bad = ContextPrepareRequest(context_id="", turn_id="t0")
    with anyio.fail_after(5):
        checked, refused = await _refused_then_prepared(monkeypatch, good, bad)
    assert checked == [good, bad]
    assert isinstance(refused, InvalidMessageError)
    assert str(refused) == "The context id must be a non-empty string, not ''."
