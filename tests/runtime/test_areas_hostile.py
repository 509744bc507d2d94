"""Hostile hosts against Context Areas in the runtime (area sections, the Collector, host
callbacks). The first two failed before their fixes (their comments say what happened);
every test runs on asyncio and on trio."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import anyio
import pytest

from tests.runtime.helpers import CHAT, assistant, call, result, user
from tests.runtime.stress import cold_render
from tests.runtime.test_areas import FlakyArea, HeldArea
from turnloom.areas import OneShotNotice, SubtaskArea
from turnloom.context import Message, NativeContent
from turnloom.context.area import AreaFlowState, AreaLifeState
from turnloom.errors import (
    AreaCallbackError,
    ContextRemovedError,
    HostCallbackError,
)
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio


def snapshot(turn_id: str, text: str, context_id: str = "c") -> TurnSnapshot:
    return TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user(text),))


def request(turn_id: str, context_id: str = "c") -> ContextPrepareRequest:
    return ContextPrepareRequest(context_id=context_id, turn_id=turn_id)


def call_ids(items: Sequence[NativeContent]) -> list[tuple[str, str]]:
    out: list[tuple[str, str]] = []
    for item in items:
        for tool_call in item.get("tool_calls") or ():
            out.append(("call", tool_call["id"]))
        if item.get("role") == "tool":
            out.append(("result", item["tool_call_id"]))
    return out


class PickyCounter:
    """A host token counter that fails on one word while ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False

    def count(self, messages: Sequence[Message]) -> int:
        if self.fail and any("boom" in str(m.content) for m in messages):
            raise RuntimeError("tokenizer unavailable")
        return len(messages)


async def _wait_until(predicate: Any) -> None:
    with anyio.fail_after(10):
        while not predicate():
            await anyio.sleep(0.005)


# -- findings -----------------------------------------------------------------


async def test_a_host_callback_failing_after_the_area_pass_does_not_leak_collected_areas() -> None:
    """Invariant: an area the Collector removed is no longer attached, whatever fails later.

    The second prepare's area pass collects the first (retired) notice and
    renders a second one; then the host's token counter raises on the area
    section (HostCallbackError). The pass stays run (the next prepare reuses
    its section as undelivered), so the first notice is gone from the
    CoopContext. It must be forgotten too: ``attached`` counts only the
    areas still attached, the collection is counted, and the host may
    attach the collected instance again.
    """
    counter = PickyCounter()
    async with Foundation(token_counter=counter) as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        first = OneShotNotice("first")
        manager.areas.attach("c", first)
        p1 = await manager.prepare(request("t1"))
        assert p1.items[1:] == ({"role": "user", "content": "first"},)
        counter.fail = True
        manager.areas.attach("c", OneShotNotice("boom"))
        with pytest.raises(HostCallbackError):
            await manager.prepare(request("t1"))  # the pass collected `first`
        counter.fail = False
        p3 = await manager.prepare(request("t1"))
        assert (p3.area_pass, p3.items[1:]) == (
            "reused_undelivered",
            ({"role": "user", "content": "boom"},),
        )
        p4 = await manager.prepare(request("t1"))  # collects "boom"
        assert (p4.area_pass, p4.items[1:]) == ("rendered", ())
        stats = manager.statistics().areas
        # It was attached 1, collected 1, reclaimed 1: the collection of `first` in the
        # pass whose render then failed was never counted, and `first` stayed attached.
        assert (stats.attached, stats.collected_total, stats.items_reclaimed_total) == (0, 2, 2)
        # It raised DuplicateAreaError "already attached" for the collected area.
        manager.areas.attach("c", first)


async def test_removing_a_context_during_its_area_pass_keeps_the_attached_count() -> None:
    """Invariant: ``statistics().areas.attached`` is never negative and counts live areas.

    A context is removed while its area pass (which collects a retired
    notice) runs in the worker. The removal forgets its two attached areas;
    the pass returning afterwards must not forget the collected one again.
    """
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        manager.areas.attach("c", OneShotNotice("first"))
        await manager.prepare(request("t1"))
        held = HeldArea(hold=True)
        manager.areas.attach("c", held)
        outcome: list[str] = []

        async def prepare() -> None:
            try:
                await manager.prepare(request("t1"))
            except ContextRemovedError:
                outcome.append("removed")

        async with anyio.create_task_group() as tg:
            tg.start_soon(prepare)
            await anyio.to_thread.run_sync(held.entered.wait, 10)
            manager.remove_context("c")
            assert manager.statistics().areas.attached == 0
            held.release.set()
        await _wait_until(lambda: manager.statistics().preparations.pending == 0)
        assert outcome == ["removed"]
        # It was -1: the removal subtracted both areas, then the abandoned pass's
        # count detached the collected one again.
        assert manager.statistics().areas.attached == 0
        manager.accept_turn(snapshot("t2", "back"))
        manager.areas.attach("c", OneShotNotice("new"))
        assert manager.statistics().areas.attached == 1


# -- attacks the library held -----------------------------------------------


async def test_attach_and_route_while_a_pass_renders_land_in_the_next_pass_in_order() -> None:
    """Areas and items handed over while the worker renders wait for the next pass, in order."""
    async with Foundation(worker_threads=2) as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        held = HeldArea(hold=True, retire=False)
        manager.areas.attach("c", held)
        got: list[Any] = []

        async def prepare() -> None:
            got.append(await manager.prepare(request("t1")))

        async with anyio.create_task_group() as tg:
            tg.start_soon(prepare)
            await anyio.to_thread.run_sync(held.entered.wait, 10)
            manager.areas.route("c", {"role": "assistant", "content": "routed during"})
            manager.areas.attach("c", OneShotNotice("attached during"))
            held.release.set()
        assert got[0].items[1:] == ({"role": "user", "content": "held notice"},)
        second = await manager.prepare(request("t1"))
        assert list(second.items[1:]) == [
            {"role": "user", "content": "held notice"},
            {"role": "assistant", "content": "routed during"},
            {"role": "user", "content": "attached during"},
        ]
        assert manager.statistics().areas.attached == 2


async def test_a_failing_pass_hands_routed_items_back_ahead_of_later_ones() -> None:
    """Items taken by a pass that fails come back before items routed while it ran."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        flaky = FlakyArea()
        manager.areas.attach("c", flaky)
        manager.areas.route("c", {"role": "assistant", "content": "one"})
        with pytest.raises(AreaCallbackError):
            await manager.prepare(request("t1"))
        manager.areas.route("c", {"role": "assistant", "content": "two"})
        with pytest.raises(AreaCallbackError):
            await manager.prepare(request("t1"))
        flaky.broken = False
        ok = await manager.prepare(request("t1"))
        assert list(ok.items[1:]) == [
            {"role": "assistant", "content": "one"},
            {"role": "assistant", "content": "two"},
            {"role": "user", "content": "recalled: window seat"},
        ]
        stats = manager.statistics()
        assert (stats.areas.renders_total, stats.preparations.failed_total) == (1, 2)


async def test_area_call_ids_that_repeat_history_ids_are_made_unique() -> None:
    """A routed call reusing a history call id: one id per call in the input; history = cold."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        manager.record("c", "t1", [call("k1"), result("k1", "h"), assistant("done")])
        manager.areas.attach("c", SubtaskArea("sub", done=lambda a: False, summary="s"))
        for message in (call("k1"), result("k1", "area")):
            for item in CHAT.render(message):
                manager.areas.route("c", item)
        manager.accept_turn(snapshot("t2", "again"))
        prepared = await manager.prepare(request("t2"))
        assert call_ids(prepared.items) == [
            ("call", "k1"),
            ("result", "k1"),
            ("call", "k1_r2"),
            ("result", "k1_r2"),
        ]
        assert CHAT.validate(list(prepared.items)) == []
        assert cold_render(manager, "c", "t2") == list(prepared.items[: prepared.area_start])
        built = manager.build(prepared, [call("k1"), result("k1", "cont")])
        assert call_ids(built)[-2:] == [("call", "k1_r3"), ("result", "k1_r3")]
        assert CHAT.validate(list(built)) == []


class RaisingLife:
    """An area whose ``life_state`` raises while ``broken`` is set (read at collection)."""

    def __init__(self) -> None:
        self.broken = False
        self.renders = 0

    @property
    def life_state(self) -> AreaLifeState:
        if self.broken:
            raise KeyError("state store gone")
        return AreaLifeState.retain

    flow_state = AreaFlowState.yielded

    def observe(self, context: Sequence[NativeContent]) -> None:
        del context

    def render(self) -> list[Message]:
        self.renders += 1
        return [user(f"render {self.renders}")] if self.renders == 1 else []

    def promote(self) -> tuple[Message, ...]:
        return ()

    def gc_prologue(self) -> None:
        pass


async def test_a_life_state_that_raises_fails_the_prepare_and_keeps_the_section() -> None:
    """AreaCallbackError (phase life_state); the Foundation and the section survive."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snapshot("t1", "hi"))
        area = RaisingLife()
        manager.areas.attach("c", area)
        first = await manager.prepare(request("t1"))
        assert first.items[1:] == ({"role": "user", "content": "render 1"},)
        area.broken = True
        with pytest.raises(AreaCallbackError) as caught:
            await manager.prepare(request("t1"))
        assert (caught.value.area, caught.value.phase) == (area, "life_state")
        area.broken = False
        again = await manager.prepare(request("t1"))
        assert (again.area_pass, again.items) == ("rendered", first.items)
        manager.accept_turn(snapshot("t1", "hi", context_id="other"))
        other = await manager.prepare(request("t1", context_id="other"))
        assert other.items == ({"role": "user", "content": "hi"},)


async def test_two_contexts_areas_never_mix_under_concurrent_prepares() -> None:
    """Each context's input holds only its own area items, prepared concurrently."""
    async with Foundation(worker_threads=4) as foundation:
        manager = foundation.manager
        for name in ("a", "b"):
            manager.accept_turn(snapshot("t1", f"hi {name}", context_id=name))
        got: dict[str, list[tuple[NativeContent, ...]]] = {"a": [], "b": []}

        async def drive(name: str) -> None:
            for i in range(5):
                manager.areas.attach(name, OneShotNotice(f"{name} notice {i}"))
                manager.areas.route(name, {"role": "assistant", "content": f"{name} routed {i}"})
                got[name].append((await manager.prepare(request("t1", context_id=name))).items)

        async with anyio.create_task_group() as tg:
            tg.start_soon(drive, "a")
            tg.start_soon(drive, "b")
        for name in ("a", "b"):
            for i, items in enumerate(got[name]):
                assert items[0] == {"role": "user", "content": f"hi {name}"}
                # Routed 0 lies before every area's range and stays; routed i
                # (i > 0) lands after notice i-1 and is reclaimed with its tail
                # at the same safe point (documented on areas.route).
                assert list(items[1:]) == [
                    {"role": "assistant", "content": f"{name} routed 0"},
                    {"role": "user", "content": f"{name} notice {i}"},
                ]
