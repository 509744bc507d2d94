"""The door refuses a turn whose input is only results answering nothing, on any turn.

Pairing drops a tool result that answers no call the kept turns leave open (never
made, already answered, closed by a later message, evicted with its turn), so an
input made only of such results would leave the turn out of its own prepared
input: an empty model input on Anthropic and Gemini, only the instructions on
OpenAI Chat and Responses. accept_turn refuses it before anything changes, on a
context's first turn and on every later one, by the one rule of the door
(check_snapshot); an input with other content, or a result answering a call
still open, is accepted.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import example, given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import assistant, call, result, user
from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    complete_pairs,
    get_gateway,
)
from turnloom.context.callids import rename_call_ids
from turnloom.context.history import HistoryLimits, HistoryView, TurnHistory
from turnloom.errors import AmbiguousStepError, InvalidMessageError, TurnTooLargeError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._door import _renders_content, check_snapshot

pytestmark = pytest.mark.anyio

SYSTEM = Message(role=Role.system, content="You manage the repository.")
ASK = user("Delete the old branch.")
REFUSED = "has no input that renders to content"


def _valid(kind: GatewayType, items: Any) -> list[str]:
    gateway = get_gateway(kind)
    body = gateway.request_body(list(items))
    return [v.rule for v in gateway.validate(body[gateway.items_field])]


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
@pytest.mark.parametrize("case", ["never-made", "answered", "closed", "evicted"])
async def test_a_later_turn_of_only_results_answering_nothing_is_refused_state_unchanged(
    anyio_backend: str, kind: GatewayType, case: str
) -> None:
    """Invariant: a later turn whose input is only results answering no open call (a call
    never made, one already answered, one closed by a later message, or one evicted with
    its turn under max_turns=1) is refused with InvalidMessageError(field="input"); the
    context keeps its turns and its newest turn prepares exactly as before."""
    limits = HistoryLimits(max_turns=1 if case == "evicted" else 8)
    async with Foundation(gateway=kind, history_limits=limits) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        if case == "answered":  # c1 answered by t2: no call c1 is open any more
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
        elif case in ("closed", "evicted"):  # t2's text closes c1 (and evicts t1 in one turn)
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("Wait."),)))
        turns = manager.history("c").turn_ids
        assert (
            turns
            == {
                "never-made": ("t1",),
                "answered": ("t1", "t2"),
                "closed": ("t1", "t2"),
                "evicted": ("t2",),
            }[case]
        )
        newest, orphan = turns[-1], ("c9" if case == "never-made" else "c1")
        request = ContextPrepareRequest(context_id="c", turn_id=newest)
        before = list((await manager.prepare(request)).items)
        with pytest.raises(InvalidMessageError, match=REFUSED) as caught:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(result(orphan),)))
        assert caught.value.field == "input"
        assert "only tool results answering no call" in str(caught.value)
        assert manager.history("c").turn_ids == turns
        assert list((await manager.prepare(request)).items) == before
        assert _valid(kind, before) == []


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_results_answering_nothing_beside_text_are_accepted_and_left_out(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: other content keeps the input non-empty: [result(c9), user text] is
    accepted; the prepared input is the history, then the text alone (the result dropped)."""
    gateway = get_gateway(kind)
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [assistant("Which branch?")])
        text = user("The old one.")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c9"), text)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert list(prepared.items) == [
            *gateway.render(SYSTEM),
            *gateway.render(ASK),
            *gateway.render(assistant("Which branch?")),
            *gateway.render(text),
        ]
        assert _valid(kind, prepared.items) == []


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_a_reused_call_id_is_answered_once_per_call(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: t2 answers c1; a second result for c1 answers nothing and is refused;
    once the model calls c1 again (the id reused), the same result answers the new call
    and is accepted; the prepared input is the cold render (instructions and five messages)."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
        with pytest.raises(InvalidMessageError, match=REFUSED):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(result("c1"),)))
        manager.record("c", "t2", [call("c1", "delete_branch")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(result("c1"),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        items = list(prepared.items)
        gateway = get_gateway(kind)
        messages = complete_pairs(list(manager.history("c").sent_messages("t3")))
        assert items == rename_call_ids(kind, [i for m in messages for i in gateway.render(m)])
        assert [m.role for m in messages] == [
            Role.system,
            Role.user,
            *[Role.assistant, Role.tool] * 2,
        ]
        assert _valid(kind, items) == []


# -- property: over generated histories, every committed turn prepares valid ------


def _kept(view: HistoryView) -> list[Message]:
    """Every kept message, oldest first: each turn's input, kept state, then outputs."""
    out: list[Message] = []
    for turn_id in view.turn_ids:
        given = view.turn_input(turn_id)
        out += [*given, *view.turn_state(turn_id), *view.turn_messages(turn_id)[len(given) :]]
    return out


def _input(history: TurnHistory, kind: str, n: int, step: int) -> list[Message]:
    """A turn's input: plain text, or results for open, answered, made-up or reused ids."""
    open_ids = [c.call_id for c in history.open_calls()]
    if kind == "user":
        return [user(f"question {step}")]
    if kind == "answer" and open_ids:
        return [result(i, f"done {i}") for i in open_ids[: 1 + n % len(open_ids)]]
    ids = [f"c{n % 3}", f"z{n}"]  # c0..c2 are reused by the model: answered or closed
    answer = [result(ids[n % 2])]
    return [*answer, user("and?")] if n >= 4 else answer


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["user", "answer", "orphan", "calls", "text", "evict"]),
        st.integers(0, 5),
    ),
    min_size=1,
    max_size=30,
)


@settings(max_examples=150)
@given(
    st.sampled_from(list(GatewayType)),
    st.builds(HistoryLimits, max_turns=st.integers(1, 5), max_items=st.integers(4, 16)),
    _OPS,
)
@example(GatewayType.anthropic, HistoryLimits(max_turns=1), [("text", 0), ("orphan", 1)])
@example(GatewayType.gemini, HistoryLimits(max_turns=3), [("calls", 0), ("answer", 0)])
@example(GatewayType.openai_chat, HistoryLimits(max_turns=3), [("calls", 0), ("orphan", 0)])
def test_every_committed_turn_prepares_valid_and_a_refusal_is_exactly_an_empty_turn(
    kind: GatewayType, limits: HistoryLimits, ops: list[tuple[str, int]]
) -> None:
    """Invariant: the door (check_snapshot) refuses a turn exactly when its input, paired
    after every kept message, adds nothing to the completed history (oracle:
    complete_pairs of the kept messages with and without the input are equal), and then
    nothing changed; every turn it lets through commits, evicts, and prepares an input
    that holds the turn's own input and passes validate()."""
    gateway = get_gateway(kind)
    history = TurnHistory(limits)
    history.commit("t0", [user("hello")], instructions=[SYSTEM])
    for step, (op, n) in enumerate(ops, start=1):
        newest = history.turn_ids[-1]
        if op == "calls":
            call_ids = [f"c{(n + k) % 3}" for k in range(1 + n % 2)]
            outputs = [call(i, "delete_branch") for i in call_ids]
            try:
                history.record(newest, outputs)
            except (TurnTooLargeError, AmbiguousStepError):  # refused: nothing changed
                pass
        elif op == "text":
            try:
                history.record(newest, [assistant(f"answer {step}")])
            except TurnTooLargeError:
                pass
        elif op == "evict":
            history.evict()
        else:
            given = _input(history, op, n, step)
            kept = _kept(history.view())
            empty = complete_pairs([*kept, *given]) == complete_pairs(kept)
            snapshot = TurnSnapshot(context_id="c", turn_id=f"t{step}", input=tuple(given))
            statistics = history.statistics()
            try:
                check_snapshot(snapshot, gateway, lambda _: history)
            except InvalidMessageError:
                assert empty
                assert history.statistics() == statistics
                continue
            assert not empty
            try:
                history.commit(snapshot.turn_id, given)
            except TurnTooLargeError:
                assert history.statistics() == statistics
                continue
            history.evict()
            rendered = history.view().render(gateway, snapshot.turn_id)
            assert rendered.turn_start < len(rendered.items)
            assert _valid(kind, rendered.items) == []


_PARTS: st.SearchStrategy[Part] = st.sampled_from(
    [
        TextPart(text=""),
        TextPart(text=" \n"),
        TextPart(text="ok"),
        TextPart(text="", extras={"thoughtSignature": "c2ln"}),
        ReasoningPart(text=""),
        ImagePart(url="https://example.com/a.png"),
        ToolCallPart(call_id="a", name="f"),
        ToolResultPart(call_id="a", content=(TextPart(text="1"),)),
        ToolResultPart(call_id="b", content=(TextPart(text="2"),)),
    ]
)


@st.composite
def _inputs(draw: st.DrawFn) -> list[Message]:
    out = []
    for _ in range(draw(st.integers(1, 3))):
        parts: list[Part] = draw(st.lists(_PARTS, min_size=1, max_size=3, unique_by=id))
        calls = any(type(p) is ToolCallPart for p in parts)
        results = any(type(p) is ToolResultPart for p in parts)
        if calls and results:
            parts = [p for p in parts if type(p) is not ToolCallPart]
            calls = False
        role = Role.assistant if calls else draw(st.sampled_from([Role.user, Role.tool]))
        if role is Role.tool:
            parts = [p for p in parts if type(p) is ToolResultPart] or [ToolResultPart(call_id="b")]
        out.append(Message(role=role, content=tuple(parts)))
    return out


@settings(max_examples=300, deadline=None)
@given(input=_inputs(), open_call=st.booleans())
def test_the_content_fast_path_decides_as_pairing(input: list[Message], open_call: bool) -> None:
    """Invariant (one rule at the door, decided the cheap way where it can be): the
    door's content test (after the render's item count) says an input keeps content
    exactly when pairing keeps some of it, against the calls the kept history leaves
    open; an input without calls or results is decided without pairing (content iff
    a part is not blank), and decides the same.

    Mutant tried: the fast path counting a blank text part as content (the input
    of blank text alone is then accepted): this test fails."""
    history = TurnHistory(HistoryLimits())
    history.commit("t0", [user("go")])
    if open_call:
        history.record("t0", [call("a")])
    results = any(m.tool_results for m in input)
    carried = history.open_calls() if results else ()
    assert _renders_content(input, history) is bool(complete_pairs(input, carried=carried))
