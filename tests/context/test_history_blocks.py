"""The closed turns kept in blocks: a run joins each 64 newest turns' chunks into one
block, which the encoded body shares (``turnloom.context.history._run``).

The history's invariants are proved again with blocks of two turns, so
generated histories of a few turns form, cut, drop and compact blocks; and at the
real size, a long history's run and body hold the same block objects.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.context import test_body, test_history, test_history_closed, test_history_state
from tests.context.test_history import SYSTEM, assistant, call, result, user
from turnloom.context import GatewayType, HistoryLimits, TurnHistory, get_gateway
from turnloom.context.history import _run

_INVARIANTS = [
    test_history.test_cached_render_equals_a_from_scratch_render,
    test_history.test_a_bounded_render_is_exact_or_nothing_and_what_renders_hand_out_never_changes,
    test_body.test_cached_body_equals_the_encoded_request_body,
    test_body.test_eviction_renames_the_kept_turns_as_a_cold_render_would,
    test_history_state.test_renders_with_kept_state_equal_a_cold_render_and_totals_count_it,
    test_history_closed.test_closed_turns_read_back_as_live_ones,
]


@pytest.mark.parametrize("turns", [2])
@pytest.mark.parametrize("invariant", _INVARIANTS, ids=lambda test: test.__name__[5:])
def test_the_history_invariants_hold_with_small_blocks(
    monkeypatch: pytest.MonkeyPatch, turns: int, invariant: object
) -> None:
    """Invariant: every render and body equals a cold one, whatever blocks the run
    formed, cut at the front, dropped, compacted or shared with the body."""
    monkeypatch.setattr(_run, "_BLOCK_TURNS", turns)
    invariant()  # type: ignore[operator]


def _turn(history: TurnHistory, number: int) -> None:
    history.commit(
        f"t{number}",
        [user(f"Check reservation {number}.")],
        instructions=[SYSTEM] if number == 0 else None,
    )
    history.record(
        f"t{number}",
        [call(f"call_{number}"), result(f"call_{number}", "ok"), assistant(f"R{number} is fine.")],
    )
    history.evict()


@pytest.mark.parametrize("kind", list(GatewayType))
def test_a_long_history_keeps_its_closed_turns_in_blocks_the_body_shares(
    kind: GatewayType,
) -> None:
    """Invariant: 200 turns rendered one by one, 150 kept: the run holds blocks of 64
    turns (the first cut at the front), then one chunk per newer turn; the body is
    the encoded request body and holds the whole blocks themselves, not copies.
    Gemini's body, whose items are not the run's, keeps its own blocks, and the run
    forms none (a block the body cannot share would hold the bytes twice)."""
    gateway = get_gateway(kind)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=150))
    for number in range(200):
        _turn(history, number)
        rendered = history.view().render(gateway, f"t{number}")  # the run grows turn by turn
    items = list(rendered.items)
    assert rendered.body is not None
    assert rendered.body.encode() == msgspec.json.encode(gateway.request_body(items))
    (run,) = history._shared.runs.values()
    assert run.turns == 149  # the closed turns t50..t198
    live = run.chunks[_run.bisect.bisect_right(run.chunk_stops, run.dead) :]
    stops = [stop - run.dead for stop in run.chunk_stops[-len(live) :]]
    body_chunks = rendered.body._chunks.tolist()  # type: ignore[attr-defined]
    if kind is GatewayType.gemini:
        # Its body items are not the history's (a function response and the next
        # user text merge into one content): the body keeps its own blocks of 64
        # segments, the newest loose, and the run one chunk per turn (no block it
        # could share, none held twice).
        assert stops == list(range(1, 150))
        assert len(body_chunks) == 2
        return
    # Blocks of t0..t63 (t0..t49 dropped), t64..t127 and t128..t191, then t192..t198 alone.
    assert stops == [14, 78, 142, *range(143, 150)]
    for block in live[1:3]:  # the whole blocks: the body holds them, not copies
        assert [chunk is block for chunk in body_chunks].count(True) == 1
        assert [chunk == block for chunk in body_chunks].count(True) == 1


@pytest.mark.parametrize("kind", list(GatewayType))
def test_a_block_the_body_cannot_share_is_not_formed(kind: GatewayType) -> None:
    """Invariant: no closed turn's bytes are held twice. Every 10th turn gets no output,
    so its user input merges with the next turn's into one Anthropic message (the body
    item spans two turns): a block holding that turn could not be the body's, so the
    run keeps those 64 turns one chunk each; every block it does form, the body holds
    itself."""
    gateway = get_gateway(kind)
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=400))
    for number in range(300):
        if number % 10 == 5:
            history.commit(f"t{number}", [user(f"Never mind {number}.")])
        else:
            _turn(history, number)
        rendered = history.view().render(gateway, f"t{number}")
    items = list(rendered.items)
    assert rendered.body is not None
    assert rendered.body.encode() == msgspec.json.encode(gateway.request_body(items))
    (run,) = history._shared.runs.values()
    blocks = [
        chunk
        for number, chunk in enumerate(run.chunks)
        if run.chunk_stops[number] - (run.chunk_stops[number - 1] if number else 0) > 1
    ]
    body_chunks = rendered.body._chunks.tolist()  # type: ignore[attr-defined]
    assert all([c is block for c in body_chunks].count(True) == 1 for block in blocks)
    expected = {"openai_chat": 4, "openai_responses": 4, "anthropic": 0, "gemini": 0}
    assert len(blocks) == expected[kind.value]
