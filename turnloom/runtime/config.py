"""Host configuration of the context runtime: the ``context`` block and its plugins.

A host's configuration file (YAML or TOML) carries one ``context`` section::

    context:
      plugin: default
      init_config:
        behavior_rules: "Follow the application's execution and authorization policies."
        max_pending_preparations: 16
        history_max_turns: 32
        history_max_items: 4096
        history_max_bytes: 8388608

:func:`load_config` reads such a file, :func:`parse_config` checks a mapping
the host already parsed; both return a frozen :class:`RuntimeConfig`.
``plugin`` names a *context plugin*, which declares the type of its
``init_config`` and builds the :class:`~turnloom.runtime.ContextManager` from
it (:func:`build_context_manager`). The built-in plugin is ``default``; third
parties register theirs under the entry point group
:data:`CONTEXT_PLUGIN_GROUP`::

    [project.entry-points."turnloom.context_plugins"]
    my-context = "my_package.context:plugin"

An entry point is loaded only when a configuration names it. ``default`` is
reserved: an entry point of that name is never loaded. Other top-level
sections of the file (a host's ``voice``, ``loop`` ...) are the host's and are
not read here.

Everything is checked before anything is built: an unknown or missing key, a
wrong type or a value out of range raises :class:`~turnloom.errors.ConfigError`
naming the key by its dotted path.
"""

# Contract: seed 004 (the context plugin configuration and the host's
# construction order: the context is built before the Foundation is bound).

from __future__ import annotations

__all__ = (
    "CONTEXT_PLUGIN_GROUP",
    "ContextConfig",
    "ContextInitConfig",
    "ContextPlugin",
    "DefaultContextPlugin",
    "RuntimeConfig",
    "build_context_manager",
    "context_plugin_names",
    "load_config",
    "parse_config",
    "resolve_context_plugin",
)

import re
import tomllib
from collections.abc import Hashable
from importlib import metadata
from os import PathLike
from pathlib import Path
from typing import Annotated, Any, Literal, Protocol, runtime_checkable

import msgspec
import yaml

from turnloom.context.cache import PromptCache
from turnloom.context.gateway import Gateway, GatewayType, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.errors import (
    ConfigError,
    InputError,
    TurnloomError,
    UnknownPluginError,
    excerpt,
    what_type,
)
from turnloom.runtime._door import check_behavior_rules
from turnloom.runtime._options import ManagerSettings
from turnloom.runtime.manager import ContextManager

CONTEXT_PLUGIN_GROUP = "turnloom.context_plugins"
"""The entry point group third-party context plugins register under."""

_DEFAULT = "default"
_MANAGER = ManagerSettings()
_LIMITS = HistoryLimits()
_Positive = Annotated[int, msgspec.Meta(ge=1)]
_Fraction = Annotated[float, msgspec.Meta(gt=0, le=1)]
_AT = re.compile(
    r"^(?P<reason>.*?)(?: - at (?P<of_key>`key` in )?`\$(?P<path>[^`]*)`)?$", re.DOTALL
)
_UNKNOWN = re.compile(r"^Object contains unknown field `(?P<name>[^`]*)`")
_MISSING = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")


class ContextInitConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    """The ``init_config`` of the ``default`` context plugin; defaults are the runtime's.

    Each key is a manager option of :class:`~turnloom.runtime.ManagerSettings`
    and takes its default from there (the ``history_*`` keys are the fields of
    its ``history_limits``, ``prompt_cache`` a switch).

    Attributes:
        behavior_rules: default application behaviour rules, carried as
            escaped data in each turn's runtime-state pair (never promoted to
            an instruction), or None.
        max_pending_preparations: the bound on pending preparations (16).
        history_max_turns: most turns each context keeps (32).
        history_max_items: most messages each context keeps (4,096).
        history_max_bytes: most bytes of serialized messages each context
            keeps (8 MiB); it bounds retained content, not process memory.
        history_max_item_bytes: the per-item byte cap (1 MiB).
        history_low_water: how far a history over a limit evicts, as a
            fraction of each limit (``HistoryLimits.low_water``: 1.0 evicts
            one turn as each new one arrives, breaking the cached prefix on
            every turn; 0.4 keeps it for many turns).
        open_calls: ``"exclude"`` or ``"cancel"`` calls without a result in
            prepared inputs (``"exclude"``).
        earlier_state: ``"keep"`` or ``"drop"`` earlier turns' runtime-state
            pairs in later inputs (``"keep"``: each exactly as it was sent,
            so the previous input is a prefix of the next).
        prompt_cache: add the provider's prompt-cache fields to the bodies
            the manager writes (``false``; ``true`` is
            ``prompt_cache=PromptCache()``: Anthropic breakpoints, the OpenAI
            ``prompt_cache_key``).
    """

    behavior_rules: str | None = _MANAGER.behavior_rules
    max_pending_preparations: _Positive = _MANAGER.max_pending_preparations
    history_max_turns: _Positive = _LIMITS.max_turns
    history_max_items: _Positive = _LIMITS.max_items
    history_max_bytes: _Positive = _LIMITS.max_bytes
    history_max_item_bytes: _Positive = _LIMITS.max_item_bytes
    history_low_water: _Fraction = _LIMITS.low_water
    open_calls: Literal["exclude", "cancel"] = _MANAGER.open_calls
    earlier_state: Literal["keep", "drop"] = _MANAGER.earlier_state
    prompt_cache: bool = _MANAGER.prompt_cache is not None

    def history_limits(self) -> HistoryLimits:
        """The history bounds these keys give."""
        return HistoryLimits(
            max_turns=self.history_max_turns,
            max_items=self.history_max_items,
            max_bytes=self.history_max_bytes,
            max_item_bytes=self.history_max_item_bytes,
            low_water=self.history_low_water,
        )


@runtime_checkable
class ContextPlugin(Protocol):
    """What a context plugin provides: its config type and a builder."""

    @property
    def config_type(self) -> type[msgspec.Struct]:
        """The msgspec Struct its ``init_config`` is checked into.

        Declare it with ``forbid_unknown_fields=True`` so unknown keys are errors.
        """
        ...

    def build(self, init_config: Any, *, gateway: Gateway) -> ContextManager:
        """Build an unbound ContextManager from a checked ``init_config``.

        Must not need a Foundation service: the Foundation is bound after.
        """
        ...


class DefaultContextPlugin:
    """The built-in ``default`` plugin: a ContextManager from a :class:`ContextInitConfig`."""

    config_type = ContextInitConfig

    def build(self, init_config: ContextInitConfig, *, gateway: Gateway) -> ContextManager:
        """Build the manager with these keys (see :class:`ContextInitConfig`)."""
        return ContextManager(
            gateway=gateway,
            max_pending_preparations=init_config.max_pending_preparations,
            history_limits=init_config.history_limits(),
            behavior_rules=init_config.behavior_rules,
            open_calls=init_config.open_calls,
            earlier_state=init_config.earlier_state,
            prompt_cache=PromptCache() if init_config.prompt_cache else None,
        )


class ContextConfig(msgspec.Struct, frozen=True, kw_only=True):
    """The checked ``context`` section.

    Attributes:
        plugin: the context plugin's name.
        init_config: its ``init_config``, an instance of the plugin's
            ``config_type`` (:class:`ContextInitConfig` for ``default``).
    """

    plugin: str = _DEFAULT
    init_config: msgspec.Struct = msgspec.field(default_factory=ContextInitConfig)


class RuntimeConfig(msgspec.Struct, frozen=True, kw_only=True):
    """A checked configuration document.

    Attributes:
        context: the ``context`` section.
    """

    context: ContextConfig = msgspec.field(default_factory=ContextConfig)


class _RawContext(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    plugin: Annotated[str, msgspec.Meta(min_length=1, max_length=128)] = _DEFAULT
    init_config: dict[str, Any] = msgspec.field(default_factory=dict)


class _RawDocument(msgspec.Struct, frozen=True, kw_only=True):
    context: _RawContext


def _config_error(exc: msgspec.ValidationError, prefix: str) -> ConfigError:
    """Translate msgspec's error into one naming the key by its dotted path."""
    match = _AT.match(str(exc))
    assert match is not None  # the pattern matches any text
    reason, path = match["reason"], (match["path"] or "").lstrip(".")
    if match["of_key"]:  # a key of the mapping at ``path`` is refused, not a value
        reason = f"a key: {reason}"
    key = ".".join(p for p in (prefix, path) if p)
    named = _UNKNOWN.match(reason) or _MISSING.match(reason)
    if named is not None:
        key = ".".join(p for p in (key, named["name"]) if p)
    where = f"configuration key {excerpt(key)}" if key else "the configuration"
    short = reason if len(reason) <= 160 else reason[:157] + "..."
    return ConfigError(f"In {where}: {short}.", key=key)


def context_plugin_names() -> tuple[str, ...]:
    """The names a configuration's ``plugin`` may take: ``default`` and the registered ones."""
    registered = {ep.name for ep in metadata.entry_points(group=CONTEXT_PLUGIN_GROUP)}
    return tuple(sorted(registered | {_DEFAULT}))


def resolve_context_plugin(name: str) -> ContextPlugin:
    """The context plugin called ``name``: ``default``, or a registered entry point.

    Raises:
        UnknownPluginError: no plugin has that name; ``known`` lists the names.
        ConfigError: the entry point cannot be loaded, or what it names is not
            a :class:`ContextPlugin`.
    """
    key = "context.plugin"
    if name == _DEFAULT:
        return DefaultContextPlugin()
    found = [ep for ep in metadata.entry_points(group=CONTEXT_PLUGIN_GROUP) if ep.name == name]
    if not found:
        known = context_plugin_names()
        raise UnknownPluginError(
            f"No context plugin is named {excerpt(name[:128])}; known plugins: {', '.join(known)}.",
            key=key,
            plugin=name,
            known=known,
        )
    try:
        plugin = found[0].load()
    except Exception as exc:
        raise ConfigError(
            f"The context plugin {excerpt(name)} ({found[0].value}) cannot be loaded: {exc}.",
            key=key,
        ) from exc
    config_type = getattr(plugin, "config_type", None)
    if not (
        isinstance(plugin, ContextPlugin)
        and isinstance(config_type, type)
        and issubclass(config_type, msgspec.Struct)
    ):
        raise ConfigError(
            f"The context plugin {excerpt(name)} ({found[0].value}) is not a ContextPlugin: it "
            "needs a 'config_type' msgspec Struct and a 'build' method.",
            key=key,
        )
    return plugin


def parse_config(document: object) -> RuntimeConfig:
    """Check a parsed configuration document (a mapping with a ``context`` section).

    Other top-level keys are the host's and are ignored.

    Returns:
        the frozen, checked configuration.

    Raises:
        ConfigError: a key that is missing or unknown, a value of the wrong
            type or out of range (or refused by the plugin's config type), or
            behaviour rules that are not valid text or alone exceed
            ``history_max_item_bytes``; ``key`` is its dotted path.
        UnknownPluginError: ``context.plugin`` names no known plugin.
    """
    try:
        raw = msgspec.convert(document, _RawDocument)
    except msgspec.ValidationError as exc:
        raise _config_error(exc, "") from None
    plugin = resolve_context_plugin(raw.context.plugin)
    try:
        init_config = msgspec.convert(raw.context.init_config, plugin.config_type)
    except msgspec.ValidationError as exc:
        raise _config_error(exc, "context.init_config") from None
    except TurnloomError:
        raise
    except Exception as exc:  # the plugin's config type's own check (its __post_init__)
        raise ConfigError(
            f"In configuration key 'context.init_config': the context plugin "
            f"{excerpt(raw.context.plugin)} refused it ({type(exc).__name__}: "
            f"{excerpt(str(exc))}).",
            key="context.init_config",
        ) from exc
    if isinstance(init_config, ContextInitConfig):
        try:
            check_behavior_rules(init_config.behavior_rules, init_config.history_max_item_bytes)
        except InputError as exc:
            raise ConfigError(
                f"In configuration key 'context.init_config.behavior_rules': {exc}",
                key="context.init_config.behavior_rules",
            ) from exc
    return RuntimeConfig(context=ContextConfig(plugin=raw.context.plugin, init_config=init_config))


class _UniqueKeyLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing a mapping that names one key twice.

    The plain safe loader keeps the last value, so a second
    ``history_max_turns`` would silently win; TOML refuses it already.
    """


def _unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode) -> dict[Any, Any]:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, Hashable):
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found a key that cannot be a key ({what_type(key)})",
                key_node.start_mark,
            )
        if key in seen:
            raise yaml.constructor.ConstructorError(
                "while constructing a mapping",
                node.start_mark,
                f"found duplicate key {excerpt(key)}",
                key_node.start_mark,
            )
        seen.add(key)
    return loader.construct_mapping(node, deep=True)


_UniqueKeyLoader.add_constructor(
    yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG,
    _unique_mapping,
)


def _parse_error(exc: Exception) -> str:
    """The parser's reason on one line, with its line and column as TOML's gives them.

    PyYAML's message spans lines (the offending text and a caret under it).
    """
    if isinstance(exc, yaml.MarkedYAMLError) and exc.problem_mark is not None:
        mark = exc.problem_mark
        reason = ", ".join(r for r in (exc.context, exc.problem) if r)
        return f"{reason} (at line {mark.line + 1}, column {mark.column + 1})"
    return " ".join(str(exc).split())


def load_config(path: str | PathLike[str]) -> RuntimeConfig:
    """Read and check a configuration file: YAML (``.yaml``, ``.yml``) or TOML (``.toml``).

    YAML is read with PyYAML's safe loader (a key named twice in one mapping
    is a parse error, as in TOML); TOML with the standard ``tomllib``.

    Raises:
        ConfigError: the file cannot be read, its suffix names no known
            format, it does not parse (the parser's line and column are
            quoted), or a key or value is invalid (see :func:`parse_config`).
        UnknownPluginError: ``context.plugin`` names no known plugin.
    """
    file = Path(path)
    suffix = file.suffix.lower()
    if suffix not in (".yaml", ".yml", ".toml"):
        raise ConfigError(
            f"Configuration file {excerpt(file.name)}: use a .yaml, .yml or .toml file.", key=""
        )
    try:
        text = file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(
            f"Configuration file {excerpt(str(file))} cannot be read: {exc}.", key=""
        ) from exc
    try:
        document = (
            tomllib.loads(text) if suffix == ".toml" else yaml.load(text, Loader=_UniqueKeyLoader)
        )
    except (tomllib.TOMLDecodeError, yaml.YAMLError) as exc:
        raise ConfigError(
            f"Configuration file {excerpt(file.name)} is not valid {suffix[1:].upper()}: "
            f"{_parse_error(exc)[:200]}",
            key="",
        ) from None
    except RecursionError:
        raise ConfigError(
            f"Configuration file {excerpt(file.name)} is not valid {suffix[1:].upper()}: it "
            "nests values too deeply to be read.",
            key="",
        ) from None
    return parse_config(document)


def build_context_manager(
    config: RuntimeConfig | ContextConfig,
    *,
    gateway: GatewayType | str | Gateway = GatewayType.openai_chat,
) -> ContextManager:
    """Build the configured plugin's ContextManager, not yet bound to a Foundation.

    Bind it with ``Foundation(manager)``; the Foundation owns it from then on.

    Raises:
        InputError: an unknown or unavailable gateway, or an option the
            manager rejects.
        UnknownPluginError, ConfigError: as :func:`resolve_context_plugin`, or
            the plugin raised an exception not turnloom's while building, or
            returned something that is not a ContextManager.
    """
    context = config.context if isinstance(config, RuntimeConfig) else config
    plugin = resolve_context_plugin(context.plugin)
    if not isinstance(context.init_config, plugin.config_type):
        raise ConfigError(
            f"The init_config of context plugin {excerpt(context.plugin)} must be a "
            f"{plugin.config_type.__name__}, not {what_type(context.init_config)}.",
            key="context.init_config",
        )
    if not isinstance(gateway, Gateway):
        gateway = get_gateway(gateway)
    try:
        manager = plugin.build(context.init_config, gateway=gateway)
    except TurnloomError:
        raise
    except Exception as exc:  # a third-party plugin's own failure: named, as a load's is
        raise ConfigError(
            f"The context plugin {excerpt(context.plugin)} raised {type(exc).__name__} while "
            f"building its ContextManager: {excerpt(str(exc))}.",
            key="context.plugin",
        ) from exc
    if not isinstance(manager, ContextManager):
        raise ConfigError(
            f"The context plugin {excerpt(context.plugin)} built {what_type(manager)}, not a "
            "ContextManager.",
            key="context.plugin",
        )
    return manager
