"""A long-running voice daemon: many calls coming and going over one Foundation and one store.

Run: ``python examples/daemon.py`` (no extra needed). No framework: the daemon
drives turnloom itself, with a scripted stand-in for the model, and keeps its
contexts durable in a SQLite store (``redis://host:6379/0`` for a fleet of
daemons). 200 calls run, at most 20 at once; each asks a question, the model
calls a tool and answers, the caller barges in (the reply is recorded as far
as it was played, matched by its played text), a cough is a false start, and
the caller hangs up. Every tenth caller hangs up while the model streams.
Runs on asyncio or trio: ``python examples/daemon.py --backend trio``.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path

import anyio

from turnloom import ContextManager, ContextPrepareRequest, Foundation, Message, Role, TurnSnapshot
from turnloom.context import TextPart, ToolCallPart, ToolResultPart
from turnloom.stores import open_context_store

SYSTEM = Message(role=Role.system, content="You are an airline agent. Be brief.")
REPLY = "Your bag costs $25 to send on. It leaves at 3:30 PM from gate 12."
PLAYED = "your bag costs twenty-five dollars to send on"  # the TTS's words when cut in
CALLS = 200
AT_ONCE = 20
HEARD: set[str] = set()
STOPPED: list[int] = []


async def model(items: tuple[object, ...], n: int) -> Message:
    """Stands in for the model: calls the tool first, then answers (streaming takes a while)."""
    try:
        await anyio.sleep(0.001 * (n % 7 + 1))
    except anyio.get_cancelled_exc_class():
        STOPPED.append(n)  # remove_context cancelled the model call in flight
        raise
    if not any(isinstance(i, dict) and i.get("role") == "tool" for i in items):
        call = ToolCallPart(call_id=f"k{n}", name="find_bag", arguments='{"tag": "X1"}')
        return Message(role=Role.assistant, content=(call,))
    return Message(role=Role.assistant, content=REPLY)


def find_bag(call: ToolCallPart) -> Message:
    result = ToolResultPart(call_id=call.call_id, content=(TextPart(text="Gate 12"),))
    return Message(role=Role.tool, content=(result,))


def say(manager: ContextManager, context_id: str, turn_id: str, text: str) -> None:
    first = turn_id == "t1"
    manager.accept_turn(
        TurnSnapshot(
            context_id=context_id,
            turn_id=turn_id,
            instructions=(SYSTEM,) if first else None,
            input=(Message(role=Role.user, content=text),),
        )
    )


# --- host code: tool call, barge-in, false start, hang-up ---
async def call(manager: ContextManager, n: int, hang_up_early: bool) -> None:
    cid = f"call-{n}"
    await manager.leases.claim(cid)  # this daemon owns the call (restored if stored)
    say(manager, cid, "t1", "How much to send my bag on?")
    prefix = await manager.prepare(ContextPrepareRequest(context_id=cid, turn_id="t1"))
    async with manager.invocation(cid, "t1") as invocation:
        asked = await model(manager.build(prefix), n)  # tool call
        invocation.record([asked, find_bag(asked.tool_calls[0])])
        if hang_up_early:
            manager.remove_context(cid)  # the caller hung up while the model streams
        reply = await model(manager.build(prefix, recorded=True), n)  # cancelled if hung up
        invocation.record_interrupted(reply, played_text=PLAYED)  # barge-in: as played
    if hang_up_early:
        return
    say(manager, cid, "t2", "uh")
    manager.voice.retract_turn(cid, "t2")  # a false start
    HEARD.add(manager.history(cid).turn_messages("t1")[-1].text)  # what history says it said
    await manager.leases.flush()  # durable before the call ends
    manager.remove_context(cid)  # hang-up


# --- end of host code ---


async def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        url = f"sqlite:{Path(folder) / 'contexts.db'}"
        async with open_context_store(url) as store, Foundation(store=store) as foundation:
            manager = foundation.manager
            slots = anyio.Semaphore(AT_ONCE)
            most = 0

            async def one(n: int) -> None:
                nonlocal most
                async with slots:
                    most = max(most, len(manager.context_ids()) + 1)
                    await call(manager, n, hang_up_early=n % 10 == 9)

            async with anyio.create_task_group() as calls:
                for n in range(CALLS):
                    calls.start_soon(one, n)
            stats = manager.statistics()
            print(f"calls: {CALLS}, at most {AT_ONCE} at once: {most <= AT_ONCE}")
            print(f"model calls cancelled by a hang-up: {len(STOPPED)}")
            print(f"turns retracted as false starts: {stats.history.retracted_turns_total}")
            print(f"prepares: {stats.preparations.prepared_total}")
            print(
                f"contexts held now: {stats.contexts}, model calls in flight: {stats.invocations}"
            )
            await manager.leases.flush()
            logs = [await store.load(f"call-{n}") for n in range(CALLS)]
            print(f"context logs left in the store: {sum(1 for log in logs if log)}")
    print(f"the cut reply, as every call's history holds it: {sorted(HEARD)}")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--backend", choices=("asyncio", "trio"), default="asyncio")
    anyio.run(main, backend=parser.parse_args().backend)
