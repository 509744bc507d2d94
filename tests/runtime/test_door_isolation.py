"""What a host keeps after handing messages in reaches nothing turnloom holds.

Invariant (DESIGN rule 4, door; "nothing handed in may be shared with what
turnloom keeps"): the door checks a message and holds private copies of its
JSON data (``extras``, ``layout``, opaque items) in a message of its own, never
in the caller's object. A host that, after ``accept_turn``, ``record``,
``Invocation.record`` or an area's construction, appends to or deletes from
any dict or list reachable from the messages it handed in changes no later
``prepare``, ``build`` or ``request_body``: they equal a twin context's fed
never-mutated copies of the same messages, on all four gateways; the host's
objects stay as the host left them (the door sets nothing in them).
"""

from __future__ import annotations

from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests._mutation import mutate
from turnloom.areas import PinnedNotice
from turnloom.context import (
    Message,
    OpaquePart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    TurnHistory,
    get_gateway,
)
from turnloom.context.message import admit_message, check_message
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

GATEWAYS = ("openai_chat", "openai_responses", "anthropic", "gemini")

_json = st.recursive(
    st.none() | st.booleans() | st.integers(-5, 5) | st.text(max_size=3),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=3), inner, max_size=3)
    ),
    max_leaves=6,
)
# Extras always hold one container, so a mutation has something to reach.
_extras = st.one_of(
    st.none(),
    st.fixed_dictionaries(
        {"x_meta": st.fixed_dictionaries({"deep": st.lists(_json, max_size=3)})},
        optional={"x_note": _json},
    ),
)


def _twin(message: Message) -> Message:
    """An equal message sharing nothing with ``message``."""
    return msgspec.json.decode(msgspec.json.encode(message), type=Message)


def _turn(k: int, extras: list[dict[str, Any] | None]) -> tuple[Message, Message, Message]:
    """Turn ``k``'s user input, the model's answer (text and a tool call), the tool's result."""
    user = Message(
        role=Role.user, content=(TextPart(text=f"ask {k}", extras=extras[0]),), extras=extras[1]
    )
    answer = Message(
        role=Role.assistant,
        content=(
            TextPart(text=f"calling {k}", extras=extras[2]),
            ToolCallPart(call_id=f"c{k}", name="look", arguments='{"k": 1}', extras=extras[3]),
        ),
        extras=extras[4],
    )
    result = Message(
        role=Role.tool,
        content=(
            ToolResultPart(
                call_id=f"c{k}",
                content=(TextPart(text=f"found {k}", extras=extras[5]),),
                extras=extras[6],
            ),
        ),
    )
    return user, answer, result


async def _run(gateway: str, turns: list[list[dict[str, Any] | None]]) -> None:
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        system = Message(role=Role.system, content="Be brief.")
        for k, extras in enumerate(turns):
            mine = _turn(k, extras)
            theirs = tuple(_twin(m) for m in mine)
            outputs = []
            for context, (user, answer, result) in (("host", mine), ("twin", theirs)):
                turn_id = f"t{k}"
                manager.accept_turn(
                    TurnSnapshot(
                        context_id=context,
                        turn_id=turn_id,
                        input=(user,),
                        instructions=(system,) if k == 0 else None,
                    )
                )
                if context == "host":
                    mutate(user)
                prefix = await manager.prepare(
                    ContextPrepareRequest(context_id=context, turn_id=turn_id)
                )
                async with manager.invocation(context, turn_id) as invocation:
                    invocation.record([answer])
                if context == "host":
                    mutate(answer)
                manager.record(context, turn_id, [result])
                if context == "host":
                    mutate(result)
                outputs.append(
                    (
                        prefix.items,
                        manager.build(prefix, []),
                        manager.request_body(prefix, recorded=True, fields={"model": "m"}),
                    )
                )
            assert outputs[0] == outputs[1], k
        final = [
            await manager.prepare(ContextPrepareRequest(context_id=c, turn_id=f"t{len(turns) - 1}"))
            for c in ("host", "twin")
        ]
        assert final[0].items == final[1].items
        assert manager.request_body(final[0], recorded=True) == manager.request_body(
            final[1], recorded=True
        )


@pytest.mark.parametrize("gateway", GATEWAYS)
@settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(turns=st.lists(st.lists(_extras, min_size=7, max_size=7), min_size=1, max_size=3))
async def test_mutating_what_the_host_handed_in_changes_no_later_input(
    gateway: str, turns: list[list[dict[str, Any] | None]]
) -> None:
    """Invariant: after each accept_turn, Invocation.record and record the host mutates
    every dict and list of the messages it handed in; every prepare, build and request
    body equals a twin context's fed never-mutated copies."""
    await _run(gateway, turns)


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_a_recorded_answers_extras_mutated_deep_stay_out_of_the_next_input(
    gateway: str,
) -> None:
    """The bug this file guards: ``extras["x_meta"]["deep"].append("MUT")`` on a recorded
    message reached the history's copy; now the next input carries no "MUT"."""
    extras = {"x_meta": {"deep": [1]}}
    await _run(gateway, [[extras, extras, None, None, None, None, None]])
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        user = Message(role=Role.user, content="hi", extras={"x_meta": {"deep": [1]}})
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user,)))
        user.extras["x_meta"]["deep"].append("MUT")  # type: ignore[index]
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        body = manager.request_body(prefix)
        assert b"MUT" not in msgspec.json.encode(body)
        assert b"MUT" not in msgspec.json.encode(prefix.items)
        assert user.extras == {"x_meta": {"deep": [1, "MUT"]}}  # the host's own, as it left it


def test_the_door_sets_nothing_in_the_callers_message() -> None:
    """admit_message leaves the caller's objects as they were: the same extras and
    layout objects, a role given as a str still a str; the held message is another
    object holding equal copies. A message holding nothing mutable is held as it is."""
    extras = {"x_meta": {"deep": [1]}}
    part_extras = {"x_part": [1]}
    item = {"type": "document", "source": {"type": "text", "media_type": "text/plain", "data": "d"}}
    message = Message(
        role="user",  # type: ignore[arg-type]
        content=(
            TextPart(text="hi", extras=part_extras),
            OpaquePart(gateway="anthropic", item=item),
        ),
        extras=extras,
    )
    held, size = admit_message(message)
    assert size == check_message(_twin(message))
    assert message.extras is extras and message.parts[0].extras is part_extras  # type: ignore[union-attr]
    assert message.parts[1].item is item  # type: ignore[union-attr]
    assert type(message.role) is str
    assert held is not message and held.role is Role.user
    assert held.extras == extras and held.extras is not extras
    assert held.extras["x_meta"] is not extras["x_meta"]
    assert held.parts[0].extras == part_extras and held.parts[0].extras is not part_extras  # type: ignore[union-attr]
    assert held.parts[1].item == item and held.parts[1].item is not item  # type: ignore[union-attr]
    plain = Message(role=Role.user, content=(TextPart(text="hi"),))
    assert admit_message(plain)[0] is plain


def test_a_tool_results_inner_parts_are_held_as_copies() -> None:
    """A tool result whose inner text part carries extras is held as a new result
    holding a new text part; the caller's result and its inner part keep their own."""
    inner = {"x_inner": [1]}
    result = ToolResultPart(call_id="c1", content=(TextPart(text="r", extras=inner),))
    message = Message(role=Role.tool, content=(result,))
    held, _ = admit_message(message)
    held_result = held.parts[0]
    assert held_result is not result and result.content[0].extras is inner  # type: ignore[union-attr]
    assert held_result.content[0].extras == inner  # type: ignore[union-attr]
    assert held_result.content[0].extras is not inner  # type: ignore[union-attr]


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_a_context_level_history_holds_its_own_copies(gateway: str) -> None:
    """TurnHistory (without the runtime): commit and record, then mutate the handed-in
    messages; the history renders as a twin fed copies does."""
    extras = [{"x_meta": {"deep": [k]}} for k in range(7)]
    renders = []
    for mutated in (True, False):
        history = TurnHistory()
        user, answer, result = _turn(
            0, [msgspec.json.decode(msgspec.json.encode(e)) for e in extras]
        )
        history.commit("t0", [user])
        history.record("t0", [answer, result])
        history.commit("t1", [Message(role=Role.user, content="next")])
        if mutated:
            for message in (user, answer, result):
                mutate(message)
        renders.append(list(history.view().render(get_gateway(gateway), "t1").items))
    assert renders[0] == renders[1]


async def test_an_areas_content_is_held_as_copies() -> None:
    """An area's Message content mutated after the area was built renders as given."""
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        bodies = []
        for context, mutated in (("host", True), ("twin", False)):
            note = Message(role=Role.user, content="remember", extras={"x_meta": {"deep": [1]}})
            manager.accept_turn(
                TurnSnapshot(
                    context_id=context, turn_id="t1", input=(Message(role=Role.user, content="hi"),)
                )
            )
            manager.areas.attach(context, PinnedNotice(note))
            if mutated:
                mutate(note)
            prefix = await manager.prepare(ContextPrepareRequest(context_id=context, turn_id="t1"))
            bodies.append(prefix.items)
        assert bodies[0] == bodies[1]
        assert b"MUT" not in msgspec.json.encode(bodies[0])


def test_a_part_given_twice_and_a_result_leaf_given_twice_are_held_as_copies() -> None:
    """One part object at two places of a message (and one leaf twice in a tool result):
    each place holds a copy, none the caller's object, and the held message encodes as
    the caller's does."""
    text = TextPart(text="t", extras={"x_meta": [1]})
    leaf = TextPart(text="r", extras={"x_leaf": [2]})
    result = ToolResultPart(call_id="c1", content=(leaf, leaf))
    for message in (
        Message(role=Role.user, content=(text, text)),
        Message(role=Role.tool, content=(result,)),
    ):
        held, size = admit_message(message)
        assert msgspec.json.encode(held) == msgspec.json.encode(message)
        assert size == len(msgspec.json.encode(message))
        flat = [p for part in held.parts for p in (part, *getattr(part, "content", ()))]
        assert all(p is not text and p is not leaf and p is not result for p in flat)
    assert text.extras == {"x_meta": [1]} and leaf.extras == {"x_leaf": [2]}


def test_a_message_subclass_is_held_as_its_own_class() -> None:
    """A Message subclass with extras is held as a copy of its own class, encoding equal."""

    class Tagged(Message, frozen=True, gc=False):
        pass

    message = Tagged(role=Role.user, content="hi", extras={"x_meta": {"a": 1}})
    held, _ = admit_message(message)
    assert type(held) is Tagged and held is not message
    assert msgspec.json.encode(held) == msgspec.json.encode(message)


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_a_build_continuation_mutated_between_builds_renders_as_first_checked(
    gateway: str,
) -> None:
    """A continuation the host mutates after a build: the next builds of the same objects
    (again, and extended by a message) equal a twin context's builds of never-mutated
    copies, and carry no "MUT"; the host's message keeps its own extras object."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        builds = []
        for context, mutated in (("host", True), ("twin", False)):
            manager.accept_turn(
                TurnSnapshot(
                    context_id=context,
                    turn_id="t1",
                    input=(Message(role=Role.user, content="hi"),),
                )
            )
            prefix = await manager.prepare(ContextPrepareRequest(context_id=context, turn_id="t1"))
            _, answer, result = _turn(1, [{"x_meta": {"deep": [k]}} for k in range(7)])
            extras = answer.extras
            first = manager.build(prefix, [answer, result])
            if mutated:
                for message in (answer, result):
                    mutate(message)
            again = manager.build(prefix, [answer, result])
            longer = manager.build(
                prefix, [answer, result, Message(role=Role.assistant, content="ok")]
            )
            assert answer.extras is extras
            builds.append((first, again, longer))
        assert builds[0] == builds[1]
        assert b"MUT" not in msgspec.json.encode(builds[0])
