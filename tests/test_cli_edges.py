"""The command line's last rough edges, run as a process: exit status and the first line.

* a reader that goes away while ``--out`` streams the inputs to it is status
  141 without a traceback (the write happens in a worker thread, so the error
  arrives inside an exception group);
* ``--out -`` writes the inputs to standard output (the summary goes to
  standard error), never to a file named ``-``; ``--json -`` likewise for a
  load test's report; ``-`` as a transcript is standard input; ``--plot -`` is
  refused (a picture needs a file);
* a ``--store`` that cannot serve the run -- its folder missing, no Redis
  server answering, a Redis store on trio -- is refused before the run
  starts: status 2, one line;
* more failed sessions than error lines end with "and N more".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from turnloom.errors import excerpt

ROOT = Path(__file__).resolve().parents[1]
HANG_GUARD = 120  # seconds: only a hang reaches it
_ENV = {**os.environ, "PYTHONPATH": str(ROOT)}


def turnloom_cli(
    *args: str | Path, cwd: Path = ROOT, stdin: str | None = None, pythonpath: str | None = None
) -> subprocess.CompletedProcess[str]:
    """``python -m turnloom *args`` in ``cwd`` (``pythonpath``: PYTHONPATH, this tree's
    by default); a hang fails after HANG_GUARD seconds."""
    return subprocess.run(
        [sys.executable, "-m", "turnloom", *map(str, args)],
        input=stdin,
        capture_output=True,
        text=True,
        check=False,
        cwd=cwd,
        env=_ENV if pythonpath is None else {**os.environ, "PYTHONPATH": pythonpath},
        timeout=HANG_GUARD,
    )


@pytest.mark.parametrize("out", ["/dev/stdout", "-"])
def test_a_reader_that_goes_away_while_out_streams_is_141_without_a_traceback(
    out: str,
) -> None:
    """``turnloom replay --sample --out /dev/stdout | head``: 141, nothing on stderr."""
    process = subprocess.Popen(
        [sys.executable, "-m", "turnloom", "replay", "--sample", "--out", out, "--no-progress"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env=_ENV,
    )
    with process:
        assert process.stdout is not None and process.stderr is not None
        assert process.stdout.read(100).startswith(b'{"session":')
        process.stdout.close()  # what head does after its lines: ~1 MB is still to come
        stderr = process.stderr.read()
        assert process.wait(timeout=HANG_GUARD) == 141
    assert stderr == b""


def test_out_dash_is_standard_output_and_the_summary_goes_to_standard_error(
    tmp_path: Path,
) -> None:
    """73 JSONL inputs on stdout, the three summary lines on stderr, no file '-'."""
    done = turnloom_cli("replay", "--sample", "--out", "-", "--no-progress", cwd=tmp_path)
    assert done.returncode == 0
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert len(records) == 73
    assert {r["session"] for r in records} == {
        f"{i}:tau-bench-airline-5.json#{i}" for i in range(5)
    }
    lines = done.stderr.splitlines()
    assert (
        lines[0] == "sessions: 5  turns: 37  model calls prepared: 73  items: 1488  bytes: 1108375"
    )
    assert lines[2].split("wall:")[0] == "normalized: 17  added items: 0  errors: 0  "
    assert not (tmp_path / "-").exists()


def test_json_dash_is_standard_output_and_the_text_report_goes_to_standard_error(
    tmp_path: Path,
) -> None:
    """``loadtest --json -``: stdout is exactly the JSON report (one document), the
    text report is on stderr, and no file named '-' is written."""
    done = turnloom_cli(
        "loadtest", "--sessions", "3", "--turns", "2", "--json", "-", "--no-progress", cwd=tmp_path
    )
    assert done.returncode == 0
    report = json.loads(done.stdout)
    assert (report["sessions"], report["sessions_failed"], report["turns"]) == (3, 0, 6)
    assert (report["model_calls"], report["prepares"], report["errors"]) == (12, 6, [])
    lines = done.stderr.splitlines()
    assert lines[0] == "sessions: 3  failed: 0  turns: 6  model calls: 12  prepares: 6"
    assert len(lines) == 8
    assert lines[4].startswith("full collections: 0 after the ramp-up")
    assert lines[7].startswith("prompt cache share: 100.0% of bytes, 100.0% of tokens")
    assert not (tmp_path / "-").exists()


def test_json_to_a_file_leaves_the_text_report_on_standard_output(tmp_path: Path) -> None:
    """The counterpart: without '-', stdout keeps the text report and stderr is empty."""
    done = turnloom_cli(
        "loadtest",
        "--sessions",
        "3",
        "--turns",
        "2",
        "--json",
        "r.json",
        "--no-progress",
        cwd=tmp_path,
    )
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.splitlines()[0] == (
        "sessions: 3  failed: 0  turns: 6  model calls: 12  prepares: 6"
    )
    assert json.loads((tmp_path / "r.json").read_text())["prepares"] == 6


def test_a_transcript_dash_is_standard_input(tmp_path: Path) -> None:
    """``replay -`` reads the trajectories from stdin: the shipped sample piped in
    replays as ``--sample`` does (5 sessions, 73 model calls), sources named '-'."""
    sample = ROOT / "turnloom" / "tools" / "data" / "tau-bench-airline-5.json"
    done = turnloom_cli(
        "replay",
        "-",
        "--out",
        "-",
        "--no-progress",
        cwd=tmp_path,
        stdin=sample.read_text(encoding="utf-8"),
    )
    assert done.returncode == 0
    records = [json.loads(line) for line in done.stdout.splitlines()]
    assert {r["session"] for r in records} == {f"{i}:-#{i}" for i in range(5)}
    assert len(records) == 73
    assert done.stderr.splitlines()[0] == (
        "sessions: 5  turns: 37  model calls prepared: 73  items: 1488  bytes: 1108375"
    )


def test_plot_dash_is_refused_before_the_run(tmp_path: Path) -> None:
    done = turnloom_cli("loadtest", "--sessions", "3", "--plot", "-", cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "turnloom loadtest: error: --plot cannot write standard output ('-'): give FILE.png "
        "or FILE.svg."
    ]


def test_source_dash_cannot_feed_a_fleet(tmp_path: Path) -> None:
    """Standard input is read once: ``--source - --processes 2`` is refused, nothing runs."""
    done = turnloom_cli(
        "loadtest", "--sessions", "4", "--source", "-", "--processes", "2", cwd=tmp_path, stdin=""
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.splitlines() == [
        "turnloom loadtest: error: --source - runs in one process; it cannot be used with "
        "--processes."
    ]


def test_a_store_in_a_missing_folder_is_refused_before_the_run(tmp_path: Path) -> None:
    url = f"sqlite:{tmp_path}/missing/contexts.db"
    done = turnloom_cli("loadtest", "--sessions", "3", "--turns", "2", "--store", url)
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        f"turnloom loadtest: error: --store: The store {excerpt(url)} cannot be created: the "
        f"folder {excerpt(f'{tmp_path}/missing')} does not exist."
    ]
    assert not (tmp_path / "missing").exists()


def test_a_redis_store_that_does_not_answer_is_refused_before_the_run() -> None:
    """Port 1 on loopback: nothing listens there."""
    pytest.importorskip("redis")
    done = turnloom_cli(
        "loadtest", "--sessions", "3", "--turns", "2", "--store", "redis://127.0.0.1:1/0"
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "turnloom loadtest: error: --store: The store 'redis://127.0.0.1:1/0' is unreachable: "
        "'Error 111 connecting to 127.0.0.1:1. Connection refused.'."
    ]


def test_a_redis_store_on_trio_is_refused_before_the_run() -> None:
    pytest.importorskip("redis")
    pytest.importorskip("trio")
    done = turnloom_cli(
        "loadtest",
        "--sessions",
        "3",
        "--turns",
        "2",
        "--backend",
        "trio",
        "--store",
        "redis://127.0.0.1:1/0",
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr.splitlines() == [
        "turnloom loadtest: error: --store: The store 'redis://127.0.0.1:1/0' runs on asyncio "
        "only (the redis client is asyncio-based), not 'trio': use the asyncio backend, or a "
        "sqlite: store."
    ]


def test_a_store_check_also_guards_a_fleet_run(tmp_path: Path) -> None:
    """``--processes 2`` starts no process when the store cannot serve them."""
    url = f"sqlite:{tmp_path}/missing/contexts.db"
    done = turnloom_cli(
        "loadtest", "--sessions", "4", "--turns", "2", "--processes", "2", "--store", url
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.startswith("turnloom loadtest: error: --store: The store ")


def test_more_failed_sessions_than_error_lines_end_with_and_n_more(tmp_path: Path) -> None:
    """12 sessions whose first message is over loadtest's 1 MiB per-item cap: 10 lines,
    then "and 2 more failed sessions."; status 1."""
    path = tmp_path / "big.jsonl"
    big = [
        {"role": "system", "content": "s"},
        {"role": "user", "content": "x" * 1_100_000},
        {"role": "assistant", "content": "ok"},
    ]
    path.write_text(json.dumps(big) + "\n", encoding="utf-8")
    done = turnloom_cli(
        "loadtest", "--source", path, "--sessions", "12", "--turns", "2", "--no-progress"
    )
    assert done.returncode == 1
    lines = done.stderr.splitlines()
    assert lines[0] == (
        "turnloom loadtest: error: session-0: Turn 't0' input[0] is 1100117 bytes, over the "
        "per-item cap of 1048576 bytes."
    )
    assert len(lines) == 11
    assert lines[-1] == "turnloom loadtest: error: and 2 more failed sessions."
    assert done.stdout.splitlines()[0].startswith("sessions: 12  failed: 12  ")
