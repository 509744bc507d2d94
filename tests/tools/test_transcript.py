"""The one transcript driver: which message becomes a turn, a reply or an output."""

from __future__ import annotations

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.context import Message, Role
from turnloom.tools.transcript import Output, Reply, Turn, snapshot, turn_ids, walk

DEVELOPER = Message(role=Role.developer, content="Be brief.")


def _shape(steps: list[Turn | Reply | Output]) -> list[tuple[str, int, str]]:
    return [(type(s).__name__, s.index, s.turn_id) for s in steps]


def test_walk_maps_roles_to_turns_replies_and_outputs() -> None:
    """Invariant: instructions ride on the next turn; each user message opens a
    turn; assistant messages are replies and tool results outputs of the current
    turn; a reply before the first turn belongs to no turn and is skipped."""
    transcript = [
        assistant("orphan"),
        SYSTEM,
        user("one"),
        call("c1"),
        result("c1"),
        assistant("done"),
        DEVELOPER,
        user("two"),
        assistant("ok"),
    ]
    steps = list(walk(transcript))
    assert _shape(steps) == [
        ("Turn", 2, "t0"),
        ("Reply", 3, "t0"),
        ("Output", 4, "t0"),
        ("Reply", 5, "t0"),
        ("Turn", 7, "t1"),
        ("Reply", 8, "t1"),
    ]
    first, second = steps[0], steps[4]
    assert isinstance(first, Turn) and isinstance(second, Turn)
    assert (first.instructions, second.instructions) == ((SYSTEM,), (DEVELOPER,))
    assert (first.number, second.number) == (0, 1)
    assert snapshot("c", second).instructions == (DEVELOPER,)
    assert snapshot("c", second).input == (user("two"),)


def test_walk_stops_before_the_turn_after_max_turns() -> None:
    transcript = [user("one"), assistant("a"), user("two"), assistant("b"), user("three")]
    assert _shape(list(walk(transcript, max_turns=2))) == [
        ("Turn", 0, "t0"),
        ("Reply", 1, "t0"),
        ("Turn", 2, "t1"),
        ("Reply", 3, "t1"),
    ]


def test_one_id_iterator_numbers_several_walks_as_one_history() -> None:
    ids = turn_ids("turn-")
    a = [s.turn_id for s in walk([user("x"), user("y")], ids=ids)]
    b = [s.turn_id for s in walk([user("z")], ids=ids)]
    assert (a, b) == (["turn-0", "turn-1"], ["turn-2"])
