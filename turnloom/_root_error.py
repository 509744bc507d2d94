"""The root of turnloom's errors, in a file of its own.

:mod:`turnloom.errors` hands out :class:`~turnloom.errors.FoundationClosedError`
from :mod:`turnloom.runtime.errors` on first use, and that class subclasses
the root; defining the root here lets the runtime's errors subclass it without
importing :mod:`turnloom.errors`, so the two modules form no import circle.
Import it as ``turnloom.errors.TurnloomError``.
"""

from __future__ import annotations

__all__ = ("TurnloomError",)


class TurnloomError(Exception):
    """Root of every error turnloom raises on purpose."""


TurnloomError.__module__ = "turnloom.errors"  # where users import it from
