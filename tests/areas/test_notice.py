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
from turnloom.errors import InputError, InvalidMessageError, InvalidTextError, StateError


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
    with pytest.raises(InputError, match="not int"):
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
    assert len(context) > len(kept)
    coop.render()
    assert items(context) == kept
