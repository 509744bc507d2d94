"""The options of a ContextManager, written once: names, types, defaults and their meaning.

:class:`ManagerSettings` is the one table. :class:`~turnloom.runtime.ContextManager`
and :class:`~turnloom.runtime.Foundation` accept its fields as keyword
arguments (typed for checkers by :class:`ManagerKwargs`, which mirrors its
names and types, a test holding the two equal), the configuration file's
``default`` plugin takes its defaults from it, and
:func:`~turnloom.runtime._door.check_manager_options` checks one into the
frozen :class:`~turnloom.runtime.ManagerOptions`.

Adding an option: a field with its default and a paragraph in
:class:`ManagerSettings`, the same name and type in :class:`ManagerKwargs`
(below it), and its check in ``check_manager_options``.
"""

from __future__ import annotations

__all__ = ("ManagerKwargs", "ManagerSettings")

from typing import TypedDict

import msgspec

from turnloom.context.cache import PromptCache
from turnloom.context.gateway import Gateway, GatewayType
from turnloom.context.history import HistoryLimits
from turnloom.context.memory import MemorySource
from turnloom.context.pairing import OpenCallPolicy
from turnloom.context.tokens import TokenCounter
from turnloom.runtime.assembly import AssemblyStrategy, StrategyOptions
from turnloom.runtime.state import EarlierStatePolicy
from turnloom.runtime.store import ContextStore


class ManagerSettings(msgspec.Struct, frozen=True, kw_only=True):
    """The options of a ContextManager as given, before they are checked.

    Each is a keyword argument of :class:`~turnloom.runtime.ContextManager`
    and of :class:`~turnloom.runtime.Foundation` (when the Foundation builds
    its manager); the defaults below are the only ones. Building this Struct
    checks nothing: the manager checks every option at once and raises
    before anything is built (the errors: see ``ContextManager``).

    Attributes:
        gateway: the provider prepared inputs are rendered for (a
            :class:`~turnloom.context.GatewayType`, its name, or a Gateway
            instance; default ``openai_chat``).
        max_pending_preparations: the bound on pending preparations (16).
        history_limits: the bounds of each context's history (None:
            ``HistoryLimits()``).
        behavior_rules: default application behaviour rules, carried as
            escaped data in each turn's runtime-state pair, never promoted to
            an instruction (see :mod:`turnloom.runtime.state`; default None).
        open_calls: ``"exclude"`` (default) or ``"cancel"`` calls without a
            result in prepared inputs.
        earlier_state: ``"keep"`` (default: each exactly as it was sent, so
            the previous input is a prefix of the next) or ``"drop"`` earlier
            turns' runtime-state pairs in later inputs (see
            :data:`~turnloom.runtime.state.EarlierStatePolicy`).
        token_counter: the one estimator of tokens (None:
            :class:`~turnloom.context.ApproxTokenCounter`): each message is
            counted once when it enters a history, and
            ``HistoryLimits.max_tokens``, the history statistics,
            ``PreparedContext.tokens`` and ``manager.bridge.working_context``
            all use that count. It must count a list as the sum of its
            messages, as the built-in counters do. Counting runs in
            ``accept_turn`` and ``record``, on the event loop: about 2.5 us
            per tau-bench message for the approximate counter, 57 us for
            ``OpenAITokenCounter("o200k_base")`` (``scripts/bench_tokens.py``).
            A counter that raises or returns anything but an int in ``[0,
            MAX_TOKEN_COUNT]`` fails the call that counted with
            :class:`~turnloom.errors.HostCallbackError`, nothing changed.
        strategy: the per-turn assembly strategy, a registered name or an
            :class:`~turnloom.runtime.AssemblyStrategy` (default None: no
            assembled prompt); see :class:`~turnloom.runtime.Assembly`.
        memory: the memory source a named strategy searches, borrowed and
            never closed (default None); only with a named ``strategy``.
        strategy_options: the named strategy's options (default None); only
            with a named ``strategy``.
        max_tenant_preparations: the most preparation slots one tenant holds
            at once (None: half the capacity, rounded up); how slots are
            shared: the ``tenant`` of :class:`~turnloom.runtime.ContextPrepareRequest`.
        store: the durable store of contexts (default None: contexts are
            kept in memory only); see :class:`~turnloom.runtime.Leases`.
        lease_ttl: seconds a context's lease lasts unless renewed (10.0);
            read only with a ``store``.
        idle_after: seconds of disuse after which a held context leaves
            memory (300.0; ``math.inf``: never); read only with a ``store``.
        owner: this manager's name in leases (None: ``turnloom-`` and a
            random hex); read only with a ``store``.
        prompt_cache: what ``request_body`` and ``request_bytes`` add for the
            provider's prompt cache (default None: nothing): Anthropic
            breakpoints within the budget of 4, an OpenAI
            ``prompt_cache_key`` per context
            (:class:`~turnloom.context.cache.PromptCache`).
    """

    gateway: GatewayType | str | Gateway = GatewayType.openai_chat
    max_pending_preparations: int = 16
    history_limits: HistoryLimits | None = None
    behavior_rules: str | None = None
    open_calls: OpenCallPolicy = "exclude"
    earlier_state: EarlierStatePolicy = "keep"
    token_counter: TokenCounter | None = None
    strategy: str | AssemblyStrategy | None = None
    memory: MemorySource | None = None
    strategy_options: StrategyOptions | None = None
    max_tenant_preparations: int | None = None
    store: ContextStore | None = None
    lease_ttl: float = 10.0
    idle_after: float = 300.0
    owner: str | None = None
    prompt_cache: PromptCache | None = None


class ManagerKwargs(TypedDict, total=False):
    """:class:`ManagerSettings` as keyword arguments, for type checkers (same names and types)."""

    gateway: GatewayType | str | Gateway
    max_pending_preparations: int
    history_limits: HistoryLimits | None
    behavior_rules: str | None
    open_calls: OpenCallPolicy
    earlier_state: EarlierStatePolicy
    token_counter: TokenCounter | None
    strategy: str | AssemblyStrategy | None
    memory: MemorySource | None
    strategy_options: StrategyOptions | None
    max_tenant_preparations: int | None
    store: ContextStore | None
    lease_ttl: float
    idle_after: float
    owner: str | None
    prompt_cache: PromptCache | None
