"""Recorded provider traffic (``../shared/data/provider-recordings``) through the gateways.

Accepted requests (status 200) are ground truth: native -> Message -> native
reproduces their item list and instructions exactly, and ``validate()``
reports nothing. Of the rejected requests (status 400) only one breaks a
structural rule -- the OpenAI Responses request with a ``reasoning`` item
sent without its following item -- and ``validate()`` must flag it. The
other rejections are about model capabilities (an unsupported role, effort
level, file type or tool for that model, an unreachable URL); they are out of
scope for structural validation and are only counted here.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from tests.context.gateways._support import (
    ITEM_FIELD,
    PROVIDERS,
    load_records,
    rendered,
    request_fields,
)
from turnloom.context import Gateway, Role, get_gateway
from turnloom.context.gateways import AnthropicGateway

# Counts stated in SOURCE.md beside the recordings.
ACCEPTED = {"anthropic": 151, "openai_chat": 89, "openai_responses": 176, "gemini": 313}
REJECTED = {"anthropic": 1, "openai_chat": 6, "openai_responses": 5, "gemini": 2}


def _exact_gateway(provider: str) -> Gateway:
    # Anthropic merges adjacent same-role turns by default (the API combines
    # them anyway); reproducing recorded traffic item for item needs it off.
    if provider == "anthropic":
        return AnthropicGateway(merge_turns=False)
    return get_gateway(provider)


def _validate(gateway: Gateway, provider: str, body: dict[str, Any], items: Any) -> list[Any]:
    continues = bool(body.get("previous_response_id") or body.get("conversation"))
    return list(gateway.validate(items, continues_response=continues))


@pytest.mark.parametrize("provider", PROVIDERS)
def test_accepted_requests_round_trip_exactly(recordings_dir: Path, provider: str) -> None:
    """Invariant: parse_request -> render -> request_body reproduces every accepted body."""
    gateway = _exact_gateway(provider)
    records = [r for r in load_records(recordings_dir, provider) if r["status"] == 200]
    mismatched: list[str] = []
    for record in records:
        body = record["request"]
        produced = gateway.request_body(rendered(gateway, gateway.parse_request(body)))
        if produced != request_fields(provider, body):
            mismatched.append(record["source"])
    assert mismatched == []
    assert len(records) == ACCEPTED[provider]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_accepted_requests_have_no_violation(recordings_dir: Path, provider: str) -> None:
    """Invariant: validate() reports nothing on traffic the provider accepted."""
    gateway = get_gateway(provider)
    flagged: dict[str, list[str]] = {}
    for record in load_records(recordings_dir, provider):
        if record["status"] != 200:
            continue
        body = record["request"]
        items = body[ITEM_FIELD[provider]]
        violations = _validate(gateway, provider, body, items)
        if violations:
            flagged[record["source"]] = [v.rule for v in violations]
    assert flagged == {}


def test_responses_reasoning_without_following_item_is_flagged(recordings_dir: Path) -> None:
    """The one structural rejection in the recordings is caught by validate()."""
    gateway = get_gateway("openai_responses")
    rejected = [
        r
        for r in load_records(recordings_dir, "openai_responses")
        if r["status"] != 200 and "without its required following item" in r.get("error", "")
    ]
    assert len(rejected) == 1
    items = rejected[0]["request"]["input"]
    violations = gateway.validate(items)
    assert [(v.index, v.rule) for v in violations] == [(1, "reasoning_without_following_item")]
    assert "rs_68c42de022c881948db7ed1cc2529f2e0202c9ad459e0d23" in violations[0].message


def test_responses_render_drops_reasoning_that_cannot_be_sent(recordings_dir: Path) -> None:
    """Invariant: the gateway never emits the rejected shape, even when parsing it."""
    gateway = get_gateway("openai_responses")
    record = next(
        r
        for r in load_records(recordings_dir, "openai_responses")
        if "without its required following item" in r.get("error", "")
    )
    messages = gateway.parse_request(record["request"])
    body = gateway.request_body(rendered(gateway, messages))
    assert gateway.validate(body["input"]) == []
    assert [i.get("type", i.get("role")) for i in body["input"]] == ["user", "assistant", "user"]


@pytest.mark.parametrize("provider", PROVIDERS)
def test_capability_rejections_are_out_of_scope(recordings_dir: Path, provider: str) -> None:
    """Rejections about model capabilities are not structural: validate() passes them.

    They are counted so that a change in the data is noticed; a structural
    rejection would show up in the previous test instead.
    """
    gateway = get_gateway(provider)
    rejected = [r for r in load_records(recordings_dir, provider) if r["status"] != 200]
    assert len(rejected) == REJECTED[provider]
    structural = [r for r in rejected if "required following item" in r.get("error", "")]
    for record in rejected:
        if record in structural:
            continue
        body = record["request"]
        assert _validate(gateway, provider, body, body[ITEM_FIELD[provider]]) == []


def test_anthropic_default_merges_adjacent_turns_of_recorded_traffic(recordings_dir: Path) -> None:
    """Adjacent user turns (accepted, combined by the API) are merged by default."""
    gateway = get_gateway("anthropic")
    record = next(
        r
        for r in load_records(recordings_dir, "anthropic")
        if r["source"].endswith("test_anthropic_model_retrying_after_empty_response.yaml#0")
    )
    body = gateway.request_body(rendered(gateway, gateway.parse_request(record["request"])))
    original = record["request"]["messages"]
    assert body["messages"] == [
        {"role": "user", "content": original[0]["content"] + original[1]["content"]}
    ]
    assert gateway.validate(body["messages"]) == []


def _instruction_text(provider: str, value: Any) -> str:
    if isinstance(value, str):
        return value
    blocks = value["parts"] if provider == "gemini" else value
    return "".join(b["text"] for b in blocks)


@pytest.mark.parametrize(
    ("provider", "field"),
    [
        ("anthropic", "system"),
        ("openai_responses", "instructions"),
        ("gemini", "systemInstruction"),
    ],
)
def test_parse_request_puts_instructions_first_as_system(
    recordings_dir: Path, provider: str, field: str
) -> None:
    """Top-level instructions become one leading system message with their text."""
    gateway = get_gateway(provider)
    records = [r for r in load_records(recordings_dir, provider) if field in r["request"]]
    assert records
    for record in records:
        body = record["request"]
        messages = gateway.parse_request(body)
        assert messages[0].role is Role.system
        assert messages[0].text == _instruction_text(provider, body[field])
        inline = [m for m in messages[1:] if m.role is Role.system]
        assert len(inline) == sum(
            1 for i in body[ITEM_FIELD[provider]] if i.get("role") == "system"
        )
