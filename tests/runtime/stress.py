"""A stress workload: many contexts, random turns, approvals, late outputs and renders
that fail part-way, where every prepared input is compared with a cold render.

Used by the test suite (a short run on each backend) and by
``scripts/stress_render_failures.py`` (at least 100,000 prepares).
"""

from __future__ import annotations

import contextlib
import random
import threading
from collections.abc import Iterator

import anyio
import msgspec

from tests.runtime.helpers import CHAT, SYSTEM, assistant, call, result, user
from turnloom.context import (
    Message,
    NativeContent,
    complete_pairs,
    open_call_ids,
)
from turnloom.context.callids import (
    _REWRITERS,
    CallIdRenamer,
    register_rewriter,
    rename_call_ids,
)
from turnloom.context.gateway import step_join
from turnloom.context.gateways import OpenAIChatGateway
from turnloom.context.history import HistoryLimits
from turnloom.context.pairing import OpenCallPolicy
from turnloom.errors import (
    AmbiguousStepError,
    PairedTurnsTooLargeError,
    StateError,
    TurnTooLargeError,
)
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.runtime.manager import ContextManager


class InjectedRenderError(RuntimeError):
    """The failure a :class:`FlakyGateway` raises."""


class FlakyGateway(OpenAIChatGateway):
    """The OpenAI Chat gateway whose renders raise at random points in worker threads.

    Renders on the thread that created it (the event loop, where the manager
    checks messages at the door) never fail. ``rate`` is the chance that one
    render call in a worker raises :class:`InjectedRenderError`; while
    ``fail_in`` is set to n, the worker render call after the next n fails
    instead (once). The door's render seeds the history's render cache, so a
    worker seldom renders a message itself: within :meth:`failing_renames`
    the call-id rewrite of each item a worker renames (every render renames
    its turns) is such a render call too.
    """

    def __init__(self, rate: float, seed: int) -> None:
        self.rate = rate
        self.fail_in: int | None = None  # when set, the render call after this many fails
        self.failures = 0
        self._random = random.Random(seed)
        self._lock = threading.Lock()
        self._loop_thread = threading.get_ident()

    def _maybe_fail(self) -> None:
        if threading.get_ident() != self._loop_thread:
            with self._lock:
                fail = self._random.random() < self.rate
                if self.fail_in is not None:
                    fail = self.fail_in <= 0
                    self.fail_in = None if fail else self.fail_in - 1
                self.failures += fail
            if fail:
                raise InjectedRenderError("injected render failure")

    def render(self, message: Message) -> list[NativeContent]:
        self._maybe_fail()
        return super().render(message)

    @contextlib.contextmanager
    def failing_renames(self) -> Iterator[None]:
        """Within the block, a worker's call-id rewrite of an OpenAI Chat item may fail."""
        original = _REWRITERS[self.type]

        def rewrite(item: NativeContent, renamer: CallIdRenamer) -> NativeContent:
            self._maybe_fail()
            return original(item, renamer)

        register_rewriter(self.type, rewrite)
        try:
            yield
        finally:
            register_rewriter(self.type, original)


def cold_render(manager: ContextManager, context_id: str, turn_id: str) -> list[NativeContent]:
    """The oracle: the retained history paired as one input, rendered without any cache,
    call ids made unique over the whole list."""
    messages = manager.history(context_id).sent_messages(turn_id)
    completed = complete_pairs(list(messages), open_calls=manager.open_calls, join=step_join(CHAT))
    return rename_call_ids(CHAT.type, [item for m in completed for item in CHAT.render(m)])


class StressReport(msgspec.Struct, frozen=True, kw_only=True):
    """What one stress run did.

    ``prepares`` counts every prepare, ``failed`` those that raised the
    injected error, ``wrong`` the prepared inputs unequal to the oracle and
    ``invalid`` those ``validate()`` rejects.
    """

    prepares: int
    failed: int
    wrong: int
    invalid: int
    injected: int
    approvals: int
    evicted_turns: int


async def run_stress(
    *,
    prepares: int,
    seed: int,
    policy: OpenCallPolicy,
    contexts: int = 8,
    rate: float = 0.05,
    limits: HistoryLimits | None = None,
) -> StressReport:
    """Drive ``contexts`` concurrent conversations until ``prepares`` prepares ran.

    Each context runs in its own task: it commits turns (user text, or the
    results of the calls its newest turn left open, as an approval), records
    outputs (text, one or two calls, results, late outputs to older turns)
    and prepares its newest turn (sometimes an older one, sometimes two at
    once) while the gateway fails renders at random. Contexts with an odd
    index send runtime state (a loop budget), so each prepared turn keeps its
    state pair and later renders carry it. Every successful prepare is
    compared with :func:`cold_render` (the items before its own state pair)
    and checked with ``validate()``.
    """
    gateway = FlakyGateway(rate, seed)
    limits = limits if limits is not None else HistoryLimits(max_turns=4, max_items=14)
    with gateway.failing_renames():
        return await _run(gateway, limits, prepares, seed, policy, contexts)


async def _run(
    gateway: FlakyGateway,
    limits: HistoryLimits,
    prepares: int,
    seed: int,
    policy: OpenCallPolicy,
    contexts: int,
) -> StressReport:
    counts = {"prepares": 0, "failed": 0, "wrong": 0, "invalid": 0, "approvals": 0}
    async with Foundation(
        gateway=gateway,
        history_limits=limits,
        open_calls=policy,
        max_pending_preparations=4 * contexts,
        worker_threads=2,
    ) as foundation:
        manager = foundation.manager

        async def prepare(context_id: str, turn_id: str) -> None:
            if counts["prepares"] >= prepares:
                return
            counts["prepares"] += 1
            # Always the same state for a context: concurrent prepares of its
            # turns keep equal pairs, so the history the oracle reads afterwards
            # is the one each prepare captured.
            budget = 4 if int(context_id.removeprefix("ctx")) % 2 else None
            request = ContextPrepareRequest(
                context_id=context_id, turn_id=turn_id, loop_budget=budget
            )
            # The oracle before and after: a concurrent prepare of another turn
            # of the context may keep that turn's first pair while this one waits.
            before = cold_render(manager, context_id, turn_id)
            try:
                prepared = await manager.prepare(request)
            except InjectedRenderError:
                counts["failed"] += 1
                return
            pair = 0 if prepared.state_call_id is None else 2
            core = list(prepared.items[: prepared.area_start - pair])
            if core not in (
                before,
                cold_render(manager, context_id, turn_id),
            ) or prepared.area_start != len(prepared.items):
                counts["wrong"] += 1
            if CHAT.validate(prepared.items):
                counts["invalid"] += 1

        async def converse(index: int) -> None:
            rng = random.Random(seed * 1_000 + index)
            context_id = f"ctx{index}"
            turn = 0
            manager.accept_turn(
                TurnSnapshot(
                    context_id=context_id,
                    turn_id="t0",
                    input=(user("hello"),),
                    instructions=(SYSTEM,),
                )
            )
            while counts["prepares"] < prepares:
                view = manager.history(context_id)
                newest = view.turn_ids[-1]
                roll = rng.random()
                if roll < 0.25:
                    turn += 1
                    # The newest turn's kept state pair sits between its input and
                    # outputs: it ends the group of calls the input left open.
                    stream = (
                        view.input_messages(newest)
                        + view.turn_state(newest)
                        + view.turn_messages(newest)[len(view.turn_input(newest)) :]
                    )
                    open_ids = open_call_ids(stream)
                    message: list[Message]
                    approval = bool(open_ids) and rng.random() < 0.6
                    if approval:
                        message = [
                            result(i, f"approved {i}") for i in open_ids[: rng.randint(1, 2)]
                        ]
                        if rng.random() < 0.3:
                            message.append(user("and then?"))
                    else:
                        message = [user(f"question {turn}")]
                    # An approval the limits cannot hold together with the turns
                    # it answers is refused and changes nothing.
                    with contextlib.suppress(PairedTurnsTooLargeError):
                        manager.accept_turn(
                            TurnSnapshot(
                                context_id=context_id, turn_id=f"t{turn}", input=tuple(message)
                            )
                        )
                        counts["approvals"] += approval
                elif roll < 0.55:
                    kind = rng.random()
                    n = rng.randint(0, 999)
                    outputs: list[Message]
                    if kind < 0.3:
                        outputs = [assistant(f"answer {n}")]
                    elif kind < 0.6:
                        outputs = [call(f"c{n}"), call(f"d{n}")][: rng.randint(1, 2)]
                    else:
                        outputs = [call(f"c{n}"), result(f"c{n}", f"r{n}")]
                    target = newest if rng.random() < 0.9 else rng.choice(view.turn_ids)
                    # A turn never outgrows the history's limits, a late record
                    # never strands a later turn's results, and a call never
                    # repeats an id of the step it continues: such a record is
                    # refused and changes nothing.
                    with contextlib.suppress(TurnTooLargeError, StateError, AmbiguousStepError):
                        manager.record(context_id, target, outputs)
                elif roll < 0.95:
                    async with anyio.create_task_group() as group:
                        group.start_soon(prepare, context_id, newest)
                        if rng.random() < 0.2:
                            group.start_soon(prepare, context_id, rng.choice(view.turn_ids))
                else:
                    await anyio.sleep(0)

        async with anyio.create_task_group() as group:
            for index in range(contexts):
                group.start_soon(converse, index)
        stats = manager.statistics()
    return StressReport(
        prepares=counts["prepares"],
        failed=counts["failed"],
        wrong=counts["wrong"],
        invalid=counts["invalid"],
        injected=gateway.failures,
        approvals=counts["approvals"],
        evicted_turns=stats.history.evicted_turns_total,
    )
