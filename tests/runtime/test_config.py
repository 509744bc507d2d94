"""Host configuration: the ``context`` block, its plugins, and the host-built manager."""

from __future__ import annotations

import textwrap
from pathlib import Path

import msgspec
import pytest

from tests.conftest import DATA_DIR
from tests.runtime.helpers import user
from turnloom.context.gateway import GatewayType
from turnloom.context.history import HistoryLimits
from turnloom.context.tokens import ApproxTokenCounter
from turnloom.errors import ConfigError, InputError, StateError, UnknownPluginError
from turnloom.runtime import (
    ContextConfig,
    ContextInitConfig,
    ContextManager,
    ContextPrepareRequest,
    Foundation,
    RuntimeConfig,
    TurnSnapshot,
    build_context_manager,
    context_plugin_names,
    load_config,
    parse_config,
    resolve_context_plugin,
)

SEED = DATA_DIR.parent / "seeds" / "004_3665e275bfd56e51.txt"


def _seed_yaml_block() -> str:
    """The seed's ``context:`` YAML block, as the seed writes it (read, not copied)."""
    if not SEED.exists():
        pytest.skip(f"seed {SEED} is not present")
    lines = SEED.read_text(encoding="utf-8").splitlines()
    start = lines.index("context:")
    block = [lines[start]]
    for line in lines[start + 1 :]:
        if not line.startswith(" "):
            break
        block.append(line)
    return "\n".join(block) + "\n"


def _write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding="utf-8")
    return path


def test_the_seed_yaml_block_loads_as_written_and_gives_todays_defaults(tmp_path: Path) -> None:
    """The seed's block checks, and its limits and bound are the runtime's defaults."""
    config = load_config(_write(tmp_path / "host.yaml", _seed_yaml_block()))
    init = config.context.init_config
    assert config.context.plugin == "default"
    assert isinstance(init, ContextInitConfig)
    assert init.behavior_rules is not None and init.behavior_rules.startswith("Follow the")
    manager = build_context_manager(config)
    default = ContextManager()
    assert manager.options.history_limits == default.options.history_limits == HistoryLimits()
    assert manager.options.max_pending_preparations == 16 == default.capacity
    assert manager.options.open_calls == default.options.open_calls == "exclude"
    assert manager.options.behavior_rules == init.behavior_rules
    assert manager.options.gateway.type is GatewayType.openai_chat


def test_toml_and_yaml_give_the_same_frozen_config(tmp_path: Path) -> None:
    yaml_file = _write(
        tmp_path / "a.yml",
        """
        voice: {engine: other}   # a host section turnloom does not read
        context:
          plugin: default
          init_config:
            behavior_rules: "Be brief."
            history_max_turns: 8
            open_calls: cancel
        """,
    )
    toml_file = _write(
        tmp_path / "a.toml",
        """
        [voice]
        engine = "other"
        [context]
        plugin = "default"
        [context.init_config]
        behavior_rules = "Be brief."
        history_max_turns = 8
        open_calls = "cancel"
        """,
    )
    from_yaml, from_toml = load_config(yaml_file), load_config(toml_file)
    assert from_yaml == from_toml
    assert from_yaml.context.init_config == ContextInitConfig(
        behavior_rules="Be brief.", history_max_turns=8, open_calls="cancel"
    )
    with pytest.raises(AttributeError):
        from_yaml.context.plugin = "x"  # type: ignore[misc]
    manager = build_context_manager(from_toml, gateway="anthropic")
    assert manager.history_limits == HistoryLimits(max_turns=8)
    assert manager.options.open_calls == "cancel"
    assert manager.gateway.type is GatewayType.anthropic


def test_an_empty_context_section_is_every_default() -> None:
    config = parse_config({"context": {}})
    assert config == RuntimeConfig() == RuntimeConfig(context=ContextConfig())
    assert config.context.init_config == ContextInitConfig()


_BAD_INIT = [
    ("history_max_turn", 3),  # unknown key
    ("history_max_turns", "3"),
    ("history_max_items", 0),
    ("history_max_bytes", True),
    ("max_pending_preparations", 1.5),
    ("behavior_rules", 7),
    ("behavior_rules", "\ud800"),
    ("open_calls", "drop"),
    ("history_low_water", 0),
    ("history_low_water", 1.5),
    ("history_low_water", "half"),
]


def test_history_low_water_sets_how_far_an_eviction_goes() -> None:
    """The key gives ``HistoryLimits.low_water``; absent, the library's default."""
    config = parse_config({"context": {"init_config": {"history_low_water": 1}}})
    init = config.context.init_config
    assert isinstance(init, ContextInitConfig)
    assert init.history_limits() == HistoryLimits(low_water=1.0)
    assert ContextInitConfig().history_limits() == HistoryLimits()


@pytest.mark.parametrize(
    ("document", "key"),
    [
        ({}, "context"),
        ([1, 2], ""),
        ({"context": None}, "context"),
        ({"context": {"plugins": "default"}}, "context.plugins"),
        ({"context": {"plugin": 3}}, "context.plugin"),
        ({"context": {"plugin": ""}}, "context.plugin"),
        ({"context": {"init_config": []}}, "context.init_config"),
    ]
    + [
        ({"context": {"init_config": {name: value}}}, f"context.init_config.{name}")
        for name, value in _BAD_INIT
    ],
)
def test_each_bad_key_is_a_config_error_naming_it(document: object, key: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    assert caught.value.key == key
    assert isinstance(caught.value, InputError)
    if key:
        assert repr(key) in str(caught.value)


def test_behaviour_rules_over_the_item_cap_are_a_config_error_naming_the_key() -> None:
    """Rules that alone exceed ``history_max_item_bytes`` fail at the config's door.

    Otherwise the file loads and every prepare of every turn raises
    ItemTooLargeError (the runtime-state result carries the rules).
    """
    document = {
        "context": {"init_config": {"behavior_rules": "x" * 101, "history_max_item_bytes": 100}}
    }
    with pytest.raises(ConfigError) as caught:
        parse_config(document)
    assert caught.value.key == "context.init_config.behavior_rules"
    assert str(caught.value) == (
        "In configuration key 'context.init_config.behavior_rules': behavior_rules carries "
        "at least 101 bytes, over the per-item cap of 100 bytes."
    )


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (
            ": : :\n",
            "while parsing a block mapping, expected <block end>, but found ':' "
            "(at line 1, column 1)",
        ),
        (
            "context:\n  plugin: default\n  init_config:\n    history_max_turns: 4\n"
            "    history_max_turns: 400\n",
            "while constructing a mapping, found duplicate key 'history_max_turns' "
            "(at line 5, column 5)",
        ),
        (
            "context: !!python/object/apply:os.system ['echo']\n",
            "could not determine a constructor for the tag "
            "'tag:yaml.org,2002:python/object/apply:os.system' (at line 1, column 10)",
        ),
    ],
)
def test_a_yaml_parse_error_is_one_line(tmp_path: Path, text: str, reason: str) -> None:
    """The parser's message (several lines, with a caret) is one line: the CLI prints one."""
    path = tmp_path / "host.yaml"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert str(caught.value) == f"Configuration file 'host.yaml' is not valid YAML: {reason}"


@pytest.mark.parametrize(
    ("name", "text", "match"),
    [
        ("bad.yaml", "context: [unclosed\n", "not valid YAML"),
        ("bad.toml", "[context\n", "not valid TOML"),
        ("bad.json", "{}", "use a .yaml, .yml or .toml file"),
        ("latin.yaml", None, "cannot be read"),
    ],
)
def test_a_file_that_cannot_be_read_or_parsed_is_a_config_error(
    tmp_path: Path, name: str, text: str | None, match: str
) -> None:
    path = tmp_path / name
    if text is None:
        path.write_bytes(b"context: {plugin: \xff}\n")
    else:
        path.write_text(text, encoding="utf-8")
    with pytest.raises(ConfigError, match=match) as caught:
        load_config(path)
    assert caught.value.key == ""
    with pytest.raises(ConfigError, match="cannot be read"):
        load_config(tmp_path / "missing.yaml")


def test_an_unknown_plugin_lists_the_known_ones() -> None:
    with pytest.raises(UnknownPluginError) as caught:
        parse_config({"context": {"plugin": "fancy"}})
    error = caught.value
    assert (error.key, error.plugin) == ("context.plugin", "fancy")
    assert error.known == context_plugin_names()
    assert "default" in error.known
    assert "known plugins: " + ", ".join(error.known) in str(error)


_PLUGIN_MODULE = """
import msgspec
from turnloom.context.history import HistoryLimits
from turnloom.context.tokens import ApproxTokenCounter
from turnloom.runtime import ContextManager


class TinyConfig(msgspec.Struct, frozen=True, kw_only=True, forbid_unknown_fields=True):
    turns: int


class TinyPlugin:
    config_type = TinyConfig

    def build(self, init_config, *, gateway):
        limits = HistoryLimits(max_turns=init_config.turns)
        return ContextManager(gateway=gateway, history_limits=limits)


class Liar:
    config_type = TinyConfig

    def build(self, init_config, *, gateway):
        return "not a manager"


plugin = TinyPlugin()
liar = Liar()
not_a_plugin = object()
"""


@pytest.fixture
def registered_plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A distribution on ``sys.path`` registering plugins through the entry point group."""
    module = f"tl_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{module}.py").write_text(_PLUGIN_MODULE, encoding="utf-8")
    info = tmp_path / "tl_plugin_dist-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: tl-plugin-dist\nVersion: 1.0\n", encoding="utf-8"
    )
    (info / "entry_points.txt").write_text(
        "[turnloom.context_plugins]\n"
        f"tiny = {module}:plugin\n"
        f"liar = {module}:liar\n"
        f"broken = {module}:not_a_plugin\n"
        "absent = tl_no_such_module_anywhere:plugin\n"
        f"default = {module}:plugin\n",
        encoding="utf-8",
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    return module


def test_a_plugin_registered_by_entry_point_checks_its_own_config_and_builds(
    registered_plugins: str,
) -> None:
    assert {"tiny", "liar", "broken", "absent", "default"} <= set(context_plugin_names())
    config = parse_config({"context": {"plugin": "tiny", "init_config": {"turns": 3}}})
    assert type(config.context.init_config).__name__ == "TinyConfig"
    manager = build_context_manager(config, gateway="gemini")
    assert manager.history_limits == HistoryLimits(max_turns=3)
    with pytest.raises(ConfigError) as caught:
        parse_config({"context": {"plugin": "tiny", "init_config": {"turns": 3, "x": 1}}})
    assert caught.value.key == "context.init_config.x"


def test_default_is_reserved_for_the_built_in_plugin(registered_plugins: str) -> None:
    """An entry point named ``default`` is never loaded."""
    assert type(resolve_context_plugin("default")).__name__ == "DefaultContextPlugin"
    assert parse_config({"context": {}}).context.init_config == ContextInitConfig()


@pytest.mark.parametrize(
    ("name", "match"),
    [("broken", "is not a ContextPlugin"), ("absent", "cannot be loaded")],
)
def test_a_registered_plugin_that_does_not_load_is_a_config_error(
    registered_plugins: str, name: str, match: str
) -> None:
    with pytest.raises(ConfigError, match=match) as caught:
        parse_config({"context": {"plugin": name}})
    assert caught.value.key == "context.plugin"
    assert not isinstance(caught.value, UnknownPluginError)


def test_a_plugin_that_builds_no_manager_is_a_config_error(registered_plugins: str) -> None:
    config = parse_config({"context": {"plugin": "liar", "init_config": {"turns": 1}}})
    with pytest.raises(ConfigError, match="built an object of type str, not a ContextManager"):
        build_context_manager(config)
    mismatched = ContextConfig(plugin="tiny", init_config=ContextInitConfig())
    with pytest.raises(ConfigError, match="must be a TinyConfig") as caught:
        build_context_manager(mismatched)
    assert caught.value.key == "context.init_config"


def test_building_a_manager_needs_no_event_loop_and_no_foundation() -> None:
    """Seed construction order: the context is built before any Foundation exists."""
    manager = build_context_manager(parse_config({"context": {}}))
    assert (manager.closed, manager.capacity, manager.context_ids()) == (False, 16, ())
    assert manager.statistics().preparations.pending == 0
    with pytest.raises(StateError, match="not bound"):
        manager.accept_turn(TurnSnapshot(context_id="c", turn_id="t1", input=(user("hi"),)))
    with pytest.raises(StateError, match="not bound"):
        manager.history("c")


@pytest.mark.anyio
async def test_the_host_built_manager_is_bound_then_owned_by_the_foundation() -> None:
    manager = build_context_manager(
        parse_config({"context": {"init_config": {"history_max_turns": 1}}})
    )
    async with Foundation(manager, worker_threads=2) as foundation:
        assert foundation.manager is manager
        for turn_id in ("t1", "t2"):
            manager.accept_turn(TurnSnapshot(context_id="c", turn_id=turn_id, input=(user("hi"),)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id="c", turn_id="t2"))
        assert prefix.item_count == 1  # history_max_turns: 1 evicted t1
        with pytest.raises(StateError, match="already bound"):
            async with Foundation(manager):
                pass
    assert manager.closed
    assert manager.history("c").turn_ids == ("t2",)


@pytest.mark.anyio
async def test_the_one_line_foundation_still_builds_its_own_manager() -> None:
    async with Foundation(gateway="anthropic", history_limits=HistoryLimits(max_turns=2)) as f:
        assert f.manager.gateway.type is GatewayType.anthropic
        assert f.manager.history_limits == HistoryLimits(max_turns=2)


@pytest.mark.parametrize(
    "options",
    [
        {"gateway": "anthropic"},
        {"max_pending_preparations": 4},
        {"history_limits": HistoryLimits()},
        {"behavior_rules": "x"},
        {"open_calls": "cancel"},
        {"token_counter": ApproxTokenCounter()},
    ],
)
def test_a_manager_and_a_manager_option_together_are_refused(options: dict[str, object]) -> None:
    with pytest.raises(InputError, match="build the manager with them instead"):
        Foundation(ContextManager(), **options)  # type: ignore[arg-type]


def test_a_foundation_refuses_what_is_not_a_manager() -> None:
    with pytest.raises(InputError, match="must be a ContextManager"):
        Foundation("openai_chat")  # type: ignore[arg-type]


def test_config_structs_round_trip_through_msgspec() -> None:
    """The config is plain data: a host may log it as JSON."""
    config = parse_config({"context": {"init_config": {"history_max_turns": 5}}})
    encoded = msgspec.json.encode(config.context.init_config)
    assert msgspec.json.decode(encoded, type=ContextInitConfig) == config.context.init_config
