"""Property: nothing a host records is lost silently, however it splits a model step.

For host-shaped output streams (parallel calls in one message or one message
per call, text and reasoning before the calls, results in and out of call
order and in the next turn's input, OpenAI Responses output parsed whole or
item by item, Gemini parts with thought signatures, images inline and as
https URLs) on all four gateways and both backends, each recorded item meets
exactly one of: it appears in the next prepared input, in call order, in a
body that the gateway's ``validate()`` and the official SDK request types
accept; it is counted in a named statistic (``dropped_blank_outputs_total``);
or the record was refused with ``AmbiguousStepError`` and changed nothing.

Examples: ``TURNLOOM_STEP_EXAMPLES`` (default 40 per backend); the closing
run of issue 25 used 10,000.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from typing import Any

import anyio
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.context.gateways.test_properties import _sdk_errors
from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.errors import AmbiguousStepError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot

EXAMPLES = int(os.environ.get("TURNLOOM_STEP_EXAMPLES", "40"))
KINDS = [g.value for g in GatewayType]
PNG = (
    "iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mP8z8BQDwAEhQGAhKmMIQAAAABJRU5E"
    "rkJggg=="
)


@dataclass
class Step:
    """One model step as the host hands it over, and what must come of it."""

    outputs: list[Message]  # the calls (and text, reasoning) as recorded
    results: list[Message]  # the results, as recorded (maybe out of call order)
    call_ids: list[str]  # in call order
    tokens: list[str]  # strings that must appear in the next input
    ambiguous: bool = False  # a split the door must refuse
    deferred: bool = False  # results go to the next turn's input


@dataclass
class Turn:
    user: Message
    tokens: list[str]
    steps: list[Step] = field(default_factory=list)
    blanks: int = 0


# -- host-shaped streams, per gateway ------------------------------------------------

_responses = get_gateway(GatewayType.openai_responses)
_anthropic = get_gateway(GatewayType.anthropic)
_gemini = get_gateway(GatewayType.gemini)
_chat = get_gateway(GatewayType.openai_chat)


def _native_step(kind: str, tag: str, calls: int, text: bool, think: bool) -> list[dict[str, Any]]:
    """One response's output items in the provider's shape, oldest first (one per part)."""
    ids = [f"{tag}c{i}" for i in range(calls)]
    if kind == "openai_responses":
        items: list[dict[str, Any]] = []
        if think:
            items.append(
                {
                    "type": "reasoning",
                    "id": f"rs_{tag}",
                    "summary": [],
                    "encrypted_content": f"enc{tag}",
                }
            )
        if text:
            items.append(
                {
                    "type": "message",
                    "id": f"msg_{tag}",
                    "role": "assistant",
                    "status": "completed",
                    "content": [{"type": "output_text", "text": f"say{tag}", "annotations": []}],
                }
            )
        for i, call_id in enumerate(ids):
            items.append(
                {
                    "type": "function_call",
                    "id": f"fc_{call_id}",
                    "call_id": call_id,
                    "name": "lookup",
                    "arguments": json.dumps({"n": i}),
                }
            )
        return items
    if kind == "anthropic":
        blocks: list[dict[str, Any]] = []
        if think:
            blocks.append({"type": "thinking", "thinking": f"think{tag}", "signature": f"sig{tag}"})
        if text:
            blocks.append({"type": "text", "text": f"say{tag}"})
        blocks += [
            {"type": "tool_use", "id": c, "name": "lookup", "input": {"n": i}}
            for i, c in enumerate(ids)
        ]
        return [{"role": "assistant", "content": [b]} for b in blocks]
    if kind == "gemini":
        parts: list[dict[str, Any]] = []
        if think:
            parts.append({"text": f"think{tag}", "thought": True})
        if text:
            parts.append({"text": f"say{tag}"})
        for i, call_id in enumerate(ids):
            part: dict[str, Any] = {
                "functionCall": {"id": call_id, "name": "lookup", "args": {"n": i}}
            }
            if i == 0:
                part["thoughtSignature"] = f"U0lH{tag}"  # the step's signature, on its first call
            parts.append(part)
        return [{"role": "model", "parts": [p]} for p in parts]
    # OpenAI Chat: text then the calls (Chat replays no reasoning).
    out: list[dict[str, Any]] = []
    if text:
        out.append({"role": "assistant", "content": f"say{tag}"})
    out += [
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": c,
                    "type": "function",
                    "function": {"name": "lookup", "arguments": json.dumps({"n": i})},
                }
            ],
        }
        for i, c in enumerate(ids)
    ]
    return out


def _parsed(kind: str, items: list[dict[str, Any]], split: bool) -> list[Message]:
    """The step's messages: parsed item by item (split), or joined as one response."""
    gateway = get_gateway(kind)
    if kind == "openai_responses":
        return [gateway.parse(i) for i in items] if split else gateway.parse_items(items)
    messages = [gateway.parse(i) for i in items]
    if split or len(messages) <= 1:
        return messages
    # One message for the response: its parts in order.
    first = messages[0]
    parts = tuple(p for m in messages for p in m.parts)
    return [Message(role=Role.assistant, content=parts, layout=first.layout)]


def _result(call_id: str, tag: str) -> ToolResultPart:
    return ToolResultPart(call_id=call_id, name="lookup", content=(TextPart(text=f"res{tag}"),))


@st.composite
def steps(draw: st.DrawFn, kind: str, tag: str) -> Step:
    calls = draw(st.integers(0, 3))
    text = draw(st.booleans())
    think = kind != "openai_chat" and draw(st.booleans())
    split = draw(st.booleans())
    ids = [f"{tag}c{i}" for i in range(calls)]
    items = _native_step(kind, tag, calls, text or not calls, think)
    outputs = _parsed(kind, items, split)
    tokens = [*ids, *([f"say{tag}"] if text or not calls else [])]
    if think:
        tokens.append(
            {"openai_responses": f"enc{tag}", "anthropic": f"sig{tag}"}.get(kind, f"think{tag}")
        )
    if kind == "gemini" and calls:
        tokens.append(f"U0lH{tag}")
    ambiguous = False
    if calls and draw(st.integers(0, 7)) == 0:
        # A split message repeating a call id of its step: refused.
        ambiguous = True
        again = next(m for m in outputs if m.tool_calls)
        outputs = [
            *outputs,
            Message(role=Role.assistant, content=(again.tool_calls[0],), layout=again.layout),
        ]
    elif calls >= 2 and draw(st.integers(0, 5)) == 0:
        # Text after the first call, then the next call: still one step.
        tokens.append(f"after{tag}")
        after = Message(role=Role.assistant, content=f"after{tag}")
        at = next(i for i, m in enumerate(outputs) if m.tool_calls) + 1
        outputs = [*outputs[:at], after, *outputs[at:]]
        if len(outputs[at - 1].tool_calls) > 1:  # the calls were one message: split them
            head = outputs[at - 1]
            first_call = head.tool_calls[0]
            rest = [p for p in head.parts if p is not first_call]
            lead = tuple(p for p in rest if type(p) is not ToolCallPart)
            plain = {"gateway": head.layout["gateway"]} if head.layout else None
            outputs[at - 1 : at + 1] = [
                Message(
                    role=Role.assistant,
                    content=(*lead, first_call),
                    id=head.id,
                    layout=head.layout,
                ),
                after,
                Message(
                    role=Role.assistant,
                    content=tuple(p for p in rest if type(p) is ToolCallPart),
                    layout=plain,
                ),
            ]
    order = draw(st.permutations(range(calls))) if calls else []
    results: list[Message] = []
    if draw(st.booleans()):  # one tool message per result
        results = [Message(role=Role.tool, content=(_result(ids[i], f"{tag}r{i}"),)) for i in order]
    elif calls:
        results = [
            Message(role=Role.tool, content=tuple(_result(ids[i], f"{tag}r{i}") for i in order))
        ]
    tokens += [f"res{tag}r{i}" for i in range(calls)]
    return Step(outputs, results, ids, tokens, ambiguous)


@st.composite
def conversations(draw: st.DrawFn) -> tuple[str, list[Turn]]:
    kind = draw(st.sampled_from(KINDS))
    turns: list[Turn] = []
    for t in range(draw(st.integers(1, 3))):
        image = draw(st.sampled_from([None, "url", "inline"]))
        parts: list[Any] = [TextPart(text=f"ask{t}")]
        tokens = [f"ask{t}"]
        if image == "url":
            parts.append(ImagePart(url=f"https://example.com/{t}.png"))
            tokens.append(f"https://example.com/{t}.png")
        elif image == "inline":
            parts.append(ImagePart(data=PNG, media_type="image/png"))
            tokens.append(PNG)
        turn = Turn(Message(role=Role.user, content=tuple(parts)), tokens)
        for s in range(draw(st.integers(1, 3))):
            turn.steps.append(draw(steps(kind, f"t{t}s{s}")))
        last = turn.steps[-1]
        last.deferred = bool(last.results) and not last.ambiguous and draw(st.booleans())
        turn.blanks = draw(st.integers(0, 1))
        turns.append(turn)
    return kind, turns


# -- the check ------------------------------------------------------------------------


def _call_order(kind: str, items: list[dict[str, Any]]) -> list[str]:
    """The call ids of the body's calls, in body order."""
    out: list[str] = []
    for item in items:
        if kind == "openai_chat":
            out += [c["id"] for c in item.get("tool_calls") or ()]
        elif kind == "openai_responses":
            if item.get("type") == "function_call":
                out.append(item["call_id"])
        elif kind == "anthropic":
            if item["role"] == "assistant" and isinstance(item["content"], list):
                out += [b["id"] for b in item["content"] if b.get("type") == "tool_use"]
        else:
            out += [p["functionCall"]["id"] for p in item["parts"] if "functionCall" in p]
    return out


async def _run(kind: str, turns: list[Turn]) -> None:
    async with Foundation(gateway=kind) as foundation:
        manager: ContextManager = foundation.manager
        expected: list[str] = []
        refused: list[str] = []
        calls: list[str] = []
        blanks = 0
        carry: list[Message] = []  # results for the next turn's input
        for t, turn in enumerate(turns):
            manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id=f"t{t}", input=(*carry, turn.user))
            )
            carry = []
            expected += turn.tokens
            for step in turn.steps:
                batch = [*step.outputs, *([] if step.deferred else step.results)]
                if step.ambiguous:
                    before = manager.history("c").turn_messages(f"t{t}")
                    stats = manager.statistics().history
                    with pytest.raises(AmbiguousStepError):
                        manager.record("c", f"t{t}", batch)
                    assert manager.history("c").turn_messages(f"t{t}") == before
                    assert manager.statistics().history == stats
                    refused += step.tokens
                    continue
                assert manager.record("c", f"t{t}", batch) == len(batch)
                if step.deferred:
                    carry = step.results
                expected += step.tokens
                calls += step.call_ids
            for _ in range(turn.blanks):
                manager.record("c", f"t{t}", [Message(role=Role.assistant, content=" ")])
                blanks += 1
        manager.accept_turn(
            TurnSnapshot(
                context_id="c",
                turn_id="next",
                input=(*carry, Message(role=Role.user, content="next")),
            )
        )
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="next"))
        gateway = manager.gateway
        body = gateway.request_body(prefix.items)
        items = body[gateway.items_field]
        assert gateway.validate(items) == []
        assert _sdk_errors(kind, items) == []
        text = json.dumps(body)
        missing = [token for token in expected if f'{token}"' not in text]
        assert missing == [], f"recorded but not in the next input: {missing}"
        leaked = [token for token in refused if token in text]
        assert leaked == [], f"refused yet in the next input: {leaked}"
        assert _call_order(kind, items) == calls
        assert manager.statistics().history.dropped_blank_outputs_total == blanks


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(conversation=conversations())
def test_every_recorded_item_reaches_the_next_input_or_is_counted_or_refused(
    backend: str, conversation: tuple[str, list[Turn]]
) -> None:
    kind, turns = conversation
    # Quiet the gateways' lossy-render warnings for this test only: the level is
    # process-wide, and other tests assert those warnings.
    logger = logging.getLogger("turnloom")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        anyio.run(_run, kind, turns, backend=backend)
    finally:
        logger.setLevel(level)
