"""Tenant scopes and memory: who a turn belongs to, and what memory is recalled for it.

A :class:`TenantScope` names the tenant (and optionally a sub-tenant and a
namespace) a request acts for. It is identity, not policy: it always travels
to the assembled prompt and to the memory source, whether or not memory is
recalled on a turn.

A :class:`MemorySource` searches stored memory by a free-text query *within*
one scope and returns at most ``top_k`` :class:`MemoryEntry` values, best
first. Sources are borrowed: whoever binds a source to a runtime keeps
ownership and closes it.

:func:`memory_payload` is the one size rule for recalled memory: every place
that shows entries to a model (the per-turn layer of a stratified prompt, the
``hydrate_context`` tool result) goes through it.

Pure data and protocols; nothing here waits.
"""

from __future__ import annotations

__all__ = (
    "MAX_SCOPE_ID_LENGTH",
    "HydratedMemory",
    "MemoryEntry",
    "MemorySource",
    "TenantScope",
    "check_tenant_scope",
    "memory_payload",
)

from collections.abc import Sequence
from typing import Any, Protocol, runtime_checkable

import msgspec

from turnloom.errors import InvalidMessageError, excerpt, what_type

MAX_SCOPE_ID_LENGTH = 128
"""The longest tenant, sub-tenant or namespace id, in characters."""


class TenantScope(msgspec.Struct, frozen=True, kw_only=True):
    """The tenant a request acts for.

    Memory entries belong to exactly one scope (the triple below); a search
    in a scope sees only the entries stored with that same triple.

    Attributes:
        tenant_id: the tenant; a printable string of 1 to 128 characters.
        sub_tenant_id: a sub-tenant (an end user of the tenant), or None.
        namespace: a namespace inside the (sub-)tenant, or None.
    """

    tenant_id: str
    sub_tenant_id: str | None = None
    namespace: str | None = None


def _check_scope_id(value: object, field: str) -> None:
    if not isinstance(value, str) or not value:
        raise InvalidMessageError(
            f"{field} must be a non-empty string, not {what_type(value)} "
            f"({excerpt(str(value)[:32])}).",
            field=field,
        )
    if len(value) > MAX_SCOPE_ID_LENGTH:
        raise InvalidMessageError(
            f"{field} {excerpt(value[:32])}... is {len(value)} characters; at most "
            f"{MAX_SCOPE_ID_LENGTH} are allowed.",
            field=field,
        )
    if not value.isprintable():
        raise InvalidMessageError(
            f"{field} {excerpt(value[:32])} holds a control or non-printable character.",
            field=field,
        )
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidMessageError(
            f"{field} {excerpt(value[:32])} is not valid UTF-8.", field=field
        ) from None


def check_tenant_scope(scope: object, field: str = "scope") -> TenantScope | None:
    """Validate a tenant scope: None, or a :class:`TenantScope` of printable ids.

    Args:
        scope: the value to check.
        field: how errors name it (``"tenant"`` for a prepare request's).

    Returns:
        ``scope``, checked.

    Raises:
        InvalidMessageError: not a TenantScope, or an id that is empty, longer
            than :data:`MAX_SCOPE_ID_LENGTH`, not printable (a newline, a
            control character) or not valid UTF-8; its ``field`` names it
            (``"tenant.tenant_id"``).
    """
    if scope is None:
        return None
    if not isinstance(scope, TenantScope):
        raise InvalidMessageError(
            f"{field} must be a TenantScope or None, not {what_type(scope)}.", field=field
        )
    _check_scope_id(scope.tenant_id, f"{field}.tenant_id")
    if scope.sub_tenant_id is not None:
        _check_scope_id(scope.sub_tenant_id, f"{field}.sub_tenant_id")
    if scope.namespace is not None:
        _check_scope_id(scope.namespace, f"{field}.namespace")
    return scope


class MemoryEntry(msgspec.Struct, frozen=True, kw_only=True):
    """One recalled memory.

    Attributes:
        id: the entry's id, unique within its scope.
        text: the remembered text.
        score: relevance to the query; higher is better (for the SQLite store,
            the negated BM25 rank).
        source: where the entry came from (a file name, a URL, ``"cli"``).
    """

    id: str
    text: str
    score: float
    source: str


class HydratedMemory(msgspec.Struct, frozen=True, kw_only=True):
    """The memory recalled for one turn.

    Attributes:
        query: the text searched for.
        scope: the scope searched in.
        entries: the entries found, best first (at most the strategy's top-k).
    """

    query: str
    scope: TenantScope
    entries: tuple[MemoryEntry, ...]


@runtime_checkable
class MemorySource(Protocol):
    """Searchable memory, isolated by tenant scope. Borrowed, never owned, by the runtime."""

    async def search(self, query: str, *, scope: TenantScope, top_k: int) -> Sequence[MemoryEntry]:
        """The entries of ``scope`` that best match ``query``, best first.

        Args:
            query: free text (not a query language): the source decides how
                to match it.
            scope: only entries stored in exactly this scope may be returned.
            top_k: the most entries to return (at least 1).

        Returns:
            at most ``top_k`` entries, best first; empty when nothing matches.

        Raises:
            MemoryStoreError: the source failed.

        Cancellation:
            Implementations say what a cancelled search leaves behind; a search
            never changes the stored memory.
        """
        ...


def memory_payload(
    entries: Sequence[MemoryEntry], max_chars: int
) -> tuple[list[dict[str, Any]], int]:
    """The entries as JSON data for a model, their texts capped at ``max_chars`` in total.

    Entries are kept in order while their texts fit; the first entry that does
    not fit is cut to the characters left (and marked ``"truncated": true``)
    when any are left, and every later entry is omitted. Scores are rounded
    to 4 decimals.

    Args:
        entries: best first.
        max_chars: the most characters of entry text in the payload (>= 0).

    Returns:
        ``(payload, omitted)``: a list of ``{"id", "source", "score", "text"}``
        objects (plus ``"truncated"`` on a cut entry), and how many entries
        were left out entirely.
    """
    payload: list[dict[str, Any]] = []
    left = max_chars
    for index, entry in enumerate(entries):
        item: dict[str, Any] = {
            "id": entry.id,
            "source": entry.source,
            "score": round(entry.score, 4),
        }
        if len(entry.text) <= left:
            item["text"] = entry.text
            left -= len(entry.text)
            payload.append(item)
            continue
        if left > 0:
            item["text"] = entry.text[:left]
            item["truncated"] = True
            payload.append(item)
            index += 1
        return payload, len(entries) - index
    return payload, 0
