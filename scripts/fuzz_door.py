"""Mutation fuzzing of the door: recorded provider requests, mutated, through every gateway.

Each iteration takes one recorded request body from
``../shared/data/provider-recordings/`` (a window of its items), applies one to
three mutations (drop, duplicate, swap or retype a field; lone surrogates, raw
and escaped in JSON text; NaN and infinities; deep nesting; huge strings; keys
a gateway writes itself; swapped roles; a removed layout, so extras go to every
gateway), then runs it through:

* the recording's gateway ``parse_request`` (the door for native bodies), and
  ``decode_message`` of the turnloom form of each parsed message, itself
  mutated (the door for turnloom JSON, bytes and dicts);
* ``check_message`` of a parsed message given, as a host may build it by
  hand, the layout of any gateway with any of its hints (right and wrong
  types, call ids of the message and others) and a field of a part set to a
  Python value of another type (int, bytes, None, a str subclass, NaN, a
  container, a forged log line, a huge or deeply nested value), never
  through JSON (the door for Python objects);
* ``render`` straight from a gateway (no door) of a parsed message made
  10,000 levels deep in its tool call arguments, extras or opaque item;
* for every message the doors accept, on all four gateways: ``render``,
  ``request_body``, ``json.dumps(..., allow_nan=False)``,
  ``msgspec.json.encode`` and ``validate``.

A refusal is a ``TurnloomError`` raised by a door. Anything else raised
anywhere is a crash, counted by kind (stage, gateway, exception type and the
innermost turnloom frame). Deterministic for one ``--seed``.

Usage::

    python scripts/fuzz_door.py --iterations 100000 [--seed 8] [--show 3]

Exit status 1 when any crash was seen.
"""

from __future__ import annotations

import argparse
import collections
import copy
import json
import logging
import math
import random
import reprlib
import sys
import time
import traceback
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    OpaquePart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    decode_message,
    get_gateway,
)
from turnloom.context.message import declared_native_keys
from turnloom.errors import TurnloomError

RECORDINGS = Path(__file__).resolve().parents[2] / "shared" / "data" / "provider-recordings"
PROVIDERS = ("openai_chat", "openai_responses", "anthropic", "gemini")
# Where each provider keeps its item list in a request body.
ITEM_LISTS = {
    "openai_chat": "messages",
    "openai_responses": "input",
    "anthropic": "messages",
    "gemini": "contents",
}
ROLES = ("system", "developer", "user", "assistant", "tool", "model", "function", "robot", "\ud800")
# Keys the gateways write themselves (as each declared them), to plant where extras come from.
WRITTEN = tuple(
    sorted(
        {
            key
            for keys in declared_native_keys().values()
            for element in ("message", "text", "image", "tool_call", "tool_result", "reasoning")
            for key in getattr(keys, element)
        }
    )
)


def deep(levels: int, leaf: Any = 1) -> Any:
    value = leaf
    for i in range(levels):
        value = [value] if i % 2 else {"k": value}
    return value


def deep_text(levels: int) -> str:
    return '{"a":' * levels + "1" + "}" * levels


ODD_VALUES: tuple[Callable[[random.Random], Any], ...] = (
    lambda r: None,
    lambda r: 0,
    lambda r: -1,
    lambda r: 2**70,
    lambda r: 1.5,
    lambda r: math.nan,
    lambda r: math.inf,
    lambda r: True,
    lambda r: "",
    lambda r: "   ",
    lambda r: "x",
    lambda r: "bad \ud800 text",
    lambda r: "\udc80",
    lambda r: "line\nERROR forged",
    lambda r: [],
    lambda r: {},
    lambda r: [1, "a", None],
    lambda r: {"output": "plain"},
    lambda r: {"role": "system"},
    lambda r: deep(r.choice((70, 200, 1500))),
    lambda r: "NaN",
    lambda r: '{"q": NaN}',
    lambda r: '{"q": "\\ud83c"}',
    lambda r: '{"q": Infinity}',
    lambda r: "[1, 2]",
    lambda r: '{"a": 1',
    lambda r: deep_text(r.choice((70, 1500))),
    lambda r: "{}",
    lambda r: r.choice(ROLES),
    lambda r: r.choice(WRITTEN),
)


def _positions(value: Any, path: tuple[Any, ...] = ()) -> Iterator[tuple[Any, ...]]:
    """Every path into ``value`` (iterative; bodies are shallow but may be wide)."""
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, path)]
    while stack:
        node, at = stack.pop()
        if isinstance(node, dict):
            for k, v in node.items():
                yield (*at, k)
                stack.append((v, (*at, k)))
        elif isinstance(node, list):
            for i, v in enumerate(node):
                yield (*at, i)
                stack.append((v, (*at, i)))


def _parent(root: Any, path: tuple[Any, ...]) -> Any:
    node = root
    for step in path[:-1]:
        node = node[step]
    return node


def mutate(value: Any, rng: random.Random) -> str:
    """Apply one random mutation to ``value`` in place; return its name."""
    paths = list(_positions(value))
    if not paths:
        return "none"
    path = rng.choice(paths)
    parent, key = _parent(value, path), path[-1]
    kind = rng.randrange(12)
    if kind == 0:
        del parent[key]
        return "drop"
    if kind == 1 and isinstance(parent, list):
        parent.insert(key, parent[key])  # shared: later mutations may touch both
        return "duplicate"
    if kind == 2 and isinstance(parent, list) and len(parent) > 1:
        other = rng.randrange(len(parent))
        parent[key], parent[other] = parent[other], parent[key]
        return "swap"
    if kind == 3 and isinstance(parent[key], str):
        text = parent[key]
        cut = rng.randrange(len(text) + 1)
        parent[key] = (
            text[:cut] + rng.choice(("\ud800", "\udfff", "\\ud83c", "\x00", "\n")) + text[cut:]
        )
        return "surrogate"
    if kind == 4:
        parent[key] = "x" * rng.choice((1024 * 1024 + 1, 300_000))
        return "huge"
    if kind == 5 and isinstance(parent, dict):
        parent[rng.choice(WRITTEN)] = rng.choice(ODD_VALUES)(rng)
        return "plant_key"
    if kind == 6 and isinstance(parent, dict) and "role" in parent:
        parent["role"] = rng.choice(ROLES)
        return "role"
    if kind == 7:
        parent[key] = deep(rng.choice((65, 300, 1200)), parent[key])
        return "nest"
    if kind == 8 and isinstance(parent[key], dict | list):
        inner = list(_positions(parent[key]))
        if inner:
            sub = rng.choice(inner)
            node = _parent(parent[key], sub)
            node[sub[-1]] = rng.choice(ODD_VALUES)(rng)
            return "retype_inner"
    if kind == 9 and isinstance(parent, dict) and "layout" in parent:
        parent["layout"] = None
        return "drop_layout"
    if kind == 10 and isinstance(parent, dict) and "arguments" in parent:
        parent["arguments"] = rng.choice(ODD_VALUES[19:])(rng)
        return "arguments"
    parent[key] = rng.choice(ODD_VALUES)(rng)
    return "retype"


class _Text(str):
    """A str subclass, as hosts' string-like types are."""


# Python values of another type than a field's, for the door for Python objects.
PY_VALUES: tuple[Callable[[random.Random], Any], ...] = (
    lambda r: None,
    lambda r: 5,
    lambda r: 1.5,
    lambda r: math.nan,
    lambda r: True,
    lambda r: b"bytes",
    lambda r: bytearray(b"x"),
    lambda r: _Text("sub"),
    lambda r: "",
    lambda r: "image/x\nCRITICAL turnloom: forged",
    lambda r: "bad \ud800",
    lambda r: "x" * 600_000,
    lambda r: ["a"],
    lambda r: ("a",),
    lambda r: {"a": 1},
    lambda r: {1: "a"},
    lambda r: deep(r.choice((70, 10_000))),
    lambda r: deep_text(r.choice((70, 10_000))),
    lambda r: "data:image/png;base64,iVBORw0KGgo=",
    lambda r: "data:image/png,x",
    lambda r: "{}",
    lambda r: object(),
)


def _call_ids(message: Message) -> list[str]:
    ids = [p.call_id for p in message.parts if isinstance(p, ToolCallPart | ToolResultPart)]
    return [i for i in ids if isinstance(i, str)]


def random_layout(message: Message, rng: random.Random) -> dict[str, Any]:
    """The layout of a random gateway with random hints: mostly well typed, some not."""
    gateway = rng.choice(PROVIDERS)
    hints = declared_native_keys()[gateway].hints
    layout: dict[str, Any] = {"gateway": gateway}
    for name in sorted(hints):
        if rng.random() < 0.3:
            continue
        kind = hints[name]
        if rng.random() < 0.15:
            layout[name] = rng.choice(PY_VALUES)(rng)
        elif kind == "flag":
            layout[name] = rng.random() < 0.8
        elif kind == "text":
            layout[name] = rng.choice(("completed", "", "x"))
        elif kind == "ids":
            # Mostly every id of the message (so the hint applies), sometimes others.
            ids = _call_ids(message) + (["c1", "other"] if rng.random() < 0.3 else [])
            layout[name] = ids or ["c1"]
        else:
            layout[name] = rng.choice(kind)
    return layout


def _leaves(message: Message) -> list[tuple[int, int | None]]:
    """(part index, index in a result's content or None) of every part."""
    out: list[tuple[int, int | None]] = []
    for i, part in enumerate(message.parts):
        out.append((i, None))
        if isinstance(part, ToolResultPart) and isinstance(part.content, tuple):
            out.extend((i, j) for j in range(len(part.content)))
    return out


def retype_part(message: Message, rng: random.Random) -> Message:
    """``message`` with one field of one part (maybe inside a result) set to a Python value."""
    spots = _leaves(message)
    if not spots:
        return message
    inner = [spot for spot in spots if spot[1] is not None]
    # Half the time a part inside a tool result, where layouts act on content.
    i, j = rng.choice(inner if inner and rng.random() < 0.5 else spots)
    outer = message.parts[i]
    part = outer if j is None else outer.content[j]  # type: ignore[union-attr]
    if not isinstance(part, msgspec.Struct):  # an earlier retype put a value there
        return message
    fields = list(part.__struct_fields__)
    if not fields:
        return message
    name = rng.choice(fields)
    new = msgspec.structs.replace(part, **{name: rng.choice(PY_VALUES)(rng)})
    if j is not None:
        content = list(outer.content)  # type: ignore[union-attr]
        content[j] = new
        new = msgspec.structs.replace(outer, content=tuple(content))
    parts = list(message.parts)
    parts[i] = new
    return msgspec.structs.replace(message, content=tuple(parts))


def deepen(message: Message, rng: random.Random) -> Message:
    """``message`` with tool call arguments, extras or an opaque item 10,000 levels deep."""
    parts = list(message.parts)
    kind = rng.randrange(3)
    for i, part in enumerate(parts):
        if kind == 0 and isinstance(part, ToolCallPart):
            parts[i] = msgspec.structs.replace(part, arguments=deep_text(10_000))
            break
        if kind == 1 and hasattr(part, "extras"):
            parts[i] = msgspec.structs.replace(part, extras={"deep": deep(10_000)})
            break
        if kind == 2 and isinstance(part, OpaquePart | ImagePart | ToolResultPart):
            if isinstance(part, OpaquePart):
                parts[i] = msgspec.structs.replace(part, item={"type": "x", "d": deep(10_000)})
            else:
                parts[i] = msgspec.structs.replace(part, extras={"d": deep(10_000)})
            break
    else:
        return msgspec.structs.replace(message, extras={"deep": deep(10_000)})
    return msgspec.structs.replace(message, content=tuple(parts))


@dataclass
class Counts:
    inputs: int = 0
    parsed_accepted: int = 0
    parsed_refused: int = 0
    decoded_accepted: int = 0
    decoded_refused: int = 0
    checked_accepted: int = 0
    checked_refused: int = 0
    direct_rendered: int = 0
    direct_refused: int = 0
    rendered: int = 0
    crashes: collections.Counter[str] = field(default_factory=collections.Counter)
    examples: dict[str, str] = field(default_factory=dict)
    refusals: collections.Counter[str] = field(default_factory=collections.Counter)


_short = reprlib.Repr()
_short.maxstring = _short.maxother = 200
_short.maxlevel = 6


def _crash_kind(stage: str, gateway: str, exc: BaseException) -> str:
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if "turnloom" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{stage}[{gateway}] {type(exc).__name__} at {where}"


def _crash(counts: Counts, stage: str, gateway: str, exc: BaseException, sample: Any) -> None:
    kind = _crash_kind(stage, gateway, exc)
    counts.crashes[kind] += 1
    if kind not in counts.examples:
        text = _short.repr(sample)
        counts.examples[kind] = f"{type(exc).__name__}: {str(exc)[:300]}\n    input: {text[:600]}"


def exercise(messages: list[Message], counts: Counts, sample: Any) -> None:
    """Render accepted messages, as one request, on every gateway; all must succeed."""
    for kind in GatewayType:
        gateway = get_gateway(kind)
        stage = "render"
        try:
            items = [item for message in messages for item in gateway.render(message)]
            stage = "request_body"
            body = gateway.request_body(items)
            stage = "json.dumps"
            json.dumps(body, allow_nan=False)
            stage = "msgspec.encode"
            msgspec.json.encode(body)
            stage = "validate"
            gateway.validate(items)
        except Exception as exc:  # a crash: the door accepted this message
            _crash(counts, stage, kind.value, exc, sample)
        else:
            counts.rendered += 1


def by_hand(messages: list[Message], rng: random.Random, counts: Counts) -> None:
    """A parsed message as a host builds it: any layout, a field retyped; then directly deep."""
    # Messages with tool results first: most layout hints act on them.
    results = [m for m in messages if m.tool_results]
    for _ in range(3):
        original = rng.choice(results if results and rng.random() < 0.5 else messages)
        message = msgspec.structs.replace(original)
        if rng.random() < 0.7:
            message = msgspec.structs.replace(message, layout=random_layout(message, rng))
        for _ in range(rng.randint(0, 2)):
            message = retype_part(message, rng)
        counts.inputs += 1
        try:
            check_message(message)
        except TurnloomError as exc:
            counts.checked_refused += 1
            counts.refusals[type(exc).__name__] += 1
        except Exception as exc:
            _crash(counts, "check_message", "-", exc, message)
        else:
            counts.checked_accepted += 1
            exercise([message], counts, message)
    # No door: a gateway's own render of a message nested far too deep.
    deep_message = deepen(msgspec.structs.replace(original), rng)
    counts.inputs += 1
    for kind in GatewayType:
        stage = "direct_render"
        try:
            items = get_gateway(kind).render(deep_message)
            stage = "direct_encode"
            msgspec.json.encode(get_gateway(kind).request_body(items))
        except TurnloomError as exc:
            counts.direct_refused += 1
            counts.refusals[type(exc).__name__] += 1
        except Exception as exc:
            _crash(counts, stage, kind.value, exc, "<10,000 levels deep>")
        else:
            counts.direct_rendered += 1


def one(record: dict[str, Any], rng: random.Random, counts: Counts) -> None:
    provider = record["provider"]
    body = copy.deepcopy(record["request"])
    key = ITEM_LISTS[provider]
    items = body.get(key)
    if isinstance(items, list) and len(items) > 8:
        start = rng.randrange(len(items) - 7)
        body[key] = items[start : start + rng.randint(1, 8)]
    for _ in range(rng.randint(1, 3)):
        mutate(body, rng)
    counts.inputs += 1
    gateway = get_gateway(provider)
    try:
        messages = gateway.parse_request(body)
    except TurnloomError as exc:
        counts.parsed_refused += 1
        counts.refusals[type(exc).__name__] += 1
        messages = []
    except Exception as exc:
        _crash(counts, "parse_request", provider, exc, body)
        return
    else:
        counts.parsed_accepted += 1
    exercise(messages, counts, body)
    if not messages:
        return
    by_hand(messages, rng, counts)
    # The turnloom form of one parsed message, mutated, through decode_message.
    original = rng.choice(messages)
    data = msgspec.to_builtins(original)
    for _ in range(rng.randint(1, 3)):
        mutate(data, rng)
    counts.inputs += 1
    form = rng.randrange(3)
    try:
        if form == 0:
            raw: Any = data
        else:
            text = json.dumps(data, allow_nan=True, ensure_ascii=rng.random() < 0.5)
            raw = text if form == 1 else text.encode("utf-8", "surrogatepass")
    except (ValueError, RecursionError):
        raw = data
    try:
        decoded = decode_message(raw)
    except TurnloomError as exc:
        counts.decoded_refused += 1
        counts.refusals[type(exc).__name__] += 1
        return
    except Exception as exc:
        _crash(counts, "decode_message", "-", exc, data)
        return
    counts.decoded_accepted += 1
    exercise([decoded], counts, data)
    # And in the request it came from, in place of the message it was made from.
    exercise([decoded if m is original else m for m in messages], counts, data)


def load() -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for provider in PROVIDERS:
        with (RECORDINGS / f"{provider}.jsonl").open(encoding="utf-8") as fh:
            records.extend(json.loads(line) for line in fh if line.strip())
    return records


def run(iterations: int, seed: int) -> Counts:
    """Fuzz ``iterations`` mutated recordings; return the counts."""
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 1000))
    rng = random.Random(seed)
    records = load()
    counts = Counts()
    for _ in range(iterations):
        one(rng.choice(records), rng, counts)
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iterations", type=int, default=10_000)
    parser.add_argument("--seed", type=int, default=8)
    parser.add_argument("--show", type=int, default=3, help="examples shown per crash kind")
    args = parser.parse_args(argv)
    logging.disable(logging.WARNING)  # the gateways' documented drops are expected here
    started = time.perf_counter()
    counts = run(args.iterations, args.seed)
    elapsed = time.perf_counter() - started
    crashes = sum(counts.crashes.values())
    print(f"fuzz_door: seed {args.seed}, {args.iterations} iterations in {elapsed:.1f} s")
    print(f"  inputs:            {counts.inputs} (native bodies and turnloom-form messages)")
    print(
        f"  parse_request:     {counts.parsed_accepted} accepted, {counts.parsed_refused} refused"
    )
    print(
        f"  decode_message:    {counts.decoded_accepted} accepted, {counts.decoded_refused} refused"
    )
    print(
        f"  check_message:     {counts.checked_accepted} accepted, {counts.checked_refused} "
        "refused (hand-built: any layout, retyped fields)"
    )
    print(
        f"  direct render:     {counts.direct_rendered} rendered, {counts.direct_refused} "
        "refused (no door, 10,000 levels deep)"
    )
    print(f"  accepted requests rendered on a gateway without error: {counts.rendered}")
    print(f"  refusals (TurnloomError) by type: {dict(counts.refusals.most_common())}")
    print(f"  crashes (any other exception): {crashes}")
    for kind, n in counts.crashes.most_common():
        print(f"    {n:6d}  {kind}")
        if args.show:
            print(f"            {counts.examples[kind]}")
    return 1 if crashes else 0


if __name__ == "__main__":
    raise SystemExit(main())
