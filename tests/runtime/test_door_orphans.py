"""The door refuses a tool result that answers no call open at its place, unless a call
recorded late can still answer it.

Pairing (CallTracker) drops a result without its call, since no provider accepts one:
a call never made, one already answered, one closed by a later message, one evicted
with its turn. Where nothing can change that, such a result would vanish from every
prepared input, so accept_turn, record and build refuse it with UnpairedResultError
(an InvalidMessageError naming the message and the call id) before anything changes:
a result after anything that starts or ends a call group in its turn (text, a model
step), a result in a context's first turn, a result of a build's continuation. A
result leading a later turn's input (or recorded to a turn holding only such results)
may still be answered by a call recorded late to an earlier turn (a host that
committed the result before recording the call): it is kept, and left out until
then. An input left with nothing to render is refused by the door's content test. A
log an earlier turnloom wrote with unpaired results restores as it was.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
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
from turnloom.errors import (
    AmbiguousStepError,
    InvalidMessageError,
    TurnTooLargeError,
    UnknownContextError,
    UnpairedResultError,
)
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime._door import _renders_content, check_snapshot
from turnloom.runtime._records import OutputsRecorded, TurnCommitted, encode_record, replay

pytestmark = pytest.mark.anyio

SYSTEM = Message(role=Role.system, content="You manage the repository.")
ASK = user("Delete the old branch.")
EMPTY = "has no input that renders to content"


def _valid(kind: GatewayType, items: Any) -> list[str]:
    gateway = get_gateway(kind)
    body = gateway.request_body(list(items))
    return [v.rule for v in gateway.validate(body[gateway.items_field])]


async def _context(manager: Any, case: str) -> tuple[str, ...]:
    """t1 makes call c1; then c1 is answered, closed or evicted as ``case`` says."""
    manager.accept_turn(
        TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
    )
    manager.record("c", "t1", [call("c1", "delete_branch")])
    if case == "answered":  # c1 answered by t2: no call c1 is open any more
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
    elif case in ("closed", "evicted"):  # t2's text closes c1 (and evicts t1 in one turn)
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("Wait."),)))
    turns: tuple[str, ...] = manager.history("c").turn_ids
    return turns


_TURNS = {
    "never-made": ("t1",),
    "answered": ("t1", "t2"),
    "closed": ("t1", "t2"),
    "evicted": ("t2",),
}


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
@pytest.mark.parametrize("case", list(_TURNS))
@pytest.mark.parametrize("shape", ["after-text", "after-a-step"])
async def test_an_input_result_after_other_content_answering_nothing_is_refused(
    anyio_backend: str, kind: GatewayType, case: str, shape: str
) -> None:
    """Invariant: an input result that answers no open call (a call never made, one
    already answered, one closed by a later message, or one evicted with its turn under
    max_turns=1) after user text or after a model step of the input (whose group it
    then belongs to) is refused with UnpairedResultError naming the message and the call
    id; the context keeps its turns and its counters, and its newest turn prepares
    exactly as before.

    Mutant tried: every result of an input treated as one a late call may answer (the
    first group boundary ignored): this test fails."""
    limits = HistoryLimits(max_turns=1 if case == "evicted" else 8)
    async with Foundation(gateway=kind, history_limits=limits) as foundation:
        manager = foundation.manager
        turns = await _context(manager, case)
        assert turns == _TURNS[case]
        orphan = result("c9" if case == "never-made" else "c1")
        lead = user("Done?") if shape == "after-text" else call("c5")
        given = (lead, orphan) if shape == "after-text" else (lead, result("c5"), orphan)
        request = ContextPrepareRequest(context_id="c", turn_id=turns[-1])
        before = list((await manager.prepare(request)).items)
        statistics = manager.statistics()
        with pytest.raises(UnpairedResultError) as caught:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=given))
        assert (caught.value.field, caught.value.call_id) == (
            f"Turn 't3' input[{len(given) - 1}]",
            orphan.parts[0].call_id,
        )
        assert isinstance(caught.value, InvalidMessageError)
        assert manager.history("c").turn_ids == turns
        assert manager.statistics() == statistics
        assert list((await manager.prepare(request)).items) == before
        assert _valid(kind, before) == []


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
@pytest.mark.parametrize("case", list(_TURNS))
async def test_an_input_of_only_results_answering_nothing_is_refused_as_empty(
    anyio_backend: str, kind: GatewayType, case: str
) -> None:
    """Invariant: an input made only of results answering no open call would leave the
    turn out of its own prepared input, so the door's content test refuses it with
    InvalidMessageError(field="input"), state unchanged."""
    limits = HistoryLimits(max_turns=1 if case == "evicted" else 8)
    async with Foundation(gateway=kind, history_limits=limits) as foundation:
        manager = foundation.manager
        turns = await _context(manager, case)
        orphan = result("c9" if case == "never-made" else "c1")
        statistics = manager.statistics()
        with pytest.raises(InvalidMessageError, match=EMPTY) as caught:
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(orphan,)))
        assert type(caught.value) is InvalidMessageError
        assert caught.value.field == "input"
        assert manager.history("c").turn_ids == turns
        assert manager.statistics() == statistics


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_a_result_leading_an_input_is_kept_until_a_late_call_answers_it(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: t2's input [result(c9), text] is accepted although no call c9 is held
    (the host committed the result before recording the call), and left out of t2's
    prepared input; once c9 is recorded late to t1, t3's input holds the call and its
    result, valid. The same result in a context's first turn, which no late call can
    precede, is refused (UnpairedResultError)."""
    gateway = get_gateway(kind)
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        text = user("The old one.")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c9"), text)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert list(prepared.items) == [
            *gateway.render(SYSTEM),
            *gateway.render(ASK),
            *gateway.render(text),
        ]
        manager.record("c", "t1", [call("c9", "delete_branch")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("Next"),)))
        messages = complete_pairs(list(manager.history("c").sent_messages("t3")))
        assert [m.role for m in messages] == [
            Role.system,
            Role.user,
            Role.assistant,
            Role.tool,
            Role.user,
            Role.user,
        ]
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        assert _valid(kind, prepared.items) == []
        with pytest.raises(UnpairedResultError) as caught:
            manager.accept_turn(
                TurnSnapshot(context_id="other", turn_id="t1", input=(result("c9"), text))
            )
        assert caught.value.field == "Turn 't1' input[0]"
        with pytest.raises(UnknownContextError):
            manager.history("other")


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
@pytest.mark.parametrize("case", ["never-made", "answered", "closed-by-input", "after-paired"])
async def test_a_recorded_result_answering_nothing_is_refused_nothing_recorded(
    anyio_backend: str, kind: GatewayType, case: str
) -> None:
    """Invariant: record refuses an output result that answers no call open at its place
    (never made; answered already, recorded twice without a message id; closed by the
    turn's input text; after a result of the batch that pairs) with UnpairedResultError
    naming the output; the turn's messages are as before (nothing of the batch kept)."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [call("c1", "delete_branch")])
        turn, batch, at = "t1", [result("c9")], 0
        if case == "answered":
            manager.record("c", "t1", [result("c1")])
            batch = [result("c1", "again")]
        elif case == "closed-by-input":
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(user("Go."),)))
            turn, batch = "t2", [result("c1")]
        elif case == "after-paired":
            batch, at = [result("c1"), result("c9")], 1
        held = manager.history("c").turn_messages(turn)
        with pytest.raises(UnpairedResultError) as caught:
            manager.record("c", turn, batch)
        assert (caught.value.field, caught.value.call_id) == (
            f"Turn {turn!r} output[{at}]",
            batch[at].parts[0].call_id,
        )
        assert manager.history("c").turn_messages(turn) == held


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_a_turn_answering_calls_of_the_turn_before_takes_their_other_results(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: t1's step makes c1 and c2 (one message per call); t2's input answers c1;
    record to t2 then takes c2's result (the calls t1 leaves open carry into t2, which
    has no step of its own) and refuses one after t2's own step began;
    build(recorded=True) of t2, whose prefix closed c2, lets the recorded result through
    and leaves it out; t3 prepares t1's calls with both results, valid.

    Mutants tried: record never letting a result of a turn without a step of its own
    await its call (c2's result refused); build checking recorded outputs as the host's
    own: this test fails."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        manager.record("c", "t1", [call("c1", "delete_branch"), call("c2", "notify")])
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t2", input=(result("c1"),)))
        assert manager.record("c", "t2", [result("c2", "sent")]) == 1
        # t2's own model calls start from its prefix, which closed c2 (the provider
        # needs every call answered before the next call): the recorded result
        # is let through build, and left out.
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert manager.build(prefix, recorded=True) == prefix.items
        with pytest.raises(UnpairedResultError) as caught:  # after t2's own step began
            manager.record("c", "t2", [assistant("Deleted."), result("c2", "sent")])
        assert (caught.value.field, caught.value.call_id) == ("Turn 't2' output[1]", "c2")
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t3", input=(user("Thanks"),)))
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t3"))
        messages = complete_pairs(list(manager.history("c").sent_messages("t3")))
        assert [m.role for m in messages] == [
            Role.system,
            Role.user,
            Role.assistant,
            Role.assistant,
            Role.tool,
            Role.tool,
            Role.user,
        ]
        assert _valid(kind, prepared.items) == []


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_build_refuses_a_continuation_result_answering_nothing(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: build refuses a continuation result that answers no call of the
    continuation (UnpairedResultError, field naming it); a result answering a call two
    messages back, after another result of the step, passes, also when the call came in
    an earlier build (the step before the new messages is read back over its results).

    Mutant tried: the step before the new messages read back over assistant messages
    only (the second build's result(b) refused): this test fails."""
    gateway = get_gateway(kind)
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(context_id="c", turn_id="t1", input=(ASK,), instructions=(SYSTEM,))
        )
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        with pytest.raises(UnpairedResultError) as caught:
            manager.build(prefix, [call("a"), result("a"), result("z")])
        assert (caught.value.field, caught.value.call_id) == ("continuation[2]", "z")
        steps = [
            Message(
                role=Role.assistant,
                content=(ToolCallPart(call_id="a", name="f"), ToolCallPart(call_id="b", name="f")),
            ),
            result("a"),
        ]
        manager.build(prefix, steps)
        steps.append(result("b"))
        items = manager.build(prefix, steps)
        assert (
            list(items)
            == [
                *prefix.items,
                *rename_call_ids(kind, [i for m in steps for i in gateway.render(m)]),
            ][: len(items)]
        )
        assert _valid(kind, items) == []


def test_a_log_an_earlier_turnloom_wrote_with_unpaired_results_restores_as_it_was() -> None:
    """Invariant (stored logs stay readable): a commit and a record holding results
    answering no call, as turnloom stored them before refusing them, replay into a
    history holding them exactly, and its render leaves them out as before."""
    t1 = (user("Hi"), result("c9"))
    outputs = (assistant("Hello"), result("c8"))
    log = [
        encode_record(TurnCommitted(turn_id="t1", input=t1, instructions=(SYSTEM,))),
        encode_record(OutputsRecorded(turn_id="t1", outputs=outputs)),
    ]
    history = replay("c", log, HistoryLimits())
    assert history.view().turn_messages("t1") == (*t1, *outputs)
    history.commit("t2", [user("Next")])
    assert complete_pairs(list(history.view().sent_messages("t2"))) == [
        SYSTEM,
        user("Hi"),
        assistant("Hello"),
        user("Next"),
    ]
    with pytest.raises(UnpairedResultError):
        TurnHistory(HistoryLimits()).commit("t1", t1)


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
        with pytest.raises(InvalidMessageError, match=EMPTY):
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


@pytest.mark.parametrize("kind", list(GatewayType), ids=lambda k: k.value)
async def test_an_input_of_blank_text_is_refused_as_empty(
    anyio_backend: str, kind: GatewayType
) -> None:
    """Invariant: an input that renders to nothing (blank text; an open call alone) is
    refused by the door's content test with InvalidMessageError(field="input")."""
    async with Foundation(gateway=kind) as foundation:
        manager = foundation.manager
        for given in ((user(" \n"),), (call("c1"),)):
            with pytest.raises(InvalidMessageError, match=EMPTY) as caught:
                manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=given))
            assert type(caught.value) is InvalidMessageError
            assert caught.value.field == "input"


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
    return {4: [*answer, user("and?")], 5: [user("and?"), *answer]}.get(n, answer)


_OPS = st.lists(
    st.tuples(
        st.sampled_from(["user", "answer", "orphan", "calls", "text", "evict", "late"]),
        st.integers(0, 5),
    ),
    min_size=1,
    max_size=30,
)


def _results(messages: list[Message]) -> int:
    return sum(len(m.tool_results) for m in messages)


def _results_only(message: Message) -> bool:
    """A message that neither starts nor ends a call group: only tool results."""
    return bool(message.tool_results) and len(message.tool_results) == len(message.parts)


def _dropped(kept: list[Message], given: list[Message]) -> list[int]:
    """The oracle: the messages of ``given`` holding a result that pairing ``given`` after
    ``kept`` leaves out (complete_pairs, one message more at a time)."""
    out = []
    for i in range(len(given)):
        before = _results(complete_pairs([*kept, *given[:i]]))
        if _results(complete_pairs([*kept, *given[: i + 1]])) - before < _results(given[i : i + 1]):
            out.append(i)
    return out


def _door_commit(history: TurnHistory, gateway: Any, snapshot: TurnSnapshot) -> None:
    """Commit ``snapshot`` as accept_turn does: the runtime door, then the history's."""
    check_snapshot(snapshot, gateway, lambda _: history)
    history.commit(snapshot.turn_id, list(snapshot.input))


def _taken(
    history: TurnHistory,
    statistics: object,
    change: Callable[[], object],
    refused: bool,
    empty: bool = False,
) -> bool:
    """Run ``change``; True when the door let it through. A refusal is the one the
    oracle expects (UnpairedResultError exactly when ``refused``, the content test's
    InvalidMessageError only when ``empty``, TurnTooLargeError whenever the limits say
    so) and changes nothing; a change let through was expected neither way."""
    try:
        change()
    except UnpairedResultError:
        assert refused
    except TurnTooLargeError:
        pass
    except InvalidMessageError:
        assert empty and not refused
    else:
        assert not refused and not empty
        return True
    assert history.statistics() == statistics
    return False


@settings(max_examples=200)
@given(
    st.sampled_from(list(GatewayType)),
    st.builds(HistoryLimits, max_turns=st.integers(1, 5), max_items=st.integers(4, 16)),
    _OPS,
)
@example(GatewayType.anthropic, HistoryLimits(max_turns=1), [("text", 0), ("orphan", 1)])
@example(GatewayType.gemini, HistoryLimits(max_turns=3), [("calls", 0), ("answer", 0)])
@example(GatewayType.openai_chat, HistoryLimits(max_turns=3), [("calls", 0), ("orphan", 0)])
@example(GatewayType.openai_chat, HistoryLimits(), [("calls", 1), ("answer", 0), ("late", 1)])
@example(GatewayType.openai_chat, HistoryLimits(), [("calls", 1), ("orphan", 5)])
# A result recorded to an approval turn (results only) may await a late call ...
@example(GatewayType.openai_chat, HistoryLimits(), [("calls", 1), ("answer", 0), ("late", 0)])
# ... one recorded to a turn whose input was text may not.
@example(GatewayType.openai_chat, HistoryLimits(), [("user", 0), ("late", 0)])
def test_the_door_refuses_exactly_the_results_no_late_call_can_answer(
    kind: GatewayType, limits: HistoryLimits, ops: list[tuple[str, int]]
) -> None:
    """Invariant: a turn's input (check_snapshot, then commit) and a record to the newest
    turn are refused with UnpairedResultError exactly when pairing them after every kept
    message leaves out a result (oracle: complete_pairs of the kept messages with and
    without it) that comes after a message starting or ending a call group in its turn,
    that is in the only kept turn, or that repeats the call id of a result its turn
    holds (no call recorded late to an earlier turn can then answer it); an input
    otherwise adding nothing is refused as empty; refusals change nothing; every turn
    let through commits, evicts, and prepares an input that holds the turn's own input
    and passes validate().

    Mutants tried, each failing this test: the commit never letting a result await a
    late call; a record to a turn of results only refusing what a late call may answer;
    a record reading only the turn's step tail (a turn holding text then lets a result
    await a call)."""
    gateway = get_gateway(kind)
    history = TurnHistory(limits)
    history.commit("t0", [user("hello")], instructions=[SYSTEM])
    for step, (op, n) in enumerate(ops, start=1):
        newest = history.turn_ids[-1]
        statistics = history.statistics()
        if op == "calls":
            call_ids = [f"c{(n + k) % 3}" for k in range(1 + n % 2)]
            outputs = [call(i, "delete_branch") for i in call_ids]
            try:
                history.record(newest, outputs)
            except (TurnTooLargeError, AmbiguousStepError):  # refused: nothing changed
                assert history.statistics() == statistics
        elif op == "text":
            try:
                history.record(newest, [assistant(f"answer {step}")])
            except TurnTooLargeError:
                assert history.statistics() == statistics
        elif op == "evict":
            history.evict()
        elif op == "late":  # a result recorded to the newest turn
            outputs = _input(history, "answer" if n % 2 else "orphan", n, step)[:1]
            view = history.view()
            own = view.turn_messages(newest)
            bounded = len(view.turn_ids) == 1 or not all(map(_results_only, own))
            # A late call joins one group: a result repeating an id the turn's
            # results answered can never pair either.
            answered = {r.call_id for m in own for r in m.tool_results}
            repeated = any(r.call_id in answered for m in outputs for r in m.tool_results)
            refused = bool(_dropped(_kept(view), outputs)) and (bounded or repeated)
            _taken(history, statistics, partial(history.record, newest, outputs), refused)
        else:
            given = _input(history, op, n, step)
            kept = _kept(history.view())
            refused = any(not all(map(_results_only, given[:i])) for i in _dropped(kept, given))
            empty = complete_pairs([*kept, *given]) == complete_pairs(kept)
            snapshot = TurnSnapshot(context_id="c", turn_id=f"t{step}", input=tuple(given))
            commit = partial(_door_commit, history, gateway, snapshot)
            if not _taken(history, statistics, commit, refused, empty):
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
