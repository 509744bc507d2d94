"""Synchronous, pure core of turnloom: messages, gateways, Context, CoopContext,
WorkingContext, scopes, token counters, tenant scopes and the memory protocol.

Nothing here imports an event-loop library; every function may be called from
a worker thread that owns its data.
"""

from __future__ import annotations

__all__ = (
    "CANCELLED_RESULT_TEXT",
    "AllOf",
    "AnyOf",
    "ApproxTokenCounter",
    "AreaFlowState",
    "AreaLifeState",
    "CallIdRenamer",
    "CallTracker",
    "CollectionPlan",
    "CollectionReport",
    "CompactionPolicy",
    "Context",
    "ContextAreaImplementation",
    "ContextDiff",
    "ContextScope",
    "CoopContext",
    "CoopStatistics",
    "EffectRange",
    "FrozenContext",
    "FrozenDict",
    "Gateway",
    "GatewayType",
    "HistoryLimits",
    "HistoryStatistics",
    "HistoryView",
    "HydratedMemory",
    "ImagePart",
    "ImageRule",
    "ImageSizeHook",
    "LastNTurns",
    "MemoryEntry",
    "MemorySource",
    "Message",
    "MutationJournal",
    "NativeContent",
    "Not",
    "OpaquePart",
    "OpenAITokenCounter",
    "OpenCallPolicy",
    "PairingStep",
    "Part",
    "PositionalScope",
    "PrefixContext",
    "PromptCache",
    "PrunePolicy",
    "ReasoningPart",
    "Role",
    "RoleFilter",
    "Since",
    "StepConflict",
    "StepJoin",
    "Tagged",
    "TenantScope",
    "TextPart",
    "TokenCounter",
    "ToolCallPart",
    "ToolResultPart",
    "TurnHistory",
    "Violation",
    "WorkingContext",
    "admit_message",
    "approx_text_tokens",
    "check_id",
    "check_message",
    "check_steps",
    "check_summary",
    "check_tenant_scope",
    "complete_pairs",
    "decode_message",
    "deep_freeze",
    "encode_message",
    "estimate_message_tokens",
    "get_gateway",
    "hold_until_answered",
    "image_size",
    "image_tokens",
    "join_steps",
    "memory_payload",
    "message_size",
    "open_call_ids",
    "plan_collection",
    "played_count",
    "played_prefix",
    "prune_messages",
    "rename_call_ids",
    "scope_indices",
)

from turnloom.context import gateways as _gateways  # registers the built-in gateways
from turnloom.context.area import (
    AreaFlowState,
    AreaLifeState,
    ContextAreaImplementation,
    EffectRange,
)
from turnloom.context.cache import PromptCache
from turnloom.context.callids import CallIdRenamer, rename_call_ids
from turnloom.context.coop import (
    CollectionPlan,
    CollectionReport,
    CoopContext,
    CoopStatistics,
    plan_collection,
)
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, Violation, get_gateway
from turnloom.context.history import (
    HistoryLimits,
    HistoryStatistics,
    HistoryView,
    TurnHistory,
    check_id,
)
from turnloom.context.interruption import played_count, played_prefix
from turnloom.context.journal import MutationJournal
from turnloom.context.memory import (
    HydratedMemory,
    MemoryEntry,
    MemorySource,
    TenantScope,
    check_tenant_scope,
    memory_payload,
)
from turnloom.context.message import (
    ImagePart,
    Message,
    OpaquePart,
    Part,
    ReasoningPart,
    Role,
    TextPart,
    ToolCallPart,
    ToolResultPart,
    admit_message,
    check_message,
    decode_message,
    encode_message,
    message_size,
)
from turnloom.context.native import Context
from turnloom.context.pairing import (
    CANCELLED_RESULT_TEXT,
    CallTracker,
    OpenCallPolicy,
    PairingStep,
    StepConflict,
    StepJoin,
    check_steps,
    complete_pairs,
    hold_until_answered,
    join_steps,
    open_call_ids,
)
from turnloom.context.scope import (
    AllOf,
    AnyOf,
    ContextScope,
    LastNTurns,
    Not,
    PositionalScope,
    RoleFilter,
    Since,
    Tagged,
    scope_indices,
)
from turnloom.context.summaries import (
    CompactionPolicy,
    PrunePolicy,
    check_summary,
    prune_messages,
)
from turnloom.context.tokens import (
    ApproxTokenCounter,
    ImageRule,
    ImageSizeHook,
    OpenAITokenCounter,
    TokenCounter,
    approx_text_tokens,
    estimate_message_tokens,
    image_size,
    image_tokens,
)
from turnloom.context.working import (
    ContextDiff,
    FrozenContext,
    FrozenDict,
    PrefixContext,
    WorkingContext,
    deep_freeze,
)

del _gateways
