"""Hostile hosts against Context Areas: an area's ``render()`` larger than the history's
per-item byte cap (``HistoryLimits.max_item_bytes``). Runs on asyncio and on trio.

The test under "findings" fails on the code it was written against; the one under
"attacks that held" passes.
"""

from __future__ import annotations

import msgspec
import pytest

from tests.runtime.helpers import user
from turnloom.areas import OneShotNotice
from turnloom.context.history import HistoryLimits
from turnloom.errors import AreaCallbackError, ItemTooLargeError
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot

pytestmark = pytest.mark.anyio

CAP = 1000


def _limits() -> HistoryLimits:
    return HistoryLimits(max_item_bytes=CAP)


def _sizes(items: object) -> list[int]:
    return [len(msgspec.json.encode(item)) for item in items]  # type: ignore[attr-defined]


# -- findings ---------------------------------------------------------------------------


async def test_an_area_rendering_an_item_over_the_per_item_cap_is_not_delivered() -> None:
    """Contract (docs/guarantees.md): "A message over the per-item byte cap is rejected
    when it arrives."; (docs/design.md) "Everything is bounded: pending preparations,
    history, per-item bytes."; and ``areas.route`` refuses the very same item with
    ``ItemTooLargeError`` ("its JSON encoding is over the history's per-item byte cap").

    What an area's ``render()`` returned was never sized against the cap: a notice of
    5,000 bytes under ``max_item_bytes=1000`` was handed to the provider as one 5,028-byte
    item, no error, nothing counted. Now the area's render fails as any failing render
    does: ``AreaCallbackError`` caused by ``ItemTooLargeError`` (5,028 bytes, cap 1,000)."""
    async with Foundation(gateway="openai_chat", history_limits=_limits()) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        big = "x" * 5000
        with pytest.raises(ItemTooLargeError):  # routed, the same item is refused at the door
            manager.areas.route("c", {"role": "user", "content": big})
        manager.areas.attach("c", OneShotNotice(big))
        request = ContextPrepareRequest(context_id="c", turn_id="t1")
        with pytest.raises(AreaCallbackError) as raised:
            await manager.prepare(request)
        cause = raised.value.__cause__
        assert isinstance(cause, ItemTooLargeError)
        assert (cause.size, cause.limit, raised.value.phase) == (5028, CAP, "render")
        # The failing area is dropped, as any area whose render fails; the next input is
        # the turn's alone, and no item of it is over the cap.
        prefix = await manager.prepare(request)
        assert prefix.items == ({"role": "user", "content": "hi"},)
        assert manager.statistics().areas.attached == 0


# -- attacks that held ------------------------------------------------------------------


async def test_an_area_rendering_within_the_cap_is_delivered_whole() -> None:
    """Contract (``AreaPass``, Safe points): the area section is appended after the turn's
    input; a notice just within the cap arrives whole, counted in ``bytes``."""
    async with Foundation(gateway="openai_chat", history_limits=_limits()) as foundation:
        manager = foundation.manager
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
        text = "y" * (CAP - 40)
        manager.areas.attach("c", OneShotNotice(text))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t1"))
        assert prefix.items[prefix.area_start :] == ({"role": "user", "content": text},)
        assert max(_sizes(prefix.items)) <= CAP
        assert prefix.bytes == sum(_sizes(prefix.items))
