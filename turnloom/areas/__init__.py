"""Built-in Context Areas (seed 000)."""

from __future__ import annotations

__all__ = ()
