"""What leaves ``async with Foundation()``: the body's own exception, not a group."""

from __future__ import annotations

import anyio
import pytest

from tests.runtime.helpers import user
from turnloom.errors import TurnloomError, UnknownContextError
from turnloom.runtime import Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio


async def test_a_turnloom_error_in_the_body_leaves_unwrapped() -> None:
    """``except TurnloomError`` catches an error raised by the manager in the body."""
    with pytest.raises(TurnloomError) as info:
        async with Foundation() as foundation:
            foundation.manager.record("nobody", "t1", [user("hi")])
    assert type(info.value) is UnknownContextError
    assert "nobody" in str(info.value)


async def test_any_single_exception_of_the_body_leaves_as_it_was_raised() -> None:
    """The same object, with its traceback: a host's own error is not rewrapped."""
    raised = OSError(98, "Address already in use")
    with pytest.raises(OSError) as info:
        async with Foundation() as foundation:
            foundation.manager.accept_turn(
                TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),))
            )
            raise raised
    assert info.value is raised
    assert info.type is OSError


async def test_the_documented_except_star_form_catches_it_too() -> None:
    """``except*`` matches an unwrapped exception as a group of one."""
    caught: list[BaseException] = []
    try:
        async with Foundation() as foundation:
            foundation.manager.record("nobody", "t1", [user("hi")])
    except* UnknownContextError as group:
        caught.extend(group.exceptions)
    assert [type(e) for e in caught] == [UnknownContextError]


async def test_a_cancelled_body_still_closes_and_raises_nothing_outside_the_scope() -> None:
    """Cancellation is not an error: the scope absorbs it, the Foundation closes."""
    foundation = Foundation()
    with anyio.move_on_after(0) as scope:
        async with foundation:
            await anyio.sleep_forever()
    assert scope.cancelled_caught
    assert foundation.closed
