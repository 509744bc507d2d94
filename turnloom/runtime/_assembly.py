"""The manager's assembly strategy as the host meets it: :class:`Assembly` (``manager.assembly``).

The strategies and their types are :mod:`turnloom.runtime.assembly`'s; this
file holds the handle the manager builds over its lifecycle, issued prefixes
and counters, so that the strategies' module imports nothing of the runtime
above it.
"""

from __future__ import annotations

__all__ = ("Assembly",)

from typing import Any

from turnloom.context.gateway import Gateway
from turnloom.context.message import Message, ToolCallPart
from turnloom.errors import StateError, excerpt
from turnloom.runtime._continuation import IssuedPrefixes
from turnloom.runtime._counters import Counters
from turnloom.runtime._lifecycle import Lifecycle
from turnloom.runtime.assembly import AssemblyStrategy, HydratingStrategy
from turnloom.runtime.schemas import PreparedContext


class Assembly:
    """A manager's assembly strategy as the host meets it. Reach it as ``manager.assembly``.

    :attr:`strategy` is the strategy the manager was built with (or None),
    :meth:`tool_definitions` what the host declares for it, and
    :meth:`hydrate_context` answers a JIT model's memory calls. Every method
    must be called from the Foundation's event loop.

    The assembly options are the manager's (``ContextManager(...)`` or
    ``Foundation(...)`` keyword arguments):

    * ``strategy``: the per-turn assembly strategy: ``"jit"``,
      ``"stratified"``, an :class:`AssemblyStrategy`, or None (default: no
      assembled prompt, no memory).
    * ``memory``: the memory source a named strategy searches. Borrowed:
      never closed by the manager or its Foundation.
    * ``strategy_options``: the named strategy's static layer and bounds
      (:class:`StrategyOptions`).
    """

    __slots__ = ("_counters", "_gateway", "_issued", "_life", "_strategy")

    def __init__(
        self,
        life: Lifecycle,
        strategy: AssemblyStrategy | None,
        gateway: Gateway,
        issued: IssuedPrefixes,
        counters: Counters,
    ) -> None:
        self._life = life
        self._strategy = strategy
        self._gateway = gateway
        self._issued = issued
        self._counters = counters

    @property
    def strategy(self) -> AssemblyStrategy | None:
        """The assembly strategy, or None."""
        return self._strategy

    def tool_definitions(self) -> list[dict[str, Any]]:
        """The tools the assembly strategy needs declared, in the gateway's ``tools`` shape.

        ``[hydrate_context]`` for JIT, ``[]`` for stratified or without a
        strategy. Declare them beside the agent's own tools.
        """
        if self._strategy is None:
            return []
        return self._strategy.tool_definitions(self._gateway)

    async def hydrate_context(self, prefix: PreparedContext, call: ToolCallPart) -> Message:
        """Answer the model's ``hydrate_context`` call of a JIT turn with a tool result.

        The search runs within the scope of the request that prepared
        ``prefix`` (never a process-wide one), with the strategy's top-k and
        output-size cap. Record the call and this result as the turn's
        outputs (or pass them as the continuation of ``manager.build``).

        Returns:
            a ``tool`` message answering ``call`` (``is_error`` with a reason
            when the model's arguments were wrong or the turn has no scope).

        Raises:
            StateError: the manager is not bound to an open Foundation yet;
                or the Foundation's strategy has no ``hydrate_context`` tool
                (it is not JIT).
            FoundationClosedError: the Foundation is closing or closed.
            InvalidMessageError: ``prefix`` was not returned by this manager's
                ``prepare``, or ``call`` is not a ToolCallPart naming
                ``hydrate_context``.
            MemoryStoreError: the memory source failed.

        Cancellation:
            As the memory source's search; nothing in the manager changes.
        """
        self._life.check_open()
        self._issued.check(prefix)
        strategy = self._strategy
        if not isinstance(strategy, HydratingStrategy):
            name = strategy.name if strategy is not None else None
            raise StateError(
                f"The assembly strategy {excerpt(name)} has no hydrate_context tool; only a JIT "
                "strategy's model recalls memory by calling it."
            )
        scope = prefix.assembled.tenant if prefix.assembled is not None else None
        answer = await strategy.hydrate(call, scope=scope)
        self._counters.hydrate_calls += 1
        self._counters.assembly_entries += answer.entries_count
        return answer.message
