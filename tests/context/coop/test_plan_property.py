"""The Collector's plan equals a brute-force oracle on random interval layouts."""

from __future__ import annotations

from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import CollectionPlan, EffectRange, plan_collection


def oracle_plan(ranges: Sequence[EffectRange], retired: Sequence[bool]) -> CollectionPlan:
    """Brute force, straight from the seed's words.

    Overlap is "the two ranges share an index", computed with sets of indices;
    components by depth-first search over all pairs; then, repeatedly, the
    component of the remaining range reaching furthest toward the tail is
    reclaimed while every area in it is retired.
    """
    n = len(ranges)
    cover = [set(range(r.earliest, r.latest + 1)) for r in ranges]
    neighbours = [[j for j in range(n) if j != i and cover[i] & cover[j]] for i in range(n)]
    component_of: dict[int, frozenset[int]] = {}
    for i in range(n):
        if i in component_of:
            continue
        seen = {i}
        stack = [i]
        while stack:
            for j in neighbours[stack.pop()]:
                if j not in seen:
                    seen.add(j)
                    stack.append(j)
        component = frozenset(seen)
        for j in component:
            component_of[j] = component
    remaining = set(range(n))
    collected: set[int] = set()
    components = 0
    while remaining:
        furthest = max(remaining, key=lambda i: ranges[i].latest)
        component = component_of[furthest]
        if not all(retired[i] for i in component):
            break
        collected |= component
        remaining -= component
        components += 1
    if not collected:
        return CollectionPlan(start=None, collected=(), components=0)
    ordered = tuple(sorted(collected, key=lambda i: (ranges[i].earliest, i)))
    return CollectionPlan(
        start=min(ranges[i].earliest for i in collected), collected=ordered, components=components
    )


@st.composite
def layouts(draw: st.DrawFn) -> tuple[list[EffectRange], list[bool]]:
    """Up to 24 ranges over 0..60: nested, chained, touching, equal and disjoint ones.

    Two in three areas are retired, so long reclaimable runs occur often.
    """
    span = draw(st.sampled_from([8, 20, 60]))
    longest = draw(st.sampled_from([0, 2, 6, span]))
    entries = draw(
        st.lists(
            st.tuples(
                st.integers(min_value=0, max_value=span),
                st.integers(min_value=0, max_value=longest),
                st.integers(min_value=0, max_value=2),
            ),
            max_size=24,
        )
    )
    ranges = [EffectRange(earliest, earliest + length) for earliest, length, _ in entries]
    return ranges, [flag != 0 for _, _, flag in entries]


@settings(max_examples=1500)
@given(layouts())
def test_collector_plan_matches_brute_force_oracle(
    layout: tuple[list[EffectRange], list[bool]],
) -> None:
    ranges, retired = layout
    assert plan_collection(ranges, retired) == oracle_plan(ranges, retired)


@settings(max_examples=300)
@given(layouts())
def test_collector_plan_is_independent_of_input_order_up_to_indices(
    layout: tuple[list[EffectRange], list[bool]],
) -> None:
    """Reversing the input permutes the collected indices, never the reclaimed set or start."""
    ranges, retired = layout
    forward = plan_collection(ranges, retired)
    backward = plan_collection(ranges[::-1], retired[::-1])
    n = len(ranges)
    assert backward.start == forward.start
    assert backward.components == forward.components
    assert {n - 1 - i for i in backward.collected} == set(forward.collected)
