"""Round trips of fork, merge, freeze and diff over generated contexts (seed 002)."""

from __future__ import annotations

import pickle
from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import (
    Message,
    PrefixContext,
    Role,
    ToolCallPart,
    ToolResultPart,
    WorkingContext,
)


@st.composite
def messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["user", "assistant", "call", "result"]))
    text = draw(st.sampled_from(["a", "b", "c"]))
    if kind == "call":
        args = draw(st.sampled_from(["{}", '{"x": 1}']))
        part = ToolCallPart(call_id=draw(st.sampled_from(["c1", "c2"])), name="f", arguments=args)
        return Message(role=Role.assistant, content=(part,))
    if kind == "result":
        return Message(role=Role.tool, content=(ToolResultPart(call_id="c1"),))
    return Message(role=Role(kind), content=text, name=draw(st.sampled_from([None, "x"])))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=4),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=8,
)
keys = st.text(min_size=1, max_size=3)


@st.composite
def contexts(draw: st.DrawFn) -> WorkingContext:
    ctx = WorkingContext(
        prefix=PrefixContext(system_prompt=draw(st.sampled_from(["", "rules"]))),
        messages=draw(st.lists(messages(), max_size=8)),
        scratchpad=draw(st.dictionaries(keys, json_values, max_size=4)),
    )
    for entry in draw(st.lists(st.integers(), max_size=3)):
        ctx.record({"agent_id": "a", "n": entry})
    return ctx


@settings(max_examples=100)
@given(contexts())
def test_freeze_round_trips_through_a_rehydrated_context(ctx: WorkingContext) -> None:
    frozen = ctx.freeze()
    live = WorkingContext(
        prefix=frozen.prefix,
        messages=list(frozen.messages),
        scratchpad=dict(frozen.scratchpad),
        journal=None,
    )
    again = live.freeze()
    assert (again.prefix, again.messages, again.scratchpad) == (
        frozen.prefix,
        frozen.messages,
        frozen.scratchpad,
    )
    assert hash(again) == hash(frozen)  # the journal is not part of the hash
    assert frozen == ctx.freeze()
    assert hash(frozen) == hash(ctx.freeze())
    assert pickle.loads(pickle.dumps(frozen)) == frozen


@settings(max_examples=100)
@given(contexts(), st.lists(messages(), max_size=3), keys, json_values)
def test_fork_is_equal_then_independent(
    ctx: WorkingContext, extra: list[Message], key: str, value: Any
) -> None:
    before = ctx.freeze()
    child = ctx.fork()
    assert child.freeze() == before
    child.extend(extra).note(key, value).record("child")
    for note in child.scratchpad.values():
        if isinstance(note, list):
            note.append("mutated")
        elif isinstance(note, dict):
            note["mutated"] = True
    assert ctx.freeze() == before


@settings(max_examples=100)
@given(contexts(), contexts())
def test_merge_concat_is_the_concatenation_of_every_axis(
    a: WorkingContext, b: WorkingContext
) -> None:
    expected_messages = a.messages + b.messages
    expected_notes = {**a.scratchpad, **b.scratchpad}
    expected_journal = a.journal.view() + b.journal.view()
    a.merge(b)
    assert a.messages == expected_messages
    assert a.scratchpad == expected_notes
    assert a.journal.view() == expected_journal


@settings(max_examples=100)
@given(contexts(), contexts())
def test_merge_union_keeps_first_occurrences_by_value(a: WorkingContext, b: WorkingContext) -> None:
    original = list(a.messages)
    a.merge(b, mode="union")
    expected = list(original)
    for message in b.messages:
        if message not in expected:
            expected.append(message)
    assert a.messages == expected
    assert a.messages[: len(original)] == original


@settings(max_examples=100)
@given(contexts(), st.lists(messages(), max_size=4))
def test_diff_of_a_fork_extended_is_what_was_added(
    ctx: WorkingContext, extra: list[Message]
) -> None:
    child = ctx.fork().extend(extra)
    d = child.diff(ctx)
    assert d.messages_added == tuple(extra)
    assert d.messages_removed == ()
    assert d.scratchpad_changes == {}
    assert d.prefix_changed is False
    reverse = ctx.diff(child)
    assert reverse.messages_removed == tuple(extra)
    assert pickle.loads(pickle.dumps(d)) == d
    assert hash(pickle.loads(pickle.dumps(d))) == hash(d)
