"""The async runtime: Foundation, ContextManager, bounded preparations.

Everything here runs on one event loop through anyio (asyncio or trio); CPU
work goes to worker threads through the Foundation's limiter.
"""

from __future__ import annotations

__all__ = (
    "STATE_TOOL_NAME",
    "AreaPass",
    "AreaStatistics",
    "ContextContribution",
    "ContextManager",
    "ContextPrepareRequest",
    "Foundation",
    "FoundationClosedError",
    "HistoryLimits",
    "HistoryTotals",
    "Invocation",
    "LatencyHistograms",
    "ManagerStatistics",
    "PrefixStatistics",
    "PreparationStatistics",
    "PreparedContext",
    "TurnSnapshot",
    "state_call_id",
    "state_tool_definition",
)

from turnloom.context.history import HistoryLimits
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.manager import ContextManager, Invocation
from turnloom.runtime.schemas import (
    AreaPass,
    AreaStatistics,
    ContextContribution,
    ContextPrepareRequest,
    HistoryTotals,
    LatencyHistograms,
    ManagerStatistics,
    PrefixStatistics,
    PreparationStatistics,
    PreparedContext,
    TurnSnapshot,
)
from turnloom.runtime.state import STATE_TOOL_NAME, state_call_id, state_tool_definition
