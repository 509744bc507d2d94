"""The render handoff's bare loop primitives (``turnloom.runtime._wakeup``).

Invariants: a Signal wakes its one waiter exactly once, whether set before or
after the wait; a waiter cancelled while it waits raises the cancellation and
a later ``set`` is a no-op (on trio it must not reschedule a task that left:
that would corrupt the run); ``call_soon`` runs the call on the loop's thread
from any thread, without waiting for it, and raises one of ``gone`` once the
loop has finished (the render thread then stops instead of crashing).
"""

from __future__ import annotations

import threading

import anyio
import pytest

from turnloom.runtime._wakeup import LoopHooks, loop_hooks

pytestmark = pytest.mark.anyio


async def test_a_signal_set_before_its_wait_returns_at_once() -> None:
    signal = loop_hooks().signal()
    signal.set()
    signal.set()  # idempotent
    with anyio.fail_after(10):
        await signal.wait()


async def test_a_signal_wakes_its_waiter_once_set_by_another_task() -> None:
    signal = loop_hooks().signal()
    woken: list[str] = []

    async def waiter() -> None:
        await signal.wait()
        woken.append("woken")

    async with anyio.create_task_group() as group:
        group.start_soon(waiter)
        await anyio.wait_all_tasks_blocked()
        assert woken == []  # still parked: nothing set it
        signal.set()
    assert woken == ["woken"]


async def test_a_cancelled_waiter_raises_and_a_later_set_is_a_no_op() -> None:
    signal = loop_hooks().signal()
    with anyio.CancelScope() as scope:

        async def cancel_when_parked() -> None:
            await anyio.wait_all_tasks_blocked()
            scope.cancel()

        async with anyio.create_task_group() as group:
            group.start_soon(cancel_when_parked)
            await signal.wait()
    assert scope.cancelled_caught
    signal.set()  # the waiter is gone: nothing to wake, nothing raised
    await anyio.sleep(0)  # a stray wake-up would surface here (trio: TrioInternalError)


async def test_call_soon_runs_the_call_on_the_loop_thread_from_another_thread() -> None:
    hooks = loop_hooks()
    loop_thread = threading.get_ident()
    ran = loop_hooks().signal()
    seen: list[tuple[int, int]] = []

    def on_loop(value: int) -> None:
        seen.append((value, threading.get_ident()))
        ran.set()

    await anyio.to_thread.run_sync(hooks.call_soon, on_loop, 7)
    with anyio.fail_after(10):
        await ran.wait()
    assert seen == [(7, loop_thread)]


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_call_soon_raises_one_of_gone_once_the_loop_has_finished(backend: str) -> None:
    box: list[LoopHooks] = []

    async def capture() -> None:
        box.append(loop_hooks())

    anyio.run(capture, backend=backend)
    hooks = box[0]
    with pytest.raises(hooks.gone):
        hooks.call_soon(print, "never")
