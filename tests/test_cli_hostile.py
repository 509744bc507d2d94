"""Hostile inputs at the command line's door: run as a process, exit status and first line.

docs/cli.md: "Every problem is one line on stderr, `turnloom <command>: error: ...`",
status 2 is "usage error, an input that cannot be read (missing, not UTF-8, not
JSON, no trajectories), or an output, backend, gateway or metrics port that
cannot be used: nothing ran", and "Everything a run needs is checked before it
starts: ... the `--config` file, every input file, ... the metrics port and the
`--store` of `loadtest`". turnloom/cli.py: "no traceback reaches the user for
anything the command line can foresee".

Tests marked HOLDS pass on the current code; the others fail on it (findings).
"""

from __future__ import annotations

import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.test_cli_edges import turnloom_cli
from turnloom.errors import ConfigError
from turnloom.runtime.config import load_config

ROOT = Path(__file__).resolve().parents[1]
GOOD = '[{"role":"user","content":"hi"},{"role":"assistant","content":"hello"}]'


def cli(
    *args: str | Path, cwd: Path, stdin: str | None = None, pythonpath: str = str(ROOT)
) -> subprocess.CompletedProcess[str]:
    return turnloom_cli(*args, cwd=cwd, stdin=stdin, pythonpath=pythonpath)


def one_line_error(done: subprocess.CompletedProcess[str], prefix: str) -> str:
    """Assert status 2, no traceback, every stderr line an error line; return the first."""
    assert "Traceback" not in done.stderr, done.stderr[-400:]
    lines = done.stderr.splitlines()
    assert lines, "nothing on stderr"
    assert lines[0].startswith(prefix), lines[0]
    assert all(line.startswith("turnloom ") for line in lines), lines
    assert done.returncode == 2, (done.returncode, done.stderr[-400:])
    return lines[0]


# -- findings: --store URLs -----------------------------------------------------------


@pytest.mark.parametrize(
    "url",
    [
        "redis://127.0.0.1:abc/0",  # ValueError: Port could not be cast to integer value
        "redis://[::1/0",  # ValueError: Invalid IPv6 URL
        "redis://127.0.0.1:99999/0",  # ValueError: Port out of range 0-65535
    ],
)
def test_a_malformed_redis_store_url_is_one_line_status_2(tmp_path: Path, url: str) -> None:
    # docs/cli.md: "Everything a run needs is checked before it starts: ... the
    # `--store` of `loadtest`"; status 2: "nothing ran". check_context_store's
    # docstring: "InputError: the URL is unknown or malformed".
    # Observed: a ValueError traceback from urllib/redis, status 1.
    done = cli(
        "loadtest", "--sessions", "1", "--turns", "1", "--no-progress", "--store", url, cwd=tmp_path
    )
    one_line_error(done, "turnloom loadtest: error: --store: ")


def test_a_sqlite_store_that_is_a_directory_is_refused_before_the_run(tmp_path: Path) -> None:
    # docs/cli.md: "Everything a run needs is checked before it starts: ... the
    # `--store` of `loadtest` (a `sqlite:` file's folder must exist ...)" and status 2
    # "an output ... that cannot be used: nothing ran" (--out naming a directory is
    # refused the same way). Observed: accepted at the door, every session fails
    # ("could not complete a write: unable to open database file"), status 1.
    (tmp_path / "db").mkdir()
    done = cli(
        "loadtest",
        "--sessions",
        "1",
        "--turns",
        "1",
        "--no-progress",
        "--store",
        "sqlite:db",
        cwd=tmp_path,
    )
    one_line_error(done, "turnloom loadtest: error: --store: ")


# -- findings: transcripts ------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    [
        "[" * 100_000 + "]" * 100_000,  # valid structure, too deep
        "[" * 100_000,  # truncated and too deep
        '{"messages":' + "[" * 100_000,
    ],
    ids=["deep-closed", "deep-truncated", "deep-in-object"],
)
@pytest.mark.parametrize("command", ["replay", "loadtest"])
def test_a_deeply_nested_transcript_is_one_line_status_2(
    tmp_path: Path, text: str, command: str
) -> None:
    # docs/cli.md: status 2 for "an input that cannot be read (missing, not UTF-8,
    # not JSON, no trajectories)". Observed: msgspec's RecursionError ("maximum
    # recursion depth exceeded while deserializing an object") escapes
    # trajectories._load as a traceback, status 1.
    (tmp_path / "deep.json").write_text(text)
    args = ["deep.json"] if command == "replay" else ["--source", "deep.json", "--turns", "1"]
    done = cli(command, *args, "--no-progress", cwd=tmp_path)
    one_line_error(done, f"turnloom {command}: error: deep.json: ")


def test_a_lone_surrogate_in_a_single_trajectory_names_its_message_not_invalid_json(
    tmp_path: Path,
) -> None:
    # docs/cli.md: replay "reads ... a single trajectory (a message list ..., on one
    # line or pretty-printed) or JSONL", "one file gives the same error lines". The
    # same trajectory as a JSONL line is reported as
    # "message 0: An OpenAI Chat message holds text that is not valid UTF-8
    # (surrogates not allowed)." Observed for the single-trajectory file (valid JSON
    # for every JSON parser but msgspec): "trajectory 0, message ?: invalid JSON."
    (tmp_path / "surr.json").write_text('[{"role":"user","content":"\\ud800"}]')
    done = cli("replay", "surr.json", "--no-progress", cwd=tmp_path)
    assert done.stderr.splitlines()[0] == (
        "turnloom replay: error: surr.json, trajectory 0, message 0: An OpenAI Chat message "
        "holds text that is not valid UTF-8 (surrogates not allowed)."
    )
    assert done.returncode == 1


# -- findings: --config ---------------------------------------------------------------


@pytest.mark.parametrize(
    "text",
    ["context:\n  ? [a, b]\n  : 1\n", "? {a: 1}\n: 2\ncontext: {}\n"],
    ids=["list-key", "mapping-key"],
)
def test_a_yaml_config_with_an_unhashable_key_is_a_config_error(tmp_path: Path, text: str) -> None:
    # docs/hosting.md: load_config "checks it into a frozen RuntimeConfig: an unknown
    # key, a wrong type or a value out of range raises ConfigError"; config.py
    # load_config: "ConfigError: ... it does not parse". Observed: TypeError
    # "unhashable type: 'list'" from _unique_mapping's `key in seen`.
    path = tmp_path / "host.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError):
        load_config(path)


def test_a_yaml_config_with_an_unhashable_key_is_one_line_status_2(tmp_path: Path) -> None:
    # docs/cli.md: "Everything a run needs is checked before it starts: ... the
    # `--config` file"; status 2. Observed: TypeError traceback, status 1.
    (tmp_path / "host.yaml").write_text("context:\n  ? [a, b]\n  : 1\n")
    done = cli("replay", "--sample", "--no-progress", "--config", "host.yaml", cwd=tmp_path)
    one_line_error(done, "turnloom replay: error: Configuration file 'host.yaml' is not valid YAML")


@pytest.mark.parametrize(
    ("name", "text"),
    [
        ("deep.yaml", "context: " + "[" * 5000 + "]" * 5000 + "\n"),
        ("deep.toml", "x = " + "[" * 5000 + "]" * 5000 + "\n"),
    ],
    ids=["yaml", "toml"],
)
def test_a_deeply_nested_config_is_one_line_status_2(tmp_path: Path, name: str, text: str) -> None:
    # config.py load_config: "ConfigError: ... it does not parse"; docs/cli.md status 2.
    # Observed: RecursionError traceback from the YAML composer / tomllib, status 1.
    (tmp_path / name).write_text(text)
    done = cli("replay", "--sample", "--no-progress", "--config", name, cwd=tmp_path)
    one_line_error(done, f"turnloom replay: error: Configuration file '{name}'")


def test_a_non_string_key_in_init_config_is_named_by_its_dotted_path(tmp_path: Path) -> None:
    # docs/hosting.md: "an unknown key ... raises ConfigError naming the key
    # (`context.init_config.history_max_turns`)". Observed: key '' and the message
    # "In the configuration: Expected `str`, got `int` - at `key` in
    # `$.context.init_config`." (msgspec's raw path syntax, no dotted key).
    path = tmp_path / "host.yaml"
    path.write_text("context:\n  init_config:\n    1: 2\n")
    with pytest.raises(ConfigError) as caught:
        load_config(path)
    assert caught.value.key == "context.init_config"
    assert str(caught.value).startswith("In configuration key 'context.init_config'")


def _plugin_dist(tmp_path: Path) -> str:
    dist = tmp_path / "site" / "hostileplug-1.0.dist-info"
    dist.mkdir(parents=True)
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: hostileplug\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text(
        "[turnloom.context_plugins]\n"
        "loadboom = hostileplug_mod:loadboom\n"
        "buildboom = hostileplug_mod:buildboom\n"
        "postboom = hostileplug_mod:postboom\n"
    )
    (tmp_path / "site" / "hostileplug_mod.py").write_text(
        "import msgspec\n"
        "class Cfg(msgspec.Struct, forbid_unknown_fields=True):\n"
        "    x: int = 1\n"
        "class PCfg(msgspec.Struct, forbid_unknown_fields=True):\n"
        "    x: int = 1\n"
        "    def __post_init__(self):\n"
        "        raise RuntimeError('post init exploded')\n"
        "class Build:\n"
        "    config_type = Cfg\n"
        "    def build(self, init_config, *, gateway):\n"
        "        raise RuntimeError('build exploded')\n"
        "class Post(Build):\n"
        "    config_type = PCfg\n"
        "buildboom = Build()\n"
        "postboom = Post()\n"
        "def __getattr__(name):\n"
        "    if name == 'loadboom':\n"
        "        raise RuntimeError('entry point exploded')\n"
        "    raise AttributeError(name)\n"
    )
    return f"{ROOT}{os.pathsep}{tmp_path / 'site'}"


def test_a_plugin_entry_point_that_raises_on_load_is_one_line_status_2(tmp_path: Path) -> None:
    # HOLDS: "The context plugin 'loadboom' (hostileplug_mod:loadboom) cannot be
    # loaded: entry point exploded.", status 2.
    pythonpath = _plugin_dist(tmp_path)
    (tmp_path / "host.yaml").write_text("context:\n  plugin: loadboom\n")
    done = cli(
        "replay",
        "--sample",
        "--no-progress",
        "--config",
        "host.yaml",
        cwd=tmp_path,
        pythonpath=pythonpath,
    )
    line = one_line_error(done, "turnloom replay: error: The context plugin 'loadboom'")
    assert line.endswith("cannot be loaded: entry point exploded.")


@pytest.mark.parametrize("plugin", ["buildboom", "postboom"])
@pytest.mark.parametrize("command", ["replay", "loadtest"])
def test_a_plugin_that_raises_while_building_is_one_line_status_2(
    tmp_path: Path, plugin: str, command: str
) -> None:
    # docs/cli.md: "Everything a run needs is checked before it starts: ... the
    # `--config` file" and "Every problem is one line on stderr"; a plugin that
    # fails on load is already one line (test above). Observed: a plugin whose
    # build() (or whose config_type's __post_init__) raises RuntimeError ends the
    # command with a traceback, status 1.
    pythonpath = _plugin_dist(tmp_path)
    (tmp_path / "host.yaml").write_text(f"context:\n  plugin: {plugin}\n")
    extra = ["--sample"] if command == "replay" else ["--sessions", "1", "--turns", "1"]
    done = cli(
        command,
        *extra,
        "--no-progress",
        "--config",
        "host.yaml",
        cwd=tmp_path,
        pythonpath=pythonpath,
    )
    one_line_error(done, f"turnloom {command}: error: ")


# -- contracts that hold --------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "data", "status", "first"),
    [
        ("empty.json", b"", 2, "empty.json: the file holds no trajectories."),
        ("blank.json", b"  \n\n", 2, "blank.json: the file holds no trajectories."),
        ("bad.json", b"\xff\xfe[]", 2, "bad.json: the file is not valid UTF-8 (byte 0)."),
        (
            "trunc.json",
            b'[{"role":"user","content":"hi"},{"role":',
            1,
            "trunc.json, trajectory 0, message 1: invalid JSON at line 1, column 41: "
            "Expecting value.",
        ),
        (
            "mid.jsonl",
            f"{GOOD}\n{{bad\n{GOOD}\n".encode(),
            1,
            "mid.jsonl, trajectory 1, message ?: invalid JSON on line 2, column 2: "
            "Expecting property name enclosed in double quotes.",
        ),
        (
            "types.json",
            b'[{"role":"user","content":5}]',
            1,
            "types.json, trajectory 0, message 0: OpenAI Chat content must be a string, "
            "a list of parts or null.",
        ),
        (
            "obj.json",
            b'{"messages":"abc"}',
            2,
            "obj.json: the file holds one JSON object without a 'traj' or 'messages' list.",
        ),
    ],
)
def test_holds_bad_transcripts_are_one_line_with_the_documented_status(
    tmp_path: Path, name: str, data: bytes, status: int, first: str
) -> None:
    # HOLDS.
    (tmp_path / name).write_bytes(data)
    done = cli("replay", name, "--no-progress", cwd=tmp_path)
    assert "Traceback" not in done.stderr
    assert done.stderr.splitlines()[0] == f"turnloom replay: error: {first}"
    assert done.returncode == status


def test_holds_a_directory_as_transcript_is_status_2(tmp_path: Path) -> None:
    # HOLDS.
    (tmp_path / "d.json").mkdir()
    done = cli("replay", "d.json", "--no-progress", cwd=tmp_path)
    assert one_line_error(done, "turnloom replay: error: ") == (
        "turnloom replay: error: d.json: cannot read the file: Is a directory."
    )


def test_holds_stdin_transcript(tmp_path: Path) -> None:
    # HOLDS: docs/cli.md "`replay -` ... read a transcript from standard input".
    done = cli("replay", "-", "--no-progress", cwd=tmp_path, stdin=GOOD)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("sessions: 1  turns: 1  model calls prepared: 1")


@pytest.mark.parametrize(
    ("args", "first"),
    [
        (["loadtest", "--sessions", "0"], "argument --sessions: 0 is not a positive integer"),
        (["loadtest", "--turns", "-3"], "argument --turns: -3 is not a positive integer"),
        (
            ["loadtest", "--think-time", "nan"],
            "argument --think-time: nan is not a finite number of seconds >= 0",
        ),
        (["loadtest", "--processes", "0"], "argument --processes: 0 is not a positive integer"),
        (
            ["loadtest", "--metrics-port", "70000"],
            "argument --metrics-port: 70000 is not a TCP port (0 to 65535)",
        ),
        (["replay", "--concurrency", "0"], "argument --concurrency: 0 is not a positive integer"),
    ],
)
def test_holds_out_of_range_flags_are_usage_errors(
    tmp_path: Path, args: list[str], first: str
) -> None:
    # HOLDS.
    done = cli(*args, cwd=tmp_path)
    line = one_line_error(done, f"turnloom {args[0]}: error: {first}")
    assert line.endswith(f"(see 'turnloom {args[0]} --help').")


@pytest.mark.parametrize(
    ("name", "text", "first"),
    [
        (
            "unk.yaml",
            "context:\n  init_config:\n    bogus: 1\n",
            "In configuration key 'context.init_config.bogus': Object contains unknown field "
            "`bogus`.",
        ),
        (
            "zero.yaml",
            "context:\n  init_config:\n    history_max_turns: 0\n",
            "In configuration key 'context.init_config.history_max_turns': Expected `int` >= 1.",
        ),
        (
            "bool.yaml",
            "context:\n  init_config:\n    history_max_turns: true\n",
            "In configuration key 'context.init_config.history_max_turns': Expected `int`, got "
            "`bool`.",
        ),
        (
            "nan.yaml",
            "context:\n  init_config:\n    history_low_water: .nan\n",
            "In configuration key 'context.init_config.history_low_water': Expected `float` > 0.0.",
        ),
        (
            "inf.toml",
            "[context.init_config]\nhistory_max_bytes = inf\n",
            "In configuration key 'context.init_config.history_max_bytes': Expected `int`, got "
            "`float`.",
        ),
        (
            "dup.yaml",
            "context:\n  init_config:\n    history_max_turns: 3\n    history_max_turns: 4\n",
            "Configuration file 'dup.yaml' is not valid YAML: while constructing a mapping, found "
            "duplicate key 'history_max_turns' (at line 4, column 5)",
        ),
        (
            "dup.toml",
            "[context.init_config]\nhistory_max_turns = 1\nhistory_max_turns = 2\n",
            "Configuration file 'dup.toml' is not valid TOML: Cannot overwrite a value (at line 3, "
            "column 22)",
        ),
        (
            "plug.yaml",
            "context:\n  plugin: nope\n",
            "No context plugin is named 'nope'; known plugins: default.",
        ),
    ],
)
def test_holds_bad_config_files_are_one_line_status_2(
    tmp_path: Path, name: str, text: str, first: str
) -> None:
    # HOLDS.
    (tmp_path / name).write_text(text)
    done = cli("replay", "--sample", "--no-progress", "--config", name, cwd=tmp_path)
    assert one_line_error(done, "turnloom replay: error: ") == f"turnloom replay: error: {first}"


def test_holds_a_metrics_port_in_use_is_status_2_and_writes_no_report(tmp_path: Path) -> None:
    # HOLDS: docs/cli.md status 2 "a ... metrics port that cannot be used: nothing ran".
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = cli(
            "loadtest",
            "--sessions",
            "2",
            "--turns",
            "2",
            "--no-progress",
            "--metrics-port",
            str(port),
            "--json",
            "r.json",
            cwd=tmp_path,
        )
    assert one_line_error(done, "turnloom loadtest: error: ") == (
        f"turnloom loadtest: error: cannot serve metrics on 127.0.0.1:{port}: "
        "Address already in use."
    )
    assert not (tmp_path / "r.json").exists()


def test_holds_an_unreachable_redis_store_is_status_2(tmp_path: Path) -> None:
    # HOLDS: port 1 on loopback refuses at once.
    done = cli(
        "loadtest",
        "--sessions",
        "1",
        "--turns",
        "1",
        "--no-progress",
        "--store",
        "redis://127.0.0.1:1/0",
        cwd=tmp_path,
    )
    line = one_line_error(done, "turnloom loadtest: error: --store: The store ")
    assert "is unreachable" in line
