"""Built-in gateways; importing this package registers them with ``get_gateway``."""

from __future__ import annotations

__all__ = ("AnthropicGateway", "GeminiGateway", "OpenAIChatGateway", "OpenAIResponsesGateway")

from turnloom.context.gateways.anthropic import AnthropicGateway
from turnloom.context.gateways.gemini import GeminiGateway
from turnloom.context.gateways.openai_chat import OpenAIChatGateway
from turnloom.context.gateways.openai_responses import OpenAIResponsesGateway
