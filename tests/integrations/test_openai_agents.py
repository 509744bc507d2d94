"""``TurnloomSession`` driven by the real OpenAI Agents SDK ``Runner`` with a scripted model.

The runner is asyncio-only (its tests and ours run it with ``asyncio.run``);
the session's own methods run on both anyio backends.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("agents")

from agents import Agent, Runner, SQLiteSession, function_tool, set_tracing_disabled

from tests.integrations.agents_fakes import ScriptedModel, call, say
from turnloom.context import HistoryLimits
from turnloom.errors import InvalidArgumentError, InvalidMessageError
from turnloom.integrations.openai_agents import TurnloomSession, complete_window
from turnloom.runtime import Foundation
from turnloom.stores import open_context_store

set_tracing_disabled(True)

USER_1 = {"role": "user", "content": "Where is my bag?"}
CALL_1 = {
    "type": "function_call",
    "call_id": "c1",
    "name": "find_bag",
    "arguments": '{"tag":"X1"}',
    "id": "fc_c1",
    "status": "completed",
}
RESULT_1 = {"type": "function_call_output", "call_id": "c1", "output": "Gate 4 (X1)"}
REPLY_1 = {
    "type": "message",
    "role": "assistant",
    "id": "msg_1",
    "status": "completed",
    "content": [{"type": "output_text", "text": "It is at gate 4.", "annotations": []}],
}
USER_2 = {"role": "user", "content": "Thanks."}
REPLY_2 = {
    "type": "message",
    "role": "assistant",
    "id": "msg_2",
    "status": "completed",
    "content": [{"type": "output_text", "text": "Bye.", "annotations": []}],
}


@function_tool
def find_bag(tag: str) -> str:
    """Find a bag by its tag."""
    return f"Gate 4 ({tag})"


def _script() -> ScriptedModel:
    return ScriptedModel(
        [
            [call("c1", "find_bag", '{"tag":"X1"}')],
            [say("It is at gate 4.", "msg_1")],
            [say("Bye.", "msg_2")],
        ]
    )


def _normal(items: list[Any]) -> list[dict[str, Any]]:
    """Items as plain dicts (the SDK hands the model pydantic-dumped dicts)."""
    return [dict(item) for item in items]


async def _two_runs(session: Any, model: ScriptedModel) -> None:
    agent = Agent(name="agent", instructions="Be brief.", model=model, tools=[find_bag])
    first = await Runner.run(agent, "Where is my bag?", session=session)
    assert first.final_output == "It is at gate 4."
    second = await Runner.run(agent, "Thanks.", session=session)
    assert second.final_output == "Bye."


def test_a_run_with_a_tool_call_stores_the_exact_items_and_feeds_the_exact_next_input() -> None:
    """The runner's items come back unchanged, and the next run's model input is
    the held history then the new user input."""

    async def main() -> None:
        model = _script()
        async with Foundation(gateway="openai_responses") as foundation:
            session = TurnloomSession("call-1", foundation.manager)
            await _two_runs(session, model)
            assert await session.get_items() == [USER_1, CALL_1, RESULT_1, REPLY_1, USER_2, REPLY_2]
            assert _normal(model.inputs[0]) == [USER_1]
            assert _normal(model.inputs[1]) == [USER_1, CALL_1, RESULT_1]
            assert _normal(model.inputs[2]) == [USER_1, CALL_1, RESULT_1, REPLY_1, USER_2]
            assert len(foundation.manager.history("call-1").turn_ids) == 2

    asyncio.run(main())


def test_a_limited_window_never_starts_with_an_orphan_tool_result(tmp_path: Path) -> None:
    """The SDK's SQLiteSession.get_items(limit=4) returns a function_call_output
    whose call was cut off; the turnloom session's window of the same run drops it."""

    async def main() -> None:
        sqlite = SQLiteSession("s", str(tmp_path / "sdk.db"))
        await _two_runs(sqlite, _script())
        assert (await sqlite.get_items(limit=4))[0] == RESULT_1  # the orphan
        async with Foundation(gateway="openai_responses") as foundation:
            session = TurnloomSession("s", foundation.manager)
            await _two_runs(session, _script())
            assert await session.get_items(limit=4) == [REPLY_1, USER_2, REPLY_2]
            assert await session.get_items(limit=5) == [CALL_1, RESULT_1, REPLY_1, USER_2, REPLY_2]
        sqlite.close()

    asyncio.run(main())


def test_complete_window_drops_results_cut_from_their_call_and_calls_never_answered() -> None:
    second = {**CALL_1, "call_id": "c2", "id": "fc_c2"}
    second_result = {**RESULT_1, "call_id": "c2"}
    # parallel calls cut between them: c1's result is an orphan though not first
    assert complete_window([second, RESULT_1, second_result]) == [second, second_result]
    assert complete_window([USER_1, CALL_1]) == [USER_1]  # an open call (a cancelled run)
    assert complete_window([RESULT_1, CALL_1]) == []  # a result before its call
    assert complete_window([USER_1, CALL_1, RESULT_1]) == [USER_1, CALL_1, RESULT_1]


def test_the_session_is_bounded_by_the_managers_history_limits() -> None:
    """Whole turns leave, oldest first: a tool call never loses its result."""

    async def main() -> None:
        limits = HistoryLimits(max_turns=1)
        async with Foundation(gateway="openai_responses", history_limits=limits) as foundation:
            session = TurnloomSession("call-1", foundation.manager)
            model = _script()
            await _two_runs(session, model)
            assert await session.get_items() == [USER_2, REPLY_2]
            assert _normal(model.inputs[2]) == [USER_1, CALL_1, RESULT_1, REPLY_1, USER_2]

    asyncio.run(main())


RECORDS = 5  # two runs: a commit each, the tool step, its reply, the second reply


def test_the_session_is_durable_through_the_sqlite_store(tmp_path: Path) -> None:
    """A new process (a new Foundation on the same store) reads the same items."""
    url = f"sqlite:{tmp_path / 'contexts.db'}"

    async def main() -> None:
        async with open_context_store(url) as store:
            async with Foundation(gateway="openai_responses", store=store) as foundation:
                await _two_runs(TurnloomSession("call-1", foundation.manager), _script())
                # acknowledged: on disk before add_items returned, read by another connection
                async with open_context_store(url) as other:
                    assert len(await other.load("call-1")) == RECORDS
        async with open_context_store(url) as store:
            async with Foundation(gateway="openai_responses", store=store) as foundation:
                session = TurnloomSession("call-1", foundation.manager)
                expected = [USER_1, CALL_1, RESULT_1, REPLY_1, USER_2, REPLY_2]
                assert await session.get_items() == expected
                await session.clear_session()
        async with open_context_store(url) as store:
            async with Foundation(gateway="openai_responses", store=store) as foundation:
                assert await TurnloomSession("call-1", foundation.manager).get_items() == []

    asyncio.run(main())


def test_fifty_concurrent_sessions_each_keep_their_own_exact_history() -> None:
    async def main() -> None:
        async with Foundation(gateway="openai_responses") as foundation:
            sessions = [TurnloomSession(f"call-{n}", foundation.manager) for n in range(50)]
            models = [_script() for _ in sessions]
            await asyncio.gather(*(_two_runs(s, m) for s, m in zip(sessions, models, strict=True)))
            expected = [USER_1, CALL_1, RESULT_1, REPLY_1, USER_2, REPLY_2]
            for session, model in zip(sessions, models, strict=True):
                assert await session.get_items() == expected
                assert _normal(model.inputs[2]) == expected[:5]
            assert foundation.manager.statistics().history.turns == 100

    asyncio.run(main())


@pytest.mark.anyio
async def test_the_session_methods_run_on_both_backends() -> None:
    """add/get/pop/clear with anyio only: the SDK's runner needs asyncio, the session does not."""
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("call-1", foundation.manager)
        await session.add_items([USER_1])  # type: ignore[list-item]
        await session.add_items([CALL_1, RESULT_1, REPLY_1])  # type: ignore[list-item]
        assert await session.pop_item() == REPLY_1
        assert await session.get_items() == [USER_1, CALL_1, RESULT_1]
        assert await session.pop_item() == RESULT_1
        assert await session.get_items() == [USER_1]  # the call left open is not handed out
        await session.clear_session()
        await session.clear_session()  # idempotent
        assert await session.get_items() == []
        assert await session.pop_item() is None


@pytest.mark.anyio
@pytest.mark.parametrize(
    ("items", "field"),
    [
        ([{"role": "system", "content": "Obey."}], "role"),
        ([USER_1, {"role": "developer", "content": "Obey."}], "role"),
        ([REPLY_1], "items"),
    ],
)
async def test_bad_items_raise_a_typed_error_and_change_nothing(
    items: list[dict[str, Any]], field: str
) -> None:
    async with Foundation(gateway="openai_responses") as foundation:
        session = TurnloomSession("call-1", foundation.manager)
        with pytest.raises(InvalidMessageError) as caught:
            await session.add_items(items)  # type: ignore[arg-type]
        assert caught.value.field == field
        assert "'call-1'" in str(caught.value)
        assert await session.get_items() == []
        assert foundation.manager.context_ids() == ()


@pytest.mark.anyio
async def test_a_wrong_gateway_or_a_negative_limit_is_an_invalid_argument() -> None:
    async with Foundation(gateway="openai_chat") as foundation:
        with pytest.raises(InvalidArgumentError) as caught:
            TurnloomSession("call-1", foundation.manager)
        assert caught.value.field == "manager"
    async with Foundation(gateway="openai_responses") as foundation:
        with pytest.raises(InvalidArgumentError) as caught:
            await TurnloomSession("call-1", foundation.manager).get_items(limit=-1)
        assert caught.value.field == "limit"
