"""The main job on real input: tau-bench replayed through the ContextManager.

Must show (issue 2): 150 sessions, 1,808 model calls prepared, 0 errors; every
prepared input equals, message for message, the trajectory's messages before
that assistant reply, with call ids reused from an earlier call renamed (the
callids rule; 227 inputs hold such a reuse); every input validates against
``openai``'s ``ChatCompletionMessageParam``.
"""

from __future__ import annotations

import io
import json
from pathlib import Path
from typing import Any

import anyio
import pytest
from openai.types.chat import ChatCompletionMessageParam
from pydantic import TypeAdapter

from tests.context.gateways._support import ITEM_FIELD, call_sites
from turnloom.areas import OneShotNotice
from turnloom.context import GatewayType, Message, Role
from turnloom.context.callids import rename_call_ids
from turnloom.errors import InputError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.state import state_call_id
from turnloom.tools._stats import percentile
from turnloom.tools.replay import _without_additions, replay, session_ids
from turnloom.tools.trajectories import builtin_trajectories, load_trajectories
from turnloom.tools.workload import generate_trajectories

CHAT_INPUT = TypeAdapter(list[ChatCompletionMessageParam])


def _check_records(
    records: list[dict[str, Any]], sessions: dict[str, list[Any]]
) -> tuple[int, int]:
    """Check each written input against its own trajectory.

    Returns:
        how many inputs, and how many of them differ from the trajectory
        (each only by the renaming of reused call ids).
    """
    positions: dict[str, list[int]] = {
        sid: [i for i, m in enumerate(traj) if m["role"] == "assistant"]
        for sid, traj in sessions.items()
    }
    seen: dict[str, int] = {}
    renamed = 0
    for record in records:
        sid = record["session"]
        k = seen.get(sid, 0)
        seen[sid] = k + 1
        reply = positions[sid][k]
        want = sessions[sid][:reply]
        assert record["messages"] == rename_call_ids(GatewayType.openai_chat, want), (sid, k)
        renamed += record["messages"] != want
        CHAT_INPUT.validate_python(record["messages"])
    assert seen == {sid: len(p) for sid, p in positions.items() if p}
    return len(records), renamed


def test_tau_bench_replays_with_exact_fidelity(tau_bench_path: Path) -> None:
    trajectories, errors = load_trajectories(tau_bench_path)
    assert (len(trajectories), errors) == (150, [])
    out = io.BytesIO()
    summary = anyio.run(lambda: replay(trajectories, out=out, concurrency=8))
    assert summary.errors == ()
    assert (summary.sessions, summary.turns, summary.model_calls) == (150, 1096, 1808)
    # The only normalization: reused call ids renamed, in these 227 inputs.
    assert summary.normalized == 227
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert summary.items == sum(len(r["messages"]) for r in records)
    assert summary.bytes == sum(
        len(json.dumps(m, separators=(",", ":"), ensure_ascii=False).encode())
        for r in records
        for m in r["messages"]
    )
    sessions = dict(zip(session_ids(trajectories), (t.messages for t in trajectories), strict=True))
    assert _check_records(records, sessions) == (1808, 227)
    assert 0 < summary.prepare_p50_ms <= summary.prepare_p99_ms


def test_the_builtin_workload_is_deterministic_and_replays_exactly() -> None:
    assert generate_trajectories(5, seed=3) == generate_trajectories(5, seed=3)
    assert generate_trajectories(5, seed=3) != generate_trajectories(5, seed=4)
    trajectories = builtin_trajectories(12)
    out = io.BytesIO()
    summary = anyio.run(lambda: replay(trajectories, out=out), backend="trio")
    users = sum(m["role"] == "user" for t in trajectories for m in t.messages)
    replies = sum(m["role"] == "assistant" for t in trajectories for m in t.messages)
    assert (summary.sessions, summary.turns, summary.model_calls, summary.errors) == (
        12,
        users,
        replies,
        (),
    )
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    # The generated workload reuses call ids across turns too: 90 inputs.
    sessions = dict(zip(session_ids(trajectories), (t.messages for t in trajectories), strict=True))
    assert _check_records(records, sessions) == (replies, 90)


@pytest.mark.parametrize("kind", [g for g in GatewayType if g is not GatewayType.openai_chat])
def test_tau_bench_replays_through_every_gateway_with_valid_inputs(
    kind: GatewayType, tau_bench_path: Path
) -> None:
    """Issue 4: every prepared input of all 150 sessions passes the gateway's validate()."""
    trajectories, errors = load_trajectories(tau_bench_path)
    assert errors == []
    summary = anyio.run(lambda: replay(trajectories, gateway=kind, concurrency=8))
    assert summary.errors == ()
    assert (summary.sessions, summary.turns, summary.model_calls) == (150, 1096, 1808)


@pytest.mark.parametrize("kind", list(GatewayType))
def test_every_replayed_tau_bench_input_carries_each_call_id_once(
    kind: GatewayType, tau_bench_path: Path
) -> None:
    """Issue 8 must-show: 1,808 inputs, 0 duplicate call ids, each result after its call.

    Counted from the written requests themselves, not through validate(). Before
    the callids rule, 227 of the 1,808 OpenAI Responses inputs held a reused id.
    """
    trajectories, _ = load_trajectories(tau_bench_path)
    out = io.BytesIO()
    summary = anyio.run(lambda: replay(trajectories, gateway=kind, out=out, concurrency=8))
    assert summary.errors == ()
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    duplicates = orphans = calls = 0
    for record in records:
        items = (
            record["messages"]
            if kind is GatewayType.openai_chat
            else record["request"][ITEM_FIELD[kind.value]]
        )
        sites = call_sites(kind.value, items)
        first: dict[str, int] = {}
        for site, index, call_id in sites:
            if site == "call":
                calls += 1
                duplicates += call_id in first
                first.setdefault(call_id, index)
            else:
                orphans += first.get(call_id, index) >= index
    assert (len(records), duplicates, orphans) == (1808, 0, 0)
    assert calls == 6_743  # calls summed over all inputs, the same on every gateway


def test_percentile_is_nearest_rank() -> None:
    values = [float(v) for v in range(1, 101)]
    assert (percentile(values, 50), percentile(values, 99), percentile(values, 100)) == (
        50.0,
        99.0,
        100.0,
    )
    assert percentile([], 50) == 0.0
    assert percentile([7.0], 99) == 7.0


def test_replay_rejects_a_bad_concurrency() -> None:
    with pytest.raises(InputError):
        anyio.run(lambda: replay([], concurrency=0))


@pytest.mark.anyio
async def test_the_documented_additions_are_set_aside_exactly() -> None:
    """What replay compares: the input less the turn's runtime-state pair, the pairs
    earlier turns keep and the area section; nothing else is removed."""
    manager = ContextManager(gateway="openai_chat", behavior_rules="Be brief.")
    async with Foundation(manager) as foundation:
        m = foundation.manager
        ids: set[str] = set()
        expected: list[dict[str, Any]] = []
        for n in (1, 2):
            turn = f"t{n}"
            ids.add(state_call_id("c", turn))
            user = Message(role=Role.user, content=f"question {n}")
            m.accept_turn(TurnSnapshot(context_id="c", turn_id=turn, input=(user,)))
            m.areas.attach("c", OneShotNotice(f"notice {n}"))
            prefix = await m.prepare(ContextPrepareRequest(context_id="c", turn_id=turn))
            expected.append({"role": "user", "content": f"question {n}"})
            assert prefix.area_items > 0 and prefix.state_call_id == state_call_id("c", turn)
            assert _without_additions(prefix, prefix.items, ids) == expected
            # The pairs and the section were there: 2 items per turn's pair, plus the section.
            assert len(prefix.items) == len(expected) + 2 * n + prefix.area_items
            reply = Message(role=Role.assistant, content=f"answer {n}")
            async with m.invocation("c", turn) as invocation:
                invocation.record([reply])
            expected.append({"role": "assistant", "content": f"answer {n}"})
