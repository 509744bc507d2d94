"""Tenant isolation as a property: no entry of one tenant reaches another tenant's turn."""

from __future__ import annotations

import json

import anyio
import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.runtime.helpers import user
from turnloom.context import TenantScope, ToolCallPart
from turnloom.runtime import HYDRATE_TOOL_NAME, ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.stores import SQLiteMemory

_WORDS = ("seat", "refund", "baggage", "upgrade", "meal", "lounge")
_TENANTS = ("t0", "t1", "t2")

_scope = st.builds(
    TenantScope,
    tenant_id=st.sampled_from(_TENANTS),
    sub_tenant_id=st.one_of(st.none(), st.sampled_from(("u1", "u2"))),
)
# One memory: its scope and the word it is about.
_rows = st.lists(st.tuples(_scope, st.sampled_from(_WORDS)), min_size=1, max_size=24)


def _tag(n: int) -> str:
    return f"zq{n}xk"  # a token no other text holds


async def _run(
    gateway: str, rows: list[tuple[TenantScope, str]], turns: list[list[TenantScope]]
) -> None:
    owner: dict[str, TenantScope] = {}
    with SQLiteMemory() as memory:
        for n, (scope, word) in enumerate(rows):
            memory.add(f"{word} note {_tag(n)}", scope=scope, entry_id=_tag(n))
            owner[_tag(n)] = scope
        question = " ".join(_WORDS)
        for strategy in ("stratified", "jit"):
            async with Foundation(gateway=gateway, strategy=strategy, memory=memory) as f:
                manager = f.manager
                for i, scopes in enumerate(turns):
                    context_id = f"c{i % 2}"
                    turn_id = f"t{i}"
                    manager.accept_turn(
                        TurnSnapshot(
                            context_id=context_id, turn_id=turn_id, input=(user(question),)
                        )
                    )
                    # Every tenant preparing this turn (one turn may be prepared for several).
                    for j, scope in enumerate(scopes):
                        prefix = await manager.prepare(
                            ContextPrepareRequest(
                                context_id=context_id, turn_id=turn_id, tenant=scope
                            )
                        )
                        seen = msgspec.json.encode(prefix.items).decode()
                        if strategy == "jit":
                            call = ToolCallPart(
                                call_id=f"k{i}-{j}",
                                name=HYDRATE_TOOL_NAME,
                                arguments=json.dumps({"query": question}),
                            )
                            answer = await manager.assembly.hydrate_context(prefix, call)
                            seen += msgspec.json.encode(answer).decode()
                        leaked = [tag for tag, o in owner.items() if o != scope and tag in seen]
                        assert leaked == [], f"{strategy}: {scope} saw {leaked}"
                        mine = [tag for tag, o in owner.items() if o == scope]
                        # Not vacuous: with up to 5 entries recalled, a tenant sees its own.
                        assert any(tag in seen for tag in mine) == bool(mine)


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
@settings(max_examples=25)
@given(
    rows=_rows,
    turns=st.lists(st.lists(_scope, min_size=1, max_size=2), min_size=1, max_size=4),
    anthropic=st.booleans(),
)
def test_no_entry_of_one_tenant_appears_in_another_tenants_input_or_tool_result(
    backend: str,
    rows: list[tuple[TenantScope, str]],
    turns: list[list[TenantScope]],
    anthropic: bool,
) -> None:
    """For random tenants and memories, every prepared input (stratified) and every
    ``hydrate_context`` result (JIT) holds entries of its own scope only."""
    gateway = "anthropic" if anthropic else "openai_chat"
    anyio.run(_run, gateway, rows, turns, backend=backend)
