"""What parse and decode hand back is the door's copy, and the door keeps its own.

Invariant (DESIGN: turnloom never mutates an object it is handed; what it
hands back is never shared with what it keeps): each gateway's ``parse``,
the OpenAI Responses ``parse_request`` and :func:`decode_message` leave the
item passed in as it was, and return the message
:func:`~turnloom.context.admit_message` holds for it: normalised (a tuple in
JSON data held as a list) and holding no dict or list of the item, so the
caller's later edits of the item change nothing returned. A parsed message
committed and then mutated by the host changes no later input: the history
holds its own copy again. An item routed to the area section is held as a
copy too.
"""

from __future__ import annotations

import copy
from typing import Any

import msgspec
import pytest

from tests._mutation import containers, mutate
from turnloom.areas import PinnedNotice
from turnloom.context import (
    GatewayType,
    Message,
    OpaquePart,
    Role,
    TextPart,
    TurnHistory,
    decode_message,
    get_gateway,
)
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

# One user item per gateway: a text with extras, an opaque part, and message-level
# extras holding a tuple (JSON data the door holds as a list).
_ITEMS: dict[str, Any] = {
    "openai_chat": lambda: {
        "role": "user",
        "content": [
            {"type": "text", "text": "hi", "x_t": {"a": [1]}},
            {"type": "file", "file": {"id": "f1"}},
        ],
        "meta": {"tags": ("a", "b")},
    },
    "openai_responses": lambda: {
        "type": "message",
        "role": "user",
        "content": [
            {"type": "input_text", "text": "hi", "x_t": {"a": [1]}},
            {"type": "input_file", "file_id": "f1"},
        ],
        "meta": {"tags": ("a", "b")},
    },
    "anthropic": lambda: {
        "role": "user",
        "content": [
            {"type": "text", "text": "hi", "x_t": {"a": [1]}},
            {
                "type": "document",
                "source": {"type": "text", "media_type": "text/plain", "data": "d"},
            },
        ],
        "meta": {"tags": ("a", "b")},
    },
    "gemini": lambda: {
        "role": "user",
        "parts": [
            {"text": "hi", "x_t": {"a": [1]}},
            {"fileData": {"fileUri": "gs://b/f.pdf", "mimeType": "application/pdf"}},
        ],
        "meta": {"tags": ("a", "b")},
    },
}
_OPAQUE: dict[str, dict[str, Any]] = {
    "openai_chat": {"type": "file", "file": {"id": "f1"}},
    "openai_responses": {"type": "input_file", "file_id": "f1"},
    "anthropic": {
        "type": "document",
        "source": {"type": "text", "media_type": "text/plain", "data": "d"},
    },
    "gemini": {"fileData": {"fileUri": "gs://b/f.pdf", "mimeType": "application/pdf"}},
}
_LAYOUT: dict[str, dict[str, Any]] = {
    "openai_chat": {"gateway": "openai_chat"},
    "openai_responses": {"gateway": "openai_responses", "typed": True},
    "anthropic": {"gateway": "anthropic"},
    "gemini": {"gateway": "gemini"},
}
GATEWAYS = tuple(_ITEMS)


def _expected(gateway: str) -> Message:
    """The message parse returns for ``_ITEMS[gateway]``: the tuple held as a list."""
    return Message(
        role=Role.user,
        content=(
            TextPart(text="hi", extras={"x_t": {"a": [1]}}),
            OpaquePart(gateway=gateway, item=copy.deepcopy(_OPAQUE[gateway])),
        ),
        extras={"meta": {"tags": ["a", "b"]}},
        layout=dict(_LAYOUT[gateway]),
    )


def _shared(message: Message, given: Any) -> set[int]:
    return set(containers(message)) & set(containers(given))


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_parse_leaves_the_item_as_it_was_and_returns_the_normalised_copy(gateway: str) -> None:
    item = _ITEMS[gateway]()
    before = copy.deepcopy(item)
    message = get_gateway(GatewayType(gateway)).parse(item)
    assert item == before
    assert type(item["meta"]["tags"]) is tuple  # nothing set on the caller's item
    assert message == _expected(gateway)
    assert message.extras == {"meta": {"tags": ["a", "b"]}}
    assert _shared(message, item) == set()
    mutate(item)
    assert message == _expected(gateway)


@pytest.mark.parametrize("gateway", GATEWAYS)
def test_parse_items_and_parse_request_return_the_normalised_copies(gateway: str) -> None:
    parser = get_gateway(GatewayType(gateway))
    items = [_ITEMS[gateway](), _ITEMS[gateway]()]
    messages = parser.parse_items(items)
    assert messages == [_expected(gateway), _expected(gateway)]
    assert _shared(messages[0], items) == _shared(messages[1], items) == set()
    mutate(items)
    assert messages == [_expected(gateway), _expected(gateway)]


def test_the_responses_input_string_is_parsed_to_a_held_user_message() -> None:
    """The input string path: a plain user message, the instructions before it."""
    body: dict[str, Any] = {"instructions": "Be brief.", "input": "hi"}
    messages = get_gateway(GatewayType.openai_responses).parse_request(body)
    assert body == {"instructions": "Be brief.", "input": "hi"}
    assert messages[1] == Message(role=Role.user, content=(TextPart(text="hi"),))
    assert type(messages[1].content) is tuple and type(messages[1].role) is Role


def test_decode_message_of_a_dict_returns_the_normalised_copy() -> None:
    data: dict[str, Any] = {
        "role": "user",
        "content": [{"type": "text", "text": "hi", "extras": {"x_t": {"a": [1]}}}],
        "extras": {"meta": {"tags": ("a", "b")}},
    }
    before = copy.deepcopy(data)
    message = decode_message(data)
    assert data == before
    assert type(data["extras"]["meta"]["tags"]) is tuple
    expected = Message(
        role=Role.user,
        content=(TextPart(text="hi", extras={"x_t": {"a": [1]}}),),
        extras={"meta": {"tags": ["a", "b"]}},
    )
    assert message == expected
    assert _shared(message, data) == set()
    mutate(data)
    assert message == expected


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("gateway", GATEWAYS)
def test_parsed_messages_mutated_after_a_commit_change_nothing_held(
    gateway: str, count: int
) -> None:
    """A commit of one message and of several (the history checks them on two paths)."""
    parser = get_gateway(GatewayType(gateway))
    messages = [parser.parse(_ITEMS[gateway]()) for _ in range(count)]
    history = TurnHistory()
    history.commit("t1", messages)
    mutate(messages)
    assert history.view().turn_messages("t1") == (_expected(gateway),) * count


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_a_parsed_message_mutated_after_accept_turn_changes_no_input(gateway: str) -> None:
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        message = manager.gateway.parse(_ITEMS[gateway]())
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(message,)))
        mutate(message)
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert list(prefix.items) == manager.gateway.render(_expected(gateway))


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_a_routed_item_mutated_after_routing_changes_no_input(gateway: str) -> None:
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        for context_id in ("host", "twin"):
            manager.accept_turn(
                TurnSnapshot(
                    context_id=context_id,
                    turn_id="t1",
                    input=(Message(role=Role.user, content="go"),),
                )
            )
            manager.areas.attach(context_id, PinnedNotice("note"))
        item = _ITEMS[gateway]()
        manager.areas.route("host", item)
        manager.areas.route("twin", _ITEMS[gateway]())
        mutate(item)
        host = await manager.prepare(ContextPrepareRequest(context_id="host", turn_id="t1"))
        twin = await manager.prepare(ContextPrepareRequest(context_id="twin", turn_id="t1"))
        assert host.items == twin.items
        assert b"MUT" not in msgspec.json.encode(host.items)
        rendered = manager.gateway.render(_expected(gateway))
        assert [i for i in host.items if i in rendered] == rendered
