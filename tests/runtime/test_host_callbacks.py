"""Host callbacks (the token counter, the clock) fail typed, and change nothing.

Invariant (DESIGN rules 4 and 5; "after the door a prepare raises only
TurnloomErrors"): a token counter or a clock that raises, or a counter that
returns a count that is not an int in ``[0, MAX_TOKEN_COUNT]``, fails the
``accept_turn``, ``record`` or ``prepare`` that asked with a
:class:`HostCallbackError` (the callback's exception as the ``__cause__``):
no context is created, no message recorded, the slot is freed and nothing is
delivered. Runs on asyncio and trio.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

import msgspec
import pytest

from tests.runtime.helpers import SYSTEM, assistant, user
from turnloom.context import ApproxTokenCounter, LastNTurns, Message, ToolCallPart
from turnloom.errors import HostCallbackError
from turnloom.runtime import (
    STATE_TOOL_NAME,
    ContextContribution,
    ContextPrepareRequest,
    Foundation,
    Perception,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio

APPROX = ApproxTokenCounter()


class Counter:
    """Honest until ``bad`` is set; then answers it, or raises it when it is an exception."""

    def __init__(self) -> None:
        self.bad: Any = None
        self.only_state_pair = False

    def count(self, messages: Sequence[Message]) -> Any:
        state_pair = any(
            type(p) is ToolCallPart and p.name == STATE_TOOL_NAME for m in messages for p in m.parts
        )
        if self.bad is None or (self.only_state_pair and not state_pair):
            return APPROX.count(messages)
        if isinstance(self.bad, BaseException):
            raise self.bad
        return self.bad


def _fingerprint(foundation: Foundation) -> tuple[object, ...]:
    manager = foundation.manager
    return (
        msgspec.structs.asdict(manager.statistics()),
        manager.context_ids(),
        tuple(
            (manager.history(c).turn_ids, manager.history(c).messages())
            for c in manager.context_ids()
        ),
    )


@pytest.mark.parametrize("bad", [-1, 0.5, True, 2**63, OSError("tokenizer gone")], ids=repr)
async def test_accept_turn_and_record_refuse_a_failing_counter_and_change_nothing(
    bad: object,
) -> None:
    counter = Counter()
    async with Foundation(token_counter=counter) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),), instructions=(SYSTEM,))
        )
        counter.bad = bad
        before = _fingerprint(foundation)
        with pytest.raises(HostCallbackError) as caught:
            manager.accept_turn(TurnSnapshot(context_id="new", turn_id="t1", input=(user("a"),)))
        assert caught.value.callback == "token_counter"
        if isinstance(bad, OSError):
            assert caught.value.__cause__ is bad
        with pytest.raises(HostCallbackError):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("b"),)))
        with pytest.raises(HostCallbackError):
            manager.record("c", "t1", [assistant("hello")])
        assert _fingerprint(foundation) == before
        assert manager.context_ids() == ("c",)
        counter.bad = None  # the ids refused are free: nothing half-made holds them
        manager.accept_turn(TurnSnapshot(context_id="new", turn_id="t1", input=(user("a"),)))
        assert manager.context_ids() == ("c", "new")


@pytest.mark.parametrize("path", ["inline", "worker"])
async def test_a_counter_failing_on_the_state_pair_fails_the_prepare_and_frees_the_slot(
    path: str,
) -> None:
    """Counting the runtime-state pair happens in the render: its failure is typed too."""
    counter = Counter()
    async with Foundation(token_counter=counter) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        request = ContextPrepareRequest(
            context_id="c",
            turn_id="t1",
            contributions=(ContextContribution(name="memory", content="likes aisles"),),
            scope=LastNTurns(5) if path == "worker" else None,
        )
        counter.bad, counter.only_state_pair = ValueError("no pair"), True
        with pytest.raises(HostCallbackError) as caught:
            await manager.prepare(request)
        assert type(caught.value.__cause__) is ValueError
        stats = manager.statistics().preparations
        assert (stats.pending, stats.failed_total, stats.prepared_total) == (0, 1, 0)
        counter.bad = None
        prefix = await manager.prepare(request)
    # Nothing of the failed prepare stayed behind: the next equals a fresh host's.
    async with Foundation() as fresh:
        fresh.manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        expected = await fresh.manager.prepare(request)
    assert (prefix.items, prefix.tokens) == (expected.items, expected.tokens)


class RaisingClock:
    def __init__(self) -> None:
        self.error = RuntimeError("NTP unreachable")

    def __call__(self) -> datetime:
        raise self.error


@pytest.mark.parametrize("path", ["inline", "worker"])
async def test_a_clock_that_raises_fails_the_prepare_typed_with_its_cause(path: str) -> None:
    clock = RaisingClock()
    async with Foundation(clock=clock) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        before = _fingerprint(foundation)
        request = ContextPrepareRequest(
            context_id="c",
            turn_id="t1",
            perception=Perception(modality="voice"),
            scope=LastNTurns(5) if path == "worker" else None,
        )
        with pytest.raises(HostCallbackError) as caught:
            await manager.prepare(request)
        assert str(caught.value) == "The Foundation's clock raised RuntimeError: 'NTP unreachable'."
        assert (caught.value.callback, caught.value.__cause__) == ("clock", clock.error)
        stats = manager.statistics().preparations
        assert (stats.pending, stats.failed_total, stats.prepared_total) == (0, 1, 0)
        after = _fingerprint(foundation)
        assert after[1:] == before[1:]
