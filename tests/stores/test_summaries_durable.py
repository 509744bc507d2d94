"""Summary compaction and pruning are durable: SQLite and Redis, a restart, a SIGKILL.

Invariants: a host taking a context over replays to the history its owner had,
summary turn and pruned results included; a host killed at any moment of a
conversation that summarizes as it goes leaves a log that restores to either
the turns before a summary or the summary (never both, never neither): every
acknowledged turn is held or named by the one summary turn, which comes first,
and the restored input equals a cold render of the restored history.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
from pathlib import Path

import anyio
import anyio.abc
import pytest

from tests.runtime.helpers import SYSTEM, user
from tests.stores.helpers import expire_lease, hosting
from tests.stores.summary_worker import LIMITS, configure, outputs
from turnloom.context import PrunePolicy, Role, TextPart
from turnloom.context.summaries import is_summary_turn
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

ROOT = Path(__file__).resolve().parents[2]


async def _converse(manager: ContextManager, first: int, last: int) -> None:
    for index in range(first, last):
        manager.accept_turn(
            TurnSnapshot(
                context_id="s",
                turn_id=f"t{index}",
                input=(user(f"question {index}"),),
                instructions=(SYSTEM,) if index == 0 else None,
            )
        )
        async with manager.invocation("s", f"t{index}") as invocation:
            invocation.record(outputs(index))
        with anyio.fail_after(10):
            while manager.summaries.running("s"):  # a summarizer faster than the host
                await anyio.sleep(0.001)


async def _cold_items(cold: ContextManager, manager: ContextManager) -> None:
    """The restored context's prepared input equals a cold host's given the same turns."""
    view = manager.history("s")
    for i, turn_id in enumerate(view.turn_ids):
        given = view.turn_input(turn_id)
        cold.accept_turn(
            TurnSnapshot(
                context_id="s",
                turn_id=turn_id,
                input=given,
                instructions=view.pinned if i == 0 else None,
            )
        )
        cold.record("s", turn_id, view.turn_messages(turn_id)[len(given) :])
    request = ContextPrepareRequest(context_id="s", turn_id=view.turn_ids[-1])
    assert (await manager.prepare(request)).items == (await cold.prepare(request)).items


async def test_a_takeover_replays_summaries_and_prunings(
    store_url: str, kind: tuple[str, str]
) -> None:
    """Invariant: the history a second host restores from the store is the owner's, byte
    for byte: the summary turn first, pruned results pruned, the same turn ids."""
    async with hosting(store_url, history_limits=LIMITS) as owner:
        manager = owner.manager
        configure(manager)
        await manager.leases.claim("s")
        await _converse(manager, 0, 14)
        expected = manager.history("s")
        assert is_summary_turn(expected.turn_ids[0])
        assert manager.statistics().summaries.finished_total >= 2
        assert manager.statistics().summaries.turns_pruned_total >= 3
        await manager.leases.flush()
        messages = {t: expected.turn_messages(t) for t in expected.turn_ids}
    async with (
        hosting(store_url, history_limits=LIMITS) as taker,
        Foundation(history_limits=LIMITS) as cold,
    ):
        expire_lease(store_url, "s")
        assert await taker.manager.leases.claim("s") is True
        view = taker.manager.history("s")
        assert view.turn_ids == expected.turn_ids
        assert {t: view.turn_messages(t) for t in view.turn_ids} == messages
        await _cold_items(cold.manager, taker.manager)


async def _open_worker(url: str, backend: str) -> anyio.abc.Process:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return await anyio.open_process(
        [sys.executable, "-m", "tests.stores.summary_worker", url, backend], cwd=ROOT, env=env
    )


async def test_a_host_killed_mid_compaction_leaves_old_turns_or_the_summary(
    store_url: str, kind: tuple[str, str]
) -> None:
    """Invariant: after SIGKILL at an arbitrary point of a summarizing conversation, the
    restored history holds at most one summary turn, first; each acknowledged turn is
    held or named by that summary, never both; held turns are consecutive up to the
    newest; the prepared input equals a cold render."""
    process = await _open_worker(store_url, kind[1])
    acked = -1
    try:
        assert process.stdout is not None
        buffer = b""
        with anyio.fail_after(60):
            while acked < 17:
                while b"\n" not in buffer:
                    buffer += await process.stdout.receive()
                line, _, buffer = buffer.partition(b"\n")
                assert line.startswith(b"ACK "), line
                acked = int(line.split()[1])
        process.kill()
        await process.wait()
    finally:
        with anyio.CancelScope(shield=True):
            if process.returncode is None:
                with contextlib.suppress(ProcessLookupError):
                    process.kill()
                await process.wait()
            await process.aclose()
    assert process.returncode == -9
    async with (
        hosting(store_url, history_limits=LIMITS) as restored,
        Foundation(history_limits=LIMITS) as cold,
    ):
        manager = restored.manager
        expire_lease(store_url, "s")
        assert await manager.leases.claim("s") is True
        view = manager.history("s")
        ids = view.turn_ids
        summaries = [t for t in ids if is_summary_turn(t)]
        assert len(summaries) == 1 and ids[0] == summaries[0]
        summary_text = " ".join(
            p.text for m in view.turn_messages(ids[0]) for p in m.parts if isinstance(p, TextPart)
        )
        named = {int(n) for n in re.findall(r"question (\d+)", summary_text)}
        held = [int(t[1:]) for t in ids[1:]]
        assert held == list(range(held[0], held[-1] + 1))  # consecutive
        assert held[-1] >= acked
        assert not named & set(held)  # never both
        assert set(range(held[0])) <= named  # never neither (no eviction at these limits)
        assert manager.statistics().history.evicted_turns_total == 0
        await _cold_items(cold.manager, manager)


async def test_a_pruned_responses_reply_restores_with_its_id_and_its_input_form(
    store_url: str, kind: tuple[str, str]
) -> None:
    """Invariant: a Responses output message whose reasoning pruning dropped restores from
    the store as the owner held it (its Message.id, the history's key, and the
    ``"unreasoned"`` hint), so the taker's prepared input sends it in input form, no id."""
    async with hosting(store_url, gateway="openai_responses") as owner:
        manager = owner.manager
        gateway = manager.gateway
        manager.summaries.prune = PrunePolicy(keep_turns=1, note="[pruned]")
        await manager.leases.claim("s")
        for n in range(3):
            manager.accept_turn(
                TurnSnapshot(context_id="s", turn_id=f"t{n}", input=(user(f"q{n}"),))
            )
            reasoning = {
                "type": "reasoning",
                "id": f"rs_{n}",
                "summary": [],
                "encrypted_content": "e",
            }
            reply = {
                "type": "message",
                "role": "assistant",
                "id": f"msg_{n}",
                "status": "completed",
                "content": [{"type": "output_text", "text": f"a{n}", "annotations": []}],
            }
            manager.record("s", f"t{n}", gateway.parse_items([reasoning, reply]))
            with anyio.fail_after(10):
                while manager.statistics().summaries.turns_pruned_total < n:
                    await anyio.sleep(0.001)
        expected = manager.history("s")
        messages = {t: expected.turn_messages(t) for t in expected.turn_ids}
        await manager.leases.flush()
    async with hosting(store_url, gateway="openai_responses") as taker:
        expire_lease(store_url, "s")
        assert await taker.manager.leases.claim("s") is True
        view = taker.manager.history("s")
        assert {t: view.turn_messages(t) for t in view.turn_ids} == messages
        replies = [m for m in view.messages() if m.role is Role.assistant]
        assert [(m.id, (m.layout or {}).get("unreasoned")) for m in replies] == [
            ("msg_0", True),
            ("msg_1", True),
            ("msg_2", None),
        ]
        taker.manager.accept_turn(TurnSnapshot(context_id="s", turn_id="t3", input=(user("q3"),)))
        request = ContextPrepareRequest(context_id="s", turn_id="t3")
        items = (await taker.manager.prepare(request)).items
        assert [i.get("id") for i in items if i.get("role") == "assistant"] == [
            None,
            None,
            "msg_2",
        ]
