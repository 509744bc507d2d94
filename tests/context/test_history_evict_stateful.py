"""A hypothesis state machine attacking the render cache around evictions.

Rules: commit turns (user text, or an approval answering the newest turn's
open calls), record outputs (text, calls and results whose ids come from a
pool of three, so ids are reused within a turn, across turns, across kept and
evicted turns and across the two histories), record late outputs for an
earlier turn, keep a state pair, evict, retract the newest turn (a false
start), commit a false start that evicts, render it (maybe failing part-way)
and retract it, and render: on any of the four gateways, either open-call
policy, the newest or an earlier turn, read as items or as body bytes only,
and renders that fail part-way (the gateway raising on a message, the token
counter raising, or a step of renaming anew raising). Histories remember 0,
1, 2 or 1,024 evicted ids, and evict one turn at a time or down to a
low-water mark (several turns at once, all restored by a retraction).

Invariants: every render that returns equals a cold render of the same
history: its items, its request body bytes, its byte and token counts, its
byte offsets, and its common prefix length with the previous render of the
same gateway and policy. A false start committed, evicting, and retracted
leaves the history as it was before its commit (see :func:`_false_start`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from types import ModuleType
from typing import Any

import msgspec
from hypothesis import settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule

from tests.context import test_history as plain
from tests.context.history_patch import history_modules
from tests.context.test_history import SYSTEM, _answer, plain_common_length
from turnloom.context import (
    Gateway,
    GatewayType,
    Message,
    NativeContent,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    complete_pairs,
    get_gateway,
    message_size,
)
from turnloom.context.callids import rename_call_ids
from turnloom.context.gateway import step_join
from turnloom.context.history import HistoryLimits, RenderedHistory, TurnHistory
from turnloom.context.pairing import OpenCallPolicy
from turnloom.errors import (
    AmbiguousStepError,
    DuplicateIdError,
    StateError,
    TurnTooLargeError,
    UnknownTurnError,
    UnpairedResultError,
)

KINDS = list(GatewayType)
HISTORIES = ("a", "b")
# Steps of rendering anew that a render may fail in (names bound in the history modules).
PATCHABLE = ("restore_call_ids", "record_renames", "encode_item", "decode_joined", "split_chunk")

_FAILS = st.sampled_from(["none"] * 6 + ["gateway", "counter", *PATCHABLE])


_MEMO: dict[tuple[str, ...], Message] = {}


def _memo(*key: str) -> Message:
    """One message object per key: the same objects recur across turns and histories."""
    message = _MEMO.get(key)
    if message is None:
        maker = getattr(plain, key[0])
        message = _MEMO[key] = maker(*key[1:])
    return message


def user(text: str) -> Message:
    return _memo("user", text)


def assistant(text: str) -> Message:
    return _memo("assistant", text)


def call(call_id: str, name: str = "lookup") -> Message:
    return _memo("call", call_id, name)


def result(call_id: str, text: str = "ok") -> Message:
    return _memo("result", call_id, text)


# Call ids reused from a pool of three; in the last two, ids the Anthropic rule
# fixes (a character it refuses becomes "_") collide with one another.
POOLS = [
    ("c0", "c1", "c2"),
    ("c.0", "c_0", "c0"),
    ("a b", "a_b", "a.b"),
    ("c0", "c0_r2", "c0_r3"),
    ("c.0_r2", "c_0", "c.0"),
]


def _multi_call(first: str, second: str, n: int) -> Message:
    """An assistant message with text and two calls."""
    return Message(
        role=Role.assistant,
        content=(
            TextPart(text=f"calling {n}"),
            ToolCallPart(call_id=first, name="lookup", arguments="{}"),
            ToolCallPart(call_id=second, name="search", arguments='{"q": 1}'),
        ),
    )


def _text_call(call_id: str, n: int) -> Message:
    """An assistant message with text before its one call (a later message of a split step)."""
    return Message(
        role=Role.assistant,
        content=(TextPart(text=f"and {n}"), ToolCallPart(call_id=call_id, name="fetch")),
    )


def _multi_result(first: str, second: str, n: int) -> Message:
    """A tool message answering both calls of :func:`_multi_call`."""
    return Message(
        role=Role.tool,
        content=(
            ToolResultPart(call_id=first, content=(TextPart(text=f"m{n}"),)),
            ToolResultPart(call_id=second, content=(TextPart(text=f"n{n}"),)),
        ),
    )


class Injected(Exception):
    """The injected failure."""


class Counter:
    """Tokens: the characters of each message's text; raises when ``fail`` is set."""

    def __init__(self) -> None:
        self.fail = False

    def count(self, messages: Sequence[Message]) -> int:
        if self.fail:
            raise Injected("token counter")
        return sum(1 + len(msgspec.json.encode(m.content)) % 7 for m in messages)


def _flaky_gateway(kind: GatewayType) -> Gateway:
    """The ``kind`` gateway's class, raising on its ``fail_in``-th render from now."""
    base = type(get_gateway(kind))

    class Flaky(base):  # type: ignore[valid-type,misc]
        fail_in: int | None = None

        def render(self, message: Message) -> list[NativeContent]:
            if self.fail_in is not None:
                self.fail_in -= 1
                if self.fail_in < 0:
                    self.fail_in = None
                    raise Injected("gateway render")
            out: list[NativeContent] = super().render(message)
            return out

    gateway: Gateway = Flaky()
    return gateway


def _cold(
    history: TurnHistory, turn_id: str, gateway: Gateway, policy: OpenCallPolicy
) -> tuple[list[NativeContent], list[Message]]:
    base = get_gateway(gateway.type)
    messages = complete_pairs(
        list(history.view().sent_messages(turn_id)), open_calls=policy, join=step_join(base)
    )
    items = rename_call_ids(gateway.type, [i for m in messages for i in base.render(m)])
    # Tokens are those of the messages as the host gave them (counted when they
    # entered); a message pairing made or changed is counted as sent.
    given = list(history.view().input_messages(turn_id))
    held = {id(m) for m in given}
    as_given = complete_pairs(given, open_calls=policy, join=step_join(base))
    assert len(as_given) == len(messages)  # renaming changes no pairing
    counted = [g if id(g) in held else m for g, m in zip(as_given, messages, strict=True)]
    return items, counted


def _observe(history: TurnHistory, counter: Counter) -> dict[str, Any]:
    """What a false start's retraction must give back: every observable, and the
    bookkeeping behind them (held and message ids, ties, remembered ids)."""
    view = history.view()
    held_aside, _ = history.before_evictions()
    aside = history.restorable_ids
    aside_messages = [
        m for t in aside for m in (*held_aside.turn_messages(t), *held_aside.turn_state(t))
    ]
    return {
        "turn_ids": view.turn_ids,
        "turns": [
            (view.turn_messages(t), view.turn_state(t), history.turn_serial(t))
            for t in view.turn_ids
        ],
        "pinned": view.pinned,
        "statistics": history.statistics(),
        "counts": history.counts(),
        "open_calls": history.open_calls(),
        "over_limits": history.over_limits(),
        "sequence": history.sequence,
        "ids": set(history._ids),
        "message_ids": dict(history._message_ids),
        "linked": set(history._linked),
        "remembered": history.evicted_ids,
        "forgotten": history._forgotten,
        # What the commit lets go of (counted evicted from then on), exactly.
        "settled": (
            len(aside),
            len(aside_messages),
            sum(message_size(m) for m in aside_messages),
            sum(counter.count([m]) for m in aside_messages),
        ),
    }


def _false_start(
    before: dict[str, Any], after: dict[str, Any], false_id: str, remember: int
) -> None:
    """The history after a false start's retraction is the one before its commit, but
    for what the commit let go (the previous commit's turns held aside, counted evicted
    now) and the false start's id, remembered as used (pushing out the oldest)."""
    turns, items, size, tokens = before["settled"]
    old = before["statistics"]
    expected_stats = msgspec.structs.replace(
        old,
        evicted_turns=old.evicted_turns + turns,
        evicted_items=old.evicted_items + items,
        evicted_bytes=old.evicted_bytes + size,
        evicted_tokens=old.evicted_tokens + tokens,
        retracted_turns=old.retracted_turns + 1,
        restorable_turns=0,
    )
    assert after["statistics"] == expected_stats
    remembered = [*before["remembered"], false_id]
    kept = remembered[len(remembered) - remember :] if remember else []
    assert after["remembered"] == tuple(kept)
    assert after["forgotten"] == before["forgotten"] + len(remembered) - len(kept)
    for key in ("turn_ids", "turns", "pinned", "open_calls", "over_limits", "sequence"):
        assert after[key] == before[key], key
    for key in ("ids", "message_ids", "linked"):
        assert after[key] == before[key], key
    counts = before["counts"]
    assert after["counts"] == (
        *counts[:4],
        counts[4] + turns,
        counts[5] + items,
        *counts[6:9],
        counts[9] + 1,
    )


class EvictionMachine(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.gateways = {kind: _flaky_gateway(kind) for kind in KINDS}
        self.counters = {h: Counter() for h in HISTORIES}
        self.histories: dict[str, TurnHistory] = {}
        self.turn = {h: 0 for h in HISTORIES}
        self.previous: dict[
            tuple[str, GatewayType, str], tuple[RenderedHistory, list[NativeContent]]
        ] = {}
        self.held: list[tuple[Any, str, list[NativeContent]]] = []

    @initialize(
        pool=st.sampled_from(POOLS),
        kind=st.sampled_from(KINDS),
        policy=st.sampled_from(["exclude", "cancel"]),
        max_turns=st.integers(2, 5),
        max_items=st.integers(8, 40),
        max_bytes=st.sampled_from([2000, 100_000, 100_000]),
        tokens=st.sampled_from([None, None, 80, 400]),
        remember=st.sampled_from([0, 1, 2, 1024]),
        low_water=st.sampled_from([1.0, 1.0, 0.5, 0.34]),
    )
    def start(
        self,
        pool: tuple[str, str, str],
        kind: GatewayType,
        policy: OpenCallPolicy,
        max_turns: int,
        max_items: int,
        max_bytes: int,
        tokens: int | None,
        remember: int,
        low_water: float,
    ) -> None:
        self.kind = kind
        self.pool = pool
        self.policy = policy
        self.remember = remember
        limits = HistoryLimits(
            max_turns=max_turns,
            max_items=max_items,
            max_bytes=max_bytes,
            max_tokens=tokens,
            low_water=low_water,
        )
        for name in HISTORIES:
            history = TurnHistory(
                limits, remember_evicted=remember, token_counter=self.counters[name]
            )
            history.commit("t0", [user("u0")], instructions=[SYSTEM])
            self.histories[name] = history

    # -- rules ------------------------------------------------------------------

    @rule(h=st.sampled_from(HISTORIES), n=st.integers(0, 5), approve=st.booleans())
    def commit(self, h: str, n: int, approve: bool) -> None:
        history = self.histories[h]
        with contextlib.suppress(TurnTooLargeError, StateError, DuplicateIdError):
            if approve and _answer(history, n):
                return
            self.turn[h] += 1
            history.commit(f"t{self.turn[h]}", [user(f"u{self.turn[h]}")] * (n % 2 + 1))

    @rule(
        h=st.sampled_from(HISTORIES),
        kind=st.sampled_from(
            [
                "text",
                "call",
                "calls",
                "result",
                "pair",
                "pairs",
                "multi",
                "late",
                "split",
                "split_text",
                "split_late",
            ]
        ),
        n=st.integers(0, 8),
    )
    def record(self, h: str, kind: str, n: int) -> None:
        history = self.histories[h]
        turns = history.turn_ids
        ids = [self.pool[n % 3], self.pool[(n + 1) % 3], self.pool[(n + 2) % 3]]
        outputs: list[Message]
        if kind == "text":
            outputs = [assistant(f"a{n}")]
        elif kind == "call":
            outputs = [call(ids[0])]
        elif kind == "calls":
            outputs = [call(ids[0]), call(ids[1])]
        elif kind == "result":
            outputs = [result(ids[0], f"r{n}")]
        elif kind == "pair":
            outputs = [call(ids[0]), result(ids[0], f"r{n}")]
        elif kind == "pairs":
            outputs = [call(ids[0]), call(ids[0]), result(ids[0], f"r{n}"), assistant(f"b{n}")]
        elif kind == "multi":  # two calls in one message (ids a rule may fix alike), text too
            outputs = [_multi_call(ids[0], ids[1], n), _multi_result(ids[0], ids[1], n)]
        elif kind == "split":  # one message per parallel call, results out of call order
            outputs = [call(ids[0]), call(ids[1]), result(ids[1], f"s{n}"), result(ids[0], f"s{n}")]
        elif kind == "split_text":  # text before the calls of each split message
            outputs = [
                _multi_call(ids[0], ids[1], n),
                _text_call(ids[2], n),
                _multi_result(ids[0], ids[1], n),
                result(ids[2], f"t{n}"),
            ]
        elif kind == "split_late":  # a split step recorded to an earlier turn
            outputs = [call(ids[0]), call(ids[1]), result(ids[0], f"l{n}"), result(ids[1], f"l{n}")]
        else:
            outputs = [call(ids[0]), result(ids[0], f"late{n}"), assistant(f"late{n}")]
        target = turns[n % len(turns)] if kind in ("late", "split_late") else turns[-1]
        # A split the door refuses (a call id the step holds already) changes nothing.
        with contextlib.suppress(
            TurnTooLargeError, StateError, AmbiguousStepError, UnpairedResultError
        ):
            history.record(target, outputs)

    @rule(h=st.sampled_from(HISTORIES), n=st.integers(0, 8))
    def keep_state(self, h: str, n: int) -> None:
        history = self.histories[h]
        turns = history.turn_ids
        tag = f"s{n}"
        pair = [call(f"tlrs_{tag}", "turnloom_runtime_context"), result(f"tlrs_{tag}", tag)]
        with contextlib.suppress(TurnTooLargeError, StateError):
            history.keep_state(turns[n % len(turns)], pair)

    @rule(h=st.sampled_from(HISTORIES))
    def evict(self, h: str) -> None:
        self.histories[h].evict()

    @rule(h=st.sampled_from(HISTORIES))
    def retract(self, h: str) -> None:
        history = self.histories[h]
        if len(history.turn_ids) < 2:
            return
        with contextlib.suppress(StateError, UnknownTurnError):
            history.retract(history.turn_ids[-1])

    @rule(
        h=st.sampled_from(HISTORIES),
        size=st.integers(1, 6),
        state=st.booleans(),
        render=st.sampled_from(["none", "newest", "earlier", "bounded"]),
        fail=_FAILS,
        fail_at=st.integers(0, 4),
    )
    def false_start(
        self, h: str, size: int, state: bool, render: str, fail: str, fail_at: int
    ) -> None:
        """A false start: committed (evicting, usually: the history is mostly at its
        limits), maybe given a state pair and rendered (maybe failing part-way), then
        retracted. Invariant: the history is what it was before the commit (see
        :func:`_false_start`), and its renders equal cold renders."""
        history = self.histories[h]
        before = _observe(history, self.counters[h])
        self.turn[h] += 1
        false_id = f"t{self.turn[h]}"
        noise = [user(f"cough {k}") for k in range(size)]
        try:
            history.commit(false_id, noise)
        except TurnTooLargeError:
            assert _observe(history, self.counters[h]) == before
            return
        evicted = history.evict()
        assert history.restorable_ids == evicted
        assert history.statistics().restorable_turns == len(evicted)
        if state:
            pair = [call("tlrs_fs", "turnloom_runtime_context"), result("tlrs_fs", "fs")]
            assert history.keep_state(false_id, pair)
            history.evict()  # the pair may push more turns out: held aside too
        if render == "newest":
            self._check(h, self.kind, self.policy, 0, True, fail, fail_at)
        elif render == "earlier":
            self._check(h, self.kind, self.policy, 1, False, fail, fail_at)
        elif render == "bounded":
            self.render_bounded(h, fail_at * 3)
        history.retract(false_id)
        assert history.restorable_ids == ()
        _false_start(before, _observe(history, self.counters[h]), false_id, self.remember)
        assert history.was_evicted(false_id) is (self.remember > 0)
        self._check(h, self.kind, self.policy, 0, False, "none", 0)

    @rule(
        h=st.sampled_from(HISTORIES),
        calls=st.integers(0, 2),
        n=st.integers(0, 5),
        bytes_only=st.booleans(),
        fail=_FAILS,
        fail_at=st.integers(0, 4),
        door=st.sampled_from([None, "same", "registered"]),
    )
    def cycle(
        self,
        h: str,
        calls: int,
        n: int,
        bytes_only: bool,
        fail: str,
        fail_at: int,
        door: str | None,
    ) -> None:
        """The common path: calls reusing ids from the pool, a reply, a new turn, an
        eviction, and a render of the new turn on this example's gateway."""
        history = self.histories[h]
        newest = history.turn_ids[-1]
        # A call reusing the id of a call the newest step left open is refused.
        with contextlib.suppress(
            TurnTooLargeError, StateError, AmbiguousStepError, UnpairedResultError
        ):
            for k in range(calls):
                call_id = self.pool[(n + k) % 3]
                history.record(newest, [call(call_id), result(call_id, f"r{n}.{k}")])
            history.record(newest, [assistant(f"a{n}")])
        self.turn[h] += 1
        batch = [user(f"u{n}")]  # the same text, and message object, in other turns
        with contextlib.suppress(TurnTooLargeError, StateError):
            if door is not None:  # checked and rendered at the door, seeding the render cache
                # (by the gateway that renders, or by the registered one of its kind)
                seeder = self.gateways[self.kind] if door == "same" else get_gateway(self.kind)
                history.check_batch(batch, "input", gateway=seeder)
            history.commit(f"t{self.turn[h]}", batch)
        history.evict()
        self._check(h, self.kind, self.policy, 0, bytes_only, fail, fail_at)

    @rule(
        h=st.sampled_from(HISTORIES),
        other=st.sampled_from([None, None, None, *KINDS]),
        policy=st.sampled_from([None, None, None, "exclude", "cancel"]),
        back=st.sampled_from([0, 0, 0, 1, 2, 3]),
        bytes_only=st.booleans(),
        fail=_FAILS,
        fail_at=st.integers(0, 4),
    )
    def render(
        self,
        h: str,
        other: GatewayType | None,
        policy: OpenCallPolicy | None,
        back: int,
        bytes_only: bool,
        fail: str,
        fail_at: int,
    ) -> None:
        """A render, mostly of the newest turn on this example's gateway and policy."""
        kind = self.kind if other is None else other
        self._check(h, kind, policy or self.policy, back, bytes_only, fail, fail_at)

    @rule(h=st.sampled_from(HISTORIES), budget=st.integers(0, 30))
    def render_bounded(self, h: str, budget: int) -> None:
        """A bounded render equals a cold render, or is None."""
        history = self.histories[h]
        target = history.turn_ids[-1]
        gateway = self.gateways[self.kind]
        rendered = history.view().render_bounded(gateway, target, budget, open_calls=self.policy)
        if rendered is not None:
            expected, _ = _cold(history, target, gateway, self.policy)
            assert rendered.body is not None
            body = msgspec.json.encode(gateway.request_body(expected))
            assert rendered.body.encode() == body
            assert list(rendered.items) == expected
            assert rendered.bytes == sum(len(msgspec.json.encode(i)) for i in expected)

    @rule(h=st.sampled_from(HISTORIES))
    def hold_view(self, h: str) -> None:
        """Keep a view (and its cold render) to render after the history changes."""
        history = self.histories[h]
        target = history.turn_ids[-1]
        view = history.view()
        expected, _ = _cold(history, target, self.gateways[self.kind], self.policy)
        self.held.append((view, target, expected))

    @rule()
    def render_held(self) -> None:
        """An older view renders what the history held when it was taken."""
        if not self.held:
            return
        view, target, expected = self.held.pop(0)
        rendered = view.render(self.gateways[self.kind], target, open_calls=self.policy)
        assert list(rendered.items) == expected
        if rendered.body is not None:
            body = msgspec.json.encode(get_gateway(self.kind).request_body(expected))
            assert rendered.body.encode() == body

    def _check(
        self,
        h: str,
        kind: GatewayType,
        policy: OpenCallPolicy,
        back: int,
        bytes_only: bool,
        fail: str,
        fail_at: int,
    ) -> None:
        history = self.histories[h]
        gateway = self.gateways[kind]
        turns = history.turn_ids
        target = turns[max(0, len(turns) - 1 - back)]
        if fail != "none":
            self._fail_once(h, gateway, target, policy, fail, fail_at)
        rendered = history.view().render(gateway, target, open_calls=policy)
        expected, messages = _cold(history, target, gateway, policy)
        body = msgspec.json.encode(get_gateway(kind).request_body(expected))
        if target == turns[-1]:
            assert rendered.body is not None  # None only for a private render (an earlier turn)
        sizes = [len(msgspec.json.encode(i)) for i in expected]
        if rendered.body is not None:
            assert rendered.body.encode() == body
        assert rendered.bytes == sum(sizes)
        assert rendered.item_count == len(expected)
        assert [rendered.bytes_before(k) for k in range(len(sizes) + 1)] == [
            sum(sizes[:k]) for k in range(len(sizes) + 1)
        ]
        assert rendered.tokens == sum(self.counters[h].count([m]) for m in messages)
        key = (h, kind, policy)
        previous = self.previous.get(key)
        if previous is not None:
            earlier, earlier_expected = previous
            common = rendered.native_items.common_length(earlier.native_items)
            assert common == plain_common_length(expected, earlier_expected)
            rendered.native_items.adopt(earlier.native_items)
        self.previous[key] = (rendered, expected)
        if not bytes_only:  # a host that reads the items (a bytes-only host never does)
            assert list(rendered.items) == expected

    def _fail_once(
        self,
        h: str,
        gateway: Gateway,
        target: str,
        policy: OpenCallPolicy,
        fail: str,
        fail_at: int,
    ) -> None:
        """Render ``target`` with one step made to raise (it may also not be reached)."""
        history = self.histories[h]
        bound: list[ModuleType] = []  # the modules whose ``fail`` is replaced
        real: Any = None
        if fail == "gateway":
            gateway.fail_in = fail_at  # type: ignore[attr-defined]
        elif fail == "counter":
            self.counters[h].fail = True
        else:
            bound = [m for m in history_modules() if hasattr(m, fail)]
            real = getattr(bound[0], fail)
            calls = [0]

            def flaky(*args: Any, **kwargs: Any) -> Any:
                calls[0] += 1
                if calls[0] > fail_at:
                    raise Injected(fail)
                return real(*args, **kwargs)

            for module in bound:
                setattr(module, fail, flaky)
        try:
            with contextlib.suppress(Injected, Exception):
                history.view().render(gateway, target, open_calls=policy)
        finally:
            for module in bound:
                setattr(module, fail, real)
            gateway.fail_in = None  # type: ignore[attr-defined]
            self.counters[h].fail = False


EvictionMachine.TestCase.settings = settings(max_examples=60, stateful_step_count=40, deadline=None)
test_evictions_render_as_cold = EvictionMachine.TestCase
