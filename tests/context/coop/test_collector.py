"""The Collector: plan_collection on fixed layouts, and collection inside render()."""

from __future__ import annotations

import pytest

from tests.context.coop.support import ScriptedArea, assistant, items, native, push, user
from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    CollectionPlan,
    Context,
    CoopContext,
    EffectRange,
    GatewayType,
    Message,
    plan_collection,
)
from turnloom.errors import InputError

R = EffectRange
Log = list[tuple[str, str]]


# -- plan_collection on fixed layouts ---------------------------------------------


def test_collector_starts_from_the_range_reaching_furthest_toward_the_tail() -> None:
    """The outer range [0, 10] reaches furthest; starting at [3, 4] would detach from 3."""
    plan = plan_collection([R(0, 10), R(3, 4)], [True, True])
    assert plan == CollectionPlan(start=0, collected=(0, 1), components=1)


def test_collector_follows_overlapping_ranges_backward() -> None:
    ranges = [R(0, 3), R(2, 6), R(5, 9)]
    assert plan_collection(ranges, [True, True, True]) == CollectionPlan(
        start=0, collected=(0, 1, 2), components=1
    )
    # A retained range at the far end of the chain blocks the whole component.
    assert plan_collection(ranges, [False, True, True]).start is None


def test_touching_ranges_overlap() -> None:
    """Closed intervals: [0, 3] and [3, 5] share index 3; [0, 2] and [3, 5] do not."""
    assert plan_collection([R(0, 3), R(3, 5)], [False, True]).start is None
    assert plan_collection([R(0, 2), R(3, 5)], [False, True]) == CollectionPlan(
        start=3, collected=(1,), components=1
    )


def test_component_is_reclaimed_only_when_every_area_in_it_is_retired() -> None:
    """A retained outer range blocks a retired nested one."""
    assert plan_collection([R(0, 9), R(2, 3)], [False, True]).start is None
    assert plan_collection([R(0, 9), R(2, 3)], [True, False]).start is None
    assert plan_collection([R(0, 9), R(2, 3)], [True, True]).start == 0


def test_collection_reclaims_the_longest_run_of_fully_retired_tail_components() -> None:
    ranges = [R(0, 1), R(2, 4), R(3, 5), R(7, 7), R(9, 12), R(10, 11)]
    retired = [False, True, True, True, True, True]
    assert plan_collection(ranges, retired) == CollectionPlan(
        start=2, collected=(1, 2, 3, 4, 5), components=3
    )
    # The run stops at the first component (from the tail) holding a retained area.
    retired[3] = False
    assert plan_collection(ranges, retired) == CollectionPlan(
        start=9, collected=(4, 5), components=1
    )


def test_plan_orders_collected_areas_by_earliest_whatever_the_input_order() -> None:
    assert plan_collection([R(6, 8), R(0, 2), R(3, 4)], [True, True, True]) == CollectionPlan(
        start=0, collected=(1, 2, 0), components=3
    )


def test_plan_of_nothing_is_empty() -> None:
    assert plan_collection([], []) == CollectionPlan(start=None, collected=(), components=0)


def test_plan_rejects_malformed_input() -> None:
    with pytest.raises(InputError, match="2 ranges but 1 retired flags"):
        plan_collection([R(0, 1), R(2, 3)], [True])
    with pytest.raises(InputError, match=r"EffectRange 0 is \[4, 2\]"):
        plan_collection([R(4, 2)], [True])
    with pytest.raises(InputError, match=r"EffectRange 0 is \[-1, 2\]"):
        plan_collection([R(-1, 2)], [True])


def test_effect_range_overlap_and_length() -> None:
    assert R(2, 5).overlaps(R(5, 9)) and R(5, 9).overlaps(R(2, 5))
    assert not R(2, 4).overlaps(R(5, 9))
    assert len(R(2, 5)) == 4


# -- collection inside render() -------------------------------------------------


def nested(kind: GatewayType, log: Log) -> tuple[Context, CoopContext, ScriptedArea, ScriptedArea]:
    """outer and inner render, outer renders again around inner, then inner retires."""
    context = Context(kind)
    coop = CoopContext(context)
    outer = ScriptedArea("outer", log, script=[[user("o1")], [user("o2")]])
    inner = ScriptedArea("inner", log, script=[[user("i1")]])
    coop.register(outer)
    coop.register(inner)
    coop.render()  # o1 i1
    push(context, assistant("model"))
    coop.render()  # o2: outer's range now spans inner's
    inner.life = AreaLifeState.retired
    coop.render()  # inner is retired but overlapped by retained outer: kept
    return context, coop, outer, inner


def test_retained_overlapping_area_blocks_a_retired_nested_one(gateway_type: GatewayType) -> None:
    log: Log = []
    context, coop, outer, inner = nested(gateway_type, log)
    assert list(coop.areas) == [outer, inner]
    assert items(context) == native(
        gateway_type, user("o1"), user("i1"), assistant("model"), user("o2")
    )
    assert "promote" not in [event for _, event in log]
    # Once the outer area retires too, the whole component goes.
    outer.life = AreaLifeState.retired
    coop.render()
    assert coop.areas == ()
    assert len(context) == 0


def test_promote_of_every_collected_area_runs_before_any_gc_prologue(
    gateway_type: GatewayType,
) -> None:
    log: Log = []
    _, coop, outer, _ = nested(gateway_type, log)
    outer.life = AreaLifeState.retired
    log.clear()
    coop.render()
    assert log == [
        ("outer", "promote"),
        ("inner", "promote"),
        ("outer", "gc_prologue"),
        ("inner", "gc_prologue"),
    ]


def test_tail_is_detached_from_component_earliest_with_model_outputs_after_it(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    keep = ScriptedArea("keep", script=[[user("k1")]])
    gone = ScriptedArea("gone", script=[[user("g1")]], retire_on_render=True)
    coop.register(keep)
    coop.register(gone)
    prefix_model = push(context, user("question"))
    coop.render()
    after = push(context, assistant("reply"), user("follow-up"))
    before = items(context)
    start = len(prefix_model) + len(native(gateway_type, user("k1")))
    coop.render()
    report = coop.last_collection
    assert report is not None
    assert report.start == start
    assert list(report.detached) == before[start:]
    assert all(x is y for x, y in zip(report.detached[-len(after) :], after, strict=True))
    assert all(x is y for x, y in zip(items(context), before[:start], strict=True))
    assert len(context) == start
    assert report.removed == (gone,)


def test_promoted_messages_are_appended_after_the_detached_tail(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    first = ScriptedArea("first", script=[[user("f1")]], retire_on_render=True)
    second = ScriptedArea(
        "second",
        script=[[user("s1")]],
        retire_on_render=True,
        promoted=[user("second survives"), user("and more")],
    )
    first.promoted = (user("first survives"),)
    coop.register(first)
    coop.register(second)
    push(context, user("question"))
    coop.render()
    push(context, assistant("reply"))
    coop.render()
    promoted = (user("first survives"), user("second survives"), user("and more"))
    assert items(context) == native(gateway_type, user("question"), *promoted)
    report = coop.last_collection
    assert report is not None
    assert report.promoted == promoted
    assert list(report.promoted_items) == native(gateway_type, *promoted)
    assert report.components == 2
    # Promoted items belong to no area: nothing has a range any more.
    assert coop.areas == ()


def test_collected_areas_are_removed_and_the_cursor_is_repaired(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    a = ScriptedArea("a")  # renders nothing, stays
    b = ScriptedArea("b", script=[[user("b1")], []], flow=AreaFlowState.exclusive)
    c = ScriptedArea("c", script=[[user("c1")]])
    for area in (a, b, c):
        coop.register(area)
    coop.render()  # a (empty), b exclusive
    assert coop.cursor is b
    b.life = AreaLifeState.retired
    coop.render()  # b collected at the safe point; the cursor moves on to c
    assert coop.areas == (a, c)
    assert c.renders == 1
    assert b not in coop
    with pytest.raises(LookupError, match="not registered"):
        coop.effect_range(b)


def test_cursor_keeps_its_area_when_earlier_areas_are_collected(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    a = ScriptedArea("a", script=[[user("a1")]], retire_on_render=True)
    b = ScriptedArea("b", retire_on_render=True)  # never renders anything
    c = ScriptedArea("c", script=[[user("c1")]] * 3, flow=AreaFlowState.exclusive)
    for area in (a, b, c):
        coop.register(area)
    coop.render()  # a1 (retired), b empty (retired), c1 exclusive
    assert coop.cursor is c
    c.flow = AreaFlowState.exclusive
    coop.render()  # b removed (never rendered); a blocked behind retained c
    assert coop.areas == (a, c)
    assert coop.cursor is c


def test_retired_areas_that_never_rendered_are_removed_at_the_next_safe_point(
    gateway_type: GatewayType,
) -> None:
    log: Log = []
    context = Context(gateway_type)
    coop = CoopContext(context)
    stay = ScriptedArea("stay", log, script=[[user("s1")]])
    silent = ScriptedArea("silent", log, retire_on_render=True, promoted=[user("left note")])
    coop.register(stay)
    coop.register(silent)
    coop.render()
    assert list(coop.areas) == [stay, silent]
    assert coop.effect_range(silent) is None
    log.clear()
    before = items(context)
    coop.render()
    assert coop.areas == (stay,)
    assert log[:2] == [("silent", "promote"), ("silent", "gc_prologue")]
    report = coop.last_collection
    assert report is not None
    assert report.start is None and report.detached == ()
    assert items(context) == before + native(gateway_type, user("left note"))


def test_area_retired_at_registration_is_removed_at_the_next_safe_point(
    gateway_type: GatewayType,
) -> None:
    coop = CoopContext(Context(gateway_type))
    area = ScriptedArea("done")
    area.life = AreaLifeState.retired
    coop.register(area)
    assert coop.is_retired(area)
    coop.render()
    assert coop.areas == ()
    assert area.renders == 0


def test_retirement_is_irreversible_for_the_coop_context(gateway_type: GatewayType) -> None:
    a = ScriptedArea("a", script=[[user("a1")], [user("a2")]])
    b = ScriptedArea("b", script=[[user("b1")]] * 3)
    context = Context(gateway_type)
    coop = CoopContext(context)
    coop.register(a)
    coop.register(b)
    coop.render()
    a.life = AreaLifeState.retired
    coop.render()
    a.life = AreaLifeState.retain  # outside the contract: ignored
    coop.render()
    assert coop.is_retired(a)
    assert a.renders == 1


class _Fickle(ScriptedArea):
    """Tries to un-retire and grab the cursor from its GC callbacks (outside the contract)."""

    def promote(self) -> tuple[Message, ...]:
        self.life = AreaLifeState.retain
        self.flow = AreaFlowState.exclusive
        return super().promote()

    def gc_prologue(self) -> None:
        self.life = AreaLifeState.retain
        super().gc_prologue()


def test_state_changes_inside_promote_or_gc_prologue_cannot_cancel_collection(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    fickle = _Fickle("fickle", script=[[user("f1")]], retire_on_render=True)
    coop.register(fickle)
    coop.render()
    coop.render()
    assert coop.areas == ()
    assert len(context) == 0
    assert fickle.log == [("fickle", "render"), ("fickle", "promote"), ("fickle", "gc_prologue")]


def test_plan_rejects_values_that_are_not_effect_ranges_with_a_typed_error() -> None:
    """Bad input at the door: an InputError naming the entry, never AttributeError/TypeError."""
    with pytest.raises(
        InputError, match=r"Range 0 is an object of type tuple, not an EffectRange\."
    ):
        plan_collection([(0, 1)], [True])  # type: ignore[list-item]
    with pytest.raises(InputError, match=r"EffectRange 1 is \['a', 'b'\]"):
        plan_collection([R(0, 1), R("a", "b")], [True, True])  # type: ignore[arg-type]
    with pytest.raises(
        InputError, match="sequences of EffectRange and of bool, not an object of type NoneType"
    ):
        plan_collection(None, None)  # type: ignore[arg-type]


def test_retained_area_nested_in_a_retired_one_blocks_the_component(
    gateway_type: GatewayType,
) -> None:
    """outer spans inner; outer retires first: nothing goes until inner retires too."""
    log: Log = []
    context = Context(gateway_type)
    coop = CoopContext(context)
    outer = ScriptedArea("outer", log, script=[[user("o1")], [user("o2")]])
    inner = ScriptedArea("inner", log, script=[[user("i1")], [], [], [user("i2")]])
    coop.register(outer)
    coop.register(inner)
    coop.render()  # o1 i1
    coop.render()  # o2: outer now spans inner
    outer.life = AreaLifeState.retired
    coop.render()  # outer retired, inner (nested, retained) blocks the component
    assert coop.areas == (outer, inner)
    assert "promote" not in [e for _, e in log]
    coop.render()  # inner renders i2 past outer's end: still one component
    o1, i1, o2, i2 = (len(native(gateway_type, user(t))) for t in ("o1", "i1", "o2", "i2"))
    assert coop.effect_range(outer) == EffectRange(0, o1 + i1 + o2 - 1)
    assert coop.effect_range(inner) == EffectRange(o1, o1 + i1 + o2 + i2 - 1)
    inner.life = AreaLifeState.retired
    coop.render()
    assert len(coop) == 0
    assert len(context) == 0
    report = coop.last_collection
    assert report is not None and report.components == 1
