"""What a voice host needs from the manager: a reply cut by its played text, a hang-up
that ends every piece of work of its call, and a next input built without handing back
what turnloom already recorded.

Invariants:
* ``record_interrupted(played_text=...)`` records the model's own text up to the word
  the played transcript ends on (``played_count``), and refuses a transcript of
  something else with nothing recorded.
* ``remove_context`` is idempotent; it cancels the context's preparations (each
  settles as discarded, its requester gets ContextRemovedError, slots free) and the
  body of its invocation block (which exits without an error); outputs recorded for
  it later, by the invocation or by id, are dropped and counted as late.
* ``build(prefix, recorded=True)`` equals ``build(prefix, outputs)`` with the outputs
  the turn recorded, and ``request_bytes`` agrees.
"""

from __future__ import annotations

import anyio
import msgspec
import pytest

from tests.runtime.helpers import SYSTEM, BlockingGateway, assistant, result, user
from turnloom.context import Message, Role, TextPart, ToolCallPart
from turnloom.errors import (
    ContextRemovedError,
    InvalidArgumentError,
    InvalidMessageError,
    PlayedTextMismatchError,
    UnknownContextError,
)
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio

# A contribution makes the render draw the runtime-state pair, fresh: a
# BlockingGateway holds the worker thread there.
FRESH = (ContextContribution(name="time", content="09:00"),)

REPLY = "Your flight to Boston costs $25. It leaves at 3:30 PM from gate 12."


def _accept(manager: ContextManager, context_id: str, turn_id: str, text: str) -> None:
    manager.accept_turn(
        TurnSnapshot(
            context_id=context_id,
            turn_id=turn_id,
            input=(user(text),),
            instructions=(SYSTEM,) if turn_id == "t1" else None,
        )
    )


async def test_played_text_records_the_model_words_up_to_the_played_ones() -> None:
    """Invariant: the history holds the model's text cut after "$25." (the TTS said
    "twenty-five dollars"), through manager.voice and through the invocation alike."""
    async with Foundation() as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "How much is my flight?")
        played = "your flight to boston costs twenty-five dollars"
        assert (
            manager.voice.record_interrupted("c", "t1", assistant(REPLY), played_text=played) == 1
        )
        _accept(manager, "c", "t2", "And when does it leave?")
        async with manager.invocation("c", "t2") as invocation:
            recorded = invocation.record_interrupted(
                assistant(REPLY),
                played_text="Your flight to Boston costs twenty five "
                "dollars. It leaves at three thirty",
            )
        assert recorded == 1
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert [item.get("content") for item in prefix.items] == [
            "You are an airline agent.",
            "How much is my flight?",
            "Your flight to Boston costs $25.",
            "And when does it leave?",
        ]
        assert manager.history("c").turn_messages("t2")[1].text == (
            "Your flight to Boston costs $25. It leaves at 3:30"
        )


async def test_a_transcript_of_another_reply_is_refused_with_nothing_recorded() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "Hi")
        with pytest.raises(PlayedTextMismatchError) as caught:
            manager.voice.record_interrupted(
                "c", "t1", assistant(REPLY), played_text="the weather today is sunny"
            )
        assert (caught.value.words, caught.value.matched) == (5, 0)
        for kwargs in ({}, {"played": 3, "played_text": "your"}):
            with pytest.raises(InvalidMessageError) as refused:
                manager.voice.record_interrupted("c", "t1", assistant(REPLY), **kwargs)  # type: ignore[arg-type]
            assert refused.value.field == "played"
        assert manager.history("c").turn_messages("t1") == (user("Hi"),)


async def test_remove_context_is_idempotent_and_later_records_are_dropped_and_counted() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "Hi")
        manager.remove_context("c")
        manager.remove_context("c")  # a second hang-up event: nothing happens
        assert manager.context_ids() == ()
        assert manager.record("c", "t1", [assistant("late"), assistant("later")]) == 0
        assert manager.voice.record_interrupted("c", "t1", assistant("late"), played=2) == 0
        assert manager.statistics().history.dropped_late_outputs_total == 3
        with pytest.raises(InvalidMessageError):
            manager.record("c", "t1", "not a list")  # type: ignore[arg-type]
        with pytest.raises(InvalidMessageError):
            manager.record("c", "t1", [5])  # type: ignore[list-item]
        assert manager.statistics().history.dropped_late_outputs_total == 3
        with pytest.raises(UnknownContextError):
            manager.remove_context("never")
        with pytest.raises(UnknownContextError):
            manager.record("never", "t1", [assistant("x")])
        # Created again, the id is a context again: records count, a removal removes.
        _accept(manager, "c", "t1", "Back")
        assert manager.record("c", "t1", [assistant("Hello again")]) == 1
        manager.remove_context("c")
        assert manager.context_ids() == ()


async def test_remove_context_cancels_the_model_call_in_flight() -> None:
    """Invariant: a hang-up while the model streams cancels the invocation block's body;
    the block exits without an error, code after it runs, and what the block records
    afterwards (nothing can: it is cancelled) or by id is dropped and counted."""
    async with Foundation() as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "Tell me a story")
        streamed: list[str] = []
        after_block: list[str] = []
        started = anyio.Event()

        async def model_call() -> None:
            async with manager.invocation("c", "t1") as invocation:
                started.set()
                for chunk in ("Once ", "upon ", "a ", "time"):
                    streamed.append(chunk)
                    await anyio.sleep(0.01)
                invocation.record([assistant("".join(streamed))])
            after_block.append("ran")

        async with anyio.create_task_group() as group:
            group.start_soon(model_call)
            await started.wait()
            await anyio.sleep(0.015)
            manager.remove_context("c")
        assert 0 < len(streamed) < 4
        assert after_block == ["ran"]
        stats = manager.statistics()
        assert (stats.invocations, stats.history.turns) == (0, 0)
        assert manager.record("c", "t1", [assistant("".join(streamed))]) == 0
        assert manager.statistics().history.dropped_late_outputs_total == 1


async def test_an_invocation_records_late_after_a_removal_are_dropped() -> None:
    """The block's own record after the removal (a reply finishing in a shield) is late."""
    async with Foundation() as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "Hi")
        async with manager.invocation("c", "t1") as invocation:
            manager.remove_context("c")
            with anyio.CancelScope(shield=True):
                assert invocation.record([assistant("Hello")]) == 0
        assert manager.statistics().history.dropped_late_outputs_total == 1


async def test_remove_context_discards_a_preparation_rendering_in_its_thread() -> None:
    """Invariant: a preparation whose worker thread renders when its context is removed
    is left to finish, its result discarded: its requester gets ContextRemovedError, it
    counts as discarded, its slot is free, and nothing is kept for the removed context."""
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, worker_threads=1) as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "Hi")
        gateway.hold = True
        errors: list[ContextRemovedError] = []

        async def prepares() -> None:
            try:
                await manager.prepare(
                    ContextPrepareRequest(context_id="c", turn_id="t1", contributions=FRESH)
                )
            except ContextRemovedError as exc:
                errors.append(exc)

        async with anyio.create_task_group() as group:
            group.start_soon(prepares)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            manager.remove_context("c")
            gateway.release.set()
        gateway.hold = False
        assert [(e.context_id, e.turn_id) for e in errors] == [("c", "t1")]
        stats = manager.statistics().preparations
        assert (stats.pending, stats.prepared_total, stats.failed_total) == (0, 0, 0)
        assert stats.discarded_total == 1
        _accept(manager, "c", "t1", "Hello")
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert [item["content"] for item in prefix.items] == ["You are an airline agent.", "Hello"]


async def test_remove_context_cancels_a_preparation_waiting_for_a_thread() -> None:
    """A preparation queued behind another context's render (the one worker is busy)
    settles as discarded with ContextRemovedError; the other context's is delivered."""
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, worker_threads=1) as foundation:
        manager = foundation.manager
        _accept(manager, "a", "t1", "Hi")
        _accept(manager, "b", "t1", "Hi")
        gateway.hold = True
        outcomes: dict[str, str] = {}

        async def prepares(context_id: str) -> None:
            try:
                await manager.prepare(
                    ContextPrepareRequest(context_id=context_id, turn_id="t1", contributions=FRESH)
                )
                outcomes[context_id] = "delivered"
            except ContextRemovedError:
                outcomes[context_id] = "removed"

        async with anyio.create_task_group() as group:
            group.start_soon(prepares, "a")
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            group.start_soon(prepares, "b")
            await anyio.wait_all_tasks_blocked()
            manager.remove_context("b")
            gateway.release.set()
        gateway.hold = False
        assert outcomes == {"a": "delivered", "b": "removed"}
        stats = manager.statistics().preparations
        assert (stats.pending, stats.prepared_total, stats.discarded_total) == (0, 1, 1)


async def test_build_with_recorded_needs_no_outputs_handed_back() -> None:
    """Invariant: build(prefix, recorded=True) == build(prefix, the recorded outputs),
    with a later continuation after them; request_bytes agrees byte for byte."""
    async with Foundation() as foundation:
        manager = foundation.manager
        _accept(manager, "c", "t1", "Is flight 12 on time?")
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert manager.build(prefix, recorded=True) == manager.build(prefix)
        speaking = Message(
            role=Role.assistant,
            content=(
                TextPart(text="Let me check."),
                ToolCallPart(call_id="k1", name="status", arguments='{"flight": 12}'),
            ),
        )
        outputs = [speaking, result("k1", "on time")]
        manager.record("c", "t1", outputs)
        built = manager.build(prefix, recorded=True)
        assert built == manager.build(prefix, outputs)
        assert [item["role"] for item in built] == ["system", "user", "assistant", "tool"]
        assert built[2]["tool_calls"][0]["id"] == "k1"
        later = [assistant("It is on time.")]
        assert manager.build(prefix, later, recorded=True) == manager.build(
            prefix, [*outputs, *later]
        )
        fields = {"model": "gpt-4o"}
        expected = manager.build(prefix, [*outputs, *later])
        assert manager.request_bytes(prefix, later, fields=fields, recorded=True) == (
            msgspec.json.encode({**fields, **manager.gateway.request_body(expected)})
        )
        with pytest.raises(InvalidArgumentError) as caught:
            manager.build(prefix, recorded=1)  # type: ignore[arg-type]
        assert caught.value.field == "recorded"
        _accept(manager, "c", "t2", "Thanks")  # t1 stays held: its outputs still count
        assert manager.build(prefix, recorded=True) == built


async def test_build_recorded_refuses_a_foreign_prefix_as_build_does() -> None:
    async with Foundation() as first, Foundation() as second:
        _accept(first.manager, "c", "t1", "Hi")
        _accept(second.manager, "c", "t1", "Hi")
        prefix = await first.manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        with pytest.raises(InvalidMessageError):
            second.manager.build(prefix, recorded=True)
