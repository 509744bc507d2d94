"""The door's one-message shortcuts give exactly what the general paths give.

``count_message_tokens`` estimates one message for the default counter
without the counter's calls; every other counter goes through
``count_tokens``. Compared on generated messages (the door property's
strategy) and on every recorded provider message (``../shared/data``).
"""

from __future__ import annotations

import contextlib
import copy
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.gateways.test_door_property import GATEWAYS, messages, recorded_messages
from tests.context.test_history import CHAT, SYSTEM, _op, apply_op, assistant, call, result, user
from turnloom.context import (
    ApproxTokenCounter,
    ImagePart,
    Message,
    Role,
    ToolCallPart,
    check_message,
)
from turnloom.context.history import HistoryLimits, TurnHistory
from turnloom.context.history._sent import _decide, door_ids
from turnloom.context.message import check_id, message_size
from turnloom.context.tokens import count_message_tokens, count_tokens
from turnloom.errors import (
    HostCallbackError,
    InvalidMessageError,
    TurnloomError,
    TurnTooLargeError,
    excerpt,
)

_COUNTERS = (
    ApproxTokenCounter(),
    ApproxTokenCounter(image_rule="anthropic"),
    ApproxTokenCounter(image_rule="gemini", image_size=lambda part: (640, 480)),
    ApproxTokenCounter(image_size=lambda part: None),
)


class _Sub(ApproxTokenCounter):
    """A subclass: not the exact class, so counted through ``count_tokens``."""

    def count(self, messages: Any) -> int:
        return 7


def _outcome(fn: Any) -> Any:
    try:
        return ("ok", fn())
    except TurnloomError as exc:
        return (type(exc), str(exc), getattr(exc, "field", None))


def _same_counts(message: Message) -> None:
    for counter in _COUNTERS:
        assert _outcome(lambda c=counter: count_message_tokens(c, message)) == _outcome(
            lambda c=counter: count_tokens(c, (message,))
        )
    assert count_message_tokens(_Sub(), message) == 7


@settings(max_examples=400)
@given(message=messages)
def test_one_message_count_equals_count_tokens_on_generated_messages(message: Message) -> None:
    """Invariant: count_message_tokens(c, m) == count_tokens(c, (m,)) for a checked message."""
    try:
        check_message(message)
    except TurnloomError:
        return
    _same_counts(message)


def test_one_message_count_equals_count_tokens_on_recorded_messages(
    recordings_dir: Any,
) -> None:
    """Invariant: the same on every message of the recorded provider requests."""
    seen = 0
    for data in recorded_messages():
        message = msgspec.convert(data, Message)
        check_message(message)
        _same_counts(message)
        seen += 1
    assert seen > 1000


def test_a_count_over_the_maximum_raises_as_count_tokens_does() -> None:
    """Invariant: an image priced over MAX_TOKEN_COUNT fails the same way on both paths."""
    counter = ApproxTokenCounter(image_rule="gemini", image_size=lambda part: (2**40, 2**40))
    message = Message(role=Role.user, content=(ImagePart(url="https://x/a.png"),))
    check_message(message)
    fast = _outcome(lambda: count_message_tokens(counter, message))
    assert fast[0] is HostCallbackError
    assert fast == _outcome(lambda: count_tokens(counter, (message,)))


@pytest.mark.parametrize("text", ["", "a", "abcd", "abcde", "\u00e9\u00e9\u00e9"])
def test_one_message_count_is_the_documented_estimate(text: str) -> None:
    """Invariant: the exact numbers (3 framing + role + a quarter of each text, rounded up)."""
    message = Message(role=Role.user, content=text, name="bob")
    expected = 3 + (len("user") + 3) // 4 + 1 + 1 + (len(text) + 3) // 4
    assert count_message_tokens(ApproxTokenCounter(), message) == expected


# -- the door's check of a one-message list or tuple ---------------------------


class _Batch(list):  # type: ignore[type-arg]
    """A list of another type: the door checks it through its general batch path."""


def _error(exc: BaseException) -> tuple[Any, ...]:
    return (type(exc), str(exc), sorted(vars(exc).items(), key=lambda kv: kv[0]))


def _memo_of(history: TurnHistory) -> tuple[Any, ...]:
    """The door's two memos, comparable across histories (the turns by identity)."""
    return tuple(_one_memo(history, memo) for memo in history._checked)


def _one_memo(history: TurnHistory, memo: Any) -> tuple[Any, ...]:
    messages, sizes, renders, gateway, turns, turn_id, pinned, plan, held = memo
    return (
        tuple(msgspec.json.encode(m) for m in messages),
        tuple(msgspec.json.encode(m) for m in held),
        sizes,
        renders,
        gateway,
        turns is history._turns if turns is not None else None,
        turn_id,
        pinned,
        None if plan is None else (plan.version, plan.turn_id, plan.sent, plan.claims),
    )


def _check(
    history: TurnHistory, batch: Any, where: str, turn_id: Any, pinned: bool, gateway: Any
) -> tuple[Any, ...]:
    try:
        return (
            "ok",
            history.check_batch(batch, where, turn_id=turn_id, pinned=pinned, gateway=gateway),
        )
    except TurnloomError as exc:
        return _error(exc)


_ONE_OPS = st.lists(_op, max_size=25)
_EDGE_MESSAGES = st.sampled_from(
    [
        ("call", "c1"),
        ("call", "c2"),
        ("result", "c1"),
        ("result", "c3"),
        ("text", "x" * 300),
        ("text", ""),
    ]
)


def _edge(spec: tuple[str, str]) -> Message:
    kind, value = spec
    if kind == "call":
        return call(value)
    if kind == "result":
        return result(value)
    return assistant(value)


@settings(max_examples=400)
@given(
    ops=_ONE_OPS,
    drawn=messages | _EDGE_MESSAGES,
    target=st.integers(-2, 5),
    pinned=st.booleans(),
    gateway=st.none() | st.sampled_from(GATEWAYS),
    tight=st.sampled_from([None, (2, 400, 200), (12, 2000, 150), (3, 250, 1000)]),
    as_tuple=st.booleans(),
)
def test_a_one_message_batch_is_checked_as_the_general_path_checks_it(
    ops: list[tuple[str, int]],
    drawn: Any,
    target: int,
    pinned: bool,
    gateway: Any,
    tight: tuple[int, int, int] | None,
    as_tuple: bool,
) -> None:
    """Invariant: check_batch of a list or tuple of one message (its own path) and of
    the same message in another Sequence type (the general path), in two histories
    built alike, give the same sizes or the same error (type, text, fields), the same
    memo (sizes, renders, sent ids decided), the same answer when asked again, and the
    same record afterwards (its outcome and the history's render)."""
    limits = HistoryLimits(low_water=1.0, max_turns=4, max_items=12)
    if tight is not None:
        items, total, cap = tight
        limits = HistoryLimits(max_turns=4, max_items=items, max_bytes=total, max_item_bytes=cap)
    histories = (TurnHistory(limits), TurnHistory(limits))
    for history in histories:
        history.commit("t0", [user("u0")], instructions=[SYSTEM])
        turn = 0
        for kind, n in ops:
            with contextlib.suppress(TurnloomError):
                turn = apply_op(history, kind, n, turn)
    ids = histories[0].turn_ids
    assert ids == histories[1].turn_ids
    turn_id = None if target == -2 else "gone" if target == -1 else ids[target % len(ids)]
    made = [drawn if isinstance(drawn, Message) else _edge(drawn)]
    made.append(copy.deepcopy(made[0]))
    fast = (tuple(made[:1]) if as_tuple else made[:1], histories[0])
    slow = (_Batch(made[1:]), histories[1])
    assert _memo_of(histories[0]) == _memo_of(histories[1])
    for attempt in range(2):  # the check, then the same batch again (the memo)
        outcomes = [
            _check(h, b, "turn 't' output", turn_id, pinned, gateway) for b, h in (fast, slow)
        ]
        assert outcomes[0] == outcomes[1], attempt
        if outcomes[0][0] == "ok":
            assert _memo_of(histories[0]) == _memo_of(histories[1])
    if outcomes[0][0] != "ok" or turn_id is None or pinned:
        return
    recorded = []
    for batch, history in (fast, slow):
        try:
            recorded.append(("ok", history.record(turn_id, batch)))
        except TurnloomError as exc:
            recorded.append(_error(exc))
    assert recorded[0] == recorded[1]
    target_id = histories[0].turn_ids[-1]
    renders = [list(h.view().render(gateway or CHAT, target_id).items) for h in histories]
    assert renders[0] == renders[1]


@pytest.mark.parametrize("as_tuple", [False, True])
@pytest.mark.parametrize("kind", ["call", "result"])
def test_a_one_message_batch_renders_as_sent_when_its_call_id_is_renamed(
    kind: str, as_tuple: bool
) -> None:
    """Invariant: a call reusing a held call id (and a result answering the renamed
    call) is rendered at the door with the id it is sent with, on the one-message
    path as on the general one, and recorded with that render."""
    histories = (TurnHistory(), TurnHistory())
    for history in histories:
        history.commit("t0", [user("u0")])
        history.record("t0", [call("c1")])
        history.record("t0", [result("c1")])
        history.commit("t1", [user("u1")])
        if kind == "result":
            history.record("t1", [call("c1")])
    one = [call("c1") if kind == "call" else result("c1")]
    batches = (tuple(one) if as_tuple else one, _Batch([copy.deepcopy(one[0])]))
    for batch, history in zip(batches, histories, strict=True):
        assert history.check_batch(batch, "w", turn_id="t1", gateway=CHAT) == (
            message_size(one[0]),
        )
    assert _memo_of(histories[0]) == _memo_of(histories[1])
    plan = histories[0]._checked[0][7]
    assert plan is not None and plan.sent is not None and plan.sent[0] not in (None, "c1")
    native = histories[0]._checked[0][2][0][0]
    sent_id = native["tool_calls"][0]["id"] if kind == "call" else native["tool_call_id"]
    assert sent_id == plan.sent[0]
    for batch, history in zip(batches, histories, strict=True):
        assert history.record("t1", batch) == 1
    assert list(histories[0].view().render(CHAT, "t1").items) == list(
        histories[1].view().render(CHAT, "t1").items
    )


def test_a_one_message_check_keeps_the_older_memo_as_the_general_path_does() -> None:
    """Invariant: after a record consumed the newest memo, a check of one message keeps
    the older memo (a batch the door checked and not yet committed) as the general path
    does, so that batch's commit or record still finds its sizes and renders."""
    histories = (TurnHistory(), TurnHistory())
    pending = [_Batch([user("later")]) for _ in histories]
    for history, batch in zip(histories, pending, strict=True):
        history.commit("t0", [user("u0")])
        history.check_batch(batch, "w", gateway=CHAT)
        history.record("t0", _Batch([assistant("a")]))
        assert history._checked[0][0] == ()
    histories[0].check_batch([assistant("b")], "w", turn_id="t0", gateway=CHAT)
    histories[1].check_batch(_Batch([assistant("b")]), "w", turn_id="t0", gateway=CHAT)
    assert _memo_of(histories[0]) == _memo_of(histories[1])
    assert histories[0]._checked[1][0] == tuple(pending[0])


def _limits_for(*messages: Message) -> HistoryLimits:
    """Limits whose byte budget holds exactly ``messages`` (and so not one byte more)."""
    return HistoryLimits(max_bytes=sum(message_size(m) for m in messages))


@pytest.mark.parametrize("wrap", [list, _Batch])
def test_a_record_checks_again_when_its_turn_grew_since_the_door(wrap: Any) -> None:
    """Invariant: the door's memo of a message serves only the state it was checked in:
    after the turn grew (its kept state), the record checks again and is refused,
    nothing changed."""
    u0, state, a = user("u0"), user("kept state"), assistant("reply")
    history = TurnHistory(_limits_for(u0, a))
    history.commit("t0", [u0])
    batch = wrap([a])
    assert history.check_batch(batch, "w", turn_id="t0", gateway=CHAT) == (message_size(a),)
    assert history.keep_state("t0", [state])
    with pytest.raises(TurnTooLargeError) as raised:
        history.record("t0", batch)
    total = message_size(u0) + message_size(state) + message_size(a)
    assert str(raised.value) == (
        f"turn 't0' output would make the turn hold at least {total} bytes, over the "
        f"history's limit of {total - message_size(state)} bytes."
    )
    assert history.view().turn_messages("t0") == (u0,)


@pytest.mark.parametrize("wrap", [list, _Batch])
def test_a_record_to_another_turn_than_the_door_checked_checks_again(wrap: Any) -> None:
    """Invariant: the door's memo of a message checked for one turn does not serve a
    record of it to another turn: that record is checked against its own turn."""
    big, small, a = user("b" * 40), user("s"), assistant("reply")
    history = TurnHistory(HistoryLimits(max_bytes=message_size(big) + message_size(a) - 1))
    history.commit("t0", [big])
    history.commit("t1", [small])
    batch = wrap([a])
    history.check_batch(batch, "w", turn_id="t1", gateway=CHAT)
    with pytest.raises(TurnTooLargeError, match=r"^turn 't0' output would make the turn hold"):
        history.record("t0", batch)
    assert history.view().turn_messages("t0") == (big,)


def _check_id_reference(value: object, what: str) -> object:
    """The id rule written out in full (no ASCII shortcut): the oracle of ``check_id``."""
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(f"The {what} must be a non-empty string, not {excerpt(value)}.")
    if len(value) > 256:
        raise InvalidMessageError(
            f"The {what} {excerpt(value[:32])}... is {len(value)} characters; at most "
            f"256 are allowed."
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError(f"The {what} {excerpt(value)} is not valid UTF-8.") from None
    return value


class _IdStr(str):
    __slots__ = ()


@settings(max_examples=300)
@given(
    value=st.one_of(
        st.text(max_size=6),
        st.text(alphabet="ab", min_size=250, max_size=262),
        st.sampled_from(["", "t1", "\ud800", "\u00e9" * 257, "a" * 256, "a" * 257]),
        st.text(max_size=4).map(_IdStr),
        st.none(),
        st.integers(),
    )
)
def test_check_id_decides_as_the_rule_written_out(value: object) -> None:
    """Invariant: check_id returns the very value or raises the same error as the full rule."""
    expected = _outcome(lambda: _check_id_reference(value, "turn id"))
    got = _outcome(lambda: check_id(value, "turn id"))
    assert got == expected
    if got[0] == "ok":
        assert got[1] is value


def _door_ids_reference(history: TurnHistory, messages: list[Message], turn_id: Any) -> Any:
    """The door's plan by the general rule (:func:`_decide`, no shortcut)."""
    ids, turns = history._sent, history._turns
    claims: list[tuple[str, str]] = []
    decided = _decide(messages, None, turn_id is None, ids, claims)
    return (turns, ids.version, turn_id, None if decided is None else tuple(decided), tuple(claims))


@settings(max_examples=300)
@given(
    ops=_ONE_OPS,
    call_ids=st.lists(st.sampled_from(["c0", "c1", "c2", "d1", "e9"]), min_size=1, max_size=3),
    newest=st.booleans(),
)
def test_the_plan_of_one_message_of_calls_is_the_general_rules(
    ops: list[tuple[str, int]], call_ids: list[str], newest: bool
) -> None:
    """Invariant: door_ids of one message holding calls (no result), each sent as it is
    when its id is free (the shortcut) or renamed (the general rule), equals the plan
    _decide makes: the same sent ids and claims, in the same state."""
    history = TurnHistory(HistoryLimits(low_water=1.0, max_turns=4, max_items=12))
    history.commit("t0", [user("u0")])
    turn = 0
    for kind, n in ops:
        with contextlib.suppress(TurnloomError):
            turn = apply_op(history, kind, n, turn)
    message = Message(
        role=Role.assistant,
        content=tuple(ToolCallPart(call_id=c, name="f", arguments="{}") for c in call_ids),
    )
    turn_id = history.turn_ids[-1] if newest else None
    position = len(history.turn_ids) - 1 if newest else len(history.turn_ids)
    plan = door_ids(history, [message], turn_id, position)
    expected = _door_ids_reference(history, [message], turn_id)
    assert (plan.turns, plan.version, plan.turn_id, plan.sent, plan.claims) == expected
    assert plan.turns is history._turns
