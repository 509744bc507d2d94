"""Token counting: one estimator of a message, two ways to measure its text.

Every token number turnloom reports comes from :func:`estimate_message_tokens`,
which walks a message's structure once and adds:

==========================  ===================================================
piece                       tokens
==========================  ===================================================
every message               3 (framing) + the role + ``name`` (1 + its text)
:class:`TextPart`           its text
:class:`ToolCallPart`       3 (block) + call id + tool name + arguments text
:class:`ToolResultPart`     3 (block) + call id + tool name (when set) + its
                            text, image and opaque content
:class:`ReasoningPart`      3 (block) + the readable reasoning text
                            (signatures and encrypted content are replayed
                            bytes, not prompt text, and are not counted)
:class:`OpaquePart`         3 (block) + the item's compact JSON text
:class:`ImagePart`          the provider's image rule over its pixel size
==========================  ===================================================

The 3-token message framing is OpenAI's documented per-message overhead for
its chat models (OpenAI Cookbook, "How to count tokens with tiktoken"), so for
a message holding only text the exact counter gives the number the cookbook
computes, without the 3 tokens that prime the reply. The block overhead is an
estimate of the JSON framing of structured blocks.

Text is measured by the counter: :class:`ApproxTokenCounter` takes a quarter
of the characters (rounded up), :class:`OpenAITokenCounter` encodes with the
``cl100k_base`` or ``o200k_base`` vocabulary that ships inside the optional
``bpe-openai`` package (``pip install 'turnloom[tokens]'``), so it works
offline.

Images cost the same however they are carried: base64 ``data``, a ``data:``
URL or a plain URL. Their pixel size is read from the image header of inline
data (PNG, JPEG, GIF, WebP), or asked of the counter's ``image_size`` hook
(for URLs whose size the caller knows); an image of unknown size is costed as
a 1024x1024 image. The rules (``image_rule``):

* ``"openai"`` -- ``detail="low"``: 85. Otherwise the image is scaled to fit
  2048x2048, then its shorter side to 768 (downscaling only); 85 + 170 per
  512-pixel tile. Source: OpenAI vision guide, "Calculating costs".
* ``"anthropic"`` -- an image whose long edge exceeds 1568 pixels is scaled
  down to it; ``ceil(width * height / 750)``, at most 1600. Source: Anthropic
  vision guide, "Calculate image costs".
* ``"gemini"`` -- 258 when both sides are at most 384 pixels, else 258 per
  768x768 tile. Source: Gemini API, "Token counting", images.
"""

from __future__ import annotations

__all__ = (
    "MAX_TOKEN_COUNT",
    "ApproxTokenCounter",
    "ImageRule",
    "ImageSizeHook",
    "OpenAITokenCounter",
    "TokenCounter",
    "approx_text_tokens",
    "count_tokens",
    "estimate_message_tokens",
    "image_size",
    "image_tokens",
)

import base64
import binascii
import math
import struct
import warnings
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal, Protocol, TypeAlias, cast, runtime_checkable

import msgspec

from turnloom.context._media import data_url_payload
from turnloom.context.message import (
    ImagePart,
    Message,
    OpaquePart,
    ReasoningPart,
    TextPart,
    ToolCallPart,
    ToolResultPart,
)
from turnloom.errors import (
    HostCallbackError,
    InvalidArgumentError,
    MissingDependencyError,
    TurnloomError,
    excerpt,
    not_a_message,
    type_name,
    what_type,
)

ImageRule: TypeAlias = Literal["openai", "anthropic", "gemini"]
ImageSizeHook: TypeAlias = Callable[[ImagePart], "tuple[int, int] | None"]

_IMAGE_RULES: tuple[str, ...] = ("openai", "anthropic", "gemini")
_MESSAGE_OVERHEAD = 3
_NAME_OVERHEAD = 1
_BLOCK_OVERHEAD = 3
_UNKNOWN_IMAGE_SIZE = (1024, 1024)
# Bytes of base64 text decoded to find the image header: PNG, GIF and WebP
# keep their size in the first 30 bytes; JPEG after its APPn segments, which
# rarely exceed 64 KiB. Past that the whole image is decoded.
_HEADER_CHARS = 87_384

_json = msgspec.json.Encoder()

MAX_TOKEN_COUNT = 2**63 - 1
"""The largest count :func:`count_tokens` takes from a counter, in tokens.

The largest 64-bit integer: what stores, metric exporters and other
languages' JSON readers carry; a larger count is a counter's bug.
"""


@runtime_checkable
class TokenCounter(Protocol):
    """Counts the tokens of a message list.

    Implementations are pure and synchronous: the same messages give the same
    number, on any thread, so a budget check made before a request and the
    count of the built request agree.
    """

    def count(self, messages: Sequence[Message]) -> int:
        """The tokens of ``messages``, in tokens; 0 for an empty list."""
        ...


def count_tokens(counter: TokenCounter, messages: Sequence[Message]) -> int:
    """``counter.count(messages)``, checked: every count turnloom takes goes through here.

    A host's counter is host code: its answer is checked where it is taken
    (a commit, a record, a render), before anything is changed with it, so a
    negative, fractional or boolean count can never defeat ``max_tokens``
    or corrupt a total.

    Args:
        counter: any object with a ``count(messages)`` method.
        messages: the messages to count.

    Returns:
        The count, an ``int`` in ``[0, MAX_TOKEN_COUNT]`` (an int subclass
        other than ``bool`` is converted to ``int``).

    Raises:
        HostCallbackError: ``counter.count`` raised an exception that is not
            a :class:`~turnloom.errors.TurnloomError` (it is the
            ``__cause__``), or returned something other than an int in that
            range (``callback`` is ``"token_counter"``).
        TurnloomError: whatever ``counter.count`` raised of turnloom's own
            errors (the built-in counters' ``InvalidArgumentError``), unchanged.
    """
    try:
        count = counter.count(messages)
    except TurnloomError:
        raise
    except Exception as exc:
        raise HostCallbackError(
            f"The token counter {type_name(counter)} raised {type_name(exc)}: {excerpt(str(exc))}.",
            callback="token_counter",
        ) from exc
    if type(count) is not int:
        if not isinstance(count, int) or isinstance(count, bool):
            raise HostCallbackError(
                f"The token counter {type_name(counter)} returned "
                f"{what_type(count)} ({excerpt(count)}), not an int count of tokens.",
                callback="token_counter",
            )
        count = int(count)
    if not 0 <= count <= MAX_TOKEN_COUNT:
        raise HostCallbackError(
            f"The token counter {type_name(counter)} returned {excerpt(count)} tokens; "
            f"a count is an int from 0 to {MAX_TOKEN_COUNT}.",
            callback="token_counter",
        )
    return count


def count_message_tokens(counter: TokenCounter, message: Message) -> int:
    """``count_tokens(counter, (message,))``: the tokens of one message, checked.

    For the default :class:`ApproxTokenCounter` (its exact class) and a
    :class:`Message` of the exact class, :func:`estimate_message_tokens` is
    called directly, without the counter's calls; any other counter or
    message, and a count over :data:`MAX_TOKEN_COUNT`, goes through
    :func:`count_tokens`, which raises what it raises.

    Raises:
        as :func:`count_tokens`.
    """
    if type(counter) is ApproxTokenCounter and type(message) is Message:
        count = estimate_message_tokens(
            message,
            approx_text_tokens,
            image_rule=counter.image_rule,
            image_size_hook=counter._image_size,
        )
        if count <= MAX_TOKEN_COUNT:
            return count
    return count_tokens(counter, (message,))


def approx_text_tokens(text: str) -> int:
    """A quarter of the characters of ``text``, rounded up (0 for ``""``)."""
    return (len(text) + 3) // 4


def estimate_message_tokens(
    message: Message,
    text_tokens: Callable[[str], int] = approx_text_tokens,
    *,
    image_rule: ImageRule = "openai",
    image_size_hook: ImageSizeHook | None = None,
) -> int:
    """Estimate the tokens of one message: the one rule every count uses.

    Args:
        message: a checked message.
        text_tokens: measures one text, in tokens (the counter's vocabulary).
        image_rule: whose published image-token rule prices images.
        image_size_hook: asked first for an image's pixel size
            ``(width, height)``; ``None`` from it falls back to the header.

    Returns:
        The tokens of the message (see the module docstring for the pieces).
    """
    # ``_value_`` is ``role.value`` without the enum property's lookup.
    total = _MESSAGE_OVERHEAD + text_tokens(message.role._value_)
    if message.name is not None:
        total += _NAME_OVERHEAD + text_tokens(message.name)
    for part in message.parts:
        kind = type(part)
        if kind is TextPart:
            total += text_tokens(part.text)  # type: ignore[union-attr]
        elif kind is ToolCallPart:
            call: ToolCallPart = part  # type: ignore[assignment]
            total += (
                _BLOCK_OVERHEAD
                + text_tokens(call.call_id)
                + text_tokens(call.name)
                + text_tokens(call.arguments)
            )
        elif kind is ToolResultPart:
            result: ToolResultPart = part  # type: ignore[assignment]
            total += _BLOCK_OVERHEAD + text_tokens(result.call_id)
            if result.name is not None:
                total += text_tokens(result.name)
            for inner in result.content:
                total += _leaf_tokens(inner, text_tokens, image_rule, image_size_hook)
        elif kind is ReasoningPart:
            total += _BLOCK_OVERHEAD + text_tokens(part.text)  # type: ignore[union-attr]
        else:
            total += _leaf_tokens(part, text_tokens, image_rule, image_size_hook)  # type: ignore[arg-type]
    return total


def _leaf_tokens(
    part: TextPart | ImagePart | OpaquePart,
    text_tokens: Callable[[str], int],
    image_rule: ImageRule,
    image_size_hook: ImageSizeHook | None,
) -> int:
    if type(part) is TextPart:
        return text_tokens(part.text)
    if type(part) is ImagePart:
        size = image_size_hook(part) if image_size_hook is not None else None
        return image_tokens(part, image_rule, size=size)
    assert type(part) is OpaquePart
    return _BLOCK_OVERHEAD + text_tokens(_json.encode(part.item).decode())


def image_tokens(
    part: ImagePart, rule: ImageRule = "openai", *, size: tuple[int, int] | None = None
) -> int:
    """The tokens of one image under a provider's published rule.

    Args:
        part: the image.
        rule: ``"openai"``, ``"anthropic"`` or ``"gemini"`` (module docstring).
        size: its pixel size ``(width, height)`` when the caller knows it;
            otherwise read from inline data, or 1024x1024 when unknown.

    Returns:
        Tokens, independent of whether the image is base64 data or a URL.
    """
    width, height = size or image_size(part) or _UNKNOWN_IMAGE_SIZE
    width, height = max(width, 1), max(height, 1)
    if rule == "openai":
        if part.detail == "low":
            return 85
        scale = min(1.0, 2048 / max(width, height))
        w, h = width * scale, height * scale
        scale = min(1.0, 768 / min(w, h))
        w, h = w * scale, h * scale
        return 85 + 170 * math.ceil(w / 512) * math.ceil(h / 512)
    if rule == "anthropic":
        scale = min(1.0, 1568 / max(width, height))
        return min(1600, math.ceil(width * scale * height * scale / 750))
    if width <= 384 and height <= 384:
        return 258
    return 258 * math.ceil(width / 768) * math.ceil(height / 768)


def image_size(part: ImagePart) -> tuple[int, int] | None:
    """The pixel size ``(width, height)`` of an inline image, from its header.

    Reads base64 ``data`` or a base64 ``data:`` URL holding PNG, JPEG, GIF or
    WebP. Returns ``None`` for a plain URL, another format, or data that is
    not valid base64 or whose header is cut short.
    """
    text = part.data
    if text is None and part.url is not None:
        # The door's reading of a data URL (turnloom.context._media).
        text = data_url_payload(part.url)
    if not text:
        return None
    head_chars = text[:_HEADER_CHARS]
    size = _header_size(_b64(head_chars[: len(head_chars) // 4 * 4]))
    if size is None and len(text) > _HEADER_CHARS:
        size = _header_size(_b64(text))
    return size


def _b64(text: str) -> bytes:
    try:
        return base64.b64decode(text, altchars=b"-_", validate=False)  # either alphabet
    except (binascii.Error, ValueError):
        return b""


def _header_size(data: bytes) -> tuple[int, int] | None:
    if data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) >= 24:
        width, height = struct.unpack(">II", data[16:24])
        return int(width), int(height)
    if data[:6] in (b"GIF87a", b"GIF89a") and len(data) >= 10:
        width, height = struct.unpack("<HH", data[6:10])
        return int(width), int(height)
    if data[:4] == b"RIFF" and data[8:12] == b"WEBP" and len(data) >= 30:
        return _webp_size(data)
    if data[:2] == b"\xff\xd8":
        return _jpeg_size(data)
    return None


def _webp_size(data: bytes) -> tuple[int, int] | None:
    chunk = data[12:16]
    if chunk == b"VP8 ":
        width, height = struct.unpack("<HH", data[26:30])
        return int(width) & 0x3FFF, int(height) & 0x3FFF
    if chunk == b"VP8L" and len(data) >= 25:
        bits = int.from_bytes(data[21:25], "little")
        return (bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1
    if chunk == b"VP8X":
        width = int.from_bytes(data[24:27], "little") + 1
        height = int.from_bytes(data[27:30], "little") + 1
        return width, height
    return None


# JPEG start-of-frame markers that carry the frame size (not DHT, JPG, DAC).
_SOF = frozenset(range(0xC0, 0xD0)) - {0xC4, 0xC8, 0xCC}


def _jpeg_size(data: bytes) -> tuple[int, int] | None:
    at = 2
    while at + 9 <= len(data):
        if data[at] != 0xFF:
            return None
        marker = data[at + 1]
        if marker == 0xFF:  # fill byte
            at += 1
            continue
        if marker in (0x01, *range(0xD0, 0xD8)):  # markers without a length
            at += 2
            continue
        length = int.from_bytes(data[at + 2 : at + 4], "big")
        if marker in _SOF:
            height = int.from_bytes(data[at + 5 : at + 7], "big")
            width = int.from_bytes(data[at + 7 : at + 9], "big")
            return width, height
        at += 2 + length
    return None


def _sum_messages(messages: Sequence[Message], per_message: Callable[[Message], int]) -> int:
    # A cheap type check only: messages are checked in full where they enter
    # a context or a history; counting must not pay for that twice.
    kind = type(messages)
    if kind is tuple and len(messages) == 1 and type(messages[0]) is Message:
        return per_message(messages[0])  # the door counts each message alone
    if (
        kind is not tuple
        and kind is not list
        and (isinstance(messages, str | bytes) or not isinstance(messages, Iterable))
    ):
        raise InvalidArgumentError(
            f"messages must be a sequence of Message, not {what_type(messages)}.",
            field="messages",
        )
    total = 0
    for i, message in enumerate(messages):
        if not isinstance(message, Message):
            raise InvalidArgumentError(
                not_a_message(f"messages[{i}]", message),
                field=f"messages[{i}]",
            )
        total += per_message(message)
    return total


def _check_image_rule(rule: object) -> ImageRule:
    if rule not in _IMAGE_RULES:
        raise InvalidArgumentError(
            f"image_rule must be one of {', '.join(_IMAGE_RULES)}, not {rule!r:.40}.",
            field="image_rule",
        )
    return rule  # type: ignore[return-value]


def _check_hook(hook: object) -> ImageSizeHook | None:
    if hook is not None and not callable(hook):
        raise InvalidArgumentError(
            "image_size must be a callable taking an ImagePart, or None.", field="image_size"
        )
    return cast("ImageSizeHook | None", hook)


class ApproxTokenCounter:
    """The default counter: a quarter of the characters of every text.

    Free and dependency-less; within roughly 30 % of a real tokenizer on
    English text. Structure and images are counted as the module docstring
    says, by :func:`estimate_message_tokens`.

    Args:
        image_rule: whose image-token rule prices images (default OpenAI's).
        image_size: optional hook giving an image's pixel size (for URLs).

    Raises:
        InvalidArgumentError: an unknown ``image_rule``, or an ``image_size``
            that is not callable.
    """

    __slots__ = ("_image_size", "image_rule")

    def __init__(
        self, *, image_rule: ImageRule = "openai", image_size: ImageSizeHook | None = None
    ) -> None:
        self.image_rule: ImageRule = _check_image_rule(image_rule)
        self._image_size = _check_hook(image_size)

    def count_text(self, text: str) -> int:
        """The tokens of one text: ``ceil(len(text) / 4)``."""
        return approx_text_tokens(text)

    def count_message(self, message: Message) -> int:
        """The tokens of one message (:func:`estimate_message_tokens`)."""
        return estimate_message_tokens(
            message,
            approx_text_tokens,
            image_rule=self.image_rule,
            image_size_hook=self._image_size,
        )

    def count(self, messages: Sequence[Message]) -> int:
        """The tokens of ``messages``: the sum over each message; 0 when empty.

        Raises:
            InvalidArgumentError: ``messages`` is not a sequence of Message.
        """
        return _sum_messages(messages, self.count_message)

    def __repr__(self) -> str:
        return f"ApproxTokenCounter(image_rule={self.image_rule!r})"


_ENCODINGS = ("cl100k_base", "o200k_base")


class OpenAITokenCounter:
    """Exact text counts with an OpenAI vocabulary, offline.

    ``o200k_base`` is the vocabulary of GPT-4o, GPT-4.1 and the o-series;
    ``cl100k_base`` of GPT-4 and GPT-3.5. The vocabularies ship inside the
    ``bpe-openai`` wheel (the ``tokens`` extra), so nothing is downloaded.
    Special-token text such as ``<|endoftext|>`` is counted as ordinary text,
    as the API treats message content. Structure and images are counted by
    :func:`estimate_message_tokens`, as with :class:`ApproxTokenCounter`.

    Args:
        encoding: ``"o200k_base"`` (default) or ``"cl100k_base"``.
        image_rule: whose image-token rule prices images (default OpenAI's).
        image_size: optional hook giving an image's pixel size (for URLs).

    Raises:
        MissingDependencyError: ``bpe-openai`` is not installed; there is no
            fallback to another counter.
        InvalidArgumentError: an unknown ``encoding`` or ``image_rule``, or an
            ``image_size`` that is not callable.
    """

    __slots__ = ("_encoder", "_image_size", "encoding", "image_rule")

    def __init__(
        self,
        encoding: str = "o200k_base",
        *,
        image_rule: ImageRule = "openai",
        image_size: ImageSizeHook | None = None,
    ) -> None:
        if encoding not in _ENCODINGS:
            raise InvalidArgumentError(
                f"encoding must be one of {', '.join(_ENCODINGS)}, not {encoding!r:.40}.",
                field="encoding",
            )
        self.image_rule: ImageRule = _check_image_rule(image_rule)
        self._image_size = _check_hook(image_size)
        try:
            with warnings.catch_warnings():
                # bpe-openai reads its vocabularies with importlib.resources'
                # deprecated open_binary when first imported: its warning,
                # not the caller's, and an error under ``-W error``.
                warnings.filterwarnings("ignore", "open_binary is deprecated", DeprecationWarning)
                import bpe_openai  # the optional extra
        except ImportError as exc:
            raise MissingDependencyError(
                "OpenAITokenCounter needs the bpe-openai package, which ships the OpenAI "
                "vocabularies: pip install 'turnloom[tokens]'.",
                package="bpe-openai",
                extra="tokens",
            ) from exc
        self.encoding = encoding
        self._encoder: Any = bpe_openai.get_encoding(encoding)

    def count_text(self, text: str) -> int:
        """The tokens of one text in the vocabulary (special tokens as plain text)."""
        if not text:
            return 0
        return len(self._encoder.encode_ordinary(text))

    def count_message(self, message: Message) -> int:
        """The tokens of one message (:func:`estimate_message_tokens`)."""
        return estimate_message_tokens(
            message, self.count_text, image_rule=self.image_rule, image_size_hook=self._image_size
        )

    def count(self, messages: Sequence[Message]) -> int:
        """The tokens of ``messages``: the sum over each message; 0 when empty.

        Raises:
            InvalidArgumentError: ``messages`` is not a sequence of Message.
        """
        return _sum_messages(messages, self.count_message)

    def __repr__(self) -> str:
        return f"OpenAITokenCounter({self.encoding!r}, image_rule={self.image_rule!r})"
