"""Summary compaction and pruning of real provider traffic: every input stays valid.

The accepted requests of ``../shared/data/provider-recordings`` (parallel tool
calls, thinking blocks with signatures, encrypted reasoning, Gemini thought
signatures, images) are cut into turns at each user message and committed to a
history; then the tool output of every turn but the newest is pruned and the
oldest turns are replaced by a summary. Invariant: the provider's own
``validate()`` finds nothing in the render of the newest turn (pairs whole, no
Gemini step left unsigned, roles as each provider orders them), and the render
equals a cold rebuild of the same history.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.context.gateways._support import PROVIDERS, load_records
from turnloom.context import Message, Role, get_gateway
from turnloom.context.history import TurnHistory, apply_summary, prune_turns, summary_range
from turnloom.context.summaries import SUMMARY_TURN_PREFIX
from turnloom.errors import TurnloomError
from turnloom.tools.transcript import Turn, turn_ids, walk

# Accepted recordings holding two turns or more (each user message opens one).
MULTI_TURN = {"openai_chat": 18, "openai_responses": 27, "anthropic": 23, "gemini": 60}


def _history(messages: list[Message]) -> TurnHistory | None:
    """The messages committed as turns (None when the door refuses the shape)."""
    history = TurnHistory()
    instructions = tuple(m for m in messages if m.role in (Role.system, Role.developer))
    outputs: list[Message] = []
    current: str | None = None
    try:
        for step in walk(messages, ids=turn_ids()):
            if isinstance(step, Turn):
                if current is not None and outputs:
                    history.record(current, outputs)
                outputs = []
                current = step.turn_id
                first = not history.turn_ids
                history.commit(
                    current,
                    [step.input],
                    instructions=instructions if first and instructions else None,
                )
            else:
                outputs.append(step.message)
        if current is not None and outputs:
            history.record(current, outputs)
    except TurnloomError:
        return None
    return history


@pytest.mark.parametrize("provider", PROVIDERS)
def test_pruned_and_summarized_recordings_stay_valid(recordings_dir: Path, provider: str) -> None:
    """Invariant: see the module docstring; every multi-turn recording is exercised."""
    gateway = get_gateway(provider)
    exercised = 0
    for record in load_records(recordings_dir, provider):
        if record["status"] != 200:
            continue
        history = _history(gateway.parse_request(record["request"]))
        if history is None or len(history.turn_ids) < 2:
            continue
        prune_turns(history, 1, "[pruned]")
        ids = summary_range(history, 1)
        if ids:
            apply_summary(
                history, ids, f"{SUMMARY_TURN_PREFIX}1", [Message(role=Role.user, content="s")]
            )
        view = history.view()
        newest = view.turn_ids[-1]
        items = list(view.render(gateway, newest).items)
        assert gateway.validate(items) == [], record["source"]
        cold = TurnHistory()
        for i, turn_id in enumerate(view.turn_ids):
            given = view.turn_input(turn_id)
            cold.commit(
                turn_id, given, instructions=view.pinned if i == 0 and view.pinned else None
            )
            rest = view.turn_messages(turn_id)[len(given) :]
            if rest:
                cold.record(turn_id, rest)
        assert list(cold.view().render(gateway, newest).items) == items, record["source"]
        exercised += 1
    assert exercised == MULTI_TURN[provider]
