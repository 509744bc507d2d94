"""Positional tool call / result pairing: open_call_ids, complete_pairs, hold_until_answered."""

from __future__ import annotations

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import (
    CANCELLED_RESULT_TEXT,
    CallTracker,
    Message,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_steps,
    complete_pairs,
    hold_until_answered,
    join_steps,
    open_call_ids,
)
from turnloom.context.pairing import _joined, steps_may_conflict
from turnloom.errors import AmbiguousStepError, UnpairedResultError

USER = Message(role=Role.user, content="q")
ASSISTANT_TEXT = Message(role=Role.assistant, content="Checking.")


def calls(*ids: str) -> Message:
    return Message(
        role=Role.assistant, content=tuple(ToolCallPart(call_id=i, name="f") for i in ids)
    )


def results(*ids: str) -> Message:
    return Message(
        role=Role.tool,
        content=tuple(ToolResultPart(call_id=i, content=(TextPart(text=i),)) for i in ids),
    )


def test_open_call_ids_lists_unanswered_calls_of_the_last_group() -> None:
    assert open_call_ids([USER, calls("a", "b"), results("b")]) == ("a",)
    assert open_call_ids([USER, calls("a"), results("a")]) == ()
    assert open_call_ids([USER, calls("a"), USER]) == ()


def test_complete_pairs_keeps_complete_input_as_the_same_objects() -> None:
    """Invariant: messages that need no change are returned as the same objects."""
    history = [USER, calls("a", "b"), results("b", "a"), Message(role=Role.assistant, content="ok")]
    completed = complete_pairs(history)
    assert all(x is y for x, y in zip(completed, history, strict=True))


def test_exclude_drops_open_calls_and_emptied_messages() -> None:
    """Default policy: an unanswered call is removed; a message left empty disappears."""
    history = [USER, calls("a", "b"), results("a"), USER, calls("c")]
    assert complete_pairs(history) == [
        USER,
        calls("a"),
        results("a"),
        USER,
    ]


def test_cancel_closes_open_calls_with_an_error_result() -> None:
    """cancel: each open call gets an is_error result with the documented text."""
    history = [USER, calls("a", "b"), results("a"), USER]
    assert complete_pairs(history, open_calls="cancel") == [
        USER,
        calls("a", "b"),
        results("a"),
        Message(
            role=Role.tool,
            content=(
                ToolResultPart(
                    call_id="b",
                    name="f",
                    is_error=True,
                    content=(TextPart(text=CANCELLED_RESULT_TEXT),),
                ),
            ),
        ),
        USER,
    ]


def test_cancelled_results_follow_the_arrived_results_in_a_user_message_with_text() -> None:
    """cancel: results riding on a user message with text get the cancelled ones after
    them and before the text (as documented), not in a tool message before them."""
    arrived = ToolResultPart(call_id="a", content=(TextPart(text="a"),))
    history = [
        USER,
        calls("a", "b"),
        Message(role=Role.user, content=(arrived, TextPart(text="more"))),
    ]
    assert complete_pairs(history, open_calls="cancel") == [
        USER,
        calls("a", "b"),
        Message(
            role=Role.user,
            content=(
                arrived,
                ToolResultPart(
                    call_id="b",
                    name="f",
                    is_error=True,
                    content=(TextPart(text=CANCELLED_RESULT_TEXT),),
                ),
                TextPart(text="more"),
            ),
        ),
    ]


def test_orphan_results_and_blank_text_are_dropped() -> None:
    """A result with no call in the preceding group goes; so does whitespace-only text."""
    history = [USER, results("x"), Message(role=Role.assistant, content="  "), USER]
    assert complete_pairs(history) == [USER, USER]


def test_reused_id_pairs_with_its_own_call() -> None:
    """Positional: a result answers the nearest preceding group, even if the id was used before."""
    history = [USER, calls("a"), results("a"), USER, calls("a"), results("a")]
    assert complete_pairs(history) == history
    late = [USER, calls("a"), results("a"), USER, calls("b"), results("a")]
    assert complete_pairs(late) == [USER, calls("a"), results("a"), USER]


def test_layout_survives_part_removal() -> None:
    """Removing an open call keeps the message's id, extras and layout."""
    owner = Message(
        role=Role.assistant,
        content=(TextPart(text="x"), ToolCallPart(call_id="a", name="f")),
        id="m1",
        extras={"k": 1},
        layout={"gateway": "openai_chat", "content": "list"},
    )
    (_, kept) = complete_pairs([USER, owner])
    assert kept == Message(
        role=Role.assistant,
        content=(TextPart(text="x"),),
        id="m1",
        extras={"k": 1},
        layout={"gateway": "openai_chat", "content": "list"},
    )


def test_hold_until_answered_moves_notices_after_the_results() -> None:
    notice = Message(role=Role.system, content="notice")
    history = [USER, calls("a", "b"), results("a"), notice, results("b"), USER]
    assert hold_until_answered(history) == [
        USER,
        calls("a", "b"),
        results("a"),
        results("b"),
        notice,
        USER,
    ]


def test_hold_until_answered_releases_before_the_next_assistant_message() -> None:
    notice = Message(role=Role.system, content="notice")
    answer = Message(role=Role.assistant, content="done")
    assert hold_until_answered([USER, calls("a"), notice, answer]) == [
        USER,
        calls("a"),
        notice,
        answer,
    ]
    assert hold_until_answered([USER, calls("a"), notice]) == [USER, calls("a"), notice]


_ids = st.sampled_from(["a", "b", "c"])


@st.composite
def histories(draw: st.DrawFn) -> list[Message]:
    out: list[Message] = []
    for _ in range(draw(st.integers(0, 12))):
        kind = draw(st.sampled_from(["user", "calls", "results", "text", "reasoning", "system"]))
        if kind == "user":
            out.append(Message(role=Role.user, content=draw(st.sampled_from(["q", " ", ""]))))
        elif kind == "calls":
            out.append(calls(*draw(st.lists(_ids, min_size=1, max_size=3, unique=True))))
        elif kind == "results":
            out.append(results(*draw(st.lists(_ids, min_size=1, max_size=3, unique=True))))
        elif kind == "text":
            out.append(Message(role=Role.assistant, content=draw(st.sampled_from(["ok", "\n\n"]))))
        elif kind == "reasoning":
            out.append(Message(role=Role.assistant, content=(ReasoningPart(text="r"),)))
        else:
            out.append(Message(role=Role.system, content="notice"))
    return out


def _pairing_holds(messages: list[Message]) -> bool:
    """Every call answered exactly once by the tool messages right after its step; no orphans.

    A step is a run of consecutive assistant messages; its calls are answered
    by the tool messages right after the run.
    """
    pending: set[str] | None = None
    previous: Role | None = None
    for message in messages:
        if message.role is Role.tool:
            if pending is None:
                return False
            for result in message.tool_results:
                if result.call_id not in pending:
                    return False
                pending.remove(result.call_id)
        elif message.role is Role.assistant and previous is Role.assistant and pending:
            ids = {c.call_id for c in message.tool_calls}
            if ids & pending:
                return False
            pending |= ids
        else:
            if pending:
                return False
            pending = {c.call_id for c in message.tool_calls} if message.tool_calls else None
        previous = message.role
    return not pending


@settings(max_examples=200)
@given(history=histories(), policy=st.sampled_from(["exclude", "cancel"]))
def test_complete_pairs_invariants(history: list[Message], policy: str) -> None:
    """Invariant: output pairs positionally, has no blank text, and is a fixed point."""
    completed = complete_pairs(history, open_calls=policy)  # type: ignore[arg-type]
    assert _pairing_holds(completed)
    assert not any(type(p) is TextPart and not p.text.strip() for m in completed for p in m.parts)
    assert complete_pairs(completed, open_calls=policy) == completed  # type: ignore[arg-type]
    assert open_call_ids(completed) == ()


@settings(max_examples=200)
@given(history=histories())
def test_hold_until_answered_is_a_permutation_that_keeps_result_order(
    history: list[Message],
) -> None:
    """Invariant: same messages, calls and results in their original relative order."""
    held = hold_until_answered(history)
    assert sorted(map(id, held)) == sorted(map(id, history))
    pairs = [m for m in history if m.role in (Role.assistant, Role.tool)]
    assert [m for m in held if m.role in (Role.assistant, Role.tool)] == pairs


def test_call_tracker_is_the_one_pairing_rule() -> None:
    """Invariant (the one pairing rule of history, area sections, routed items and
    replay): a result answers an open call of the current group by id; other ids are
    orphans; consecutive assistant messages with calls are one step (one group); a
    group ends at the next assistant message that starts a step, a user, system or
    developer message, or after the results of a user message that also holds text,
    leaving its open calls closed; with model_turns, consecutive assistant messages
    form one group."""
    tracker = CallTracker()
    assert tracker.feed(USER) == ((), (), (), False)
    assert tracker.feed(calls("a", "b", "c")).closed == ()
    step = tracker.feed(results("b", "x"))
    assert ([r.call_id for r in step.paired], [r.call_id for r in step.orphans]) == (["b"], ["x"])
    assert tracker.open_ids == ("a", "c")
    answered_then_text = Message(
        role=Role.user,
        content=(ToolResultPart(call_id="a", content=(TextPart(text="a"),)), TextPart(text="t")),
    )
    step = tracker.feed(answered_then_text)
    assert [r.call_id for r in step.paired] == ["a"]
    assert [c.call_id for c in step.closed] == ["c"]
    assert not tracker.open
    tracker.feed(calls("a"))
    assert tracker.feed(calls("d")).closed == ()  # a step split one message per call
    assert tracker.open_ids == ("a", "d")
    tracker.feed(results("a"))
    assert [c.call_id for c in tracker.feed(calls("e")).closed] == ["d"]
    carried = CallTracker(calls("e").tool_calls)
    assert [r.call_id for r in carried.feed(results("e")).paired] == ["e"]
    turns = CallTracker(model_turns=True)
    turns.feed(calls("a"))
    turns.feed(calls("b"))
    assert turns.feed(results("a", "b")).orphans == ()
    copy = turns.copy()
    copy.feed(calls("z"))
    assert (turns.open_ids, copy.open_ids) == ((), ("z",))


def _answered_then_text(*ids: str) -> Message:
    """A user message with results and text: it ends the group (closing its open calls)."""
    parts = tuple(ToolResultPart(call_id=i, content=(TextPart(text=i),)) for i in ids)
    return Message(role=Role.user, content=(*parts, TextPart(text="t")))


@st.composite
def _steps(draw: st.DrawFn) -> list[Message]:
    out = draw(histories())
    if draw(st.booleans()):
        ids = draw(st.lists(_ids, min_size=1, max_size=2, unique=True))
        out.insert(draw(st.integers(0, len(out))), _answered_then_text(*ids))
    return out


@settings(max_examples=400)
@given(before=_steps(), messages=_steps())
def test_steps_may_conflict_is_false_only_where_check_steps_passes(
    before: list[Message], messages: list[Message]
) -> None:
    """Invariant (the record's fast path keeps the step check): whenever
    ``steps_may_conflict`` says a batch cannot conflict, ``check_steps`` over it
    after any ``before`` passes, under every ``late``/``unpaired`` flag (a record
    and both of a build's continuation checks); it says so for batches without
    results whose calls never directly follow an assistant message."""
    previous = before[-1] if before else None
    if not steps_may_conflict(messages, previous):
        for late, unpaired in itertools.product((False, True), repeat=2):
            check_steps(messages, "batch", before=before, late=late, unpaired=unpaired)
        sequence = [previous, *messages] if previous is not None else messages
        assert not any(type(p) is ToolResultPart for m in messages for p in m.parts)
        for earlier, message in itertools.pairwise(sequence):
            if earlier.role is Role.assistant:
                assert not message.tool_calls


def _join_calls_with_one_tracker(messages: list[Message]) -> list[Message]:
    """The oracle: every message fed to one tracker, oldest first; an assistant message
    that leaves the group as it was joins the message before it."""
    tracker = CallTracker()
    out: list[Message] = []
    for message in messages:
        group = tracker.group
        tracker.feed(message)
        if message.role is Role.assistant and tracker.group == group and out:
            out[-1] = _joined(out[-1], message)
        else:
            out.append(message)
    return out


@settings(max_examples=400)
@given(history=_steps())
def test_join_steps_calls_pairs_each_assistant_run_alone_as_one_tracker_would(
    history: list[Message],
) -> None:
    """Invariant (``join_steps`` feeds only runs of assistant messages, each to its own
    tracker): the joined list equals the one a single tracker fed every message gives,
    and messages not joined are the same objects.

    Mutant tried: an assistant message without calls joined to the one before it
    whatever the tracker says: fails (two replies in a row without calls are two steps)."""
    joined = join_steps(history, "calls")
    expected = _join_calls_with_one_tracker(history)
    assert joined == expected
    originals = {id(m) for m in history}
    for got, want in zip(joined, expected, strict=True):
        assert (got is want) if id(want) in originals else id(got) not in originals


def test_steps_may_conflict_on_each_kind_of_ambiguous_step() -> None:
    """Each refusal of ``check_steps`` is seen by the fast path: a repeated call id in
    a split step (duplicate_call_id), a result of a call whose step a model message
    ended (closed_call) and one whose group a user message ended (UnpairedResultError);
    a text reply or calls after a result are not.

    Mutant tried: ``steps_may_conflict`` answering False for a call after an
    assistant message (the record then accepts the repeated id); this test and
    tests/runtime/test_split_steps.py fail."""
    for before, batch, reason in (
        ([USER, calls("a")], [calls("a")], "duplicate_call_id"),
        ([USER, calls("a", "b"), calls("c")], [results("a")], None),
        ([USER, calls("a", "b"), results("b")], [ASSISTANT_TEXT, results("a")], "closed_call"),
        ([USER, calls("a", "b"), _answered_then_text("b")], [results("a")], "unpaired"),
        ([calls("a"), results("a"), calls("b")], [calls("c"), calls("b")], "duplicate_call_id"),
    ):
        assert steps_may_conflict(batch, before[-1])
        if reason is None:
            check_steps(batch, "batch", before=before)
        else:
            try:
                check_steps(batch, "batch", before=before)
            except AmbiguousStepError as exc:
                assert exc.reason == reason
            except UnpairedResultError as exc:  # a user message ended the group
                assert (reason, exc.call_id) == ("unpaired", "a")
            else:
                raise AssertionError("check_steps passed an ambiguous step")
    reply = Message(role=Role.assistant, content="done")
    assert not steps_may_conflict([reply], results("a"))
    assert not steps_may_conflict([calls("a")], results("a"))
    assert not steps_may_conflict([reply, USER, calls("b")], calls("a"))
    assert steps_may_conflict([reply, calls("b")], USER)
    assert steps_may_conflict([object()], None)
