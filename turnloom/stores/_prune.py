"""The argument both stores' ``prune`` take, checked in one place."""

from __future__ import annotations

__all__ = ("check_older_than",)

from turnloom.errors import InputError


def check_older_than(older_than: float) -> None:
    """Raise :class:`InputError` unless ``older_than`` (seconds) is a non-negative number."""
    if not isinstance(older_than, int | float) or not older_than >= 0:
        raise InputError(
            f"older_than must be a non-negative number of seconds, not {older_than!r}."
        )
