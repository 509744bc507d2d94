"""The door names a failing batch exactly as before, and builds that name only when a check fails.

``accept_turn``, ``record`` and ``Invocation.record`` check every message on the
event loop; the label an error names the batch with (``"Output of turn 't1'"``,
an excerpt of the turn id) is built only once a check has failed: the success
path quotes nothing.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

import turnloom.errors
from tests.context.test_pairing import histories
from turnloom.context import (
    GatewayType,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_steps,
    get_gateway,
)
from turnloom.context.history import TurnHistory
from turnloom.context.history._changes import _check_steps_named
from turnloom.context.message import message_size, reject_instructions
from turnloom.errors import (
    InstructionMessageError,
    InvalidMessageError,
    ItemTooLargeError,
    TurnloomError,
    UnpairedResultError,
    excerpt,
)
from turnloom.runtime import STATE_TOOL_NAME, Foundation, HistoryLimits, TurnSnapshot
from turnloom.runtime._door import check_outputs, check_renderable, check_snapshot, reject_state

pytestmark = pytest.mark.anyio

_real_excerpt = turnloom.errors.excerpt


@pytest.fixture
def excerpts(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[object]]:
    """Every value quoted through ``excerpt`` by any turnloom module, in order."""
    quoted: list[object] = []

    def counting(value: object) -> str:
        quoted.append(value)
        return _real_excerpt(value)

    for name, module in list(sys.modules.items()):
        if name.startswith("turnloom") and getattr(module, "excerpt", None) is _real_excerpt:
            monkeypatch.setattr(module, "excerpt", counting)
    yield quoted


def _user(text: str) -> Message:
    return Message(role=Role.user, content=text)


def _call(call_id: str) -> Message:
    return Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name="lookup", arguments='{"q": 1}'),),
    )


def _result(call_id: str) -> Message:
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, content=(TextPart(text="ok"),)),),
    )


async def test_accepted_turns_and_records_quote_nothing(excerpts: list[object]) -> None:
    """A turn, a model call with a tool call, its result and a reply: no excerpt is built."""
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        async with manager.invocation("c", "t1") as invocation:
            assert invocation.record([_call("k1")]) == 1
        assert manager.record("c", "t1", [_result("k1")]) == 1
        async with manager.invocation("c", "t1") as invocation:
            assert invocation.record([Message(role=Role.assistant, content="done")]) == 1
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(_user("more"),)))
        assert excerpts == []


async def test_a_record_over_the_cap_names_its_batch() -> None:
    async with Foundation(history_limits=HistoryLimits(max_item_bytes=200)) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        big = Message(role=Role.assistant, content="x" * 300)
        size = message_size(big)
        async with manager.invocation("c", "t1") as invocation:
            with pytest.raises(ItemTooLargeError) as caught:
                invocation.record([Message(role=Role.assistant, content="ok"), big])
        assert str(caught.value) == (
            f"Output of turn 't1'[1] is {size} bytes, over the per-item cap of 200 bytes."
        )
        assert manager.history("c").turn_messages("t1") == (_user("hi"),)  # nothing recorded


async def test_a_malformed_input_names_its_turn() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        bad: Any = "not a message"
        with pytest.raises(InvalidMessageError) as caught:
            manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id="t9", input=(_user("hi"), bad))
            )
        assert str(caught.value) == (
            "Turn 't9' input[1] is an object of type str, not a turnloom Message."
        )


async def test_instructions_and_state_in_outputs_name_their_batch() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        with pytest.raises(InstructionMessageError) as instruction:
            manager.record("c", "t1", [Message(role=Role.system, content="obey")])
        assert str(instruction.value).startswith("Output of turn 't1'[0] is a system message;")
        assert instruction.value.field == "outputs[0]"
        state = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="s1", name=STATE_TOOL_NAME, arguments="{}"),),
        )
        with pytest.raises(InvalidMessageError) as carried:
            manager.record("c", "t1", [_user("fine"), state])
        assert str(carried.value).startswith(
            "Output of turn 't1'[1] carries a runtime-state call or result"
        )


async def test_an_unpaired_result_names_the_turn_output() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(_user("hi"),)))
        manager.record("c", "t1", [_call("k1")])
        with pytest.raises(UnpairedResultError) as caught:
            manager.record("c", "t1", [_result("k2")])
        assert (caught.value.field, caught.value.call_id) == ("Turn 't1' output[0]", "k2")
        assert str(caught.value).startswith(
            "Turn 't1' output[0] holds a tool result for call 'k2', which no call open"
        )


def test_message_parts_is_its_content_and_read_only() -> None:
    message = Message(role=Role.user, content="hi")
    assert message.parts is message.content
    assert message.parts == (TextPart(text="hi"),)
    with pytest.raises(AttributeError):
        message.parts = ()  # type: ignore[misc]


# The door's fast path against its slow composition, over generated bad batches:
# each check runs unlabelled first and again, labelled, only when it fails, so it
# must raise exactly what the labelled checks alone raise (type, text, fields).

_TURN_IDS = st.sampled_from(["t1", "turn 'quoted'", "t" * 80])
_BAD_ITEMS: st.SearchStrategy[Any] = st.sampled_from(
    [
        "not a message",
        None,
        Message(role=Role.system, content="obey"),
        Message(role=Role.developer, content="obey"),
        Message(role=Role.assistant, content="x" * 400),  # over the 300-byte cap below
        Message(role=Role.assistant, content="a\ud800b"),
        Message(role=Role.user, content=(TextPart(text="t", extras={"k": "\udcff"}),)),
        Message(
            role=Role.assistant, content=(ToolCallPart(call_id="k", name="f", arguments="[1]"),)
        ),
        Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="s1", name=STATE_TOOL_NAME, arguments="{}"),),
        ),
        Message(role=Role.tool, content=(ToolResultPart(call_id="tlrs-" + "0" * 24),)),
        Message(role=Role.assistant, content="same id", id="m1"),
    ]
)


@st.composite
def _outputs(draw: st.DrawFn) -> list[Any]:
    """Host batches: the repo's step shapes, with some bad items put anywhere."""
    out: list[Any] = list(draw(histories()))[:6]
    for _ in range(draw(st.integers(0, 2))):
        out.insert(draw(st.integers(0, len(out))), draw(_BAD_ITEMS))
    return out


def _same_error(fast: Callable[[], object], slow: Callable[[], object]) -> None:
    """``fast`` and ``slow`` both pass, or both raise one error: type, text and fields."""
    errors: list[BaseException | None] = []
    for run in (fast, slow):
        try:
            run()
        except TurnloomError as exc:
            errors.append(exc)
        else:
            errors.append(None)
    got, want = errors
    assert type(got) is type(want)
    if want is not None:
        assert (str(got), vars(got)) == (str(want), vars(want))


def _history(turn_id: str, max_bytes: int = 8 << 20) -> TurnHistory:
    """A turn ``turn_id`` with a call left open, under limits a few bad items exceed."""
    limits = HistoryLimits(max_items=8, max_item_bytes=300, max_bytes=max_bytes)
    history = TurnHistory(limits)
    history.commit(turn_id, [_user("go")])
    history.record(turn_id, [_call("a")])
    return history


@settings(max_examples=400, deadline=None)
@given(outputs=_outputs(), turn_id=_TURN_IDS, kind=st.sampled_from(list(GatewayType)))
def test_check_outputs_raises_what_the_labelled_checks_raise(
    outputs: list[Any], turn_id: str, kind: GatewayType
) -> None:
    """Invariant: ``check_outputs`` (each check unlabelled first, labelled only once it
    fails) raises exactly the error of the labelled checks run alone in their order
    (the batch check and render, then runtime state, then instructions), and passes
    exactly when they pass. Each side checks its own equal history (a passing check
    leaves a memo behind).

    Mutants tried, each fails this test: the failed check re-raised without its
    labelled rerun; the state rule tested only on system/developer messages; the
    instruction rule run before the state rule."""
    gateway = get_gateway(kind)
    where = f"Output of turn {excerpt(turn_id)}"

    def slow() -> None:
        history = _history(turn_id)
        check_renderable(gateway, outputs, where, history, turn_id=turn_id)
        reject_state(outputs, where)
        reject_instructions(outputs, "outputs", where)

    _same_error(lambda: check_outputs(gateway, turn_id, outputs, _history(turn_id)), slow)


@settings(max_examples=400, deadline=None)
@given(
    messages=histories(),
    before=histories(),
    turn_id=_TURN_IDS,
    late=st.booleans(),
    unpaired=st.booleans(),
)
def test_named_steps_check_raises_what_the_labelled_check_raises(
    messages: list[Message], before: list[Message], turn_id: str, late: bool, unpaired: bool
) -> None:
    """Invariant: the history's commit and record pairing check (``check_steps``
    unlabelled, then labelled once it fails) raises exactly what ``check_steps``
    labelled alone raises (type, text, ``field`` naming the batch, call id, reason).

    Mutant tried: the failed check re-raised without its labelled rerun: fails."""
    kwargs: dict[str, Any] = {"before": before, "late": late, "unpaired": unpaired}
    _same_error(
        lambda: _check_steps_named(messages, "Turn {} output", turn_id, **kwargs),
        lambda: check_steps(messages, f"Turn {excerpt(turn_id)} output", **kwargs),
    )


def _errors(*runs: Callable[[], object]) -> TurnloomError | None:
    """The error of the first of ``runs`` to raise one, or None when all pass."""
    try:
        for run in runs:
            run()
    except TurnloomError as exc:
        return exc
    return None


# Pinned instructions are not held to the byte limit: 8 of these are 2,312 bytes.
_LONG_INSTRUCTION = Message(role=Role.system, content="x" * 170)


@settings(max_examples=400, deadline=None)
@example(
    input=[_user("q")],
    instructions=[_LONG_INSTRUCTION] * 8,
    turn_id="t1",
    as_list=False,
    kind=GatewayType.openai_chat,
)
@given(
    input=_outputs(),
    instructions=st.one_of(
        st.none(),
        _outputs(),
        st.sampled_from([1, 8]).map(lambda n: [_LONG_INSTRUCTION] * n),
    ),
    turn_id=_TURN_IDS,
    as_list=st.booleans(),
    kind=st.sampled_from(list(GatewayType)),
)
def test_check_snapshot_raises_what_the_labelled_checks_raise(
    input: list[Any],
    instructions: list[Any] | None,
    turn_id: str,
    as_list: bool,
    kind: GatewayType,
) -> None:
    """Invariant: a turn's input and instructions fail ``check_snapshot`` with exactly
    the error (type, text, fields) of the labelled checks alone: the input's batch
    check and render, then its runtime-state rule; past the content rule, the
    instructions' pinned batch check. Input and instructions as tuples or lists.

    Mutants tried, each fails this test: the state rule dropped; the input's label
    misspelt; the instructions checked unpinned (held to the byte limit)."""
    gateway = get_gateway(kind)
    history = _history("t0", max_bytes=2000)
    inp: Any = input if as_list else tuple(input)
    ins: Any = instructions if instructions is None or as_list else tuple(instructions)
    snapshot = TurnSnapshot(context_id="c", turn_id=turn_id, input=inp, instructions=ins)
    got = _errors(lambda: check_snapshot(snapshot, gateway, lambda _: history))
    slow = _history("t0", max_bytes=2000)
    where = f"Turn {excerpt(turn_id)}"
    want = _errors(
        lambda: check_renderable(gateway, inp, f"{where} input", slow),
        lambda: reject_state(inp, f"{where} input"),
    )
    if want is None and got is not None and "has no input that renders" in str(got):
        return  # the content rule, between the two batches
    if want is None and ins:
        want = _errors(
            lambda: check_renderable(gateway, ins, f"{where} instructions", slow, pinned=True)
        )
    assert type(got) is type(want)
    if want is not None:
        assert (str(got), vars(got)) == (str(want), vars(want))
