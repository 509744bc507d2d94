"""The manager's options are written once: ``ManagerSettings`` is the one table."""

from __future__ import annotations

import math
import typing

import anyio
import msgspec
import pytest

from turnloom.context.cache import PromptCache
from turnloom.context.gateway import GatewayType
from turnloom.errors import InputError
from turnloom.runtime import (
    ContextInitConfig,
    ContextManager,
    Foundation,
    ManagerOptions,
    ManagerSettings,
)
from turnloom.runtime._options import ManagerKwargs

_NAMES = (
    "gateway",
    "max_pending_preparations",
    "history_limits",
    "behavior_rules",
    "open_calls",
    "earlier_state",
    "token_counter",
    "strategy",
    "memory",
    "strategy_options",
    "max_tenant_preparations",
    "store",
    "lease_ttl",
    "idle_after",
    "owner",
    "prompt_cache",
)


def test_the_keyword_types_mirror_the_table_name_for_name() -> None:
    """Invariant: the TypedDict checkers read equals the Struct (same names, order, types)."""
    settings = typing.get_type_hints(ManagerSettings)
    kwargs = typing.get_type_hints(ManagerKwargs)
    assert tuple(settings) == _NAMES
    assert tuple(kwargs) == _NAMES
    assert kwargs == settings


def test_the_defaults_are_the_tables() -> None:
    """Invariant: one default per option, read by the manager and the config loader alike."""
    defaults = ManagerSettings()
    assert msgspec.structs.asdict(defaults) == {
        "gateway": GatewayType.openai_chat,
        "max_pending_preparations": 16,
        "history_limits": None,
        "behavior_rules": None,
        "open_calls": "exclude",
        "earlier_state": "keep",
        "token_counter": None,
        "strategy": None,
        "memory": None,
        "strategy_options": None,
        "max_tenant_preparations": None,
        "store": None,
        "lease_ttl": 10.0,
        "idle_after": 300.0,
        "owner": None,
        "prompt_cache": None,
    }
    checked = ContextManager().options
    assert (checked.max_pending_preparations, checked.open_calls, checked.earlier_state) == (
        16,
        "exclude",
        "keep",
    )
    assert (checked.tenant_limit, checked.prompt_cache, checked.durable) == (8, None, None)
    config = ContextInitConfig()
    assert (
        config.max_pending_preparations,
        config.behavior_rules,
        config.open_calls,
        config.earlier_state,
        config.prompt_cache,
    ) == (16, None, "exclude", "keep", False)


def test_both_constructors_take_every_option_by_keyword() -> None:
    """Invariant: each table field is a keyword of ContextManager and Foundation."""
    given: ManagerKwargs = {
        "gateway": "anthropic",
        "max_pending_preparations": 6,
        "open_calls": "cancel",
        "earlier_state": "drop",
        "max_tenant_preparations": 2,
        "idle_after": math.inf,
        "prompt_cache": PromptCache(),
    }

    async def foundation_options() -> ManagerOptions:
        async with Foundation(**given) as foundation:
            return foundation.manager.options

    for options in (ContextManager(**given).options, anyio.run(foundation_options)):
        assert options.gateway.type is GatewayType.anthropic
        assert (options.max_pending_preparations, options.tenant_limit) == (6, 2)
        assert (options.open_calls, options.earlier_state) == ("cancel", "drop")
        assert options.prompt_cache == PromptCache()


@pytest.mark.parametrize("build", [ContextManager, Foundation])
def test_an_unknown_option_is_a_type_error(build: typing.Callable[..., object]) -> None:
    """Invariant: a misspelt option fails as Python's own keyword check does."""
    with pytest.raises(TypeError, match="max_pending_preparation"):
        build(max_pending_preparation=4)


def test_a_manager_with_an_option_at_its_default_is_refused_too() -> None:
    """Invariant: with ``manager`` every given option is refused, even one equal to its default."""
    with pytest.raises(InputError, match=r"option\(s\) open_calls, gateway; build the manager"):
        Foundation(ContextManager(), open_calls="exclude", gateway="openai_chat")
