"""Optional adapters to the frameworks hosts build on, one module per framework.

Each adapter is the only module that imports its framework and is installed
with its extra; importing this package imports no framework:

* :mod:`turnloom.integrations.openai_agents` (``pip install 'turnloom[openai-agents]'``):
  :class:`~turnloom.integrations.openai_agents.TurnloomSession`, an OpenAI Agents
  SDK ``Session`` backed by a turnloom context.
* :mod:`turnloom.integrations.livekit` (``pip install 'turnloom[livekit]'``):
  :class:`~turnloom.integrations.livekit.TurnloomAgent`, a LiveKit Agents
  ``Agent`` whose ``llm_node`` sends turnloom's prepared input (asyncio only).
"""

from __future__ import annotations

__all__ = ()
