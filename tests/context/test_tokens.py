"""Token counting (seed 002): one estimator of a message, approximate and exact text measures."""

from __future__ import annotations

import base64
import builtins
import struct
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.context.gateways._support import load_tau_bench
from turnloom.context import (
    ApproxTokenCounter,
    ImagePart,
    Message,
    OpaquePart,
    OpenAITokenCounter,
    ReasoningPart,
    Role,
    TextPart,
    TokenCounter,
    ToolCallPart,
    ToolResultPart,
    WorkingContext,
    estimate_message_tokens,
    get_gateway,
    image_size,
    image_tokens,
)
from turnloom.context.tokens import count_tokens
from turnloom.errors import HostCallbackError, InvalidArgumentError, MissingDependencyError

bpe_openai = pytest.importorskip("bpe_openai")


def png(width: int, height: int) -> bytes:
    """The first bytes of a PNG: signature and IHDR (all the header reader needs)."""
    ihdr = struct.pack(">II", width, height) + b"\x08\x06\x00\x00\x00"
    return b"\x89PNG\r\n\x1a\n" + struct.pack(">I", 13) + b"IHDR" + ihdr + b"\0\0\0\0"


def jpeg(width: int, height: int) -> bytes:
    app0 = b"\xff\xe0" + struct.pack(">H", 16) + b"JFIF\0\x01\x01\0\0\x01\0\x01\0\0"
    sof0 = b"\xff\xc0" + struct.pack(">HBHHB", 17, 8, height, width, 3) + b"\0" * 9
    return b"\xff\xd8" + app0 + sof0 + b"\xff\xd9"


def gif(width: int, height: int) -> bytes:
    return b"GIF89a" + struct.pack("<HH", width, height) + b"\0" * 8


def webp(width: int, height: int) -> bytes:
    body = b"VP8X" + struct.pack("<I", 10) + b"\0" * 4
    body += (width - 1).to_bytes(3, "little") + (height - 1).to_bytes(3, "little")
    return b"RIFF" + struct.pack("<I", len(body) + 4) + b"WEBP" + body


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


# -- the approximate counter -------------------------------------------------


def test_approx_token_counter_counts_an_empty_list_as_zero() -> None:
    """Invariant: no messages, no tokens (no priming overhead)."""
    assert ApproxTokenCounter().count([]) == 0
    assert WorkingContext().tokens() == 0


def test_approx_token_counter_is_a_token_counter() -> None:
    assert isinstance(ApproxTokenCounter(), TokenCounter)
    assert isinstance(OpenAITokenCounter(), TokenCounter)


def test_approx_token_counter_counts_text_as_chars_over_four_rounded_up() -> None:
    """Rule: 3 framing + role + ceil(chars / 4) for a text-only message."""
    counter = ApproxTokenCounter()
    message = Message(role=Role.user, content="x" * 9)
    # 3 framing + ceil(4/4) for "user" + ceil(9/4)
    assert counter.count([message]) == 3 + 1 + 3
    named = Message(role=Role.assistant, content="abcd", name="planner")
    # 3 + ceil(9/4) "assistant" + 1 + ceil(7/4) name + 1
    assert counter.count([named]) == 3 + 3 + 1 + 2 + 1


def test_approx_token_counter_counts_tool_call_names_ids_and_arguments() -> None:
    """Regression (seed 002): the old estimators ignored tool calls; a call costs its parts."""
    counter = ApproxTokenCounter()
    bare = Message(role=Role.assistant, content=())
    args = '{"reservation_id": "ZFA04Y"}'
    assert len(args) == 28
    call = Message(
        role=Role.assistant,
        content=(ToolCallPart(call_id="call_12345678", name="get_reservation", arguments=args),),
    )
    # block 3 + ceil(13/4)=4 id + ceil(15/4)=4 name + ceil(28/4)=7 arguments
    assert counter.count([call]) - counter.count([bare]) == 3 + 4 + 4 + 7


def test_approx_token_counter_counts_tool_results_reasoning_and_opaque_blocks() -> None:
    counter = ApproxTokenCounter()
    result = Message(
        role=Role.tool,
        content=(ToolResultPart(call_id="c1", name="f", content=(TextPart(text="x" * 8),)),),
    )
    # 3 + ceil(4/4) role "tool" + block 3 + id 1 + name 1 + text 2
    assert counter.count([result]) == 3 + 1 + 3 + 1 + 1 + 2
    thinking = Message(
        role=Role.assistant,
        content=(ReasoningPart(text="y" * 12, signature="s" * 400),),
    )
    # signature bytes are not prompt text: 3 + 3 + block 3 + 3
    assert counter.count([thinking]) == 3 + 3 + 3 + 3
    opaque = Message(
        role=Role.user, content=(OpaquePart(gateway="anthropic", item={"type": "document"}),)
    )
    # '{"type":"document"}' is 19 chars -> 5, plus block 3
    assert counter.count([opaque]) == 3 + 1 + 3 + 5


def test_one_estimator_gives_the_same_number_everywhere() -> None:
    """Regression (seed 002, three drifting estimators): counter, context and function agree."""
    messages = [
        Message(role=Role.user, content="Where is my bag?"),
        Message(
            role=Role.assistant,
            content=(ToolCallPart(call_id="c1", name="find_bag", arguments='{"tag": 7}'),),
        ),
        Message(role=Role.tool, content=(ToolResultPart(call_id="c1"),)),
    ]
    counter = ApproxTokenCounter()
    per_message = sum(estimate_message_tokens(m) for m in messages)
    assert counter.count(messages) == per_message == WorkingContext(messages=messages).tokens()
    assert [counter.count_message(m) for m in messages] == [
        estimate_message_tokens(m) for m in messages
    ]


# -- images ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("encode", "media_type"),
    [(png, "image/png"), (jpeg, "image/jpeg"), (gif, "image/gif"), (webp, "image/webp")],
)
def test_image_size_reads_the_header_of_inline_images(encode: Any, media_type: str) -> None:
    data = b64(encode(1024, 700))
    assert image_size(ImagePart(data=data, media_type=media_type)) == (1024, 700)
    assert image_size(ImagePart(url=f"data:{media_type};base64,{data}")) == (1024, 700)


def test_image_size_is_unknown_for_a_plain_url_or_garbage() -> None:
    assert image_size(ImagePart(url="https://example.com/cat.png")) is None
    assert image_size(ImagePart(data="!!!not base64", media_type="image/png")) is None
    assert image_size(ImagePart(data=b64(b"\xff\xd8\xff"), media_type="image/jpeg")) is None


def test_image_tokens_follow_openai_tiles() -> None:
    """Source: OpenAI vision guide examples (1024x1024 high: 765; 2048x4096: 1105; low: 85)."""
    part = ImagePart(url="https://example.com/x.png")
    assert image_tokens(part, "openai", size=(1024, 1024)) == 765
    assert image_tokens(part, "openai", size=(2048, 4096)) == 1105
    assert image_tokens(part, "openai", size=(100, 100)) == 255
    low = ImagePart(url="https://example.com/x.png", detail="low")
    assert image_tokens(low, "openai", size=(4096, 8192)) == 85


def test_image_tokens_follow_anthropic_area_rule() -> None:
    """Source: Anthropic vision guide (w*h/750; 1000x1000 ~1334; long edge capped at 1568)."""
    part = ImagePart(url="https://example.com/x.png")
    assert image_tokens(part, "anthropic", size=(1000, 1000)) == 1334
    assert image_tokens(part, "anthropic", size=(200, 200)) == 54
    assert image_tokens(part, "anthropic", size=(4000, 4000)) == 1600


def test_image_tokens_follow_gemini_tiles() -> None:
    part = ImagePart(url="https://example.com/x.png")
    assert image_tokens(part, "gemini", size=(384, 300)) == 258
    assert image_tokens(part, "gemini", size=(1000, 700)) == 258 * 2


def test_an_image_costs_the_same_as_base64_data_or_url() -> None:
    """Invariant: the carriage (base64, data: URL, URL of known size) never changes the cost."""
    raw = png(1600, 900) + b"\0" * 300_000  # a large payload: its length must not count
    data = b64(raw)
    url = "https://example.com/photo.png"
    sizes = {url: (1600, 900)}
    counter = ApproxTokenCounter(image_size=lambda p: sizes.get(p.url or ""))
    carried = [
        ImagePart(data=data, media_type="image/png"),
        ImagePart(url=f"data:image/png;base64,{data}"),
        ImagePart(url=url),
    ]
    costs = {counter.count([Message(role=Role.user, content=(p,))]) for p in carried}
    # 1600x900 -> shorter side to 768: 1365x768 -> 3x2 tiles -> 85 + 170*6
    assert costs == {3 + 1 + 85 + 170 * 6}


def test_an_image_of_unknown_size_costs_a_1024_square() -> None:
    counter = ApproxTokenCounter()
    message = Message(role=Role.user, content=(ImagePart(url="https://example.com/a.png"),))
    assert counter.count([message]) == 3 + 1 + 765
    assert ApproxTokenCounter(image_rule="anthropic").count([message]) == 3 + 1 + 1399


def test_counters_reject_bad_arguments_at_construction() -> None:
    with pytest.raises(InvalidArgumentError) as info:
        ApproxTokenCounter(image_rule="bing")  # type: ignore[arg-type]
    assert info.value.field == "image_rule"
    with pytest.raises(InvalidArgumentError) as info:
        ApproxTokenCounter(image_size=42)  # type: ignore[arg-type]
    assert info.value.field == "image_size"
    with pytest.raises(InvalidArgumentError) as info:
        OpenAITokenCounter("p50k_base")
    assert info.value.field == "encoding"


# -- the exact counter -------------------------------------------------------


@pytest.mark.parametrize("encoding", ["cl100k_base", "o200k_base"])
def test_openai_token_counter_equals_the_vocabulary_on_tau_bench(
    tau_bench_path: Path, encoding: str
) -> None:
    """Invariant: every counted text is the vocabulary's own count, on real GPT-4o traffic.

    The expected number of each message is built from ``bpe_openai``'s encoder
    directly, following the documented rule (3 framing + role + content, and
    for a call: block 3 + id + name + arguments; a result: block 3 + id + name
    + text).
    """
    encoder = bpe_openai.get_encoding(encoding)

    def n(text: str) -> int:
        return len(encoder.encode_ordinary(text))

    counter = OpenAITokenCounter(encoding)
    chat = get_gateway("openai_chat")
    total = expected_total = messages_seen = 0
    for trajectory in load_tau_bench(tau_bench_path):
        for item in trajectory:
            message = chat.parse(item)
            expected = 3 + n(item["role"])
            if isinstance(item.get("content"), str):
                expected += n(item["content"]) if item["role"] != "tool" else 0
            for call in item.get("tool_calls") or ():
                fn = call["function"]
                expected += 3 + n(call["id"]) + n(fn["name"]) + n(fn["arguments"])
            if item["role"] == "tool":
                expected += 3 + n(item["tool_call_id"]) + n(item["name"]) + n(item["content"])
            assert counter.count([message]) == expected
            total += counter.count([message])
            expected_total += expected
            messages_seen += 1
    assert messages_seen == 150 + 1096 + 1808 + 862  # SOURCE.md counts
    assert total == expected_total


def test_openai_token_counter_matches_the_cookbook_for_text_messages() -> None:
    """A text message costs OpenAI's documented 3 + role + content (+ 1 + name)."""
    encoder = bpe_openai.get_encoding("o200k_base")
    text = "Hello! I'd like to change my flight, reservation ZFA04Y. <|endoftext|>"
    message = Message(role=Role.user, content=text, name="alice")
    expected = 3 + len(encoder.encode_ordinary("user")) + len(encoder.encode_ordinary(text))
    expected += 1 + len(encoder.encode_ordinary("alice"))
    assert OpenAITokenCounter().count([message]) == expected
    assert OpenAITokenCounter().count([]) == 0


def test_openai_token_counter_without_its_extra_raises_instead_of_falling_back(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Invariant: no silent fallback; a missing bpe-openai is a typed error naming the extra."""
    real_import = builtins.__import__

    def fake_import(name: str, *args: Any, **kwargs: Any) -> Any:
        if name == "bpe_openai":
            raise ImportError("No module named 'bpe_openai'")
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "bpe_openai", raising=False)
    monkeypatch.setattr(builtins, "__import__", fake_import)
    with pytest.raises(MissingDependencyError) as info:
        OpenAITokenCounter()
    assert (info.value.package, info.value.extra) == ("bpe-openai", "tokens")
    assert isinstance(info.value, ImportError)


@pytest.mark.parametrize("counter", [ApproxTokenCounter(), OpenAITokenCounter()], ids=repr)
def test_count_rejects_what_is_not_a_message_list(counter: TokenCounter) -> None:
    with pytest.raises(InvalidArgumentError) as info:
        counter.count("hello")  # type: ignore[arg-type]
    assert info.value.field == "messages"
    with pytest.raises(InvalidArgumentError) as info:
        counter.count([Message(role=Role.user, content="a"), {"role": "user"}])  # type: ignore[list-item]
    assert info.value.field == "messages[1]"


def test_count_tokens_of_one_message_by_the_builtin_counter_is_its_count() -> None:
    """Invariant: ``count_tokens`` of one message (the door's call) is ``counter.count`` of it.

    The built-in counter's one-message path gives the exact same numbers
    (the rule of :func:`estimate_message_tokens`), and a failing image hook
    is still reported as a HostCallbackError.
    """
    counter = ApproxTokenCounter()
    messages = [
        Message(role=Role.user, content="hello there", name="ann"),
        Message(role=Role.assistant, content=(ToolCallPart(call_id="c1", name="f"),)),
        Message(
            role=Role.tool,
            content=(ToolResultPart(call_id="c1", content=(TextPart(text="r" * 9),), name="f"),),
        ),
        Message(role=Role.user, content=(ImagePart(url="https://example.com/a.png"),)),
    ]
    assert [count_tokens(counter, (m,)) for m in messages] == [9, 12, 12, 769]
    assert [count_tokens(counter, (m,)) for m in messages] == [counter.count([m]) for m in messages]

    def broken(part: ImagePart) -> tuple[int, int] | None:
        raise RuntimeError("no size")

    with pytest.raises(HostCallbackError) as info:
        count_tokens(ApproxTokenCounter(image_size=broken), (messages[3],))
    assert info.value.callback == "token_counter"
    assert isinstance(info.value.__cause__, RuntimeError)


def test_count_tokens_goes_through_the_counters_own_count() -> None:
    """Invariant: count_tokens calls ``counter.count`` (its one-message fast path
    lives in the counters' sum), so a count replaced on the class is honoured."""
    from unittest import mock

    from turnloom.context.message import Message, Role
    from turnloom.context.tokens import ApproxTokenCounter, count_tokens

    with mock.patch.object(ApproxTokenCounter, "count", return_value=41):
        assert count_tokens(ApproxTokenCounter(), (Message(role=Role.user, content="hi"),)) == 41
