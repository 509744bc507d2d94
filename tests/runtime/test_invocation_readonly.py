"""An invocation's ids are read-only: what it records to was checked when it began."""

from __future__ import annotations

import pytest

from turnloom.context.message import Message, Role
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.schemas import TurnSnapshot

pytestmark = pytest.mark.anyio


async def test_invocation_ids_cannot_be_reassigned() -> None:
    async with Foundation() as foundation:
        manager = foundation.manager
        manager.accept_turn(
            TurnSnapshot(
                context_id="c", turn_id="t1", input=(Message(role=Role.user, content="hi"),)
            )
        )
        async with manager.invocation("c", "t1") as invocation:
            with pytest.raises(AttributeError):
                invocation.turn_id = 123  # type: ignore[misc, assignment]
            with pytest.raises(AttributeError):
                invocation.context_id = "other"  # type: ignore[misc]
            assert (invocation.context_id, invocation.turn_id) == ("c", "t1")
            assert invocation.record([Message(role=Role.assistant, content="hello")]) == 1
