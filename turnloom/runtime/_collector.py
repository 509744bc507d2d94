"""The Foundation's collector policy: full collections walk only what changed.

A full collection of CPython's cyclic collector visits every tracked object
that lives: at 1,000 load-test sessions that is 36-41 ms of CPU on the event
loop, at 5,000 about 220 ms, almost all of it spent on data that has not
changed since the last one. ``gc.freeze()`` moves every tracked object into a
permanent generation that no collection visits (0.01 ms for the same full
collection afterwards). A :class:`FrozenCollector` does that periodically:

- **Step** (every :attr:`CollectorPolicy.interval` seconds, once the process
  made at least :attr:`CollectorPolicy.young_collections` young collections
  since the last step, i.e. allocated): one full collection, which visits
  only the objects allocated since the last step, then ``gc.freeze()`` of the
  survivors. Garbage is collected before it could be frozen.
- **Frozen objects are never collected.** An object frozen while alive that
  later becomes part of unreachable *cyclic* garbage stays until the next
  unfreeze (non-cyclic garbage is freed by reference counting, frozen or
  not). So every :attr:`CollectorPolicy.check_every` steps the size of the
  frozen set is read (O(frozen): see the next point); once it
  grew past ``(1 + regrowth)`` times its size after the last *thorough* step,
  the next step is thorough: ``gc.unfreeze()``, one full collection of
  everything (the cold pause the policy otherwise avoids), then freeze. The
  memory such garbage can hold is thereby bounded by ``regrowth`` times the
  live frozen set. The first step (after warm-up) is a plain one that reads
  the frozen set's size: what the host froze itself stays frozen until then.
- **The read is a pause of its own.** It walks the frozen set's list, one
  cache miss per object on a large heap: measured in ``turnloom loadtest``
  on a loaded 2-core machine, 8-10 ms of CPU at 1,000 sessions (about 90,000
  frozen objects) and 40-60 ms at 5,000 (280,000), as much as the
  collection itself. So :meth:`FrozenCollector.run` makes it at its next
  look, ``interval`` seconds after the step's collection, never in the same
  pause (:meth:`FrozenCollector.collect`, then :meth:`FrozenCollector.check`).

The policy is process-wide, as the collector is: ``gc.freeze`` moves every
tracked object of the process, the host's included, and a thorough step
unfreezes objects the host froze itself (the live ones are frozen again).
On close the Foundation unfreezes what is frozen, so a closed Foundation's
objects are collectable again.

What a host gives up with the policy on: cyclic garbage made of objects that
lived across a step (at least ``interval`` seconds) is reclaimed only at the
next thorough step, so memory may reach ``(1 + regrowth)`` times what lives;
``gc.get_objects()`` does not list frozen objects. Turn it off with
``Foundation(collector=None)``.
"""

from __future__ import annotations

__all__ = ("CollectorPolicy", "CollectorStatistics", "FrozenCollector")

import gc
import math
import time

import anyio
import msgspec

from turnloom.errors import InputError, what_type


class CollectorPolicy(msgspec.Struct, frozen=True, kw_only=True):
    """When a Foundation collects what changed and freezes what lives.

    Every ``interval`` seconds, once the process allocated (``young_collections``),
    a *step*: one full collection, which visits only what is not frozen, then
    ``gc.freeze()``. Frozen objects that later become cyclic garbage stay until
    a *thorough* step (``gc.unfreeze()``, a full collection of everything,
    freeze), taken once the frozen set grew past ``1 + regrowth`` times its
    size after the last one; so such garbage is bounded by ``regrowth`` times
    what lives frozen (by object count). Process-wide, as the collector is;
    the Foundation unfreezes at its close. What a host gives up: cyclic
    garbage of objects that lived across a step stays until a thorough step,
    and ``gc.get_objects()`` does not list frozen objects.

    Attributes:
        interval: seconds between two looks at the allocation count (> 0).
        young_collections: generation-0 collections (about 700 net
            allocations each, CPython's default threshold) since the last step
            that make the next look a step (>= 1).
        check_every: steps between two reads of the frozen set's size (>= 1).
        regrowth: how much the frozen set may grow, as a fraction of its size
            after the last thorough step, before a thorough step (> 0;
            ``math.inf``: never again after the first, which lets cyclic
            garbage of frozen objects stay for the process's life).
    """

    interval: float = 1.0
    young_collections: int = 10
    check_every: int = 10
    regrowth: float = 1.0

    def __post_init__(self) -> None:
        """Check every field (a Struct's constructor checks no types).

        Raises:
            InputError: a field out of its range or of another type.
        """
        for name in ("young_collections", "check_every"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise InputError(f"CollectorPolicy.{name} must be an int >= 1, not {value!r}.")
        if not _is_number(self.interval) or not 0 < self.interval < math.inf:
            raise InputError(
                f"CollectorPolicy.interval must be a finite number of seconds > 0, "
                f"not {self.interval!r}."
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
        frozen: the frozen set's size at its last read (objects).
        step_cpu_max_seconds: the longest step's CPU time on the loop's thread
            (its collection and freeze; the read of the frozen set's size
            aside, see ``check_cpu_max_seconds``).
        thorough_cpu_max_seconds: the longest thorough step's.
        check_cpu_max_seconds: the longest read of the frozen set's size, CPU
            seconds on the loop's thread (a pause of its own, ``interval``
            seconds after the step that made it due).
    """

    steps: int
    thorough_steps: int
    frozen: int
    step_cpu_max_seconds: float
    thorough_cpu_max_seconds: float
    check_cpu_max_seconds: float = 0.0


class FrozenCollector:
    """Runs a :class:`CollectorPolicy` on the event loop of one Foundation."""

    __slots__ = (
        "_base",
        "_check_cpu",
        "_check_next",
        "_froze",
        "_frozen",
        "_policy",
        "_step_cpu",
        "_steps",
        "_thorough",
        "_thorough_cpu",
        "_thorough_next",
        "_young",
        "stepping",
    )

    def __init__(self, policy: CollectorPolicy) -> None:
        self._policy = policy
        self._young = _young_collections()
        self._base = 0  # the frozen set's size after the last thorough step
        self._frozen = 0
        self._froze = False
        self._thorough_next = False
        self._check_next = False  # the last step made a read of the frozen set's size due
        self.stepping = False  # True while a step collects (for a gc callback to tell)
        self._steps = 0
        self._thorough = 0
        self._step_cpu = 0.0
        self._thorough_cpu = 0.0
        self._check_cpu = 0.0

    @property
    def policy(self) -> CollectorPolicy:
        """The policy this collector runs."""
        return self._policy

    def statistics(self) -> CollectorStatistics:
        """What it did so far, O(1)."""
        return CollectorStatistics(
            steps=self._steps,
            thorough_steps=self._thorough,
            frozen=self._frozen,
            step_cpu_max_seconds=self._step_cpu,
            thorough_cpu_max_seconds=self._thorough_cpu,
            check_cpu_max_seconds=self._check_cpu,
        )

    def due(self) -> bool:
        """True when the process allocated enough since the last step for another."""
        return _young_collections() - self._young >= self._policy.young_collections

    def step(self) -> None:
        """One whole step now: :meth:`collect`, then :meth:`check` if it made one due.

        Synchronous, on the event loop, in one pause (:meth:`run` makes the two
        ``interval`` seconds apart instead).
        """
        self.collect()
        if self._check_next:
            self.check()

    @property
    def check_due(self) -> bool:
        """True when the last step made a read of the frozen set's size due (:meth:`check`)."""
        return self._check_next

    def collect(self) -> None:
        """A step's pause: collect what is not frozen (all, when thorough), then freeze.

        Synchronous, on the event loop: it pauses the loop for one full
        collection of what changed since the last step (of everything, on a
        thorough step). The first step, a thorough one and every
        ``check_every``-th step make a read of the frozen set's size due
        (:attr:`check_due`), which this call does not make: it costs as much
        as the collection on a large heap.
        """
        began = time.thread_time()
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
        if thorough:
            self._thorough += 1
            self._thorough_next = False
        if thorough or self._steps == 1:
            self._base = -1  # the next read sets the base the regrowth is measured from
        # A read left due (its step's task cancelled before it) stays due.
        self._check_next = (
            self._check_next or self._base < 0 or self._steps % self._policy.check_every == 0
        )
        spent = time.thread_time() - began
        self._step_cpu = max(self._step_cpu, spent)
        if thorough:
            self._thorough_cpu = max(self._thorough_cpu, spent)

    def check(self) -> None:
        """Read the frozen set's size (O(frozen)); decide whether the next step is thorough.

        Synchronous, on the event loop; does nothing unless :attr:`check_due`.
        After the first or a thorough step the size read is the base the
        regrowth is measured from; after another, the next step is thorough
        once the size grew past ``(1 + regrowth)`` times that base.
        """
        if not self._check_next:
            return
        began = time.thread_time()
        self._check_next = False
        self._frozen = _frozen_count()
        if self._base < 0:
            self._base = self._frozen
        else:
            self._thorough_next = self._frozen > (1 + self._policy.regrowth) * self._base
        self._check_cpu = max(self._check_cpu, time.thread_time() - began)

    async def run(self) -> None:
        """Look every ``interval`` seconds; step when :meth:`due`. Runs until cancelled.

        A step is two pauses of the loop, never one and never back to back:
        :meth:`collect`, then, when it made one due, :meth:`check` at the next
        look, ``interval`` seconds later, instead of a step (a ticker of the
        loop sees at most one of them in one wait).

        Cancellation: cancelled between looks (neither pause awaits), leaving
        what it froze frozen until :meth:`close`; a read not made is made
        after the next step's collection.
        """
        interval = self._policy.interval
        while True:
            await anyio.sleep(interval)
            if self._check_next:
                self.check()  # the read is a pause of its own
            elif self.due():
                self.collect()

    def close(self) -> None:
        """Unfreeze what the steps froze, so the Foundation's objects are collectable again.

        Idempotent. Unfreezes the whole permanent generation (what the host
        froze too); the next full collection then visits it.
        """
        if self._froze:
            self._froze = False
            gc.unfreeze()


def _frozen_count() -> int:
    """The frozen set's size, in objects: a walk of its list (O(frozen), cache-cold)."""
    return gc.get_freeze_count()


def _young_collections() -> int:
    return int(gc.get_stats()[0]["collections"])
