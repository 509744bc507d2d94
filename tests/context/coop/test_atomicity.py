"""render() is all or nothing; open tool calls; ownership and re-entrancy."""

from __future__ import annotations

from typing import Any

import msgspec
import pytest

from tests.context.coop.support import (
    Boom,
    ScriptedArea,
    assistant,
    call,
    items,
    native,
    push,
    result,
    user,
)
from turnloom.areas import OneShotNotice
from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    CoopContext,
    GatewayType,
    Message,
    Role,
    ToolCallPart,
)
from turnloom.errors import (
    AreaCallbackError,
    InputError,
    InvalidMessageError,
    ItemTooLargeError,
    OpenToolCallError,
    StateError,
)

Log = list[tuple[str, str]]


def state(coop: CoopContext) -> dict[str, Any]:
    """Everything observable about a CoopContext and its Context."""
    now = items(coop.context)
    return {
        "ids": [id(item) for item in now],
        "encoded": msgspec.json.encode(now),
        "areas": coop.areas,
        "ranges": [coop.effect_range(a) for a in coop.areas],
        "retired": [coop.is_retired(a) for a in coop.areas],
        "cursor": coop.cursor,
        "stats": coop.statistics(),
        "last": coop.last_collection,
    }


def scenario(
    kind: GatewayType, max_item_bytes: int | None = None
) -> tuple[CoopContext, dict[str, ScriptedArea], Log]:
    """P, F render each pass; Z and Y render once and retire; Q renders nothing.

    The next render() collects Z and Y (two tail components: promote, gc_prologue,
    detach, append summaries), then P, F and Q take their turn.
    """
    log: Log = []
    areas = {
        "P": ScriptedArea("P", log, script=[[user("p")]] * 5),
        "F": ScriptedArea("F", log, script=[[user("f")]] * 5),
        "Z": ScriptedArea(
            "Z", log, script=[[user("z")]], retire_on_render=True, promoted=[user("z sum")]
        ),
        "Y": ScriptedArea(
            "Y", log, script=[[user("y")]], retire_on_render=True, promoted=[user("y sum")]
        ),
        "Q": ScriptedArea("Q", log),
    }
    context = Context(kind)
    coop = CoopContext(context, max_item_bytes=max_item_bytes)
    for area in areas.values():
        coop.register(area)
    push(context, user("question"))
    coop.render()
    push(context, assistant("reply"))
    return coop, areas, log


FAILURES = [
    ("Q", "life_state"),
    ("Y", "promote"),
    ("Y", "gc_prologue"),
    ("F", "observe"),
    ("F", "render"),
    ("F", "flow_state"),
]


@pytest.mark.parametrize(("name", "phase"), FAILURES, ids=[f"{n}-{p}" for n, p in FAILURES])
def test_callback_error_leaves_coop_and_context_as_before_and_names_area_and_phase(
    gateway_type: GatewayType, name: str, phase: str
) -> None:
    coop, areas, _ = scenario(gateway_type)
    twin, _, _ = scenario(gateway_type)
    before = state(coop)
    failing = areas[name]
    failing.fail_in = phase
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert info.value.area is failing
    assert info.value.phase == phase
    assert isinstance(info.value.__cause__, Boom)
    seq = list(areas).index(name) + 1
    assert f"area #{seq} (ScriptedArea)" in str(info.value)
    assert f"in {phase}" in str(info.value)
    assert state(coop) == before
    # Once the area behaves, the same render gives what a never-failing twin gives.
    failing.fail_in = None
    coop.render()
    twin.render()
    assert items(coop.context) == items(twin.context)
    assert [coop.effect_range(a) for a in coop.areas] == [twin.effect_range(a) for a in twin.areas]


@pytest.mark.parametrize("phase", ["render", "promote"])
def test_an_item_over_the_per_item_cap_fails_its_phase_and_changes_nothing(
    gateway_type: GatewayType, phase: str
) -> None:
    """Invariant: with ``max_item_bytes``, no native item an area adds is over it; the
    phase adding one fails (caused by ItemTooLargeError) and render() changes nothing."""
    coop, areas, _ = scenario(gateway_type, max_item_bytes=600)
    before = state(coop)
    big = user("x" * 1000)
    size = len(msgspec.json.encode(native(gateway_type, big)[0]))
    if phase == "render":
        areas["F"].script = [[big]] * 5
    else:
        areas["Y"].promoted = (big,)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    cause = info.value.__cause__
    assert isinstance(cause, ItemTooLargeError)
    assert (cause.size, cause.limit, info.value.phase) == (size, 600, phase)
    assert state(coop) == before
    assert max(len(msgspec.json.encode(item)) for item in items(coop.context)) <= 600


@pytest.mark.parametrize("cap", [0, -1, 1.5, True, "600"])
def test_a_cap_that_is_not_a_positive_int_is_refused(cap: object) -> None:
    with pytest.raises(InputError, match="max_item_bytes must be a positive int"):
        CoopContext(Context(GatewayType.openai_chat), max_item_bytes=cap)  # type: ignore[arg-type]


def test_promoted_messages_leaving_a_call_open_roll_back_the_detached_tail(
    gateway_type: GatewayType,
) -> None:
    coop, areas, _ = scenario(gateway_type)
    before = state(coop)
    areas["Y"].promoted = (call("c9"),)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (areas["Y"], "promote")
    assert "'c9'" in str(info.value)
    assert state(coop) == before


def test_malformed_promoted_message_fails_before_any_gc_prologue(
    gateway_type: GatewayType,
) -> None:
    coop, areas, log = scenario(gateway_type)
    before = state(coop)
    areas["Z"].promoted = (Message(role=Role.user, content=(ToolCallPart(call_id="", name="x"),)),)
    log.clear()
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (areas["Z"], "promote")
    assert isinstance(info.value.__cause__, InvalidMessageError)
    assert log == [("Z", "promote")]
    assert state(coop) == before


@pytest.mark.parametrize(
    ("phase", "fragment"),
    [
        ("render", "returned an object of type NoneType, not a list"),
        ("flow_state", "has flow_state 'sideways'"),
    ],
    ids=["render-returns-None", "flow-state-not-an-enum"],
)
def test_wrong_return_values_fail_like_exceptions(
    gateway_type: GatewayType, phase: str, fragment: str
) -> None:
    coop, areas, _ = scenario(gateway_type)
    before = state(coop)
    failing = areas["F"]
    if phase == "render":
        failing.render = lambda: None  # type: ignore[method-assign,assignment,return-value]
    else:
        failing.flow = "sideways"  # type: ignore[assignment]
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (failing, phase)
    assert fragment in str(info.value)
    assert state(coop) == before


def test_invalid_rendered_message_fails_in_render_phase(gateway_type: GatewayType) -> None:
    coop, areas, _ = scenario(gateway_type)
    before = state(coop)
    areas["F"].script = [[Message(role="wizard", content="x")]]  # type: ignore[arg-type]
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (areas["F"], "render")
    assert isinstance(info.value.__cause__, InvalidMessageError)
    assert state(coop) == before


def test_base_exception_in_a_callback_rolls_back_and_propagates_unchanged(
    gateway_type: GatewayType,
) -> None:
    coop, areas, _ = scenario(gateway_type)
    before = state(coop)

    def interrupted() -> list[Message]:
        raise KeyboardInterrupt

    areas["F"].render = interrupted  # type: ignore[method-assign]
    with pytest.raises(KeyboardInterrupt):
        coop.render()
    assert state(coop) == before


# -- open tool calls -------------------------------------------------------------


def test_render_with_an_open_tool_call_raises_and_changes_nothing(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    notice = OneShotNotice("Repository state is authoritative.")
    coop.register(notice)
    push(context, user("question"), call("c1"))
    before = state(coop)
    with pytest.raises(OpenToolCallError) as info:
        coop.render()
    assert info.value.call_ids == ("c1",)
    assert "'c1'" in str(info.value)
    assert state(coop) == before
    assert not notice.rendered


def test_notice_injected_while_a_call_is_open_lands_after_its_result(
    gateway_type: GatewayType,
) -> None:
    """Issue 4 small input 3: never between a call and its result."""
    context = Context(gateway_type)
    coop = CoopContext(context)
    push(context, user("question"), call("c1"))
    coop.register(OneShotNotice("Heads up."))
    with pytest.raises(OpenToolCallError):
        coop.render()
    push(context, result("c1"))
    coop.render()
    assert items(context) == native(
        gateway_type, user("question"), call("c1"), result("c1"), user("Heads up.")
    )


def test_parallel_calls_stay_open_until_every_result_is_pushed(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    both = Message(
        role=Role.assistant,
        content=(
            ToolCallPart(call_id="c1", name="lookup", arguments="{}"),
            ToolCallPart(call_id="c2", name="lookup", arguments="{}"),
        ),
    )
    push(context, user("question"), both, result("c1"))
    with pytest.raises(OpenToolCallError) as info:
        coop.render()
    assert info.value.call_ids == ("c2",)
    push(context, result("c2"))
    assert coop.render() is context


def test_area_leaving_a_tool_call_open_fails_and_rolls_back(gateway_type: GatewayType) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    ok = ScriptedArea("ok", script=[[user("fine")]])
    bad = ScriptedArea("bad", script=[[call("c5")]])
    coop.register(ok)
    coop.register(bad)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (bad, "render")
    assert "'c5'" in str(info.value)
    assert len(context) == 0
    assert coop.effect_range(ok) is None


def test_area_rendering_a_complete_call_pair_is_accepted(gateway_type: GatewayType) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    pair = ScriptedArea("pair", script=[[call("state-1", "runtime_state"), result("state-1")]])
    coop.register(pair)
    coop.render()
    expected = native(gateway_type, call("state-1", "runtime_state"), result("state-1"))
    assert items(context) == expected


# -- ownership -------------------------------------------------------------------


def test_ownership_is_one_thread_at_a_time_and_documented() -> None:
    doc = CoopContext.__doc__ or ""
    assert "used by one thread at a time" in doc
    assert "no locking" in doc


def test_reentrant_render_or_register_from_a_callback_is_a_state_error(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    area = ScriptedArea("nosy", script=[[user("n1")]])
    coop.register(area)

    def render_again() -> list[Message]:
        coop.render()
        return []

    area.render = render_again  # type: ignore[method-assign]
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert isinstance(info.value.__cause__, StateError)
    assert "from inside an area callback" in str(info.value.__cause__)

    def register_more() -> list[Message]:
        coop.register(ScriptedArea("late"))
        return []

    area.render = register_more  # type: ignore[method-assign]
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert isinstance(info.value.__cause__, StateError)
    assert coop.areas == (area,)
    # Not busy any more after a failure.
    area.render = lambda: []  # type: ignore[method-assign]
    assert coop.render() is context
    assert coop.statistics().renders == 1


def test_failed_render_restores_the_cursor_repaired_by_its_collection(
    gateway_type: GatewayType,
) -> None:
    """Collection removed an area before the cursor, then the cursor area failed."""
    context = Context(gateway_type)
    coop = CoopContext(context)
    quiet = ScriptedArea("quiet", retire_on_render=True)  # renders nothing, retires
    busy = ScriptedArea("busy", script=[[user("b")]] * 3, flow=AreaFlowState.exclusive)
    coop.register(quiet)
    coop.register(busy)
    coop.render()
    assert coop.cursor is busy
    before = state(coop)
    busy.fail_in = "render"
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert state(coop) == before
    assert coop.cursor is busy
    busy.fail_in = None
    coop.render()
    assert coop.areas == (busy,)
    assert coop.cursor is busy


# -- GC callbacks are told once ---------------------------------------------------


def test_promote_and_gc_prologue_run_once_even_when_a_later_phase_fails(
    gateway_type: GatewayType,
) -> None:
    """A failure after the collection rolls it back, but the areas are not told twice.

    gc_prologue() is the final notification: a retry reuses the promoted messages
    and does not call promote() or gc_prologue() of those areas again.
    """
    coop, areas, log = scenario(gateway_type)
    twin, _, _ = scenario(gateway_type)
    before = state(coop)
    areas["F"].fail_in = "observe"
    log.clear()
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert log == [
        ("Z", "promote"),
        ("Y", "promote"),
        ("Z", "gc_prologue"),
        ("Y", "gc_prologue"),
        ("P", "observe"),
        ("P", "render"),
        ("F", "observe"),
    ]
    assert state(coop) == before
    areas["F"].fail_in = None
    areas["Z"].promoted = (user("changed after promote"),)  # not asked again
    log.clear()
    coop.render()
    assert [e for e in log if e[1] in ("promote", "gc_prologue")] == []
    twin.render()
    assert items(coop.context) == items(twin.context)
    report = coop.last_collection
    assert report is not None
    assert report.promoted == (user("z sum"), user("y sum"))
    assert report.removed == (areas["Z"], areas["Y"])


def test_retry_after_a_failed_gc_prologue_tells_only_the_areas_not_yet_told(
    gateway_type: GatewayType,
) -> None:
    coop, areas, log = scenario(gateway_type)
    areas["Y"].fail_in = "gc_prologue"
    log.clear()
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert log == [("Z", "promote"), ("Y", "promote"), ("Z", "gc_prologue"), ("Y", "gc_prologue")]
    areas["Y"].fail_in = None
    log.clear()
    coop.render()
    assert [e for e in log if e[1] in ("promote", "gc_prologue")] == [("Y", "gc_prologue")]
    assert coop.areas == (areas["P"], areas["F"], areas["Q"])


@pytest.mark.parametrize("why", ["open-call", "not-a-json-object"])
def test_rejected_promotion_is_found_before_any_gc_prologue(
    gateway_type: GatewayType, why: str
) -> None:
    """Promoted messages are rendered and checked before gc_prologue(), the final notification."""
    coop, areas, log = scenario(gateway_type)
    before = state(coop)
    if why == "open-call":
        areas["Y"].promoted = (call("c9"),)
    else:
        if gateway_type in (GatewayType.openai_chat, GatewayType.openai_responses):
            pytest.skip("OpenAI gateways carry tool call arguments as text, unparsed")
        bad = Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c9", name="lookup", arguments="not json"),),
        )
        areas["Y"].promoted = (bad, result("c9"))
    log.clear()
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (areas["Y"], "promote")
    assert log == [("Z", "promote"), ("Y", "promote")]
    assert state(coop) == before
    # The rejected promotion is asked for again; Z's accepted one is kept, not asked twice.
    areas["Y"].promoted = (user("y fixed"),)
    areas["Z"].promoted = (user("z changed"),)
    log.clear()
    coop.render()
    assert log[:3] == [("Y", "promote"), ("Z", "gc_prologue"), ("Y", "gc_prologue")]
    report = coop.last_collection
    assert report is not None
    assert report.promoted == (user("z sum"), user("y fixed"))


# -- tool results without their call ------------------------------------------------


def test_area_rendering_a_tool_result_without_its_call_fails_and_rolls_back(
    gateway_type: GatewayType,
) -> None:
    """Provider rule (every gateway): no tool result without its call in the prepared input.

    A render never starts with a call open, so an area's result can only answer a
    call the same area rendered before it, in the same render.
    """
    context = Context(gateway_type)
    coop = CoopContext(context)
    question = push(context, user("question"), call("c1"), result("c1"))
    ok = ScriptedArea("ok", script=[[user("fine")]])
    bad = ScriptedArea("bad", script=[[user("note"), result("c1")]])
    coop.register(ok)
    coop.register(bad)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (bad, "render")
    assert "tool result(s) 'c1' without their call" in str(info.value)
    assert items(context) == question
    assert coop.effect_range(ok) is None


def test_results_must_answer_the_nearest_preceding_call_group_of_the_area(
    gateway_type: GatewayType,
) -> None:
    """Pairing is positional: a user turn between call and result breaks the pair."""
    context = Context(gateway_type)
    coop = CoopContext(context)
    area = ScriptedArea("area", script=[[call("s1"), user("between"), result("s1")]])
    coop.register(area)
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert "'s1'" in str(info.value)
    assert len(context) == 0


def test_promoted_tool_result_without_its_call_fails_before_any_gc_prologue(
    gateway_type: GatewayType,
) -> None:
    coop, areas, log = scenario(gateway_type)
    before = state(coop)
    areas["Z"].promoted = (result("gone"),)  # its call was in the detached tail
    log.clear()
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (areas["Z"], "promote")
    assert "tool result(s) 'gone' without their call" in str(info.value)
    assert log == [("Z", "promote")]
    assert state(coop) == before


# -- more failure points ------------------------------------------------------------


class _FlakyLife(ScriptedArea):
    """life_state raises on its ``fail_at``-th read (1-based)."""

    def __init__(self, *args: Any, fail_at: int, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.reads = 0
        self.fail_at = fail_at

    @property
    def life_state(self) -> AreaLifeState:
        self.reads += 1
        if self.reads == self.fail_at:
            raise Boom("life_state read after observe fails")
        return self.life


def test_life_state_failing_after_observe_restores_collection_and_pass(
    gateway_type: GatewayType,
) -> None:
    """The read after observe() is the last before render(); failing there undoes it all."""
    coop, _, log = scenario(gateway_type)
    flaky = _FlakyLife("flaky", log, script=[[user("k1")], [user("k2")]], fail_at=0)
    coop.register(flaky)
    coop.render()  # collects Z, Y; flaky renders k1
    push(coop.context, assistant("again"))
    done = ScriptedArea("done", log, script=[[user("d1")]], retire_on_render=True)
    coop.register(done)
    coop.render()  # done renders and retires: the tail component
    before = state(coop)
    flaky.reads = 0
    flaky.fail_at = 3  # collection, before observe, after observe
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (flaky, "life_state")
    assert ("done", "gc_prologue") in log
    assert state(coop) == before


class _Pusher(ScriptedArea):
    """Breaks the contract: appends a native item to the Context from gc_prologue()."""

    def __init__(self, *args: Any, context: Context, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.context = context

    def gc_prologue(self) -> None:
        super().gc_prologue()
        for item in native(self.context.gateway.type, user("smuggled")):
            self.context.push_back(item)


def test_rollback_restores_the_context_even_if_a_callback_appended_to_it(
    gateway_type: GatewayType,
) -> None:
    context = Context(gateway_type)
    coop = CoopContext(context)
    keep = ScriptedArea("keep", script=[[user("k1")], [user("k2")]])
    gone = _Pusher("gone", script=[[user("g1")]], retire_on_render=True, context=context)
    coop.register(keep)
    coop.register(gone)
    coop.render()
    push(context, assistant("reply"))
    before = state(coop)
    keep.fail_in = "render"
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert state(coop) == before


def test_promotion_rendering_to_nothing_appends_no_item(gateway_type: GatewayType) -> None:
    """The promoted message is reported, but no native item stands for it."""
    context = Context(gateway_type)
    coop = CoopContext(context)
    blank = Message(role=Role.user, content="  ")
    gone = ScriptedArea("gone", script=[[user("g1")]], retire_on_render=True, promoted=[blank])
    coop.register(gone)
    question = push(context, user("question"))
    coop.render()
    coop.render()
    assert items(context) == question
    report = coop.last_collection
    assert report is not None
    assert (report.start, report.promoted, report.promoted_items) == (len(question), (blank,), ())
    stats = coop.statistics()
    assert (stats.items_promoted, stats.areas_collected) == (0, 1)


def test_calls_of_consecutive_assistant_messages_form_one_call_group(
    gateway_type: GatewayType,
) -> None:
    """As for open calls: one model turn may span assistant items (Responses: one per call)."""
    context = Context(gateway_type)
    coop = CoopContext(context)
    batch = [call("g1"), call("g2", "search"), result("g1"), result("g2", name="search")]
    area = ScriptedArea("area", script=[batch])
    coop.register(area)
    coop.render()
    assert items(context) == native(gateway_type, *batch)
    assert coop.effect_range(area) is not None


def test_render_refuses_a_context_shrunk_outside_the_collector(gateway_type: GatewayType) -> None:
    """Ranges must lie inside the Context; only the Collector removes items.

    Without the check an area's observe() got an IndexError and was blamed for it.
    """
    context = Context(gateway_type)
    coop = CoopContext(context)
    area = ScriptedArea("area", script=[[user("a1"), user("a2")], [user("a3")]])
    coop.register(area)
    coop.render()
    context.detach_tail(1)
    before = state(coop)
    with pytest.raises(StateError) as info:
        coop.render()
    assert "The Context holds 1 items but held 2 after the last render()" in str(info.value)
    assert state(coop) == before
    assert area.log == [("area", "render")]


class _Fickle(ScriptedArea):
    """Un-retires from its GC callbacks (outside the contract)."""

    def promote(self) -> tuple[Message, ...]:
        self.life = AreaLifeState.retain
        return super().promote()

    def gc_prologue(self) -> None:
        self.life = AreaLifeState.retain
        super().gc_prologue()


def test_gc_callbacks_cannot_cancel_a_collection_retried_after_a_failure(
    gateway_type: GatewayType,
) -> None:
    """Seed 000: state changes in promote()/gc_prologue() cannot cancel collection.

    Also not through the retry of a render that failed after the collection.
    """
    log: Log = []
    context = Context(gateway_type)
    coop = CoopContext(context)
    keep = ScriptedArea("keep", log, script=[[user("k1")]])
    fickle = _Fickle(
        "fickle", log, script=[[user("f1")]], retire_on_render=True, promoted=[user("f sum")]
    )
    coop.register(keep)
    coop.register(fickle)
    coop.render()
    push(context, assistant("reply"))
    before = state(coop)
    keep.fail_in = "observe"
    with pytest.raises(AreaCallbackError):
        coop.render()
    assert state(coop) == before
    assert fickle.life_state is AreaLifeState.retain
    keep.fail_in = None
    coop.render()
    assert coop.areas == (keep,)
    assert items(context) == native(gateway_type, user("k1"), user("f sum"))
    assert [e for n, e in log if n == "fickle"] == ["render", "promote", "gc_prologue"]


@pytest.mark.parametrize(
    ("value", "fragment"),
    [
        ("plain text", "render() returned an object of type str, not a list of Message"),
        (
            iter([user("x")]),
            "render() returned an object of type list_iterator, not a list of Message",
        ),
        (["plain text"], "render()[0] is an object of type str, not a turnloom Message"),
        (
            [user("ok"), {"role": "user", "content": "native"}],
            "is an object of type dict, not a turnloom Message",
        ),
    ],
    ids=["str", "iterator", "list-of-str", "native-dict"],
)
def test_render_results_that_are_not_lists_of_messages_fail_and_roll_back(
    gateway_type: GatewayType, value: object, fragment: str
) -> None:
    """Areas return neutral Messages only, never provider-native items (seed 000)."""
    coop, areas, _ = scenario(gateway_type)
    before = state(coop)
    areas["F"].render = lambda: value  # type: ignore[method-assign,assignment,return-value]
    with pytest.raises(AreaCallbackError) as info:
        coop.render()
    assert (info.value.area, info.value.phase) == (areas["F"], "render")
    assert fragment in str(info.value)
    assert state(coop) == before


# Model output in each provider's own shape: (items ending with an open call, the
# open call ids, the items that close them).
_NATIVE_OPEN_CALLS: dict[GatewayType, tuple[list[dict[str, Any]], tuple[str, ...], list[Any]]] = {
    GatewayType.openai_chat: (
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": "Checking.",
                "tool_calls": [
                    {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                    {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{}"}},
                ],
            },
            {"role": "tool", "tool_call_id": "a", "content": "ra"},
        ],
        ("b",),
        [{"role": "tool", "tool_call_id": "b", "content": "rb"}],
    ),
    GatewayType.openai_responses: (
        [
            {"role": "user", "content": "q"},
            {"type": "reasoning", "id": "rs_1", "summary": [], "encrypted_content": "x"},
            {"type": "function_call", "call_id": "a", "name": "f", "arguments": "{}"},
            {"type": "function_call", "call_id": "b", "name": "f", "arguments": "{}"},
            {"type": "function_call_output", "call_id": "b", "output": "rb"},
        ],
        ("a",),
        [{"type": "function_call_output", "call_id": "a", "output": "ra"}],
    ),
    GatewayType.anthropic: (
        [
            {"role": "user", "content": "q"},
            {
                "role": "assistant",
                "content": [
                    {"type": "text", "text": "Checking."},
                    {"type": "tool_use", "id": "a", "name": "f", "input": {}},
                ],
            },
        ],
        ("a",),
        [
            {
                "role": "user",
                "content": [{"type": "tool_result", "tool_use_id": "a", "content": "r"}],
            }
        ],
    ),
    GatewayType.gemini: (
        [
            {"role": "user", "parts": [{"text": "q"}]},
            {
                "role": "model",
                "parts": [
                    {"functionCall": {"name": "f", "args": {}}},
                    {"functionCall": {"name": "g", "args": {"x": 1}}},
                ],
            },
        ],
        ("f#0", "g#0"),  # "<name>#<n>": the n-th id-less call of that name
        [
            {
                "role": "user",
                "parts": [
                    {"functionResponse": {"name": "f", "response": {"output": "rf"}}},
                    {"functionResponse": {"name": "g", "response": {"output": "rg"}}},
                ],
            }
        ],
    ),
}


def test_open_calls_in_native_model_output_block_render_until_answered(
    gateway_type: GatewayType,
) -> None:
    """Provider-native shapes: parallel calls, reasoning items, calls without ids (Gemini)."""
    pushed, open_ids, closing = _NATIVE_OPEN_CALLS[gateway_type]
    context = Context(gateway_type)
    for item in pushed:
        context.push_back(item)
    coop = CoopContext(context)
    coop.register(OneShotNotice("Heads up."))
    with pytest.raises(OpenToolCallError) as info:
        coop.render()
    assert info.value.call_ids == open_ids
    assert items(context) == pushed
    for item in closing:
        context.push_back(item)
    coop.render()
    assert items(context) == pushed + closing + native(gateway_type, user("Heads up."))
    assert context.gateway.validate(items(context)) == []
