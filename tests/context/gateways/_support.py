"""Helpers shared by the gateway tests: recorded traffic, tau-bench, request fields."""

from __future__ import annotations

__all__ = (
    "ITEM_FIELD",
    "PROVIDERS",
    "Record",
    "call_sites",
    "load_records",
    "load_tau_bench",
    "rendered",
    "request_fields",
)

import json
from functools import cache
from pathlib import Path
from typing import Any, TypedDict

from turnloom.context import Gateway, Message, NativeContent

PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")

# The request field holding the item list, per gateway.
ITEM_FIELD = {
    "openai_chat": "messages",
    "openai_responses": "input",
    "anthropic": "messages",
    "gemini": "contents",
}
# The request fields a gateway's request_body produces (input + instructions).
_FIELDS = {
    "openai_chat": ("messages",),
    "openai_responses": ("instructions", "input"),
    "anthropic": ("system", "messages"),
    "gemini": ("systemInstruction", "contents"),
}


class Record(TypedDict, total=False):
    source: str
    provider: str
    status: int
    request: dict[str, Any]
    error: str


@cache
def load_records(directory: Path, provider: str) -> tuple[Record, ...]:
    """Every record of ``provider``'s recording file, in file order."""
    path = directory / f"{provider}.jsonl"
    with path.open(encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


@cache
def load_tau_bench(path: Path) -> tuple[tuple[dict[str, Any], ...], ...]:
    """The message lists (OpenAI Chat dicts) of every tau-bench trajectory."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return tuple(tuple(entry["traj"]) for entry in data)


def request_fields(provider: str, body: dict[str, Any]) -> dict[str, Any]:
    """The fields of a recorded request body that a gateway's request_body produces."""
    return {k: body[k] for k in _FIELDS[provider] if k in body}


def rendered(gateway: Gateway, messages: list[Message]) -> list[NativeContent]:
    """Every message rendered by ``gateway``, concatenated in order."""
    return [item for message in messages for item in gateway.render(message)]


def call_sites(provider: str, items: list[Any]) -> list[tuple[str, int, str]]:
    """Every call and result in a request's item list, read straight from the JSON.

    Independent of the gateways' code (a test oracle): ``("call" | "result",
    item index, id)`` in request order. Gemini calls and responses without an
    id are not listed.
    """
    out: list[tuple[str, int, str]] = []
    for index, item in enumerate(items):
        if provider == "openai_chat":
            for call in item.get("tool_calls") or ():
                out.append(("call", index, call["id"]))
            if item.get("role") == "tool":
                out.append(("result", index, item["tool_call_id"]))
        elif provider == "openai_responses":
            if item.get("type") == "function_call":
                out.append(("call", index, item["call_id"]))
            elif item.get("type") == "function_call_output":
                out.append(("result", index, item["call_id"]))
        elif provider == "anthropic":
            content = item.get("content")
            for block in content if isinstance(content, list) else ():
                if block.get("type") == "tool_use":
                    out.append(("call", index, block["id"]))
                elif block.get("type") == "tool_result":
                    out.append(("result", index, block["tool_use_id"]))
        else:
            for part in item.get("parts", ()):
                call = part.get("functionCall", part.get("function_call"))
                response = part.get("functionResponse", part.get("function_response"))
                if isinstance(call, dict) and "id" in call:
                    out.append(("call", index, call["id"]))
                elif isinstance(response, dict) and "id" in response:
                    out.append(("result", index, response["id"]))
    return out
