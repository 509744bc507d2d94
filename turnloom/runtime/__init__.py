"""The async runtime: Foundation, ContextManager, bounded preparations.

Everything here runs on one event loop through anyio (asyncio or trio); CPU
work goes to worker threads: renders to the Foundation's render thread, other
work through its limiter.
"""

from __future__ import annotations

__all__ = (
    "CONTEXT_PLUGIN_GROUP",
    "HYDRATE_TOOL_NAME",
    "STATE_TOOL_NAME",
    "STRATEGIES",
    "AreaPass",
    "AreaStatistics",
    "Areas",
    "AssembledContext",
    "Assembly",
    "AssemblyMetadata",
    "AssemblyStatistics",
    "AssemblyStrategy",
    "Bridge",
    "CollectorPolicy",
    "CollectorStatistics",
    "ContextConfig",
    "ContextContribution",
    "ContextInitConfig",
    "ContextManager",
    "ContextPlugin",
    "ContextPrepareRequest",
    "DefaultContextPlugin",
    "EarlierStatePolicy",
    "Foundation",
    "FoundationClosedError",
    "HistoryLimits",
    "HistoryTotals",
    "HydratingStrategy",
    "Hydration",
    "Invocation",
    "JITStrategy",
    "LatencyHistograms",
    "Leases",
    "ManagerOptions",
    "ManagerSettings",
    "ManagerStatistics",
    "OutputRecord",
    "OutputStatistics",
    "OutputStreams",
    "Perception",
    "PrefixStatistics",
    "PreparationStatistics",
    "PreparedContext",
    "RuntimeConfig",
    "StoreStatistics",
    "StrategyOptions",
    "StratifiedStrategy",
    "Summaries",
    "Summarizer",
    "SummaryStatistics",
    "TurnSnapshot",
    "Voice",
    "build_context_manager",
    "context_plugin_names",
    "load_config",
    "make_strategy",
    "parse_config",
    "resolve_context_plugin",
    "state_call_id",
    "state_tool_definition",
)

from turnloom.context.history import HistoryLimits
from turnloom.runtime._areas import Areas
from turnloom.runtime._assembly import Assembly
from turnloom.runtime._bridge import Bridge
from turnloom.runtime._collector import CollectorPolicy, CollectorStatistics
from turnloom.runtime._door import ManagerOptions
from turnloom.runtime._invocation import Invocation
from turnloom.runtime._leases import Leases
from turnloom.runtime._options import ManagerSettings
from turnloom.runtime._outputs import OutputStreams
from turnloom.runtime._strategies import STRATEGIES, JITStrategy, StratifiedStrategy, make_strategy
from turnloom.runtime._summaries import Summaries, Summarizer
from turnloom.runtime._voice import Voice
from turnloom.runtime.assembly import (
    HYDRATE_TOOL_NAME,
    AssembledContext,
    AssemblyMetadata,
    AssemblyStrategy,
    HydratingStrategy,
    Hydration,
    StrategyOptions,
)
from turnloom.runtime.config import (
    CONTEXT_PLUGIN_GROUP,
    ContextConfig,
    ContextInitConfig,
    ContextPlugin,
    DefaultContextPlugin,
    RuntimeConfig,
    build_context_manager,
    context_plugin_names,
    load_config,
    parse_config,
    resolve_context_plugin,
)
from turnloom.runtime.errors import FoundationClosedError
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.manager import ContextManager
from turnloom.runtime.schemas import (
    AreaPass,
    AreaStatistics,
    AssemblyStatistics,
    ContextContribution,
    ContextPrepareRequest,
    HistoryTotals,
    LatencyHistograms,
    ManagerStatistics,
    OutputRecord,
    OutputStatistics,
    Perception,
    PrefixStatistics,
    PreparationStatistics,
    PreparedContext,
    StoreStatistics,
    SummaryStatistics,
    TurnSnapshot,
)
from turnloom.runtime.state import (
    STATE_TOOL_NAME,
    EarlierStatePolicy,
    state_call_id,
    state_tool_definition,
)
