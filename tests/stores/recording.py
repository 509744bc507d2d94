"""A real context store that records each state of one context's log after every write."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import anyio

from turnloom.errors import StoreError, StoreUnavailableError
from turnloom.runtime.store import ContextStore, LogWrite


class Recording:
    """A real store that, after each write, loads the log of ``watched`` into ``states``.

    ``replace_fault`` (``append_fault``) set to ``"before"`` makes the next
    replace (append) raise StoreUnavailableError without reaching the store;
    ``"after"`` applies it and then raises (the reply was lost). ``replace_gate``, when set, is
    awaited before each replace reaches the store.
    """

    def __init__(self, inner: ContextStore, watched: str) -> None:
        self.inner = inner
        self.watched = watched
        self.states: list[tuple[bytes, ...]] = []
        self.calls: list[str] = []
        self.replace_fault: str | None = None
        self.append_fault: str | None = None
        self.replace_gate: anyio.Event | None = None
        self.replacing = anyio.Event()

    async def _record(self, name: str) -> None:
        self.calls.append(name)
        self.states.append(await self.inner.load(self.watched))

    async def acquire(self, context_id: str, owner: str, ttl: float) -> int:
        return await self.inner.acquire(context_id, owner, ttl)

    async def renew(self, leases: Mapping[str, int], ttl: float) -> frozenset[str]:
        return await self.inner.renew(leases, ttl)

    async def release(self, leases: Mapping[str, int]) -> None:
        await self.inner.release(leases)

    async def append(self, writes: Sequence[LogWrite]) -> Mapping[str, int | StoreError]:
        fault, self.append_fault = self.append_fault, None
        if fault == "before":
            raise StoreUnavailableError("The store went away before the append.")
        outcome = await self.inner.append(writes)
        await self._record("append")
        if fault == "after":
            raise StoreUnavailableError("The reply to the append was lost.")
        return outcome

    async def replace(
        self, context_id: str, token: int, length: int, records: tuple[bytes, ...]
    ) -> bool:
        self.replacing.set()
        if self.replace_gate is not None:
            await self.replace_gate.wait()
        fault, self.replace_fault = self.replace_fault, None
        if fault == "before":
            raise StoreUnavailableError("The store went away before the replace.")
        done = await self.inner.replace(context_id, token, length, records)
        await self._record("replace")
        if fault == "after":
            raise StoreUnavailableError("The reply to the replace was lost.")
        return done

    async def load(self, context_id: str) -> tuple[bytes, ...]:
        return await self.inner.load(context_id)

    async def forget(self, context_id: str, token: int) -> bool:
        done = await self.inner.forget(context_id, token)
        await self._record("forget")
        return done

    async def idle(self, seconds: float) -> tuple[str, ...]:
        return await self.inner.idle(seconds)

    async def aclose(self) -> None:
        await self.inner.aclose()
