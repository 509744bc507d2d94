"""Per-turn assembly strategies: the prompt and the memory a turn's model input carries.

A strategy has one method, :meth:`AssemblyStrategy.assemble`, which the
:class:`~turnloom.runtime.ContextManager` awaits once per turn, when the
turn's first preparation captures its state; every later preparation and
model call of that turn reuses the :class:`AssembledContext`. A Foundation
selects its strategy once, by name (:func:`~turnloom.runtime.make_strategy`);
the host reaches it through the manager's :class:`~turnloom.runtime.Assembly`
(``manager.assembly``, in ``_assembly``). The built-in strategies live in
``_strategies``.

Two strategies:

* ``"jit"`` (:class:`~turnloom.runtime.JITStrategy`) -- a minimal system prompt (checked
  against a token budget, 250 by default) and no hydration: the model asks
  for memory through the ``hydrate_context`` tool
  (:data:`HYDRATE_TOOL_NAME`), which the host answers with
  :meth:`manager.assembly.hydrate_context
  <turnloom.runtime.Assembly.hydrate_context>`, searching within the
  scope of the request that prepared the turn.
* ``"stratified"`` (:class:`~turnloom.runtime.StratifiedStrategy`) -- every turn with
  ``auto_hydrate`` recalls memory. The prompt has three layers: L0, the
  static instructions; L1, the session-stable part (the tenant scope and how
  memory arrives: no time, no memory, no per-turn tools); L2, the turn's
  recalled memory. L0 and L1 form the system prompt, byte-identical across
  the turns of a scope; L2 travels after the durable history, in the
  runtime-state pair (key ``"memory"``), so it never invalidates the cached
  prefix. For Anthropic one ``cache_control`` breakpoint closes L1 when the
  system prompt reaches the minimum cacheable length.

Tenant identity is not hydration policy: the scope always reaches the prompt
and the memory source; only ``auto_hydrate`` decides whether a turn recalls
memory. A turn without a scope recalls nothing (a search always runs within
one tenant).
"""

# Contract: seed 003 (assemble, AssembledContext, the scope/auto_hydrate rule).

from __future__ import annotations

__all__ = (
    "HYDRATE_TOOL_NAME",
    "AssembledContext",
    "AssemblyMetadata",
    "AssemblyStrategy",
    "HydratingStrategy",
    "Hydration",
    "StrategyOptions",
    "assembly_query",
)

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from turnloom.context.gateway import Gateway
from turnloom.context.memory import HydratedMemory, TenantScope
from turnloom.context.message import Message, TextPart, ToolCallPart

HYDRATE_TOOL_NAME = "hydrate_context"
"""The tool a JIT turn's model calls to recall memory."""

_DEFAULT_INSTRUCTIONS = "You are a helpful assistant."


class StrategyOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How a strategy assembles: the static layer and the memory bounds.

    Attributes:
        instructions: L0, the static instructions the assembled system prompt
            starts with.
        top_k: the most memory entries recalled per search (1..100).
        max_memory_chars: the most characters of entry text shown to the
            model per search (stratified L2, one ``hydrate_context`` result).
        prompt_budget: the JIT system prompt's budget, in tokens (the
            project's approximate counter), checked for the longest possible
            scope when the strategy is made.
        cache_min_tokens: the shortest system prompt, in tokens, that gets an
            Anthropic ``cache_control`` breakpoint. Anthropic documents the
            minimum cacheable prompt length per model: 1024 tokens (Claude
            Opus 4.1, Opus 4, Sonnet 4.5, Sonnet 4, Sonnet 3.7), 2048 (Sonnet
            4.6, Haiku 3.5, Haiku 3), 4096 (Opus 4.5, Opus 4.6, Haiku 4.5);
            a shorter marked prefix is simply not cached. Source: Anthropic
            prompt caching guide, "Cache limitations".
    """

    instructions: str = _DEFAULT_INSTRUCTIONS
    top_k: int = 5
    max_memory_chars: int = 4000
    prompt_budget: int = 250
    cache_min_tokens: int = 1024


class AssemblyMetadata(msgspec.Struct, frozen=True, kw_only=True):
    """Telemetry of one assembly.

    Attributes:
        strategy_name: ``"jit"``, ``"stratified"`` or a custom strategy's name.
        latency_ms: time spent in ``assemble``, in milliseconds.
        entries_count: memory entries recalled (0 when none or no hydration).
    """

    strategy_name: str
    latency_ms: float
    entries_count: int


class AssembledContext(msgspec.Struct, frozen=True, kw_only=True):
    """What a strategy assembled for one turn.

    Attributes:
        system_prompt: the assembled system prompt, placed before every other
            item of the prepared input; None for none.
        memory_context: the memory recalled for the turn; None means no
            hydration happened (JIT, ``auto_hydrate=False``, no scope, or no
            memory source).
        state_overrides: strategy state for the host (stratified:
            ``{"l1_hash": 16 hex digits}``, a digest of L1); empty for JIT.
        activation_log: which entries were recalled and their scores
            (``{"entries": [{"id", "score"}, ...]}``), or None without hydration.
        metadata: strategy name, latency and entry count.
        tenant: the tenant scope the turn was assembled for;
            ``hydrate_context`` searches within it.
        cache_breakpoint: the system prompt's end carries an Anthropic
            ``cache_control`` breakpoint.
        max_memory_chars: the cap on the characters of entry text the runtime
            renders from ``memory_context`` into the runtime-state pair
            (see :func:`~turnloom.context.memory.memory_payload`).
    """

    metadata: AssemblyMetadata
    system_prompt: str | None = None
    memory_context: HydratedMemory | None = None
    state_overrides: dict[str, str] = msgspec.field(default_factory=dict)
    activation_log: dict[str, Any] | None = None
    tenant: TenantScope | None = None
    cache_breakpoint: bool = False
    max_memory_chars: int = 0


@runtime_checkable
class AssemblyStrategy(Protocol):
    """A per-turn assembly strategy (one method, plus its name and tools)."""

    @property
    def name(self) -> str:
        """A short, fixed name (a metrics label: keep the set bounded)."""
        ...

    def tool_definitions(self, gateway: Gateway) -> list[dict[str, Any]]:
        """The tools the host declares for this strategy, in ``gateway``'s shape."""
        ...

    async def assemble(
        self,
        *,
        query: str,
        scope: TenantScope | None,
        intent_verdict: Any | None,
        auto_hydrate: bool = True,
    ) -> AssembledContext:
        """Assemble one turn.

        Args:
            query: the turn's input text (what memory is searched for).
            scope: the tenant the turn acts for; it reaches the prompt and the
                memory source whatever ``auto_hydrate`` says.
            intent_verdict: an optional classifier verdict; the built-in
                strategies ignore it.
            auto_hydrate: whether this turn recalls memory.

        Raises:
            MemoryStoreError: the memory source failed or returned malformed entries.

        Cancellation:
            A cancelled assembly leaves nothing behind; the next preparation
            of the turn assembles again.
        """
        ...


class Hydration(msgspec.Struct, frozen=True, kw_only=True):
    """The answer to one ``hydrate_context`` call.

    Attributes:
        message: the ``tool`` message answering the call.
        entries_count: memory entries it shows (0 for an error result).
    """

    message: Message
    entries_count: int


@runtime_checkable
class HydratingStrategy(AssemblyStrategy, Protocol):
    """A strategy whose model recalls memory through the ``hydrate_context`` tool."""

    async def hydrate(self, call: ToolCallPart, *, scope: TenantScope | None) -> Hydration:
        """Answer one ``hydrate_context`` call with a tool result message.

        Raises:
            InvalidMessageError: ``call`` is not a ToolCallPart of ``hydrate_context``.
            MemoryStoreError: the memory source failed.
        """
        ...


def assembly_query(messages: Sequence[Message]) -> str:
    """The query of a turn: the text parts of its input messages, joined by newlines."""
    return "\n".join(
        part.text for message in messages for part in message.parts if type(part) is TextPart
    )
