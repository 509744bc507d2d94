"""OneShotNotice and PinnedNotice on a CoopContext, with every available gateway."""

from __future__ import annotations

import pytest

from tests.context.coop.support import ScriptedArea, assistant, items, native, push, user
from turnloom.areas import OneShotNotice, PinnedNotice
from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    ContextAreaImplementation,
    CoopContext,
    EffectRange,
    GatewayType,
    Message,
    Role,
)
from turnloom.errors import (
    AreaCallbackError,
    InputError,
    InvalidMessageError,
    InvalidTextError,
    StateError,
)


def test_one_shot_notice_renders_once_retires_and_leaves_nothing(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    question = push(context, user("What changed?"))
    notice: ContextAreaImplementation = OneShotNotice("The repository state is authoritative.")
    coop.register(notice)
    coop.render()
    assert items(context) == question + native(
        gateway_type, user("The repository state is authoritative.")
    )
    assert notice.life_state is AreaLifeState.retired
    assert notice.flow_state is AreaFlowState.yielded
    push(context, assistant("Nothing."))
    coop.render()
    assert items(context) == question
    assert coop.areas == ()


def test_one_shot_notice_accepts_text_message_or_messages(gateway_type: GatewayType) -> None:
    dev = Message(role=Role.developer, content="Be brief.")
    assert OneShotNotice("hi", role=Role.developer).messages == (
        Message(role=Role.developer, content="hi"),
    )
    assert OneShotNotice(dev).messages == (dev,)
    pair = [user("one"), user("two")]
    context = Context(gateway_type)
    coop = CoopContext(context)
    coop.register(OneShotNotice(pair))
    coop.render()
    assert items(context) == native(gateway_type, *pair)


def test_one_shot_notice_rejects_bad_content_at_construction() -> None:
    with pytest.raises(InputError, match="empty or whitespace-only"):
        OneShotNotice("  ")
    with pytest.raises(InputError, match="empty sequence"):
        OneShotNotice([])
    with pytest.raises(InputError, match="not an object of type int"):
        OneShotNotice(3)  # type: ignore[arg-type]
    with pytest.raises(InvalidTextError):
        OneShotNotice("lone \ud800 surrogate")
    with pytest.raises(InvalidMessageError, match="unknown role"):
        OneShotNotice(Message(role="wizard", content="x"))  # type: ignore[arg-type]


def test_one_shot_notice_refuses_a_second_render() -> None:
    notice = OneShotNotice("once")
    assert notice.render() == [user("once")]
    assert notice.rendered
    with pytest.raises(StateError, match="second time"):
        notice.render()
    assert notice.promote() == ()


def test_pinned_notice_renders_once_and_never_retires(gateway_type: GatewayType) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    pin = PinnedNotice("You are the airline agent.")
    coop.register(pin)
    for turn in range(3):
        coop.render()
        push(context, user(f"q{turn}"), assistant(f"a{turn}"))
    width = len(native(gateway_type, user("You are the airline agent.")))
    assert coop.effect_range(pin) == EffectRange(0, width - 1)
    assert pin.life_state is AreaLifeState.retain
    assert items(context)[:width] == native(gateway_type, user("You are the airline agent."))
    assert coop.areas == (pin,)


def test_pinned_notice_blocks_collection_of_overlapping_and_earlier_tails(
    gateway_type: GatewayType,
) -> None:
    """The documented cost: the pin's component and everything before it stay."""
    context = Context(gateway_type)
    coop = CoopContext(context)
    before = ScriptedArea("before", script=[[user("b1")]], retire_on_render=True)
    across = ScriptedArea("across", script=[[user("x1")], [user("x2")]])
    pin = PinnedNotice("pinned")
    coop.register(before)
    coop.register(across)
    coop.register(pin)
    coop.render()  # b1 x1 pinned
    coop.render()  # x2: "across" now reaches over the pin
    across.life = AreaLifeState.retired
    after = OneShotNotice("after the pin")
    coop.register(after)
    coop.render()  # "after" renders; "before" and "across" are retired but blocked
    snapshot = items(context)
    coop.render()  # "after" is reclaimed: it lies past the pin's component
    assert items(context) == snapshot[: -len(native(gateway_type, user("after the pin")))]
    assert coop.areas == (before, across, pin)
    assert coop.is_retired(before) and coop.is_retired(across)


def test_one_shot_notice_after_a_pin_is_reclaimed(gateway_type: GatewayType) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    pin = PinnedNotice("pinned")
    coop.register(pin)
    coop.render()
    kept = items(context)
    coop.register(OneShotNotice("transient"))
    coop.render()
    assert items(context) == kept + native(gateway_type, user("transient"))
    coop.render()
    assert items(context) == kept
    assert coop.areas == (pin,)


def test_notices_reject_messages_that_render_to_nothing(gateway_type: GatewayType) -> None:
    """Bad input at the door: a blank message, like blank text, is not a notice."""
    blank = Message(role=Role.user, content="   ")
    assert native(gateway_type, blank) == []
    with pytest.raises(InputError, match=r"OneShotNotice content\[0\] has no content"):
        OneShotNotice(blank)
    with pytest.raises(InputError, match=r"PinnedNotice content\[1\] has no content"):
        PinnedNotice([user("kept"), Message(role=Role.user, content=())])


def test_notices_reject_a_text_role_that_renders_no_text() -> None:
    """A text ``tool`` message carries no tool result: OpenAI gateways drop it silently."""
    with pytest.raises(InputError, match="The role tool given for OneShotNotice content text"):
        OneShotNotice("hi", role=Role.tool)
    with pytest.raises(InputError, match="The role 'wizard' given for"):
        PinnedNotice("hi", role="wizard")  # type: ignore[arg-type]


def test_one_shot_notice_waits_until_every_later_range_has_retired(
    gateway_type: GatewayType,
) -> None:
    """No retained range overlaps the notice, yet a retained range after it keeps it.

    The Collector reclaims whole runs of components from the tail backward only.
    """
    context = Context(gateway_type)
    coop = CoopContext(context)
    notice = OneShotNotice("Prices are in EUR.")
    later = ScriptedArea("later", script=[[user("l1")], [user("l2")]])
    coop.register(notice)
    coop.register(later)
    coop.render()  # notice, l1
    push(context, assistant("ok"))
    coop.render()  # notice retired but followed by retained "later": kept; l2
    assert coop.effect_range(later) == EffectRange(
        len(native(gateway_type, user("Prices are in EUR."))), len(context) - 1
    )
    assert coop.effect_range(notice) == EffectRange(
        0, len(native(gateway_type, user("Prices are in EUR."))) - 1
    )
    assert coop.areas == (notice, later)
    assert items(context) == native(
        gateway_type, user("Prices are in EUR."), user("l1"), assistant("ok"), user("l2")
    )
    later.life = AreaLifeState.retired
    coop.render()
    assert len(coop) == 0
    assert len(context) == 0


def test_pinned_notice_survives_a_render_rolled_back_by_another_area(
    gateway_type: GatewayType,
) -> None:
    """A failure later in the pass rolls the pin's items back; the pin must render again.

    The pin learns that its items were kept from observe(), which a CoopContext
    calls only for an area that owns an EffectRange.
    """
    context = Context(gateway_type)
    coop = CoopContext(context)
    pin = PinnedNotice("You are the airline agent.")
    flaky = ScriptedArea("flaky", script=[[user("f1")]], fail_in="render")
    coop.register(pin)
    coop.register(flaky)
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert len(context) == 0
    flaky.fail_in = None
    coop.render()
    coop.render()
    assert items(context) == native(gateway_type, user("You are the airline agent."), user("f1"))
    width = len(native(gateway_type, user("You are the airline agent.")))
    assert coop.effect_range(pin) == EffectRange(0, width - 1)


def test_one_shot_notice_rolled_back_is_lost_as_documented(gateway_type: GatewayType) -> None:
    """The documented limit: a retired area never renders, so the rolled-back notice is gone.

    The docstring's recipe (rendered, but no EffectRange) detects it.
    """
    context = Context(gateway_type)
    coop = CoopContext(context)
    notice = OneShotNotice("Prices are in EUR.")
    flaky = ScriptedArea("flaky", script=[[user("f1")]], fail_in="render")
    coop.register(notice)
    coop.register(flaky)
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert notice.rendered and coop.effect_range(notice) is None
    flaky.fail_in = None
    coop.render()
    assert notice not in coop
    assert items(context) == native(gateway_type, user("f1"))
