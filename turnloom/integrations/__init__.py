"""Optional adapters to the frameworks hosts build on, one module per framework.

Each adapter is the only module that imports its framework and is installed
with its extra; importing this package imports no framework:

* :mod:`turnloom.integrations.openai_agents` (``pip install 'turnloom[openai-agents]'``):
  :class:`~turnloom.integrations.openai_agents.TurnloomSession`, an OpenAI Agents
  SDK ``Session`` backed by a turnloom context.
* :mod:`turnloom.integrations.livekit` (``pip install 'turnloom[livekit]'``):
  :class:`~turnloom.integrations.livekit.TurnloomAgent`, a LiveKit Agents
  ``Agent`` whose ``llm_node`` sends turnloom's prepared input (asyncio only).
* :mod:`turnloom.integrations.pipecat` (``pip install 'turnloom[pipecat]'``):
  :class:`~turnloom.integrations.pipecat.TurnloomContextAggregatorPair`, a
  Pipecat context aggregator pair whose ``LLMContext`` is turnloom's prepared
  input and whose assistant side records what the TTS spoke (asyncio only).

Process model (measured by ``scripts/bench_process_model.py``): one
Foundation per process and one context per call; LiveKit's process executor
means one Foundation per job process, its thread executor one per job thread
(a Foundation serves one event loop); a Pipecat or daemon host shares one
Foundation among its calls. The jobs of a machine share one SQLite store, a
fleet one Redis store, and leases hand a call over when its process dies.
"""

from __future__ import annotations

__all__ = ()
