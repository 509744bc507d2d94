"""The area protocol is structural; the seed example runs; register() validates at the door."""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Sequence

import pytest

from tests.context.coop.support import ScriptedArea, gateway_or_skip, native, user
from turnloom.context import EffectRange, NativeContent
from turnloom.context.area import (
    AreaFlowState,
    AreaLifeState,
    ContextAreaImplementation,
)
from turnloom.context.coop import CoopContext
from turnloom.context.gateway import GatewayType
from turnloom.context.message import Message, Role
from turnloom.context.native import Context
from turnloom.errors import DuplicateAreaError, InputError, InvalidAreaError

# -- the seed's minimal example, with only its imports changed ---------------


class OneShotNoticeArea:
    _life_state: AreaLifeState
    _flow_state: AreaFlowState

    _content: str
    _rendered: bool

    def __init__(self, content: str) -> None:
        self._life_state = AreaLifeState.retain
        self._flow_state = AreaFlowState.yielded
        self._content = content
        self._rendered = False

    @property
    def life_state(self) -> AreaLifeState:
        return self._life_state

    @property
    def flow_state(self) -> AreaFlowState:
        return self._flow_state

    def observe(
        self,
        context: Sequence[NativeContent],
    ) -> None:
        _ = context

    def render(self) -> list[Message]:
        if self._rendered:
            raise RuntimeError("OneShotNoticeArea rendered more than once.")

        self._rendered = True
        self._life_state = AreaLifeState.retired
        return [
            Message(
                role=Role.user,
                content=self._content,
            )
        ]

    def promote(self) -> tuple[Message, ...]:
        return ()

    def gc_prologue(self) -> None:
        pass


NOTICE = "Use the repository state as the authoritative source."


def test_seed_one_shot_notice_example_runs_with_only_its_imports_changed() -> None:
    """Seed 000's example, verbatim in behaviour, on the Gemini gateway it names."""
    gateway_or_skip(GatewayType.gemini)
    area: ContextAreaImplementation = OneShotNoticeArea(NOTICE)

    context = Context(GatewayType.gemini)
    coop_context = CoopContext(context)
    coop_context.register(area)

    model_context = coop_context.render()

    assert model_context is context
    assert list(context.snapshot()) == native(GatewayType.gemini, user(NOTICE))
    assert area.life_state is AreaLifeState.retired


def test_seed_one_shot_notice_example_on_every_gateway(gateway_type: GatewayType) -> None:
    """The example renders once through the active gateway, then its tail is reclaimed."""
    area: ContextAreaImplementation = OneShotNoticeArea(NOTICE)
    context = Context(gateway_type)
    coop_context = CoopContext(context)
    coop_context.register(area)

    assert coop_context.render() is context
    assert list(context.snapshot()) == native(gateway_type, user(NOTICE))
    assert coop_context.effect_range(area) is not None

    # The next safe point reclaims the retired notice; nothing is promoted.
    coop_context.render()
    assert len(context) == 0
    assert coop_context.areas == ()
    assert area not in coop_context


# -- structural protocol -----------------------------------------------------


def test_area_protocol_is_structural_without_base_class_or_decorator() -> None:
    """ContextAreaImplementation is a typing.Protocol naming exactly the six seed members."""
    assert typing.Protocol in ContextAreaImplementation.__bases__
    members = {
        name
        for name in vars(ContextAreaImplementation)
        if not name.startswith("_") and name != "register"
    }
    assert members == {"life_state", "flow_state", "observe", "render", "promote", "gc_prologue"}
    # The seed example and the scripted test area inherit from nothing of turnloom.
    assert OneShotNoticeArea.__mro__ == (OneShotNoticeArea, object)
    assert ScriptedArea.__mro__ == (ScriptedArea, object)
    coop = CoopContext(Context(GatewayType.openai_chat))
    coop.register(OneShotNoticeArea(NOTICE))
    assert len(coop) == 1


# -- register() validation -------------------------------------------------------


class _RenderOnly:
    def render(self) -> list[Message]:
        return []


def test_register_rejects_object_missing_protocol_members_naming_them() -> None:
    coop = CoopContext(Context(GatewayType.openai_chat))
    with pytest.raises(InvalidAreaError) as info:
        coop.register(_RenderOnly())  # type: ignore[arg-type]
    assert info.value.missing == ("flow_state", "gc_prologue", "life_state", "observe", "promote")
    assert "flow_state, gc_prologue, life_state, observe, promote" in str(info.value)
    assert isinstance(info.value, InputError)
    assert coop.areas == ()


def test_register_rejects_non_callable_method_member() -> None:
    area = ScriptedArea("a")
    area.promote = "not callable"  # type: ignore[assignment,method-assign]
    coop = CoopContext(Context(GatewayType.openai_chat))
    with pytest.raises(InvalidAreaError) as info:
        coop.register(area)
    assert info.value.missing == ("promote",)
    assert coop.areas == ()


@dataclasses.dataclass
class _ValueArea:
    """A dataclass with eq=True and no hash: unhashable, so not a valid area."""

    text: str
    life_state: AreaLifeState = AreaLifeState.retain
    flow_state: AreaFlowState = AreaFlowState.yielded

    def observe(self, context: Sequence[NativeContent]) -> None:
        del context

    def render(self) -> list[Message]:
        return [user(self.text)]

    def promote(self) -> tuple[Message, ...]:
        return ()

    def gc_prologue(self) -> None:
        pass


@dataclasses.dataclass(frozen=True)
class _FrozenArea:
    """A frozen dataclass hashes by value: two equal instances are still two areas."""

    text: str
    life_state: AreaLifeState = AreaLifeState.retain
    flow_state: AreaFlowState = AreaFlowState.yielded

    def observe(self, context: Sequence[NativeContent]) -> None:
        del context

    def render(self) -> list[Message]:
        return [user(self.text)]

    def promote(self) -> tuple[Message, ...]:
        return ()

    def gc_prologue(self) -> None:
        pass


def test_register_rejects_unhashable_area() -> None:
    coop = CoopContext(Context(GatewayType.openai_chat))
    with pytest.raises(InvalidAreaError) as info:
        coop.register(_ValueArea("x"))
    assert info.value.missing == ()
    assert "unhashable" in str(info.value)
    assert coop.areas == ()


def test_register_rejects_second_registration_of_same_instance() -> None:
    coop = CoopContext(Context(GatewayType.openai_chat))
    area = ScriptedArea("a")
    coop.register(area)
    with pytest.raises(DuplicateAreaError) as info:
        coop.register(area)
    assert "area #1 (ScriptedArea)" in str(info.value)
    assert coop.areas == (area,)


def test_register_tells_equal_areas_apart_by_identity(gateway_type: GatewayType) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    first, second = _FrozenArea("same"), _FrozenArea("same")
    assert first == second and hash(first) == hash(second)
    coop.register(first)
    coop.register(second)
    coop.render()
    assert coop.areas == (first, second)
    assert list(context.snapshot()) == native(gateway_type, user("same"), user("same"))
    width = len(native(gateway_type, user("same")))
    assert coop.effect_range(first) == EffectRange(0, width - 1)
    assert coop.effect_range(second) == EffectRange(width, 2 * width - 1)


class _BadState(OneShotNoticeArea):
    @property
    def life_state(self) -> AreaLifeState:
        return "alive"  # type: ignore[return-value]


def test_register_rejects_state_member_of_wrong_type() -> None:
    coop = CoopContext(Context(GatewayType.openai_chat))
    with pytest.raises(InvalidAreaError) as info:
        coop.register(_BadState(NOTICE))
    assert info.value.missing == ("life_state",)
    assert "'alive'" in str(info.value)
    assert coop.areas == ()


def test_coop_context_rejects_a_non_context() -> None:
    with pytest.raises(InputError, match="wraps a turnloom Context, not an object of type list"):
        CoopContext([])  # type: ignore[arg-type]


class _ObserveRaises(ScriptedArea):
    @property
    def observe(self) -> None:  # type: ignore[override]
        raise RuntimeError("observe is not ready")


class _HashRaises(ScriptedArea):
    def __hash__(self) -> int:
        raise ValueError("no hash today")


def test_register_turns_errors_from_members_or_hash_into_invalid_area_error() -> None:
    """Whatever reading a member or hashing raises, register() answers with a typed error."""
    coop = CoopContext(Context(GatewayType.openai_chat))
    with pytest.raises(InvalidAreaError) as info:
        coop.register(_ObserveRaises("o"))  # type: ignore[arg-type]
    assert info.value.missing == ("observe",)
    assert "Reading observe of the _ObserveRaises area raised RuntimeError" in str(info.value)
    assert isinstance(info.value.__cause__, RuntimeError)
    with pytest.raises(InvalidAreaError) as info:
        coop.register(_HashRaises("h"))
    assert "The _HashRaises area is unhashable" in str(info.value)
    assert isinstance(info.value.__cause__, ValueError)
    assert coop.areas == ()
