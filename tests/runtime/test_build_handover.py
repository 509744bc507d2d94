"""``build`` and ``PreparedContext.items`` hand over a host copy made in the worker.

Design rule: nothing proportional to the history runs on the event loop. A
copy of a prefix's items is O(history), so the render worker makes it ahead
(once the host took copies of the context's previous prefix) and the first
``build`` / ``.items`` read takes it in O(1); ``build`` then asks the worker
for the next one. The copy handed over is still shared with nothing
turnloom keeps and with no other read.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import anyio
import pytest

import turnloom.context._fresh as fresh_module
import turnloom.context.items as items_module
import turnloom.runtime._preparing as preparing_module
from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.context import GatewayType, Message, NativeContent
from turnloom.context.items import COPY_AHEAD_ITEMS, TAKEN_BUILD, TAKEN_ITEMS, NativeItems
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime.manager import ContextManager

pytestmark = pytest.mark.anyio

_HISTORY = 1000  # input messages of the first turn: one item each on every gateway
# Containers of an assistant text reply's one native item, per gateway.
_REPLY_CONTAINERS = {
    GatewayType.openai_chat: 1,
    GatewayType.openai_responses: 1,
    GatewayType.anthropic: 3,
    GatewayType.gemini: 3,
}


async def _turn(manager: ContextManager, number: int, size: int = 1) -> PreparedContext:
    """Commit and prepare turn ``t<number>`` of context ``c`` with ``size`` user messages."""
    turn_id = f"t{number}"
    manager.accept_turn(
        TurnSnapshot(
            context_id="c",
            turn_id=turn_id,
            instructions=(SYSTEM,) if number == 1 else None,
            input=tuple(user(f"Question {number}.{i}.") for i in range(size)),
        )
    )
    return await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=turn_id))


def _outputs(number: int) -> list[Message]:
    return [call(f"call_{number}"), result(f"call_{number}", f"found {number}")]


@contextmanager
def _loop_calls() -> Iterator[dict[str, int]]:
    """Count, on this thread only, container copies (``_fresh._copy``) and JSON decodes
    (of single items or runs kept, ``_decode``, and of host copies, ``_decode_tuple``).

    The worker thread copies and decodes meanwhile: its calls are not counted.
    """
    counts = {"copy": 0, "decode": 0}
    here = threading.get_ident()
    copy, decode, decode_tuple = (
        fresh_module._copy,
        items_module._decode,
        items_module._decode_tuple,
    )

    def counted(name: str, function: Callable[[Any], Any]) -> Callable[[Any], Any]:
        def wrapper(value: Any) -> Any:
            if threading.get_ident() == here:
                counts[name] += 1
            return function(value)

        return wrapper

    fresh_module._copy = counted("copy", copy)  # type: ignore[assignment]
    items_module._decode = counted("decode", decode)
    items_module._decode_tuple = counted("decode", decode_tuple)
    try:
        yield counts
    finally:
        fresh_module._copy = copy  # type: ignore[assignment]
        items_module._decode = decode
        items_module._decode_tuple = decode_tuple


async def _copies_ready(items: NativeItems, count: int) -> None:
    """Wait (bounded) until the worker made ``count`` copies of ``items`` ahead."""
    with anyio.fail_after(10):
        while items.copies_ready < count:
            await anyio.sleep(0.001)


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_build_copies_no_history_item_on_the_loop(
    kind: GatewayType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: with the host building on its prefixes, ``build`` of a
    1,005-item prefix and a one-message continuation copies exactly the
    containers of the continuation's one item on the event loop and decodes nothing: the
    prefix's copy was made in the worker. O(1) in the history."""
    monkeypatch.setattr(
        preparing_module, "INLINE_SHARE", 1.0
    )  # the loop may render: never throttled
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        first = await _turn(manager, 1, _HISTORY)
        manager.build(first, [assistant("Answer 1.")])  # the host builds: copies are made ahead
        manager.record("c", "t1", [assistant("Answer 1.")])
        # The history's run is built here (work proportional to it: in the worker) ...
        manager.build(await _turn(manager, 2), [assistant("Answer 2.")])
        manager.record("c", "t2", [assistant("Answer 2.")])
        with _loop_calls() as counts:
            # ... so this render's own work is small (the loop could do it), but not
            # the copy made ahead: the prepare runs in the worker.
            second = await _turn(manager, 3)
        assert counts == {"copy": 0, "decode": 0}
        assert (second.item_count, second.native_items.copies_ready) == (_HISTORY + 5, 1)
        with _loop_calls() as counts:
            built = manager.build(second, [assistant("Answer 3.")])
        # The continuation's one item: a dict, or a dict holding a list of one dict.
        assert counts == {"copy": _REPLY_CONTAINERS[kind], "decode": 0}
        assert len(built) == _HISTORY + 6
        assert built == (*second.items, *manager.gateway.render(assistant("Answer 3.")))


@pytest.mark.parametrize("size", [COPY_AHEAD_ITEMS - 3, COPY_AHEAD_ITEMS - 2])
async def test_a_prefix_shorter_than_the_copy_ahead_floor_is_copied_where_read(size: int) -> None:
    """Invariant: copies are made ahead only for a prefix of at least
    ``COPY_AHEAD_ITEMS`` items. Turn 2's prefix holds ``size + 2`` items (the
    system, turn 1's input and outputs, turn 2's input): one short of the
    floor gets no copy ahead and its build copies it on the loop (bounded by
    the floor): its closed turns in one decode of their kept bytes, container
    by container only the items outside them (the system item and turn 2's
    input); at the floor it gets one and its build copies only the
    continuation's item."""
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        first = await _turn(manager, 1, size - 2)
        manager.build(first, _outputs(1))  # the host builds: copies are wanted
        manager.record("c", "t1", _outputs(1))
        second = await _turn(manager, 2)
        assert second.item_count == size + 2
        ahead = 1 if second.item_count >= COPY_AHEAD_ITEMS else 0
        if ahead:
            await _copies_ready(second.native_items, 1)
        await anyio.sleep(0.05)  # a copy the worker would make after all has time to appear
        assert second.native_items.copies_ready == ahead
        with _loop_calls() as counts:
            built = manager.build(second, [assistant("Answer 2.")])
        # The continuation's one item, and without a copy ahead the whole prefix:
        # the system item and turn 2's input copied, the rest decoded at once.
        assert counts == {"copy": 1 + (0 if ahead else 2), "decode": 0 if ahead else 1}
        assert built == (
            *second.native_items._shared(),
            {"role": "assistant", "content": "Answer 2."},
        )
        assert _shared(built, second.native_items._shared()) == 0


async def test_a_build_without_a_copy_ready_copies_the_history_on_its_thread() -> None:
    """The fallback, counted as the test above counts: the context's first
    prefix (the host had taken no copy before) is copied at its first build,
    one container per item (user items hold no other container)."""
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        first = await _turn(manager, 1, _HISTORY)
        assert first.native_items.copies_ready == 0
        with _loop_calls() as counts:
            manager.build(first, [assistant("Answer 1.")])
        assert counts == {"copy": _HISTORY + 2, "decode": 0}


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_editing_a_handed_over_copy_changes_no_later_read(kind: GatewayType) -> None:
    """Invariant: the copies handed over (``.items`` then ``build``, each made
    ahead in the worker) and the one the worker makes after a build share no
    container with each other or with what turnloom keeps: editing the first
    ``.items`` read and the first build leaves the second read, the second
    build and the next prepare equal to those of a manager that saw no edit."""
    async with (
        Foundation(gateway=kind) as edited_foundation,
        Foundation(gateway=kind) as twin_foundation,
    ):
        edited, twin = edited_foundation.manager, twin_foundation.manager
        for manager in (edited, twin):
            first = await _turn(manager, 1, COPY_AHEAD_ITEMS)
            first.items  # noqa: B018  (the host reads items and builds: two copies ahead)
            manager.build(first, _outputs(1))
            manager.record("c", "t1", _outputs(1))
        prefix, twin_prefix = await _turn(edited, 2), await _turn(twin, 2)
        native = prefix.native_items
        assert (native.copies_ready, native.taken) == (2, 0)
        items = prefix.items  # handed over
        assert native.copies_ready == 1
        _vandalize(items)
        (made_ahead,) = native._copies or ()
        first_build = edited.build(prefix, _outputs(2))  # handed over; asks for the next one
        assert native.taken == TAKEN_ITEMS | TAKEN_BUILD
        assert all(a is b for a, b in zip(made_ahead, first_build, strict=False))
        assert len(first_build) == len(made_ahead) + len(_outputs(2))
        # The worker may have made the next one already: the loop's thread can
        # lose the GIL to it between the build and this line.
        assert native.copies_ready in (0, 1)
        _vandalize(first_build)
        await _copies_ready(native, 1)  # the worker made the next build's copy
        second_build = edited.build(prefix, _outputs(2))  # handed over
        expected = twin.build(twin_prefix, _outputs(2))
        assert second_build == expected
        assert prefix.items == twin_prefix.items
        assert _shared(first_build, second_build, items) == 0
        for manager in (edited, twin):
            manager.record("c", "t2", _outputs(2))
        after, twin_after = await _turn(edited, 3), await _turn(twin, 3)
        # The copy the worker made after the second build went with the next delivery.
        assert (native.copies_ready, after.native_items.copies_ready) == (0, 2)
        assert after.items == twin_after.items
        assert edited.request_bytes(after) == twin.request_bytes(twin_after)


def test_each_copy_made_ahead_is_taken_once_and_dropping_them_changes_no_value() -> None:
    """Invariant: ``make_copies(n)`` makes n copies equal to the items, each
    taken once (no two share a container), then ``take_copy`` gives None and
    ``materialize`` copies; ``drop_copies`` forgets the rest."""
    items = NativeItems(({"role": "user", "content": [{"type": "text", "text": "hi"}]},))
    items.make_copies(2)
    items.make_copies(2)  # two are ready: none more
    assert items.copies_ready == 2
    first, second = items.take_copy(TAKEN_BUILD), items.take_copy(TAKEN_BUILD)
    assert first is not None and second is not None
    assert first == second == items._shared()
    assert _shared(first, second, items._shared()) == 0
    assert (items.take_copy(TAKEN_BUILD), items.taken) == (None, TAKEN_BUILD)
    assert items.materialize() == items._shared()
    assert items.taken == TAKEN_BUILD | TAKEN_ITEMS
    items.make_copies(1)
    items.drop_copies()
    assert (items.copies_ready, items.take_copy(TAKEN_ITEMS)) == (0, None)


def _containers(value: Any) -> list[Any]:
    out, stack = [], [value]
    while stack:
        node = stack.pop()
        if type(node) in (dict, list, tuple):
            out.append(node)
            stack.extend(node.values() if type(node) is dict else node)
    return out


def _shared(*reads: Any) -> int:
    """How many containers two of ``reads`` have in common, over every pair."""
    ids = [{id(node) for node in _containers(read)} for read in reads]
    return sum(len(a & b) for i, a in enumerate(ids) for b in ids[i + 1 :])


def _vandalize(items: tuple[NativeContent, ...]) -> None:
    """Change every container of every item: a new key in each dict, an element in each list."""
    stack: list[Any] = list(items)
    while stack:
        node = stack.pop()
        if isinstance(node, dict):
            stack.extend(node.values())
            if "content" in node:
                node["content"] = "edited"
            node["edited"] = True
        elif isinstance(node, list):
            stack.extend(node)
            node.append("edited")


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_two_builds_of_a_short_prefix_share_no_container(kind: GatewayType) -> None:
    """Invariant: two builds of one prefix shorter than ``COPY_AHEAD_ITEMS`` (copied
    where read) with the turn's recorded outputs as continuation (plain steps: their
    cached renders reused, nothing completed again) share no container with each
    other, with the prefix's kept items or with the history's cached renders of those
    outputs; editing the first changes neither the second, nor the next build, nor
    the next prepare (equal to a manager that saw no edit)."""
    async with (
        Foundation(gateway=kind) as edited_foundation,
        Foundation(gateway=kind) as twin_foundation,
    ):
        edited, twin = edited_foundation.manager, twin_foundation.manager
        prefixes = []
        for manager in (edited, twin):
            first = await _turn(manager, 1, 3)
            manager.build(first, _outputs(1))  # the host builds: copies wanted (not this short)
            manager.record("c", "t1", _outputs(1))
            prefix = await _turn(manager, 2)
            outputs = _outputs(2)
            manager.record("c", "t2", outputs)
            prefixes.append((prefix, outputs))
        (prefix, outputs), (twin_prefix, twin_outputs) = prefixes
        assert prefix.native_items.copies_ready == 0
        one = edited.build(prefix, outputs)
        two = edited.build(prefix, outputs)
        history = edited._issued._histories("c")
        assert history is not None
        renders = tuple(history.output_renders("t2", edited.gateway).values())
        assert _shared(one, two) == 0
        for built in (one, two):
            assert _shared(built, prefix.native_items._shared()) == 0
            assert _shared(built, renders) == 0
        _vandalize(one)
        expected = twin.build(twin_prefix, twin_outputs)
        assert two == expected
        assert edited.build(prefix, outputs, recorded=False) == expected
        assert edited.build(prefix, recorded=True) == expected
        for manager in (edited, twin):
            manager.record("c", "t2", [assistant("Answer 2.")])
        after, twin_after = await _turn(edited, 3), await _turn(twin, 3)
        assert after.items == twin_after.items
        assert edited.request_bytes(after) == twin.request_bytes(twin_after)


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_a_copy_the_last_prefix_left_untaken_seeds_the_next_prefixs_copy(
    kind: GatewayType,
) -> None:
    """Invariant: the copy the worker made ahead for a build that never came (the turn
    ended) is not decoded again for the next prefix: its items of the run both prefixes
    hold move into the next prefix's copy (the very containers), and that copy still
    equals the next prefix's items by value and type, shares no container with them or
    with the other copy, and editing it changes no later read (equal to a manager that
    saw no edit)."""
    async with (
        Foundation(gateway=kind) as edited_foundation,
        Foundation(gateway=kind) as twin_foundation,
    ):
        edited, twin = edited_foundation.manager, twin_foundation.manager
        prefixes = []
        for manager in (edited, twin):
            first = await _turn(manager, 1, COPY_AHEAD_ITEMS)
            first.items  # noqa: B018  (the host reads items and builds: two copies ahead)
            manager.build(first, _outputs(1))
            manager.record("c", "t1", _outputs(1))
            manager.record("c", "t1", [assistant("Answer 1.")])
            second = await _turn(manager, 2)
            second.items  # noqa: B018
            manager.build(second, _outputs(2))  # asks the worker for the next build's copy
            prefixes.append(second)
        second = prefixes[0]
        native = second.native_items
        await _copies_ready(native, 1)  # made for a build the turn will not make
        (spare,) = native._copies or ()
        for manager in (edited, twin):
            manager.record("c", "t2", [*_outputs(2), assistant("Answer 2.")])
        third, twin_third = await _turn(edited, 3), await _turn(twin, 3)
        assert native.copies_ready == 0  # taken by the third prefix's render
        kept = third.native_items._shared()
        copies = list(third.native_items._copies or ())
        assert len(copies) == 2
        moved = [sum(any(a is b for b in spare) for a in copy) for copy in copies]
        # The spare's items of the run: all but the system item and turn 2's input,
        # which the second prefix held outside its run (turn 2 was open then).
        assert sorted(moved) == [0, len(spare) - 2]
        for copy in copies:
            assert copy == kept
            assert [type(item) for item in copy] == [type(item) for item in kept]
        assert _shared(*copies, kept) == 0
        items = third.items
        _vandalize(items)
        built = edited.build(third, _outputs(3))
        assert built == twin.build(twin_third, _outputs(3))
        assert third.items == twin_third.items
