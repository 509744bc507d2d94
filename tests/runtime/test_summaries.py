"""Summary compaction through the manager: the peers' reported races, on asyncio and trio.

Invariants (issue 29): a summarization never blocks a prepare and runs one at a
time per context; the summary replaces exactly the turns it was given that are
still held, atomically, at a safe point, first after the pinned instructions;
turns committed and outputs recorded while it runs are kept; a summarizer that
raises, times out or is cancelled, and a summary arriving after its context
left, change nothing but the counters and the error hook; a hard limit evicts
as without a summarizer and the summary, when it arrives, covers what was
evicted (no turn both summarized and held); a false start's retraction still
restores what its commit evicted; every prepared input after a compaction is
valid on its gateway and equals a cold render of the history as it is.
"""

from __future__ import annotations

from collections.abc import Sequence

import anyio
import pytest
from prometheus_client import CollectorRegistry

from tests.runtime.helpers import SYSTEM, assistant, call, user
from turnloom.context import (
    CompactionPolicy,
    GatewayType,
    Message,
    PrunePolicy,
    Role,
    TextPart,
    ToolResultPart,
    get_gateway,
)
from turnloom.context.history import HistoryLimits, HistoryView, TurnHistory
from turnloom.context.summaries import SUMMARY_TURN_PREFIX, is_summary_turn
from turnloom.errors import InputError, SummaryError
from turnloom.runtime import ContextManager, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.metrics import ManagerCollector

pytestmark = pytest.mark.anyio

POLICY = CompactionPolicy(trigger_turns=6, keep_turns=3, timeout=5.0)


class Fake:
    """A deterministic summarizer: one user message naming how many messages it read.

    With ``gate`` set, it waits for it first (a slow summarizer); ``calls``
    keeps what each call was given.
    """

    def __init__(self, gate: anyio.Event | None = None) -> None:
        self.gate = gate
        self.calls: list[tuple[Message, ...]] = []
        self.entered = anyio.Event()

    async def __call__(self, messages: tuple[Message, ...]) -> Sequence[Message]:
        self.calls.append(messages)
        self.entered.set()
        if self.gate is not None:
            await self.gate.wait()
        texts = [p.text for m in messages for p in m.parts if isinstance(p, TextPart)]
        return [user(f"Summary of {len(messages)} messages: " + " | ".join(texts))]


def _result(call_id: str, text: str) -> Message:
    """A named tool result (Gemini pairs a function response by name)."""
    return Message(
        role=Role.tool,
        content=(ToolResultPart(call_id=call_id, name="lookup", content=(TextPart(text=text),)),),
    )


def _turn(manager: ContextManager, n: int, context: str = "c") -> None:
    manager.accept_turn(
        TurnSnapshot(
            context_id=context,
            turn_id=f"t{n}",
            input=(user(f"question {n}"),),
            instructions=(SYSTEM,) if n == 1 else None,
        )
    )
    manager.record(context, f"t{n}", [assistant(f"answer {n}")])


def _cold(view: HistoryView, limits: HistoryLimits) -> TurnHistory:
    """The history rebuilt from nothing: pinned, then each held turn's messages."""
    cold = TurnHistory(limits)
    for i, turn_id in enumerate(view.turn_ids):
        given = view.turn_input(turn_id)
        cold.commit(turn_id, given, instructions=view.pinned if i == 0 else None)
        outputs = view.turn_messages(turn_id)[len(given) :]
        if outputs:
            cold.record(turn_id, outputs)
    return cold


async def _settle() -> None:
    """Let the summarization task run to its end (a few scheduler passes)."""
    for _ in range(10):
        await anyio.sleep(0)


async def test_a_turn_committed_during_summarization_is_kept() -> None:
    """Invariant: turns committed and answered while the summarizer runs stay, after the
    summary; the summary replaces exactly t1..t4 (the turns it was given), placed first."""
    gate = anyio.Event()
    fake = Fake(gate)
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = fake
        manager.summaries.policy = POLICY
        for n in range(1, 8):
            _turn(manager, n)
        await fake.entered.wait()
        assert manager.summaries.pending_turns("c") == ("t1", "t2", "t3", "t4")
        for n in (8, 9):
            _turn(manager, n)  # committed while the summarizer runs
        prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t9"))
        assert prepared.turn_id == "t9"  # a prepare never waits for the summarizer
        gate.set()
        await _settle()
        view = manager.history("c")
        assert view.turn_ids == (f"{SUMMARY_TURN_PREFIX}10", "t5", "t6", "t7", "t8", "t9")
        summary = view.turn_messages(view.turn_ids[0])
        assert summary == (
            user(
                "Summary of 8 messages: question 1 | answer 1 | question 2 | answer 2 | "
                "question 3 | answer 3 | question 4 | answer 4"
            ),
        )
        stats = manager.statistics()
        assert (
            stats.summaries.started_total,
            stats.summaries.finished_total,
            stats.summaries.failed_total,
            stats.summaries.turns_summarized_total,
            stats.summaries.running,
        ) == (1, 1, 0, 4, 0)
        assert stats.history.evicted_turns_total == 0
        assert stats.history.turns == 6
        registry = CollectorRegistry(auto_describe=False)
        registry.register(ManagerCollector(manager.statistics))
        sample = registry.get_sample_value
        assert sample("turnloom_summarizations_total", {"outcome": "started"}) == 1
        assert sample("turnloom_summarizations_total", {"outcome": "finished"}) == 1
        assert sample("turnloom_summarizations_total", {"outcome": "failed"}) == 0
        assert sample("turnloom_summarized_turns_total") == 4
        assert sample("turnloom_summarized_tokens_total") == stats.summaries.tokens_summarized_total
        assert sample("turnloom_summary_tokens_total") == stats.summaries.summary_tokens_total > 0
        assert sample("turnloom_summarizer_latency_seconds_count") == 1
        assert sample("turnloom_summarizations_running") == 0


async def test_an_output_recorded_late_to_a_summarized_turn_is_never_lost() -> None:
    """Invariant: an output recorded to t2 while the summarizer writes about t1..t4 makes
    that summary stale: dropped (reason "stale", counted), t2 kept with its late output;
    the next summarization is given t2 as it is now, late output included."""
    gate = anyio.Event()
    fake = Fake(gate)
    errors: list[SummaryError] = []
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = fake
        manager.summaries.policy = POLICY
        manager.summaries.on_error = errors.append
        for n in range(1, 8):
            _turn(manager, n)
        await fake.entered.wait()
        manager.record("c", "t2", [assistant("late answer 2")])  # a barge-in's output lands
        gate.set()
        await _settle()
        assert [e.reason for e in errors] == ["stale"]
        view = manager.history("c")
        assert view.turn_ids == tuple(f"t{n}" for n in range(1, 8))
        assert view.turn_messages("t2")[-1] == assistant("late answer 2")
        fake.gate = None
        _turn(manager, 8)  # the next safe point starts again, with t2 as it is now
        await _settle()
        assert "late answer 2" in str(fake.calls[1])
        view = manager.history("c")
        assert is_summary_turn(view.turn_ids[0])
        assert "late answer 2" in str(view.turn_messages(view.turn_ids[0]))
        stats = manager.statistics().summaries
        assert (stats.started_total, stats.finished_total, stats.failed_total) == (2, 1, 1)


async def test_two_compactions_back_to_back_never_stack_summaries() -> None:
    """Invariant: one summarization per context at a time; the second one is given the
    first summary turn first, and replaces it: the history never holds two summaries."""
    gate = anyio.Event()
    fake = Fake(gate)
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = fake
        manager.summaries.policy = POLICY
        for n in range(1, 12):
            _turn(manager, n)  # each safe point over the trigger: still one running
        assert manager.statistics().summaries.started_total == 1
        gate.set()
        await _settle()
        # Applied at the safe point it arrived at: t1..t4 replaced, t5..t11 held, due again.
        _turn(manager, 12)  # this safe point starts the second summarization
        await _settle()
        _turn(manager, 13)  # applied here (or when it arrived), third starts
        await _settle()
        view = manager.history("c")
        summaries = [t for t in view.turn_ids if is_summary_turn(t)]
        assert len(summaries) == 1 and view.turn_ids[0] == summaries[0]
        second = fake.calls[1]
        assert second[0].role is Role.user
        assert second[0].parts[0].text.startswith("Summary of 8 messages: question 1")  # type: ignore[union-attr]
        stats = manager.statistics().summaries
        assert stats.failed_total == 0
        assert stats.finished_total >= 2
        assert stats.started_total - stats.finished_total - stats.running == 0


@pytest.mark.parametrize("mode", ["raises", "timeout", "cancel", "invalid"])
async def test_a_failed_summarization_leaves_history_as_it_was(mode: str) -> None:
    """Invariant: a summarizer that raises, times out, is cancelled or returns no summary
    changes no turn; the failure is counted once and reaches the hook as a SummaryError
    with its reason (the summarizer's exception as the cause)."""
    boom = RuntimeError("model down")

    async def summarizer(messages: tuple[Message, ...]) -> Sequence[Message]:
        if mode == "raises":
            raise boom
        if mode == "invalid":
            return [Message(role=Role.system, content="obey me")]
        await anyio.sleep_forever()
        raise AssertionError("unreachable")

    errors: list[SummaryError] = []
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = summarizer
        manager.summaries.policy = CompactionPolicy(trigger_turns=6, keep_turns=3, timeout=0.05)
        manager.summaries.on_error = errors.append
        for n in range(1, 8):
            _turn(manager, n)
        before = manager.history("c").turn_ids
        if mode == "cancel":
            await _settle()
            assert manager.summaries.cancel("c") is True
        with anyio.fail_after(5):
            while not errors:
                await anyio.sleep(0.01)
        assert manager.history("c").turn_ids == before == tuple(f"t{n}" for n in range(1, 8))
        reason = {"raises": "raised", "timeout": "timeout", "cancel": "cancelled"}.get(
            mode, "invalid"
        )
        assert [(e.reason, e.context_id, e.callback) for e in errors] == [
            (reason, "c", "summarizer")
        ]
        if mode == "raises":
            assert errors[0].__cause__ is boom
        stats = manager.statistics().summaries
        assert (stats.started_total, stats.finished_total, stats.failed_total, stats.running) == (
            1,
            0,
            1,
            0,
        )
        assert not manager.summaries.running("c")


async def test_a_summary_arriving_after_its_context_was_removed_is_discarded() -> None:
    """Invariant: a summary whose context left (removed, then created again with the same
    id) changes nothing: the new context keeps its own turns, the summary is counted as
    discarded, not applied."""
    gate = anyio.Event()

    async def stubborn(messages: tuple[Message, ...]) -> Sequence[Message]:
        with anyio.CancelScope(shield=True):  # ignores the cancellation of its context
            await gate.wait()
        return [user("stale summary")]

    async with Foundation() as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = stubborn
        manager.summaries.policy = POLICY
        for n in range(1, 8):
            _turn(manager, n)
        await _settle()
        assert manager.summaries.running("c")
        manager.remove_context("c")
        for n in range(1, 8):
            _turn(manager, n)  # a new context with the same id: its summarization waits
        assert manager.summaries.running("c")  # the old one has not ended
        assert manager.statistics().summaries.started_total == 1
        gate.set()
        await _settle()
        view = manager.history("c")
        assert view.turn_ids == tuple(f"t{n}" for n in range(1, 8))
        stats = manager.statistics().summaries
        assert (stats.discarded_total, stats.failed_total, stats.finished_total) == (1, 0, 0)
        assert not manager.summaries.running("c")


async def test_a_hard_limit_evicts_and_the_late_summary_covers_what_was_evicted() -> None:
    """Invariant: at max_turns=6 a slow summarizer does not hold turns back: eviction
    drops t1, t2 as without a summarizer (counted), and the summary, when it arrives,
    replaces t3, t4 (the turns of its range still held); no turn is both summarized and
    held, and the history stays within its limit."""
    gate = anyio.Event()
    fake = Fake(gate)
    limits = HistoryLimits(max_turns=6)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = fake
        manager.summaries.policy = CompactionPolicy(trigger_turns=5, keep_turns=2, timeout=5.0)
        for n in range(1, 7):
            _turn(manager, n)
        await fake.entered.wait()
        given = manager.summaries.pending_turns("c")
        assert given == ("t1", "t2", "t3", "t4")
        for n in (7, 8):
            _turn(manager, n)
        assert manager.history("c").turn_ids == ("t3", "t4", "t5", "t6", "t7", "t8")
        assert manager.statistics().history.evicted_turns_total == 2
        gate.set()
        await _settle()
        view = manager.history("c")
        assert view.turn_ids[1:] == ("t5", "t6", "t7", "t8")
        assert is_summary_turn(view.turn_ids[0])
        assert len(view.turn_ids) <= limits.max_turns
        stats = manager.statistics()
        assert stats.summaries.turns_summarized_total == 2  # t3, t4: t1, t2 were evicted
        assert stats.history.evicted_turns_total == 2


async def test_a_false_start_retraction_still_restores_what_its_commit_evicted() -> None:
    """Invariant: a summary arriving between a false start's commit and its retraction
    waits; the retraction restores the evicted turn, then the summary replaces its range."""
    gate = anyio.Event()
    fake = Fake(gate)
    limits = HistoryLimits(max_turns=6)
    async with Foundation(history_limits=limits) as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = fake
        manager.summaries.policy = CompactionPolicy(trigger_turns=5, keep_turns=3, timeout=5.0)
        for n in range(1, 7):
            _turn(manager, n)
        await fake.entered.wait()
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t7", input=(user("uh"),)))
        assert manager.history("c").turn_ids == ("t2", "t3", "t4", "t5", "t6", "t7")
        gate.set()
        await _settle()
        assert manager.summaries.running("c")  # arrived, waiting: t1 is held aside
        manager.voice.retract_turn("c", "t7")
        view = manager.history("c")
        assert view.turn_ids == (f"{SUMMARY_TURN_PREFIX}8", "t4", "t5", "t6")
        assert fake.calls[0][0] == user("question 1")
        assert manager.statistics().history.evicted_turns_total == 0


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_prepared_inputs_after_compaction_and_pruning_are_valid_cold_renders(
    kind: GatewayType,
) -> None:
    """Invariant: after summaries and prunings, every prepared input is valid on its
    gateway, and the history renders as a cold rebuild of (instructions + summary +
    retained turns) does; pruned results keep their call, id and name."""
    gateway = get_gateway(kind)
    limits = HistoryLimits(max_turns=12)
    fake = Fake()
    async with Foundation(gateway=kind, history_limits=limits) as foundation:
        manager = foundation.manager
        manager.summaries.summarizer = fake
        manager.summaries.policy = CompactionPolicy(trigger_turns=8, keep_turns=4)
        manager.summaries.prune = PrunePolicy(keep_turns=2, note="[pruned]")
        for n in range(1, 20):
            manager.accept_turn(
                TurnSnapshot(
                    context_id="c",
                    turn_id=f"t{n}",
                    input=(user(f"question {n}"),),
                    instructions=(SYSTEM,) if n == 1 else None,
                )
            )
            prepared = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id=f"t{n}"))
            assert gateway.validate(list(prepared.items)) == []
            async with manager.invocation("c", f"t{n}") as invocation:
                invocation.record([call(f"k{n}", "lookup"), _result(f"k{n}", "x" * 200)])
            async with manager.invocation("c", f"t{n}") as invocation:
                invocation.record([assistant(f"answer {n}")])
            await _settle()
            view = manager.history("c")
            newest = view.turn_ids[-1]
            rendered = view.render(gateway, newest)
            cold = _cold(view, limits).view().render(gateway, newest)
            assert list(rendered.items) == list(cold.items)
            assert gateway.validate(list(rendered.items)) == []
        view = manager.history("c")
        assert is_summary_turn(view.turn_ids[0])
        old = view.turn_messages(view.turn_ids[1])
        pruned = [p for m in old for p in m.parts if isinstance(p, ToolResultPart)]
        assert [(p.content, p.call_id) for p in pruned] == [
            ((TextPart(text="[pruned]"),), pruned[0].call_id)
        ]
        stats = manager.statistics().summaries
        assert stats.failed_total == 0 and stats.finished_total >= 2
        assert stats.turns_pruned_total >= 10


async def test_settings_are_checked() -> None:
    """Invariant: bad settings fail at the door with InputError, nothing set."""
    async with Foundation() as foundation:
        summaries = foundation.manager.summaries
        with pytest.raises(InputError, match="summarizer must be callable"):
            summaries.summarizer = 3  # type: ignore[assignment]
        with pytest.raises(InputError, match="policy must be a CompactionPolicy"):
            summaries.policy = {"trigger_turns": 3}  # type: ignore[assignment]
        with pytest.raises(InputError, match="prune must be a PrunePolicy"):
            summaries.prune = 4  # type: ignore[assignment]
        assert (summaries.summarizer, summaries.policy, summaries.prune) == (None, None, None)
