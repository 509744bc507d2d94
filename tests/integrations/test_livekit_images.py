"""A LiveKit user message with images (LiveKit's vision pattern: ``ImageContent`` in the
user's ``ChatMessage``) keeps its images in turnloom's history and in every model call.

LiveKit Agents is asyncio-only, so these tests run on asyncio only.
"""

from __future__ import annotations

import asyncio
import base64
import logging
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


class _LateImageAgent(TurnloomAgent):
    """LiveKit's vision pattern run after the base hook: the frame appended too late."""

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        await super().on_user_turn_completed(turn_ctx, new_message)
        new_message.content.append(llm.ImageContent(image=URL))


class _EarlyImageAgent(TurnloomAgent):
    """LiveKit's vision pattern run before the base hook: the frame is the turn's."""

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        new_message.content.append(llm.ImageContent(image=URL))
        await super().on_user_turn_completed(turn_ctx, new_message)


def test_an_image_appended_after_the_commit_is_a_counted_late_edit(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: an image appended to ``new_message`` after the base hook committed the
    turn is not dropped silently: one warning (image counts, not the caller's words) and
    ``late_edits`` grows by one; appended before the hook, it is the turn's and reaches
    the model call. Before the fix the late image was neither sent nor counted (the
    late-edit check compared text only).

    Mutant tried: the image count left out of the late-edit check: no warning,
    ``late_edits`` stays 0."""
    from tests.integrations.test_livekit import _speak

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            manager = foundation.manager
            late_model, early_model = ScriptedLLM([["One."]]), ScriptedLLM([["Two."]])
            late = _LateImageAgent(manager=manager, context_id="late", instructions="Be brief.")
            early = _EarlyImageAgent(manager=manager, context_id="early", instructions="Be brief.")
            with caplog.at_level(logging.WARNING, logger="turnloom.integrations.livekit"):
                for agent, model in ((late, late_model), (early, early_model)):
                    async with AgentSession(llm=model) as session:
                        await session.start(agent)
                        await _speak(session, "What is this?")
            assert (late.late_edits, early.late_edits) == (1, 0)
            assert [r.getMessage() for r in caplog.records] == [
                "TurnloomAgent 'late': LiveKit's user message "
                f"{late._user_item!r} was edited after turn {late._turn!r} was committed; "
                "turnloom keeps the committed text (13 characters), not the edit (13 "
                "characters) (images: 0 committed, 1 in the edit): edit new_message before "
                "calling TurnloomAgent.on_user_turn_completed"
            ]
            assert _contents(late_model.seen[0])[1] == ("user", ["What is this?"])
            assert _contents(early_model.seen[0])[1] == (
                "user",
                ["What is this?", ("image", URL, "auto")],
            )

    asyncio.run(main())


class _ImageNoteAgent(TurnloomAgent):
    """Adds host notes to ``turn_ctx`` (the RAG pattern), one with an image only."""

    async def on_user_turn_completed(
        self, turn_ctx: llm.ChatContext, new_message: llm.ChatMessage
    ) -> None:
        turn_ctx.add_message(role="assistant", content=[llm.ImageContent(image=URL)])
        turn_ctx.add_message(role="assistant", content=["Fact: bags go to gate 4.", PNG_IMAGE])
        await super().on_user_turn_completed(turn_ctx, new_message)


PNG_IMAGE = llm.ImageContent(image=PNG)


def test_a_host_notes_images_are_counted_not_dropped_silently(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Invariant: a host note reaches the model as text; its images (an image-only note
    too) cannot, and are counted in ``note_images_dropped`` with one warning, while the
    note's text still reaches the model. Before the fix they vanished without a trace.

    Mutant tried: no _drop_note_images call: the counter stays 0, no warning."""
    from tests.integrations.test_livekit import _shape, _speak

    async def main() -> None:
        async with Foundation(gateway="openai_chat") as foundation:
            model = ScriptedLLM([["Gate 4."]])
            agent = _ImageNoteAgent(
                manager=foundation.manager, context_id="call-1", instructions="Be brief."
            )
            with caplog.at_level(logging.WARNING, logger="turnloom.integrations.livekit"):
                async with AgentSession(llm=model) as session:
                    await session.start(agent)
                    await _speak(session, "Where is my bag?")
            assert agent.note_images_dropped == 2
            assert [r.getMessage().split(" (LiveKit message")[0] for r in caplog.records] == [
                "TurnloomAgent 'call-1': a host note"
            ]
            notes = ("notes", "assistant_message_1: Fact: bags go to gate 4.")
            assert _shape(model.seen[0]) == [
                ("system", "Be brief."),
                ("user", "Where is my bag?"),
                notes,
            ]

    asyncio.run(main())
