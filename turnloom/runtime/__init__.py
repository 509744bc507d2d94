"""The async runtime: Foundation, ContextManager, bounded preparations (seed 004)."""

from __future__ import annotations

__all__ = ()
