"""Images given as ``data:`` URLs: inline data on every provider, malformed ones refused.

Anthropic takes a ``base64`` source and Gemini ``inlineData``; neither takes
a data URL as a URL (``source.url``, ``fileData.fileUri``). OpenAI Chat and
Responses take a data URL as the image URL. The door refuses a data URL,
base64 data or media type that no provider could take, with a typed error
naming the field, and changes nothing.
"""

from __future__ import annotations

import base64
import os
from pathlib import Path
from typing import Any

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.context.gateways._support import load_records
from turnloom.context import (
    GatewayType,
    ImagePart,
    Message,
    Role,
    TextPart,
    ToolResultPart,
    check_message,
    estimate_message_tokens,
    get_gateway,
    image_size,
)
from turnloom.context._media import canonical_media_type
from turnloom.context.history import TurnHistory
from turnloom.errors import InvalidMessageError, excerpt

_PNG = base64.b64encode(
    b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR\x00\x00\x00\x02\x00\x00\x00\x03\x08\x02\x00\x00\x00"
).decode("ascii")
# Bytes whose standard base64 holds "+" and "/", so the URL-safe form differs.
_SAFE_BYTES = b"\xfb\xff\xfe\x89PNG"
_STANDARD = base64.b64encode(_SAFE_BYTES).decode("ascii")
_URL_SAFE = base64.urlsafe_b64encode(_SAFE_BYTES).decode("ascii")


def _user(*parts: Any) -> Message:
    return Message(role=Role.user, content=tuple(parts))


def _walk(value: Any) -> Any:
    if isinstance(value, dict):
        yield value
        for inner in value.values():
            yield from _walk(inner)
    elif isinstance(value, list):
        for inner in value:
            yield from _walk(inner)


def _recorded(recordings: Path, provider: str, source: str, pick: Any) -> Any:
    [record] = [r for r in load_records(recordings, provider) if r["source"].endswith(source)]
    assert record["status"] == 200
    [found] = [d for d in _walk(record["request"]) if pick(d)]
    return found


def test_a_recorded_data_url_renders_as_the_inline_image_each_provider_accepted(
    recordings_dir: Path,
) -> None:
    """The accepted OpenAI Chat data URL of pydantic-ai's mixed-content test, as an
    ImagePart url, renders as the accepted Anthropic base64 source (byte for byte) and
    as the accepted Gemini inlineData (same type, same bytes; Gemini's recording uses
    the URL-safe alphabet), and stays the same URL on both OpenAI gateways."""
    test = "test_multimodal_tool_returns/test_mixed_content_ordering[{}].yaml#1"
    chat = _recorded(
        recordings_dir,
        "openai_chat",
        test.format("openai_chat"),
        lambda d: d.get("type") == "image_url",
    )
    url = chat["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,/9j/")
    anthropic = _recorded(
        recordings_dir, "anthropic", test.format("anthropic"), lambda d: d.get("type") == "image"
    )
    gemini = _recorded(
        recordings_dir, "gemini", test.format("google_2_5"), lambda d: "inlineData" in d
    )
    message = _user(ImagePart(url=url))
    check_message(message)

    [a_item] = get_gateway("anthropic").render(message)
    assert a_item == {"role": "user", "content": [{"type": "image", "source": anthropic["source"]}]}
    [g_item] = get_gateway("gemini").render(message)
    [g_part] = g_item["parts"]
    assert g_part.keys() == {"inlineData"}
    assert g_part["inlineData"]["mimeType"] == gemini["inlineData"]["mimeType"] == "image/jpeg"
    assert base64.b64decode(g_part["inlineData"]["data"]) == base64.urlsafe_b64decode(
        gemini["inlineData"]["data"]
    )
    [c_item] = get_gateway("openai_chat").render(message)
    assert c_item["content"] == [{"type": "image_url", "image_url": {"url": url}}]
    [r_item] = get_gateway("openai_responses").render(message)
    assert r_item["content"] == [{"type": "input_image", "image_url": url, "detail": "auto"}]
    for kind in GatewayType:
        gateway = get_gateway(kind)
        body = gateway.request_body(gateway.render(message))
        assert gateway.validate(body[gateway.items_field]) == []


@pytest.mark.parametrize(
    ("url", "inline"),
    [
        (f"data:image/png;base64,{_PNG}", ("image/png", _PNG)),
        (f"DATA:image/png;name=a.png;base64,{_PNG}", ("image/png", _PNG)),
        (f"data:image/webp;BASE64,{_PNG}", ("image/webp", _PNG)),
    ],
)
def test_a_data_url_renders_as_inline_data_where_the_provider_needs_it(
    url: str, inline: tuple[str, str]
) -> None:
    """Anthropic base64 source, Gemini inlineData (both spellings), also inside a tool
    result; the URL itself on OpenAI Chat and Responses."""
    media, data = inline
    message = _user(ImagePart(url=url))
    check_message(message)
    anthropic = get_gateway("anthropic").render(message)
    assert anthropic == [
        {
            "role": "user",
            "content": [
                {"type": "image", "source": {"type": "base64", "media_type": media, "data": data}}
            ],
        }
    ]
    assert get_gateway("gemini").render(message) == [
        {"role": "user", "parts": [{"inlineData": {"mimeType": media, "data": data}}]}
    ]
    snake = Message(
        role=Role.user, content=message.content, layout={"gateway": "gemini", "snake": True}
    )
    check_message(snake)
    assert get_gateway("gemini").render(snake) == [
        {"role": "user", "parts": [{"inline_data": {"mime_type": media, "data": data}}]}
    ]
    result = Message(
        role=Role.tool,
        content=(
            ToolResultPart(
                call_id="c1", name="f", content=(TextPart(text="ok"), ImagePart(url=url))
            ),
        ),
    )
    check_message(result)
    [a_result] = get_gateway("anthropic").render(result)
    assert a_result["content"][0]["content"][1] == anthropic[0]["content"][0]
    [g_result] = get_gateway("gemini").render(result)
    assert g_result["parts"][0]["functionResponse"]["parts"] == [
        {"inlineData": {"mimeType": media, "data": data}}
    ]
    assert get_gateway("openai_chat").render(message)[0]["content"][0]["image_url"] == {"url": url}
    assert get_gateway("openai_responses").render(message)[0]["content"][0]["image_url"] == url


def test_a_data_url_costs_the_tokens_of_the_same_inline_data() -> None:
    """The estimator reads a data URL as the door and the gateways do: as its data."""
    by_url = ImagePart(url=f"data:image/png;name=a.png;base64,{_PNG}")
    by_data = ImagePart(data=_PNG, media_type="image/png")
    assert image_size(by_url) == image_size(by_data) == (2, 3)
    assert estimate_message_tokens(_user(by_url)) == estimate_message_tokens(_user(by_data))


@pytest.mark.parametrize(
    ("provider", "item"),
    [
        (
            "anthropic",
            {
                "role": "user",
                "content": [
                    {
                        "type": "image",
                        "source": {"type": "base64", "media_type": "image/png", "data": _PNG},
                    }
                ],
            },
        ),
        (
            "gemini",
            {
                "role": "user",
                "parts": [{"inlineData": {"mimeType": "image/png", "data": _URL_SAFE}}],
            },
        ),
        (
            "gemini",
            {
                "role": "user",
                "parts": [{"fileData": {"mimeType": "image/png", "fileUri": "gs://b/a.png"}}],
            },
        ),
        (
            "openai_chat",
            {
                "role": "user",
                "content": [
                    {"type": "image_url", "image_url": {"url": f"data:image/png;base64,{_PNG}"}}
                ],
            },
        ),
        (
            "openai_chat",
            {
                "role": "user",
                "content": [
                    {
                        "type": "image_url",
                        "image_url": {"url": f"data:image/png;name=a;base64,{_PNG}"},
                    }
                ],
            },
        ),
        (
            "openai_responses",
            {
                "role": "user",
                "content": [
                    {
                        "type": "input_image",
                        "image_url": f"data:image/png;base64,{_PNG}",
                        "detail": "auto",
                    }
                ],
            },
        ),
    ],
)
def test_a_parsed_inline_image_renders_back_exactly(provider: str, item: dict[str, Any]) -> None:
    """parse -> render is the identity for inline images (and a URL-safe Gemini one)."""
    gateway = get_gateway(provider)
    message = gateway.parse(item)
    check_message(message)
    assert gateway.render(message) == [item]


def test_parsed_inline_images_are_image_parts_with_data_and_media_type() -> None:
    """What an Anthropic base64 image and a Gemini inlineData parse to."""
    anthropic = get_gateway("anthropic").parse(
        {
            "role": "user",
            "content": [
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": "image/png", "data": _PNG},
                }
            ],
        }
    )
    gemini = get_gateway("gemini").parse(
        {"role": "user", "parts": [{"inlineData": {"mimeType": "image/png", "data": _URL_SAFE}}]}
    )
    assert anthropic.parts == (ImagePart(data=_PNG, media_type="image/png"),)
    assert gemini.parts == (ImagePart(data=_URL_SAFE, media_type="image/png"),)


def test_url_safe_base64_renders_in_the_standard_alphabet_off_gemini() -> None:
    """Gemini's inlineData may be URL-safe base64; Anthropic and OpenAI get the standard one."""
    message = _user(ImagePart(data=_URL_SAFE, media_type="image/png"))
    check_message(message)
    source = get_gateway("anthropic").render(message)[0]["content"][0]["source"]
    assert source == {"type": "base64", "media_type": "image/png", "data": _STANDARD}
    chat = get_gateway("openai_chat").render(message)[0]["content"][0]["image_url"]["url"]
    assert chat == f"data:image/png;base64,{_STANDARD}"
    responses = get_gateway("openai_responses").render(message)[0]["content"][0]["image_url"]
    assert responses == f"data:image/png;base64,{_STANDARD}"
    gemini = get_gateway("gemini").render(message)[0]["parts"][0]["inlineData"]["data"]
    assert gemini == _URL_SAFE


_BAD_IMAGES = [
    (
        ImagePart(url="data:image/png;base64" + _PNG),
        "content[0].url",
        "message content[0].url is a data URL that has no comma between its media type and "
        "its data.",
    ),
    (
        ImagePart(url="data:image/png," + _PNG),
        "content[0].url",
        "message content[0].url is a data URL that is not base64 (no ;base64 before the comma); "
        "providers take image data as base64 only.",
    ),
    (
        ImagePart(url="data:;base64," + _PNG),
        "content[0].url",
        "message content[0].url is a data URL that names no media type (which means "
        "text/plain), not an image type.",
    ),
    (
        ImagePart(url="data:text/plain;base64," + _PNG),
        "content[0].url",
        "message content[0].url is a data URL that has the media type 'text/plain', which "
        "is not an image type (image/...).",
    ),
    (
        ImagePart(url="data:image/png\nCRITICAL forged;base64," + _PNG),
        "content[0].url",
        "message content[0].url is a data URL that has the media type 'image/png\\nCRITICAL "
        "forged', which is not a media type: type/subtype, each at most 127 letters, digits "
        "or !#$&-^_.+ (RFC 6838), without parameters.",
    ),
    (
        ImagePart(url="data:image/png;name a;base64," + _PNG),
        "content[0].url",
        "message content[0].url is a data URL that has the parameter 'name a', which is not "
        "name=value (RFC 2045 token).",
    ),
    (
        ImagePart(url="data:image/png;base64,"),
        "content[0].url",
        "message content[0].url is a data URL that has no data after the comma.",
    ),
    (
        ImagePart(url="data:image/png;base64,iVBO*w0K"),
        "content[0].url",
        "message content[0].url is a data URL that has data that is not base64 (Only base64 "
        "data is allowed).",
    ),
    (
        ImagePart(url="data:image/png;base64,iVBORw0"),
        "content[0].url",
        "message content[0].url is a data URL that has data that is not base64 (Incorrect "
        "padding).",
    ),
    (
        ImagePart(url="data:image/png;base64," + _URL_SAFE),
        "content[0].url",
        "message content[0].url is a data URL that has data that is not base64 (Only base64 "
        "data is allowed).",
    ),
    (
        ImagePart(url="data:image/png;base64,iVBORw0KGgo=\n"),
        "content[0].url",
        "message content[0].url is a data URL that has data that is not base64 (Excess data "
        "after padding).",
    ),
    (
        ImagePart(url=f"data:image/png;base64,{_PNG}", media_type="image/jpeg"),
        "content[0].media_type",
        "message content[0].media_type 'image/jpeg' does not match the media type of its "
        "data URL, 'image/png'.",
    ),
    (
        ImagePart(data="iVBO*w0K", media_type="image/png"),
        "content[0].data",
        "message content[0].data is not base64 (Only base64 data is allowed).",
    ),
    (
        ImagePart(data="iVBORw0", media_type="image/png"),
        "content[0].data",
        "message content[0].data is not base64 (Incorrect padding).",
    ),
    (
        ImagePart(data="ï" + _PNG, media_type="image/png"),
        "content[0].data",
        "message content[0].data is not base64 (string argument should contain only ASCII "
        "characters).",
    ),
    (
        ImagePart(data=_PNG, media_type="image/x\nCRITICAL turnloom: forged"),
        "content[0].media_type",
        "message content[0].media_type 'image/x\\nCRITICAL turnloom: forged' is not a media "
        "type: type/subtype, each at most 127 letters, digits or !#$&-^_.+ (RFC 6838), "
        "without parameters.",
    ),
    (
        ImagePart(data=_PNG, media_type="image/png; charset=x"),
        "content[0].media_type",
        "message content[0].media_type 'image/png; charset=x' is not a media type: "
        "type/subtype, each at most 127 letters, digits or !#$&-^_.+ (RFC 6838), without "
        "parameters.",
    ),
    (
        ImagePart(data=_PNG, media_type="image/" + "x" * 128),
        "content[0].media_type",
        f"message content[0].media_type {excerpt('image/' + 'x' * 128)} is not a media type: "
        "type/subtype, each at most 127 letters, digits or !#$&-^_.+ (RFC 6838), without "
        "parameters.",
    ),
    (
        ImagePart(data=_PNG, media_type="image/*"),
        "content[0].media_type",
        "message content[0].media_type 'image/*' is not a media type: type/subtype, each at "
        "most 127 letters, digits or !#$&-^_.+ (RFC 6838), without parameters.",
    ),
    (
        ImagePart(url="https://example.com/a.png", media_type="application/pdf"),
        "content[0].media_type",
        "message content[0].media_type 'application/pdf' is not an image type (image/...).",
    ),
]


@pytest.mark.parametrize(("image", "field", "text"), _BAD_IMAGES)
def test_a_malformed_image_is_refused_at_the_door_naming_its_field(
    image: ImagePart, field: str, text: str
) -> None:
    """Each kind of malformed data URL, base64 data and media type: InvalidMessageError
    (exactly that type) with the field and the full sentence; the message is unchanged."""
    message = _user(TextPart(text="see", extras={"k": "v"}), image)
    message = Message(role=Role.user, content=(image, *message.parts[:1]))
    before = msgspec.to_builtins(message)
    with pytest.raises(InvalidMessageError) as info:
        check_message(message)
    assert type(info.value) is InvalidMessageError
    assert info.value.field == field
    assert str(info.value) == text
    assert msgspec.to_builtins(message) == before


@pytest.mark.parametrize(("image", "field", "text"), _BAD_IMAGES[:3])
def test_a_malformed_image_is_refused_by_a_history_which_keeps_what_it_held(
    image: ImagePart, field: str, text: str
) -> None:
    """The history's door: commit and record refuse it, typed, and hold what they held."""
    history = TurnHistory()
    history.commit("t1", [_user(TextPart(text="hi"))])
    before = (history.view().messages(), history.statistics())
    with pytest.raises(InvalidMessageError) as info:
        history.commit("t2", [_user(image)])
    assert (type(info.value), info.value.field) == (InvalidMessageError, field)
    with pytest.raises(InvalidMessageError):
        history.record("t1", [Message(role=Role.assistant, content="ok"), _user(image)])
    assert (history.view().messages(), history.statistics()) == before


def test_a_direct_render_of_an_unchecked_malformed_data_url_is_a_typed_error() -> None:
    """A message that never passed the door: Anthropic and Gemini refuse the data URL
    they would have to split, typed; nothing is half-rendered."""
    message = _user(ImagePart(url="data:image/png," + _PNG))
    for kind in ("anthropic", "gemini"):
        with pytest.raises(InvalidMessageError) as info:
            get_gateway(kind).render(message)
        assert type(info.value) is InvalidMessageError
        assert str(info.value) == (
            "An image's url is a data URL that is not base64 (no ;base64 before the comma); "
            "providers take image data as base64 only."
        )


_NAME_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789!#$&-^_.+"
_names = st.builds(
    lambda first, rest: first + rest,
    st.sampled_from("abcdefghijklmnopqrstuvwxyz0123456789"),
    st.text(_NAME_CHARS, max_size=20),
)
_params = st.lists(
    st.builds(
        lambda n, v: f"{n}={v}", _names, st.text(_NAME_CHARS + "%*'`{|}~", min_size=1, max_size=8)
    ),
    max_size=3,
)


@settings(max_examples=int(os.environ.get("TURNLOOM_DATA_URL_EXAMPLES", "200")))
@given(data=st.binary(min_size=1, max_size=64), subtype=_names, params=_params)
def test_every_well_formed_data_url_renders_its_bytes_inline_on_every_provider(
    data: bytes, subtype: str, params: list[str]
) -> None:
    """Property: the door accepts ``data:image/<subtype>[;params];base64,<data>``; Anthropic
    (when it takes the type) and Gemini carry the same type (canonical: lower case, an
    alias as its registered name) and bytes inline, OpenAI the URL."""
    url = f"data:{';'.join([f'image/{subtype}', *params])};base64,{base64.b64encode(data).decode()}"
    media = canonical_media_type(f"image/{subtype}")
    message = _user(ImagePart(url=url))
    check_message(message)
    [g_item] = get_gateway("gemini").render(message)
    inline = g_item["parts"][0]["inlineData"]
    assert (inline["mimeType"], base64.b64decode(inline["data"])) == (media, data)
    anthropic = get_gateway("anthropic").render(message)
    if media in ("image/jpeg", "image/png", "image/gif", "image/webp"):
        source = anthropic[0]["content"][0]["source"]
        assert (source["media_type"], base64.b64decode(source["data"])) == (media, data)
    else:
        assert anthropic == []  # dropped with a warning: Anthropic takes four types
    assert get_gateway("openai_chat").render(message)[0]["content"][0]["image_url"]["url"] == url


@settings(max_examples=int(os.environ.get("TURNLOOM_DATA_URL_EXAMPLES", "200")))
@given(
    data=st.binary(min_size=1, max_size=64),
    at=st.integers(min_value=0),
    bad=st.sampled_from([" ", "\n", "*", "-", "_", "é", "=", "\x00", ",", ";"]),
)
def test_a_data_url_with_a_foreign_character_in_its_base64_is_refused(
    data: bytes, at: int, bad: str
) -> None:
    """Property: one character outside the standard base64 alphabet (or a misplaced
    ``=``) anywhere in the data makes the door refuse the URL, typed, naming ``url``."""
    text = base64.b64encode(data).decode()
    cut = at % (len(text) + 1)
    if bad == "=" and text[cut:].strip("=") == "":
        cut = 0  # "=" at the end may be padding
    url = f"data:image/png;base64,{text[:cut]}{bad}{text[cut:]}"
    with pytest.raises(InvalidMessageError) as info:
        check_message(_user(ImagePart(url=url)))
    assert (type(info.value), info.value.field) == (InvalidMessageError, "content[0].url")


# Host-written media types that name a type Anthropic and Gemini take: the
# ``.jpg`` alias (``f"image/{extension}"``) and other case (RFC 6838 section
# 4.2: type and subtype names are case-insensitive).
_ALIASES = {
    "image/jpg": "image/jpeg",
    "image/PNG": "image/png",
    "IMAGE/JPEG": "image/jpeg",
    "Image/Webp": "image/webp",
}


@pytest.mark.parametrize("written", list(_ALIASES))
@pytest.mark.parametrize("form", ["data", "url"])
def test_an_image_type_alias_or_other_case_renders_as_the_canonical_type(
    written: str, form: str
) -> None:
    """Never dropped on Anthropic: the canonical lower-case type goes out, as on Gemini."""
    part = (
        ImagePart(data=_PNG, media_type=written)
        if form == "data"
        else ImagePart(url=f"DATA:{written};base64,{_PNG}")
    )
    message = _user(TextPart(text="What is this?"), part)
    check_message(message)
    canonical = _ALIASES[written]
    assert get_gateway("anthropic").render(message) == [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "What is this?"},
                {
                    "type": "image",
                    "source": {"type": "base64", "media_type": canonical, "data": _PNG},
                },
            ],
        }
    ]
    assert get_gateway("gemini").render(message) == [
        {
            "role": "user",
            "parts": [
                {"text": "What is this?"},
                {"inlineData": {"mimeType": canonical, "data": _PNG}},
            ],
        }
    ]
