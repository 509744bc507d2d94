"""A host process for the crash and race tests (run with ``python -m``).

``load URL BACKEND``: claims ``CONTEXTS`` contexts and runs rounds forever; in
round ``r`` every context, concurrently, commits turn ``t<r>``, prepares it
and records its outputs (a tool call and its result, then an answer); then it
flushes and prints ``ACK r``. The test kills it with SIGKILL at any moment.

``stall URL BACKEND``: owns context ``race``, commits and flushes turns
``a0``, ``a1``, ... printing ``ACK <turn id>``; after ``a2`` it prints
``STALL`` and blocks its event loop on stdin (a stalled host), then goes on
writing; it prints ``STALE`` and exits when it learns it lost the lease.
"""

from __future__ import annotations

import sys

import anyio

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from tests.stores.helpers import hosting
from turnloom.context import Message
from turnloom.context.history import HistoryLimits
from turnloom.errors import StaleLeaseError
from turnloom.runtime import ContextManager, ContextPrepareRequest, TurnSnapshot

CONTEXTS = 6
LIMITS = HistoryLimits(low_water=1.0, max_turns=4)
# Renewed every 10 s: a loaded machine never lets the worker's leases lapse while it
# runs. The tests end them as a stalled or killed host's leases end (expire_lease).
LEASE_TTL = 30.0


def turn_input(context_id: str, index: int) -> tuple[Message, ...]:
    return (user(f"{context_id} question {index} " + "x" * (index % 7)),)


def turn_outputs(context_id: str, index: int) -> tuple[Message, ...]:
    call_id = f"{context_id}-k{index}"
    return (call(call_id), result(call_id, f"found {index}"), assistant(f"answer {index}"))


def snapshot(context_id: str, index: int) -> TurnSnapshot:
    return TurnSnapshot(
        context_id=context_id,
        turn_id=f"t{index}",
        input=turn_input(context_id, index),
        instructions=(SYSTEM,) if index == 0 else None,
    )


async def _turn(manager: ContextManager, context_id: str, index: int) -> None:
    await manager.leases.claim(context_id)
    manager.accept_turn(snapshot(context_id, index))
    await manager.prepare(ContextPrepareRequest(context_id=context_id, turn_id=f"t{index}"))
    outputs = turn_outputs(context_id, index)
    async with manager.invocation(context_id, f"t{index}") as invocation:
        invocation.record(outputs[:2])
    manager.record(context_id, f"t{index}", outputs[2:])


async def load(url: str) -> None:
    async with hosting(url, history_limits=LIMITS, lease_ttl=LEASE_TTL) as foundation:
        manager = foundation.manager
        index = 0
        while True:
            async with anyio.create_task_group() as group:
                for c in range(CONTEXTS):
                    group.start_soon(_turn, manager, f"c{c}", index)
            await manager.leases.flush()
            print(f"ACK {index}", flush=True)
            index += 1


async def stall(url: str) -> None:
    async with hosting(url, lease_ttl=LEASE_TTL, owner="stalled-host") as foundation:
        manager = foundation.manager
        await manager.leases.claim("race")
        index = 0
        try:
            while True:
                manager.accept_turn(
                    TurnSnapshot(context_id="race", turn_id=f"a{index}", input=(user("a"),))
                )
                await manager.leases.flush("race")
                print(f"ACK a{index}", flush=True)
                if index == 2:
                    print("STALL", flush=True)
                    sys.stdin.readline()  # blocks the event loop: no renewals
                index += 1
        except StaleLeaseError as exc:
            print(f"STALE {exc.context_id}", flush=True)


if __name__ == "__main__":
    mode, url, backend = sys.argv[1:4]
    anyio.run(load if mode == "load" else stall, url, backend=backend)
