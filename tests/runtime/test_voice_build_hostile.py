"""Hostile voice hosts and build callers: barge-ins (``record_interrupted``,
``retract_turn``) and hosts misusing ``build`` / ``request_body`` / ``request_bytes``.

The tests under "findings" failed when they were written (each comment quotes the
contract it holds the code to); the others pin behaviour that held. Every async test
runs on asyncio and on trio.
"""

from __future__ import annotations

import copy
from typing import Any

import anyio
import msgspec
import pytest

from tests.runtime.helpers import SYSTEM, BlockingGateway, assistant, call, result, user
from turnloom.areas import OneShotNotice
from turnloom.context import (
    GatewayType,
    HistoryLimits,
    Message,
    Role,
    TextPart,
    ToolCallPart,
    played_count,
    played_prefix,
)
from turnloom.context.cache import PromptCache
from turnloom.errors import (
    DuplicateIdError,
    InvalidArgumentError,
    InvalidMessageError,
    PlayedTextMismatchError,
    UnknownContextError,
    UnknownTurnError,
    UnpairedResultError,
)
from turnloom.runtime import (
    ContextContribution,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    TurnSnapshot,
)

pytestmark = pytest.mark.anyio

GATEWAYS = [g.value for g in GatewayType]
FRESH = (ContextContribution(name="time", content="09:00"),)


def snap(turn_id: str, text: str, context_id: str = "c", first: bool = False) -> TurnSnapshot:
    return TurnSnapshot(
        context_id=context_id,
        turn_id=turn_id,
        input=(user(text),),
        instructions=(SYSTEM,) if first else None,
    )


def req(turn_id: str, context_id: str = "c", **kw: Any) -> ContextPrepareRequest:
    return ContextPrepareRequest(context_id=context_id, turn_id=turn_id, **kw)


def texts(items: Any) -> list[Any]:
    return [item.get("content") for item in items]


def speaking(text: str, call_id: str = "k1") -> Message:
    return Message(
        role=Role.assistant,
        content=(
            TextPart(text=text),
            ToolCallPart(call_id=call_id, name="look", arguments='{"q": [1, 2]}'),
        ),
    )


def scribble(value: Any) -> None:
    """Change every dict and list reachable from ``value`` in place (a careless host)."""
    if isinstance(value, dict):
        for key in list(value):
            scribble(value[key])
        value["HOST"] = 1
    elif isinstance(value, list):
        for item in value:
            scribble(item)
        value.append("HOST")


# -- findings -----------------------------------------------------------------


def test_played_text_cut_never_claims_a_number_after_a_sentence_end() -> None:
    """Contract (turnloom.context.played_count): "So a cut lands at a word boundary of the
    output and never drifts by the TTS's normalisation; it can only be wrong by the words
    of an edit at the very end", and "history never claims words that may not have been
    heard".

    The played transcript aligns with the output's first four words with no edit at all
    ("twelve" = "12"), yet the digits "12" and "3" of two different sentences are merged
    into one number token, so the cut claims "3", the start of a sentence nobody heard.
    """
    reply = assistant("Your seat is 12. 3 bags are included.")
    cut = played_count(reply, "your seat is twelve")
    assert reply.text[:cut] == "Your seat is 12."  # observed: "Your seat is 12. 3"


def test_played_text_cut_never_claims_later_items_of_a_spoken_list() -> None:
    """Contract (played_count): "it can only be wrong by the words of an edit at the very
    end" / "history never claims words that may not have been heard".

    "gates four" aligns exactly with "Gates 4"; the comma-separated numbers after it are
    merged into the same number token, so the recorded reply claims 5, 6 and 7 were said.
    """
    reply = assistant("Gates 4, 5, 6 and 7 are open.")
    cut = played_count(reply, "gates four")
    assert reply.text[:cut] == "Gates 4,"  # observed: "Gates 4, 5, 6 and 7"


async def test_build_recorded_on_a_removed_calls_prefix_never_takes_a_new_calls_outputs() -> None:
    """Contract (ContextManager.build): "When the turn is no longer held (evicted,
    retracted, its context removed), there are no recorded outputs to add"; docs/voice.md:
    "a context created again with the same id never serves those requests".

    The old prefix's context was removed and a new call reuses its context and turn ids;
    ``build(old_prefix, recorded=True)`` looks the outputs up by ids and splices the new
    call's reply into the old call's input (a cross-call leak), in request_bytes too.
    """
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "first call", first=True))
        old = await manager.prepare(req("t1"))
        manager.record("c", "t1", [assistant("old reply")])
        manager.remove_context("c")
        expected = texts(manager.build(old, recorded=True))
        assert expected == ["You are an airline agent.", "first call"]
        manager.accept_turn(snap("t1", "second call", first=True))
        manager.record("c", "t1", [assistant("the new caller's reply")])
        # observed: [..., "first call", "the new caller's reply"]
        assert texts(manager.build(old, recorded=True)) == expected
        assert b"new caller" not in manager.request_bytes(old, recorded=True)


async def test_a_prepare_in_flight_when_its_turn_is_retracted_does_not_deliver_it() -> None:
    """Contract (Voice.retract_turn): "retracting it keeps it out of every later input"
    and "a later prepare of it raises UnknownTurnError" (remove_context, the other
    call-level edit, settles the preparations in flight).

    The prepare of t2 is rendering in the worker when the host retracts t2 (a cough);
    after retract_turn returned, the requester still receives an input that holds the
    retracted false start "uh" and it is counted as prepared (observed: delivered,
    prepared_total == 1).
    """
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, worker_threads=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        manager.record("c", "t1", [assistant("hello")])
        manager.accept_turn(snap("t2", "uh"))
        gateway.hold = True
        outcome: list[Any] = []

        async def prepares() -> None:
            try:
                prefix = await manager.prepare(req("t2", contributions=FRESH))
                outcome.append(texts(prefix.items))
            except UnknownTurnError as exc:
                outcome.append(type(exc))

        async with anyio.create_task_group() as group:
            group.start_soon(prepares)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            manager.voice.retract_turn("c", "t2")
            gateway.release.set()
        gateway.hold = False
        assert outcome == [UnknownTurnError]
        assert manager.statistics().preparations.pending == 0


def test_played_text_in_another_unicode_normalisation_form_is_not_another_reply() -> None:
    """Contract (Voice.record_interrupted): played_text is "matched against the output's
    text by the rule of played_count (words, case, punctuation and numbers normalised),
    so the TTS's normalisation does not move the cut"; PlayedTextMismatchError means "a
    transcript of something else".

    The TTS reports the very words the model wrote, decomposed (NFD: "e" + U+0301), as
    macOS and some STT engines emit them. The combining marks are not word characters,
    so every accented word differs: observed PlayedTextMismatchError (0 of 3 words match)
    instead of the cut after "crème,".
    """
    reply = assistant("Caf\u00e9 cr\u00e8me, s'il vous pla\u00eet.")
    played = "cafe\u0301 cre\u0300me"  # the same two words, NFD
    assert reply.text[: played_count(reply, played)] == "Caf\u00e9 cr\u00e8me,"


# -- held: barge-in door -------------------------------------------------------

BAD_COUNTS: list[dict[str, Any]] = [
    {"played": True},
    {"played": False},
    {"played": -1},
    {"played": 1.0},
    {"played": "3"},
    {},
    {"played": 0, "played_text": ""},
    {"played": None, "played_text": None},
]
BAD_TEXTS: list[dict[str, Any]] = [{"played_text": b"hi"}, {"played_text": 3}]


async def _state(manager: ContextManager, turn_id: str) -> tuple[Any, ...]:
    prefix = await manager.prepare(req(turn_id))
    return manager.statistics(), manager.history("c").turn_messages(turn_id), prefix.items


async def test_bad_barge_in_inputs_get_their_typed_error_and_change_nothing() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        manager.record("c", "t1", [assistant("ok")])
        manager.accept_turn(snap("t2", "and?"))
        before = await _state(manager, "t2")
        stats = manager.statistics()
        reply = speaking("Hello there.")
        for kwargs in BAD_COUNTS + BAD_TEXTS:
            field = "played_text" if kwargs in BAD_TEXTS else "played"
            with pytest.raises(InvalidMessageError) as caught:
                manager.voice.record_interrupted("c", "t2", reply, **kwargs)
            assert caught.value.field == field
            async with manager.invocation("c", "t2") as invocation:
                with pytest.raises(InvalidMessageError) as caught:
                    invocation.record_interrupted(reply, **kwargs)
                assert caught.value.field == field
        for output in (user("x"), Message(role=Role.tool, content="x"), None, {"role": "x"}):
            with pytest.raises(InvalidMessageError) as caught:
                manager.voice.record_interrupted("c", "t2", output, played=1)  # type: ignore[arg-type]
            assert caught.value.field == "output"
        with pytest.raises(PlayedTextMismatchError):
            manager.voice.record_interrupted("c", "t2", reply, played_text="the weather is sunny")
        for bad_ids, error in (
            ((None, "t2"), InvalidMessageError),
            (("c", 5), InvalidMessageError),
            (("c\ud800", "t2"), InvalidMessageError),
            (("zz", "t2"), UnknownContextError),
            (("c", "zz"), UnknownTurnError),
        ):
            with pytest.raises(error):
                manager.voice.record_interrupted(*bad_ids, reply, played=3)  # type: ignore[arg-type]
        assert manager.statistics().history == stats.history
        assert manager.history("c").turn_messages("t2") == before[1]
        assert (await manager.prepare(req("t2"))).items == before[2]


@pytest.mark.parametrize(
    ("played", "text"),
    [
        (0, None),
        (5, "Hello"),
        (12, "Hello there."),  # the exact end
        (10**6, "Hello there."),  # past the end keeps all
    ],
)
async def test_played_counts_cut_exactly_as_documented(played: int, text: str | None) -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        reply = assistant("Hello there.")
        recorded = manager.voice.record_interrupted("c", "t1", reply, played=played)
        outputs = manager.history("c").turn_messages("t1")[1:]
        if text is None:
            assert (recorded, outputs) == (0, ())
            assert manager.statistics().history.dropped_blank_outputs_total == 1
        else:
            assert recorded == 1
            assert [m.text for m in outputs] == [text]


def test_played_prefix_counts_code_points_through_emoji_and_combining_marks() -> None:
    reply = assistant("Cafe\u0301 \U0001f44d\U0001f3fd ok")
    assert played_prefix(reply, 4).text == "Cafe"  # the combining accent is cut off
    assert played_prefix(reply, 5).text == "Cafe\u0301"
    assert played_prefix(reply, 7).text == "Cafe\u0301 \U0001f44d"  # skin tone cut off
    assert played_prefix(reply, 8).text == "Cafe\u0301 \U0001f44d\U0001f3fd"
    # A transcript with no words (only an emoji, a lone surrogate) played nothing.
    assert played_count(reply, "\U0001f44d") == 0
    assert played_count(reply, "\ud800") == 0


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_an_interrupted_tool_call_leaves_a_valid_next_input(gateway: str) -> None:
    """A barge-in on a reply that made a call, landing after the next turn was accepted
    and prepared: the next prepare excludes the open call and passes the provider rules."""
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        gw = manager.gateway
        manager.accept_turn(snap("t1", "hi", first=True))
        first = await manager.prepare(req("t1", contributions=FRESH))
        manager.accept_turn(snap("t2", "stop"))
        await manager.prepare(req("t2"))
        assert manager.voice.record_interrupted("c", "t1", speaking("Sure, checking."), played=5)
        held = manager.history("c").turn_messages("t1")[-1]
        assert [type(p).__name__ for p in held.parts] == ["TextPart", "ToolCallPart"]
        assert held.text == "Sure,"
        after = await manager.prepare(req("t2"))
        body = manager.request_body(after)
        assert gw.validate(body[gw.items_field]) == []
        assert b'"look"' not in msgspec.json.encode(body)  # the open call is excluded
        assert b"Sure," in msgspec.json.encode(body)
        built = manager.request_body(first, recorded=True)
        assert gw.validate(built[gw.items_field]) == []


async def test_cancelling_a_rendering_prepare_then_accepting_the_next_turn() -> None:
    gateway = BlockingGateway()
    async with Foundation(gateway=gateway, worker_threads=1) as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        manager.areas.attach("c", OneShotNotice("NOTICE"))
        gateway.hold = True
        async with anyio.create_task_group() as group:

            async def prepares() -> None:
                await manager.prepare(req("t1", contributions=FRESH))

            group.start_soon(prepares)
            await anyio.to_thread.run_sync(gateway.entered.wait, 10)
            group.cancel_scope.cancel()
            # The render is still running in its thread: the host moves on at once (the
            # door renders on this thread, so only the worker's render stays held).
            gateway.hold = False
            manager.voice.record_interrupted("c", "t1", assistant("Partial reply."), played=7)
            manager.accept_turn(snap("t2", "next"))
            gateway.release.set()
        prefix = await manager.prepare(req("t2"))
        assert texts(prefix.items) == [
            "You are an airline agent.",
            "hi",
            "Partial",
            "next",
            "NOTICE",
        ]
        again = await manager.prepare(req("t2"))
        assert texts(again.items) == ["You are an airline agent.", "hi", "Partial", "next"]
        stats = manager.statistics().preparations
        assert (stats.pending, stats.discarded_total, stats.prepared_total) == (0, 1, 2)


# -- held: build misuse --------------------------------------------------------


async def test_build_refuses_foreign_prefixes_and_misused_continuations() -> None:
    async with Foundation() as first, Foundation() as second:
        manager = first.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        second.manager.accept_turn(snap("t1", "hi", first=True))
        prefix = await manager.prepare(req("t1"))
        foreign = await second.manager.prepare(req("t1"))
        for method in (manager.build, manager.request_body, manager.request_bytes):
            with pytest.raises(InvalidMessageError):
                method(foreign)
            with pytest.raises(InvalidMessageError):
                method(msgspec.structs.replace(prefix))
        manager.record("c", "t1", [speaking("one"), result("k1")])
        recorded_result = manager.history("c").turn_messages("t1")[-1]
        manager.accept_turn(snap("t2", "next"))
        p2 = await manager.prepare(req("t2"))
        # A result recorded under another turn answers no call of this continuation.
        with pytest.raises(UnpairedResultError):
            manager.build(p2, [recorded_result])
        twice = Message(role=Role.assistant, content="same", id="m1")
        with pytest.raises(DuplicateIdError):
            manager.build(p2, [twice, twice])
        no_id = assistant("again")
        assert texts(manager.build(p2, [no_id, user("u"), no_id]))[-3:] == ["again", "u", "again"]
        assert texts(manager.build(p2)) == texts(p2.items)


@pytest.mark.parametrize("gateway", GATEWAYS)
async def test_reserved_fields_are_refused_by_request_body_and_request_bytes(gateway: str) -> None:
    reserved = {
        "openai_chat": ["messages"],
        "openai_responses": ["input", "instructions"],
        "anthropic": ["messages", "system"],
        "gemini": ["contents", "systemInstruction", "system_instruction"],
    }[gateway]
    async with Foundation(gateway=gateway) as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        prefix = await manager.prepare(req("t1"))
        for key in [*reserved, 5]:
            for method in (manager.request_body, manager.request_bytes):
                with pytest.raises(InvalidArgumentError):
                    method(prefix, fields={key: "x"})
        for value in (float("nan"), [float("inf")], "\ud800", {"a": [float("nan")]}):
            for method in (manager.request_body, manager.request_bytes):
                with pytest.raises(InvalidArgumentError):
                    method(prefix, fields={"model": value})


async def test_build_on_retracted_and_evicted_turns_adds_no_outputs() -> None:
    async with Foundation(history_limits=HistoryLimits(max_turns=2)) as foundation:
        manager = foundation.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        manager.record("c", "t1", [assistant("a1")])
        manager.accept_turn(snap("t2", "uh"))
        p2 = await manager.prepare(req("t2"))
        manager.voice.retract_turn("c", "t2")
        assert manager.build(p2, recorded=True) == manager.build(p2)
        p1_items = texts(p2.items)
        assert p1_items == ["You are an airline agent.", "hi", "a1", "uh"]
        manager.accept_turn(snap("t3", "x"))
        p3 = await manager.prepare(req("t3"))
        manager.record("c", "t3", [assistant("a3")])
        manager.accept_turn(snap("t4", "y"))
        manager.accept_turn(snap("t5", "z"))
        assert "t3" not in manager.history("c").turn_ids
        assert texts(manager.build(p3, recorded=True)) == texts(p3.items)


@pytest.mark.parametrize("gateway", GATEWAYS)
@pytest.mark.parametrize("cache", [False, True])
async def test_returned_values_are_unshared_and_request_bytes_encodes_request_body(
    gateway: str, cache: bool
) -> None:
    async with Foundation(gateway=gateway, prompt_cache=PromptCache() if cache else None) as f:
        manager = f.manager
        manager.accept_turn(snap("t1", "hi", first=True))
        manager.record("c", "t1", [assistant("a1")])
        manager.accept_turn(snap("t2", "go"))
        prefix = await manager.prepare(req("t2", contributions=FRESH))
        manager.record("c", "t2", [speaking("checking"), result("k1", "found")])
        continuation = [assistant("next"), call("k1"), result("k1", "again")]  # k1 renamed
        fields = {"model": "m", "temperature": 0.5}
        items = copy.deepcopy(manager.build(prefix, continuation, recorded=True))
        body = copy.deepcopy(
            manager.request_body(prefix, continuation, recorded=True, fields=fields)
        )
        encoded = manager.request_bytes(prefix, continuation, recorded=True, fields=fields)
        assert msgspec.json.encode(body) == encoded
        for _ in range(3):
            scribble(list(manager.build(prefix, continuation, recorded=True)))
            got = manager.request_body(prefix, continuation, recorded=True, fields=fields)
            scribble([v for k, v in got.items() if k not in fields])
            scribble(list(prefix.items))
            assert list(manager.build(prefix, continuation, recorded=True)) == list(items)
            assert manager.request_body(prefix, continuation, recorded=True, fields=fields) == body
            assert manager.request_bytes(prefix, continuation, recorded=True, fields=fields) == (
                encoded
            )
        # The continuation list mutated in place between two builds.
        continuation[0] = assistant("changed")
        changed = manager.request_body(prefix, continuation, recorded=True, fields=fields)
        assert b"changed" in msgspec.json.encode(changed)
        assert msgspec.json.encode(changed) == manager.request_bytes(
            prefix, continuation, recorded=True, fields=fields
        )
        later = await manager.prepare(req("t2", contributions=FRESH))
        assert b"HOST" not in msgspec.json.encode(list(later.items))
