"""Tokens in the history: counted once at the door, one number everywhere.

Invariants (hypothesis, against a model that recounts from scratch):

* ``statistics().tokens`` is the counter over the kept turns' messages,
  ``pinned_tokens`` over the pinned instructions, and ``evicted_tokens`` over
  what eviction dropped, after any sequence of commits, records and evictions;
* ``max_tokens`` eviction drops exactly the oldest whole turns the model drops;
* a render's ``tokens`` is the counter over the messages it renders (after
  pairing: an excluded call and a cancelled result are counted as rendered);
* ``render_scoped`` equals a cold render of the selected messages, completed
  turn by turn, and leaves the shared run exactly as it was.
"""

from __future__ import annotations

from typing import Any

import msgspec
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from turnloom.context import (
    AllOf,
    AnyOf,
    ApproxTokenCounter,
    ContextScope,
    LastNTurns,
    Message,
    Not,
    RoleFilter,
    Since,
    complete_pairs,
    scope_indices,
)
from turnloom.context.gateway import step_join
from turnloom.context.history import HistoryLimits, TurnHistory

COUNTER = ApproxTokenCounter()

# One turn: its user text and its outputs, each "a" (assistant text), "c"
# (a call), "r" (the result of the turn's last call) or "o" (a call left open).
_turn = st.tuples(
    st.text("abc xyz", min_size=1, max_size=30),
    st.lists(st.sampled_from("acro"), max_size=5),
)


def _outputs(n: int, kinds: list[str]) -> list[Message]:
    out: list[Message] = []
    last = None
    for j, kind in enumerate(kinds):
        if kind == "a":
            out.append(assistant(f"answer {n}.{j}"))
        elif kind in "co":
            last = f"k{n}_{j}"
            out.append(call(last, arguments=f'{{"n": {j}}}'))
            if kind == "o":
                last = None
        elif last is not None:
            out.append(result(last, f"result {n}.{j}"))
            last = None
    return out


@settings(max_examples=60)
@given(
    turns=st.lists(_turn, min_size=1, max_size=10),
    max_tokens=st.one_of(st.none(), st.integers(1, 300)),
)
def test_token_totals_and_max_tokens_eviction_match_a_recounting_model(
    turns: list[tuple[str, list[str]]], max_tokens: int | None
) -> None:
    history = TurnHistory(HistoryLimits(low_water=1.0, max_tokens=max_tokens, max_turns=1000))
    model: list[tuple[str, list[Message]]] = []
    evicted: list[Message] = []
    for n, (text, kinds) in enumerate(turns):
        turn_id = f"t{n}"
        history.commit(turn_id, [user(text)], instructions=[SYSTEM] if n == 0 else None)
        outputs = _outputs(n, kinds)
        history.record(turn_id, outputs)
        history.evict()
        model.append((turn_id, [user(text), *outputs]))
        while (
            max_tokens is not None
            and len(model) > 1
            and COUNTER.count([m for _, ms in model for m in ms]) > max_tokens
        ):
            evicted.extend(model.pop(0)[1])
        stats = history.statistics()
        assert history.turn_ids == tuple(t for t, _ in model)
        assert stats.tokens == COUNTER.count([m for _, ms in model for m in ms])
        assert stats.pinned_tokens == COUNTER.count([SYSTEM])
        assert stats.evicted_tokens == COUNTER.count(evicted)
        assert not history.over_limits()
        # The shared run follows the evictions: its tokens are recounted.
        rendered = history.view().render(CHAT, turn_id)
        spans = [ms for _, ms in model[:-1]] + [model[-1][1][:1]]
        assert rendered.tokens == _cold(history.view().pinned, spans, "exclude")[1]


def _cold(
    pinned: tuple[Message, ...], spans: list[list[Message]], policy: Any
) -> tuple[list[Any], int]:
    items: list[Any] = []
    rendered: list[Message] = []
    for span in [list(pinned), *spans]:
        for message in complete_pairs(span, open_calls=policy, join=step_join(CHAT)):
            rendered.append(message)
            items.extend(CHAT.render(message))
    return items, COUNTER.count(rendered)


_scopes = st.sampled_from(
    [
        LastNTurns(1),
        LastNTurns(3),
        LastNTurns(0),
        RoleFilter("user", "assistant"),
        RoleFilter("tool"),
        Since(4),
        AllOf(RoleFilter("assistant"), LastNTurns(2)),
        AnyOf(RoleFilter("user"), Since(7)),
        Not(RoleFilter("tool")),
        AllOf(),
    ]
)


@settings(max_examples=60)
@given(
    turns=st.lists(_turn, min_size=1, max_size=8),
    scope=_scopes,
    policy=st.sampled_from(["exclude", "cancel"]),
)
def test_render_and_render_scoped_equal_a_cold_render_and_count_what_they_render(
    turns: list[tuple[str, list[str]]], scope: ContextScope, policy: Any
) -> None:
    history = TurnHistory()
    spans: list[list[Message]] = []
    for n, (text, kinds) in enumerate(turns):
        history.commit(f"t{n}", [user(text)], instructions=[SYSTEM] if n == 0 else None)
        history.record(f"t{n}", _outputs(n, kinds))
        spans.append([user(text), *_outputs(n, kinds)])
    last = f"t{len(turns) - 1}"
    view = history.view()
    spans[-1] = spans[-1][:1]  # the prepared turn shows its input only
    whole = view.render(CHAT, last, open_calls=policy)
    items, tokens = _cold(view.pinned, spans, policy)
    assert list(whole.items) == items
    assert whole.tokens == tokens
    # The sliced view: the scope indexes the turns' messages in order.
    flat = [m for span in spans for m in span]
    assert list(view.scope_messages(last)) == flat
    keep = scope_indices(scope, flat)
    kept: list[list[Message]] = []
    at = 0
    for span in spans[:-1]:
        kept.append([m for i, m in enumerate(span, at) if i in keep])
        at += len(span)
    kept.append(spans[-1])
    scoped = view.render_scoped(CHAT, last, scope, open_calls=policy)
    items, tokens = _cold(view.pinned, kept, policy)
    assert list(scoped.items) == items
    assert scoped.tokens == tokens
    assert scoped.bytes == sum(len(msgspec.json.encode(i)) for i in items)
    assert scoped.turn_start == len(items) - len(CHAT.render(spans[-1][0]))
    # The shared run is untouched: the next unscoped render is the same, reused.
    again = view.render(CHAT, last, open_calls=policy)
    assert again.items == whole.items and again.tokens == whole.tokens
