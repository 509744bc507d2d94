"""The preparation slots of a ContextManager, shared fairly between tenants.

The rule (documented on :class:`~turnloom.runtime.Foundation`):

1. At most ``capacity`` preparations hold a slot at once.
2. A tenant (the ``tenant_id`` of a request's ``tenant``) holds at most
   ``tenant_limit`` slots, so a tenant flooding the queue always leaves
   ``capacity - tenant_limit`` slots to the others. Requests without a tenant
   form one bucket that only the capacity bounds (a single-tenant host keeps
   every slot).
3. When a slot frees, it goes to the waiting request whose tenant holds the
   fewest slots (among tenants under their limit); ties go to the request
   that has waited longest. A new request never overtakes an eligible
   waiting one.

4. At most ``hand_limit`` slots are *being handed* at once: granted to a
   waiting request that has not resumed yet; one that resumes (or is
   cancelled) hands the next. A granted request resumes at the event
   loop's next iteration, so when every request waits (a saturated loop)
   about ``hand_limit`` of them resume per iteration, not ``capacity``, and
   each iteration (how late any other task of the loop runs) stays short.
   A slot freed meanwhile waits for its hand; rule 3 still decides who gets
   it, and a new request does not take it while an eligible request waits.

So a tenant that arrives while another floods waits for at most one
preparation to settle, not behind the whole flood.

Event-loop only; every method is O(tenants waiting). A waiting call parks on
one :class:`~turnloom.runtime._wakeup.Signal` of the loop (on asyncio a bare
future): a full collection walks every waiting call's objects, so a wait
keeps few.
"""

from __future__ import annotations

__all__ = ("FairSlots",)

import itertools
from collections import deque
from collections.abc import Awaitable, Callable

import anyio
import anyio.lowlevel

from turnloom.runtime._wakeup import Signal

Tenant = str | None


class _Waiter:
    __slots__ = ("granted", "order", "signal", "tenant")

    def __init__(self, tenant: Tenant, order: int, signal: Signal) -> None:
        self.tenant = tenant
        self.order = order
        self.signal = signal
        self.granted = False


class FairSlots:
    """``capacity`` slots, at most ``tenant_limit`` per tenant, fewest-held tenant first.

    At most ``hand_limit`` (default ``capacity``) slots being handed to waiters at once.
    """

    def __init__(
        self,
        capacity: int,
        tenant_limit: int,
        checkpoint: Callable[[], Awaitable[None]] = anyio.lowlevel.checkpoint,
        signal: Callable[[], Signal] = anyio.Event,
        hand_limit: int | None = None,
    ) -> None:
        self.capacity = capacity
        # Slots granted to waiters that have not resumed yet, and their bound (rule 4).
        self._handing = 0
        self._hand_limit = capacity if hand_limit is None else hand_limit
        self._checkpoint = checkpoint  # anyio.lowlevel.checkpoint, or the loop's own
        self._signal = signal  # anyio.Event, or the loop's bare Signal
        self.tenant_limit = tenant_limit
        self.free = capacity
        self.waiting = 0
        self._held: dict[Tenant, int] = {}
        self._queues: dict[Tenant, deque[_Waiter]] = {}
        self._order = itertools.count()

    def held(self, tenant: Tenant) -> int:
        """Slots ``tenant`` holds now."""
        return self._held.get(tenant, 0)

    def _limit(self, tenant: Tenant) -> int:
        return self.capacity if tenant is None else self.tenant_limit

    def _take(self, tenant: Tenant) -> None:
        self.free -= 1
        self._held[tenant] = self._held.get(tenant, 0) + 1

    def try_acquire(self, tenant: Tenant) -> bool:
        """Take a slot at once if the rule allows it now; return whether one was taken."""
        # Grants are eager while fewer than hand_limit slots are being handed, so
        # then a free slot means every waiter is at its limit; at hand_limit a free
        # slot is owed to an eligible waiter, if any. Either way taking it
        # overtakes no eligible waiter.
        if not self.free:
            return False
        held = self._held.get(tenant, 0)
        if held >= (self.capacity if tenant is None else self.tenant_limit) or (
            self._handing >= self._hand_limit and self._eligible()
        ):
            return False
        self.free -= 1
        self._held[tenant] = held + 1
        return True

    def _eligible(self) -> bool:
        """True when a waiter's tenant is under its limit (it could take a free slot)."""
        held, capacity, tenant_limit = self._held, self.capacity, self.tenant_limit
        for tenant in self._queues:
            if held.get(tenant, 0) < (capacity if tenant is None else tenant_limit):
                return True
        return False

    async def acquire(self, tenant: Tenant) -> bool:
        """Wait for a slot for ``tenant``; return whether it had to wait (False: taken at once).

        Cancellation:
            A cancelled call holds no slot: one granted to it in the meantime
            is handed to the next waiter.
        """
        # One checkpoint (cheaper than a cancellation check plus a shielded
        # one): a call cancelled in it holds no slot; past it, it cannot be
        # cancelled before it returns with the slot taken.
        await self._checkpoint()
        if self.try_acquire(tenant):
            return False
        await self.park(tenant)
        return True

    async def park(self, tenant: Tenant) -> None:
        """Wait until a slot is granted to ``tenant``, without a checkpoint first.

        For a caller that just found :meth:`try_acquire` False and was not
        cancelled (it checked, without yielding): it parks at once, and its
        wait is its yield. :meth:`acquire` is a checkpoint, then this; a
        caller that keeps no frame of its own for the wait does what this
        does: :meth:`enqueue`, await the waiter's ``signal.wait()``, then
        :meth:`resumed`, or :meth:`leave` if the wait raised.

        Cancellation:
            As :meth:`acquire`: a cancelled call holds no slot; one granted
            to it in the meantime is handed to the next waiter.
        """
        waiter = self.enqueue(tenant)
        try:
            await waiter.signal.wait()
        except BaseException:
            self.leave(waiter)
            raise
        self.resumed()

    def enqueue(self, tenant: Tenant) -> _Waiter:
        """Queue a waiter for ``tenant`` (see :meth:`park`); its ``signal`` is set on its grant."""
        waiter = _Waiter(tenant, next(self._order), self._signal())
        queue = self._queues.get(tenant)
        if queue is None:
            queue = self._queues[tenant] = deque()
        queue.append(waiter)
        self.waiting += 1
        return waiter

    def leave(self, waiter: _Waiter) -> None:
        """A queued waiter's wait raised: it holds no slot (one granted to it is handed on)."""
        tenant = waiter.tenant
        if waiter.granted:
            self._handing -= 1
            self.release(tenant)
        else:
            queue = self._queues[tenant]
            queue.remove(waiter)
            if not queue:
                del self._queues[tenant]
            self.waiting -= 1

    def resumed(self) -> None:
        """A granted waiter resumed holding its slot: the next slot can be handed (rule 4)."""
        self._handing -= 1
        self._grant()

    def release(self, tenant: Tenant) -> None:
        """Give back a slot ``tenant`` held; hand it on by the rule."""
        left = self._held[tenant] - 1
        if left:
            self._held[tenant] = left
        else:
            del self._held[tenant]
        self.free += 1
        self._grant()

    def _grant(self) -> None:
        while self.free and self._queues and self._handing < self._hand_limit:
            best: deque[_Waiter] | None = None
            best_key = (0, 0)
            holding = self._held
            for tenant, queue in self._queues.items():
                held = holding.get(tenant, 0)
                if held >= (self.capacity if tenant is None else self.tenant_limit):
                    continue
                key = (held, queue[0].order)
                if best is None or key < best_key:
                    best, best_key = queue, key
            if best is None:
                return
            waiter = best.popleft()
            if not best:
                del self._queues[waiter.tenant]
            self.waiting -= 1
            self._take(waiter.tenant)
            self._handing += 1
            waiter.granted = True
            waiter.signal.set()
