"""Optional adapters to the frameworks hosts build on, one module per framework.

Each adapter is the only module that imports its framework and is installed
with its extra; importing this package imports no framework:

* :mod:`turnloom.integrations.openai_agents` (``pip install 'turnloom[openai-agents]'``):
  :class:`~turnloom.integrations.openai_agents.TurnloomSession`, an OpenAI Agents
  SDK ``Session`` backed by a turnloom context.
"""

from __future__ import annotations

__all__ = ()
