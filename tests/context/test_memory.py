"""Tenant scopes at the door, and the one size rule for recalled memory."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnloom.context.memory import (
    MAX_SCOPE_ID_LENGTH,
    MemoryEntry,
    TenantScope,
    check_tenant_scope,
    memory_payload,
)
from turnloom.errors import InvalidMessageError


def _entry(i: int, text: str) -> MemoryEntry:
    return MemoryEntry(id=f"e{i}", text=text, score=1.0 / (i + 1), source="s")


@pytest.mark.parametrize(
    ("scope", "field"),
    [
        ("acme", "scope"),
        (TenantScope(tenant_id=""), "scope.tenant_id"),
        (TenantScope(tenant_id="x" * (MAX_SCOPE_ID_LENGTH + 1)), "scope.tenant_id"),
        (TenantScope(tenant_id="a\nb"), "scope.tenant_id"),
        (TenantScope(tenant_id="a", sub_tenant_id="\x00"), "scope.sub_tenant_id"),
        (TenantScope(tenant_id="a", namespace="\ud800"), "scope.namespace"),
        (TenantScope(tenant_id=7), "scope.tenant_id"),  # type: ignore[arg-type]
    ],
)
def test_each_kind_of_bad_scope_is_rejected_naming_its_field(scope: object, field: str) -> None:
    with pytest.raises(InvalidMessageError) as caught:
        check_tenant_scope(scope)
    assert caught.value.field == field


def test_a_good_scope_and_none_pass_the_door_unchanged() -> None:
    scope = TenantScope(tenant_id="acme", sub_tenant_id="u-1", namespace="trips")
    assert check_tenant_scope(scope) is scope
    assert check_tenant_scope(None) is None


def test_the_payload_cuts_the_first_entry_that_does_not_fit_and_omits_the_rest() -> None:
    entries = [_entry(0, "abcd"), _entry(1, "efghij"), _entry(2, "kl")]
    payload, omitted = memory_payload(entries, 7)
    assert payload == [
        {"id": "e0", "source": "s", "score": 1.0, "text": "abcd"},
        {"id": "e1", "source": "s", "score": 0.5, "text": "efg", "truncated": True},
    ]
    assert omitted == 1


def test_an_exactly_full_payload_omits_the_next_entry_without_an_empty_cut() -> None:
    payload, omitted = memory_payload([_entry(0, "abcd"), _entry(1, "ef")], 4)
    assert payload == [{"id": "e0", "source": "s", "score": 1.0, "text": "abcd"}]
    assert omitted == 1


@given(
    texts=st.lists(st.text(min_size=1, max_size=40), max_size=12),
    cap=st.integers(min_value=0, max_value=200),
)
def test_payload_texts_never_exceed_the_cap_and_keep_rank_order(texts: list[str], cap: int) -> None:
    """The size rule: total text <= cap; entries are a rank-order prefix; counts add up."""
    entries = [_entry(i, t) for i, t in enumerate(texts)]
    payload, omitted = memory_payload(entries, cap)
    assert sum(len(item["text"]) for item in payload) <= cap
    assert [item["id"] for item in payload] == [e.id for e in entries[: len(payload)]]
    assert len(payload) + omitted == len(entries)
    for item, entry in zip(payload, entries, strict=False):
        assert entry.text.startswith(item["text"])
        assert item.get("truncated", False) == (item["text"] != entry.text)
    if sum(len(t) for t in texts) <= cap:
        assert omitted == 0 and [i["text"] for i in payload] == texts
