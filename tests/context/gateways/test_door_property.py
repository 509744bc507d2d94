"""Property: what the door accepts renders on every gateway; every refusal is typed.

For generated messages and for messages mutated from the recorded provider
requests (``../shared/data/provider-recordings/``), a message either is refused
at the door with a :class:`~turnloom.errors.TurnloomError`, or ``render``,
``request_body``, ``json.dumps(..., allow_nan=False)`` and
``msgspec.json.encode`` succeed for it on all four gateways, alone and in a
request with other accepted messages. Extras only ever add keys: every key the
gateway writes keeps the value it has without extras.

The number of examples per property is ``TURNLOOM_DOOR_EXAMPLES`` (500 by
default, so the suite stays fast; the issue's 10,000-example run sets it).
"""

from __future__ import annotations

import functools
import json
import logging
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from tests.conftest import RECORDINGS
from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    OpaquePart,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    check_message,
    decode_message,
    get_gateway,
)
from turnloom.context.message import declared_native_keys, is_blank_text
from turnloom.errors import TurnloomError

EXAMPLES = int(os.environ.get("TURNLOOM_DOOR_EXAMPLES", "500"))
_settings = settings(
    max_examples=EXAMPLES,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)

GATEWAYS = tuple(get_gateway(kind) for kind in GatewayType)
# Keys gateways write, planted where extras and opaque items come from.
NATIVE_KEYS = tuple(
    sorted(
        {
            key
            for keys in declared_native_keys().values()
            for element in ("message", "text", "image", "tool_call", "tool_result", "reasoning")
            for key in getattr(keys, element)
        }
    )
)
HINTS = tuple(sorted({hint for keys in declared_native_keys().values() for hint in keys.hints}))
IDS = ("c1", "c2", "f#0")

scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(),  # NaN and infinities included: the door refuses them
    st.text(max_size=8),
    st.sampled_from(["\ud800", "", " ", "list", "string", "absent", *IDS]),
)
json_values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(st.sampled_from(NATIVE_KEYS) | st.text(max_size=4), inner, max_size=3)
    ),
    max_leaves=6,
)
extras = st.none() | st.dictionaries(
    st.sampled_from(NATIVE_KEYS) | st.text(max_size=6), json_values, max_size=3
)
arguments = st.one_of(
    st.dictionaries(st.text(max_size=4), json_values, max_size=3).map(
        lambda v: json.dumps(v, allow_nan=True)
    ),
    json_values.map(lambda v: json.dumps(v, allow_nan=True)),
    st.text(max_size=12),
    st.sampled_from(
        ['{"q": "\\ud83c"}', '{"q": NaN}', "", '{"a": 1', '{"a":' * 70 + "1" + "}" * 70]
    ),
)
hint_values = st.one_of(
    st.booleans(),
    st.sampled_from(["list", "absent", "string", "completed", 5]),
    st.lists(st.sampled_from(IDS), max_size=2),
    json_values,
)
layouts = st.none() | st.builds(
    lambda gateway, hints: {"gateway": gateway, **hints},
    st.sampled_from([k.value for k in GatewayType] + ["other"]),
    st.dictionaries(st.sampled_from(HINTS), hint_values, max_size=3),
)
texts = st.text(max_size=10) | st.sampled_from(["", "  ", '{"output": 1}', "NaN", "[1]"])
text_parts = st.builds(TextPart, text=texts, extras=extras)
image_parts = st.one_of(
    st.builds(ImagePart, url=st.sampled_from(["https://x/a.png", "gs://b/c", ""]), extras=extras),
    st.builds(
        ImagePart,
        data=st.sampled_from(["aGk=", ""]),
        media_type=st.sampled_from(["image/png", "image/tiff", "text/plain", None]),
        detail=st.none() | st.sampled_from(["low", "auto"]),
    ),
)
opaque_parts = st.builds(
    OpaquePart,
    gateway=st.sampled_from([k.value for k in GatewayType]),
    item=st.dictionaries(st.sampled_from(NATIVE_KEYS), json_values, max_size=3),
)
parts = st.one_of(
    text_parts,
    image_parts,
    opaque_parts,
    st.builds(
        ToolCallPart,
        call_id=st.sampled_from(IDS),
        name=st.sampled_from(["f", "g", ""]),
        arguments=arguments,
        extras=extras,
    ),
    st.builds(
        ToolResultPart,
        call_id=st.sampled_from(IDS),
        content=st.lists(text_parts | image_parts | opaque_parts, max_size=2).map(tuple),
        is_error=st.booleans(),
        name=st.none() | st.sampled_from(["f", "g"]),
        extras=extras,
    ),
    st.builds(
        ReasoningPart,
        text=texts,
        signature=st.none() | st.just("sig"),
        encrypted_content=st.none() | st.just("enc"),
        redacted=st.booleans(),
        id=st.none() | st.just("rs_1"),
        gateway=st.none() | st.sampled_from([k.value for k in GatewayType]),
        extras=extras,
    ),
)
messages = st.builds(
    Message,
    role=st.sampled_from(list(Role)),
    content=st.lists(parts, max_size=4).map(tuple),
    id=st.none() | st.sampled_from(["m1", "msg_1"]),
    extras=extras,
    layout=layouts,
)


@functools.cache
def recorded_messages() -> tuple[dict[str, Any], ...]:
    """Every message of every recorded request, parsed, in turnloom's dict form."""
    out: list[dict[str, Any]] = []
    for kind in GatewayType:
        path = Path(RECORDINGS) / f"{kind.value}.jsonl"
        gateway = get_gateway(kind)
        for line in path.read_text(encoding="utf-8").splitlines():
            record = json.loads(line)
            try:
                parsed = gateway.parse_request(record["request"])
            except TurnloomError:
                continue  # a rejected recording the door refuses
            out.extend(msgspec.to_builtins(m) for m in parsed)
    return tuple(out)


def _paths(value: Any) -> list[tuple[Any, ...]]:
    out: list[tuple[Any, ...]] = []
    stack: list[tuple[Any, tuple[Any, ...]]] = [(value, ())]
    while stack:
        node, at = stack.pop()
        items = (
            node.items()
            if isinstance(node, dict)
            else enumerate(node)
            if isinstance(node, list)
            else ()
        )
        for k, v in items:
            out.append((*at, k))
            stack.append((v, (*at, k)))
    return out


@st.composite
def mutated_recorded(draw: st.DrawFn) -> dict[str, Any]:
    """A recorded message in turnloom's dict form with one to three mutations."""
    records = recorded_messages()
    data: dict[str, Any] = msgspec.json.decode(
        msgspec.json.encode(records[draw(st.integers(0, len(records) - 1))]), type=dict[str, Any]
    )
    for _ in range(draw(st.integers(1, 3))):
        paths = _paths(data)
        if not paths:
            break
        path = paths[draw(st.integers(0, len(paths) - 1))]
        parent: Any = data
        for step in path[:-1]:
            parent = parent[step]
        op = draw(st.sampled_from(["drop", "retype", "plant", "layout", "args", "role"]))
        key = path[-1]
        if op == "drop":
            del parent[key]
        elif op == "plant" and isinstance(parent, dict):
            parent[draw(st.sampled_from(NATIVE_KEYS))] = draw(json_values)
        elif op == "layout":
            data["layout"] = draw(layouts)
        elif op == "args" and isinstance(parent, dict) and "arguments" in parent:
            parent["arguments"] = draw(arguments)
        elif op == "role":
            data["role"] = draw(st.sampled_from([*(r.value for r in Role), "model", "\ud800"]))
        else:
            parent[key] = draw(json_values)
    return data


def door(candidate: Message | dict[str, Any]) -> Message | None:
    """The door's verdict: the accepted message, or None for a typed refusal."""
    try:
        if isinstance(candidate, dict):
            candidate = decode_message(candidate)
        else:
            check_message(candidate)
    except TurnloomError as exc:
        event(f"refused: {type(exc).__name__}")
        return None  # any other exception fails the property
    event("accepted")
    return candidate


def renders_everywhere(accepted: list[Message]) -> None:
    """render, request_body and both JSON encoders succeed on every gateway."""
    for gateway in GATEWAYS:
        items = [item for message in accepted for item in gateway.render(message)]
        body = gateway.request_body(items)
        json.dumps(body, allow_nan=False)
        msgspec.json.encode(body)


def _without_extras(message: Message) -> Message:
    def strip(part: Any) -> Any:
        if isinstance(part, ToolResultPart):
            part = msgspec.structs.replace(part, content=tuple(strip(p) for p in part.content))
        if getattr(part, "extras", None) is not None:
            part = msgspec.structs.replace(part, extras=None)
        return part

    return msgspec.structs.replace(
        message, extras=None, content=tuple(strip(p) for p in message.parts)
    )


def _covers(with_extras: Any, base: Any) -> bool:
    """Every key of ``base`` holds the same value in ``with_extras`` (extras only add)."""
    if isinstance(base, dict):
        return isinstance(with_extras, dict) and all(
            k in with_extras and _covers(with_extras[k], v) for k, v in base.items()
        )
    if isinstance(base, list):
        # In order, every element of ``base`` is covered by one of
        # ``with_extras``: extras may add a part (Gemini keeps an empty text
        # that carries a thoughtSignature) but never change one.
        if not isinstance(with_extras, list):
            return False
        rest = iter(with_extras)
        return all(any(_covers(w, b) for w in rest) for b in base)
    if isinstance(base, str) and isinstance(with_extras, list):
        # A text part with extras is sent as a list of text blocks (a blank one
        # left out) instead of as a string; the text is the same.
        texts = [b.get("text") for b in with_extras if isinstance(b, dict)]
        joined = "".join(map(str, texts))
        return len(texts) == len(with_extras) and (
            joined == base or is_blank_text(base) == (not texts)
        )
    return bool(with_extras == base)


@pytest.fixture(autouse=True)
def _quiet_drops() -> Any:
    """The gateways' documented drops log warnings; thousands of them are noise here."""
    logging.disable(logging.WARNING)
    yield
    logging.disable(logging.NOTSET)


@_settings
@given(batch=st.lists(messages, min_size=1, max_size=4))
def test_generated_messages_the_door_accepts_render_on_every_gateway(batch: list[Message]) -> None:
    accepted = [m for m in (door(c) for c in batch) if m is not None]
    for message in accepted:
        renders_everywhere([message])
    renders_everywhere(accepted)


# Without the recordings (a clone outside the project's machines) the
# recorded examples are not drawn: the first property skips, the second runs
# on generated messages only.
_HAVE_RECORDINGS = Path(RECORDINGS).exists()
_recorded = mutated_recorded() if _HAVE_RECORDINGS else st.nothing()


@pytest.mark.skipif(not _HAVE_RECORDINGS, reason=f"real input {RECORDINGS} is not present")
@_settings
@given(batch=st.lists(_recorded, min_size=1, max_size=3))
def test_mutated_recorded_messages_the_door_accepts_render_on_every_gateway(
    batch: list[dict[str, Any]],
) -> None:
    accepted = [m for m in (door(c) for c in batch) if m is not None]
    for message in accepted:
        renders_everywhere([message])
    renders_everywhere(accepted)


@_settings
@given(candidate=messages | _recorded)
def test_extras_never_replace_what_a_gateway_writes(candidate: Message | dict[str, Any]) -> None:
    """Invariant: render(m) keeps every key and value of render(m without its extras)."""
    message = door(candidate)
    if message is None:
        return
    bare = _without_extras(message)
    for gateway in GATEWAYS:
        base = gateway.render(bare)
        assert _covers(gateway.render(message), base), gateway.type
