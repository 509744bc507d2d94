"""Each holder of messages keeps the door's copy, never the caller's object.

Invariant (DESIGN: turnloom never mutates an object it is handed, and
nothing it keeps is shared with what the caller has): a host that hands a
message to a ``WorkingContext`` (its constructor, ``append``, ``extend``, a
``PrefixContext``'s grounding), to a history's ``keep_state`` or to a
``SubtaskArea`` (its instruction, summary and ``route``), and afterwards
changes every dict and list reachable from that message, changes nothing
the holder reads back or renders: the held values equal a never-mutated
message's, exactly. The caller's message is left as the caller made it by
the door (only the caller's own edits show in it).
"""

from __future__ import annotations

from typing import Any

from tests._mutation import mutate
from turnloom.areas import SubtaskArea
from turnloom.context import (
    GatewayType,
    Message,
    OpaquePart,
    PrefixContext,
    Role,
    TextPart,
    TurnHistory,
    WorkingContext,
    get_gateway,
)

CHAT = get_gateway(GatewayType.openai_chat)


def _render(messages: list[Message] | tuple[Message, ...]) -> list[Any]:
    return [item for message in messages for item in CHAT.render(message)]


def _message(text: str = "hi", role: Role = Role.user) -> Message:
    """A message holding dicts and lists at each level: its extras, a part's, an opaque item."""
    return Message(
        role=role,
        content=(
            TextPart(text=text, extras={"x_t": {"a": [1]}}),
            OpaquePart(gateway="openai_chat", item={"type": "file", "file": {"id": "f1"}}),
        ),
        extras={"x_meta": {"deep": [1]}},
    )


def _rendered(text: str = "hi", role: str = "user") -> dict[str, Any]:
    """``_message(text, role)`` rendered for OpenAI Chat, written out."""
    return {
        "role": role,
        "content": [
            {"type": "text", "text": text, "x_t": {"a": [1]}},
            {"type": "file", "file": {"id": "f1"}},
        ],
        "x_meta": {"deep": [1]},
    }


def _mutated() -> Message:
    """What ``_mutate`` makes of ``_message()``: the caller's object, as the caller left it."""
    message = _message()
    mutate(message)
    return message


# -- WorkingContext ------------------------------------------------------------------------


def test_a_working_contexts_constructor_holds_copies() -> None:
    given = _message()
    context = WorkingContext(messages=[given])
    mutate(given)
    assert given == _mutated()
    assert context.messages == [_message()]
    assert _render(context.assembled()) == [_rendered()]


def test_a_working_contexts_append_and_extend_hold_copies() -> None:
    appended, extended = _message("a"), _message("e")
    context = WorkingContext().append(appended).extend([extended])
    mutate(appended)
    mutate(extended)
    assert context.messages == [_message("a"), _message("e")]
    assert _render(context.assembled()) == [_rendered("a"), _rendered("e")]


def test_a_prefix_contexts_grounding_holds_copies() -> None:
    given = _message("g")
    context = WorkingContext(prefix=PrefixContext(system_prompt="Be brief.", grounding=(given,)))
    mutate(given)
    assert context.prefix.grounding == (_message("g"),)
    assert _render(context.assembled()) == [
        {"role": "system", "content": "Be brief."},
        _rendered("g"),
    ]


# -- TurnHistory.keep_state ----------------------------------------------------------------


def test_kept_state_holds_copies() -> None:
    history = TurnHistory()
    history.commit("t1", [Message(role=Role.user, content="u1")])
    state = _message("state")
    assert history.keep_state("t1", [state])
    mutate(state)
    history.commit("t2", [Message(role=Role.user, content="u2")])
    view = history.view()
    assert view.turn_state("t1") == (_message("state"),)
    assert list(view.render(CHAT, "t2").items) == [
        {"role": "user", "content": "u1"},
        _rendered("state"),
        {"role": "user", "content": "u2"},
    ]


# -- SubtaskArea ---------------------------------------------------------------------------


def test_a_subtask_areas_route_holds_copies() -> None:
    area = SubtaskArea("Find the fare.", done=lambda area: False, summary="Found.")
    routed = _message("FARE: 12", Role.assistant)
    area.route(routed)
    area.route([_message("more", Role.assistant)])
    mutate(routed)
    assert area.routed == (_message("FARE: 12", Role.assistant), _message("more", Role.assistant))
    assert _render(area.routed) == [
        _rendered("FARE: 12", "assistant"),
        _rendered("more", "assistant"),
    ]


def test_a_subtask_areas_instruction_and_summary_hold_copies() -> None:
    instruction, summary = _message("Find the fare."), _message("Found.")
    area = SubtaskArea([instruction], done=lambda area: False, summary=[summary])
    mutate(instruction)
    mutate(summary)
    assert area.instruction == (_message("Find the fare."),)
    assert area.render() == [_message("Find the fare.")]
    assert area.promote() == (_message("Found."),)
