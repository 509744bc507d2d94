"""TurnHistory: whole turns, limits, eviction, and the incremental render cache."""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.history_patch import history_modules, patched
from turnloom.context import (
    Gateway,
    GatewayType,
    Message,
    NativeContent,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    complete_pairs,
    get_gateway,
    message_size,
    open_call_ids,
)
from turnloom.context.callids import rename_call_ids
from turnloom.context.gateway import step_join
from turnloom.context.gateways import OpenAIChatGateway
from turnloom.context.history import HistoryLimits, HistoryView, RenderedHistory, TurnHistory
from turnloom.context.pairing import OpenCallPolicy
from turnloom.errors import (
    AmbiguousStepError,
    DuplicateIdError,
    InputError,
    InvalidMessageError,
    InvalidTextError,
    ItemTooLargeError,
    OutOfOrderTurnError,
    PairedTurnsTooLargeError,
    StateError,
    TurnTooLargeError,
    UnknownTurnError,
    UnpairedResultError,
)

CHAT = get_gateway(GatewayType.openai_chat)


class CountingGateway(OpenAIChatGateway):
    """The OpenAI Chat gateway, counting how many messages it renders."""

    def __init__(self) -> None:
        self.rendered = 0

    def render(self, message: Message) -> list[NativeContent]:
        self.rendered += 1
        return super().render(message)


def user(text: str) -> Message:
    return Message(role=Role.user, content=text)


def assistant(text: str) -> Message:
    return Message(role=Role.assistant, content=text)


def call(call_id: str, name: str = "lookup") -> Message:
    return Message(
        role=Role.assistant, content=(ToolCallPart(call_id=call_id, name=name, arguments="{}"),)
    )


def result(call_id: str, text: str = "ok") -> Message:
    return Message(
        role=Role.tool, content=(ToolResultPart(call_id=call_id, content=(TextPart(text=text),)),)
    )


SYSTEM = Message(role=Role.system, content="You are terse.")


def test_render_gives_pinned_then_earlier_turns_then_the_turn_input() -> None:
    history = TurnHistory()
    history.commit("t1", [user("hi")], instructions=[SYSTEM])
    history.record("t1", [call("c1"), result("c1", "42"), assistant("It is 42.")])
    history.commit("t2", [user("thanks")])
    history.record("t2", [assistant("You're welcome.")])

    rendered = history.view().render(CHAT, "t2")

    assert list(rendered.items) == [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": "hi"},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {"id": "c1", "type": "function", "function": {"name": "lookup", "arguments": "{}"}}
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "42"},
        {"role": "assistant", "content": "It is 42."},
        {"role": "user", "content": "thanks"},
    ]
    assert rendered.turn_start == 5
    sizes = [len(msgspec.json.encode(item)) for item in rendered.items]
    assert rendered.bytes == sum(sizes)
    assert [rendered.bytes_before(k) for k in range(8)] == [sum(sizes[:k]) for k in range(8)]


def test_pinned_instructions_are_not_counted_and_are_replaced_not_duplicated() -> None:
    history = TurnHistory()
    history.commit("t1", [user("a")], instructions=[SYSTEM])
    new = Message(role=Role.developer, content="Be kind.")
    history.commit("t2", [user("b")], instructions=[new])
    stats = history.statistics()
    assert (stats.turns, stats.items, stats.pinned_items) == (2, 2, 1)
    assert stats.bytes == message_size(user("a")) + message_size(user("b"))
    assert stats.pinned_bytes == message_size(new)
    items = history.view().render(CHAT, "t2").items
    assert items[0] == {"role": "developer", "content": "Be kind."}
    assert [i["role"] for i in items] == ["developer", "user", "user"]


def test_a_prepare_renders_only_new_messages() -> None:
    """Incremental rendering: each message is rendered once per gateway."""
    gateway = CountingGateway()
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=1000, max_items=100_000))
    history.commit("t0", [user("start")], instructions=[SYSTEM])
    for i in range(50):
        history.record(f"t{i}", [call(f"c{i}"), result(f"c{i}"), assistant(f"done {i}")])
        history.commit(f"t{i + 1}", [user(f"next {i}")])
        history.view().render(gateway, f"t{i + 1}")
    before = gateway.rendered
    history.record("t50", [assistant("reply")])
    history.commit("t51", [user("again")])
    history.view().render(gateway, "t51")
    # Only the new output of t50 and the input of t51: t50's input was rendered
    # when t50 was prepared, and every message keeps its rendering.
    assert gateway.rendered - before == 2


def test_eviction_drops_whole_turns_oldest_first() -> None:
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [user("a")], instructions=[SYSTEM])
    history.record("t1", [assistant("A")])
    history.commit("t2", [user("b")])
    history.commit("t3", [user("c")])
    assert history.over_limits()
    assert history.evict() == ("t1",)
    stats = history.statistics()
    # Held aside until the next change (t3's retraction would restore it), then counted.
    assert (stats.turns, stats.restorable_turns, stats.evicted_turns) == (2, 1, 0)
    assert history.turn_ids == ("t2", "t3")
    items = history.view().render(CHAT, "t3").items
    assert [i["content"] for i in items] == ["You are terse.", "b", "c"]
    history.record("t3", [assistant("C")])
    stats = history.statistics()
    assert (stats.turns, stats.items, stats.evicted_turns, stats.evicted_items) == (2, 3, 1, 2)
    assert (stats.restorable_turns, history.restorable_ids) == (0, ())
    assert stats.evicted_bytes == message_size(user("a")) + message_size(assistant("A"))


def test_item_and_byte_limits_evict_but_never_the_newest_turn() -> None:
    size = message_size(user("xxxx"))
    history = TurnHistory(HistoryLimits(low_water=1.0, max_items=3, max_bytes=size * 3))
    for i in range(3):
        history.commit(f"t{i}", [user("xxxx")])
    assert history.evict() == ()
    history.record("t2", [user("xxxx"), user("xxxx")])
    assert history.evict() == ("t0", "t1")
    assert history.turn_ids == ("t2",)
    # The newest turn is never evicted; it cannot outgrow the limits (TurnTooLargeError).
    assert history.statistics().items == 3


def test_an_item_over_the_byte_cap_is_rejected_and_nothing_changes() -> None:
    history = TurnHistory(HistoryLimits(low_water=1.0, max_item_bytes=128))
    history.commit("t1", [user("short")])
    with pytest.raises(ItemTooLargeError) as info:
        history.record("t1", [assistant("fine"), assistant("x" * 200)])
    assert info.value.limit == 128
    assert info.value.size == message_size(assistant("x" * 200))
    assert history.statistics().items == 1
    with pytest.raises(ItemTooLargeError):
        history.commit("t2", [user("y" * 200)])
    assert history.turn_ids == ("t1",)


def test_late_outputs_of_an_evicted_turn_are_dropped_counted_and_never_revive_it() -> None:
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=1))
    history.commit("t1", [user("a")])
    history.commit("t2", [user("b")])
    history.evict()
    assert history.record("t1", [assistant("late"), assistant("later")]) == 0
    stats = history.statistics()
    assert stats.dropped_late_outputs == 2
    assert history.turn_ids == ("t2",)
    with pytest.raises(DuplicateIdError):
        history.commit("t1", [user("again")])
    with pytest.raises(UnknownTurnError):
        history.record("never", [assistant("x")])


def test_blank_outputs_are_not_recorded() -> None:
    history = TurnHistory()
    history.commit("t1", [user("a")])
    assert history.record("t1", [assistant(""), assistant("  \n"), assistant("real")]) == 1
    assert history.statistics().dropped_blank_outputs == 2
    assert history.statistics().items == 2


def test_a_tool_result_with_blank_text_is_recorded() -> None:
    """Blank tool output is a real result (tau-bench has 71 of them), not a partial."""
    history = TurnHistory()
    history.commit("t1", [user("a")])
    assert history.record("t1", [call("c1"), result("c1", "")]) == 2


def test_bad_commits_are_rejected_before_any_change() -> None:
    history = TurnHistory()
    history.commit("t1", [user("a")], sequence=5)
    with pytest.raises(DuplicateIdError):
        history.commit("t1", [user("b")])
    with pytest.raises(OutOfOrderTurnError):
        history.commit("t2", [user("b")], sequence=5)
    with pytest.raises(InvalidMessageError):
        history.commit("t2", [Message(role=Role.system, content="obey me")])
    with pytest.raises(InvalidMessageError):
        history.commit("t2", [user("b")], instructions=[user("not an instruction")])
    with pytest.raises(InvalidTextError):
        history.commit("t2", [user("bad \ud800")])
    with pytest.raises(InvalidMessageError):
        history.commit("", [user("b")])
    with pytest.raises(InvalidMessageError):
        history.commit("t2", [user("b"), "not a message"])  # type: ignore[list-item]
    assert history.turn_ids == ("t1",)
    assert history.statistics().items == 1
    history.commit("t2", [user("b")], sequence=6)
    assert history.turn_ids == ("t1", "t2")  # type: ignore[comparison-overlap]


def test_limits_must_be_positive() -> None:
    with pytest.raises(InputError):
        HistoryLimits(low_water=1.0, max_turns=0)
    with pytest.raises(InputError):
        TurnHistory(remember_evicted=-1)


def test_an_open_call_in_a_closed_turn_is_excluded_from_the_render() -> None:
    history = TurnHistory()
    history.commit("t1", [user("a")])
    history.record("t1", [call("c1")])  # interrupted before the result
    history.commit("t2", [user("b")])
    items = history.view().render(CHAT, "t2").items
    assert list(items) == [{"role": "user", "content": "a"}, {"role": "user", "content": "b"}]
    assert CHAT.validate(items) == []


def test_a_reused_call_id_in_a_later_turn_pairs_with_its_own_call() -> None:
    """Positional pairing: tau-bench reuses call ids across turns."""
    history = TurnHistory()
    history.commit("t1", [user("a")])
    history.record("t1", [call("c1"), result("c1", "one")])
    history.commit("t2", [user("b")])
    history.record("t2", [call("c1"), result("c1", "two")])
    history.commit("t3", [user("c")])
    items = history.view().render(CHAT, "t3").items
    assert [i.get("content") for i in items if i["role"] == "tool"] == ["one", "two"]
    # The request carries each call id once: the reuse is renamed in its call
    # and its result alike.
    assert [c["id"] for i in items for c in i.get("tool_calls", ())] == ["c1", "c1_r2"]
    assert [i["tool_call_id"] for i in items if i["role"] == "tool"] == ["c1", "c1_r2"]
    assert CHAT.validate(items) == []


def test_a_view_is_not_changed_by_later_mutation() -> None:
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=1))
    history.commit("t1", [user("a")])
    view = history.view()
    history.record("t1", [assistant("A")])
    history.commit("t2", [user("b")])
    history.evict()
    assert list(view.render(CHAT, "t1").items) == [{"role": "user", "content": "a"}]
    assert view.turn_ids == ("t1",)


# -- property: the cached render equals a from-scratch render -------------------

_op = st.one_of(
    st.tuples(st.just("commit"), st.integers(0, 3)),
    st.tuples(st.just("text"), st.integers(0, 3)),
    st.tuples(st.just("call"), st.integers(0, 3)),
    st.tuples(st.just("result"), st.integers(0, 3)),
    st.tuples(st.just("answer"), st.integers(0, 3)),
    st.tuples(st.just("evict"), st.integers(0, 3)),
    st.tuples(st.just("render"), st.integers(0, 3)),
    st.tuples(st.just("late"), st.integers(0, 3)),
    st.tuples(st.just("fail"), st.integers(0, 3)),
)


class FlakyGateway(CountingGateway):
    """The OpenAI Chat gateway; ``render`` raises on its ``fail_in``-th call from now."""

    def __init__(self) -> None:
        super().__init__()
        self.fail_in: int | None = None

    def render(self, message: Message) -> list[NativeContent]:
        if self.fail_in is not None:
            self.fail_in -= 1
            if self.fail_in < 0:
                self.fail_in = None
                raise RuntimeError("injected render failure")
        return super().render(message)


def plain_common_length(a: Sequence[object], b: Sequence[object]) -> int:
    """The oracle of a common prefix: a plain scan."""
    count = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        count += 1
    return count


def cold_render(
    history: TurnHistory,
    turn_id: str,
    policy: OpenCallPolicy = "exclude",
    gateway: Gateway = CHAT,
) -> list[NativeContent]:
    """The oracle: the retained history completed at once, rendered without any cache,
    call ids made unique over the whole list."""
    messages = complete_pairs(
        list(history.view().sent_messages(turn_id)), open_calls=policy, join=step_join(gateway)
    )
    return rename_call_ids(gateway.type, [item for m in messages for item in gateway.render(m)])


def _answer(history: TurnHistory, n: int) -> bool:
    """Commit a turn whose input answers calls left open by the newest turn (approval)."""
    view = history.view()
    turn_id = view.turn_ids[-1]
    open_ids = open_call_ids(
        view.input_messages(turn_id) + view.turn_messages(turn_id)[len(view.turn_input(turn_id)) :]
    )
    if not open_ids:
        return False
    answered = open_ids[:1] if n % 3 == 0 else open_ids
    answer: list[Message] = [result(i, f"approved {i}") for i in answered]
    if n % 3 == 2:
        answer.append(user("and then?"))
    history.commit(f"{turn_id}-answer", answer)
    return True


@settings(max_examples=120)
def apply_op(history: TurnHistory, kind: str, n: int, turn: int) -> int:
    """Apply one generated history operation (see ``_op``); return the newest turn number.

    ``"fail"`` and ``"render"`` change nothing here (the caller renders). A
    record that would make one turn outgrow ``max_items`` is refused and
    changes nothing, as does a late record that would leave a later turn's results
    answering nothing (StateError) and a call repeating a call id of the step it
    continues (AmbiguousStepError).
    """
    turns = history.turn_ids
    if kind == "commit":
        turn += 1
        history.commit(f"t{turn}", [user(f"u{turn}")] * (n % 2 + 1))
    elif kind == "evict":
        history.evict()
    with contextlib.suppress(
        TurnTooLargeError, StateError, AmbiguousStepError, UnpairedResultError
    ):
        if kind == "text":
            history.record(turns[-1], [assistant(f"a{n}")])
        elif kind == "call":
            history.record(turns[-1], [call(f"c{n}"), call(f"d{n}")][: n % 2 + 1])
        elif kind == "result":
            history.record(turns[-1], [result(f"c{n}", f"r{n}")])
        elif kind == "answer":
            _answer(history, n)
        elif kind == "late":
            history.record(turns[n % len(turns)], [assistant(f"late{n}")])
    return turn


@given(st.lists(_op, min_size=1, max_size=60), st.sampled_from(["exclude", "cancel"]))
def test_cached_render_equals_a_from_scratch_render(
    ops: list[tuple[str, int]], policy: OpenCallPolicy
) -> None:
    """Invariant: whatever the order of commits, records, approvals (results as the next
    turn's input), evictions, renders and renders that fail part-way, every render equals
    a cold render of the retained history paired as one input. Its items, kept encoded
    and decoded reusing the previous render's decoded items, equal it too, and their
    common length with the previous render is that of the two plain lists."""
    gateway = FlakyGateway()
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=4, max_items=12))
    turn = 0
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    previous: RenderedHistory | None = None
    for kind, n in ops:
        turn = apply_op(history, kind, n, turn)
        target = history.turn_ids[n % len(history.turn_ids)]
        if kind == "fail":
            target = history.turn_ids[-1]
            gateway.fail_in = n
            try:
                history.view().render(gateway, target, open_calls=policy)
            except RuntimeError:
                pass
            gateway.fail_in = None
        rendered = history.view().render(gateway, target, open_calls=policy)
        common = None
        if previous is not None:
            common = rendered.native_items.common_length(previous.native_items)
            rendered.native_items.adopt(previous.native_items)
        assert list(rendered.items) == cold_render(history, target, policy)
        if previous is not None:
            assert common == plain_common_length(rendered.items, previous.items)
        previous = rendered
        sizes = [len(msgspec.json.encode(item)) for item in rendered.items]
        assert rendered.bytes == sum(sizes)
        assert [rendered.bytes_before(k) for k in range(len(sizes) + 2)] == [
            sum(sizes[:k]) for k in range(len(sizes) + 2)
        ]
        assert CHAT.validate(rendered.items) == []


def test_views_render_the_same_from_many_threads_at_once() -> None:
    """Worker threads share the render caches; every view still renders exactly."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=6))
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    views = []
    for i in range(1, 30):
        history.record(f"t{i - 1}", [call(f"c{i}"), result(f"c{i}", f"r{i}"), assistant(f"a{i}")])
        history.commit(f"t{i}", [user(f"u{i}")])
        history.evict()
        views.append((history.view(), f"t{i}"))
    expected = [list(view.render(CHAT, turn).items) for view, turn in views]

    def render(index: int) -> list[NativeContent]:
        view, turn = views[index % len(views)]
        return list(view.render(CHAT, turn).items)

    with ThreadPoolExecutor(max_workers=4) as pool:
        results = list(pool.map(render, range(len(views) * 8)))
    assert results == [expected[i % len(views)] for i in range(len(views) * 8)]


# -- pairing across turns --------------------------------------------------------


def _delete_branch_history() -> TurnHistory:
    """Issue small input: the result of t1's call arrives as t2's input (an approval)."""
    history = TurnHistory()
    history.commit("t1", [user("Delete the old branch.")])
    history.record("t1", [call("c1", "delete_branch")])
    history.commit("t2", [result("c1", "deleted")])
    return history


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
def test_a_result_given_as_the_next_turns_input_pairs_with_the_earlier_call(
    policy: OpenCallPolicy,
) -> None:
    """Invariant: pairing spans turns: prepare(t2) holds the user message, the call and
    its result, in order, and under "cancel" nothing claims the call was cancelled."""
    history = _delete_branch_history()
    expected = [
        {"role": "user", "content": "Delete the old branch."},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "delete_branch", "arguments": "{}"},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": "deleted"},
    ]
    for _ in range(2):  # the second render is served from the caches
        rendered = history.view().render(CHAT, "t2", open_calls=policy)
        assert list(rendered.items) == expected
        assert rendered.turn_start == 2
    history.record("t2", [assistant("Done.")])
    history.commit("t3", [user("Thanks.")])
    rendered = history.view().render(CHAT, "t3", open_calls=policy)
    assert list(rendered.items) == [
        *expected,
        {"role": "assistant", "content": "Done."},
        {"role": "user", "content": "Thanks."},
    ]


def test_an_unanswered_call_is_closed_where_the_next_turn_ends_its_group() -> None:
    """Invariant: a call answered neither in its turn nor by the next turn's input is
    excluded (or cancelled, after the results that did arrive) exactly once."""
    history = TurnHistory()
    history.commit("t1", [user("Do both.")])
    history.record(
        "t1",
        [
            Message(
                role=Role.assistant,
                content=(
                    ToolCallPart(call_id="a", name="f", arguments="{}"),
                    ToolCallPart(call_id="b", name="f", arguments="{}"),
                ),
            )
        ],
    )
    history.commit("t2", [result("a", "A"), user("Skip b.")])
    for policy in ("exclude", "cancel"):
        rendered = list(history.view().render(CHAT, "t2", open_calls=policy).items)
        assert rendered == cold_render(history, "t2", policy)
        assert CHAT.validate(rendered) == []
    calls = history.view().render(CHAT, "t2").items[1]["tool_calls"]
    assert [c["id"] for c in calls] == ["a"]
    cancelled = history.view().render(CHAT, "t2", open_calls="cancel").items
    assert [i.get("tool_call_id") for i in cancelled] == [None, None, "a", "b", None]


def test_an_approval_the_limits_cannot_hold_with_its_call_is_refused() -> None:
    """Decision: a result given as the next turn's input is never evicted apart from its
    call: with max_turns=1 the two turns cannot be kept, so the commit is refused and
    nothing changes (tests/context/test_history_pairs.py covers every limit)."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=1))
    history.commit("t1", [user("Delete the old branch.")], instructions=[SYSTEM])
    history.record("t1", [call("c1", "delete_branch")])
    before = history.view().render(CHAT, "t1").items
    with pytest.raises(PairedTurnsTooLargeError, match="answers tool calls of turn 't1'"):
        history.commit("t2", [result("c1", "deleted"), user("And now?")])
    assert history.turn_ids == ("t1",)
    assert list(history.view().render(CHAT, "t1").items) == list(before)


def test_eviction_takes_the_turn_answering_a_call_with_the_call_and_renders_cold() -> None:
    """Invariant: the turn holding a call leaves with the next turn, whose input answers
    it, even when the limit alone would keep that turn; the cached run (which held the
    pair) is rebuilt to equal a cold render."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [user("Delete the old branch.")], instructions=[SYSTEM])
    history.record("t1", [call("c1", "delete_branch")])
    history.commit("t2", [result("c1", "deleted"), user("Thanks.")])
    history.commit("t3", [user("Next.")])
    cached = history.view().render(CHAT, "t3").items
    assert [i["role"] for i in cached] == ["system", "user", "assistant", "tool", "user", "user"]
    assert history.evict() == ("t1", "t2")
    rendered = list(history.view().render(CHAT, "t3").items)
    assert rendered == cold_render(history, "t3")
    assert rendered == [
        {"role": "system", "content": SYSTEM.text},
        {"role": "user", "content": "Next."},
    ]


# -- duplicate records, late outputs, retraction ----------------------------------


def test_recording_a_message_id_again_is_idempotent_and_other_content_is_an_error() -> None:
    """Invariant: the same id recorded twice to a turn (an interrupted reply committed
    twice) is stored once and counted; the same id with other content is rejected and
    nothing of that record is kept."""
    history = TurnHistory()
    history.commit("t1", [user("Hi.")])
    reply = Message(role=Role.assistant, content="Hello!", id="m1")
    assert history.record("t1", [reply]) == 1
    assert history.record("t1", [reply, assistant("More.")]) == 1
    assert history.view().turn_messages("t1") == (user("Hi."), reply, assistant("More."))
    assert history.statistics().duplicate_outputs == 1
    other = Message(role=Role.assistant, content="Hello?", id="m1")
    with pytest.raises(DuplicateIdError, match="'m1'"):
        history.record("t1", [assistant("kept?"), other])
    assert history.view().turn_messages("t1") == (user("Hi."), reply, assistant("More."))
    history.commit("t2", [user("Again.")])
    with pytest.raises(DuplicateIdError, match="another turn"):
        history.record("t2", [reply])
    with pytest.raises(DuplicateIdError, match="'m1'"):
        history.commit("t3", [Message(role=Role.user, content="x", id="m1")])
    assert history.turn_ids == ("t1", "t2")


def test_late_outputs_after_the_evicted_ids_were_forgotten_are_dropped_and_counted() -> None:
    """Issue small input: a late output for a turn evicted more than remember_evicted
    turns ago is dropped and counted (not UnknownTurnError); with the turn's serial,
    a late output for a turn whose id was reused never lands in the new turn."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=1), remember_evicted=2)
    history.commit("t0", [user("first")])
    serial = history.turn_serial("t0")
    with pytest.raises(UnknownTurnError):
        history.record("never", [assistant("x")])
    for n in range(1, 5):
        history.commit(f"t{n}", [user(f"q{n}")])
        history.evict()
    assert not history.was_evicted("t0")  # forgotten
    assert history.record("t0", [assistant("late")]) == 0
    history.commit("t0", [user("the id again")])  # allowed once forgotten
    assert history.record("t0", [assistant("late for the old t0")], serial=serial) == 0
    assert history.view().turn_messages("t0") == (user("the id again"),)
    assert history.statistics().dropped_late_outputs == 2
    assert history.record("t0", [assistant("now")], serial=history.turn_serial("t0")) == 1


def test_retract_takes_back_the_newest_turn_without_an_answer() -> None:
    """Invariant: a retracted false start is not in the next turn's input; its id is
    gone (late outputs dropped, not reusable); only an unanswered newest turn goes."""
    history = TurnHistory()
    history.commit("t1", [user("Book a flight.")], instructions=[SYSTEM])
    history.record("t1", [assistant("Where to?")])
    history.commit("t2", [user("uh")])
    with pytest.raises(StateError, match="newest"):
        history.retract("t1")
    history.retract("t2")
    assert history.turn_ids == ("t1",)
    assert history.statistics().retracted_turns == 1
    assert (history.statistics().items, history.statistics().turns) == (2, 1)
    assert history.record("t2", [assistant("late")]) == 0
    with pytest.raises(DuplicateIdError):
        history.commit("t2", [user("again")])
    history.commit("t3", [user("To Oslo.")])
    assert list(history.view().render(CHAT, "t3").items) == [
        {"role": "system", "content": SYSTEM.text},
        {"role": "user", "content": "Book a flight."},
        {"role": "assistant", "content": "Where to?"},
        {"role": "user", "content": "To Oslo."},
    ]
    with pytest.raises(StateError, match="output"):
        history.record("t3", [assistant("Sure.")])
        history.retract("t3")
    with pytest.raises(UnknownTurnError):
        history.retract("t9")


def test_a_model_output_holding_only_a_signed_empty_text_is_recorded() -> None:
    """A Gemini thought signature on an empty text is content, not a blank output."""
    gemini = get_gateway(GatewayType.gemini)
    native = {"role": "model", "parts": [{"text": "", "thoughtSignature": "U0lHX0I="}]}
    history = TurnHistory()
    history.commit("t1", [user("a")])
    assert history.record("t1", [gemini.parse(native), assistant("  ")]) == 1
    assert history.statistics().dropped_blank_outputs == 1
    history.commit("t2", [user("b")])
    items = history.view().render(gemini, "t2").items
    assert items[1] == native


def _has_id(part: object) -> bool:
    return isinstance(part, (ToolCallPart, ToolResultPart))


def test_eviction_keeps_the_sent_ids_of_the_kept_turns() -> None:
    """Invariant: a call id is decided when its message is committed and kept through
    evictions: the renamed reuse stays renamed once the first use is evicted (the
    kept prefix stays byte-stable), and an id freed by eviction is taken again as it is."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [user("a")])
    history.record("t1", [call("c1"), result("c1")])
    history.commit("t2", [user("b")])
    history.record("t2", [call("c1"), result("c1")])
    history.commit("t3", [user("c")])
    ids = [
        c["id"] for i in history.view().render(CHAT, "t3").items for c in i.get("tool_calls", ())
    ]
    assert ids == ["c1", "c1_r2"]
    assert history.evict() == ("t1",)  # t2's reuse keeps the id it was sent with
    history.record("t3", [call("c2"), result("c2")])
    history.commit("t4", [user("d")])
    items = history.view().render(CHAT, "t4").items
    assert [c["id"] for i in items for c in i.get("tool_calls", ())] == ["c1_r2", "c2"]
    assert [i["tool_call_id"] for i in items if i["role"] == "tool"] == ["c1_r2", "c2"]
    assert [p.call_id for m in history.view().messages() for p in m.parts if _has_id(p)] == [
        "c1",
        "c1",
        "c2",
        "c2",
    ]
    history.record("t4", [call("c1"), result("c1")])  # c1 itself is free: sent as it is
    history.commit("t5", [user("e")])
    assert history.evict() == ("t2", "t3")
    items = history.view().render(CHAT, "t5").items
    assert [c["id"] for i in items for c in i.get("tool_calls", ())] == ["c1"]
    assert [i["tool_call_id"] for i in items if i["role"] == "tool"] == ["c1"]
    # The host sees the messages as it gave them.
    view = history.view()
    assert [p.call_id for m in view.turn_messages("t4") for p in m.parts if _has_id(p)] == [
        "c1",
        "c1",
    ]


@pytest.mark.parametrize("kind", list(GatewayType))
def test_an_eviction_of_a_first_use_renames_nothing_and_keeps_the_kept_items(
    kind: GatewayType, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Invariant: when an eviction drops the first use of a reused call id, the kept
    turns keep the ids they were sent with: the run is not renamed anew, the kept
    items are the previous render's very objects, and the render equals a cold render
    of the messages as sent, its body the encoded request body."""
    gateway = get_gateway(kind)
    renamed_anew: list[int] = []
    original = HistoryView._renamed_anew

    def spy(self: HistoryView, *args: Any) -> Any:
        renamed_anew.append(1)
        return original(self, *args)

    monkeypatch.setattr(HistoryView, "_renamed_anew", spy)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [user("a")], instructions=[SYSTEM])
    history.record("t1", [call("c1"), result("c1", "r1"), assistant("A1")])
    history.commit("t2", [user("b")])
    history.record("t2", [call("c1"), result("c1", "r2"), assistant("A2")])
    history.commit("t3", [user("c")])
    before = history.view().render(gateway, "t3")
    previous = before.native_items._shared()  # the kept items (``items`` are copies)
    assert history.evict() == ("t1",)
    rendered = history.view().render(gateway, "t3")
    assert renamed_anew == []
    rendered.native_items.adopt(before.native_items)
    items = rendered.native_items._shared()
    messages = complete_pairs(list(history.view().sent_messages("t3")))
    assert list(items) == rename_call_ids(kind, [i for m in messages for i in gateway.render(m)])
    assert [p.call_id for m in messages for p in m.parts if hasattr(p, "call_id")] == [
        "c1_r2",
        "c1_r2",
    ]
    assert rendered.body is not None
    assert rendered.body.encode() == msgspec.json.encode(gateway.request_body(items))
    # Every kept item is the previous render's: nothing was renamed or encoded again.
    reused = [i for i in items if any(i is p for p in previous)]
    assert len(reused) == len(items) == 6


def test_an_eviction_after_ids_a_gateway_fixes_together_renames_anew_as_a_cold_render(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: the rare rename only a gateway can make (Anthropic's id ``fix``
    mapping ``c.1`` and ``c_1`` to one id) still renames the kept turns anew when the
    first use leaves, and the render equals a cold render, its body the request body."""
    gateway = get_gateway(GatewayType.anthropic)
    renamed_anew: list[int] = []
    original = HistoryView._renamed_anew

    def spy(self: HistoryView, *args: Any) -> Any:
        renamed_anew.append(1)
        return original(self, *args)

    monkeypatch.setattr(HistoryView, "_renamed_anew", spy)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=2))
    history.commit("t1", [user("a")], instructions=[SYSTEM])
    history.record("t1", [call("c.1"), result("c.1", "r1"), assistant("A1")])
    history.commit("t2", [user("b")])
    history.record("t2", [call("c_1"), result("c_1", "r2"), assistant("A2")])
    history.commit("t3", [user("c")])
    before = list(history.view().render(gateway, "t3").items)
    assert [b["id"] for i in before for b in i["content"] if b["type"] == "tool_use"] == [
        "c_1",
        "c_1_r2",
    ]
    assert history.evict() == ("t1",)
    rendered = history.view().render(gateway, "t3")
    assert renamed_anew == [1]
    items = list(rendered.items)
    assert [b["id"] for i in items for b in i["content"] if b["type"] == "tool_use"] == ["c_1"]
    messages = complete_pairs(list(history.view().sent_messages("t3")))
    expected = rename_call_ids(
        GatewayType.anthropic, [i for m in messages for i in gateway.render(m)]
    )
    assert items == expected
    assert rendered.body is not None
    assert rendered.body.encode() == msgspec.json.encode(gateway.request_body(items))


@settings(max_examples=40, deadline=None)
@given(
    st.sampled_from(list(GatewayType)),
    st.lists(st.tuples(st.integers(0, 2), st.integers(0, 5)), min_size=1, max_size=16),
    st.integers(-1, 16),
)
def test_evictions_with_call_ids_reused_across_turns_render_and_encode_as_cold(
    kind: GatewayType, steps: list[tuple[int, int]], fail_at: int
) -> None:
    """Invariant: turns that reuse call ids (so evictions rename the kept turns anew,
    some turns' ids changing and others' not) render each prepare as a cold render
    does: items, decoded reusing the previous render's items, and the encoded body.
    A render that fails part-way through renaming anew (``fail_at``: the rename
    call that raises) leaves nothing behind: the next render equals a cold one."""
    from turnloom.context.callids import restore_call_ids as real

    gateway = get_gateway(kind)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=4))
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    previous: RenderedHistory | None = None
    renames = [0]

    def flaky(*args: Any) -> Any:
        renames[0] += 1
        if renames[0] == fail_at:
            raise MemoryError("injected")
        return real(*args)

    for number, (calls, reuse) in enumerate(steps, start=1):
        newest = history.turn_ids[-1]
        # Ids from a pool of three: reused within and across turns, kept and evicted.
        for k in range(calls):
            call_id = f"c{(reuse + k) % 3}"
            history.record(newest, [call(call_id), result(call_id, f"r{number}.{k}")])
        history.record(newest, [assistant(f"a{number}")])
        history.commit(f"t{number}", [user(f"u{number}")])
        history.evict()
        with contextlib.suppress(MemoryError), patched("restore_call_ids", flaky):
            history.view().render(gateway, f"t{number}")
        rendered = history.view().render(gateway, f"t{number}")
        common = None
        if previous is not None:
            common = rendered.native_items.common_length(previous.native_items)
            rendered.native_items.adopt(previous.native_items)
        items = list(rendered.items)
        assert items == cold_render(history, f"t{number}", gateway=gateway)
        if previous is not None:
            assert common == plain_common_length(items, previous.items)
        sizes = [len(msgspec.json.encode(item)) for item in items]
        assert [rendered.bytes_before(k) for k in range(len(sizes) + 1)] == [
            sum(sizes[:k]) for k in range(len(sizes) + 1)
        ]
        assert rendered.bytes == sum(sizes)
        assert rendered.body is not None
        assert rendered.body.encode() == msgspec.json.encode(gateway.request_body(items))
        previous = rendered


@pytest.mark.parametrize("kind", list(GatewayType))
def test_turns_joined_before_any_rename_are_renamed_anew_twice_as_a_cold_render(
    kind: GatewayType,
) -> None:
    """Invariant: turns that joined the run before any call id was renamed (kept without
    a call log) and then survive two evictions that rename the kept turns anew still
    count for later renames: each render equals a cold render, its body the encoded
    request body."""
    gateway = get_gateway(kind)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=5))
    history.commit("t1", [user("u1")], instructions=[SYSTEM])
    for number, ids in enumerate((["x"], ["y"], ["z"], ["x", "y", "z"]), start=1):
        history.record(f"t{number}", [m for i in ids for m in (call(i), result(i, f"r{i}"))])
        history.commit(f"t{number + 1}", [user(f"u{number + 1}")])
    for number in (5, 6, 7):
        rendered = history.view().render(gateway, f"t{number}")
        items = list(rendered.items)
        assert items == cold_render(history, f"t{number}", gateway=gateway)
        assert rendered.body is not None
        assert rendered.body.encode() == msgspec.json.encode(gateway.request_body(items))
        history.record(f"t{number}", [assistant(f"a{number}")])
        history.commit(f"t{number + 1}", [user(f"u{number + 1}")])
        history.evict()  # t1 (x), then t2 (y): t4's renames of them are renamed anew
    assert history.turn_ids == ("t4", "t5", "t6", "t7", "t8")
    stats = history.statistics()
    assert (stats.evicted_turns, stats.restorable_turns) == (2, 1)  # t3 held aside for t8


def test_a_batch_checked_at_the_door_is_not_checked_again_when_committed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """check_batch then commit/record of the same message objects: each message is
    checked (and encoded to size it) once; other objects are checked anew, and
    the sizes reused are the sizes check_message gives."""
    from turnloom.context.message import admit_message
    from turnloom.context.message import check_message as real

    checked: list[object] = []

    def counting(message: object, *, where: str = "message") -> tuple[Message, int]:
        checked.append(message)
        return admit_message(message, where=where)

    for module in history_modules():
        if hasattr(module, "admit_message"):
            monkeypatch.setattr(module, "admit_message", counting)
    history = TurnHistory()
    first = (Message(role=Role.user, content="hello"),)
    assert history.check_batch(first, "input") == (real(first[0]),)
    history.commit("t1", first)
    assert checked == [first[0]]
    outputs = (Message(role=Role.assistant, content="hi there"),)
    history.check_batch(outputs, "outputs", turn_id="t1")
    history.record("t1", list(outputs))
    assert checked == [first[0], outputs[0]]
    assert history.statistics().bytes == real(first[0]) + real(outputs[0])
    again = (Message(role=Role.assistant, content="hi there"),)  # equal, not the same
    history.record("t1", again)
    assert checked == [first[0], outputs[0], again[0]]


def test_a_batch_checked_before_the_history_changed_is_held_to_its_limits_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A check_batch passed on one state of the history: recording the same objects
    after another record grew the turn checks the limits again on the new state (the
    messages are not checked again), and refuses them, nothing recorded; recording
    them on the state they were checked on is not checked again at all."""
    from turnloom.context.message import admit_message
    from turnloom.context.message import check_message as real

    checked: list[object] = []

    def counting(message: object, *, where: str = "message") -> tuple[Message, int]:
        checked.append(message)
        return admit_message(message, where=where)

    for module in history_modules():
        if hasattr(module, "admit_message"):
            monkeypatch.setattr(module, "admit_message", counting)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_items=3))
    history.commit("t1", [user("a")])
    later = (assistant("b"), assistant("c"))
    assert history.check_batch(later, "outputs", turn_id="t1") == tuple(map(real, later))
    history.record("t1", [assistant("d")])
    with pytest.raises(TurnTooLargeError) as raised:
        history.record("t1", later)
    assert str(raised.value) == (
        "turn 't1' output would make the turn hold 4 messages, over the history's limit of 3."
    )
    assert len(checked) == 4  # a, b, c, d: b and c once
    assert history.statistics().items == 2
    history.check_batch(later[:1], "outputs", turn_id="t1")
    assert history.record("t1", later[:1]) == 1
    assert len(checked) == 5
    assert history.statistics().items == 3


@settings(max_examples=60, deadline=None)
@given(st.lists(_op, min_size=1, max_size=40))
def test_counts_are_the_statistics_fields_a_runtime_sums(ops: list[tuple[str, int]]) -> None:
    """Invariant: ``counts()`` (what a runtime takes before and after every change)
    holds exactly the named fields of ``statistics()``, in HistoryCounts' order,
    whatever commits, records (late, blank, duplicate), evictions and retractions
    came before."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=3, max_items=12))
    turn = 0
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    for kind, n in ops:
        turn = apply_op(history, kind, n, turn)
        if kind == "fail" and len(history.turn_ids) > 1:
            with contextlib.suppress(StateError):  # only a turn with no output
                history.retract(history.turn_ids[-1])
        elif kind == "render":
            again = Message(role=Role.assistant, content="a", id=f"m{n}")
            with contextlib.suppress(TurnTooLargeError):  # a full turn refuses it
                history.record(history.turn_ids[-1], [assistant(" "), again, again])
        s = history.statistics()
        assert history.counts() == (
            s.turns,
            s.items,
            s.bytes,
            s.tokens,
            s.evicted_turns,
            s.evicted_items,
            s.dropped_late_outputs,
            s.dropped_blank_outputs,
            s.duplicate_outputs,
            s.retracted_turns,
        )


def _kept_record(rendered: RenderedHistory) -> tuple[list[bytes], list[int], bytes | None]:
    """What a render handed out, read again later: its encoded run, sizes and body."""
    sizes = [rendered.bytes_before(k) for k in range(rendered.item_count + 1)]
    body = rendered.body.encode() if rendered.body is not None else None
    return list(rendered._run), sizes, body


@settings(max_examples=80)
@given(
    st.lists(_op, min_size=1, max_size=160),
    st.integers(0, 24),
    st.sampled_from(["exclude", "cancel"]),
)
def test_a_bounded_render_is_exact_or_nothing_and_what_renders_hand_out_never_changes(
    ops: list[tuple[str, int]], budget: int, policy: OpenCallPolicy
) -> None:
    """Invariant: ``render_bounded`` returns what ``render`` returns (a cold render, its
    body the encoded request body) or None, and always renders when the view holds at
    most ``budget`` items; one that renders while more are held renders at most
    ``budget`` messages. A render hands the run's encoded items out without a copy,
    and what it handed out (items, sizes, body) stays the same while later renders drop
    evicted turns from the run and compact it; what the run keeps for dropped turns
    stays under the compaction bound (1/16 of what it holds, plus 64, plus what one
    render drops)."""
    gateway = CountingGateway()
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=6, max_items=16))
    turn = 0
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    handed_out: list[tuple[RenderedHistory, tuple[list[bytes], list[int], bytes | None]]] = []
    for kind, n in ops:
        turn = apply_op(history, kind, n, turn)
        target = history.turn_ids[-1]
        view = history.view()
        before = gateway.rendered
        rendered = view.render_bounded(gateway, target, budget, open_calls=policy)
        if rendered is None:
            assert history.held_items > budget
            rendered = view.render(gateway, target, open_calls=policy)
        elif history.held_items > budget:
            assert gateway.rendered - before <= budget
        items = list(rendered.items)
        assert items == cold_render(history, target, policy)
        assert rendered.body is not None
        assert rendered.body.encode() == msgspec.json.encode(CHAT.request_body(items))
        run = history._shared.runs[(gateway, policy)]
        assert rendered._run._chunks is run.chunks
        assert run.skip <= 64 + run.count // 16 + 16
        assert run.dead <= 64 + run.turns // 16 + 6
        handed_out.append((rendered, _kept_record(rendered)))
    for rendered, record in handed_out:
        assert _kept_record(rendered) == record


def test_the_run_compacts_what_it_dropped_and_earlier_renders_keep_their_items() -> None:
    """Invariant: a long-running history drops evicted turns by moving the run's start,
    compacts into new containers once the dropped part is due (so the memory held for
    evicted items stays bounded), and every render made before stays exact."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_items=12))
    history.commit("t0", [user("u0")], instructions=[SYSTEM])
    renders: list[tuple[RenderedHistory, list[NativeContent]]] = []
    lists = set()
    for n in range(1, 120):
        history.record(f"t{n - 1}", [call(f"c{n}"), result(f"c{n}"), assistant(f"a{n}")])
        history.commit(f"t{n}", [user(f"u{n}")])
        history.evict()
        rendered = history.view().render(CHAT, f"t{n}")
        renders.append((rendered, cold_render(history, f"t{n}")))
        run = history._shared.runs[(CHAT, "exclude")]
        lists.add(id(run.chunks))
        assert run.skip <= 64 + run.count // 16 + 4
    assert len(lists) >= 4  # compacted into a new list several times
    for rendered, expected in renders:
        assert list(rendered.native_items.materialize()) == expected


def test_a_packed_call_log_gives_back_its_events_ids_and_carriers() -> None:
    """Invariant: a turn's call log, packed in one tuple, returns exactly the events,
    ids and carriers it was built from (a fixed id, an index past one byte), and
    replaying the packed tuple replays its events only."""
    from turnloom.context.callids import CallIdRenamer
    from turnloom.context.history._cells import _NO_CALLS, _call_log

    events = ("cCre", "a", "b.1", "b_1", "a")
    log = _call_log(events, ("a", "b_1", "a"), [3, 300, 301])
    assert (log.events, log.ids, log.carriers) == (events, ("a", "b_1", "a"), [3, 300, 301])
    assert (
        CallIdRenamer().replay(log.packed)
        == CallIdRenamer().replay(events)
        == (
            "a",
            "b_1",
            "a",
        )
    )
    assert _call_log((), (), []) is _NO_CALLS
    assert (_NO_CALLS.events, _NO_CALLS.ids, _NO_CALLS.carriers) == ((), (), [])


def _calls_message(*ids: str) -> Message:
    return Message(
        role=Role.assistant, content=tuple(ToolCallPart(call_id=i, name="f") for i in ids)
    )


def test_a_step_split_across_records_is_checked_against_the_turns_last_message() -> None:
    """Invariant (the record's step check, fast path or not): an output that would
    continue the step the turn's last message is part of, repeating a call id of it,
    is refused across records as within one (``duplicate_call_id``, ``field`` naming
    its index) and nothing is recorded; the same calls after the step's results start
    a new step and are recorded; a text reply needs no walk back and is recorded.

    Mutant tried: the record's fast path reading no previous message
    (``_steps_may_conflict(messages, None)``): the repeated id is accepted."""
    history = TurnHistory(HistoryLimits())
    history.commit("t0", [Message(role=Role.user, content="q")])
    assert history.record("t0", [_calls_message("a")]) == 1
    with pytest.raises(AmbiguousStepError) as caught:
        history.record("t0", [_calls_message("b", "a")])
    assert (caught.value.reason, caught.value.call_id) == ("duplicate_call_id", "a")
    assert caught.value.field == "Turn 't0' output[0]"
    assert len(history.view().turn_messages("t0")) == 2
    result = Message(
        role=Role.tool, content=(ToolResultPart(call_id="a", content=(TextPart(text="1"),)),)
    )
    assert history.record("t0", [result]) == 1
    assert history.record("t0", [_calls_message("a")]) == 1
    assert history.record("t0", [Message(role=Role.assistant, content="done")]) == 1
    assert len(history.view().turn_messages("t0")) == 5
