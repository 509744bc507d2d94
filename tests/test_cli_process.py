"""The command line as a newcomer meets it, run as a process: exit status and the one line.

Every problem a user can cause is one line on stderr and a documented exit
status (0, 1, 2, 130), never a traceback or a hang; both backends run.
"""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import select
import signal
import socket
import struct
import subprocess
import sys
import termios
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

import turnloom
from turnloom.cli import EXIT_STATUSES
from turnloom.context.history import HistoryLimits
from turnloom.tools.replay import REPLAY_LIMITS

ROOT = Path(__file__).resolve().parents[1]
HANG_GUARD = 120  # seconds: only a hang reaches it

GOOD = [
    {"role": "system", "content": "Be helpful."},
    {"role": "user", "content": "Hi"},
    {
        "role": "assistant",
        "content": None,
        "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
        ],
    },
    {"role": "tool", "tool_call_id": "c1", "name": "f", "content": "42"},
    {"role": "assistant", "content": "It is 42."},
]
ORPHAN = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello."},
    {"role": "tool", "tool_call_id": "zz", "content": "x"},
]
ORPHAN_REASON = (
    "trajectory 0, message 2: tool message answers call 'zz', which the directly preceding "
    "assistant message did not make."
)


def turnloom_cli(*args: str | Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "turnloom", *map(str, args)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        timeout=HANG_GUARD,
    )


def assert_one_line(done: subprocess.CompletedProcess[str], status: int, line: str) -> None:
    """The process exited with ``status`` and said exactly ``line`` on stderr."""
    assert (done.returncode, done.stderr) == (status, line + "\n")


@pytest.fixture
def good(tmp_path: Path) -> Path:
    path = tmp_path / "a.jsonl"
    path.write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    return path


# -- no hang, no lost work ----------------------------------------------------------


def test_the_same_file_twice_replays_two_sessions_with_their_own_ids(
    good: Path, tmp_path: Path
) -> None:
    """Session ids are unique per input position: no shared context, no hang."""
    other = tmp_path / "other"
    other.mkdir()
    same_name = other / "a.jsonl"
    same_name.write_text(json.dumps(GOOD) + "\n", encoding="utf-8")
    out = tmp_path / "inputs.jsonl"
    done = turnloom_cli("replay", good, good, same_name, "--out", out)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("sessions: 3  turns: 3  model calls prepared: 6  ")
    records = [json.loads(line) for line in out.read_text().splitlines()]
    assert sorted({r["session"] for r in records}) == ["0:a.jsonl#0", "1:a.jsonl#0", "2:a.jsonl#0"]


@pytest.mark.parametrize(
    ("command", "option"), [("loadtest", "--json"), ("replay", "--out")], ids=["json", "out"]
)
def test_an_output_path_that_cannot_be_written_stops_the_run_before_it_starts(
    tmp_path: Path, command: str, option: str
) -> None:
    missing = tmp_path / "missing" / "r.json"
    base = [command, "--sessions", "2"]
    done = turnloom_cli(*base, option, missing)
    assert_one_line(
        done,
        2,
        f"turnloom {command}: error: cannot write {option} {missing}: "
        f"the folder {missing.parent} does not exist.",
    )
    assert done.stdout == ""
    done = turnloom_cli(*base, option, tmp_path)
    assert_one_line(
        done, 2, f"turnloom {command}: error: cannot write {option} {tmp_path}: it is a directory."
    )


def test_out_equal_to_an_input_is_refused_and_the_input_is_untouched(good: Path) -> None:
    before = good.read_bytes()
    for spelling in (good, good.parent / "." / good.name):
        done = turnloom_cli("replay", good, "--out", spelling)
        assert_one_line(
            done,
            2,
            f"turnloom replay: error: --out {spelling} is one of the inputs; "
            "it would be overwritten.",
        )
        assert good.read_bytes() == before


def test_the_loadtest_report_is_written_where_it_was_asked(tmp_path: Path) -> None:
    report = tmp_path / "r.json"
    done = turnloom_cli("loadtest", "--sessions", "2", "--turns", "2", "--json", report)
    assert (done.returncode, done.stderr) == (0, "")
    assert json.loads(report.read_text())["sessions"] == 2


# -- one line, not a traceback ------------------------------------------------------


@pytest.mark.parametrize("port", ["70000", "-1", "http"])
def test_a_metrics_port_out_of_range_is_a_usage_error(port: str) -> None:
    done = turnloom_cli("loadtest", "--sessions", "1", f"--metrics-port={port}")
    reason = (
        f"{port!r} is not a TCP port number"
        if port == "http"
        else f"{port} is not a TCP port (0 to 65535)"
    )
    assert_one_line(
        done,
        2,
        f"turnloom loadtest: error: argument --metrics-port: {reason} "
        "(see 'turnloom loadtest --help').",
    )


def test_a_metrics_port_in_use_is_one_line_and_exit_2() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        done = turnloom_cli("loadtest", "--sessions", "2", "--metrics-port", str(port))
    assert_one_line(
        done,
        2,
        f"turnloom loadtest: error: cannot serve metrics on 127.0.0.1:{port}: "
        "Address already in use.",
    )
    assert done.stdout == ""


def _read_until(fd: int, marker: bytes) -> bytes:
    """Read ``fd`` until ``marker`` appears (bounded by the hang guard)."""
    seen = b""
    deadline = time.monotonic() + HANG_GUARD
    while marker not in seen:
        assert time.monotonic() < deadline, seen[-500:]
        ready, _, _ = select.select([fd], [], [], 1.0)
        if ready:
            chunk = os.read(fd, 65536)
            assert chunk, seen[-500:]
            seen += chunk
    return seen


def _drain(fd: int) -> Iterator[bytes]:
    while True:
        try:
            chunk = os.read(fd, 65536)
        except OSError:  # the pty's other side closed
            return
        if not chunk:
            return
        yield chunk


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ctrl_c_in_a_long_replay_on_a_terminal_shows_progress_then_exits_130(
    backend: str,
) -> None:
    """A long replay on a terminal shows its bar; SIGINT ends it with one line and 130."""
    controller, terminal = pty.openpty()
    # A terminal 80 columns wide (a fresh pty has 0, and tqdm then draws nothing).
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "turnloom", "replay", "--sessions", "1000", "--backend", backend],
        stdout=subprocess.PIPE,
        stderr=terminal,
        cwd=ROOT,
    )
    os.close(terminal)
    try:
        seen = _read_until(controller, b"session/s]")  # the tqdm bar on the terminal
        assert seen.lstrip(b"\r").startswith(b"replay:")
        process.send_signal(signal.SIGINT)
        stdout, _ = process.communicate(timeout=HANG_GUARD)
        seen += b"".join(_drain(controller))
    finally:
        process.kill()
        os.close(controller)
    assert process.returncode == 130
    assert stdout == b""
    text = seen.decode()
    assert "Traceback" not in text
    assert text.replace("\r\n", "\n").rsplit("\r", 1)[-1].splitlines()[-1] == (
        "turnloom replay: interrupted."
    )


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_ctrl_c_in_a_loadtest_exits_130_with_one_line(backend: str) -> None:
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "turnloom",
            "loadtest",
            "--sessions",
            "2000",
            "--metrics-port",
            "0",
            "--backend",
            backend,
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    try:
        assert process.stderr is not None
        first = _read_until(process.stderr.fileno(), b"/metrics\n")
        process.send_signal(signal.SIGINT)
        stdout, stderr = process.communicate(timeout=HANG_GUARD)
    finally:
        process.kill()
    assert process.returncode == 130
    assert stdout == b""
    lines = (first + stderr).decode().splitlines()
    assert lines[0].startswith("serving metrics at http://127.0.0.1:")
    assert lines[1:] == ["turnloom loadtest: interrupted."]


# -- consistency: one loader, one set of errors ---------------------------------------


def _write(path: Path, text: str) -> Path:
    path.write_text(text, encoding="utf-8")
    return path


@pytest.mark.parametrize("command", ["replay", "loadtest"])
def test_a_malformed_trajectory_is_the_same_line_and_exit_1_in_both_commands(
    tmp_path: Path, command: str
) -> None:
    orphan = _write(tmp_path / "orphan.json", json.dumps(ORPHAN))
    source = [orphan] if command == "replay" else ["--source", orphan]
    done = turnloom_cli(command, *source)
    assert_one_line(done, 1, f"turnloom {command}: error: {orphan}, {ORPHAN_REASON}")


@pytest.mark.parametrize("command", ["replay", "loadtest"])
@pytest.mark.parametrize(
    ("name", "content", "reason"),
    [
        ("empty-list.json", "[]", "the file holds no trajectories."),
        ("blank.jsonl", "\n\n", "the file holds no trajectories."),
        (
            "damaged.json",
            json.dumps({"traj": GOOD}, indent=2)[:-3],
            "invalid JSON at line 35, column 3: Expecting ',' delimiter.",
        ),
        (
            "number.json",
            "42",
            "the file holds JSON that decodes to an object of type int, not trajectories.",
        ),
        (
            "object.json",
            json.dumps({"task_id": 3}, indent=2),
            "the file holds one JSON object without a 'traj' or 'messages' list.",
        ),
        ("latin1.json", "caf\xe9", "the file is not valid UTF-8 (byte 3)."),
    ],
    ids=["empty-list", "blank", "damaged-object", "number", "no-traj", "latin1"],
)
def test_an_unreadable_input_is_one_file_level_line_and_exit_2_in_both_commands(
    tmp_path: Path, command: str, name: str, content: str, reason: str
) -> None:
    """A file-level problem names only the file (no trajectory 0, message 0) and runs nothing."""
    path = tmp_path / name
    path.write_bytes(content.encode("latin-1" if name == "latin1.json" else "utf-8"))
    source = [path] if command == "replay" else ["--source", path]
    done = turnloom_cli(command, *source)
    assert_one_line(done, 2, f"turnloom {command}: error: {path}: {reason}")
    assert done.stdout == ""


@pytest.mark.parametrize("command", ["replay", "loadtest"])
def test_a_missing_input_is_one_line_and_exit_2_in_both_commands(
    tmp_path: Path, command: str
) -> None:
    path = tmp_path / "missing.json"
    source = [path] if command == "replay" else ["--source", path]
    done = turnloom_cli(command, *source)
    assert_one_line(
        done,
        2,
        f"turnloom {command}: error: {path}: cannot read the file: No such file or directory.",
    )
    assert done.stdout == ""


@pytest.mark.parametrize(
    "text",
    [
        json.dumps({"traj": GOOD}, indent=2),
        json.dumps(GOOD, indent=2),
        json.dumps({"messages": GOOD}),
    ],
    ids=["pretty-object", "pretty-message-list", "one-line-object"],
)
def test_a_single_trajectory_reads_however_it_is_laid_out(tmp_path: Path, text: str) -> None:
    path = _write(tmp_path / "one.json", text)
    done = turnloom_cli("replay", path)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("sessions: 1  turns: 1  model calls prepared: 2  items: 6  ")


def test_replay_keeps_a_message_the_default_limits_refuse_as_its_help_says(
    tmp_path: Path,
) -> None:
    """Replay's relaxed limits are documented in --help; loadtest keeps the defaults."""
    size = 2 << 20  # over the 1 MiB default per-message cap, under replay's 64 MiB
    assert HistoryLimits().max_item_bytes < size < REPLAY_LIMITS.max_item_bytes
    big = _write(
        tmp_path / "big.json",
        json.dumps(
            [{"role": "user", "content": "x" * size}, {"role": "assistant", "content": "ok"}]
        ),
    )
    replayed = turnloom_cli("replay", big)
    assert (replayed.returncode, replayed.stderr) == (0, "")
    assert replayed.stdout.startswith("sessions: 1  turns: 1  model calls prepared: 1  ")
    loaded = turnloom_cli("loadtest", "--sessions", "1", "--source", big)
    assert loaded.returncode == 1
    refused = re.fullmatch(
        r"turnloom loadtest: error: session-0: [Tt]urn 't0' input\[0\] is (\d+) bytes, over "
        rf"the per-item cap of {HistoryLimits().max_item_bytes} bytes\.\n",
        loaded.stderr,
    )
    assert refused is not None, loaded.stderr
    assert size < int(refused[1]) < size + 200  # the message, serialized
    help_text = " ".join(turnloom_cli("replay", "--help").stdout.split())
    assert (
        "History limits: replay keeps every turn of a session (eviction would change the inputs "
        "it checks) and accepts messages up to 64 MiB; loadtest and the library use turnloom's "
        "defaults (32 turns, 4,096 items and 8 MiB per context, 1 MiB per message)."
    ) in help_text


def test_replay_sessions_with_a_path_replays_the_first_n(tmp_path: Path) -> None:
    path = _write(tmp_path / "three.jsonl", "\n".join([json.dumps(GOOD)] * 3) + "\n")
    done = turnloom_cli("replay", path, "--sessions", "2")
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("sessions: 2  turns: 2  model calls prepared: 4  ")


# -- what a newcomer needs ---------------------------------------------------------------


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_both_commands_run_on_both_backends(backend: str) -> None:
    replayed = turnloom_cli("replay", "--sample", "--backend", backend)
    assert (replayed.returncode, replayed.stderr) == (0, "")
    assert replayed.stdout.startswith("sessions: 5  turns: 37  model calls prepared: 73  ")
    loaded = turnloom_cli(
        "loadtest", "--sessions", "3", "--turns", "2", "--source", "sample", "--backend", backend
    )
    assert (loaded.returncode, loaded.stderr) == (0, "")
    assert loaded.stdout.startswith("sessions: 3  failed: 0  turns: 6  model calls: ")


def test_version_is_the_package_version() -> None:
    done = turnloom_cli("--version")
    assert (done.returncode, done.stdout) == (0, f"turnloom {turnloom.__version__}\n")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    assert 'version = { attr = "turnloom._version.__version__" }' in pyproject  # one place


@pytest.mark.parametrize("command", ["replay", "loadtest"])
def test_help_names_the_gateway_default_and_every_exit_status(command: str) -> None:
    done = turnloom_cli(command, "--help")
    assert done.returncode == 0
    text = " ".join(done.stdout.split())
    assert (
        "--gateway G the provider whose native input is prepared: openai_chat, "
        "openai_responses, anthropic, gemini (default: openai_chat)"
    ) in text
    assert "--backend {asyncio,trio} the event loop to run on (default: asyncio;" in text
    epilog = " ".join(done.stdout.split("exit status:")[1].split())
    assert epilog == " ".join(f"{status} {meaning}" for status, meaning in EXIT_STATUSES)
    assert [status for status, _ in EXIT_STATUSES] == [0, 1, 2, 130, 141]


def test_a_reader_that_goes_away_is_exit_141_without_a_traceback() -> None:
    """``turnloom replay | head -1``: the closed pipe is not an error to report."""
    process = subprocess.Popen(
        [sys.executable, "-m", "turnloom", "replay", "--sessions", "2"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
    )
    with process:
        assert process.stdout is not None and process.stderr is not None
        process.stdout.close()  # the reader is gone before the summary is written
        stderr = process.stderr.read()
        assert process.wait(timeout=HANG_GUARD) == 141
    assert stderr == b""


# -- the progress bar and the lines around it -----------------------------------------

_METRICS_LINE = re.compile(r"serving metrics at http://127\.0\.0\.1:\d+/metrics")


def _terminal_lines(raw: bytes) -> list[str]:
    """What a terminal shows of ``raw``: each line as left by its last carriage return."""
    text = raw.decode().replace("\r\n", "\n")
    return [line.rsplit("\r", 1)[-1] for line in text.split("\n")]


def test_the_metrics_line_on_a_terminal_is_its_own_line_beside_the_bar() -> None:
    """On a terminal the "serving metrics at" line is written through tqdm, which
    clears the bar first: the line stands alone, and the bar goes on below it."""
    controller, terminal = pty.openpty()
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    process = subprocess.Popen(
        [sys.executable, "-m", "turnloom", "loadtest", "--sessions", "20", "--metrics-port", "0"],
        stdout=subprocess.PIPE,
        stderr=terminal,
        cwd=ROOT,
    )
    os.close(terminal)
    try:
        stdout, _ = process.communicate(timeout=HANG_GUARD)
        seen = b"".join(_drain(controller))
    finally:
        process.kill()
        os.close(controller)
    assert process.returncode == 0
    lines = _terminal_lines(seen)
    shown = [line for line in lines if "serving metrics at" in line]
    assert len(shown) == 1
    assert _METRICS_LINE.fullmatch(shown[0]), shown[0]
    assert seen.decode().startswith("\rloadtest:")  # the bar was drawn before the line
    assert "model call/s]" in seen.decode()
    assert b"model calls/s" in stdout


def test_the_metrics_line_is_the_first_stderr_line_and_the_run_exits_0() -> None:
    done = turnloom_cli("loadtest", "--sessions", "5", "--metrics-port", "0")
    assert done.returncode == 0
    first = done.stderr.splitlines()[0]
    assert _METRICS_LINE.fullmatch(first), done.stderr
    assert done.stderr == first + "\n"


def test_the_summary_rates_name_what_they_count(tmp_path: Path) -> None:
    """ "prepares/s" counts prepares; "model calls/s" counts prepares plus builds, the
    count the progress bar shows as "model call/s"."""
    done = turnloom_cli("loadtest", "--sessions", "5", "--json", tmp_path / "report.json")
    assert done.returncode == 0, done.stderr
    assert done.stderr == ""
    report = json.loads((tmp_path / "report.json").read_text(encoding="utf-8"))
    lines = done.stdout.splitlines()
    throughput = next(line for line in lines if line.startswith("throughput:"))
    match = re.fullmatch(
        r"throughput: (\d+) prepares/s  (\d+) model calls/s  wall: ([\d.]+) s", throughput
    )
    assert match is not None, throughput
    assert int(match[1]) == round(report["prepares"] / report["seconds"])
    assert int(match[2]) == round(report["model_calls"] / report["seconds"])
    assert report["model_calls"] > report["prepares"]
