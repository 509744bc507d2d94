"""Anthropic prompt-cache rules: the 4-breakpoint budget, TTL order, the automatic policy.

Sources: Anthropic prompt caching guide (at most 4 ``cache_control``
breakpoints per request, counted across ``tools``, ``system`` and message
blocks; a top-level ``cache_control`` takes a slot; longer TTLs first; about
20 blocks of lookback). The recorded bodies that carry marks were accepted
(status 200): they must pass.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from tests.context.gateways._support import load_records
from turnloom.context.cache import (
    ANTHROPIC_LOOKBACK_BLOCKS,
    anthropic_breakpoints,
    place_breakpoints,
    prompt_cache_key,
)
from turnloom.context.gateways import AnthropicGateway
from turnloom.errors import InvalidArgumentError

GATEWAY = AnthropicGateway()
MARK = {"type": "ephemeral"}


def _text(text: str, **mark: Any) -> dict[str, Any]:
    block: dict[str, Any] = {"type": "text", "text": text}
    if mark:
        block["cache_control"] = dict(mark)
    return block


def _user(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "user", "content": list(blocks)}


def _assistant(*blocks: dict[str, Any]) -> dict[str, Any]:
    return {"role": "assistant", "content": list(blocks)}


def _rules(violations: list[Any]) -> list[tuple[int, str]]:
    return [(v.index, v.rule) for v in violations]


def test_recorded_bodies_with_marks_pass(recordings_dir: Path) -> None:
    """Invariant: every accepted recorded body with cache_control passes validate_request."""
    marked = [
        r
        for r in load_records(recordings_dir, "anthropic")
        if "cache_control" in json.dumps(r["request"])
    ]
    assert len(marked) == 6
    assert all(r["status"] == 200 for r in marked)
    assert [GATEWAY.validate_request(r["request"]) for r in marked] == [[]] * 6
    # One of them marks through the top-level field (automatic caching): one slot.
    counts = sorted(len(anthropic_breakpoints(r["request"])) for r in marked)
    assert counts == [1, 1, 1, 1, 1, 1]


def test_recorded_body_with_a_fifth_mark_is_flagged(recordings_dir: Path) -> None:
    """Invariant: a recorded body grown to 5 marks (tools, system, blocks) is flagged once."""
    record = next(
        r
        for r in load_records(recordings_dir, "anthropic")
        if r["source"].endswith("test_mid_conversation_system_prompt_takes_cache_breakpoint.yaml#0")
    )
    body = copy.deepcopy(record["request"])
    body["tools"] = [{"name": "t", "input_schema": {"type": "object"}, "cache_control": MARK}]
    body["system"] = [_text("Be brief.", **MARK)]
    body["messages"][0]["content"] = [
        {**block, "cache_control": MARK} for block in body["messages"][0]["content"]
    ]
    assert len(anthropic_breakpoints(body)) == 4
    assert GATEWAY.validate_request(body) == []
    body["messages"][1]["content"][-1]["cache_control"] = MARK
    assert len(anthropic_breakpoints(body)) == 5
    assert [v.rule for v in GATEWAY.validate_request(body)] == ["too_many_cache_breakpoints"]


def test_four_marks_pass_five_are_flagged_at_the_fifth() -> None:
    """Invariant: validate() takes 4 message-block marks and flags the fifth, at its item."""
    four = [_user(_text("a", **MARK), _text("b", **MARK)), _assistant(_text("c", **MARK))]
    four.append(_user(_text("d", **MARK)))
    assert GATEWAY.validate(four) == []
    five = [*four, _assistant(_text("e", **MARK))]
    assert _rules(GATEWAY.validate(five)) == [(3, "too_many_cache_breakpoints")]


def test_marks_are_counted_across_tools_system_and_the_top_level_field() -> None:
    """Invariant: validate_request counts tools, system, blocks and automatic caching."""
    body: dict[str, Any] = {
        "tools": [{"name": "t", "input_schema": {"type": "object"}, "cache_control": MARK}],
        "system": [_text("rules", **MARK)],
        "messages": [_user(_text("hi", **MARK))],
    }
    assert GATEWAY.validate(body["messages"]) == []
    assert GATEWAY.validate_request(body) == []
    body["cache_control"] = MARK
    assert GATEWAY.validate_request(body) == []  # 4: the automatic mark is the fourth
    body["system"].append(_text("more", **MARK))
    assert _rules(GATEWAY.validate_request(body)) == [(-1, "too_many_cache_breakpoints")]


def test_a_one_hour_mark_after_a_five_minute_one_is_flagged() -> None:
    """Invariant: longer TTLs come first, in reading order tools, system, messages."""
    hour = {"type": "ephemeral", "ttl": "1h"}
    ordered = {"system": [_text("s", **hour)], "messages": [_user(_text("u", **MARK))]}
    assert GATEWAY.validate_request(ordered) == []
    wrong = {"system": [_text("s", **MARK)], "messages": [_user(_text("u", **hour))]}
    assert _rules(GATEWAY.validate_request(wrong)) == [(0, "cache_ttl_order")]
    explicit = {"type": "ephemeral", "ttl": "5m"}
    inline = [_user(_text("a", **explicit)), _assistant(_text("b", **hour))]
    assert _rules(GATEWAY.validate(inline)) == [(1, "cache_ttl_order")]


def _conversation(turns: int, blocks_per_turn: int = 2) -> list[dict[str, Any]]:
    messages = []
    for turn in range(turns):
        messages.append(_user(_text(f"q{turn}")))
        messages.append(_assistant(*(_text(f"a{turn}.{b}") for b in range(blocks_per_turn - 1))))
    return messages


def _marked(body: dict[str, Any]) -> list[tuple[str, int, int]]:
    return [(m.field, m.item, m.block) for m in anthropic_breakpoints(body)]


def test_policy_marks_the_rolling_end_the_closed_turn_and_the_instructions() -> None:
    """Invariant: with no host marks the policy places rolling, closed-turn and system marks."""
    messages = _conversation(3)
    messages.append(_user(_text("now")))
    body: dict[str, Any] = {"system": "You help.", "messages": messages}
    assert place_breakpoints(body, closed_blocks=6) == 3
    assert _marked(body) == [("system", 0, -1), ("messages", 5, 0), ("messages", 6, 0)]
    assert body["system"] == [_text("You help.", **MARK)]
    assert GATEWAY.validate_request(body) == []


def test_policy_counts_host_marks_and_never_exceeds_four() -> None:
    """Invariant: host marks use the budget first; the policy spends only what is left."""
    messages = _conversation(3)
    for index in (0, 1, 2, 3):
        messages[index]["content"][0]["cache_control"] = dict(MARK)
    messages.append(_user(_text("now")))
    body: dict[str, Any] = {"system": "You help.", "messages": messages}
    assert place_breakpoints(body, closed_blocks=6) == 0
    assert len(anthropic_breakpoints(body)) == 4
    assert body["system"] == "You help."
    del messages[3]["content"][0]["cache_control"]
    assert place_breakpoints(body, closed_blocks=6) == 1
    assert _marked(body)[-1] == ("messages", 6, 0)  # the rolling mark comes first


def test_policy_keeps_marks_on_copies_of_the_blocks() -> None:
    """Invariant: a marked block is a new dict; the block it replaced is unchanged."""
    block = _text("now")
    body: dict[str, Any] = {"messages": [_user(block)]}
    place_breakpoints(body, closed_blocks=0)
    assert block == {"type": "text", "text": "now"}
    assert body["messages"][0]["content"][0] == _text("now", **MARK)


def test_policy_skips_thinking_blocks_and_respects_a_host_hour_mark() -> None:
    """Invariant: no mark on a thinking block; no 5m policy mark before a host 1h mark."""
    thinking = {"type": "thinking", "thinking": "hm", "signature": "s"}
    messages = [_user(_text("q")), _assistant(_text("a"), thinking)]
    body: dict[str, Any] = {"system": "S", "messages": messages}
    place_breakpoints(body, closed_blocks=0)
    assert _marked(body) == [("system", 0, -1), ("messages", 1, 0)]
    hour = {"type": "ephemeral", "ttl": "1h"}
    messages = [_user(_text("q", **hour)), _assistant(_text("a")), _user(_text("b"))]
    body = {"system": "S", "messages": messages}
    assert place_breakpoints(body, closed_blocks=2) == 2
    assert _marked(body) == [("messages", 0, 0), ("messages", 1, 0), ("messages", 2, 0)]
    assert GATEWAY.validate_request(body) == []


def test_policy_bridges_a_turn_longer_than_the_lookback() -> None:
    """Invariant: marks after the closed turn lie at most 20 blocks apart, budget allowing."""
    messages = _conversation(1)
    # One open turn of 30 tool steps: 60 blocks after the closed turn.
    messages.append(_user(_text("go")))
    for step in range(30):
        call = {"type": "tool_use", "id": f"c{step}", "name": "f", "input": {}}
        messages.append(_assistant(call))
        result = {"type": "tool_result", "tool_use_id": f"c{step}", "content": "ok"}
        messages.append(_user(result))
    body: dict[str, Any] = {"messages": messages}
    assert place_breakpoints(body, closed_blocks=2) == 4
    flat = [(i, j) for i, m in enumerate(messages) for j in range(len(m["content"]))]
    where = sorted(flat.index((m.item, m.block)) for m in anthropic_breakpoints(body))
    assert where == [
        1,
        len(flat) - 1 - 2 * ANTHROPIC_LOOKBACK_BLOCKS,
        len(flat) - 21,
        len(flat) - 1,
    ]
    assert GATEWAY.validate_request(body) == []


def test_policy_refuses_a_bad_boundary_before_changing_the_body() -> None:
    """Invariant: a bad closed_blocks is a typed error and the body is left as it was."""
    body: dict[str, Any] = {"messages": [_user(_text("q"))]}
    with pytest.raises(InvalidArgumentError):
        place_breakpoints(body, closed_blocks=2)
    with pytest.raises(InvalidArgumentError):
        place_breakpoints({"system": "S"}, closed_blocks=0)
    assert body == {"messages": [_user(_text("q"))]}


def test_prompt_cache_key_is_a_salted_hash_of_the_id() -> None:
    """Invariant: one id gives one key; the key hides the id; the salt separates deployments."""
    key = prompt_cache_key("support-42")
    assert key == prompt_cache_key("support-42")
    assert key.startswith("tl-") and len(key) == 35 and "support" not in key
    assert prompt_cache_key("support-43") != key
    assert prompt_cache_key("support-42", b"tenant-a") != key
    with pytest.raises(InvalidArgumentError):
        prompt_cache_key("x", b"s" * 65)
