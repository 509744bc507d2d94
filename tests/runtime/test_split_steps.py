"""A model step the host split over several messages keeps every call and result.

Invariant (issue 25, sections 1 and 2): pairing is by call id within a step,
however the host split the step into messages (one assistant message per
parallel call, as LiteLLM, Vercel AI and the OpenAI Agents SDK store them;
OpenAI Responses output parsed one item at a time), on every gateway; a split
that cannot be paired without guessing is refused at the door with
``AmbiguousStepError`` and changes nothing.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime.helpers import call, result, user
from turnloom.context import (
    GatewayType,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    get_gateway,
)
from turnloom.errors import AmbiguousStepError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

SPLIT = [
    call("a"),
    call("b"),
    call("c"),
    result("a", "ra"),
    result("b", "rb"),
    result("c", "rc"),
]


def _turn(turn_id: str, *messages: Message) -> TurnSnapshot:
    return TurnSnapshot(context_id="c", turn_id=turn_id, input=messages or (user(turn_id),))


async def _next_body(manager: ContextManager, turn_id: str = "t2") -> dict[str, Any]:
    """The request body of the next prepared input (``turn_id`` committed first)."""
    manager.accept_turn(_turn(turn_id, user("next")))
    prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=turn_id))
    body = manager.gateway.request_body(prefix.items)
    assert manager.gateway.validate(body[manager.gateway.items_field]) == []
    return body


def _chat_call(call_id: str) -> dict[str, Any]:
    return {
        "id": call_id,
        "type": "function",
        "function": {"name": "lookup", "arguments": "{}"},
    }


def _anthropic_result(call_id: str, text: str) -> dict[str, Any]:
    return {
        "type": "tool_result",
        "tool_use_id": call_id,
        "content": [{"type": "text", "text": text}],
        "is_error": False,
    }


def _gemini_response(call_id: str, text: str) -> dict[str, Any]:
    return {"functionResponse": {"id": call_id, "name": "lookup", "response": {"output": text}}}


SPLIT_BODIES: dict[str, dict[str, Any]] = {
    "openai_chat": {
        "messages": [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": None, "tool_calls": [_chat_call(i) for i in "abc"]},
            {"role": "tool", "tool_call_id": "a", "content": "ra"},
            {"role": "tool", "tool_call_id": "b", "content": "rb"},
            {"role": "tool", "tool_call_id": "c", "content": "rc"},
            {"role": "user", "content": "next"},
        ]
    },
    "openai_responses": {
        "input": [
            {"role": "user", "content": "q"},
            *(
                {"type": "function_call", "call_id": i, "name": "lookup", "arguments": "{}"}
                for i in "abc"
            ),
            *({"type": "function_call_output", "call_id": i, "output": f"r{i}"} for i in "abc"),
            {"role": "user", "content": "next"},
        ]
    },
    "anthropic": {
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "q"}]},
            {
                "role": "assistant",
                "content": [
                    {"type": "tool_use", "id": i, "name": "lookup", "input": {}} for i in "abc"
                ],
            },
            {
                "role": "user",
                "content": [
                    *(_anthropic_result(i, f"r{i}") for i in "abc"),
                    {"type": "text", "text": "next"},
                ],
            },
        ]
    },
    "gemini": {
        "contents": [
            {"role": "user", "parts": [{"text": "q"}]},
            {
                "role": "model",
                "parts": [{"functionCall": {"id": i, "name": "lookup", "args": {}}} for i in "abc"],
            },
            {"role": "user", "parts": [_gemini_response(i, f"r{i}") for i in "abc"]},
            {"role": "user", "parts": [{"text": "next"}]},
        ]
    },
}


@pytest.mark.parametrize("kind", list(SPLIT_BODIES))
async def test_a_step_split_one_message_per_call_keeps_every_call_and_result(kind: str) -> None:
    """The issue's repro: three calls, one assistant message each, then three results."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        assert manager.record("c", "t1", SPLIT) == 6
        assert await _next_body(manager) == SPLIT_BODIES[kind]


@pytest.mark.parametrize("kind", list(SPLIT_BODIES))
async def test_results_out_of_call_order_and_in_the_next_record_keep_every_pair(
    kind: str,
) -> None:
    """Results recorded later, out of call order: the same pairs (Gemini: in call order)."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", SPLIT[:2])
        manager.record("c", "t1", [SPLIT[2]])
        manager.record("c", "t1", [SPLIT[5], SPLIT[3], SPLIT[4]])
        body = await _next_body(manager)
    want = SPLIT_BODIES[kind]
    if kind == "openai_chat":
        messages = want["messages"]
        want = {"messages": [*messages[:2], messages[4], messages[2], messages[3], messages[5]]}
    elif kind == "openai_responses":
        items = want["input"]
        want = {"input": [*items[:4], items[6], items[4], items[5], items[7]]}
    elif kind == "anthropic":
        turn = want["messages"][2]["content"]
        results = {"role": "user", "content": [turn[2], turn[0], turn[1], turn[3]]}
        want = {"messages": [*want["messages"][:2], results]}
    assert body == want


@pytest.mark.parametrize("kind", list(SPLIT_BODIES))
async def test_split_calls_answered_by_the_next_turns_input_keep_every_pair(kind: str) -> None:
    """Calls recorded in t1, their results the input of t2 (an approval)."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", SPLIT[:3])
        manager.accept_turn(_turn("t2", *SPLIT[3:]))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        body = manager.gateway.request_body(prefix.items)
    want = SPLIT_BODIES[kind]
    field = manager.gateway.items_field
    if kind == "anthropic":
        last = want["messages"][2]
        want = {"messages": [*want["messages"][:2], {**last, "content": last["content"][:3]}]}
    else:
        want = {field: want[field][:-1]}
    assert body == want


async def test_chat_joins_the_texts_before_each_split_call_into_one_message() -> None:
    """Text before the calls of each split message: one Chat message, texts in order."""
    first = Message(
        role=Role.assistant,
        content=(TextPart(text="Checking a."), ToolCallPart(call_id="a", name="lookup")),
    )
    second = Message(
        role=Role.assistant,
        content=(TextPart(text="And b."), ToolCallPart(call_id="b", name="lookup")),
    )
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", [first, second, result("a", "ra"), result("b", "rb")])
        body = await _next_body(manager)
    assert body["messages"][1:4] == [
        {
            "role": "assistant",
            "content": [
                {"type": "text", "text": "Checking a."},
                {"type": "text", "text": "And b."},
            ],
            "tool_calls": [_chat_call("a"), _chat_call("b")],
        },
        {"role": "tool", "tool_call_id": "a", "content": "ra"},
        {"role": "tool", "tool_call_id": "b", "content": "rb"},
    ]


async def test_build_joins_a_split_step_of_the_continuation() -> None:
    """The continuation pairs as history does: Chat gets one assistant message."""
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        items = manager.build(prefix, SPLIT[:2])  # no results yet: both calls left out
        assert items == ({"role": "user", "content": "q"},)
        items = manager.build(prefix, [*SPLIT[:2], SPLIT[4], SPLIT[3]])
    assert list(items) == [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": None, "tool_calls": [_chat_call("a"), _chat_call("b")]},
        {"role": "tool", "tool_call_id": "b", "content": "rb"},
        {"role": "tool", "tool_call_id": "a", "content": "ra"},
    ]


async def test_a_left_out_signed_first_call_passes_its_signature_to_the_next_message() -> None:
    """Gemini signs a step on its first call; left out, the next kept call is signed."""
    signed = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="a", name="lookup", extras={"thoughtSignature": "U0lH"}),),
    )
    async with Foundation(gateway="gemini") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", [signed, call("b"), result("b", "rb")])
        body = await _next_body(manager)
    assert body["contents"][1:3] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": "b", "name": "lookup", "args": {}},
                    "thoughtSignature": "U0lH",
                }
            ],
        },
        {"role": "user", "parts": [_gemini_response("b", "rb")]},
    ]


def _text_then(call_id: str, text: str = "done") -> Message:
    return Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id=call_id, name="lookup"), TextPart(text=text)),
    )


AMBIGUOUS = [
    # a result "a" would answer two calls
    ([call("a"), call("a")], 1, "a", "duplicate_call_id"),
    ([call("a"), call("b"), call("a")], 2, "a", "duplicate_call_id"),
    (
        [_text_then("a"), Message(role=Role.assistant, content="so"), call("a")],
        2,
        "a",
        "duplicate_call_id",
    ),
]


@pytest.mark.parametrize(("outputs", "index", "call_id", "reason"), AMBIGUOUS)
async def test_a_split_that_cannot_be_paired_without_guessing_is_refused_at_record(
    outputs: list[Message], index: int, call_id: str, reason: str
) -> None:
    """Refused with the message's index and call id; nothing recorded."""
    async with Foundation(gateway="openai_chat") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        before = manager.history("c").turn_messages("t1")
        with pytest.raises(AmbiguousStepError) as caught:
            manager.record("c", "t1", outputs)
        assert manager.history("c").turn_messages("t1") == before
    error = caught.value
    assert (error.field, error.call_id, error.reason) == (
        f"Turn 't1' output[{index}]",
        call_id,
        reason,
    )
    assert str(error).startswith(f"Turn 't1' output[{index}] ")


async def test_a_refused_split_names_its_index_across_records_and_in_the_input() -> None:
    """The step a record continues is the turn's trailing assistant messages; a turn
    never starts by continuing the step the turn before it ends with."""
    async with Foundation(gateway="anthropic") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", [_text_then("a")])
        with pytest.raises(AmbiguousStepError) as caught:
            manager.record("c", "t1", [call("b"), call("a")])
        assert (caught.value.field, caught.value.call_id) == ("Turn 't1' output[1]", "a")
        with pytest.raises(AmbiguousStepError) as caught:
            manager.record("c", "t1", [result("a"), call("b"), call("b")])
        assert caught.value.field == "Turn 't1' output[2]"
        assert len(manager.history("c").turn_messages("t1")) == 2
        with pytest.raises(AmbiguousStepError) as caught:
            manager.accept_turn(_turn("t2", call("d"), result("d")))
        assert (caught.value.field, caught.value.reason) == ("Turn 't2' input[0]", "across_turns")
        with pytest.raises(AmbiguousStepError) as caught:
            manager.accept_turn(_turn("t2", user("x"), call("d"), call("d")))
        assert caught.value.field == "Turn 't2' input[2]"
        assert manager.history("c").turn_ids == ("t1",)
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        with pytest.raises(AmbiguousStepError) as caught:
            manager.build(prefix, [_text_then("e"), call("f"), call("e")])
        assert caught.value.field == "continuation[2]"


@pytest.mark.parametrize("kind", list(SPLIT_BODIES))
async def test_text_between_split_calls_keeps_the_step_whole(kind: str) -> None:
    """[call a, text], [call b], results: one step (no response follows an open call)."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", [_text_then("a"), call("b"), result("b"), result("a")])
        body = await _next_body(manager)
    text = str(body)
    assert all(token in text for token in ("'a'", "'b'", "'done'"))
    if kind == "openai_chat":
        assert body["messages"][1] == {
            "role": "assistant",
            "content": "done",
            "tool_calls": [_chat_call("a"), _chat_call("b")],
        }


# -- OpenAI Responses output parsed one item at a time ------------------------------

RESPONSES_OUTPUT: list[dict[str, Any]] = [
    {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "enc1"},
    {
        "type": "message",
        "id": "msg_1",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": "Checking.", "annotations": []}],
    },
    *(
        {
            "type": "function_call",
            "id": f"fc_{i}",
            "call_id": f"call_{i}",
            "name": "lookup",
            "arguments": f'{{"n":{i}}}',
            "status": "completed",
        }
        for i in (1, 2, 3)
    ),
]
RESPONSES_RESULTS = [
    {"type": "function_call_output", "call_id": f"call_{i}", "output": f"r{i}"} for i in (1, 2, 3)
]
RESPONSES_NEXT_INPUT = [
    {"role": "user", "content": "q"},
    RESPONSES_OUTPUT[0],
    RESPONSES_OUTPUT[1],
    *(
        {
            "type": "function_call",
            "call_id": f"call_{i}",
            "name": "lookup",
            "arguments": f'{{"n":{i}}}',
            "id": f"fc_{i}",
            "status": "completed",
        }
        for i in (1, 2, 3)
    ),
    *RESPONSES_RESULTS,
    {"role": "user", "content": "next"},
]


@pytest.mark.parametrize("how", ["parse_items", "parse", "parse, one record per item"])
async def test_responses_output_parsed_item_by_item_gives_the_parse_items_input(
    how: str,
) -> None:
    """reasoning rs_1, message msg_1, fc_1..3 and their outputs: the same next input."""
    gateway = get_gateway(GatewayType.openai_responses)
    items = [*RESPONSES_OUTPUT, *RESPONSES_RESULTS]
    async with Foundation(gateway="openai_responses") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        if how == "parse_items":
            manager.record("c", "t1", gateway.parse_items(items))
        elif how == "parse":
            manager.record("c", "t1", [gateway.parse(item) for item in items])
        else:
            for item in items:
                manager.record("c", "t1", [gateway.parse(item)])
        body = await _next_body(manager)
    assert body == {"input": RESPONSES_NEXT_INPUT}


async def test_responses_items_with_a_message_between_calls_pair_as_parse_items_does() -> None:
    """fc_1, a message, fc_2 and their outputs: one by one, the parse_items input."""
    gateway = get_gateway(GatewayType.openai_responses)
    items = [RESPONSES_OUTPUT[2], RESPONSES_OUTPUT[1], RESPONSES_OUTPUT[3], *RESPONSES_RESULTS[:2]]
    bodies = []
    for parsed in (gateway.parse_items(items), [gateway.parse(item) for item in items]):
        async with Foundation(gateway="openai_responses") as foundation:
            manager = foundation.manager
            manager.accept_turn(_turn("t1", user("q")))
            manager.record("c", "t1", parsed)
            bodies.append(await _next_body(manager))
    assert bodies[0] == bodies[1]
    assert bodies[0]["input"][1:6] == [
        RESPONSES_NEXT_INPUT[3],
        RESPONSES_OUTPUT[1],
        RESPONSES_NEXT_INPUT[4],
        *RESPONSES_RESULTS[:2],
    ]


def _gemini_call(call_id: str, signature: str | None = None) -> dict[str, Any]:
    part: dict[str, Any] = {"functionCall": {"id": call_id, "name": "lookup", "args": {}}}
    if signature is not None:
        part["thoughtSignature"] = signature
    return {"role": "model", "parts": [part]}


@pytest.mark.parametrize("signed", [0, 1])
async def test_a_gemini_split_step_signed_on_any_call_goes_out_signed_on_its_first_call(
    signed: int,
) -> None:
    """Gemini 3 rejects a current-turn step whose first ``functionCall`` is unsigned.

    A host that splits a step and records its calls in another order (here the
    signed call second) must still get a step signed on its first call; the
    signature moves there, once (validate() clean on the prepared input).
    """
    gateway = get_gateway(GatewayType.gemini)
    natives = [_gemini_call("a", "U0lH" if signed == 0 else None)]
    natives.append(_gemini_call("b", "U0lH" if signed == 1 else None))
    answers = [{"role": "user", "parts": [_gemini_response(i, f"r{i}")]} for i in ("b", "a")]
    async with Foundation(gateway="gemini") as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        manager.record("c", "t1", [gateway.parse(n) for n in natives])
        manager.accept_turn(_turn("t2", *(gateway.parse(n) for n in answers)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        body = gateway.request_body(prefix.items)
    assert gateway.validate(body["contents"]) == []
    assert body["contents"][1:] == [
        {
            "role": "model",
            "parts": [
                {
                    "functionCall": {"id": "a", "name": "lookup", "args": {}},
                    "thoughtSignature": "U0lH",
                },
                {"functionCall": {"id": "b", "name": "lookup", "args": {}}},
            ],
        },
        {"role": "user", "parts": [_gemini_response(i, f"r{i}") for i in "ab"]},
    ]


@pytest.mark.parametrize("kind", list(SPLIT_BODIES))
async def test_a_result_for_a_call_its_step_closed_is_refused_not_dropped(kind: str) -> None:
    """A host running tools as their calls stream records a result before the step's
    last call: ``[a, b, result a]`` then ``[c, result b, result c]``. Call ``c``
    after a result starts another step and closes ``b`` unanswered, so ``result b``
    would answer nothing and ``b`` be left out, silently: refused, nothing changed;
    the message says why (the step ended before the result).

    Mutant tried: the message's "ended before it" as a93bd72 left it ("whose model
    step stale before it", a rename of ``late`` that reached the text): this test
    fails."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(_turn("t1", user("q")))
        assert manager.record("c", "t1", [call("a"), call("b"), result("a", "ra")]) == 3
        with pytest.raises(AmbiguousStepError) as caught:
            manager.record("c", "t1", [call("c"), result("b", "rb"), result("c", "rc")])
        assert (caught.value.field, caught.value.call_id, caught.value.reason) == (
            "Turn 't1' output[1]",
            "b",
            "closed_call",
        )
        assert str(caught.value).startswith(
            "Turn 't1' output[1] answers call 'b', whose model step ended before it "
            "(an assistant message after a result of that step starts another)"
        )
        assert len(manager.history("c").turn_messages("t1")) == 4
        with pytest.raises(AmbiguousStepError) as caught:
            manager.accept_turn(
                _turn("t2", call("d"), call("e"), result("d"), call("f"), result("e"))
            )
        assert (caught.value.field, caught.value.call_id) == ("Turn 't2' input[4]", "e")
        assert manager.history("c").turn_ids == ("t1",)
