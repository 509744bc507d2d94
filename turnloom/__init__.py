"""turnloom: a cooperative context runtime for LLM agents."""

from __future__ import annotations

__all__ = ("TurnloomError", "__version__")

from turnloom.errors import TurnloomError

__version__ = "0.1.0"
