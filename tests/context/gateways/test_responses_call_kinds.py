"""OpenAI Responses call kinds beyond ``function_call``: one table, paired by ``validate``.

``custom_tool_call``, ``computer_call``, ``local_shell_call``, ``shell_call``,
``apply_patch_call`` and ``tool_search_call`` each have an output item the
host sends back (``CALL_KINDS``); the API rejects an output whose call is not
in the input and a call without its output. An ``mcp_approval_response``
answers the ``mcp_approval_request`` its ``approval_request_id`` names; a
request left unanswered is held open by the server. The gateway keeps these
items opaque (rendered back exactly); ``validate`` pairs them, and the OpenAI
Agents session's ``complete_window`` applies the same table, so what it keeps
validates.
"""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from turnloom.context import (
    CANCELLED_RESULT_TEXT,
    Message,
    OpaquePart,
    OpenCallPolicy,
    Role,
    check_steps,
    complete_pairs,
    get_gateway,
)
from turnloom.context._call_kinds import CALL_KINDS, call_key, cancelled_output, output_key
from turnloom.errors import DuplicateIdError, UnpairedResultError

GATEWAY = get_gateway("openai_responses")
USER = {"role": "user", "content": "Go."}
# Written out, not read from CALL_KINDS: a kind dropped from the table fails its cases.
OUTPUTS = {
    "function_call": "function_call_output",
    "custom_tool_call": "custom_tool_call_output",
    "computer_call": "computer_call_output",
    "local_shell_call": "local_shell_call_output",
    "shell_call": "shell_call_output",
    "apply_patch_call": "apply_patch_call_output",
    "tool_search_call": "tool_search_output",
    "program": "program_output",
}
KINDS = [kind for kind in OUTPUTS if kind != "function_call"]
NEXT = {"role": "user", "content": "Next."}
POLICIES: list[OpenCallPolicy] = ["exclude", "cancel"]
# The kinds whose output can say "cancelled" (cancelled_output); the others are
# left out under "cancel" too: a computer_call_output must hold a screenshot.
CANCELLABLE = {"function_call", "custom_tool_call", "local_shell_call", "shell_call"}
CANCELLABLE |= {"apply_patch_call"}


def _call(kind: str, call_id: str, item_id: str | None = None) -> dict[str, Any]:
    if kind == "function_call":
        return {"type": kind, "call_id": call_id, "name": "lookup", "arguments": "{}"}
    item: dict[str, Any] = {"type": kind, "call_id": call_id, "status": "completed"}
    if item_id is not None:
        item["id"] = item_id
    return item


def _output(kind: str, call_id: str) -> dict[str, Any]:
    return {"type": OUTPUTS[kind], "call_id": call_id, "output": "done"}


def _rules(items: list[dict[str, Any]], **options: Any) -> list[tuple[int, str]]:
    return [(v.index, v.rule) for v in GATEWAY.validate(items, **options)]


def test_the_table_names_every_kind_the_openai_agents_sdk_pairs() -> None:
    """Invariant: CALL_KINDS is the SDK's own map of call item type to output item
    type (agents.run_internal.items._TOOL_CALL_TO_OUTPUT_TYPE), entry for entry."""
    items = pytest.importorskip("agents.run_internal.items")
    assert items._TOOL_CALL_TO_OUTPUT_TYPE == CALL_KINDS == OUTPUTS


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_answered_later_in_the_input_is_valid(kind: str) -> None:
    """Invariant: a call of each kind followed (not necessarily directly) by its
    output is valid, and parses and renders back exactly."""
    items = [
        USER,
        _call(kind, "k1", "it_1"),
        {"role": "user", "content": "ok"},
        _output(kind, "k1"),
    ]
    assert _rules(items) == []
    rendered = [i for m in GATEWAY.parse_items(items) for i in GATEWAY.render(m)]
    assert rendered == items


@pytest.mark.parametrize("kind", KINDS)
def test_a_call_without_its_output_is_flagged(kind: str) -> None:
    """Invariant: a call of each kind with no output in the input is
    tool_call_without_result at the call's index; an output of another kind
    with the same call id does not answer it."""
    other = next(k for k in CALL_KINDS if k != kind)
    items = [USER, _call(kind, "k1"), _output(other, "k1") if other != "function_call" else USER]
    rules = _rules(items)
    assert (1, "tool_call_without_result") in rules


@pytest.mark.parametrize("kind", KINDS)
def test_an_output_without_its_call_is_flagged_unless_it_continues_a_response(
    kind: str,
) -> None:
    """Invariant: an output answering no earlier call of its kind is
    tool_result_without_call; one answering a call already answered is too; at
    the head of an input that continues a stored response it is not flagged."""
    assert _rules([USER, _output(kind, "k9")]) == [(1, "tool_result_without_call")]
    twice = [USER, _call(kind, "k1"), _output(kind, "k1"), _output(kind, "k1")]
    assert _rules(twice) == [(3, "tool_result_without_call")]
    assert _rules([_output(kind, "k9"), USER], continues_response=True) == []


def test_a_local_shell_output_may_name_its_call_in_id() -> None:
    """Invariant: a local_shell_call_output without call_id answers the call whose
    call_id its ``id`` names (the API's input type carries ``id``), once."""
    call = _call("local_shell_call", "call_1", "lsh_1")
    by_id = {"type": "local_shell_call_output", "id": "call_1", "output": "ok"}
    assert _rules([USER, call, by_id]) == []
    assert _rules([USER, call, {**by_id, "id": "call_2"}]) == [
        (1, "tool_call_without_result"),
        (2, "tool_result_without_call"),
    ]


def test_mcp_approvals_pair_by_request_id() -> None:
    """Invariant: an mcp_approval_response must name an earlier
    mcp_approval_request; a request not answered yet is valid."""
    request = {
        "type": "mcp_approval_request",
        "id": "mcpr_1",
        "name": "deploy",
        "arguments": "{}",
        "server_label": "ops",
    }
    response = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    stray = {**response, "approval_request_id": "mcpr_2"}
    assert _rules([USER, request]) == []
    assert _rules([USER, request, response]) == []
    assert _rules([USER, request, stray]) == [(2, "tool_result_without_call")]
    assert _rules([USER, response, request]) == [(1, "tool_result_without_call")]


def test_the_session_helpers_share_the_table() -> None:
    """Invariant: call_key and output_key match for every kind (one rule, one
    place: the OpenAI Agents session imports them)."""
    for kind in CALL_KINDS:
        assert output_key(_output(kind, "k")) == call_key(_call(kind, "k"))
    assert call_key(USER) is None and output_key(USER) is None


_items = st.lists(
    st.one_of(
        st.just(USER),
        st.builds(_call, st.sampled_from(KINDS), st.sampled_from(["a", "b"])),
        st.builds(_output, st.sampled_from(KINDS), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=12,
)


@settings(max_examples=300, deadline=None)
@given(_items)
def test_what_the_session_window_keeps_pairs(items: list[dict[str, Any]]) -> None:
    """Invariant: over generated inputs of every opaque kind, what the OpenAI Agents
    session's complete_window keeps (after the user input it starts with) has no
    pairing violation: the session and validate apply one rule."""
    pytest.importorskip("agents")
    from turnloom.integrations.openai_agents import complete_window

    kept = complete_window([USER, *items])
    pairing = {"tool_call_without_result", "tool_result_without_call"}
    assert [v for v in GATEWAY.validate(kept) if v.rule in pairing] == []


# -- pairing in the neutral model: complete_pairs, the door -------------------


def _cancelled(kind: str, call_id: str) -> dict[str, Any]:
    if kind == "function_call":
        return {"type": "function_call_output", "call_id": call_id, "output": CANCELLED_RESULT_TEXT}
    item = cancelled_output(f"{OUTPUTS[kind]} {call_id}", CANCELLED_RESULT_TEXT)
    assert item is not None
    return item


def _prepared(messages: list[Message], policy: OpenCallPolicy) -> list[dict[str, Any]]:
    """The input complete_pairs leaves under ``policy``, rendered."""
    completed = complete_pairs(messages, open_calls=policy, join=GATEWAY.step_join)
    return [item for message in completed for item in GATEWAY.render(message)]


@pytest.mark.parametrize("kind", [*KINDS, "mcp_approval_response"])
def test_an_output_parses_to_a_tool_message_and_renders_back(kind: str) -> None:
    """Invariant: an output of each opaque kind (and an MCP approval response) parses to
    a tool message holding the item verbatim, which renders back to that item alone."""
    item = (
        _output(kind, "k1")
        if kind in OUTPUTS
        else {"type": kind, "approval_request_id": "mcpr_1", "approve": False}
    )
    message = GATEWAY.parse(item)
    assert message.role is Role.tool
    assert GATEWAY.render(message) == [item]


@pytest.mark.parametrize("kind", list(OUTPUTS))
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("closed_by", ["next input", "end of input"])
def test_an_unanswered_call_is_closed_by_the_policy_as_a_function_call_is(
    kind: str, policy: OpenCallPolicy, closed_by: str
) -> None:
    """Invariant: a call of every kind left without its output (a cancelled turn) is
    left out under "exclude"; under "cancel" it is answered by a cancelled output of
    its own type where that type can say so, else left out too; either way the input
    is valid."""
    call = _call(kind, "k1", "it_1")
    items = [USER, call, NEXT] if closed_by == "next input" else [USER, call]
    tail = [NEXT] if closed_by == "next input" else []
    got = _prepared(GATEWAY.parse_items(items), policy)
    if policy == "cancel" and kind in CANCELLABLE:
        assert got == [USER, call, _cancelled(kind, "k1"), *tail]
    else:
        assert got == [USER, *tail]
    assert _rules(got) == []


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", POLICIES)
def test_parallel_calls_keep_the_answered_one(kind: str, policy: OpenCallPolicy) -> None:
    """Invariant: a function_call answered and a call of another kind left open in one
    model step: the answered pair stays in place, the open call is closed by the policy
    (its cancelled output after the results that arrived)."""
    function = _call("function_call", "f1")
    other = _call(kind, "k1")
    answer = {"type": "function_call_output", "call_id": "f1", "output": "ok"}
    got = _prepared(GATEWAY.parse_items([USER, function, other, answer, NEXT]), policy)
    if policy == "cancel" and kind in CANCELLABLE:
        assert got == [USER, function, other, answer, _cancelled(kind, "k1"), NEXT]
    else:
        assert got == [USER, function, answer, NEXT]
    assert _rules(got) == []


@pytest.mark.parametrize("kind", list(OUTPUTS))
@pytest.mark.parametrize("policy", POLICIES)
def test_an_answered_call_is_kept_exactly(kind: str, policy: OpenCallPolicy) -> None:
    """Invariant: a call of every kind with its output stays as it was, under both
    policies (pairing changes nothing it does not have to)."""
    items = [USER, _call(kind, "k1", "it_1"), _output(kind, "k1"), NEXT]
    if kind == "function_call":
        items[2] = {"type": "function_call_output", "call_id": "k1", "output": "done"}
    assert _prepared(GATEWAY.parse_items(items), policy) == items


@pytest.mark.parametrize("policy", POLICIES)
def test_an_unanswered_mcp_approval_request_is_kept(policy: OpenCallPolicy) -> None:
    """Invariant: an mcp_approval_request left unanswered stays under both policies (the
    API accepts one: validate flags nothing); answered, both stay; a response naming
    no request is left out."""
    request = {"type": "mcp_approval_request", "id": "mcpr_1", "name": "deploy"}
    request |= {"arguments": "{}", "server_label": "ops"}
    response = {"type": "mcp_approval_response", "approval_request_id": "mcpr_1", "approve": True}
    stray = {**response, "approval_request_id": "mcpr_2"}
    assert _prepared(GATEWAY.parse_items([USER, request, NEXT]), policy) == [USER, request, NEXT]
    assert _prepared(GATEWAY.parse_items([USER, request]), policy) == [USER, request]
    answered = [USER, request, response, NEXT]
    assert _prepared(GATEWAY.parse_items(answered), policy) == answered
    assert _prepared(GATEWAY.parse_items([USER, request, stray, NEXT]), policy) == [
        USER,
        request,
        NEXT,
    ]


@pytest.mark.parametrize("kind", [*OUTPUTS, "mcp_approval_request"])
def test_an_output_answering_no_call_is_refused_at_the_door(kind: str) -> None:
    """Invariant: check_steps (the door's pairing check) refuses an output of every kind
    that answers no open call -- never made, or made for another kind with the same id
    -- with UnpairedResultError naming the message and the call's pairing key, as it
    refuses a function_call_output; the same output answering its call passes."""
    if kind == "mcp_approval_request":
        call = {"type": kind, "id": "k1", "name": "deploy", "arguments": "{}", "server_label": "s"}
        output = {"type": "mcp_approval_response", "approval_request_id": "k1", "approve": True}
        key = "mcp_approval_response k1"
    elif kind == "function_call":
        call = _call(kind, "k1")
        output = {"type": "function_call_output", "call_id": "k1", "output": "ok"}
        key = "k1"
    else:
        call, output, key = _call(kind, "k1"), _output(kind, "k1"), f"{OUTPUTS[kind]} k1"
    check_steps(GATEWAY.parse_items([USER, call, output]), "Input")
    other = next(k for k in KINDS if k != kind)
    for made in ([USER], [USER, _call(other, "k1")]):
        messages = GATEWAY.parse_items([*made, NEXT, output])
        with pytest.raises(UnpairedResultError) as caught:
            check_steps(messages, "Input")
        assert (caught.value.field, caught.value.call_id) == (f"Input[{len(messages) - 1}]", key)


_ALL_KINDS = [*OUTPUTS, "mcp_approval_request"]


def _any_call(kind: str, call_id: str) -> dict[str, Any]:
    if kind == "mcp_approval_request":
        return {"type": kind, "id": call_id, "name": "deploy", "arguments": "{}"}
    return _call(kind, call_id)


def _any_output(kind: str, call_id: str) -> dict[str, Any]:
    if kind == "mcp_approval_request":
        return {"type": "mcp_approval_response", "approval_request_id": call_id, "approve": True}
    if kind == "function_call":
        return {"type": "function_call_output", "call_id": call_id, "output": "ok"}
    return _output(kind, call_id)


_mixed = st.lists(
    st.one_of(
        st.just(NEXT),
        st.builds(_any_call, st.sampled_from(_ALL_KINDS), st.sampled_from(["a", "b"])),
        st.builds(_any_output, st.sampled_from(_ALL_KINDS), st.sampled_from(["a", "b", "c"])),
    ),
    max_size=14,
)


@settings(max_examples=400, deadline=None)
@given(_mixed, st.sampled_from(POLICIES))
def test_what_pairing_keeps_validates(items: list[dict[str, Any]], policy: OpenCallPolicy) -> None:
    """Invariant: over generated inputs mixing every call kind, their outputs and MCP
    approvals, the input complete_pairs leaves (either policy) has no pairing
    violation, and every item of it is an item given or a cancelled output."""
    try:
        messages = GATEWAY.parse_items([USER, *items])
    except DuplicateIdError:  # two function_calls with one id in one model turn
        return
    got = _prepared(messages, policy)
    pairing = {"tool_call_without_result", "tool_result_without_call", "duplicate_call_id"}
    assert [v for v in GATEWAY.validate(got) if v.rule in pairing] == []
    cancelled = [_cancelled(k, i) for k in CANCELLABLE for i in ("a", "b")]
    assert all(item in items or item == USER or item in cancelled for item in got)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("split", [False, True])
def test_an_output_recorded_as_assistant_content_still_answers_its_call(
    kind: str, policy: OpenCallPolicy, split: bool
) -> None:
    """Invariant: a history recorded before outputs parsed to tool messages holds the
    output beside its call in one assistant message (parse_items joined them), or in
    the assistant message after it (parse); the pair is kept exactly under both
    policies, not taken for an unanswered call."""
    call, output = _call(kind, "k1", "it_1"), _output(kind, "k1")
    parts = (OpaquePart(gateway="openai_responses", item=call),)
    answer = (OpaquePart(gateway="openai_responses", item=output),)
    user, next_input = GATEWAY.parse(USER), GATEWAY.parse(NEXT)
    if split:
        model = [Message(role=Role.assistant, content=parts)]
        model.append(Message(role=Role.assistant, content=answer))
    else:
        model = [Message(role=Role.assistant, content=parts + answer)]
    got = _prepared([user, *model, next_input], policy)
    assert got == [USER, call, output, NEXT]
