"""Memory held by a 100,000-item history, render cache included, against its JSON bytes.

For each gateway: tau-bench airline trajectories (the shared 150, or the 5
shipped with turnloom) are committed and recorded turn by turn into one
:class:`~turnloom.context.TurnHistory` until it holds N items (100,000 by
default, nothing evicted), then its newest turn is rendered as a prepare
does (filling the render cache and the encoded body of the closed turns)
and the body's bytes are produced once. Memory is measured with
tracemalloc: what is allocated and still held after the render, from a
baseline taken with the trajectories already loaded. Printed per gateway:
the history's JSON bytes (``statistics().bytes``), the memory held before
the render (messages and bookkeeping) and after it, and the ratio held /
JSON bytes, with the render cache beside its goal (issue 32: at most 1.4x).

Beside it, the floor: what a bare program holds for the same data the
leanest ways we know, measured with tracemalloc in the same way, as a
ratio to the same JSON bytes:

* render: the rendered items only, one ``bytes`` per turn (each message
  rendered by the gateway and encoded, joined by ``,``), in a list: what
  any render cache that hands out bytes without rendering again holds;
* +objects: render plus the same number of messages parsed from the
  trajectories as the history's are (so they share the loaded
  trajectories' strings, allocated before the baseline, as the history's
  do), held in one list: the messages as Python objects, no bookkeeping;
* +msgpack: render plus each turn's messages as one msgpack ``bytes`` (null
  and false fields left out): nothing shared with the loaded trajectories,
  so its text is counted where +objects' is not.

A history also needs what neither floor holds (tokens, eviction's
bookkeeping, call-id state, the run's index), so a goal below the floor
plus that cannot be met.

Then, per gateway, where the held memory goes (``sys.getsizeof`` summed
over the objects each part holds, each object counted once, in this
order; the rest of what tracemalloc counts is the last part, bookkeeping),
as a ratio to the JSON bytes:

* messages: the committed Message structs, their parts and strings (those
  not already held by the loaded trajectories, which the parsed messages
  share and the baseline excludes);
* closed turns: the run's encoded items (one ``bytes`` per turn, its items
  joined);
* body extra: encoded body chunks that are not the run's turn chunks (the
  turns holding a merged Anthropic message, the pinned instructions' body);
* natives: native items cached for turns not yet closed; ``shared str`` is
  the part of their deep size that is strings the messages hold (not
  counted again);
* call ids: the call-id renaming states (the run's and the body writer's),
  the ids the run's renamed turns had before renaming and the call-id
  events recorded for turns renamed anew after an eviction;
* run index: the run's lists and arrays of references, offsets and counts;
* bookkeeping: the rest of what tracemalloc counts after the render: the
  history's per-message and per-turn records (a closed turn's compact
  record, an open turn's entries), the id maps and allocator rounding.
  (Measured as the committed memory before the render less the messages,
  it counted the entries of turns the render then closes: 0.65x, summing
  the parts past what is held by 0.4x.)

and the cyclic garbage collector's tracked objects (``len(gc.get_objects())``
after a full collection) per history item, committed and with the cache.

Usage: python scripts/bench_memory.py [--items N] [PATH]
"""

from __future__ import annotations

import argparse
import gc
import itertools
import sys
import tracemalloc
from pathlib import Path
from typing import Any

import msgspec

from turnloom.context import GatewayType, get_gateway
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.items import encode_item
from turnloom.tools.trajectories import load_trajectories
from turnloom.tools.transcript import Turn, turn_ids, walk

_SHARED = Path(__file__).resolve().parents[2] / "shared/data/tau-bench/airline-150.json"
_SAMPLE = Path(__file__).resolve().parents[1] / "turnloom/tools/data/tau-bench-airline-5.json"
GOAL = 1.4  # issue 32: memory with the render cache at most 1.4x the history's JSON bytes


def _fill(history: TurnHistory, trajectories: list[list[object]], items: int) -> str:
    """Commit and record trajectories, round-robin, until ``items``; the newest turn id."""
    chat = get_gateway(GatewayType.openai_chat)
    ids = turn_ids()
    newest = ""
    while True:
        for natives in trajectories:
            messages = [chat.parse(native) for native in natives]  # type: ignore[arg-type]
            for step in walk(messages, ids=ids):
                if isinstance(step, Turn):
                    if history.statistics().items >= items:
                        history.commit(step.turn_id, [step.input])
                        return step.turn_id
                    history.commit(
                        step.turn_id,
                        [step.input],
                        instructions=step.instructions if not newest else None,
                    )
                    newest = step.turn_id
                else:
                    history.record(step.turn_id, [step.message])


def _deep(roots: list[Any], seen: set[int]) -> tuple[int, int]:
    """(bytes, of which str) of the objects reachable from ``roots`` not in ``seen``.

    Follows dicts, lists, tuples and msgspec Structs; adds what it counts to
    ``seen``. Strings met that ``seen`` holds already are counted apart, as
    shared, in the second number's complement: the first number excludes them.
    """
    total = strings = 0
    stack = list(roots)
    while stack:
        node = stack.pop()
        if id(node) in seen:
            continue
        seen.add(id(node))
        size = sys.getsizeof(node)
        total += size
        kind = type(node)
        if kind is str:
            strings += size
        elif kind is dict:
            stack.extend(node.keys())
            stack.extend(node.values())
        elif kind in (list, tuple, set, frozenset):
            stack.extend(node)
        elif isinstance(node, msgspec.Struct):
            stack.extend(getattr(node, f) for f in node.__struct_fields__)
    return total, strings


def _shared_strings(roots: list[Any], seen: set[int]) -> int:
    """Bytes of the strings reachable from ``roots`` (dicts, lists) that ``seen`` holds."""
    shared = 0
    stack = list(roots)
    visited: set[int] = set()
    while stack:
        node = stack.pop()
        if id(node) in visited:
            continue
        visited.add(id(node))
        kind = type(node)
        if kind is str and id(node) in seen:
            shared += sys.getsizeof(node)
        elif kind is dict:
            stack.extend(node.keys())
            stack.extend(node.values())
        elif kind in (list, tuple):
            stack.extend(node)
    return shared


def breakdown(history: TurnHistory, trajectories: list[list[object]]) -> dict[str, int]:
    """Where the held memory goes (see the module docstring), in bytes.

    Reads the history's private structures: a measurement, not an API.
    """
    # What the loaded trajectories hold (the messages' text, parsed from them
    # without a copy) was allocated before the baseline: tracemalloc does not
    # count it, so neither does ``messages``.
    seen: set[int] = set()
    _deep(trajectories, seen)
    entries = [*history._pinned, *(e for t in history._turns for e in t.entries(True))]
    messages, _ = _deep([e.message for e in entries], seen)
    [run] = history._shared.runs.values()
    closed, _ = _deep(run.chunks[run.dead :], seen)
    natives_roots: list[Any] = []
    for entry in entries:
        natives_roots.append(entry.native)
        if entry.more:
            natives_roots.extend(pair[0] for pair in entry.more.values())
    for turn in history._turns:
        natives_roots.extend(r.items for r in (turn.renders or {}).values())
    natives_roots.append(run.pinned.items)
    shared = _shared_strings(natives_roots, seen)
    natives, _ = _deep(natives_roots, seen)
    body = run.body
    body_extra = 0
    renamers: list[Any] = [run.call_ids]
    if body is not None:
        held = [
            *body._lead,
            body._head,
            *body._chunks[body._skip :],
            *body._loose,
            *(item for segment in body._open.values() for item in segment.pending),
        ]
        body_extra, _ = _deep(held, seen)  # the very objects it holds (blocks, not slices)
        if body._writer.renamer is not None:
            renamers.append(body._writer.renamer)
    # The ids renamed turns had before, and the call-id events of turns renamed anew.
    call_ids = _deep([run.calls], seen)[0]
    for renamer in renamers:
        for layers in (renamer._seen, renamer._counters):
            call_ids += _deep([layers.top, *layers.frozen], seen)[0]
    index = sum(
        sys.getsizeof(x)
        for x in (
            run.chunks,
            run.offsets,
            run.item_ends,
            run.byte_ends,
            run.turn_tokens,
            run.turn_carried,
        )
    )
    if body is not None:
        index += sum(
            sys.getsizeof(x)
            for x in (
                body._lead,
                body._chunks,
                body._loose,
                body._tags,
                body._reach,
                body._opens,
                body._where,
                body._offsets,
                body._loose_at,
            )
        )
    return {
        "messages": messages,
        "closed turns": closed,
        "body extra": body_extra,
        "natives": natives,
        "shared str": shared,
        "call ids": call_ids,
        "run index": index,
    }


def _lean(value: Any) -> Any:
    """``value`` (JSON-like builtins) without null and false fields, recursively."""
    kind = type(value)
    if kind is dict:
        return {k: _lean(v) for k, v in value.items() if v is not None and v is not False}
    if kind is list:
        return [_lean(v) for v in value]
    return value


def floor(
    kind: GatewayType, history: TurnHistory, trajectories: list[list[object]]
) -> tuple[int, int, int]:
    """Bytes a bare program holds for ``history``: (rendered items, messages, msgpack).

    Each measured with tracemalloc as what stays allocated: one ``bytes``
    per turn (and one for the pinned instructions) in a list, the turn's
    messages rendered by the gateway one by one, each item JSON-encoded,
    joined by ``,``; as many messages as the history holds parsed from
    ``trajectories`` (round-robin, as :func:`_fill` does) in one list; one
    msgpack ``bytes`` per turn of its messages (see :func:`_lean`). Pairing
    and call-id renaming are left out: they change a few bytes, not the
    size of what is held.
    """
    gateway = get_gateway(kind)
    chat = get_gateway(GatewayType.openai_chat)
    view = history.view()
    groups = [view.pinned, *(view.turn_messages(t) for t in view.turn_ids)]
    count = sum(map(len, groups))
    gc.collect()
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    rendered = [
        b",".join([encode_item(i) for m in messages for i in gateway.render(m)])
        for messages in groups
    ]
    after_render = tracemalloc.get_traced_memory()[0]
    natives = itertools.islice(itertools.cycle(itertools.chain(*trajectories)), count)
    messages = [chat.parse(native) for native in natives]  # type: ignore[arg-type]
    after_messages = tracemalloc.get_traced_memory()[0]
    encode = msgspec.msgpack.encode
    blobs = [encode(_lean(msgspec.to_builtins(list(group)))) for group in groups]
    end = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del rendered, messages, blobs
    return after_render - base, after_messages - after_render, end - after_messages


def measure(
    kind: GatewayType, trajectories: list[list[object]], items: int
) -> tuple[int, int, int, dict[str, int], tuple[int, int], tuple[int, int, int]]:
    """JSON bytes, held before and after the render (bytes), the breakdown, tracked
    objects, the floor.

    The tracked objects are those the history adds to the cyclic collector's
    count, committed and with the render cache; the floor is :func:`floor`'s.
    """
    gateway = get_gateway(kind)
    gc.collect()
    objects = len(gc.get_objects())
    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    history = TurnHistory(
        HistoryLimits(max_turns=1_000_000, max_items=10 * items, max_bytes=1 << 40)
    )
    newest = _fill(history, trajectories, items)
    gc.collect()
    before = tracemalloc.get_traced_memory()[0] - base
    tracked_before = len(gc.get_objects()) - objects
    rendered = history.view().render(gateway, newest)
    assert rendered.body is not None
    rendered.body.encode()  # what a prepare's request_bytes does once
    del rendered  # the render cache stays in the history
    gc.collect()
    after = tracemalloc.get_traced_memory()[0] - base
    tracked_after = len(gc.get_objects()) - objects
    tracemalloc.stop()
    json_bytes = history.statistics().bytes + history.statistics().pinned_bytes
    parts = breakdown(history, trajectories)
    lean = floor(kind, history, trajectories)
    del history
    return json_bytes, before, after, parts, (tracked_before, tracked_after), lean


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=100_000)
    parser.add_argument("path", nargs="?", type=Path)
    args = parser.parse_args()
    path = args.path or (_SHARED if _SHARED.exists() else _SAMPLE)
    loaded, errors = load_trajectories(path)
    assert not errors, errors
    trajectories = [list(t.messages) for t in loaded]
    print(f"{args.items} history items from {path.name} (tracemalloc, bytes held)")
    print(
        f"{'gateway':<17}{'JSON MB':>9}{'held MB':>9}{'ratio':>7}{'+cache MB':>11}{'ratio':>7}"
        f"{'goal':>13}   floor:{'render':>7}{'+objects':>9}{'+msgpack':>9}"
    )
    results = {}
    for kind in GatewayType:
        json_bytes, before, after, parts, tracked, lean = measure(kind, trajectories, args.items)
        results[kind] = (json_bytes, after, parts, tracked)
        mb = 1 << 20
        ratio = after / json_bytes
        render, objects, packed = lean
        print(
            f"{kind.value:<17}{json_bytes / mb:9.1f}{before / mb:9.1f}{before / json_bytes:6.2f}x"
            f"{after / mb:11.1f}{ratio:6.2f}x"
            f"  <={GOAL:g}x {'met' if ratio <= GOAL else 'MISSED':<6}"
            f"{render / json_bytes:12.2f}x{(render + objects) / json_bytes:8.2f}x"
            f"{(render + packed) / json_bytes:8.2f}x"
        )
    print()
    names = list(next(iter(results.values()))[2])
    print("held memory by part, x JSON bytes (getsizeof; bookkeeping: the rest, see above)")
    print(f"{'gateway':<17}" + "".join(f"{name:>13}" for name in [*names, "bookkeeping"]))
    for kind, (json_bytes, after, parts, _) in results.items():
        counted = sum(v for k, v in parts.items() if k != "shared str")
        row = "".join(f"{parts[name] / json_bytes:12.3f}x" for name in names)
        print(f"{kind.value:<17}{row}{(after - counted) / json_bytes:12.3f}x")
    print()
    print("tracked objects (gc.get_objects()) per history item: committed, with the cache")
    for kind, (_, _, _, (tracked_before, tracked_after)) in results.items():
        print(
            f"{kind.value:<17}{tracked_before / args.items:10.4f}{tracked_after / args.items:10.4f}"
            f"   ({tracked_before} and {tracked_after} objects)"
        )


if __name__ == "__main__":
    main()
