"""Media types, base64 data and ``data:`` URLs of image parts (private).

The door (:func:`~turnloom.context.check_message`) checks an image part with
these rules, the gateways render its inline data with them, and the token
estimator reads the same data, so the three agree on what a data URL is:

* a media type is ``type/subtype``, each a restricted name of at most 127
  characters (letters, digits and ``!#$&-^_.+``, starting with a letter or
  digit), nothing else: no parameters, no spaces, no control characters;
  names are case-insensitive, and the gateways that take a media type as a
  field send it in lower case, a common alias (``image/jpg``) as its
  registered name (:func:`canonical_media_type`);
* base64 data is the standard alphabet with its padding, or (a Gemini
  ``inlineData`` field, protobuf ``bytes``) the URL-safe one, checked by the
  standard library (``base64.b64decode(..., validate=True)``);
* an image's data URL is ``data:<image media type>[;name=value]...;base64,<data>``
  with standard base64: every provider takes image data as base64 only.

Source: RFC 6838 section 4.2 (type and subtype names), RFC 2045 section 5.1
(parameter values are tokens), RFC 2397 (the ``data`` URL scheme), RFC 4648
sections 4 and 5 (base64, and its URL- and filename-safe alphabet), protobuf
JSON mapping (``bytes`` accepts either alphabet).
"""

from __future__ import annotations

__all__ = (
    "base64_problem",
    "canonical_media_type",
    "data_url_payload",
    "image_media_type_problem",
    "inline_image",
    "is_data_url",
    "is_image_media_type",
    "media_type_problem",
    "split_data_url",
    "standard_base64",
)

import base64
import binascii
import re

from turnloom.errors import excerpt

_NAME = r"[A-Za-z0-9][A-Za-z0-9!#$&^_.+-]{0,126}"
_MEDIA_TYPE = re.compile(rf"{_NAME}/{_NAME}", re.ASCII)
_PARAMETER = re.compile(rf"{_NAME}=[A-Za-z0-9!#$%&'*+.^_`{{|}}~-]+", re.ASCII)
# The longest media type the grammar allows: two names and the slash.
_MAX_MEDIA_TYPE = 127 * 2 + 1
_TO_STANDARD = str.maketrans("-_", "+/")
# Names hosts write for a registered type (``f"image/{extension}"`` gives
# ``image/jpg``); providers take only the registered name.
_ALIASES = {"image/jpg": "image/jpeg", "image/pjpeg": "image/jpeg", "image/x-png": "image/png"}


def media_type_problem(value: str) -> str | None:
    """What makes ``value`` no media type, as a clause (None: it is one).

    ``value`` must be ``type/subtype`` by the grammar of RFC 6838 (see the
    module docstring); the clause reads after the value ("... is not ...").
    """
    if len(value) > _MAX_MEDIA_TYPE or _MEDIA_TYPE.fullmatch(value) is None:
        return (
            "is not a media type: type/subtype, each at most 127 letters, digits or "
            "!#$&-^_.+ (RFC 6838), without parameters"
        )
    return None


def image_media_type_problem(value: str) -> str | None:
    """What makes ``value`` no image media type, as a clause (None: it is one)."""
    problem = media_type_problem(value)
    if problem is None and value[:6].lower() != "image/":
        return "is not an image type (image/...)"
    return problem


def canonical_media_type(value: str) -> str:
    """``value`` in lower case (names are case-insensitive), an alias as its registered name.

    ``"IMAGE/PNG"`` gives ``"image/png"``, ``"image/jpg"`` gives ``"image/jpeg"``.
    """
    lowered = value.lower()
    return _ALIASES.get(lowered, lowered)


def is_image_media_type(value: object) -> bool:
    """True when ``value`` is a str naming an image media type (``image/png``)."""
    return isinstance(value, str) and image_media_type_problem(value) is None


def base64_problem(text: str, *, url_safe: bool = False) -> str | None:
    """What makes ``text`` no base64 data, as a clause (None: it is base64).

    Args:
        text: the data.
        url_safe: also accept the URL-safe alphabet (``-`` and ``_``).
    """
    try:
        base64.b64decode(text, altchars=b"-_" if url_safe else None, validate=True)
    except (binascii.Error, ValueError) as exc:
        return f"is not base64 ({exc})"
    return None


def standard_base64(data: str) -> str:
    """``data`` in the standard base64 alphabet (URL-safe ``-`` and ``_`` translated)."""
    if "-" in data or "_" in data:
        return data.translate(_TO_STANDARD)
    return data


def is_data_url(url: str) -> bool:
    """True when ``url`` uses the ``data`` scheme (the scheme is case-insensitive)."""
    return url[:5].lower() == "data:"


def data_url_payload(url: str) -> str | None:
    """The base64 text of a ``;base64`` data URL, unchecked; None for any other URL."""
    if not is_data_url(url):
        return None
    head, comma, payload = url.partition(",")
    if comma and head.lower().endswith(";base64"):
        return payload
    return None


def split_data_url(url: str) -> tuple[str, str]:
    """The image media type and the base64 data of the data URL ``url``.

    Parameters between the media type and ``;base64`` (``;name=a.png``) are
    checked and left out.

    Raises:
        ValueError: ``url`` is not a base64 data URL of an image; the message
            is a clause naming what is wrong ("has no comma ...").
    """
    if not is_data_url(url):
        return _refuse("does not start with data:")
    head, comma, payload = url[5:].partition(",")
    if not comma:
        return _refuse("has no comma between its media type and its data")
    fields = head.split(";")
    if len(fields) < 2 or fields[-1].lower() != "base64":
        return _refuse(
            "is not base64 (no ;base64 before the comma); providers take image data as base64 only"
        )
    media = fields[0]
    if not media:
        return _refuse("names no media type (which means text/plain), not an image type")
    problem = image_media_type_problem(media)
    if problem is not None:
        return _refuse(f"has the media type {excerpt(media)}, which {problem}")
    for parameter in fields[1:-1]:
        if _PARAMETER.fullmatch(parameter) is None:
            return _refuse(
                f"has the parameter {excerpt(parameter)}, which is not name=value (RFC 2045 token)"
            )
    if not payload:
        return _refuse("has no data after the comma")
    problem = base64_problem(payload)
    if problem is not None:
        return _refuse(f"has data that {problem}")
    return media, payload


def _refuse(clause: str) -> tuple[str, str]:
    raise ValueError(clause)


def inline_image(
    url: str | None, data: str | None, media_type: str | None
) -> tuple[str, str] | None:
    """The ``(media type, base64 data)`` an image carries inline, or None for a plain URL.

    Base64 ``data`` with its ``media_type`` as they are; a data URL split by
    :func:`split_data_url`.

    Raises:
        ValueError: ``url`` is a data URL that :func:`split_data_url` refuses.
    """
    if data is not None:
        return media_type or "", data
    if url is not None and is_data_url(url):
        return split_data_url(url)
    return None
