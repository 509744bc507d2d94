"""Context Areas connected to the runtime: the area section of a prepared input.

Source: seed 000 (areas, safe points, the Collector) and seed 004 / issue 5
(preparations in worker threads, no collection while a model call is in
flight, items reclaimed by the Collector as a statistic). Every test runs on
asyncio and on trio (``anyio_backend`` fixture).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from turnloom.areas import OneShotNotice, PinnedNotice, SubtaskArea
from turnloom.context import GatewayType, Message, NativeContent, get_gateway
from turnloom.context.area import AreaFlowState, AreaLifeState
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    AreaCallbackError,
    DuplicateAreaError,
    InvalidAreaError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    OpenToolCallError,
    UnknownContextError,
)
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
    state_call_id,
)

pytestmark = pytest.mark.anyio


def snapshot(turn_id: str, text: str, **kw: Any) -> TurnSnapshot:
    return TurnSnapshot(context_id="c", turn_id=turn_id, input=(user(text),), **kw)


def request(turn_id: str, **kw: Any) -> ContextPrepareRequest:
    return ContextPrepareRequest(context_id="c", turn_id=turn_id, **kw)


def native(manager: ContextManager, message: Message) -> list[NativeContent]:
    return manager.gateway.render(message)


def history_of(manager: ContextManager) -> tuple[object, ...]:
    view = manager.history("c")
    return (view.turn_ids, tuple(view.turn_messages(t) for t in view.turn_ids))


async def _wait_until(predicate: Any) -> None:
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.005)


class FlakyArea:
    """Renders one notice; its render raises while ``broken`` is set."""

    def __init__(self) -> None:
        self.broken = True
        self._life = AreaLifeState.retain

    @property
    def life_state(self) -> AreaLifeState:
        return self._life

    @property
    def flow_state(self) -> AreaFlowState:
        return AreaFlowState.yielded

    def observe(self, context: Sequence[NativeContent]) -> None:
        del context

    def render(self) -> list[Message]:
        if self.broken:
            raise ValueError("the memory store is unreachable")
        self._life = AreaLifeState.retired
        return [user("recalled: window seat")]

    def promote(self) -> tuple[Message, ...]:
        return ()

    def gc_prologue(self) -> None:
        pass


class HeldArea(FlakyArea):
    """A one-shot area whose render can be held in the worker thread.

    It records how many renders overlap, so a test can check that one
    context's CoopContext is never used by two threads at once.
    """

    def __init__(self, *, hold: bool, retire: bool = True) -> None:
        super().__init__()
        self.broken = False
        self.retire = retire
        self.hold = hold
        self.entered = threading.Event()
        self.release = threading.Event()
        self.active = 0
        self.overlap = 0
        self.renders = 0

    def render(self) -> list[Message]:
        self.active += 1
        self.overlap = max(self.overlap, self.active)
        try:
            self.entered.set()
            if self.hold:
                self.release.wait(10)
            else:
                time.sleep(0.02)  # widen the window in which a second render could overlap
            self.renders += 1
            if self.renders > 1:
                return []
            if self.retire:
                self._life = AreaLifeState.retired
            return [user("held notice")]
        finally:
            self.active -= 1


async def test_a_one_shot_notice_sits_after_the_turn_input_and_is_collected_next() -> None:
    """Prefix = instructions + turns + turn input + state pair + area section; then GC."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "Where is my bag?", instructions=(SYSTEM,)))
        manager.areas.attach("c", OneShotNotice("Bags are tracked by tag number."))
        assert manager.statistics().areas.attached == 1
        first = await manager.prepare(request("t1", loop_budget=3))
        call_id = state_call_id("c", "t1")
        assert list(first.items[:2]) == [
            {"role": "system", "content": "You are an airline agent."},
            {"role": "user", "content": "Where is my bag?"},
        ]
        assert first.items[2]["tool_calls"][0]["id"] == call_id
        assert first.items[3]["tool_call_id"] == call_id
        assert first.items[4] == {"role": "user", "content": "Bags are tracked by tag number."}
        assert (first.turn_start, first.area_start, first.area_items, first.item_count) == (
            1,
            4,
            1,
            5,
        )
        assert first.area_pass == "rendered"
        stats = manager.statistics()
        assert (stats.areas.renders_total, stats.areas.collected_total) == (1, 0)
        assert stats.areas.items_reclaimed_total == 0

        manager.record("c", "t1", [assistant("It is at gate 4.")])
        manager.accept_turn(snapshot("t2", "Thanks"))
        second = await manager.prepare(request("t2"))
        # t1 keeps the state pair it was sent (earlier_state="keep"), not the notice.
        assert list(second.items) == [
            {"role": "system", "content": "You are an airline agent."},
            {"role": "user", "content": "Where is my bag?"},
            first.items[2],
            first.items[3],
            {"role": "assistant", "content": "It is at gate 4."},
            {"role": "user", "content": "Thanks"},
        ]
        assert (second.area_start, second.area_items, second.area_pass) == (6, 0, "rendered")
        assert history_of(manager)[0] == ("t1", "t2")  # the notice never entered history
        stats = manager.statistics()
        assert (
            stats.areas.registered_total,
            stats.areas.attached,
            stats.areas.renders_total,
            stats.areas.collected_total,
            stats.areas.items_reclaimed_total,
            stats.areas.items_promoted_total,
        ) == (1, 0, 2, 1, 1, 0)
        manager.remove_context("c")
        kept = manager.statistics()
        assert (kept.areas.collected_total, kept.areas.items_reclaimed_total) == (1, 1)


async def test_a_subtask_runs_over_several_prepares_then_leaves_its_summary() -> None:
    """Routed outputs stay in the area section until the sub-task's tail is reclaimed."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "Can I change my flight?"))
        subtask = SubtaskArea(
            "Look up the fare rules first.",
            done=lambda area: len(area.routed) >= 2,
            summary="Fare rules: changes are free within 24 hours.",
        )
        manager.areas.attach("c", subtask)
        instruction = {"role": "user", "content": "Look up the fare rules first."}

        p1 = await manager.prepare(request("t1"))
        assert list(p1.items) == [
            {"role": "user", "content": "Can I change my flight?"},
            instruction,
        ]

        step = assistant("Checking the fare class.")
        subtask.route(step)
        for item in native(manager, step):
            manager.areas.route("c", item)
        p2 = await manager.prepare(request("t1"))
        assert list(p2.items[1:]) == [
            instruction,
            {"role": "assistant", "content": "Checking the fare class."},
        ]
        assert not subtask.collected

        lookup, found = call("k1", "fare_rules"), result("k1", "free within 24h")
        subtask.route(lookup)
        for item in native(manager, lookup) + native(manager, found):
            manager.areas.route("c", item)
        p3 = await manager.prepare(request("t1"))  # done holds: it retires in observe()
        assert p3.area_items == 4
        assert p3.items[3]["tool_calls"][0]["id"] == "k1"
        assert p3.items[4] == {"role": "tool", "tool_call_id": "k1", "content": "free within 24h"}
        assert manager.statistics().areas.collected_total == 0

        p4 = await manager.prepare(request("t1"))  # the next safe point reclaims its tail
        assert list(p4.items) == [
            {"role": "user", "content": "Can I change my flight?"},
            {"role": "user", "content": "Fare rules: changes are free within 24 hours."},
        ]
        assert subtask.collected
        stats = manager.statistics()
        assert (
            stats.areas.renders_total,
            stats.areas.collected_total,
            stats.areas.items_reclaimed_total,
            stats.areas.items_promoted_total,
            stats.areas.attached,
        ) == (4, 1, 4, 1, 0)
        assert CHAT.validate(list(p3.items)) == []


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_the_combined_input_passes_every_gateways_rules(kind: GatewayType) -> None:
    """History + turn input + area section (with routed calls) + state pair: valid bodies."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        gateway = get_gateway(kind)
        manager.accept_turn(snapshot("t1", "hello", instructions=(SYSTEM,)))
        manager.record("c", "t1", [call("h1", "lookup"), result("h1", "found"), assistant("Done.")])
        manager.accept_turn(snapshot("t2", "and now?"))
        manager.areas.attach("c", PinnedNotice("The customer is a gold member."))
        manager.areas.attach("c", OneShotNotice("Mention the new baggage policy."))
        subtask = SubtaskArea("Check the booking.", done=lambda a: False, summary="checked")
        manager.areas.attach("c", subtask)
        contributions = (ContextContribution(name="memory", content="likes tea"),)
        first = await manager.prepare(request("t2", contributions=contributions))
        body = gateway.request_body(first.items)
        assert gateway.validate(body[gateway.items_field]) == []
        routed = [
            item
            for message in (assistant("Looking."), call("k1", "booking"), result("k1", "AB12"))
            for item in gateway.render(message)
        ]
        for item in routed:
            manager.areas.route("c", item)
        second = await manager.prepare(request("t2", contributions=contributions))
        assert second.area_pass == "rendered"
        assert second.area_items == first.area_items + len(routed) == 6
        start = second.area_start
        assert list(second.items[start + first.area_items : start + second.area_items]) == routed
        outputs = [call("k2", "lookup"), result("k2", "ok"), assistant("Here it is.")]
        for step in range(len(outputs) + 1):
            items = manager.build(second, outputs[:step])
            body = gateway.request_body(items)
            assert gateway.validate(body[gateway.items_field]) == [], (kind, step)


async def test_no_collection_while_a_model_call_is_in_flight() -> None:
    """A prepare during an invocation reuses the previous area section as it is."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        manager.areas.attach("c", OneShotNotice("first notice"))
        first = await manager.prepare(request("t1"))
        assert first.items[1:] == ({"role": "user", "content": "first notice"},)
        async with manager.invocation("c", "t1") as invocation:
            manager.areas.attach("c", OneShotNotice("second notice"))
            manager.areas.route("c", {"role": "assistant", "content": "routed meanwhile"})
            during = await manager.prepare(request("t1"))
            invocation.record([assistant("hello")])
        assert during.items == first.items
        assert during.area_pass == "reused_invocation"
        stats = manager.statistics()
        assert (stats.areas.renders_total, stats.areas.passes_reused_total) == (1, 1)
        assert stats.areas.collected_total == 0
        after = await manager.prepare(request("t1"))
        assert after.area_pass == "rendered"
        # The routed item landed after the first notice, so the Collector
        # reclaimed it with the notice's tail (seed 000: outputs after a
        # collected range are detached too); the second notice renders next.
        assert list(after.items[1:]) == [{"role": "user", "content": "second notice"}]
        stats = manager.statistics()
        assert (stats.areas.collected_total, stats.areas.items_reclaimed_total) == (1, 2)


@pytest.mark.parametrize("kind", [GatewayType.openai_chat, GatewayType.anthropic])
async def test_an_area_that_raises_fails_the_prepare_and_changes_nothing(kind: GatewayType) -> None:
    """AreaCallbackError: slot freed, history and area section as before, routed items kept."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        manager.record("c", "t1", [assistant("hello")])
        before = history_of(manager)
        flaky = FlakyArea()
        routed = native(manager, assistant("routed before the failure"))
        for item in routed:
            manager.areas.route("c", item)
        manager.areas.attach("c", flaky)
        with pytest.raises(AreaCallbackError) as caught:
            await manager.prepare(request("t1"))
        assert (caught.value.area, caught.value.phase) == (flaky, "render")
        assert isinstance(caught.value.__cause__, ValueError)
        stats = manager.statistics()
        assert (
            stats.preparations.pending,
            stats.preparations.failed_total,
            stats.preparations.prepared_total,
        ) == (0, 1, 0)
        assert (stats.areas.renders_total, stats.areas.attached) == (0, 1)
        assert history_of(manager) == before
        flaky.broken = False
        again = await manager.prepare(request("t1"))
        assert list(again.items[1:]) == [*routed, *native(manager, user("recalled: window seat"))]
        assert manager.statistics().areas.renders_total == 1


async def test_a_routed_call_without_its_result_fails_the_prepare_until_it_is_routed() -> None:
    """OpenToolCallError names the call; routing the result makes the next prepare pass."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        (call_item,) = native(manager, call("k9", "search"))
        manager.areas.route("c", call_item)
        with pytest.raises(OpenToolCallError) as caught:
            await manager.prepare(request("t1"))
        assert caught.value.call_ids == ("k9",)
        assert "'c'" in str(caught.value)
        assert manager.statistics().preparations.pending == 0
        with pytest.raises(InvalidMessageError):
            manager.areas.route("c", {"role": "assistant", "content": "jumped the queue"})
        manager.areas.route("c", {"role": "tool", "tool_call_id": "k9", "content": "3 hits"})
        ok = await manager.prepare(request("t1"))
        assert list(ok.items[1:]) == [
            call_item,
            {"role": "tool", "tool_call_id": "k9", "content": "3 hits"},
        ]
        assert CHAT.validate(list(ok.items)) == []


async def test_attach_area_and_route_reject_bad_input_before_changing_anything() -> None:
    """Typed errors at the door: unknown context, protocol, duplicate, malformed items."""
    async with Foundation(history_limits=HistoryLimits(max_item_bytes=200)) as foundation:
        manager = foundation.manager
        notice = OneShotNotice("n")
        with pytest.raises(UnknownContextError):
            manager.areas.attach("nope", notice)
        with pytest.raises(UnknownContextError):
            manager.areas.route("nope", {"role": "assistant", "content": "x"})
        manager.accept_turn(snapshot("t1", "hi"))

        class Partial:
            life_state = AreaLifeState.retain
            flow_state = AreaFlowState.yielded

            def render(self) -> list[Message]:
                return []

        with pytest.raises(InvalidAreaError) as missing:
            manager.areas.attach("c", Partial())  # type: ignore[arg-type]
        assert missing.value.missing == ("gc_prologue", "observe", "promote")

        class Unhashable(FlakyArea):
            __hash__ = None  # type: ignore[assignment]

        with pytest.raises(InvalidAreaError):
            manager.areas.attach("c", Unhashable())
        manager.areas.attach("c", notice)
        with pytest.raises(DuplicateAreaError):
            manager.areas.attach("c", notice)
        for bad, error in (
            ("text", InvalidMessageError),
            ({"role": "nobody", "content": "x"}, InvalidMessageError),
            ({"role": "tool", "tool_call_id": "zz", "content": "orphan"}, InvalidMessageError),
            ({"role": "assistant", "content": "x" * 300}, ItemTooLargeError),
            ({"role": "assistant", "content": "\ud800"}, InvalidTextError),
            ({"role": "assistant", "content": object()}, InvalidMessageError),
        ):
            with pytest.raises(error):
                manager.areas.route("c", bad)  # type: ignore[arg-type]
        stats = manager.statistics()
        assert (stats.areas.registered_total, stats.areas.attached) == (1, 1)
        prepared = await manager.prepare(request("t1"))
        assert list(prepared.items) == [
            {"role": "user", "content": "hi"},
            {"role": "user", "content": "n"},
        ]


async def test_cancelling_a_prepare_during_the_area_pass_keeps_slots_history_and_notice() -> None:
    """The worker finishes, the result is discarded, and the rendered notice is not lost."""
    async with Foundation(max_pending_preparations=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        manager.record("c", "t1", [assistant("hello")])
        before = history_of(manager)
        held = HeldArea(hold=True)
        manager.areas.attach("c", held)
        with anyio.CancelScope() as scope:
            async with anyio.create_task_group() as tg:

                async def cancel_when_rendering() -> None:
                    await anyio.to_thread.run_sync(held.entered.wait, 10)
                    scope.cancel()

                tg.start_soon(cancel_when_rendering)
                await manager.prepare(request("t1"))
        assert scope.cancelled_caught
        assert manager.statistics().preparations.pending == 1  # owned until the thread finishes
        held.release.set()
        await _wait_until(lambda: manager.statistics().preparations.pending == 0)
        stats = manager.statistics()
        assert (
            stats.preparations.discarded_total,
            stats.preparations.prepared_total,
            stats.areas.renders_total,
        ) == (1, 0, 1)
        assert history_of(manager) == before
        reused = await manager.prepare(request("t1"))
        assert reused.area_pass == "reused_undelivered"
        assert reused.items[1:] == ({"role": "user", "content": "held notice"},)
        collected = await manager.prepare(request("t1"))
        assert (collected.area_pass, collected.area_items) == ("rendered", 0)
        stats = manager.statistics()
        assert (stats.areas.passes_reused_total, stats.areas.items_reclaimed_total) == (1, 1)
        assert held.renders == 1


async def test_two_prepares_of_one_context_never_render_its_areas_at_once() -> None:
    """The per-context lock: one thread at a time uses a CoopContext."""
    async with Foundation(worker_threads=2) as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        held = HeldArea(hold=False, retire=False)
        manager.areas.attach("c", held)
        got: list[tuple[NativeContent, ...]] = []

        async def one() -> None:
            got.append((await manager.prepare(request("t1"))).items)

        async with anyio.create_task_group() as tg:
            tg.start_soon(one)
            tg.start_soon(one)
        assert held.overlap == 1
        assert (
            got
            == [({"role": "user", "content": "hi"}, {"role": "user", "content": "held notice"})] * 2
        )


async def test_an_area_that_turns_invalid_before_its_first_pass_is_dropped() -> None:
    """Checked at areas.attach; if its state members break later, the pass drops it."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        fickle = FlakyArea()
        fickle.broken = False
        manager.areas.attach("c", fickle)
        fickle._life = "gone"  # type: ignore[assignment]
        with pytest.raises(AreaCallbackError) as caught:
            await manager.prepare(request("t1"))
        assert (caught.value.area, caught.value.phase) == (fickle, "register")
        assert isinstance(caught.value.__cause__, InvalidAreaError)
        stats = manager.statistics()
        assert (stats.areas.attached, stats.areas.registered_total, stats.preparations.pending) == (
            0,
            1,
            0,
        )
        prepared = await manager.prepare(request("t1"))
        assert (prepared.items, prepared.area_pass) == (
            ({"role": "user", "content": "hi"},),
            "rendered",
        )
        fickle._life = AreaLifeState.retain
        manager.areas.attach("c", fickle)  # no longer attached, so it may come back
        again = await manager.prepare(request("t1"))
        assert again.items[1:] == ({"role": "user", "content": "recalled: window seat"},)
