"""What a host hands in never forges or floods a log line.

The gateways log what they drop (an opaque part of another provider, a
result part a provider cannot carry, reasoning without its follower). Every
value from the host in such a line goes through :func:`~turnloom.errors.excerpt`:
a newline appears escaped, a 600 kB value as a short excerpt.
"""

from __future__ import annotations

import logging

import pytest

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
    get_gateway,
)
from turnloom.errors import EXCERPT_LIMIT

FORGED = "x\nCRITICAL turnloom: forged"
HUGE = "t" * 600_000
# The longest line: the longest template plus a few excerpts.
LINE_LIMIT = 200 + 3 * EXCERPT_LIMIT

_PNG = "iVBORw0KGgo="

# Messages the door accepts, each holding a hostile value a gateway logs.
CHECKED = {
    "result part dropped, forged call id": Message(
        role=Role.tool,
        content=(
            ToolResultPart(
                call_id=FORGED,
                name="f",
                content=(TextPart(text="ok"), ImagePart(data=_PNG, media_type="image/png")),
            ),
        ),
    ),
    "foreign opaque part, huge type": Message(
        role=Role.user, content=(OpaquePart(gateway="gemini", item={"type": HUGE}),)
    ),
    "foreign opaque part, forged type and gateway": Message(
        role=Role.user, content=(OpaquePart(gateway=FORGED, item={"type": FORGED}),)
    ),
    "foreign reasoning, forged gateway": Message(
        role=Role.assistant,
        content=(ReasoningPart(text="hm", gateway=FORGED), TextPart(text="ok")),
    ),
    "reasoning without a follower, forged id": Message(
        role=Role.assistant,
        content=(ReasoningPart(text="hm", id=FORGED, gateway="openai_responses"),),
    ),
}
# Messages that never passed the door (the door refuses these shapes), rendered directly.
DIRECT = {
    "tool call in a user message, forged call id": Message(
        role=Role.user, content=(ToolCallPart(call_id=FORGED, name="f"),)
    ),
    "result in an assistant message, huge call id": Message(
        role=Role.assistant, content=(ToolResultPart(call_id=HUGE, name="f"),)
    ),
    "image of a forged media type": Message(
        role=Role.user, content=(ImagePart(data=_PNG, media_type="image/x\nCRITICAL forged"),)
    ),
}


def _render_everywhere(message: Message) -> None:
    for kind in GatewayType:
        get_gateway(kind).render(message)


@pytest.mark.parametrize("name", sorted(CHECKED))
def test_a_hostile_value_of_a_checked_message_is_an_excerpt_in_every_log_line(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """Invariant: no log record holds a newline or the raw value, and each is bounded."""
    message = CHECKED[name]
    check_message(message)
    with caplog.at_level(logging.DEBUG, logger="turnloom"):
        _render_everywhere(message)
    lines = [r.getMessage() for r in caplog.records]
    assert lines  # something was logged, so the test can fail
    for line in lines:
        assert "\n" not in line
        assert "CRITICAL turnloom: forged" not in line or "\\nCRITICAL" in line
        assert len(line) <= LINE_LIMIT


@pytest.mark.parametrize("name", sorted(DIRECT))
def test_a_hostile_value_of_a_direct_render_is_an_excerpt_in_every_log_line(
    name: str, caplog: pytest.LogCaptureFixture
) -> None:
    """The same for a message rendered without the door (which refuses each of these)."""
    message = DIRECT[name]
    with caplog.at_level(logging.DEBUG, logger="turnloom"):
        _render_everywhere(message)
    lines = [r.getMessage() for r in caplog.records]
    assert lines
    for line in lines:
        assert "\n" not in line
        assert len(line) <= LINE_LIMIT


def test_the_forged_opaque_type_is_logged_as_its_escaped_excerpt(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The exact line: the value quoted and escaped, the gateway name too."""
    message = CHECKED["foreign opaque part, forged type and gateway"]
    check_message(message)
    with caplog.at_level(logging.WARNING, logger="turnloom"):
        get_gateway("anthropic").render(message)
    assert [r.getMessage() for r in caplog.records] == [
        "Dropped a 'x\\nCRITICAL turnloom: forged'-native 'x\\nCRITICAL turnloom: forged' "
        "part: the anthropic gateway cannot carry it."
    ]
