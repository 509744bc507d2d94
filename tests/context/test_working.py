"""WorkingContext, PrefixContext, ContextDiff and FrozenContext (seed 002)."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path
from typing import Any

import anyio
import pytest

from tests.context.gateways._support import load_tau_bench
from turnloom.context import (
    ApproxTokenCounter,
    ContextDiff,
    FrozenContext,
    FrozenDict,
    LastNTurns,
    Message,
    MutationJournal,
    PrefixContext,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    WorkingContext,
    deep_freeze,
    get_gateway,
)
from turnloom.errors import (
    FrozenValueError,
    InvalidArgumentError,
    InvalidMessageError,
)


def user(text: str, name: str | None = None) -> Message:
    return Message(role=Role.user, content=text, name=name)


def assistant(text: str) -> Message:
    return Message(role=Role.assistant, content=text)


def call(call_id: str, arguments: str = "{}") -> Message:
    part = ToolCallPart(call_id=call_id, name="lookup", arguments=arguments)
    return Message(role=Role.assistant, content=(part,))


def result(call_id: str, text: str = "ok") -> Message:
    part = ToolResultPart(call_id=call_id, content=(TextPart(text=text),))
    return Message(role=Role.tool, content=(part,))


PREFIX = PrefixContext(
    system_prompt="You are an airline agent.",
    grounding=(user("policy: bags are tracked by tag"),),
    schema_block='{"type": "object"}',
)


# -- PrefixContext -----------------------------------------------------------


def test_prefix_context_as_messages_orders_prompt_grounding_schema() -> None:
    assert [(m.role, m.text) for m in PREFIX.as_messages()] == [
        (Role.system, "You are an airline agent."),
        (Role.user, "policy: bags are tracked by tag"),
        (Role.system, '{"type": "object"}'),
    ]
    assert PrefixContext().as_messages() == []


def test_prefix_context_as_messages_returns_a_fresh_list_each_call() -> None:
    first = PREFIX.as_messages()
    first.clear()
    assert len(PREFIX.as_messages()) == 3
    assert PREFIX.as_messages() is not PREFIX.as_messages()


def test_prefix_context_is_frozen_and_structurally_equal() -> None:
    """Two prefixes built from the same values are equal and hash equal, even with extras."""
    grounding = [Message(role=Role.user, content="g", extras={"cache_control": {"type": "x"}})]
    a = PrefixContext("p", grounding, "s")  # type: ignore[arg-type]
    b = PrefixContext("p", tuple(grounding), "s")
    assert a == b
    assert hash(a) == hash(b)
    assert a.grounding == tuple(grounding)
    with pytest.raises(AttributeError):
        a.system_prompt = "other"  # type: ignore[misc]
    assert PrefixContext("p") != PrefixContext("q")


def test_prefix_context_rejects_bad_fields() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        PrefixContext(system_prompt=None)  # type: ignore[arg-type]
    assert info.value.field == "system_prompt"
    with pytest.raises(InvalidArgumentError) as info:
        PrefixContext(schema_block=3)  # type: ignore[arg-type]
    assert info.value.field == "schema_block"
    with pytest.raises(InvalidMessageError):
        PrefixContext(grounding=("text",))  # type: ignore[arg-type]


# -- construction and mutators ---------------------------------------------


def test_working_context_defaults_are_empty_and_independent() -> None:
    a, b = WorkingContext(), WorkingContext()
    a.append(user("x")).note("k", 1).record("e")
    assert (b.messages, b.scratchpad, b.journal.view()) == ([], {}, ())
    assert b.prefix == PrefixContext()
    assert isinstance(b.token_counter, ApproxTokenCounter)
    assert (b.limit, b.shared) == (None, False)


def test_working_context_copies_the_caller_list_and_dict() -> None:
    items, notes = [user("a")], {"k": 1}
    ctx = WorkingContext(messages=items, scratchpad=notes)
    items.append(user("b"))
    notes["j"] = 2
    assert (len(ctx.messages), ctx.scratchpad) == (1, {"k": 1})


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"prefix": "system"}, "prefix"),
        ({"messages": "hello"}, "messages"),
        ({"scratchpad": [("k", 1)]}, "scratchpad"),
        ({"scratchpad": {1: "x"}}, "scratchpad[1]"),
        ({"scratchpad": {"": "x"}}, "scratchpad['']"),
        ({"journal": []}, "journal"),
        ({"token_counter": len}, "token_counter"),
        ({"limit": -1}, "limit"),
        ({"limit": True}, "limit"),
        ({"limit": 1.5}, "limit"),
        ({"shared": 1}, "shared"),
    ],
)
def test_working_context_rejects_bad_fields_at_the_door(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        WorkingContext(**kwargs)
    assert info.value.field == field


def test_working_context_rejects_a_malformed_message() -> None:
    with pytest.raises(InvalidMessageError) as info:
        WorkingContext(messages=[user("a"), Message(role=Role.user, content="x", id="")])
    assert info.value.field == "id"
    assert "messages[1]" in str(info.value)


def test_append_and_extend_chain_and_check_before_changing() -> None:
    ctx = WorkingContext().append(user("a")).extend([assistant("b"), user("c")])
    assert [m.text for m in ctx.messages] == ["a", "b", "c"]
    with pytest.raises(InvalidMessageError):
        ctx.extend([user("d"), "not a message"])  # type: ignore[list-item]
    with pytest.raises(InvalidMessageError):
        ctx.append(Message(role=Role.user, content=(ToolCallPart(call_id="c", name="f"),)))
    assert [m.text for m in ctx.messages] == ["a", "b", "c"]


def test_note_update_scratchpad_and_get() -> None:
    ctx = WorkingContext().note("plan", [1]).update_scratchpad({"a": 1, "plan": [2]})
    assert ctx.scratchpad == {"plan": [2], "a": 1}
    assert (ctx.get("a"), ctx.get("missing"), ctx.get("missing", 7)) == (1, None, 7)
    with pytest.raises(InvalidArgumentError):
        ctx.note("", 1)
    with pytest.raises(InvalidArgumentError) as info:
        ctx.update_scratchpad({"b": 2, 3: 4})  # type: ignore[dict-item]
    assert info.value.field == "notes[3]"
    assert "b" not in ctx.scratchpad
    with pytest.raises(InvalidArgumentError):
        ctx.update_scratchpad([("b", 2)])  # type: ignore[arg-type]


def test_record_appends_to_the_journal_only() -> None:
    ctx = WorkingContext().record({"agent_id": "a", "op": "x"})
    assert ctx.journal.view() == ({"agent_id": "a", "op": "x"},)
    assert (ctx.messages, ctx.scratchpad) == ([], {})


def test_set_prefix_replaces_the_prefix_only() -> None:
    ctx = WorkingContext(messages=[user("a")]).set_prefix(PREFIX)
    assert ctx.prefix is PREFIX
    assert len(ctx.messages) == 1
    with pytest.raises(InvalidArgumentError):
        ctx.set_prefix("prompt")  # type: ignore[arg-type]


# -- measures ----------------------------------------------------------------


def test_assembled_is_prefix_then_tail_in_a_fresh_list() -> None:
    ctx = WorkingContext(prefix=PREFIX, messages=[user("q")])
    first = ctx.assembled()
    assert [m.text for m in first] == [
        "You are an airline agent.",
        "policy: bags are tracked by tag",
        '{"type": "object"}',
        "q",
    ]
    first.clear()
    assert len(ctx.assembled()) == 4
    assert ctx.assembled() is not ctx.assembled()


def test_size_counts_assembled_messages() -> None:
    assert WorkingContext(prefix=PREFIX, messages=[user("q")]).size() == 4
    assert WorkingContext().size() == 0


def test_tokens_counts_prefix_and_tail_with_the_configured_counter() -> None:
    class Fixed:
        def count(self, messages: Any) -> int:
            return 10 * len(messages)

    ctx = WorkingContext(prefix=PREFIX, messages=[user("q")], token_counter=Fixed())
    assert ctx.tokens() == 40
    approx = WorkingContext(prefix=PREFIX, messages=[user("q")])
    assert approx.tokens() == ApproxTokenCounter().count(approx.assembled())


def test_headroom_is_limit_minus_tokens() -> None:
    ctx = WorkingContext(messages=[user("x" * 8)], limit=10)
    assert ctx.tokens() == 3 + 1 + 2
    assert ctx.headroom() == 4
    assert WorkingContext(messages=[user("x" * 80)], limit=10).headroom() == 10 - 24
    assert WorkingContext().headroom() is None


# -- the lock ----------------------------------------------------------------


@pytest.mark.anyio
async def test_apply_locked_runs_sync_and_async_closures_under_the_lock() -> None:
    ctx = WorkingContext(shared=True)
    assert ctx.apply_locked is not None

    def sync_step(c: WorkingContext) -> int:
        c.append(user("a"))
        return 1

    async def async_step(c: WorkingContext) -> int:
        c.append(user("b"))
        await anyio.sleep(0)
        c.append(assistant("c"))
        return 2

    assert await ctx.apply_locked(sync_step) == 1
    assert await ctx.apply_locked(async_step) == 2
    assert [m.text for m in ctx.messages] == ["a", "b", "c"]


@pytest.mark.anyio
async def test_apply_locked_serialises_read_modify_write_across_awaits() -> None:
    """Invariant: 20 concurrent read-await-write increments under the lock lose none."""
    ctx = WorkingContext(scratchpad={"n": 0}, shared=True)

    async def increment(c: WorkingContext) -> None:
        value = c.get("n")
        await anyio.sleep(0)
        c.note("n", value + 1)

    async with anyio.create_task_group() as tg:
        for _ in range(20):
            tg.start_soon(ctx.apply_locked, increment)
    assert ctx.get("n") == 20


@pytest.mark.anyio
async def test_lock_is_shared_by_apply_locked_and_async_with() -> None:
    ctx = WorkingContext(shared=True)
    order: list[str] = []

    async def holder() -> None:
        async with ctx.lock:
            order.append("held")
            await anyio.sleep(0.01)
            order.append("released")

    async def waiter(c: WorkingContext) -> None:
        order.append("ran")

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await anyio.sleep(0)
        tg.start_soon(ctx.apply_locked, waiter)
    assert order == ["held", "released", "ran"]
    assert ctx.lock is ctx.lock
    assert ctx.fork().lock is not ctx.lock


@pytest.mark.anyio
async def test_apply_locked_cancelled_while_waiting_leaves_the_context_unchanged() -> None:
    ctx = WorkingContext(shared=True)
    held, release = anyio.Event(), anyio.Event()

    def mutate(c: WorkingContext) -> None:
        c.append(user("late"))

    async def holder() -> None:
        async with ctx.lock:
            held.set()
            await release.wait()

    async with anyio.create_task_group() as tg:
        tg.start_soon(holder)
        await held.wait()
        with anyio.move_on_after(0.01) as scope:
            await ctx.apply_locked(mutate)
        release.set()
    assert scope.cancelled_caught
    assert ctx.messages == []
    await ctx.apply_locked(mutate)  # the lock was released
    assert len(ctx.messages) == 1


@pytest.mark.anyio
async def test_apply_locked_releases_the_lock_when_the_closure_raises() -> None:
    ctx = WorkingContext(shared=True)

    async def boom(c: WorkingContext) -> None:
        raise KeyError("x")

    with pytest.raises(KeyError):
        await ctx.apply_locked(boom)
    assert await ctx.apply_locked(lambda c: "free") == "free"


# -- fork, merge, slice, diff, freeze ----------------------------------------


def test_fork_is_independent_but_shares_the_prefix() -> None:
    ctx = WorkingContext(
        prefix=PREFIX,
        messages=[user("a")],
        scratchpad={"plan": {"steps": [1]}},
        limit=99,
        shared=True,
    ).record("e1")
    child = ctx.fork()
    child.append(user("b")).record("e2")
    child.scratchpad["plan"]["steps"].append(2)
    assert child.prefix is ctx.prefix
    assert [m.text for m in ctx.messages] == ["a"]
    assert ctx.get("plan") == {"steps": [1]}
    assert ctx.journal.view() == ("e1",)
    assert child.journal.view() == ("e1", "e2")
    assert child.journal.committed_index == 1  # seeded entries count as committed
    assert (child.limit, child.shared, child.token_counter) == (99, True, ctx.token_counter)


def test_merge_concat_appends_verbatim_and_last_write_wins() -> None:
    parent = WorkingContext(messages=[user("a")], scratchpad={"k": 1, "p": "parent"})
    child = WorkingContext(messages=[user("a"), assistant("b")], scratchpad={"k": 2})
    child.record({"agent_id": "child"})
    value = ["shared"]
    child.note("v", value)
    assert parent.merge(child) is parent
    assert [m.text for m in parent.messages] == ["a", "a", "b"]
    assert parent.scratchpad == {"k": 2, "p": "parent", "v": ["shared"]}
    assert parent.get("v") is value  # handed over by reference
    assert parent.journal.view() == ({"agent_id": "child"},)
    assert parent.journal.view()[0] is child.journal.view()[0]


def test_merge_union_deduplicates_messages_by_value() -> None:
    parent = WorkingContext(messages=[user("a"), call("c1"), result("c1")])
    sibling = WorkingContext(messages=[user("a"), call("c1"), result("c1"), assistant("new")])
    other = WorkingContext(messages=[assistant("new"), assistant("new")])
    parent.merge(sibling, mode="union").merge(other, mode="union")
    assert [m.text or m.role.value for m in parent.messages] == [
        "a",
        "assistant",
        "tool",
        "new",
    ]


def test_merge_union_on_unhashable_tool_call_messages() -> None:
    """Regression (seed 002): union merge raised TypeError on every message with tool calls.

    Parsed traffic carries dicts (``extras``, ``layout``), which make a
    msgspec message unhashable; union must still work, and two calls with one
    id but different arguments are different values that both survive.
    """
    chat = get_gateway("openai_chat")
    native = {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {
                "id": "c1",
                "type": "function",
                "function": {"name": "f", "arguments": "{}"},
                "index": 0,
            }
        ],
        "audio": {"id": "audio_1"},  # kept in extras (nulls and the call's index are not)
    }
    parsed = chat.parse(native)
    with pytest.raises(TypeError):
        hash(parsed)
    again = chat.parse(native)
    other_args = call("c1", '{"x": 1}')
    same_id = call("c1", "{}")
    parent = WorkingContext(messages=[parsed, same_id])
    parent.merge(WorkingContext(messages=[again, other_args, same_id]), mode="union")
    assert parent.messages == [parsed, same_id, other_args]


def test_merge_rejects_a_bad_mode_or_other_before_changing() -> None:
    ctx = WorkingContext(messages=[user("a")])
    with pytest.raises(InvalidArgumentError) as info:
        ctx.merge(WorkingContext(messages=[user("b")]), mode="zip")  # type: ignore[arg-type]
    assert info.value.field == "mode"
    with pytest.raises(InvalidArgumentError) as info:
        ctx.merge([user("b")])  # type: ignore[arg-type]
    assert info.value.field == "other"
    assert len(ctx.messages) == 1


def test_slice_keeps_the_scope_and_inherits_the_other_axes() -> None:
    journal = MutationJournal(["seen"])
    journal.record("new")
    value = {"deep": [1]}
    ctx = WorkingContext(
        prefix=PREFIX,
        messages=[user("u1"), assistant("a1"), user("u2"), assistant("a2")],
        scratchpad={"v": value},
        journal=journal,
        limit=5,
    )
    view = ctx.slice(LastNTurns(1))
    assert [m.text for m in view.messages] == ["u2", "a2"]
    assert view.prefix is ctx.prefix
    assert view.scratchpad == ctx.scratchpad and view.scratchpad is not ctx.scratchpad
    assert view.get("v") is value
    assert (view.journal.view(), view.journal.diff()) == (("seen", "new"), ("new",))
    assert view.journal is not ctx.journal
    assert view.limit == 5
    view.append(user("x"))
    assert len(ctx.messages) == 4


def test_diff_reports_added_removed_scratchpad_and_prefix() -> None:
    before = WorkingContext(messages=[user("a"), user("a"), assistant("b")], scratchpad={"k": 1})
    before.note("gone", "x").note("same", [1])
    after = before.fork().append(user("c")).set_prefix(PREFIX)
    after.messages.remove(assistant("b"))
    after.messages.remove(user("a"))
    after.note("k", 2).note("new", {"a": [1]})
    del after.scratchpad["gone"]
    d = after.diff(before)
    assert d.messages_added == (user("c"),)
    assert d.messages_removed == (user("a"), assistant("b"))
    assert d.scratchpad_changes == {"k": 2, "new": {"a": (1,)}, "gone": None}
    assert d.prefix_changed is True
    assert before.diff(before) == ContextDiff((), (), {}, False)
    with pytest.raises(InvalidArgumentError):
        before.diff(before.freeze())  # type: ignore[arg-type]


def test_context_diff_is_frozen_hashable_and_picklable() -> None:
    d = WorkingContext(scratchpad={"k": [1, {"x": 2}]}).diff(WorkingContext())
    with pytest.raises(FrozenValueError):
        d.scratchpad_changes["k"] = 1
    assert isinstance(d.scratchpad_changes, dict)
    assert hash(d) == hash(pickle.loads(pickle.dumps(d)))
    assert pickle.loads(pickle.dumps(d)) == d


def test_freeze_deep_freezes_and_unaliases_scratchpad_values() -> None:
    """Regression (seed 002): a frozen value aliased the live scratchpad and changed with it."""
    plan: dict[str, Any] = {"steps": [1, 2], "tags": {"a"}, "raw": bytearray(b"x")}
    ctx = WorkingContext(messages=[user("a")], scratchpad={"plan": plan, "n": 1})
    frozen = ctx.freeze()
    plan["steps"].append(3)
    ctx.note("n", 2)
    assert frozen.scratchpad == (
        ("n", 1),
        ("plan", {"steps": (1, 2), "tags": frozenset({"a"}), "raw": b"x"}),
    )
    value = dict(frozen.scratchpad)["plan"]
    assert isinstance(value, FrozenDict)
    with pytest.raises(FrozenValueError):
        value["steps"] = ()
    with pytest.raises(FrozenValueError):
        value.update(x=1)
    with pytest.raises(AttributeError):
        frozen.messages = ()  # type: ignore[misc]


def test_freeze_passes_journal_entries_through_by_identity() -> None:
    entry = {"agent_id": "a", "mutable": [1]}
    frozen = WorkingContext().record(entry).freeze()
    assert frozen.journal_entries[0] is entry


def test_frozen_context_hash_covers_the_identity_subset() -> None:
    """Snapshots with unhashable values or entries hash; equal snapshots hash equal."""

    class Opaque:
        __hash__ = None  # type: ignore[assignment]

    ctx = WorkingContext(prefix=PREFIX, messages=[call("c1")], scratchpad={"o": Opaque()})
    ctx.record([1, 2])
    a, b = ctx.freeze(), ctx.freeze()
    assert hash(a) == hash(b)
    assert a.journal_entries == b.journal_entries
    plain = WorkingContext(messages=[user("x")], scratchpad={"k": [1]})
    assert plain.freeze() == plain.freeze()
    assert hash(plain.freeze()) == hash(plain.freeze())
    assert {plain.freeze(): "cached"}[plain.freeze()] == "cached"


def test_frozen_context_round_trips_through_a_live_context() -> None:
    ctx = WorkingContext(
        prefix=PREFIX, messages=[user("a"), call("c")], scratchpad={"p": {"s": [1]}}
    )
    frozen = ctx.freeze()
    live = WorkingContext(
        prefix=frozen.prefix, messages=list(frozen.messages), scratchpad=dict(frozen.scratchpad)
    )
    assert live.freeze() == frozen
    with pytest.raises(FrozenValueError):
        live.get("p")["s"] = ()  # nested values stay frozen
    live.note("p", {**live.get("p"), "s": [1, 2]})  # the top level is writable
    assert live.get("p") == {"s": [1, 2]}
    assert ctx.get("p") == {"s": [1]}


def test_frozen_context_built_directly_is_checked_and_frozen() -> None:
    f = FrozenContext(PREFIX, (user("a"),), {"b": [1], "a": {2}})  # type: ignore[arg-type]
    assert f.scratchpad == (("a", frozenset({2})), ("b", (1,)))
    with pytest.raises(InvalidArgumentError) as info:
        FrozenContext("p", (), ())  # type: ignore[arg-type]
    assert info.value.field == "prefix"
    with pytest.raises(InvalidArgumentError) as info:
        FrozenContext(PREFIX, (), (("a", 1), ("a", 2)))
    assert info.value.field == "scratchpad"
    with pytest.raises(InvalidArgumentError) as info:
        FrozenContext(PREFIX, (), ((1, 1),))  # type: ignore[arg-type]
    assert info.value.field == "scratchpad[1]"
    with pytest.raises(InvalidMessageError):
        FrozenContext(PREFIX, ("a",), ())  # type: ignore[arg-type]


def test_deep_freeze_rules() -> None:
    class Box:
        def __init__(self) -> None:
            self.items = [1]

    box = Box()
    frozen = deep_freeze({"l": [1, [2]], "t": (3, {"x": 4}), "s": {5}, "box": box, "m": user("m")})
    assert frozen == {
        "l": (1, (2,)),
        "t": (3, {"x": 4}),
        "s": frozenset({5}),
        "box": frozen["box"],
        "m": user("m"),
    }
    assert frozen["box"] is not box and frozen["box"].items == [1]
    assert frozen["m"] is not None
    loop: list[Any] = []
    loop.append(loop)
    with pytest.raises(InvalidArgumentError):
        deep_freeze(loop)
    plain = deep_freeze({"l": [1, [2]], "s": {5}})
    again = copy.deepcopy(plain)
    assert again == plain and isinstance(again, FrozenDict)
    assert copy.copy(plain) is plain


def test_freeze_cyclic_scratchpad_value_raises_a_typed_error() -> None:
    loop: dict[str, Any] = {}
    loop["self"] = loop
    with pytest.raises(InvalidArgumentError):
        WorkingContext(scratchpad={"loop": loop}).freeze()


def test_working_context_on_real_tau_bench_traffic(tau_bench_path: Path) -> None:
    """Union merge, diff and freeze work on parsed GPT-4o traffic (dict-bearing messages)."""
    chat = get_gateway("openai_chat")
    trajectories = load_tau_bench(tau_bench_path)[:20]
    contexts = [WorkingContext(messages=[chat.parse(i) for i in t]) for t in trajectories]
    merged = WorkingContext()
    for ctx in contexts:
        merged.merge(ctx, mode="union").merge(ctx, mode="union")
    oracle: list[Message] = []  # dedupe by == alone, quadratic
    for ctx in contexts:
        oracle.extend(m for m in ctx.messages if m not in oracle)
    assert merged.messages == oracle
    assert len(oracle) < sum(len(c.messages) for c in contexts)  # the system prompt repeats
    assert merged.diff(merged).messages_added == ()
    assert hash(merged.freeze()) == hash(merged.freeze())
