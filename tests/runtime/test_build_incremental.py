"""``build`` is incremental and equals the cold computation over the whole continuation."""

from __future__ import annotations

import functools

import anyio
import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import assistant, call, result, user
from turnloom.context import (
    GatewayType,
    Message,
    NativeContent,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    callids,
    get_gateway,
)
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.gateway import step_join
from turnloom.context.gateways import OpenAIChatGateway
from turnloom.context.history import HistoryLimits
from turnloom.context.pairing import OpenCallPolicy, check_steps, complete_pairs
from turnloom.errors import AmbiguousStepError, DuplicateIdError, UnpairedResultError
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime._continuation import IssuedPrefixes, _plain_steps, _settled_count

_IDS = ("c1", "c2", "c3")


@functools.cache
def _prefix(kind: GatewayType) -> PreparedContext:
    """A prefix a manager prepared (its items and reserved ids; kept alive here)."""

    async def main() -> PreparedContext:
        async with Foundation(gateway=kind) as foundation:
            manager = foundation.manager
            snapshot = TurnSnapshot(context_id="c", turn_id="t", input=(user("hi"),))
            manager.accept_turn(snapshot)
            return await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t"))

    return anyio.run(main)


def _calls(ids: list[str]) -> Message:
    return Message(
        role=Role.assistant,
        content=tuple(ToolCallPart(call_id=i, name="lookup", arguments="{}") for i in ids),
    )


def _user_results(ids: list[str], text: str) -> Message:
    parts: list[TextPart | ToolResultPart] = [
        ToolResultPart(call_id=i, content=(TextPart(text="ok"),)) for i in ids
    ]
    if text:
        parts.append(TextPart(text=text))
    return Message(role=Role.user, content=tuple(parts))


_id_sets = st.lists(st.sampled_from(_IDS), min_size=1, max_size=3, unique=True)
_message = st.one_of(
    _id_sets.map(_calls),
    st.sampled_from(_IDS).map(result),
    st.sampled_from(_IDS).map(call),
    st.sampled_from(["next", "  "]).map(user),
    st.sampled_from(["done", " "]).map(assistant),
    st.tuples(_id_sets, st.sampled_from(["", "more"])).map(lambda a: _user_results(*a)),
)


def _renamer(kind: GatewayType) -> CallIdRenamer:
    """The renaming state after items that already sent ``c1``, so continuation calls rename."""
    renamer = CallIdRenamer()
    gateway = get_gateway(kind)
    for message in (call("c1"), result("c1")):
        rename_call_ids(kind, gateway.render(message), renamer)
    return renamer


def _cold(
    kind: GatewayType,
    prefix: PreparedContext,
    renamer: CallIdRenamer,
    continuation: list[Message],
    policy: OpenCallPolicy,
) -> tuple[NativeContent, ...]:
    """The oracle: the whole continuation completed, rendered and renamed at once."""
    gateway = get_gateway(kind)
    state = renamer.copy()
    items = list(prefix.items)
    for message in complete_pairs(continuation, open_calls=policy, join=step_join(gateway)):
        items.extend(rename_call_ids(kind, gateway.render(message), state))
    return tuple(items)


@settings(max_examples=300, deadline=None)
@given(
    kind=st.sampled_from(list(GatewayType)),
    policy=st.sampled_from(["exclude", "cancel"]),
    messages=st.lists(_message, max_size=14),
    builds=st.lists(
        st.tuples(st.integers(0, 14), st.none() | st.tuples(st.integers(0, 13), _message)),
        min_size=1,
        max_size=8,
    ),
)
# The head settled by a closing message (the second call, while the first is
# open) is not reused when that message is swapped for the first call's result.
@example(
    kind=GatewayType.openai_chat,
    policy="exclude",
    messages=[call("c2"), call("c3")],
    builds=[(2, None), (2, (1, result("c2")))],
)
# A user message answering one of two calls closes nothing: the head is not
# settled before it.
@example(
    kind=GatewayType.anthropic,
    policy="exclude",
    messages=[_calls(["c2", "c3"]), _user_results(["c2"], "")],
    builds=[(2, None)],
)
def test_incremental_builds_equal_the_cold_computation(
    kind: GatewayType,
    policy: OpenCallPolicy,
    messages: list[Message],
    builds: list[tuple[int, tuple[int, Message] | None]],
) -> None:
    """Invariant: every build, whatever the builds before it on the same prefix
    (growing, shrinking, or with a message replaced by another object), equals the
    prefix's items followed by the whole continuation completed (``complete_pairs``),
    rendered and renamed from the prefix's renaming state in one pass, including
    when a later message answers or closes an earlier open call; a continuation
    splitting a model step ambiguously, or holding a result that answers no call of
    it, is refused, as ``check_steps`` refuses it."""
    prefix = _prefix(kind)
    renamer = _renamer(kind)
    issued = IssuedPrefixes(get_gateway(kind), HistoryLimits(), policy, lambda _: None)
    issued.add(prefix, renamer)
    current = list(messages)
    for length, swap in builds:
        if swap is not None and current:
            current = list(current)
            current[swap[0] % len(current)] = swap[1]
        continuation = current[:length]
        try:
            built = issued.build(prefix, continuation)
        except (AmbiguousStepError, UnpairedResultError) as error:
            # Refused exactly when the whole continuation splits a step ambiguously
            # or holds a result answering no call, with the same error.
            with pytest.raises(type(error)) as caught:
                check_steps(continuation, "continuation")
            assert str(caught.value) == str(error)
            continue
        assert built == _cold(kind, prefix, renamer, continuation, policy)


@pytest.mark.parametrize("policy", ["exclude", "cancel"])
def test_a_build_renders_only_what_follows_the_settled_head(policy: OpenCallPolicy) -> None:
    """Invariant: a build that extends the previous continuation renders only its
    messages after the settled head (work per build follows the new messages, not
    the continuation's length)."""
    kind = GatewayType.openai_chat
    prefix = _prefix(kind)
    rendered: list[Message] = []

    class Counting(OpenAIChatGateway):
        def render(self, message: Message) -> list[NativeContent]:
            rendered.append(message)
            return super().render(message)

    issued = IssuedPrefixes(Counting(), HistoryLimits(), policy, lambda _: None)
    issued.add(prefix, CallIdRenamer())
    steps = [call("a"), result("a"), call("b"), result("b"), call("c")]
    issued.build(prefix, steps[:2])
    assert rendered == steps[:2]
    rendered.clear()
    issued.build(prefix, steps[:4])
    assert rendered == steps[2:4]
    rendered.clear()
    issued.build(prefix, steps)  # the call is open: the rest is rendered every time
    issued.build(prefix, steps)
    if policy == "exclude":
        assert rendered == []  # the open call is left out: its message goes
    else:
        # The call, then its cancelled result, each time.
        assert [m.role for m in rendered] == [Role.assistant, Role.tool] * 2
        assert rendered[0] is steps[4] and rendered[2] is steps[4]


def test_a_refused_continuation_leaves_the_checked_ids_as_they_were() -> None:
    """Invariant: the ids a build checked are kept for the next build without a copy,
    but a build refused for a repeated id adds none of its ids: the same messages
    without the repeat then pass, and a repeat of a checked id is still refused."""
    kind = GatewayType.openai_chat
    prefix = _prefix(kind)
    issued = IssuedPrefixes(get_gateway(kind), HistoryLimits(), "exclude", lambda _: None)
    issued.add(prefix, CallIdRenamer())
    first = Message(role=Role.assistant, content="one", id="m1")
    second = Message(role=Role.assistant, content="two", id="m2")
    again = Message(role=Role.assistant, content="three", id="m2")
    issued.build(prefix, [first])
    with pytest.raises(DuplicateIdError) as info:
        issued.build(prefix, [first, second, again])
    assert str(info.value) == (
        "continuation[2] repeats id 'm2' of the prefix's turn or of an earlier "
        "continuation message."
    )
    assert len(issued.build(prefix, [first, second])) == len(prefix.items) + 2
    with pytest.raises(DuplicateIdError):
        issued.build(prefix, [first, second, Message(role=Role.user, content="x", id="m1")])


def test_a_build_failing_midway_leaves_no_half_renamed_head(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: a build extending the settled head advances the head's renaming
    state in place, so a build that fails while renaming (after some items advanced
    it) forgets the head: every later build equals the cold computation from the
    prefix's own renaming state, whose renamed ids depend on every call before."""
    kind = GatewayType.openai_chat
    prefix = _prefix(kind)
    renamer = _renamer(kind)  # "c1" is sent already: each later "c1" is renamed
    issued = IssuedPrefixes(get_gateway(kind), HistoryLimits(), "exclude", lambda _: None)
    issued.add(prefix, renamer)
    steps = [call("c1"), result("c1"), call("c1"), result("c1"), call("c1"), result("c1")]
    assert issued.build(prefix, steps[:2]) == _cold(kind, prefix, renamer, steps[:2], "exclude")

    rewrite = callids._REWRITERS[kind]
    armed = [True]

    def failing(item: NativeContent, state: CallIdRenamer) -> NativeContent:
        renamed = rewrite(item, state)  # the state advances, then the rename fails
        if armed[0] and isinstance(item, dict) and item.get("role") == "tool":
            armed[0] = False
            raise RuntimeError("rewriter failed")
        return renamed

    monkeypatch.setitem(callids._REWRITERS, kind, failing)
    with pytest.raises(RuntimeError):
        issued.build(prefix, steps[:4])
    for length in (4, 2, 6, 4):
        assert issued.build(prefix, steps[:length]) == _cold(
            kind, prefix, renamer, steps[:length], "exclude"
        )
    assert [c["id"] for c in issued.build(prefix, steps)[-2]["tool_calls"]] == ["c1_r4"]


@st.composite
def _plain(draw: st.DrawFn) -> list[Message]:
    """Steps that pair as they stand: a call per id, answered in any split and order,
    user and assistant text around them, no assistant message right after another."""
    out: list[Message] = []
    for _ in range(draw(st.integers(0, 4))):
        # A user message between two assistant messages (one directly after another
        # may continue its step: not plain).
        if draw(st.booleans()) or (out and out[-1].role is Role.assistant):
            out.append(user("next"))
        ids = draw(st.lists(st.sampled_from(_IDS), max_size=3, unique=True))
        text = (TextPart(text="thinking aloud"),) if draw(st.booleans()) or not ids else ()
        calls = tuple(ToolCallPart(call_id=i, name="lookup", arguments="{}") for i in ids)
        out.append(Message(role=Role.assistant, content=text + calls))
        order = list(draw(st.permutations(ids)))
        while order:
            cut = draw(st.integers(1, len(order)))
            answers = tuple(
                ToolResultPart(call_id=i, content=(TextPart(text="ok"),)) for i in order[:cut]
            )
            out.append(Message(role=Role.tool, content=answers))
            order = order[cut:]
    return out


@st.composite
def _plain_or_not(draw: st.DrawFn) -> list[Message]:
    """:func:`_plain` steps with, sometimes, one message of ``_message`` put anywhere."""
    out = draw(_plain())
    if draw(st.booleans()):
        out.insert(draw(st.integers(0, len(out))), draw(_message))
    return out


@settings(max_examples=400, deadline=None)
@given(
    messages=_plain_or_not(),
    before=st.lists(_message, max_size=3),
    kind=st.sampled_from(list(GatewayType)),
    policy=st.sampled_from(["exclude", "cancel"]),
)
def test_plain_steps_complete_as_they_stand(
    messages: list[Message], before: list[Message], kind: GatewayType, policy: OpenCallPolicy
) -> None:
    """Invariant: messages ``_plain_steps`` accepts are what ``complete_pairs``
    returns for them (the very objects, either policy, the gateway's step join),
    settle whole (``_settled_count``), and pass ``check_steps`` after any messages
    whose last is no assistant message (what lets build skip those three)."""
    if not _plain_steps(messages):
        return
    completed = complete_pairs(messages, open_calls=policy, join=step_join(get_gateway(kind)))
    assert len(completed) == len(messages)
    assert all(a is b for a, b in zip(completed, messages, strict=True))
    assert _settled_count(messages) == len(messages)
    if before and before[-1].role is Role.assistant:
        before = [*before, user("next")]
    check_steps(messages, "continuation", before=before)
    check_steps(messages, "continuation", before=before, unpaired=True)


@given(messages=_plain())
def test_steps_answered_in_any_split_and_order_are_plain(messages: list[Message]) -> None:
    """The test above is not vacuous: every :func:`_plain` sequence is accepted."""
    assert _plain_steps(messages)
