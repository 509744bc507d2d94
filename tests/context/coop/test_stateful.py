"""A hypothesis state machine driving register / render / push_back / retire on a CoopContext.

Invariants checked after every step (issue 3):

* every EffectRange lies inside the Context;
* items before the collected tail never change (same objects, same bytes);
* the Context plus the detached garbage equals, item for item, everything the
  model and the areas ever appended plus the promoted items;
* each render's collection matches the brute-force oracle, promotes every
  removed area before any gc_prologue, and appends exactly what the gateway
  renders for the promoted and rendered messages;
* promote() and gc_prologue() succeed at most once per area, even across a
  failed render() that reached them (a removed area: exactly once each);
* a failed render() leaves everything as it was.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

import msgspec
import pytest
from hypothesis import event, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from tests.context.coop.support import (
    assistant,
    call,
    gateway_or_skip,
    items,
    native,
    push,
    result,
    user,
)
from tests.context.coop.test_plan_property import oracle_plan
from turnloom.context import (
    AreaFlowState,
    AreaLifeState,
    Context,
    CoopContext,
    EffectRange,
    GatewayType,
    Message,
    NativeContent,
)
from turnloom.errors import AreaCallbackError, OpenToolCallError


class MachineArea:
    """An area whose renders follow ``counts`` (messages per render, cycling)."""

    def __init__(
        self,
        name: str,
        events: list[tuple[str, str, tuple[Message, ...]]],
        *,
        counts: Sequence[int],
        flow: AreaFlowState,
        retire_after: int | None,
        promotes: bool,
    ) -> None:
        self.name = name
        self.events = events
        self.counts = list(counts)
        self.flow = flow
        self.life = AreaLifeState.retain
        self.retire_after = retire_after
        self.promotes = promotes
        self.renders = 0
        self.fail_in: str | None = None
        self.promote_calls = 0  # successful calls
        self.prologue_calls = 0

    @property
    def life_state(self) -> AreaLifeState:
        if self.fail_in == "life_state":
            raise RuntimeError(f"{self.name} life_state fails")
        return self.life

    @property
    def flow_state(self) -> AreaFlowState:
        return self.flow

    def observe(self, context: Sequence[NativeContent]) -> None:
        self.events.append((self.name, "observe", ()))

    def render(self) -> list[Message]:
        if self.fail_in == "render":
            raise RuntimeError(f"{self.name} render fails")
        count = self.counts[self.renders % len(self.counts)]
        messages = tuple(user(f"{self.name} r{self.renders} m{i}") for i in range(count))
        self.renders += 1
        if self.retire_after is not None and self.renders >= self.retire_after:
            self.life = AreaLifeState.retired
        self.events.append((self.name, "render", messages))
        return list(messages)

    @property
    def promotion(self) -> tuple[Message, ...]:
        return (user(f"{self.name} summary"),) if self.promotes else ()

    def promote(self) -> tuple[Message, ...]:
        self.events.append((self.name, "promote", self.promotion))
        if self.fail_in == "promote":
            raise RuntimeError(f"{self.name} promote fails")
        self.promote_calls += 1
        return self.promotion

    def gc_prologue(self) -> None:
        self.events.append((self.name, "gc_prologue", ()))
        if self.fail_in == "gc_prologue":
            raise RuntimeError(f"{self.name} gc_prologue fails")
        self.prologue_calls += 1


class CoopMachine(RuleBasedStateMachine):
    kind: GatewayType = GatewayType.openai_chat

    def __init__(self) -> None:
        super().__init__()
        self.context = Context(self.kind)
        self.coop = CoopContext(self.context)
        self.events: list[tuple[str, str, tuple[Message, ...]]] = []
        self.registered: list[MachineArea] = []
        self.appended: list[NativeContent] = []  # by the model and by area renders
        self.promoted: list[NativeContent] = []
        self.garbage: list[NativeContent] = []
        self.encoded: dict[int, bytes] = {}
        self.serial = 0

    # -- helpers -------------------------------------------------------------

    def _record(self, new: Sequence[NativeContent], into: list[NativeContent]) -> None:
        for item in new:
            assert id(item) not in self.encoded, "an item was appended twice"
            self.encoded[id(item)] = msgspec.json.encode(item)
            into.append(item)

    def _expected_collection(self) -> tuple[int | None, tuple[MachineArea, ...]]:
        rendered = [a for a in self.registered if self.coop.effect_range(a) is not None]
        ranges: list[EffectRange] = []
        for area in rendered:
            rng = self.coop.effect_range(area)
            assert rng is not None
            ranges.append(rng)
        retired = [a.life is AreaLifeState.retired for a in rendered]
        plan = oracle_plan(ranges, retired)
        unrendered = tuple(
            a
            for a in self.registered
            if a.life is AreaLifeState.retired and self.coop.effect_range(a) is None
        )
        return plan.start, tuple(rendered[i] for i in plan.collected) + unrendered

    def _state(self) -> tuple[object, ...]:
        now = items(self.context)
        return (
            [id(i) for i in now],
            self.coop.areas,
            [self.coop.effect_range(a) for a in self.coop.areas],
            [self.coop.is_retired(a) for a in self.coop.areas],
            self.coop.cursor,
            self.coop.statistics(),
            self.coop.last_collection,
        )

    # -- rules ---------------------------------------------------------------

    @precondition(lambda self: len(self.registered) < 8)
    @rule(
        counts=st.lists(st.integers(min_value=0, max_value=2), min_size=1, max_size=3),
        flow=st.sampled_from(AreaFlowState),
        retire_after=st.sampled_from([1, 1, 1, 2, 3, None]),
        promotes=st.booleans(),
    )
    def register(
        self,
        counts: list[int],
        flow: AreaFlowState,
        retire_after: int | None,
        promotes: bool,
    ) -> None:
        self.serial += 1
        area = MachineArea(
            f"a{self.serial}",
            self.events,
            counts=counts,
            flow=flow,
            retire_after=retire_after,
            promotes=promotes,
        )
        self.coop.register(area)
        self.registered.append(area)

    @precondition(lambda self: len(self.registered) < 8)
    @rule(n=st.integers(min_value=1, max_value=3), promotes=st.booleans())
    def register_one_shots(self, n: int, promotes: bool) -> None:
        """Areas rendering once and retiring: disjoint retired components at the tail."""
        for _ in range(n):
            self.register([1], AreaFlowState.yielded, 1, promotes)

    @rule()
    def render_twice(self) -> None:
        """Renders are the interesting step: give them more weight."""
        self.render()
        self.render()

    @rule()
    def render(self) -> None:
        before = items(self.context)
        start, removed = self._expected_collection()
        to_promote = [a.name for a in removed if a.promote_calls == 0]
        to_close = [a.name for a in removed if a.prologue_calls == 0]
        self.events.clear()
        assert self.coop.render() is self.context
        after = items(self.context)
        report = self.coop.last_collection
        assert report is not None
        assert report.start == start
        assert report.removed == removed
        cut = len(before) if start is None else start
        # Items before the collected tail never change.
        assert len(after) >= cut
        assert all(x is y for x, y in zip(after[:cut], before[:cut], strict=True))
        assert all(x is y for x, y in zip(report.detached, before[cut:], strict=True))
        assert len(report.detached) == len(before) - cut
        self.garbage.extend(report.detached)
        # promote() of every removed area not promoted by an earlier failed
        # render, then gc_prologue() of each not yet told, in that order.
        gc_phase = [(n, e) for n, e, _ in self.events if e in ("promote", "gc_prologue")]
        assert gc_phase == [(n, "promote") for n in to_promote] + [
            (n, "gc_prologue") for n in to_close
        ]
        assert all((a.promote_calls, a.prologue_calls) == (1, 1) for a in removed)
        promoted = [m for a in removed for m in a.promotion]
        assert list(report.promoted) == promoted
        promoted_items = after[cut : cut + len(report.promoted_items)]
        assert promoted_items == native(self.kind, *promoted)
        self._record(promoted_items, self.promoted)
        # Then exactly the gateway's rendering of what the areas returned, in pass order.
        rendered = [m for _, e, ms in self.events if e == "render" for m in ms]
        new = after[cut + len(promoted_items) :]
        assert new == native(self.kind, *rendered)
        self._record(new, self.appended)
        self.registered = [a for a in self.registered if a not in removed]
        event(f"render detached items: {bool(report.detached)}")
        event(f"render reclaimed components: {min(report.components, 2)}")

    @rule(kind=st.sampled_from(["text", "call_group", "user"]))
    def push_model_output(self, kind: str) -> None:
        self.serial += 1
        if kind == "text":
            pushed = push(self.context, assistant(f"reply {self.serial}"))
        elif kind == "user":
            pushed = push(self.context, user(f"user {self.serial}"))
        else:
            cid = f"c{self.serial}"
            pushed = push(self.context, call(cid), result(cid))
        self._record(pushed, self.appended)

    @precondition(lambda self: bool(self.registered))
    @rule(data=st.data())
    def retire(self, data: st.DataObject) -> None:
        area = data.draw(st.sampled_from(self.registered))
        area.life = AreaLifeState.retired

    @precondition(lambda self: bool(self.registered))
    @rule(data=st.data(), flow=st.sampled_from(AreaFlowState))
    def set_flow(self, data: st.DataObject, flow: AreaFlowState) -> None:
        data.draw(st.sampled_from(self.registered)).flow = flow

    @rule()
    def render_with_open_call_fails_cleanly(self) -> None:
        self.serial += 1
        cid = f"open{self.serial}"
        self._record(push(self.context, call(cid)), self.appended)
        before = self._state()
        with pytest.raises(OpenToolCallError) as info:
            self.coop.render()
        assert info.value.call_ids == (cid,)
        assert self._state() == before
        self._record(push(self.context, result(cid)), self.appended)

    @precondition(lambda self: bool(self.registered))
    @rule(data=st.data())
    def failing_render_changes_nothing(self, data: st.DataObject) -> None:
        """Make one callback fail where the render is sure to reach it; nothing may change."""
        _, removed = self._expected_collection()
        choices: list[tuple[MachineArea, str]] = []
        untold = [a for a in removed if a.prologue_calls == 0]
        if untold:  # fails after every promote() and the earlier gc_prologue()s
            choices.append((untold[-1], "gc_prologue"))
        unpromoted = [a for a in removed if a.promote_calls == 0]
        if unpromoted:  # fails after the earlier promote()s, before any gc_prologue()
            choices.append((unpromoted[-1], "promote"))
        cursor = self.coop.cursor
        if isinstance(cursor, MachineArea) and cursor.life is AreaLifeState.retain:
            # fails after the whole collection: detach, promotions, cursor repair
            choices.append((cursor, "render"))
        retained = [a for a in self.registered if a.life is AreaLifeState.retain]
        if retained:
            choices.append((retained[-1], "life_state"))
        if not choices:
            return
        failing, phase = data.draw(st.sampled_from(choices))
        failing.fail_in = phase
        event(f"failing render in {phase}")
        before = self._state()
        encoded = msgspec.json.encode(items(self.context))
        try:
            with pytest.raises(AreaCallbackError) as info:
                self.coop.render()
        finally:
            failing.fail_in = None
        assert (info.value.area, info.value.phase) == (failing, phase)
        assert self._state() == before
        assert msgspec.json.encode(items(self.context)) == encoded

    # -- invariants ----------------------------------------------------------

    @invariant()
    def ranges_lie_inside_the_context(self) -> None:
        size = len(self.context)
        for area in self.coop.areas:
            rng = self.coop.effect_range(area)
            if rng is not None:
                assert 0 <= rng.earliest <= rng.latest < size

    @invariant()
    def every_item_ever_appended_is_accounted_for(self) -> None:
        present = Counter(id(i) for i in items(self.context)) + Counter(id(i) for i in self.garbage)
        expected = Counter(id(i) for i in self.appended) + Counter(id(i) for i in self.promoted)
        assert present == expected

    @invariant()
    def items_are_never_mutated(self) -> None:
        for item in items(self.context):
            assert msgspec.json.encode(item) == self.encoded[id(item)]

    @invariant()
    def gc_callbacks_succeed_at_most_once_per_area(self) -> None:
        for area in self.registered:
            assert area.promote_calls <= 1
            assert area.prologue_calls <= 1

    @invariant()
    def registered_areas_match_the_model(self) -> None:
        assert self.coop.areas == tuple(self.registered)


@pytest.mark.parametrize("kind", list(GatewayType), ids=[g.value for g in GatewayType])
def test_coop_context_state_machine(kind: GatewayType) -> None:
    gateway_or_skip(kind)
    machine = type(f"CoopMachine_{kind.value}", (CoopMachine,), {"kind": kind})
    run_state_machine_as_test(  # type: ignore[no-untyped-call]
        machine,
        settings=settings(
            max_examples=100,
            stateful_step_count=40,
        ),
    )
