"""The Foundation's collector policy: full collections walk only what changed.

A full collection of CPython's cyclic collector visits every tracked object
that lives: at 1,000 load-test sessions that is 36-41 ms of CPU on the event
loop, at 5,000 about 220 ms, almost all of it spent on data that has not
changed since the last one. ``gc.freeze()`` moves every tracked object into a
permanent generation that no collection visits (0.01 ms for the same full
collection afterwards). A :class:`FrozenCollector` does that periodically:

- **Open**: ``gc.freeze()`` of what the process holds, without a collection
  (O(1): it splices the generations' lists into the permanent one, as
  CPython's documentation advises before a fork). The first step then walks
  what was allocated since the open, not the whole heap, imports included
  (0.2 ms of CPU in ``turnloom replay`` rather than 17-24 ms).
  Cyclic garbage the process made before the open, and objects alive at the
  open that become cyclic garbage later, are frozen as any object a step
  froze alive: they stay until a thorough step or the close, and are bounded
  by what the process held at the open (counted in the origin, next points).
- **Step** (at most every :attr:`CollectorPolicy.interval` seconds, once the
  process made :attr:`CollectorPolicy.young_collections` young collections
  since the last step, i.e. allocated, or the last step's cost says a step
  now would cost half of :attr:`CollectorPolicy.step_cpu`): one full collection, which visits
  only the objects allocated since the last step, then ``gc.freeze()`` of the
  survivors. Garbage made since the open is collected before it could be
  frozen (garbage from before the open was frozen by it, above). A step is paced
  by its own cost: the next look comes after the time the last step's
  allocations took, times :attr:`CollectorPolicy.step_cpu` over the step's
  CPU (between a 16th of the interval and the interval; a nearer look than
  a step always steps; a wait is at most twice the one before), so
  while the process allocates fast (a ramp-up) each step walks a small set.
  The first look comes a 16th of the interval after the open, and looks come
  a 16th apart until the first step: taken at the first look that finds the
  Foundation holding a context and a history item, so a ramp-up starting at
  the open is walked in small steps from its start, not in one step of its
  first interval. Without them by the interval, young collections decide
  and the looks go back to the interval (as after an idle step).
- **Frozen objects are never collected.** An object frozen while alive that
  later becomes part of unreachable *cyclic* garbage stays until the next
  unfreeze (non-cyclic garbage is freed by reference counting, frozen or
  not). So every step then reads the process's allocated blocks
  (``sys.getallocatedblocks()``: every Python object, frozen garbage
  included; O(pools), 0.1-0.5 ms on a 5,000-session heap, where the frozen
  set's size, ``gc.get_freeze_count()``, walks every frozen object: 40-60 ms
  of a pause of its own). Once they grew past what the live state explains
  (next point), the next step is *thorough*: ``gc.unfreeze()``, one full
  collection of everything (the cold pause the policy otherwise avoids),
  then freeze.
- **Growth the live state explains is not garbage.** Blocks are counted from
  the Foundation's open. The first step and each thorough one take the
  *base*: the blocks then (the first step's base holds no frozen garbage
  past the origin's: only the open froze before it, and what it froze is
  counted in the origin). Each step also notes the blocks per context held
  and per history item held; a step allows ``1 + regrowth`` times the
  largest of the base, the fewest blocks per context seen since the base
  times the contexts now, and the same per item (a step's own rates count
  from the next step: its blocks may hold garbage). So memory that costs a
  fixed amount per context plus one per item (the host's per-session objects
  included) never makes a thorough step with ``regrowth >= 1``, whether
  sessions arrive or histories grow; frozen cyclic garbage is bounded by
  ``regrowth`` times what the live state explains, and so by the limits of
  what the Foundation holds. A host whose memory per context grows (a cache
  per session) makes a thorough step once it doubled, which takes a new base.
  This is why the first step waits for a context and an item: a base with
  nothing live explains no growth until a later step saw both, and a ramp-up
  past ``1 + regrowth`` times that base in between would make a thorough step
  (a walk of everything the ramp-up made); a first step that saw both gives
  rates, at least the cost per unit, that explain every step after it.

The policy is process-wide, as the collector is: ``gc.freeze`` moves every
tracked object of the process, the host's included, and a thorough step
unfreezes objects the host froze itself (the live ones are frozen again).
Another Foundation's growth counts as unexplained (its thorough steps come
sooner, never later). On close the Foundation unfreezes what is frozen, so a
closed Foundation's objects are collectable again.

What a host gives up with the policy on: cyclic garbage made of objects that
lived across a step (at least one look apart) or across the open is
reclaimed only at the next thorough step (or the close; ``gc.collect()``
does not reach it), so memory may reach ``(1 + regrowth)`` times what the
live state explains, counted in allocations (a large buffer is one block),
plus what the process held at the open; ``gc.get_objects()`` does not list
frozen objects. Turn it off with
``Foundation(collector=None)``.
"""

from __future__ import annotations

__all__ = ("CollectorPolicy", "CollectorStatistics", "FrozenCollector")

import gc
import math
import sys
import time
from collections.abc import Callable

import anyio
import msgspec

from turnloom.errors import InputError, what_type

# The nearest look after a costly step, as a share of the interval: 1/16 of
# the default 1 s is 62 ms.
_NEAREST = 1 / 16


class CollectorPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a Foundation collects what changed and freezes what lives.

    The open freezes what the process holds (``gc.freeze()``, no
    collection). At most every ``interval`` seconds, once the process allocated
    (``young_collections``, or the last step's cost says it is busy), a
    *step*: one full collection, which visits only what is not frozen (what
    was allocated since the last step, or the open), then
    ``gc.freeze()``; a step that took more than
    ``step_cpu`` seconds of CPU brings the next one nearer. The first step
    comes at the first look (a 16th of ``interval`` apart from the open) that
    finds a context and a history item held, or from ``interval`` after the
    open once the process allocated. Frozen objects that
    later become cyclic garbage stay until a *thorough* step (``gc.unfreeze()``,
    a full collection of everything, freeze), taken once the process's
    allocated blocks (counted from the Foundation's open) grew past
    ``1 + regrowth`` times what the last thorough step left or, when more, what
    the Foundation's contexts and history items explain at the fewest blocks
    per context and per item seen since. Process-wide, as the collector is;
    the Foundation unfreezes at its close. What a host gives up: cyclic
    garbage of objects that lived across a step or the open stays until a
    thorough step (or the close), and ``gc.get_objects()`` does not list
    frozen objects.

    Attributes:
        interval: the longest time between two looks at the allocation count,
            in seconds (> 0, finite).
        young_collections: generation-0 collections (about 700 net
            allocations each, CPython's default threshold) since the last step
            that make a look ``interval`` seconds after it a step (>= 1; a
            nearer look, after a costly step, needs none, nor does a look at
            which, by the last step's CPU per second, a step would cost at
            least half of ``step_cpu``).
        regrowth: how much the allocated blocks may grow past what the last
            thorough step left (or what the live state explains) before a
            thorough step, as a fraction (> 0; at least 1 for any cost linear
            in contexts and items to count as live; ``math.inf``: never again after
            the first, which lets cyclic garbage of frozen objects stay for the
            process's life).
        step_cpu: the CPU seconds a step aims at (> 0, finite): the next
            look comes after the time since the last step's start times
            ``step_cpu`` over its CPU, between a 16th of ``interval`` and
            ``interval`` and at most twice the wait before.
    """

    interval: float = 1.0
    young_collections: int = 10
    regrowth: float = 1.0
    step_cpu: float = 0.004

    def __post_init__(self) -> None:
        """Check every field (a Struct's constructor checks no types).

        Raises:
            InputError: a field out of its range or of another type.
        """
        value = self.young_collections
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise InputError(
                f"CollectorPolicy.young_collections must be an int >= 1, not {value!r}."
            )
        for name in ("interval", "step_cpu"):
            value = getattr(self, name)
            if not _is_number(value) or not 0 < value < math.inf:
                raise InputError(
                    f"CollectorPolicy.{name} must be a finite number of seconds > 0, not {value!r}."
                )
        if not _is_number(self.regrowth) or not self.regrowth > 0:  # NaN fails too
            raise InputError(
                f"CollectorPolicy.regrowth must be a number > 0 (or math.inf), "
                f"not {self.regrowth!r}."
            )


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def check_policy(policy: object) -> CollectorPolicy | None:
    """``policy`` if it is a :class:`CollectorPolicy` or None.

    Raises:
        InputError: anything else.
    """
    if policy is None or isinstance(policy, CollectorPolicy):
        return policy
    raise InputError(f"collector must be a CollectorPolicy or None, not {what_type(policy)}.")


class CollectorStatistics(msgspec.Struct, frozen=True, kw_only=True):
    """What a Foundation's collector policy did (``Foundation.collector.statistics()``).

    Attributes:
        steps: steps taken (each one full collection of what was not frozen).
        thorough_steps: steps that unfroze everything first.
        blocks: the process's allocated blocks after the last step
            (``sys.getallocatedblocks()``; 0 before the first).
        allowed_blocks: the allocated blocks past which the next step is
            thorough, as of the last step (0 before the first).
        live: the Foundation's live state at the last step: (contexts held,
            history items they hold).
        step_cpu_max_seconds: the longest step's CPU time on the loop's thread
            (its collection, freeze and read of the allocated blocks).
        thorough_cpu_max_seconds: the longest thorough step's.
    """

    steps: int
    thorough_steps: int
    blocks: int
    allowed_blocks: int
    live: tuple[int, int]
    step_cpu_max_seconds: float
    thorough_cpu_max_seconds: float


class FrozenCollector:
    """Runs a :class:`CollectorPolicy` on the event loop of one Foundation.

    Constructing it is the open: it freezes what the process holds
    (``gc.freeze()``, no collection) and counts allocated blocks from there;
    :meth:`close` unfreezes.
    ``live`` answers the Foundation's live state, (contexts held, history
    items they hold), O(1), on the loop's thread; without it no growth is
    explained by live state.
    """

    __slots__ = (
        "_allowed",
        "_base",
        "_blocks",
        "_closed",
        "_froze",
        "_live",
        "_live_now",
        "_origin",
        "_pace",
        "_policy",
        "_rate",
        "_step_cpu",
        "_stepped",
        "_steps",
        "_thorough",
        "_thorough_cpu",
        "_thorough_next",
        "_wait",
        "_young",
        "stepping",
    )

    def __init__(
        self, policy: CollectorPolicy, live: Callable[[], tuple[int, int]] | None = None
    ) -> None:
        self._policy = policy
        self._live = live if live is not None else _nothing_live
        # The open: what the process holds now is frozen without a collection
        # (O(1), a splice of the generations' lists), so the first step walks
        # only what was allocated since; its cyclic garbage waits for a thorough step.
        gc.freeze()
        self._froze = True
        self._young = _young_collections()
        self._origin = _allocated()  # what the process held before the Foundation opened
        self._base = -1  # blocks allocated since the origin at the last base (-1: none yet)
        self._rate = (math.inf, math.inf)  # the fewest of those blocks per context, per item
        self._blocks = 0
        self._allowed = 0
        self._live_now = (0, 0)
        # Until the next look: the first comes a 16th of the interval after the open.
        self._wait = policy.interval * _NEAREST
        self._stepped = time.monotonic()  # when the last step began (the open, before any)
        self._pace = 0.0  # the last plain step's CPU per second since the step before
        self._closed = False
        self._thorough_next = False
        self.stepping = False  # True while a step collects (for a gc callback to tell)
        self._steps = 0
        self._thorough = 0
        self._step_cpu = 0.0
        self._thorough_cpu = 0.0

    @property
    def policy(self) -> CollectorPolicy:
        """The policy this collector runs."""
        return self._policy

    @property
    def wait(self) -> float:
        """Seconds :meth:`run` waits before its next look (``interval`` or nearer)."""
        return self._wait

    def statistics(self) -> CollectorStatistics:
        """What it did so far, O(1)."""
        return CollectorStatistics(
            steps=self._steps,
            thorough_steps=self._thorough,
            blocks=self._blocks,
            allowed_blocks=self._allowed,
            live=self._live_now,
            step_cpu_max_seconds=self._step_cpu,
            thorough_cpu_max_seconds=self._thorough_cpu,
        )

    def due(self) -> bool:
        """True when the process allocated enough since the last step for another.

        Before the first step: while less than ``interval`` has passed since
        the open, when the live state holds a context and a history item;
        from then on, ``young_collections`` young collections since the open.
        After it: ``young_collections`` young collections since; or the last
        step made the wait shorter than ``interval``; or, at the last plain
        step's CPU per second since the step before, a step now would cost at
        least half of ``step_cpu``. Young collections count net allocations, which frees
        of frozen objects offset while a process that evicts old history
        allocates fast: waiting for them could let a step walk several
        intervals' allocations.
        """
        policy = self._policy
        if not self._steps:  # the first step: once the live state explains growth
            if time.monotonic() - self._stepped < policy.interval:
                contexts, items = self._live()
                return contexts > 0 and items > 0
            return _young_collections() - self._young >= policy.young_collections
        if self._wait < policy.interval:
            return True  # the last step was costly: the process allocates fast
        if self._pace * (time.monotonic() - self._stepped) >= policy.step_cpu / 2:
            return True  # busy: a step now walks what a step_cpu step would, or half
        return _young_collections() - self._young >= policy.young_collections

    def step(self) -> None:
        """One step now: collect what is not frozen (all, when thorough), then freeze.

        Synchronous, on the event loop: it pauses the loop for one full
        collection of what changed since the last step (of everything, on a
        thorough step), then reads the allocated blocks and the live state
        and decides whether the next step is thorough. The first step and a
        thorough one take the base the next decisions measure from. A plain
        step's CPU time paces the next look (:attr:`wait`). After
        :meth:`close` it does nothing: what it would freeze would outlive the
        Foundation.
        """
        if self._closed:
            return
        began, now = time.thread_time(), time.monotonic()
        elapsed, self._stepped = now - self._stepped, now
        thorough = self._thorough_next
        self.stepping = True
        try:
            if thorough:
                gc.unfreeze()
            gc.collect()
            gc.freeze()
        finally:
            self.stepping = False
        self._froze = True
        self._steps += 1
        self._young = _young_collections()
        blocks = self._blocks = _allocated()
        live = self._live_now = self._live()
        if thorough:
            self._thorough += 1
        growth = max(0, blocks - self._origin)
        if thorough or self._base < 0:  # the base: no frozen garbage (or none known)
            self._base = growth
            self._rate = _per_unit(growth, live)
        self._allowed = self._allowance(live)
        self._thorough_next = blocks > self._allowed
        # After the decision: this step's blocks may hold frozen garbage.
        contexts, items = _per_unit(growth, live)
        self._rate = (min(self._rate[0], contexts), min(self._rate[1], items))
        spent = time.thread_time() - began
        self._step_cpu = max(self._step_cpu, spent)
        if thorough:
            self._thorough_cpu = max(self._thorough_cpu, spent)
        else:  # a thorough step walks everything: its cost says nothing of the pace
            # What a step walks grows with the time since the last: aim the next at step_cpu.
            interval = self._policy.interval
            self._pace = spent / elapsed if elapsed > 0 else 0.0
            wait = elapsed * self._policy.step_cpu / spent if spent else interval
            # At most twice the last wait: a process that allocated little
            # since a near step (between bursts of a ramp-up) is looked at soon again.
            self._wait = min(interval, 2 * self._wait, max(interval * _NEAREST, wait))

    def _allowance(self, live: tuple[int, int]) -> int:
        """The allocated blocks past which the next step is thorough."""
        if self._policy.regrowth == math.inf:
            return sys.maxsize
        growth = float(self._base)
        for rate, units in zip(self._rate, live, strict=True):
            if units and rate < math.inf:
                growth = max(growth, rate * units)  # what the live state explains
        return self._origin + int(min((1 + self._policy.regrowth) * growth, sys.maxsize))

    async def run(self) -> None:
        """Look every :attr:`wait` seconds (:meth:`look`). Runs until cancelled or closed.

        Returns at its first look after :meth:`close`: a cancellation can
        arrive after the sleep ended and before the task resumed (anyio on
        asyncio then delivers it at the next await), and a step there would
        freeze again what the close unfroze.

        Cancellation: cancelled between looks (a step does not await),
        leaving what it froze frozen until :meth:`close`.
        """
        while True:
            await anyio.sleep(self._wait)
            if self._closed:
                return
            self.look()

    def look(self) -> bool:
        """One look: :meth:`step` when :meth:`due`; True when it stepped.

        A look that finds no step due before the first step, an interval or
        more after the open, sets :attr:`wait` to the interval (an idle
        Foundation is looked at every interval from then on).
        """
        if self.due():
            self.step()
            return True
        if not self._steps and time.monotonic() - self._stepped >= self._policy.interval:
            self._wait = self._policy.interval
        return False

    def close(self) -> None:
        """Unfreeze what the open and the steps froze, so their objects are collectable again.

        Idempotent. Unfreezes the whole permanent generation (what the host
        froze too); the next full collection then visits it. The collector
        steps no more: :meth:`step` does nothing and :meth:`run` returns.
        """
        self._closed = True
        if self._froze:
            self._froze = False
            gc.unfreeze()


def _nothing_live() -> tuple[int, int]:
    return (0, 0)


def _per_unit(growth: int, live: tuple[int, int]) -> tuple[float, float]:
    contexts, items = live
    return (growth / contexts if contexts else math.inf, growth / items if items else math.inf)


def _allocated() -> int:
    """The process's allocated memory blocks (objects), O(pools), frozen garbage included."""
    return sys.getallocatedblocks()


def _young_collections() -> int:
    return int(gc.get_stats()[0]["collections"])
