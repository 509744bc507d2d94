"""Synchronous, pure core of turnloom: messages, gateways, Context, CoopContext.

Nothing here imports an event-loop library; every function may be called from
a worker thread that owns its data.
"""

from __future__ import annotations

__all__ = (
    "CANCELLED_RESULT_TEXT",
    "AreaFlowState",
    "AreaLifeState",
    "CallTracker",
    "CollectionPlan",
    "CollectionReport",
    "Context",
    "ContextAreaImplementation",
    "CoopContext",
    "CoopStatistics",
    "EffectRange",
    "Gateway",
    "GatewayType",
    "HistoryLimits",
    "HistoryStatistics",
    "ImagePart",
    "Message",
    "NativeContent",
    "OpaquePart",
    "OpenCallPolicy",
    "PairingStep",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "TurnHistory",
    "Violation",
    "check_message",
    "complete_pairs",
    "decode_message",
    "encode_message",
    "get_gateway",
    "hold_until_answered",
    "message_size",
    "open_call_ids",
    "plan_collection",
    "played_prefix",
)

from turnloom.context import gateways as _gateways  # registers the built-in gateways
from turnloom.context.area import (
    AreaFlowState,
    AreaLifeState,
    ContextAreaImplementation,
    EffectRange,
)
from turnloom.context.coop import (
    CollectionPlan,
    CollectionReport,
    CoopContext,
    CoopStatistics,
    plan_collection,
)
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, Violation, get_gateway
from turnloom.context.history import HistoryLimits, HistoryStatistics, TurnHistory
from turnloom.context.interruption import played_prefix
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
    complete_pairs,
    hold_until_answered,
    open_call_ids,
)

del _gateways
