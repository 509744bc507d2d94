"""Synchronous, pure core of turnloom: messages, gateways, Context.

Nothing here imports an event-loop library; every function may be called from
a worker thread that owns its data.
"""

from __future__ import annotations

__all__ = (
    "Context",
    "Gateway",
    "GatewayType",
    "ImagePart",
    "Message",
    "NativeContent",
    "OpaquePart",
    "Part",
    "ReasoningPart",
    "Role",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "Violation",
    "check_message",
    "decode_message",
    "encode_message",
    "get_gateway",
    "message_size",
)

from turnloom.context import gateways as _gateways  # registers the built-in gateways
from turnloom.context.gateway import Gateway, GatewayType, NativeContent, Violation, get_gateway
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

del _gateways
