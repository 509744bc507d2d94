"""Scopes (seed 002): predicates, positional scopes and their index-set algebra, through slice."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import (
    AllOf,
    AnyOf,
    ContextScope,
    LastNTurns,
    Message,
    Not,
    PositionalScope,
    Role,
    RoleFilter,
    Since,
    Tagged,
    ToolCallPart,
    ToolResultPart,
    WorkingContext,
    scope_indices,
)
from turnloom.errors import InvalidArgumentError, PositionalScopeError


def sys_(text: str) -> Message:
    return Message(role=Role.system, content=text)


def user(text: str, name: str | None = None) -> Message:
    return Message(role=Role.user, content=text, name=name)


def assistant(text: str, name: str | None = None) -> Message:
    return Message(role=Role.assistant, content=text, name=name)


def call(call_id: str) -> Message:
    return Message(role=Role.assistant, content=(ToolCallPart(call_id=call_id, name="f"),))


def result(call_id: str) -> Message:
    return Message(role=Role.tool, content=(ToolResultPart(call_id=call_id),))


# sys, turn 1 (u1 a-call tool a1), dev, turn 2 (u2 a2), turn 3 (u3 a3)
TRANSCRIPT = [
    sys_("rules"),
    user("u1", "alice"),
    call("c1"),
    result("c1"),
    assistant("a1", "bot"),
    Message(role=Role.developer, content="dev note"),
    user("u2", "bob"),
    assistant("a2", "bot"),
    user("u3", "alice"),
    assistant("a3", "bot"),
]


def texts(ctx: WorkingContext) -> list[str]:
    return [m.text or m.role.value for m in ctx.messages]


def sliced(scope: ContextScope) -> list[str]:
    return texts(WorkingContext(messages=TRANSCRIPT).slice(scope))


def test_role_filter_keeps_messages_of_the_given_roles() -> None:
    assert sliced(RoleFilter(Role.user, "assistant")) == [
        "u1",
        "assistant",
        "a1",
        "u2",
        "a2",
        "u3",
        "a3",
    ]
    assert RoleFilter("user") == RoleFilter(Role.user)


def test_tagged_matches_message_name() -> None:
    assert sliced(Tagged("alice")) == ["u1", "u3"]
    assert sliced(Tagged("nobody")) == []


def test_since_keeps_indices_from_the_checkpoint_and_is_not_positional() -> None:
    assert sliced(Since(8)) == ["u3", "a3"]
    assert Since(8).matches(TRANSCRIPT[8], 8) is True
    assert Since(8).matches(TRANSCRIPT[7], 7) is False
    assert not isinstance(Since(1), PositionalScope)


def test_last_n_turns_keeps_whole_turns_and_every_system_message() -> None:
    """Rule: system (and developer) messages survive; a turn keeps its calls and results."""
    assert sliced(LastNTurns(1)) == ["rules", "dev note", "u3", "a3"]
    assert sliced(LastNTurns(2)) == ["rules", "dev note", "u2", "a2", "u3", "a3"]
    assert sliced(LastNTurns(3)) == texts(WorkingContext(messages=TRANSCRIPT))
    assert sliced(LastNTurns(99)) == texts(WorkingContext(messages=TRANSCRIPT))


@pytest.mark.parametrize("n", [0, -1, -50])
def test_last_n_turns_with_n_at_most_zero_keeps_only_system_messages(n: int) -> None:
    assert sliced(LastNTurns(n)) == ["rules", "dev note"]


def test_last_n_turns_counts_a_user_message_carrying_results_as_part_of_its_turn() -> None:
    """A user message that answers calls (Anthropic style) does not start a turn."""
    answer = Message(role=Role.user, content=(ToolResultPart(call_id="c9"),))
    messages = [user("u1"), call("c9"), answer, assistant("done")]
    kept = WorkingContext(messages=messages).slice(LastNTurns(1)).messages
    assert kept == messages


def test_last_n_turns_matches_refuses_with_a_typed_error() -> None:
    """Rule: a positional scope never guesses from one message."""
    with pytest.raises(PositionalScopeError):
        LastNTurns(2).matches(TRANSCRIPT[0], 0)
    with pytest.raises(PositionalScopeError):
        AllOf(RoleFilter(Role.user), LastNTurns(1)).matches(TRANSCRIPT[1], 1)
    with pytest.raises(PositionalScopeError):
        Not(LastNTurns(1)).matches(TRANSCRIPT[1], 1)
    assert isinstance(LastNTurns(1), PositionalScope)


def test_last_n_turns_inside_combinators_keeps_its_window() -> None:
    """Regression (seed 002): inside AllOf/AnyOf/Not, LastNTurns counts turns of the whole list."""
    assert sliced(AllOf(RoleFilter(Role.user), LastNTurns(2))) == ["u2", "u3"]
    assert sliced(AnyOf(Tagged("alice"), LastNTurns(1))) == ["rules", "u1", "dev note", "u3", "a3"]
    assert sliced(Not(LastNTurns(1))) == ["u1", "assistant", "tool", "a1", "u2", "a2"]
    assert sliced(AllOf(Not(RoleFilter(Role.system, Role.developer)), LastNTurns(1))) == [
        "u3",
        "a3",
    ]


def test_all_of_any_of_and_not_compose_in_index_set_algebra() -> None:
    assert sliced(AllOf(Tagged("bot"), Since(5))) == ["a2", "a3"]
    assert sliced(AnyOf(Tagged("bob"), RoleFilter(Role.tool))) == ["tool", "u2"]
    assert sliced(Not(RoleFilter(Role.assistant, Role.tool))) == [
        "rules",
        "u1",
        "dev note",
        "u2",
        "u3",
    ]
    assert sliced(AllOf()) == texts(WorkingContext(messages=TRANSCRIPT))
    assert sliced(AnyOf()) == []


def test_a_user_scope_with_matches_only_composes() -> None:
    """A scope implementing only the ContextScope protocol works in slice and combinators."""

    @dataclass(frozen=True)
    class Even:
        def matches(self, message: Message, index: int) -> bool:
            return index % 2 == 0

    assert isinstance(Even(), ContextScope)
    assert sliced(Even()) == ["rules", "assistant", "a1", "u2", "u3"]
    assert sliced(AllOf(Even(), LastNTurns(2))) == ["rules", "u2", "u3"]


def test_scopes_reject_bad_arguments() -> None:
    cases: list[tuple[object, str]] = []
    for build, field in (
        (lambda: RoleFilter("boss"), "roles[0]"),
        (lambda: Tagged(""), "tag"),
        (lambda: Since(-1), "checkpoint_index"),
        (lambda: Since(True), "checkpoint_index"),
        (lambda: LastNTurns("2"), "n"),  # type: ignore[arg-type]
        (lambda: AllOf(RoleFilter(Role.user), 42), "scopes[1]"),  # type: ignore[arg-type]
        (lambda: AnyOf("user"), "scopes[0]"),  # type: ignore[arg-type]
        (lambda: Not(None), "scope"),  # type: ignore[arg-type]
        (lambda: WorkingContext().slice(42), "scope"),  # type: ignore[arg-type]
    ):
        with pytest.raises(InvalidArgumentError) as info:
            build()
        cases.append((info.value.field, field))
    assert [got for got, _ in cases] == [want for _, want in cases]


# -- the algebra, on generated lists ----------------------------------------

_names = st.sampled_from([None, "a", "b"])


@st.composite
def messages(draw: st.DrawFn) -> Message:
    role = draw(st.sampled_from(list(Role)))
    name = draw(_names)
    if role is Role.tool:
        return Message(role=role, content=(ToolResultPart(call_id="c"),))
    if role is Role.user and draw(st.booleans()):
        return Message(role=role, content=(ToolResultPart(call_id="c"),), name=name)
    return Message(role=role, content=draw(st.sampled_from(["x", "y"])), name=name)


base_scopes = st.one_of(
    st.lists(st.sampled_from(list(Role)), max_size=3).map(lambda rs: RoleFilter(*rs)),
    st.sampled_from(["a", "b"]).map(Tagged),
    st.integers(0, 12).map(Since),
    st.integers(-1, 4).map(LastNTurns),
)
scopes = st.recursive(
    base_scopes,
    lambda inner: st.one_of(
        inner.map(Not),
        st.lists(inner, max_size=3).map(lambda s: AllOf(*s)),
        st.lists(inner, max_size=3).map(lambda s: AnyOf(*s)),
    ),
    max_leaves=6,
)
transcripts = st.lists(messages(), max_size=14)


def view(scope: ContextScope, items: list[Message]) -> list[Message]:
    return WorkingContext(messages=items).slice(scope).messages


@settings(max_examples=150)
@given(transcripts, scopes)
def test_not_not_is_the_scope_itself_on_every_list(items: list[Message], s: ContextScope) -> None:
    assert view(Not(Not(s)), items) == view(s, items)


@settings(max_examples=150)
@given(transcripts, scopes, scopes)
def test_de_morgan_laws_hold_through_slice(
    items: list[Message], a: ContextScope, b: ContextScope
) -> None:
    assert view(Not(AllOf(a, b)), items) == view(AnyOf(Not(a), Not(b)), items)
    assert view(Not(AnyOf(a, b)), items) == view(AllOf(Not(a), Not(b)), items)


@settings(max_examples=150)
@given(transcripts, scopes)
def test_slice_keeps_order_and_partitions_with_not(items: list[Message], s: ContextScope) -> None:
    """A scope and its complement split the list: disjoint, covering, order kept."""
    kept = scope_indices(s, items)
    dropped = scope_indices(Not(s), items)
    assert kept | dropped == frozenset(range(len(items)))
    assert kept & dropped == frozenset()
    assert view(s, items) == [m for i, m in enumerate(items) if i in kept]


@settings(max_examples=100)
@given(
    transcripts, st.lists(base_scopes.filter(lambda s: not isinstance(s, LastNTurns)), max_size=3)
)
def test_matches_and_indices_agree_for_non_positional_scopes(
    items: list[Message], parts: list[ContextScope]
) -> None:
    for s in (AllOf(*parts), AnyOf(*parts), Not(AllOf(*parts))):
        assert scope_indices(s, items) == frozenset(
            i for i, m in enumerate(items) if s.matches(m, i)
        )
