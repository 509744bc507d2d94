"""The turn ids the adapters give the turns they commit: written once for every adapter."""

from __future__ import annotations

__all__ = ("new_turn_id",)

import secrets


def new_turn_id() -> str:
    """A fresh turn id: ``"t-"`` and 16 random hex digits (64 bits, unique in practice)."""
    return f"t-{secrets.token_hex(8)}"
