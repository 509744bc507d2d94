"""The request body kept encoded by the history equals the gateway's body, encoded.

Oracle: ``msgspec.json.encode(gateway.request_body(items))``. The cached path
(:class:`~turnloom.context.body.EncodedBody` from ``RenderedHistory.body``)
must produce the same bytes for every gateway, after any sequence of commits,
records, evictions and failed renders, with or without a continuation.
"""

from __future__ import annotations

import contextlib
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.test_history import SYSTEM, _op, apply_op, assistant, call, result, user
from turnloom.context import (
    GatewayType,
    Message,
    NativeContent,
    Role,
    ToolCallPart,
    complete_pairs,
    get_gateway,
)
from turnloom.context import body as body_module
from turnloom.context.body import BodyRun, body_writer
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.gateway import Gateway
from turnloom.context.history import HistoryLimits, RenderedHistory, TurnHistory
from turnloom.context.pairing import OpenCallPolicy
from turnloom.errors import AmbiguousStepError
from turnloom.tools.trajectories import load_trajectories
from turnloom.tools.transcript import Turn, turn_ids, walk

_encode = msgspec.json.Encoder().encode
CHAT = get_gateway(GatewayType.openai_chat)


class Flaky:
    """A built-in gateway whose ``render`` raises on its ``fail_in``-th call from now."""

    def __init__(self, inner: Gateway) -> None:
        self.inner = inner
        self.fail_in: int | None = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def render(self, message: Message) -> list[NativeContent]:
        if self.fail_in is not None:
            self.fail_in -= 1
            if self.fail_in < 0:
                self.fail_in = None
                raise RuntimeError("injected render failure")
        return self.inner.render(message)


def _continuation(gateway: Gateway, rendered: RenderedHistory, n: int) -> list[NativeContent]:
    """A continuation's items: a call, its result and an answer, ids continued."""
    messages = [call(f"k{n}"), result(f"k{n}", "done"), assistant("ok")]
    items = [item for m in messages for item in gateway.render(m)]
    return rename_call_ids(gateway.type, items, rendered.call_ids.copy())


def assert_body_is_exact(gateway: Gateway, rendered: RenderedHistory, n: int = 0) -> None:
    """The cached body, alone and extended by a continuation, equals the encoded body."""
    assert rendered.body is not None
    assert rendered.body.encode() == _encode(gateway.request_body(rendered.items))
    more = _continuation(gateway, rendered, n)
    assert rendered.body.extend(more).encode() == _encode(
        gateway.request_body([*rendered.items, *more])
    )


@settings(max_examples=60)
@given(
    st.lists(_op, min_size=1, max_size=60),
    st.sampled_from(["exclude", "cancel"]),
    st.sampled_from(list(GatewayType)),
)
def test_cached_body_equals_the_encoded_request_body(
    ops: list[tuple[str, int]], policy: OpenCallPolicy, kind: GatewayType
) -> None:
    """Invariant: whatever the commits, records, approvals, evictions and renders that
    fail part-way, the body the history keeps encoded is byte for byte the encoded
    ``request_body`` of the rendered items, for every gateway (merges of adjacent
    turns across a cut included)."""
    gateway = Flaky(get_gateway(kind))
    history = TurnHistory(HistoryLimits(max_turns=4, max_items=12))
    turn = 0
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    for kind_, n in ops:
        turn = apply_op(history, kind_, n, turn)
        target = history.turn_ids[-1]
        if kind_ == "fail":
            gateway.fail_in = n
            with contextlib.suppress(RuntimeError):
                history.view().render(gateway, target, open_calls=policy)
            gateway.fail_in = None
        rendered = history.view().render(gateway, target, open_calls=policy)
        assert_body_is_exact(gateway, rendered, n)


@pytest.mark.parametrize("kind", list(GatewayType))
@pytest.mark.parametrize(
    ("max_turns", "count", "checks"),
    # All kept: 20 trajectories (610 messages by the end); each check encodes the
    # whole body twice, so the cost grows with the square of the count.
    [pytest.param(10_000, 20, 182, id="10000"), pytest.param(3, 40, 357, id="3")],
)
def test_cached_body_equals_the_encoded_request_body_on_tau_bench(
    tau_bench_path: Path, kind: GatewayType, max_turns: int, count: int, checks: int
) -> None:
    """Invariant: on real trajectories held as one history (20 all kept, or 40 evicting
    to 3 turns), every prepare's cached body equals the encoded request body."""
    trajectories, errors = load_trajectories(tau_bench_path)
    assert errors == []
    gateway = get_gateway(kind)
    history = TurnHistory(HistoryLimits(max_turns=max_turns, max_items=100_000, max_bytes=1 << 30))
    ids = turn_ids()
    checked = 0
    for trajectory in trajectories[:count]:
        messages = [CHAT.parse(native) for native in trajectory.messages]
        for step in walk(messages, ids=ids):
            if isinstance(step, Turn):
                history.commit(step.turn_id, [step.input], instructions=step.instructions)
                history.evict()
                rendered = history.view().render(gateway, step.turn_id)
                assert_body_is_exact(gateway, rendered, checked)
                checked += 1
            else:
                history.record(step.turn_id, [step.message])
    assert checked == checks


def test_an_earlier_turn_renders_without_a_cached_body() -> None:
    """Invariant: a private render (an earlier turn, an older view) has no cached body,
    so its callers encode the body whole; the newest turn's render has one."""
    history = TurnHistory()
    history.commit("t1", [user("a")])
    history.record("t1", [assistant("A")])
    history.commit("t2", [user("b")])
    view = history.view()
    assert view.render(CHAT, "t1").body is None
    assert view.render(CHAT, "t2").body is not None


def _segments(run: BodyRun) -> list[tuple[int, int, bytes]]:
    """Each segment's tag, reach and encoded body items (comma-joined)."""
    out, start, held = [], 0, run._held()
    for tag, reach, count in run._live_segments():
        out.append((tag, reach, b",".join(held[start : start + count])))
        start += count
    assert start == len(held)
    return out


def _user(text: str) -> NativeContent:
    return {"role": "user", "content": text}


def test_a_body_item_belongs_to_the_segment_it_starts_in() -> None:
    """Invariant: a held-back body item handed out during a later segment is kept with
    the segment of its first item; a merge across a cut is recorded as its reach,
    and dropping such a segment is refused (the caller rebuilds)."""
    writer = body_writer(get_gateway(GatewayType.anthropic))
    assert writer is not None
    run = BodyRun(writer)
    run.append([{"role": "system", "content": "s"}], 0)
    run.append([_user("a"), {"role": "assistant", "content": "b"}], 1)
    run.append([_user("c"), {"role": "assistant", "content": "g"}], 2)  # hands out b, c
    run.append([_user("e"), _user("h")], 3)
    run.append([_user("i"), {"role": "assistant", "content": "f"}], 4)  # i joins e, h
    merged = (
        b'{"role":"user","content":[{"type":"text","text":"e"},'
        b'{"type":"text","text":"h"},{"type":"text","text":"i"}]}'
    )
    assert _segments(run) == [
        (0, 0, b""),
        (1, 1, b'{"role":"user","content":"a"},{"role":"assistant","content":"b"}'),
        (2, 2, b'{"role":"user","content":"c"},{"role":"assistant","content":"g"}'),
        (3, 4, merged),
        (4, 4, b""),
    ]
    dropped = CallIdRenamer()
    assert run.drop(2, dropped) is True
    assert run.drop(3, dropped) is True
    assert [tag for tag, _, _ in _segments(run)] == [0, 3, 4]
    assert run.drop(4, dropped) is False  # segment 3's message holds segment 4's item
    assert [tag for tag, _, _ in _segments(run)] == [0, 3, 4]
    assert run.snapshot().encode() == (
        b'{"system":"s","messages":[' + merged + b',{"role":"assistant","content":"f"}]}'
    )


def test_a_cut_before_responses_ordered_by_a_dropped_call_turn_is_refused() -> None:
    """Invariant (Gemini): responses put in call order after a dropped model turn would
    keep their original order once it is gone, so that cut is refused."""
    writer = body_writer(get_gateway(GatewayType.gemini))
    assert writer is not None
    run = BodyRun(writer)

    def response(name: str) -> dict[str, Any]:
        return {"functionResponse": {"id": name, "name": name, "response": {"ok": 1}}}

    calls: list[Any] = [{"functionCall": {"id": n, "name": n, "args": {}}} for n in ("a", "b")]
    run.append([{"role": "user", "parts": [{"text": "q"}]}, {"role": "model", "parts": calls}], 1)
    run.append([{"role": "user", "parts": [response("b"), response("a")]}], 2)
    run.append([{"role": "model", "parts": [{"text": "done"}]}], 3)
    assert run.drop(2, CallIdRenamer()) is False
    assert run.snapshot().encode() == _encode(
        get_gateway(GatewayType.gemini).request_body(
            [
                {"role": "user", "parts": [{"text": "q"}]},
                {"role": "model", "parts": calls},
                {"role": "user", "parts": [response("b"), response("a")]},
                {"role": "model", "parts": [{"text": "done"}]},
            ]
        )
    )


def _cold_items(gateway: Gateway, history: TurnHistory, turn_id: str) -> list[NativeContent]:
    """The oracle: the retained history paired as one input, rendered without any
    cache, call ids made unique over the whole list."""
    messages = complete_pairs(list(history.view().sent_messages(turn_id)))
    return rename_call_ids(gateway.type, [i for m in messages for i in gateway.render(m)])


# One turn of a history that reuses a few call ids: per round the ids called
# (from 3, so ids recur across turns) and whether their results come (mostly:
# a round without results leaves its calls open, which makes later turns
# render anew rather than be renamed).
_evicting_turn = st.lists(
    st.tuples(
        st.lists(st.integers(0, 2), min_size=1, max_size=2, unique=True),
        st.integers(0, 5).map(bool),
    ),
    min_size=1,
    max_size=2,
)


@settings(max_examples=80)
@given(
    st.lists(_evicting_turn, min_size=6, max_size=20),
    st.integers(1, 5),
    st.sampled_from(list(GatewayType)),
)
def test_eviction_renames_the_kept_turns_as_a_cold_render_would(
    turns: list[list[tuple[list[int], bool]]], max_turns: int, kind: GatewayType
) -> None:
    """Invariant: on histories that reuse call ids and evict at every turn, so the kept
    turns are renamed anew many times over (first from their items, then from their
    recorded call-id events), every render of the newest turn equals a cold render of
    the retained history, and its cached body is exactly the encoded request body."""
    gateway = get_gateway(kind)
    history = TurnHistory(HistoryLimits(max_turns=max_turns))
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    history.view().render(gateway, "t0")
    for number, rounds in enumerate(turns, 1):
        turn_id = f"t{number}"
        history.commit(turn_id, [user(f"u{number}")])
        history.evict()
        rendered = history.view().render(gateway, turn_id)
        assert list(rendered.items) == _cold_items(gateway, history, turn_id)
        assert_body_is_exact(gateway, rendered, number)
        for ids, answered in rounds:
            parts = tuple(ToolCallPart(call_id=f"c{i}", name="f", arguments="{}") for i in ids)
            try:
                history.record(turn_id, [Message(role=Role.assistant, content=parts)])
            except AmbiguousStepError:  # repeats an id of the open step: nothing changed
                continue
            if answered:
                history.record(turn_id, [result(f"c{i}", f"r{number}") for i in ids])
        history.record(turn_id, [assistant(f"a{number}")])


def _gemini_text(role: str, text: str) -> NativeContent:
    return {"role": role, "parts": [{"text": text}]}


def test_body_only_segments_are_joined_into_blocks_and_cut_exactly() -> None:
    """Invariant: segments whose body items are the body's alone (Gemini merges their two
    model contents) are kept joined in blocks of ``_BLOCK_SEGMENTS``, so a body joins
    about one piece per block, not per segment; a segment whose body items are its own
    items stays its caller's chunk, that very object; and after every drop at the front
    (into a block, past it, into the loose tail) and every compaction, the body is
    exactly the encoded request body of the kept items."""
    gateway = get_gateway(GatewayType.gemini)
    writer = body_writer(gateway)
    assert writer is not None
    run = BodyRun(writer)
    system = _gemini_text("system", "s")
    run.append([system], 0)
    segments: dict[int, list[NativeContent]] = {}
    shared: dict[int, bytes] = {}
    assert body_module._BLOCK_SEGMENTS == 64
    count = 210
    for tag in range(1, count + 1):
        if tag % 100 == 0:  # passed through unchanged: the caller's chunk is its body
            items = [_gemini_text("user", f"q{tag}"), _gemini_text("model", f"a{tag}")]
            encoded = [_encode(item) for item in items]
            shared[tag] = b",".join(encoded)
            run.append(items, tag, encoded, shared[tag])
        else:  # two model contents: merged into one body item
            items = [
                _gemini_text("user", f"q{tag}"),
                _gemini_text("model", f"a{tag}"),
                _gemini_text("model", f"b{tag}"),
            ]
            run.append(items, tag)
        segments[tag] = items
    # Segments 1-99: a block of 64 and, before segment 100's own chunk, one of
    # 35; the same for 101-199 and 200; 201-209 loose (210 is still open).
    assert [chunk.count(b'"user"') for chunk in run._chunks] == [64, 35, 1, 64, 35, 1]
    assert len(run._loose) == 9
    assert all(any(chunk is held for held in run._chunks) for chunk in shared.values())
    compactions = 0
    for first_kept in range(2, count + 1):
        assert run.drop(first_kept, CallIdRenamer()) is True
        if run.compaction_due():
            run.compact()
            compactions += 1
        kept = [system, *(i for tag in range(first_kept, count + 1) for i in segments[tag])]
        assert run.snapshot().encode() == _encode(gateway.request_body(kept)), first_kept
    assert compactions > 0


def test_a_chunk_sealed_at_once_follows_the_loose_segments_before_it() -> None:
    """Invariant: a segment sealed as its caller's chunk the moment it is fed (a writer
    that passes items through) comes after the loose segments fed before it, in body
    order: they are joined into a block first."""
    writer = body_writer(CHAT)
    assert writer is not None
    run = BodyRun(writer)
    first = [_user("a"), {"role": "assistant", "content": "b"}]
    second = [_user("c"), {"role": "assistant", "content": "d"}]
    run.append(first, 1)  # no chunk from the caller: the body's own, loose
    encoded = [_encode(item) for item in second]
    run.append(second, 2, encoded, b",".join(encoded))
    assert run.snapshot().encode() == _encode(CHAT.request_body([*first, *second]))
