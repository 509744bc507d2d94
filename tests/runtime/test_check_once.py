"""Each message is checked, sized and rendered once, at the door; a small prepare renders inline.

Every async test runs on asyncio and on trio (``anyio_backend`` fixture).
"""

from __future__ import annotations

import threading
from typing import Any

import msgspec
import pytest

from tests.runtime.helpers import CHAT, BlockingGateway, assistant, call, result, user
from turnloom.context import Message, NativeContent
from turnloom.context.gateways import OpenAIChatGateway
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.message import admit_message
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime import _continuation as continuation_module
from turnloom.runtime import _preparing as preparing_module
from turnloom.runtime._render import render_preparation

pytestmark = pytest.mark.anyio


class _CountingGateway(OpenAIChatGateway):
    """The OpenAI Chat gateway counting its render calls."""

    def __init__(self) -> None:
        self.renders = 0

    def render(self, message: Message) -> list[NativeContent]:
        self.renders += 1
        return super().render(message)


def test_the_door_render_seeds_the_render_cache() -> None:
    """Invariant: a batch checked with a gateway, then committed and recorded, is never
    rendered again: the history's render uses the door's renders, equal to the gateway's."""
    gateway = _CountingGateway()
    history = TurnHistory()
    first = (user("Where is my bag?"),)
    outputs = (call("c1", "find_bag"), result("c1", "in Paris"), assistant("In Paris."))
    history.check_batch(first, "input", gateway=gateway)
    history.commit("t1", first)
    history.check_batch(outputs, "outputs", turn_id="t1", gateway=gateway)
    history.record("t1", outputs)
    second = (user("Thanks"),)
    history.check_batch(second, "input", gateway=gateway)
    history.commit("t2", second)
    assert gateway.renders == 5
    rendered = history.view().render(gateway, "t2")
    assert gateway.renders == 5  # no message rendered twice
    expected = [item for m in (*first, *outputs, *second) for item in CHAT.render(m)]
    assert list(rendered.items) == expected


async def test_build_checks_recorded_messages_once_and_equals_a_fresh_render(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: build does not check again a continuation message the turn recorded
    (it passed the door), checks one it never saw, and its items equal the prefix plus
    the continuation rendered anew."""
    checked: list[Message] = []

    def counting(message: Any, *, where: str = "message") -> tuple[Message, int]:
        checked.append(message)
        return admit_message(message, where=where)

    monkeypatch.setattr(continuation_module, "admit_message", counting)
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        recorded = [call("c1", "lookup"), result("c1", "found")]
        manager.record("c", "t1", recorded)
        unseen = assistant("not recorded")
        items = manager.build(prefix, [*recorded, unseen])
    assert checked == [unseen]
    fresh = [item for m in (*recorded, unseen) for item in CHAT.render(m)]
    assert list(items) == [*prefix.items, *fresh]


async def test_a_small_prepare_renders_inline_with_the_worker_result(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: a prepare of a committed turn for a built-in gateway renders on the
    event loop's thread, a custom gateway's in a worker thread, and both deliver the
    same items and count one delivered prepare each."""
    threads: list[bool] = []
    real = render_preparation

    def spy(*args: Any) -> Any:
        threads.append(threading.current_thread() is threading.main_thread())
        return real(*args)

    monkeypatch.setattr(preparing_module, "render_preparation", spy)
    prepared = []
    for gateway in (OpenAIChatGateway(), BlockingGateway()):
        async with Foundation(gateway=gateway) as foundation:
            manager = foundation.manager
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
            manager.record("c", "t1", [call("c1"), result("c1")])
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("ok"),)))
            request = ContextPrepareRequest(context_id="c", turn_id="t2", loop_budget=2)
            prepared.append(await manager.prepare_nowait(request))
            stats = manager.statistics().preparations
            assert (stats.prepared_total, stats.pending, stats.failed_total) == (1, 0, 0)
    assert threads == [True, False]
    assert prepared[0].items == prepared[1].items


async def test_a_new_contexts_first_turn_is_checked_and_rendered_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: the first turn of a new context (its instructions and input) is checked
    and rendered once, at the door: the history the door checked it on is the one the
    context is created with, so the prepare renders none of its messages again."""
    from tests.context.history_patch import history_modules

    checked: list[Message] = []

    def counting(message: Any, *, where: str = "message") -> tuple[Message, int]:
        checked.append(message)
        return admit_message(message, where=where)

    for module in history_modules():
        if hasattr(module, "admit_message"):
            monkeypatch.setattr(module, "admit_message", counting)
    gateway = _CountingGateway()
    system = Message(role="system", content="Be brief.")  # type: ignore[arg-type]
    first = user("hi")
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(first,), instructions=(system,))
        )
        assert (checked, gateway.renders) == ([first, system], 2)
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
    assert (checked, gateway.renders) == ([first, system], 2)
    assert list(prefix.items[:2]) == [*CHAT.render(admit_message(system)[0]), *CHAT.render(first)]
    assert type(system.role) is str  # the host's object as it gave it: the history holds its own


async def test_a_prepare_of_a_long_history_renders_inline_when_its_work_is_small(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: whether a prepare renders on the event loop depends on the work of its
    render, not on the size of the history: with more items held than INLINE_MAX_ITEMS,
    the first prepare (the cached run is built, work proportional to the history)
    renders in a worker thread and the next ones (one new turn, one evicted) on the
    loop, each giving the items of a cold render of the same history (for a host that
    takes no copy of its prefixes' items). A declined inline render renders nothing
    and the worker's result is the same."""
    threads: list[tuple[bool, bool]] = []  # (on the loop's thread, rendered)
    real = render_preparation

    def spy(*args: Any) -> Any:
        rendered = real(*args)
        threads.append((threading.current_thread() is threading.main_thread(), bool(rendered)))
        return rendered

    monkeypatch.setattr(preparing_module, "render_preparation", spy)
    monkeypatch.setattr(preparing_module, "INLINE_SHARE", 1.0)  # never throttled here
    size = preparing_module.INLINE_MAX_ITEMS + 100
    limits = HistoryLimits(low_water=1.0, max_items=size, max_turns=size)
    oracle = TurnHistory(limits)
    async with Foundation(gateway=OpenAIChatGateway(), history_limits=limits) as foundation:
        manager = foundation.manager
        for n in range(200):  # 800 items: the history evicts a turn per turn at the end
            if n:
                outputs = [call(f"c{n}"), result(f"c{n}"), assistant(f"a{n}")]
                manager.record("c", f"t{n - 1}", outputs)
                oracle.record(f"t{n - 1}", outputs)
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id=f"t{n}", input=(user("u"),)))
            oracle.commit(f"t{n}", [user("u")])
            oracle.evict()
            if n >= 197:
                request = ContextPrepareRequest(context_id="c", turn_id=f"t{n}")
                prepared = await manager.prepare(request)
                cold = TurnHistory(limits)  # the same history, nothing rendered yet
                for turn_id in oracle.turn_ids:
                    messages = oracle.view().turn_messages(turn_id)
                    cold.commit(turn_id, messages[:1])
                    cold.record(turn_id, messages[1:])
                expected = cold.view().render(CHAT, f"t{n}").items
                assert prepared.item_count == len(expected)
                # The kept items: a host read (.items) would have the next prefix's
                # copy made ahead, O(history), so rendered in a worker (see
                # test_build_handover); this host takes none.
                assert prepared.native_items._shared()[: len(expected)] == expected
    assert oracle.held_items > preparing_module.INLINE_MAX_ITEMS
    # The first prepare tries the loop, whose bounded render declines, then a worker.
    assert threads == [(True, False), (False, True), (True, True), (True, True)]


async def test_a_host_that_reads_items_gets_its_prefixes_decoded_off_the_loop(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: once a context's prefix items were decoded (read by turnloom's
    own readers of the kept tuple, as ``request_bytes`` without a cached body
    does), every later prefix of that context is delivered decoded, by the
    prepare, and a prefix too long for a bounded inline step is never decoded
    on the event loop; a host that only builds and reads ``.items`` (copies
    decoded from the kept bytes) or only sends ``request_bytes`` gets every
    prefix still encoded. Decoded items and builds equal the request body's, also
    after evictions that rename the kept turns anew (call ids reused) and so
    decode from another run."""
    seen: list[tuple[bool, bool, int]] = []  # (on the loop's thread, decoded, items)
    real = render_preparation

    def spy(*args: Any) -> Any:
        rendered = real(*args)
        if rendered is not None:
            prefix = rendered[0]
            on_loop = threading.current_thread() is threading.main_thread()
            seen.append((on_loop, prefix.native_items.decoded, prefix.item_count))
        return rendered

    monkeypatch.setattr(preparing_module, "render_preparation", spy)
    monkeypatch.setattr(preparing_module, "INLINE_SHARE", 1.0)  # never throttled here
    monkeypatch.setattr(preparing_module, "INLINE_MAX_ITEMS", 2)  # decoded inline up to 16
    limits = HistoryLimits(low_water=1.0, max_turns=8)
    delivered: dict[str, list[bool]] = {"reader": [], "builder": [], "writer": []}
    async with Foundation(gateway=OpenAIChatGateway(), history_limits=limits) as foundation:
        manager = foundation.manager
        for n in range(24):
            for context_id, calls in delivered.items():
                turn_id = f"t{n}"
                snapshot = TurnSnapshot(context_id=context_id, turn_id=turn_id, input=(user("u"),))
                manager.accept_turn(snapshot)
                request = ContextPrepareRequest(context_id=context_id, turn_id=turn_id)
                prefix = await manager.prepare(request)
                calls.append(prefix.native_items.decoded)
                body = msgspec.json.decode(manager.request_bytes(prefix))
                if context_id == "reader":
                    assert prefix.native_items._shared() == tuple(body["messages"])
                elif context_id == "builder":
                    assert manager.build(prefix) == tuple(body["messages"]) == prefix.items
                outputs = [call(f"c{n % 3}"), result(f"c{n % 3}"), assistant(f"a{n}")]
                manager.record(context_id, turn_id, outputs)
    assert delivered["reader"] == [False] + [True] * 23
    assert delivered["writer"] == delivered["builder"] == [False] * 24
    assert not [s for s in seen if s[0] and s[1] and s[2] > 16]
    assert [s for s in seen if not s[0] and s[1]]  # decoded in a worker thread
