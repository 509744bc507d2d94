"""SubtaskArea: exclusive across model calls, retires on its predicate, promotes a summary."""

from __future__ import annotations

from typing import Any, cast

import pytest

from tests.context.coop.support import (
    ScriptedArea,
    assistant,
    call,
    items,
    native,
    push,
    result,
    user,
)
from turnloom.areas import OneShotNotice, SubtaskArea
from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    ContextAreaImplementation,
    CoopContext,
    EffectRange,
    Gateway,
    GatewayType,
    Message,
    NativeContent,
    Role,
    ToolCallPart,
    get_gateway,
)
from turnloom.errors import (
    AreaCallbackError,
    InputError,
    InvalidMessageError,
    ProviderRuleError,
    StateError,
)


def states(area: SubtaskArea) -> tuple[AreaLifeState, AreaFlowState]:
    """Read both states (a call, so type checkers do not narrow them across renders)."""
    return area.life_state, area.flow_state


def fare_found(area: SubtaskArea) -> bool:
    return any(m.text.startswith("FARE:") for m in area.routed)


def fare_summary(area: SubtaskArea) -> str:
    final = [m.text for m in area.routed if m.text.startswith("FARE:")][-1]
    return f"Sub-task result: {final}"


def test_subtask_reclaims_its_intermediate_items_and_promotes_the_summary(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    question = push(context, user("Book me the cheapest flight to Oslo."))
    task = SubtaskArea("Find the cheapest fare first.", done=fare_found, summary=fare_summary)
    area: ContextAreaImplementation = task
    coop.register(area)

    coop.render()
    instruction = native(gateway_type, user("Find the cheapest fare first."))
    assert items(context) == question + instruction
    assert coop.cursor is task
    assert states(task) == (AreaLifeState.retain, AreaFlowState.exclusive)
    start = len(question)
    assert coop.effect_range(task) == EffectRange(start, start + len(instruction) - 1)

    # Model call 1: a tool call and its result, routed to the sub-task.
    step = [call("c1", "search_fares"), result("c1", "OSL 120 EUR, 150 EUR", "search_fares")]
    push(context, *step)
    task.route(step)
    coop.render()  # observes, not done: renders nothing, keeps the cursor
    assert list(task.observed) == instruction
    assert items(context) == question + instruction + native(gateway_type, *step)
    assert coop.is_retired(task) is False

    # Model call 2: the answer that completes the sub-task.
    final = assistant("FARE: 120 EUR on the 07:10 departure.")
    push(context, final)
    task.route(final)
    coop.render()  # done: yields and retires; nothing reclaimed before the next safe point
    assert states(task) == (AreaLifeState.retired, AreaFlowState.yielded)
    assert not task.collected

    coop.render()
    summary = user("Sub-task result: FARE: 120 EUR on the 07:10 departure.")
    assert items(context) == question + native(gateway_type, summary)
    assert task.collected and task.routed == () and task not in coop
    report = coop.last_collection
    assert report is not None and report.promoted == (summary,)
    assert report.start == start


def test_subtask_keeps_other_areas_waiting_while_exclusive(gateway_type: GatewayType) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    task = SubtaskArea("Check the baggage policy.", done=fare_found, summary="Policy checked.")
    notice = OneShotNotice("Prices are in EUR.")
    coop.register(task)
    coop.register(notice)
    coop.render()
    push(context, assistant("Looking it up."))
    coop.render()
    assert not notice.rendered
    task.route(assistant("FARE: n/a"))
    push(context, assistant("FARE: n/a"))
    coop.render()  # the sub-task retires in observe; the notice renders in the same pass
    assert notice.rendered
    assert items(context)[-1:] == native(gateway_type, user("Prices are in EUR."))
    coop.render()  # both tail components are retired: one collection reclaims both
    assert items(context) == native(gateway_type, user("Policy checked."))
    assert coop.areas == ()


def test_subtask_predicate_error_is_an_observe_failure_and_rolls_back(
    gateway_type: GatewayType,
) -> None:
    def broken(area: SubtaskArea) -> bool:
        raise ValueError("predicate exploded")

    context = Context(gateway_type)
    coop = CoopContext(context)
    task = SubtaskArea("Do it.", done=broken, summary="done")
    coop.register(task)
    coop.render()
    before = items(context)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (task, "observe")
    assert isinstance(info.value.__cause__, ValueError)
    assert items(context) == before


def test_subtask_summary_callback_producing_nothing_fails_in_promote(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    task = SubtaskArea("Do it.", done=lambda a: True, summary=lambda a: "   ")
    coop.register(task)
    coop.render()
    coop.render()  # retires in observe
    before = items(context)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (task, "promote")
    assert isinstance(info.value.__cause__, InputError)
    assert items(context) == before
    assert task in coop and not task.collected


def test_subtask_summary_may_be_messages() -> None:
    notes = (Message(role=Role.user, content="a"), Message(role=Role.user, content="b"))
    task = SubtaskArea("Do it.", done=lambda a: True, summary=notes)
    assert task.promote() == notes
    assert task.instruction == (Message(role=Role.user, content="Do it."),)


def test_route_rejects_bad_output_and_late_output() -> None:
    task = SubtaskArea("Do it.", done=lambda a: True, summary="done")
    with pytest.raises(InvalidMessageError):
        task.route(Message(role="wizard", content="x"))  # type: ignore[arg-type]
    with pytest.raises(InvalidMessageError):
        task.route([assistant("fine"), Message(role="wizard", content="x")])  # type: ignore[arg-type]
    assert task.routed == ()
    task.observe(())
    assert task.life_state is AreaLifeState.retired
    with pytest.raises(StateError, match="already finished"):
        task.route(assistant("too late"))


def test_subtask_rejects_empty_instruction_or_summary() -> None:
    with pytest.raises(InputError, match="instruction"):
        SubtaskArea("", done=lambda a: True, summary="x")
    with pytest.raises(InputError, match="summary"):
        SubtaskArea("Do it.", done=lambda a: True, summary=[])


def test_subtask_summary_is_produced_once_when_another_area_fails_after_its_collection(
    gateway_type: GatewayType,
) -> None:
    """A rolled-back render must not wedge a finished sub-task.

    Its gc_prologue() drops the routed outputs the summary callback reads; the
    retry reuses the summary instead of calling the callback on an emptied area.
    """
    calls: list[int] = []

    def counted_summary(area: SubtaskArea) -> str:
        calls.append(len(area.routed))
        return fare_summary(area)

    context = Context(gateway_type)
    coop = CoopContext(context)
    earlier = ScriptedArea("earlier", script=[[user("Prices are in EUR.")]])
    task = SubtaskArea("Find the cheapest fare first.", done=fare_found, summary=counted_summary)
    coop.register(earlier)
    coop.register(task)
    coop.render()  # earlier's notice, then the instruction (exclusive)
    final = assistant("FARE: 120 EUR.")
    push(context, final)
    task.route(final)
    coop.render()  # done: retires in observe
    before = items(context)
    earlier.fail_in = "observe"
    with pytest.raises(AreaCallbackError) as info:
        coop.render()  # collects the sub-task, then the earlier area fails
    assert (info.value.area, info.value.phase) == (earlier, "observe")
    assert items(context) == before
    assert task in coop and task.collected and task.routed == ()
    earlier.fail_in = None
    coop.render()
    assert calls == [1]
    assert items(context) == native(
        gateway_type, user("Prices are in EUR."), user("Sub-task result: FARE: 120 EUR.")
    )
    assert coop.areas == (earlier,)


def test_subtask_summary_callback_error_is_a_promote_failure_and_keeps_the_area(
    gateway_type: GatewayType,
) -> None:
    def broken(area: SubtaskArea) -> str:
        raise KeyError("no fare")

    context = Context(gateway_type)
    coop = CoopContext(context)
    task = SubtaskArea("Do it.", done=fare_found, summary=broken)
    coop.register(task)
    coop.render()
    final = assistant("FARE: 99 EUR.")
    push(context, final)
    task.route(final)
    coop.render()  # retires in observe
    before = items(context)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (task, "promote")
    assert isinstance(info.value.__cause__, KeyError)
    assert "raised KeyError in promote" in str(info.value)
    assert items(context) == before
    assert task in coop and coop.is_retired(task)
    assert not task.collected and task.routed == (final,)


def test_subtask_rejects_a_done_predicate_that_is_not_callable() -> None:
    with pytest.raises(InputError, match="done must be callable, not an object of type NoneType"):
        SubtaskArea("Do it.", done=None, summary="x")  # type: ignore[arg-type]


def test_subtask_rejects_a_role_that_cannot_carry_its_text() -> None:
    """The role is checked at construction even when only a callback summary will use it."""
    with pytest.raises(InputError, match="The role 'wizard' given for"):
        SubtaskArea(user("Do it."), done=fare_found, summary=fare_summary, role="wizard")  # type: ignore[arg-type]
    with pytest.raises(InputError, match="The role tool given for SubtaskArea instruction"):
        SubtaskArea("Do it.", done=fare_found, summary="x", role=Role.tool)


def test_subtask_rejects_an_instruction_that_renders_to_nothing(gateway_type: GatewayType) -> None:
    """A blank instruction would create no EffectRange: never observed, exclusive forever."""
    blank = Message(role=Role.user, content=" \n ")
    assert native(gateway_type, blank) == []
    with pytest.raises(InputError, match=r"SubtaskArea instruction\[0\] has no content"):
        SubtaskArea(blank, done=lambda a: True, summary="x")
    with pytest.raises(InputError, match=r"SubtaskArea summary\[1\] has no content"):
        SubtaskArea("Do it.", done=lambda a: True, summary=[user("kept"), blank])


def test_route_rejects_values_that_are_not_messages() -> None:
    task = SubtaskArea("Do it.", done=fare_found, summary="x")
    for value, name in ((None, "NoneType"), (3, "int"), ("FARE: 1", "str")):
        with pytest.raises(InputError, match=f"not an object of type {name}"):
            task.route(value)  # type: ignore[arg-type]
    assert task.routed == ()


class _RefusingGateway:
    """The real gateway, except that it rejects any message calling ``lookup``.

    Stands in for a provider rule the door cannot see, so that an area's render
    fails inside the gateway.
    """

    def __init__(self, kind: GatewayType) -> None:
        self._inner = get_gateway(kind)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)

    def render(self, message: Message) -> list[NativeContent]:
        if any(c.name == "lookup" for c in message.tool_calls):
            raise ProviderRuleError("lookup cannot be carried.")
        return self._inner.render(message)


def test_subtask_renders_its_instruction_again_after_a_rolled_back_render(
    gateway_type: GatewayType,
) -> None:
    """An instruction the gateway rejected is rolled back; the retry must fail loudly again.

    Before, the area believed itself rendered: it returned nothing, never got a
    range, was never observed, and held the cursor forever without an error.
    """
    bad_call = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="s1", name="lookup", arguments="{}"),),
    )
    context = Context(cast(Gateway, _RefusingGateway(gateway_type)))
    coop = CoopContext(context)
    task = SubtaskArea([user("Look it up."), bad_call, result("s1")], done=fare_found, summary="x")
    coop.register(task)
    for _ in range(2):
        with pytest.raises(AreaCallbackError) as info:
            coop.render()
        assert (info.value.area, info.value.phase) == (task, "render")
        assert isinstance(info.value.__cause__, ProviderRuleError)
        assert len(context) == 0
        assert coop.effect_range(task) is None
