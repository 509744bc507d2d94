"""The prompt-cache option (issue 30): request bodies, cache keys, the cache metric.

``Foundation(prompt_cache=PromptCache())`` makes ``manager.request_body`` and
``request_bytes`` add the provider's cache fields (Anthropic breakpoints
within the budget of 4, OpenAI ``prompt_cache_key``); every prefix reports
the bytes and tokens it shares with the context's previous one, and the
statistics and Prometheus carry the running shares labelled by gateway only.
"""

from __future__ import annotations

import urllib.request
from typing import Any

import anyio
import msgspec
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.runtime.helpers import SYSTEM, assistant, call, result, user
from turnloom.context import GatewayType
from turnloom.context.cache import PromptCache, anthropic_breakpoints, prompt_cache_key
from turnloom.context.gateways import AnthropicGateway
from turnloom.context.history import HistoryLimits
from turnloom.errors import InputError, InvalidArgumentError
from turnloom.runtime import ContextPrepareRequest, Foundation, PreparedContext, TurnSnapshot
from turnloom.runtime.config import build_context_manager, parse_config
from turnloom.runtime.manager import ContextManager
from turnloom.runtime.metrics import serve_metrics

pytestmark = pytest.mark.anyio

_encode = msgspec.json.Encoder().encode
MARK = {"type": "ephemeral"}


async def _turn(manager: ContextManager, number: int, context_id: str = "c") -> PreparedContext:
    manager.accept_turn(
        TurnSnapshot(
            context_id=context_id,
            turn_id=f"t{number}",
            input=(user(f"Question {number}."),),
            instructions=(SYSTEM,) if number == 1 else None,
        )
    )
    return await manager.prepare(ContextPrepareRequest(context_id=context_id, turn_id=f"t{number}"))


def _answer(manager: ContextManager, number: int, context_id: str = "c") -> list[Any]:
    outputs = [call(f"c{number}"), result(f"c{number}", f"found {number}")]
    manager.record(context_id, f"t{number}", outputs)
    return outputs


@pytest.mark.parametrize("kind", list(GatewayType))
async def test_request_bytes_is_the_request_body_encoded(kind: GatewayType) -> None:
    """Invariant: with the option, request_bytes == encode(request_body), builds included."""
    fields = {"model": "m", "max_tokens": 10}
    async with Foundation(gateway=kind, prompt_cache=PromptCache()) as foundation:
        manager = foundation.manager
        for number in (1, 2, 3):
            prefix = await _turn(manager, number)
            assert manager.request_bytes(prefix, fields=fields) == _encode(
                manager.request_body(prefix, fields=fields)
            )
            continuation = _answer(manager, number)
            body = manager.request_body(prefix, continuation, fields=fields)
            assert manager.request_bytes(prefix, continuation, fields=fields) == _encode(body)
            assert manager.request_bytes(prefix, continuation) == _encode(
                manager.request_body(prefix, continuation)
            )
            plain = {**fields, **manager.gateway.request_body(manager.build(prefix, continuation))}
            manager.record("c", f"t{number}", [assistant(f"Answer {number}.")])
    openai = kind in (GatewayType.openai_chat, GatewayType.openai_responses)
    assert ("prompt_cache_key" in body) is openai
    assert (prefix.prompt_cache_key is not None) is openai
    if kind is GatewayType.anthropic:
        # System, the end of turn 2 (closed), the rolling end: 3 marks, all valid.
        assert [m.field for m in anthropic_breakpoints(body)] == ["system", "messages", "messages"]
        assert AnthropicGateway().validate_request(body) == []
    if kind is GatewayType.gemini:
        assert body == plain  # implicit caching: nothing added


@pytest.mark.parametrize("kind", [GatewayType.openai_chat, GatewayType.openai_responses])
async def test_openai_cache_key_is_the_salted_hash_and_the_hosts_key_wins(
    kind: GatewayType,
) -> None:
    """Invariant: one conversation, one key; never the raw id; the host's own key is kept."""
    salt = b"deployment-7"
    async with Foundation(gateway=kind, prompt_cache=PromptCache(key_salt=salt)) as foundation:
        manager = foundation.manager
        first = await _turn(manager, 1, "support-42")
        other = await _turn(manager, 1, "support-43")
        manager.record("support-42", "t1", [assistant("A.")])
        second = await _turn(manager, 2, "support-42")
        body = manager.request_body(second, fields={"model": "m"})
        own = manager.request_body(second, fields={"prompt_cache_key": "mine"})
    key = prompt_cache_key("support-42", salt)
    assert first.prompt_cache_key == second.prompt_cache_key == key
    assert other.prompt_cache_key == prompt_cache_key("support-43", salt) != key
    assert list(body)[:2] == ["model", "prompt_cache_key"] and body["prompt_cache_key"] == key
    assert "support-42" not in key
    assert own["prompt_cache_key"] == "mine"


async def test_without_the_option_nothing_is_added() -> None:
    """Invariant: the option is opt-in: no key, no marks, body == gateway.request_body."""
    for kind in (GatewayType.openai_chat, GatewayType.anthropic):
        async with Foundation(gateway=kind) as foundation:
            manager = foundation.manager
            prefix = await _turn(manager, 1)
            body = manager.request_body(prefix)
        assert prefix.prompt_cache_key is None
        assert body == manager.gateway.request_body(prefix.items)
        assert b"cache_control" not in _encode(body) and "prompt_cache_key" not in body


async def test_anthropic_marks_stay_in_the_body_they_were_placed_in() -> None:
    """Invariant: the policy's marks never reach prefix.items, build, or a later body."""
    async with Foundation(gateway="anthropic", prompt_cache=PromptCache()) as foundation:
        manager = foundation.manager
        prefix = await _turn(manager, 1)
        continuation = _answer(manager, 1)
        before = _encode(prefix.items)
        for _ in range(2):
            body = manager.request_body(prefix, continuation)
            assert len(anthropic_breakpoints(body)) == 2  # system and the rolling end
        assert _encode(prefix.items) == before
        assert b"cache_control" not in _encode(manager.build(prefix, continuation))
        assert b"cache_control" not in _encode(manager.gateway.request_body(prefix.items))


async def test_policy_counts_host_marks_in_fields_and_extras() -> None:
    """Invariant: tools and the top-level automatic mark take slots; never more than 4."""
    tools = [{"name": "t", "input_schema": {"type": "object"}, "cache_control": MARK}]
    async with Foundation(gateway="anthropic", prompt_cache=PromptCache()) as foundation:
        manager = foundation.manager
        await _turn(manager, 1)
        manager.record("c", "t1", [assistant("A.")])
        prefix = await _turn(manager, 2)
        full = manager.request_body(prefix, fields={"tools": tools, "cache_control": MARK})
        roomy = manager.request_body(prefix, fields={"tools": tools})
    assert [m.field for m in anthropic_breakpoints(full)] == [
        "tools",
        "messages",
        "messages",
        "body",
    ]
    assert [m.field for m in anthropic_breakpoints(roomy)] == [
        "tools",
        "system",
        "messages",
        "messages",
    ]
    assert tools[0]["cache_control"] == MARK and len(tools[0]) == 3  # the host's, unchanged
    gateway = AnthropicGateway()
    assert gateway.validate_request(full) == gateway.validate_request(roomy) == []


async def test_a_bad_prompt_cache_option_is_refused_at_the_door() -> None:
    """Invariant: a wrong option type or salt is an InputError before anything is built."""
    with pytest.raises(InputError):
        Foundation(prompt_cache=True)  # type: ignore[arg-type]
    with pytest.raises(InputError):
        Foundation(prompt_cache=PromptCache(key_salt=b"s" * 65))
    async with Foundation(gateway="anthropic", prompt_cache=PromptCache()) as foundation:
        prefix = await _turn(foundation.manager, 1)
        with pytest.raises(InvalidArgumentError):
            foundation.manager.request_body(prefix, fields={"messages": []})
    async with Foundation(prompt_cache=PromptCache()) as foundation:
        prefix = await _turn(foundation.manager, 1)
        for write in (foundation.manager.request_body, foundation.manager.request_bytes):
            with pytest.raises(InvalidArgumentError, match="fields must be a mapping"):
                write(prefix, fields=[("model", "m")])  # type: ignore[arg-type]


async def test_reused_bytes_and_tokens_reach_statistics_and_metrics() -> None:
    """Invariant: the cache metric per prefix, its running totals, and one series per gateway."""
    async with Foundation(
        gateway="anthropic", history_limits=HistoryLimits(max_turns=2)
    ) as foundation:
        manager = foundation.manager
        prefixes = []
        for number in (1, 2, 3):
            prefixes.append(await _turn(manager, number))
            manager.record("c", f"t{number}", [assistant(f"Answer {number}.")])
        server = serve_metrics(manager.statistics)
        try:
            text = await anyio.to_thread.run_sync(_scrape, server.url)
        finally:
            server.close()
        stats = manager.statistics().prefix
    first, second, third = prefixes
    assert (first.reused_bytes, first.reused_tokens) == (0, 0)
    # Turn 2 repeats all of turn 1's prefix; turn 3 evicted turn 1: only the system prompt.
    assert second.reused_bytes == first.bytes and second.reused_tokens == first.tokens
    system = len(_encode(first.items[0]))
    assert third.reused_bytes == system
    assert third.reused_tokens == second.tokens * system // second.bytes
    assert (stats.bytes_total, stats.reused_bytes_total) == (
        first.bytes + second.bytes,
        first.bytes + system,
    )
    assert (stats.tokens_total, stats.reused_tokens_total) == (
        first.tokens + second.tokens,
        first.tokens + third.reused_tokens,
    )
    assert stats.gateway == "anthropic"
    shares = {
        labels: value
        for (name, labels), value in text.items()
        if name == "turnloom_prompt_cache_share"
    }
    assert shares == {
        (("gateway", "anthropic"), ("unit", "bytes")): pytest.approx(
            stats.reused_bytes_total / stats.bytes_total
        ),
        (("gateway", "anthropic"), ("unit", "tokens")): pytest.approx(
            stats.reused_tokens_total / stats.tokens_total
        ),
    }
    assert text[("turnloom_prefix_reused_tokens_total", ())] == stats.reused_tokens_total


def _scrape(url: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    with urllib.request.urlopen(url, timeout=10) as response:
        body = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(body)
        for sample in family.samples
    }


def test_the_configuration_file_key_turns_the_option_on() -> None:
    """Invariant: ``init_config.prompt_cache: true`` builds a manager with PromptCache()."""
    on = parse_config({"context": {"init_config": {"prompt_cache": True}}})
    off = parse_config({"context": {}})
    assert build_context_manager(on).options.prompt_cache == PromptCache()
    assert build_context_manager(off).options.prompt_cache is None
