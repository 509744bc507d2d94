"""The lock of a shared WorkingContext: the value layer's one use of anyio.

``turnloom.context`` never imports an event-loop library:
everything there must run in a worker thread that owns its data. Only
``WorkingContext.lock`` and ``apply_locked`` need a lock, and only when a
coroutine asks for one. They import this module at that moment, so importing
``turnloom.context`` -- and every pure operation on a context -- never loads
anyio, while the lock itself is an ``anyio.Lock`` that works on asyncio and on
trio. It lives here rather than in ``turnloom.runtime`` so that the value layer
does not depend on the runtime layer above it.
"""

from __future__ import annotations

__all__ = ("new_lock",)

import anyio


def new_lock() -> anyio.Lock:
    """A new, unlocked ``anyio.Lock``; it binds to the event loop that first awaits it."""
    return anyio.Lock()
