"""TurnHistory's cost to Python's cyclic garbage collector.

A full collection visits every tracked object, so a held history must not add
tracked objects per message: its bookkeeping (entries, turns, rendered runs)
and its cached native items are untracked, and untracking changes no value.
"""

from __future__ import annotations

import gc
import sys
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from turnloom.context import GatewayType, Message, NativeContent, get_gateway
from turnloom.context.gateway import Gateway
from turnloom.context.history import HistoryLimits, RenderedHistory, TurnHistory
from turnloom.tools.trajectories import load_trajectories
from turnloom.tools.transcript import Turn, turn_ids, walk

CHAT = get_gateway(GatewayType.openai_chat)
ANTHROPIC = get_gateway(GatewayType.anthropic)

cpython_only = pytest.mark.skipif(
    sys.implementation.name != "cpython", reason="native items are untracked on CPython only"
)


def _history(
    tau_bench_path: Path,
    count: int,
    *,
    max_turns: int = 10_000,
    on_commit: Callable[[TurnHistory, str], None] | None = None,
) -> TurnHistory:
    """The first ``count`` tau-bench trajectories as one history's turns;
    ``on_commit(history, turn_id)`` runs after each commit."""
    trajectories, errors = load_trajectories(tau_bench_path)
    assert errors == []
    history = TurnHistory(HistoryLimits(max_turns=max_turns, max_items=100_000, max_bytes=1 << 30))
    ids = turn_ids()
    for trajectory in trajectories[:count]:
        messages = [CHAT.parse(native) for native in trajectory.messages]
        for step in walk(messages, ids=ids):
            if isinstance(step, Turn):
                history.commit(step.turn_id, [step.input], instructions=step.instructions)
                if on_commit is not None:
                    on_commit(history, step.turn_id)
            else:
                history.record(step.turn_id, [step.message])
    return history


def _containers(value: Any) -> list[Any]:
    """Every dict, list and tuple in a JSON-like value, the value included."""
    found: list[Any] = []
    stack = [value]
    while stack:
        node = stack.pop()
        if type(node) in (dict, list, tuple):
            found.append(node)
            stack.extend(node.values() if type(node) is dict else node)
    return found


def _bookkeeping(history: TurnHistory) -> list[Any]:
    """The history's per-message and per-turn objects, and the caches they hold."""
    objects: list[Any] = list(history._pinned)
    for turn in history._turns:
        cells = turn.cells
        # A closed turn's cells are one tuple (its messages, tokens and sent ids).
        objects.extend((turn, cells) if turn.closed else (turn, cells, *cells))
        if turn.renders is not None:  # its whole and input renders, by render key slot
            objects.append(turn.renders)
            for rendered in turn.renders.values():
                objects.extend((rendered, rendered.items, rendered.encoded))
    for run in history._shared.runs.values():  # its chunk list is one object per run
        objects.extend((run.pinned, run.pinned.items, run.pinned.encoded, *run.chunks))
    return objects


def _render_all(history: TurnHistory, gateway: Gateway, open_calls: str = "exclude") -> list[Any]:
    """Render every turn of the history (as successive prepares do); return the renders."""
    view = history.view()
    return [
        view.render(gateway, turn_id, open_calls=open_calls)  # type: ignore[arg-type]
        for turn_id in view.turn_ids
    ]


@cpython_only
def test_history_bookkeeping_and_cached_items_are_not_tracked(tau_bench_path: Path) -> None:
    """Invariant: no entry, turn, rendered run, cached native item (nor any dict or
    list inside it) of a rendered history is tracked by the cyclic GC."""
    history = _history(tau_bench_path, 5)
    renders = _render_all(history, CHAT)
    gc.collect()  # tuples and dicts holding only untracked objects are untracked here
    objects = _bookkeeping(history)
    stats = history.statistics()
    entries = [o for o in objects if type(o).__name__ == "_Entry"]
    # Every message was rendered but the last turn's outputs (its continuation);
    # the closed turns joined the run, which holds their items encoded, so they keep
    # no entry (their compact form holds no render), and only the pinned
    # instructions and the last turn's input keep native items.
    last = history._turns[-1]
    assert [t.closed for t in history._turns] == [True] * (stats.turns - 1) + [False]
    assert len(entries) == stats.pinned_items + last.items
    assert [e for e in entries if e.native is not None] == [*history._pinned, *last.input]
    assert all(e.native is None and e.encoded is None for e in last.outputs)
    assert [type(o).__name__ for o in objects if gc.is_tracked(o)] == []
    items = renders[-1].native_items._shared()  # the kept items (``items`` are copies)
    assert len(items) == sum(len(CHAT.render(m)) for m in _complete(history))
    tracked = [c for item in items for c in _containers(item) if gc.is_tracked(c)]
    assert tracked == []
    # Some items are nested containers (assistant tool calls): the check is not vacuous.
    assert sum(1 for item in items if "tool_calls" in item) > 10


def _complete(history: TurnHistory) -> list[Message]:
    """The messages the last turn's render holds: pinned, whole turns, last input."""
    view = history.view()
    ids = view.turn_ids
    messages = list(view.pinned)
    for turn_id in ids[:-1]:
        messages.extend(view.turn_messages(turn_id))
    messages.extend(view.turn_input(ids[-1]))
    return messages


@cpython_only
def test_held_history_adds_no_tracked_objects_per_message(tau_bench_path: Path) -> None:
    """Invariant: a rendered history holds exactly as many tracked objects with 50
    trajectories as with 5 (only the few per-history objects are tracked)."""
    counts = []
    for count in (5, 50):
        history = _history(tau_bench_path, count)
        _render_all(history, CHAT)
        gc.collect()
        reached = _tracked_reachable(history)
        counts.append(reached)
        del history
    assert counts[0] == counts[1]


def _tracked_reachable(root: object, *others: object) -> int:
    """How many tracked objects are reachable from ``root`` through tracked objects,
    counting what untracked bookkeeping refers to (walked through ``_bookkeeping``)."""
    return _visited(root, *others)[0]


def _visited(root: object, *others: object) -> tuple[int, int]:
    """The tracked objects reachable from ``root`` (and ``others``) through tracked
    objects, and how many references they hold (what a full collection visits)."""
    assert isinstance(root, TurnHistory)
    seen: set[int] = set()
    stack: list[Any] = [root, *others, *_bookkeeping(root)]
    for turn in root._turns:
        for entry in () if turn.closed else turn.cells:
            stack.extend((entry.native, entry.encoded))
    tracked = references = 0
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        if gc.is_tracked(node):
            tracked += 1
            referents = gc.get_referents(node)
            references += len(referents)
            # Do not follow the shared gateway singletons and classes.
            stack.extend(r for r in referents if not isinstance(r, type | Gateway | str))
    return tracked, references


@cpython_only
@pytest.mark.parametrize("max_turns", [10_000, 3])
def test_a_full_collection_visits_no_reference_per_message(
    tau_bench_path: Path, max_turns: int
) -> None:
    """Invariant: the tracked objects a rendered history and its newest render hold
    (the run's item list, the render's item tuple, call-id sets, the encoded body)
    hold as many references with 50 trajectories as with 5, kept whole or evicting
    (kept turns renamed anew), so a full collection's pause does not grow with them."""
    visited = []
    renders: list[RenderedHistory] = []  # the newest turn's render

    def evict_and_render(history: TurnHistory, turn_id: str) -> None:
        history.evict()
        renders[:] = [history.view().render(CHAT, turn_id)]

    for count in (5, 50):
        history = _history(tau_bench_path, count, max_turns=max_turns, on_commit=evict_and_render)
        (rendered,) = renders
        renders.clear()
        assert rendered.body is not None
        history.view()  # the history caches its view either way
        gc.collect()
        visited.append(_visited(history, rendered))
        del history, rendered
    assert visited[0] == visited[1]


def test_cached_renders_equal_fresh_renders_for_every_gateway_and_policy(
    tau_bench_path: Path,
) -> None:
    """Invariant: a history rendered for several gateways and open-call policies
    (cache slot 0 and the other slots) gives, for each, exactly the items a
    history rendered only for that gateway and policy gives."""
    mixed = _history(tau_bench_path, 3)
    keys = [(CHAT, "exclude"), (ANTHROPIC, "exclude"), (CHAT, "cancel"), (ANTHROPIC, "cancel")]
    for _ in range(2):  # the second round is served from the caches
        for gateway, policy in keys:
            fresh = _history(tau_bench_path, 3)
            expected = [r.items for r in _render_all(fresh, gateway, policy)]
            got = _render_all(mixed, gateway, policy)
            assert [r.items for r in got] == expected
            assert [r.bytes for r in got] == [r.bytes for r in _render_all(fresh, gateway, policy)]
            assert all(type(item) is dict for r in got for item in r.items)
    assert mixed._shared.gateway_slots == {CHAT: 0, ANTHROPIC: 1}
    if sys.implementation.name == "cpython":
        gc.collect()
        # Every turn but the last joined both runs: closed, no render left.
        assert [t.closed for t in mixed._turns] == [True] * (len(mixed._turns) - 1) + [False]
        live = [t for t in mixed._turns if not t.closed]
        others = [t.renders for t in live] + [e.more for t in live for e in t.entries(True)]
        assert [o for o in others if o is not None and gc.is_tracked(o)] == []
        # Filled: all but the last turn's outputs' renders (its input's are cached
        # with its head render, in ``more`` beside the other turns' whole renders).
        unfilled = len(mixed._turns[-1].outputs)
        assert sum(1 for o in others if o is None) == unfilled


class _SelfReferringGateway:
    """The OpenAI Chat gateway, holding a reference to the history it renders."""

    def __init__(self) -> None:
        self.history: TurnHistory | None = None

    @property
    def type(self) -> GatewayType:
        return GatewayType.openai_chat

    def render(self, message: Message) -> list[NativeContent]:
        return CHAT.render(message)

    def parse(self, item: NativeContent) -> Message:
        return CHAT.parse(item)

    def parse_request(self, body: dict[str, Any]) -> list[Message]:
        return CHAT.parse_request(body)


def test_cycle_through_a_gateway_is_still_collected(tau_bench_path: Path) -> None:
    """Invariant: untracked bookkeeping never refers to a gateway, so a cycle
    history -> caches -> gateway -> history is found and freed by the collector."""
    history = _history(tau_bench_path, 2)
    gateway = _SelfReferringGateway()
    gateway.history = history
    _render_all(history, gateway)  # type: ignore[arg-type]
    probe = weakref.ref(gateway)
    del gateway, history
    gc.collect()
    assert probe() is None


@cpython_only
def test_untracked_item_dict_is_tracked_again_when_a_container_is_stored(
    tau_bench_path: Path,
) -> None:
    """Invariant (CPython, relied on by the render cache): a cached item dict that
    someone stores a container into becomes tracked again."""
    history = _history(tau_bench_path, 1)
    kept = _render_all(history, CHAT)[-1].native_items._shared()
    item = next(i for i in kept if "tool_calls" in i)
    assert (gc.is_tracked(item), gc.is_tracked(item["tool_calls"])) == (False, False)
    item["extra"] = [1]
    assert (gc.is_tracked(item), gc.is_tracked(item["tool_calls"])) == (True, False)
