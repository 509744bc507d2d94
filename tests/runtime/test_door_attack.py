"""Real host flows against the door's refusal of unpaired tool results.

Each test is a flow a real host produces, with the outcome it must have: Gemini calls
and responses without ids pair by name, whatever text precedes them; a result no late
call can answer (repeated in one input, or recorded again to the turn whose input
answered it) is refused; a routed result answering no routed call is an unpaired
result.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.runtime.helpers import call, result
from turnloom.context import GatewayType, Message, Role, get_gateway
from turnloom.errors import AmbiguousStepError, UnpairedResultError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

ASK = Message(role=Role.user, content="Weather in Paris?")
NEXT = Message(role=Role.user, content="And tomorrow?")

GEMINI_CALL = {
    "role": "model",
    "parts": [
        {"text": "Let me check."},
        {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
    ],
}
GEMINI_RESPONSE = {
    "role": "user",
    "parts": [{"functionResponse": {"name": "get_weather", "response": {"temp": 20}}}],
}


async def _next_input_after(manager: Any, call: Message, response: Message) -> Any:
    """Turn t1 asks, records the model's ``call`` then ``response`` (each taken: the
    record returns 1); turn t2 asks again; return t2's prepared input."""
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,)))
    assert manager.record("c", "t1", [call]) == 1
    assert manager.record("c", "t1", [response]) == 1
    manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(NEXT,)))
    return await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))


async def test_a_gemini_call_without_id_after_text_pairs_with_its_response(
    anyio_backend: str,
) -> None:
    """Invariant: a Gemini exchange parsed by the gemini gateway (a model content with
    text, then a functionCall without id; the user content answering it with a
    functionResponse without id) is recorded and sent whole: ids are optional on Gemini
    and "calls and responses without one are matched by name" (gateway docs).

    Mutant tried: the id counting the content's parts, not its calls of that name (the
    call 'get_weather#1' after the text, the response 'get_weather#0'): this test fails.
    """
    gateway = get_gateway(GatewayType.gemini)
    call, response = gateway.parse_items([GEMINI_CALL, GEMINI_RESPONSE])
    async with Foundation(gateway=GatewayType.gemini) as foundation:
        prepared = await _next_input_after(foundation.manager, call, response)
        assert list(prepared.items) == [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            GEMINI_CALL,
            GEMINI_RESPONSE,
            {"role": "user", "parts": [{"text": "And tomorrow?"}]},
        ]


@pytest.mark.parametrize("order", ["in-call-order", "reversed"])
async def test_gemini_calls_without_ids_of_two_names_pair_by_name(
    anyio_backend: str, order: str
) -> None:
    """Invariant: a model content [text, get_weather, get_time] (no ids) and a response
    content answering both (no ids, in call order or reversed, as a host may list them)
    parse to ids that pair by name, so record takes the responses, the next input holds
    the calls and the responses as given, and its body sends the responses in call
    order.

    Mutant tried: the id counting every id-less call of the content rather than those of
    its name ('get_time#1' against a first response 'get_time#0'): the reversed case
    fails."""
    gateway = get_gateway(GatewayType.gemini)
    calls = {
        "role": "model",
        "parts": [
            {"text": "Checking both."},
            {"functionCall": {"name": "get_weather", "args": {"city": "Paris"}}},
            {"functionCall": {"name": "get_time", "args": {"city": "Paris"}}},
        ],
    }
    weather = {"functionResponse": {"name": "get_weather", "response": {"temp": 20}}}
    time = {"functionResponse": {"name": "get_time", "response": {"time": "10:00"}}}
    answers = [weather, time] if order == "in-call-order" else [time, weather]
    call_message, response = gateway.parse_items([calls, {"role": "user", "parts": answers}])
    async with Foundation(gateway=GatewayType.gemini) as foundation:
        manager = foundation.manager
        prepared = await _next_input_after(manager, call_message, response)
        assert list(prepared.items) == [
            {"role": "user", "parts": [{"text": "Weather in Paris?"}]},
            calls,
            {"role": "user", "parts": answers},
            {"role": "user", "parts": [{"text": "And tomorrow?"}]},
        ]
        # The body sends the responses in call order.
        assert manager.request_body(prepared)["contents"][2] == {
            "role": "user",
            "parts": [weather, time],
        }


def _history(manager: object) -> tuple[object, ...]:
    view = manager.history("c")  # type: ignore[attr-defined]
    return tuple((t, view.turn_messages(t)) for t in view.turn_ids)


@pytest.mark.parametrize("case", ["answers-a-carried-call", "leads-the-input"])
async def test_a_result_repeated_in_one_input_is_refused(anyio_backend: str, case: str) -> None:
    """Invariant: an input holding the same result twice (a host delivering an approval
    twice) is refused at the second copy with UnpairedResultError (field names it,
    call_id is the call's), nothing committed: the second copy can never pair. A late
    call with its id would repeat a call id of the step it joins (refused as
    AmbiguousStepError), so the late-call exception cannot apply to it, and the docs
    list "answered already" among the refused.

    Before the fix both inputs were accepted and the copy held but left out of every
    input. Shapes: t1 made call c1, t2's input is [result c1, result c1]; or t1 made no
    call and t2's input is [result c9, result c9, text] (c9 recorded late to t1
    afterwards pairs the first copy only).

    Mutant tried: check_steps without the window of result ids the late exception let
    pass (the ``elif late and not group`` branch removed): this test fails."""
    async with Foundation(gateway=GatewayType.openai_chat) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,)))
        if case == "answers-a-carried-call":
            manager.record("c", "t1", [call("c1")])
            given: tuple[Message, ...] = (result("c1"), result("c1", "again"))
        else:
            given = (result("c9"), result("c9", "again"), NEXT)
        held = _history(manager)
        statistics = manager.statistics()
        with pytest.raises(UnpairedResultError) as caught:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=given))
        assert (caught.value.field, caught.value.call_id) == (
            "Turn 't2' input[1]",
            given[1].parts[0].call_id,
        )
        assert _history(manager) == held
        assert manager.statistics() == statistics


async def test_a_result_recorded_to_the_turn_whose_input_answered_it_is_refused(
    anyio_backend: str,
) -> None:
    """Invariant: t1 made call c1 and t2's input answered it (an approval); recording
    the same result again to t2 (a host that both commits and records the approval)
    is refused with UnpairedResultError naming "Turn 't2' output[0]" and c1, nothing
    recorded: no late call can answer it (a late call c1 to t1 repeats the call id of
    t1's step).

    Mutant tried: check_steps not counting the turn's own results in the window the
    late-call exception lets pass (accepted, and left out of every input): this test
    fails."""
    async with Foundation(gateway=GatewayType.openai_chat) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,)))
        manager.record("c", "t1", [call("c1")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
        held = _history(manager)
        with pytest.raises(UnpairedResultError) as caught:
            manager.record("c", "t2", [result("c1", "again")])
        assert (caught.value.field, caught.value.call_id) == ("Turn 't2' output[0]", "c1")
        assert _history(manager) == held
        with pytest.raises(AmbiguousStepError):  # why no late call can answer it
            manager.record("c", "t1", [call("c1")])


async def test_a_routed_result_answering_no_routed_call_is_an_unpaired_result(
    anyio_backend: str,
) -> None:
    """Invariant: ``manager.areas.route`` refuses a tool result answering no open routed
    call with the same error the history's door uses for the same fault,
    UnpairedResultError (an InvalidMessageError), field "item", call_id the result's;
    nothing is queued (the next prepare renders the turn alone).

    Mutant tried: answer_routed_calls raising a plain InvalidMessageError for
    orphans (as before): this test fails."""
    async with Foundation(gateway=GatewayType.openai_chat) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,)))
        with pytest.raises(UnpairedResultError) as caught:
            manager.areas.route("c", {"role": "tool", "tool_call_id": "zz", "content": "x"})
        assert (caught.value.field, caught.value.call_id) == ("item", "zz")
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert list(prepared.items) == [{"role": "user", "content": "Weather in Paris?"}]
