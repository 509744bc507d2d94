"""The leases a store object issued: the owner and epoch each write must present.

A runtime writes with a context's fencing token alone; the store remembers
who took that token (and, for Redis, the store epoch it was issued in) and
sends them along, so the check inside the store compares the owner and the
epoch as well as the token. A token issued again by a store that lost its
data (or pruned a context) to another owner, or in another epoch, does not
let a stale owner's write through.
"""

from __future__ import annotations

__all__ = ("Holds",)


class Holds:
    """Context id -> (token, owner, epoch) of the newest lease this store object issued."""

    __slots__ = ("_held",)

    def __init__(self) -> None:
        self._held: dict[str, tuple[int, str, str]] = {}

    def issued(self, context_id: str, token: int, owner: str, epoch: str = "") -> None:
        """Remember the lease just taken."""
        self._held[context_id] = (token, owner, epoch)

    def owner(self, context_id: str, token: int) -> str:
        """The owner that took ``token``, or ``""`` (matches no lease) when not issued here."""
        held = self._held.get(context_id)
        return held[1] if held is not None and held[0] == token else ""

    def epoch(self, context_id: str, token: int) -> str:
        """The epoch ``token`` was issued in, or ``""`` (matches no lease)."""
        held = self._held.get(context_id)
        return held[2] if held is not None and held[0] == token else ""

    def drop(self, context_id: str, token: int) -> None:
        """Forget a lease given up, refused or lost (only when it is still ``token``)."""
        held = self._held.get(context_id)
        if held is not None and held[0] == token:
            del self._held[context_id]
