"""Lifecycle errors of the runtime, which mirror anyio's.

They are defined here rather than in :mod:`turnloom.errors` so that the
synchronous ``turnloom.context`` layer never imports an event-loop library;
:mod:`turnloom.errors` hands them out on first use, so both import paths give
the same class.
"""

from __future__ import annotations

__all__ = ("FoundationClosedError",)

import anyio

from turnloom._root_error import TurnloomError


class FoundationClosedError(TurnloomError, anyio.ClosedResourceError):
    """The Foundation (and its ContextManager) is closing or closed.

    Raised by every call made after :meth:`~turnloom.runtime.Foundation.aclose`
    began, and by calls that were still waiting (for their turn's commit,
    holding no slot, for a slot, or as admitted preparations) when it did.
    It is an :class:`anyio.ClosedResourceError`, so code that already handles
    closed anyio resources handles it too.
    """
