"""Helpers shared by the gateway tests: recorded traffic, tau-bench, request fields."""

from __future__ import annotations

__all__ = (
    "ITEM_FIELD",
    "PROVIDERS",
    "Record",
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
