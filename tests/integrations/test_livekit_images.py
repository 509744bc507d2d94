"""A LiveKit user message with images (LiveKit's vision pattern: ``ImageContent`` in the
user's ``ChatMessage``) keeps its images in turnloom's history and in every model call.

LiveKit Agents is asyncio-only, so these tests run on asyncio only.
"""

from __future__ import annotations

import asyncio
import base64
from typing import Any

import pytest

pytest.importorskip("livekit.agents")

from livekit import rtc
from livekit.agents import AgentSession, llm

from tests.integrations.livekit_fakes import ScriptedLLM
from turnloom.context import ImagePart, Message, Role, TextPart
from turnloom.integrations.livekit import TurnloomAgent
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot

URL = "https://example.com/bag.jpg"
PNG = "data:image/png;base64,iVBORw0KGgo="


def _contents(ctx: llm.ChatContext) -> list[tuple[str, list[Any]]]:
    out: list[tuple[str, list[Any]]] = []
    for item in ctx.items:
        assert isinstance(item, llm.ChatMessage)
        out.append(
            (
                item.role,
                [
                    c if isinstance(c, str) else ("image", c.image, c.inference_detail)
                    for c in item.content
                    if isinstance(c, str | llm.ImageContent)
                ],
            )
        )
    return out


async def _next_input(manager: ContextManager) -> list[dict[str, Any]]:
    manager.accept_turn(
        TurnSnapshot(
            context_id="call-1", turn_id="t9", input=(Message(role=Role.user, content="More?"),)
        )
    )
    prefix = await manager.prepare(ContextPrepareRequest(context_id="call-1", turn_id="t9"))
    assert manager.gateway.validate(prefix.items) == []
    return list(prefix.items)


def test_a_user_messages_images_reach_history_and_every_model_call() -> None:
    """Invariant: nothing the caller hands in vanishes: a user turn holding text and
    images (URL, data URL) keeps them in LiveKit's order, in turnloom's history, in each
    model call of that turn and the next, and in the next prepared input (which
    validates).

    Mutant tried: the turn's input built from ``text_content`` only (as before): the
    images are missing from history and from both model calls."""

    async def main() -> None:
        model = ScriptedLLM([["A red bag."], ["Bye."]])
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            agent = TurnloomAgent(manager=manager, context_id="call-1", instructions="Be brief.")
            async with AgentSession(llm=model) as session:
                await session.start(agent)
                content: list[Any] = [
                    "What is this?",
                    llm.ImageContent(image=URL, inference_detail="low"),
                    "And this?",
                    llm.ImageContent(image=PNG),
                ]
                await session.generate_reply(
                    user_input=llm.ChatMessage(role="user", content=content)
                )
                await session.run(user_input="Thanks.")
            view = manager.history("call-1")
            first = view.turn_messages(view.turn_ids[0])[0]
            assert first.content == (
                TextPart(text="What is this?"),
                ImagePart(url=URL, detail="low"),
                TextPart(text="And this?"),
                ImagePart(data="iVBORw0KGgo=", media_type="image/png", detail="auto"),
            )
            user = (
                "user",
                [
                    "What is this?",
                    ("image", URL, "low"),
                    "And this?",
                    ("image", PNG, "auto"),
                ],
            )
            assert [_contents(c) for c in model.seen] == [
                [("system", ["Be brief."]), user],
                [
                    ("system", ["Be brief."]),
                    user,
                    ("assistant", ["A red bag."]),
                    ("user", ["Thanks."]),
                ],
            ]
            items = await _next_input(manager)
            assert items[1] == {
                "role": "user",
                "content": [
                    {"type": "text", "text": "What is this?"},
                    {"type": "image_url", "image_url": {"url": URL, "detail": "low"}},
                    {"type": "text", "text": "And this?"},
                    {"type": "image_url", "image_url": {"url": PNG, "detail": "auto"}},
                ],
            }

    asyncio.run(main())


def test_an_image_only_user_turn_and_a_video_frame_are_kept() -> None:
    """Invariant: a user turn that is only a camera frame (LiveKit's ``VideoFrame``,
    encoded as LiveKit encodes it: JPEG) is kept as an image, with no empty text block.

    Mutant tried: as before the fix, the turn's input is an empty text: the frame is lost."""

    async def main() -> None:
        model = ScriptedLLM([["A bag."]])
        frame = rtc.VideoFrame(2, 2, rtc.VideoBufferType.RGBA, bytes(16))
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            agent = TurnloomAgent(manager=manager, context_id="call-1", instructions="Be brief.")
            async with AgentSession(llm=model) as session:
                await session.start(agent)
                await session.generate_reply(
                    user_input=llm.ChatMessage(role="user", content=[llm.ImageContent(image=frame)])
                )
            view = manager.history("call-1")
            (image,) = view.turn_messages(view.turn_ids[0])[0].content
            assert isinstance(image, ImagePart)
            assert (image.media_type, image.detail, image.url) == ("image/jpeg", "auto", None)
            assert base64.b64decode(image.data or "")[:2] == b"\xff\xd8"  # a JPEG
            sent = model.seen[0].items[1]
            assert isinstance(sent, llm.ChatMessage)
            (content,) = sent.content
            assert isinstance(content, llm.ImageContent)
            assert content.image == f"data:image/jpeg;base64,{image.data}"
            items = await _next_input(manager)
            assert items[1]["content"] == [
                {
                    "type": "image_url",
                    "image_url": {"url": f"data:image/jpeg;base64,{image.data}", "detail": "auto"},
                }
            ]

    asyncio.run(main())
