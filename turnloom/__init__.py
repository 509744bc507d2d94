"""turnloom: a cooperative context runtime for LLM agents.

The names most programs need are importable from here::

    from turnloom import ContextPrepareRequest, Foundation, Message, Role, TurnSnapshot

Each is the object of the subpackage that defines it (``turnloom.Foundation is
turnloom.runtime.Foundation``). They are imported on first use, so ``import
turnloom`` stays as cheap as importing :mod:`turnloom.errors`; the full public
surface of each layer is in :mod:`turnloom.context`, :mod:`turnloom.runtime`,
:mod:`turnloom.stores` and :mod:`turnloom.errors`.
"""

from __future__ import annotations

__all__ = (
    "ContextManager",
    "ContextPrepareRequest",
    "Foundation",
    "FoundationClosedError",
    "Gateway",
    "GatewayType",
    "HistoryLimits",
    "HistoryView",
    "ImagePart",
    "ManagerOptions",
    "Message",
    "MetricsServer",
    "NativeContent",
    "PreparedContext",
    "PromptCache",
    "Role",
    "RuntimeConfig",
    "TenantScope",
    "TextPart",
    "ToolCallPart",
    "ToolResultPart",
    "TurnSnapshot",
    "TurnloomError",
    "__version__",
    "get_gateway",
    "load_config",
    "open_context_store",
    "serve_metrics",
)

import importlib
from typing import TYPE_CHECKING

from turnloom.errors import TurnloomError

if TYPE_CHECKING:
    from turnloom.context import (
        Gateway,
        GatewayType,
        HistoryLimits,
        HistoryView,
        ImagePart,
        Message,
        NativeContent,
        PromptCache,
        Role,
        TenantScope,
        TextPart,
        ToolCallPart,
        ToolResultPart,
        get_gateway,
    )
    from turnloom.runtime import (
        ContextManager,
        ContextPrepareRequest,
        Foundation,
        FoundationClosedError,
        ManagerOptions,
        PreparedContext,
        RuntimeConfig,
        TurnSnapshot,
        load_config,
    )
    from turnloom.runtime.metrics import MetricsServer, serve_metrics
    from turnloom.stores import open_context_store

from turnloom._version import __version__

# Which module defines each lazily imported name.
_HOMES = {
    **dict.fromkeys(
        (
            "Gateway",
            "GatewayType",
            "HistoryLimits",
            "HistoryView",
            "ImagePart",
            "Message",
            "NativeContent",
            "PromptCache",
            "Role",
            "TenantScope",
            "TextPart",
            "ToolCallPart",
            "ToolResultPart",
            "get_gateway",
        ),
        "turnloom.context",
    ),
    **dict.fromkeys(
        (
            "ContextManager",
            "ContextPrepareRequest",
            "Foundation",
            "FoundationClosedError",
            "ManagerOptions",
            "PreparedContext",
            "RuntimeConfig",
            "TurnSnapshot",
            "load_config",
        ),
        "turnloom.runtime",
    ),
    "MetricsServer": "turnloom.runtime.metrics",
    "serve_metrics": "turnloom.runtime.metrics",
    "open_context_store": "turnloom.stores",
}


def __getattr__(name: str) -> object:
    """Import a public name from the module that defines it, once.

    Raises:
        AttributeError: ``name`` is not one of turnloom's top-level names.
    """
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(home), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
