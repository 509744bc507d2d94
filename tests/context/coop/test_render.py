"""The unfold pass of CoopContext.render(), one test per seed 000 rule."""

from __future__ import annotations

import pytest

from tests.context.coop.support import (
    ScriptedArea,
    assistant,
    items,
    native,
    push,
    user,
)
from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    CoopContext,
    EffectRange,
    GatewayType,
)

Log = list[tuple[str, str]]


def setup(kind: GatewayType, *areas: ScriptedArea) -> tuple[Context, CoopContext]:
    context = Context(kind)
    coop = CoopContext(context)
    for area in areas:
        coop.register(area)
    return context, coop


def test_render_returns_the_wrapped_context(gateway_type: GatewayType) -> None:
    context, coop = setup(gateway_type)
    assert coop.render() is context
    assert len(context) == 0


def test_messages_go_through_the_active_gateway(gateway_type: GatewayType) -> None:
    """Each area message is rendered by the Context's gateway and appended in order."""
    a = ScriptedArea("a", script=[[user("alpha"), user("beta")]])
    b = ScriptedArea("b", script=[[user("gamma")]])
    context, coop = setup(gateway_type, a, b)
    coop.render()
    assert items(context) == native(gateway_type, user("alpha"), user("beta"), user("gamma"))


def test_render_collects_at_the_safe_point_before_the_unfold_pass(
    gateway_type: GatewayType,
) -> None:
    """Collection (promote, gc_prologue, detach) happens before any area renders."""
    log: Log = []
    a = ScriptedArea(
        "a", log, script=[[user("a1")]], retire_on_render=True, promoted=[user("a kept")]
    )
    context, coop = setup(gateway_type, a)
    coop.render()
    b = ScriptedArea("b", log, script=[[user("b1")]])
    coop.register(b)
    log.clear()
    coop.render()
    assert log == [("a", "promote"), ("a", "gc_prologue"), ("b", "render")]
    kept = native(gateway_type, user("a kept"))
    assert items(context) == kept + native(gateway_type, user("b1"))
    assert coop.effect_range(b) == EffectRange(len(kept), len(kept))
    assert coop.areas == (b,)


def test_render_skips_retired_areas(gateway_type: GatewayType) -> None:
    """A retired area that cannot be collected yet is neither observed nor rendered."""
    log: Log = []
    a = ScriptedArea("a", log, script=[[user("a1")], [user("a2")]])
    b = ScriptedArea("b", log, script=[[user("b1")], [user("b2")]])
    context, coop = setup(gateway_type, a, b)
    coop.render()
    a.life = AreaLifeState.retired  # a's component lies before retained b: it stays
    log.clear()
    coop.render()
    assert log == [("b", "observe"), ("b", "render")]
    assert a.renders == 1
    assert coop.areas == (a, b)
    assert items(context) == native(gateway_type, user("a1"), user("b1"), user("b2"))


def test_observe_only_when_retained_at_cursor_with_an_effect_range(
    gateway_type: GatewayType,
) -> None:
    log: Log = []
    empty = ScriptedArea("empty", log)  # renders nothing: never gets a range
    full = ScriptedArea("full", log, script=[[user("f1")], [user("f2")]])
    _, coop = setup(gateway_type, empty, full)
    coop.render()
    assert log == [("empty", "render"), ("full", "render")]
    log.clear()
    coop.render()
    assert log == [("empty", "render"), ("full", "observe"), ("full", "render")]


def test_observe_gets_a_read_only_snapshot_of_exactly_its_range(
    gateway_type: GatewayType,
) -> None:
    a = ScriptedArea("a", script=[[user("a1")], [user("a2")], []])
    b = ScriptedArea("b", script=[[user("b1")]])
    context, coop = setup(gateway_type, a, b)
    coop.render()  # a1 b1
    push(context, assistant("model says"))
    coop.render()  # a observes [a1] and renders a2: its range now spans b1 and the model output
    before = items(context)
    rng = coop.effect_range(a)
    assert rng == EffectRange(0, len(before) - 1)
    assert a.observed == [native(gateway_type, user("a1"))]
    b_range = coop.effect_range(b)
    assert b_range is not None
    assert b.observed == [before[b_range.earliest : b_range.latest + 1]]
    coop.render()  # a observes its whole range now
    last = a.snapshots[-1]
    assert list(last) == before[rng.earliest : rng.latest + 1]
    assert all(x is y for x, y in zip(last, before[rng.earliest : rng.latest + 1], strict=True))
    assert not hasattr(last, "append")
    assert len(last) == rng.latest - rng.earliest + 1
    assert last[-1] is before[rng.latest]
    assert list(last[1:]) == before[rng.earliest + 1 : rng.latest + 1]
    assert list(last[::-1]) == before[rng.earliest : rng.latest + 1][::-1]
    with pytest.raises(IndexError):
        last[len(last)]
    with pytest.raises(TypeError):
        last[0] = {}  # type: ignore[index]


def test_retiring_inside_observe_skips_that_render(gateway_type: GatewayType) -> None:
    log: Log = []
    a = ScriptedArea("a", log, script=[[user("a1")], [user("never")]], retire_on_observe=True)
    b = ScriptedArea("b", log, script=[[user("b1")], [user("b2")]])
    context, coop = setup(gateway_type, a, b)
    coop.render()
    log.clear()
    coop.render()
    assert log == [("a", "observe"), ("b", "observe"), ("b", "render")]
    assert a.renders == 1
    assert coop.is_retired(a)
    assert items(context) == native(gateway_type, user("a1"), user("b1"), user("b2"))


def test_first_nonempty_render_fixes_earliest_and_later_ones_move_latest(
    gateway_type: GatewayType,
) -> None:
    a = ScriptedArea("a", script=[[user("a1")], [], [user("a2"), user("a3")]])
    context, coop = setup(gateway_type)
    push(context, user("question"))
    coop.register(a)
    coop.render()
    first = len(native(gateway_type, user("question")))
    one = len(native(gateway_type, user("a1")))
    assert coop.effect_range(a) == EffectRange(first, first + one - 1)
    push(context, assistant("answer"))
    coop.render()  # empty render: the range does not move
    assert coop.effect_range(a) == EffectRange(first, first + one - 1)
    coop.render()
    assert coop.effect_range(a) == EffectRange(first, len(context) - 1)


def test_empty_render_creates_no_effect_range(gateway_type: GatewayType) -> None:
    a = ScriptedArea("a", script=[[]])
    context, coop = setup(gateway_type, a)
    coop.render()
    assert a.renders == 1
    assert coop.effect_range(a) is None
    assert len(context) == 0


def test_messages_rendering_to_no_item_count_as_an_empty_render(
    gateway_type: GatewayType,
) -> None:
    """Whitespace-only text renders to nothing; the range must point at existing items."""
    blank = user("  \n\n ")
    a = ScriptedArea("a", script=[[blank]])
    context, coop = setup(gateway_type, a)
    coop.render()
    assert native(gateway_type, blank) == []  # no gateway emits an empty text block
    assert a.renders == 1
    assert len(context) == 0
    assert coop.effect_range(a) is None


def test_exclusive_keeps_the_cursor_and_returns_at_once(gateway_type: GatewayType) -> None:
    log: Log = []
    a = ScriptedArea(
        "a", log, script=[[user("a1")], [user("a2")], [user("a3")]], flow=AreaFlowState.exclusive
    )
    b = ScriptedArea("b", log, script=[[user("b1")]])
    context, coop = setup(gateway_type, a, b)
    coop.render()
    assert log == [("a", "render")]
    assert coop.cursor is a
    log.clear()
    coop.render()
    assert log == [("a", "observe"), ("a", "render")]
    assert coop.cursor is a
    a.flow = AreaFlowState.yielded
    log.clear()
    coop.render()
    assert log == [("a", "observe"), ("a", "render"), ("b", "render")]
    assert items(context) == native(gateway_type, user("a1"), user("a2"), user("a3"), user("b1"))


def test_yielded_advances_the_cursor(gateway_type: GatewayType) -> None:
    a = ScriptedArea("a", script=[[user("a1")]])
    b = ScriptedArea("b", script=[[user("b1")]], flow=AreaFlowState.exclusive)
    c = ScriptedArea("c", script=[[user("c1")]])
    _, coop = setup(gateway_type, a, b, c)
    assert coop.cursor is a
    coop.render()
    assert coop.cursor is b
    assert (a.renders, b.renders, c.renders) == (1, 1, 0)


def test_one_pass_visits_each_area_at_most_once(gateway_type: GatewayType) -> None:
    """A pass starts at the cursor, wraps around the registration order, stops after n visits."""
    log: Log = []
    a = ScriptedArea("a", log, script=[[user("a")]] * 4)
    b = ScriptedArea("b", log, script=[[user("b")]] * 4, flow=AreaFlowState.exclusive)
    c = ScriptedArea("c", log, script=[[user("c")]] * 4)
    _, coop = setup(gateway_type, a, b, c)
    coop.render()
    assert [name for name, event in log if event == "render"] == ["a", "b"]
    b.flow = AreaFlowState.yielded
    log.clear()
    coop.render()
    assert [name for name, event in log if event == "render"] == ["b", "c", "a"]
    assert coop.cursor is b  # a full pass ends where it started
    log.clear()
    coop.render()
    assert [name for name, event in log if event == "render"] == ["b", "c", "a"]


def test_area_registered_later_joins_the_next_pass(gateway_type: GatewayType) -> None:
    a = ScriptedArea("a", script=[[user("a1")], [user("a2")]])
    context, coop = setup(gateway_type, a)
    coop.render()
    b = ScriptedArea("b", script=[[user("b1")]])
    coop.register(b)
    assert b.renders == 0
    coop.render()
    assert items(context) == native(gateway_type, user("a1"), user("a2"), user("b1"))


def test_statistics_count_renders_and_areas(gateway_type: GatewayType) -> None:
    a = ScriptedArea("a", script=[[user("a1")]], retire_on_render=True)
    b = ScriptedArea("b", script=[[user("b1")]])
    _, coop = setup(gateway_type, b, a)
    coop.render()
    stats = coop.statistics()
    assert (stats.areas, stats.materialized, stats.retired, stats.renders) == (2, 2, 0, 1)
    coop.render()
    stats = coop.statistics()
    assert (stats.areas, stats.materialized, stats.renders, stats.collections) == (1, 1, 2, 1)
    detached = len(native(gateway_type, user("a1")))
    assert (stats.areas_collected, stats.items_detached) == (1, detached)
