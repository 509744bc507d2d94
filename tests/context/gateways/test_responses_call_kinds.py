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

from turnloom.context import get_gateway
from turnloom.context._call_kinds import CALL_KINDS, call_key, output_key

GATEWAY = get_gateway("openai_responses")
USER = {"role": "user", "content": "Go."}
KINDS = [kind for kind in CALL_KINDS if kind != "function_call"]


def _call(kind: str, call_id: str, item_id: str | None = None) -> dict[str, Any]:
    item: dict[str, Any] = {"type": kind, "call_id": call_id, "status": "completed"}
    if item_id is not None:
        item["id"] = item_id
    return item


def _output(kind: str, call_id: str) -> dict[str, Any]:
    return {"type": CALL_KINDS[kind], "call_id": call_id, "output": "done"}


def _rules(items: list[dict[str, Any]], **options: Any) -> list[tuple[int, str]]:
    return [(v.index, v.rule) for v in GATEWAY.validate(items, **options)]


def test_the_table_names_every_kind_the_openai_agents_sdk_pairs() -> None:
    """Invariant: CALL_KINDS is the SDK's own map of call item type to output item
    type (agents.run_internal.items._TOOL_CALL_TO_OUTPUT_TYPE), entry for entry."""
    items = pytest.importorskip("agents.run_internal.items")
    assert items._TOOL_CALL_TO_OUTPUT_TYPE == CALL_KINDS


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
