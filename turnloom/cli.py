"""The ``turnloom`` command line: ``replay``, ``loadtest`` and ``memory``.

Every problem is one line on stderr, ``turnloom <command>: error: ...``; no
traceback reaches the user for anything the command line can foresee.
Everything a run needs is checked before it starts (gateway, backend, inputs,
output paths, metrics port), so a bad option never costs a run or its report.

Exit status (also in ``--help``): see :data:`EXIT_STATUSES`.
"""

from __future__ import annotations

__all__ = ("EXIT_STATUSES", "main")

import argparse
import importlib.util
import math
import os
import signal
import sys
import textwrap
import uuid
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import BinaryIO, NoReturn, TextIO, TypeVar

import anyio
import anyio.abc
import msgspec
from tqdm import tqdm  # type: ignore[import-untyped]

from turnloom import __version__
from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.context.history import HistoryLimits
from turnloom.context.memory import TenantScope, check_tenant_scope
from turnloom.errors import ConfigError, InputError, StoreError, TurnloomError, excerpt
from turnloom.runtime import STRATEGIES
from turnloom.runtime.config import RuntimeConfig, build_context_manager, load_config
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.metrics import MetricsServer, serve_metrics
from turnloom.stores import SQLiteMemory, check_context_store
from turnloom.tools.fleet import run_fleet
from turnloom.tools.loadtest import (
    LoadtestReport,
    LoadtestSamples,
    count_model_calls,
    loadtest,
    sustained_sessions,
)
from turnloom.tools.memory import add_memory_parser, run_memory
from turnloom.tools.plot import check_plot_path, plot_loadtest
from turnloom.tools.replay import REPLAY_LIMITS, ReplaySummary, replay
from turnloom.tools.trajectories import (
    SAMPLE,
    ReplayError,
    Trajectory,
    builtin_trajectories,
    check_trajectory,
    load_trajectories,
)

EXIT_STATUSES = (
    (0, "every session ran and every check passed"),
    (1, "a session or trajectory failed: each is one error line, the others still ran"),
    (
        2,
        "usage error, an input that cannot be read, or an output, backend, gateway or "
        "metrics port that cannot be used: nothing ran",
    ),
    (130, "interrupted (Ctrl-C)"),
    (141, "the reader of the output went away (a closed pipe, as with '| head')"),
)
"""The exit statuses of every command, with their meaning."""

_T = TypeVar("_T")
_REPLAY_SESSIONS = 24
_PROGRESS_DELAY = 1.0  # seconds before a replay's progress bar appears
_STDOUT = Path("-")  # ``--out -``, ``--json -``: standard output


class _Refused(Exception):
    """A problem found at the door: each argument is one error line; exit status 2."""


class _Parser(argparse.ArgumentParser):
    """argparse with one-line usage errors (``turnloom replay: error: ...``), status 2."""

    def error(self, message: str) -> NoReturn:
        self.exit(2, f"{self.prog}: error: {message} (see '{self.prog} --help').\n")


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text)} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a number of seconds") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{value} is not a finite number of seconds >= 0")
    return value


def _port(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a TCP port number") from None
    if not 0 <= value <= 65535:
        raise argparse.ArgumentTypeError(f"{value} is not a TCP port (0 to 65535)")
    return value


def _mib(n: int) -> str:
    return f"{n / 2**20:g} MiB"


def _paragraphs(*texts: str) -> str:
    return "\n\n".join(textwrap.fill(text, 79) for text in texts)


def _epilog() -> str:
    lines = ["exit status:"]
    for status, meaning in EXIT_STATUSES:
        lines.append(
            textwrap.fill(meaning, 79, initial_indent=f"  {status:<5}", subsequent_indent=" " * 7)
        )
    return "\n".join(lines)


def _add_run_options(parser: argparse.ArgumentParser) -> None:
    gateways = [g.value for g in GatewayType]
    parser.add_argument(
        "--gateway",
        choices=gateways,
        default=GatewayType.openai_chat.value,
        metavar="G",
        help="the provider whose native input is prepared: "
        f"{', '.join(gateways)} (default: openai_chat)",
    )
    parser.add_argument(
        "--backend",
        choices=("asyncio", "trio"),
        default="asyncio",
        help="the event loop to run on (default: asyncio; trio needs the 'trio' package)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (shown on a terminal only)"
    )
    parser.add_argument(
        "--config",
        type=Path,
        metavar="FILE",
        help="build the context manager from this YAML or TOML file's 'context' section",
    )


def _parser() -> argparse.ArgumentParser:
    formatter = argparse.RawDescriptionHelpFormatter
    parser = _Parser(
        prog="turnloom",
        description="Cooperative context runtime for LLM agents: replay transcripts, load-test.",
        epilog=_epilog(),
        formatter_class=formatter,
    )
    parser.add_argument("--version", action="version", version=f"turnloom {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    defaults = HistoryLimits()
    rp = commands.add_parser(
        "replay",
        help="replay agent transcripts through the ContextManager",
        description=_paragraphs(
            "Replay OpenAI Chat transcripts (tau-bench list, one trajectory, or JSONL) "
            "through one Foundation, checking every prepared input against what the agent "
            f"sent; with no PATH and no --sample, a built-in generated workload of "
            f"{_REPLAY_SESSIONS} sessions.",
            "History limits: replay keeps every turn of a session (eviction would change the "
            "inputs it checks) and accepts messages up to "
            f"{_mib(REPLAY_LIMITS.max_item_bytes)}; loadtest and the library use turnloom's "
            f"defaults ({defaults.max_turns} turns, {defaults.max_items:,} items and "
            f"{_mib(defaults.max_bytes)} per context, {_mib(defaults.max_item_bytes)} per "
            "message).",
        ),
        epilog=_epilog(),
        formatter_class=formatter,
    )
    rp.add_argument(
        "paths",
        nargs="*",
        type=Path,
        metavar="PATH",
        help="transcript files; '-' is standard input",
    )
    rp.add_argument(
        "--sample",
        action="store_true",
        help="replay the 5 real tau-bench trajectories shipped with turnloom",
    )
    rp.add_argument(
        "--out",
        type=Path,
        metavar="FILE.jsonl",
        help="write every prepared input (JSONL); '-' is standard output (the summary then "
        "goes to standard error)",
    )
    rp.add_argument(
        "--concurrency",
        type=_positive,
        default=4,
        metavar="N",
        help="sessions replayed at once (default: 4)",
    )
    rp.add_argument(
        "--sessions",
        type=_positive,
        metavar="N",
        help=f"replay the first N trajectories of the inputs (default: all), or N sessions "
        f"of the built-in workload (default: {_REPLAY_SESSIONS})",
    )
    rp.add_argument(
        "--strategy",
        choices=sorted(STRATEGIES),
        help="assemble every turn with this strategy: jit or stratified",
    )
    rp.add_argument("--memory", metavar="DB", help="the SQLite memory database it searches")
    rp.add_argument(
        "--tenant", default="replay", metavar="T", help="the sessions' tenant (default: replay)"
    )
    _add_run_options(rp)

    lt = commands.add_parser(
        "loadtest",
        help="run many concurrent sessions through one Foundation",
        description=_paragraphs(
            "Run N concurrent sessions in one Foundation and report throughput, prepare "
            "latency, event-loop lag, peak RSS, rejections and evictions. Histories keep "
            "turnloom's default limits, so long sessions evict."
        ),
        epilog=_epilog(),
        formatter_class=formatter,
    )
    lt.add_argument(
        "--sessions", type=_positive, default=100, help="concurrent sessions (default: 100)"
    )
    lt.add_argument(
        "--turns", type=_positive, default=40, help="turns per session, at most (default: 40)"
    )
    lt.add_argument(
        "--source",
        default="builtin",
        metavar="builtin|sample|PATH",
        help="the built-in workload, the shipped tau-bench sample, or a transcript file "
        "('-': standard input) (default: builtin)",
    )
    lt.add_argument(
        "--metrics-port",
        type=_port,
        metavar="P",
        help="serve Prometheus /metrics on 127.0.0.1:P while running (0: any free port)",
    )
    lt.add_argument(
        "--think-time",
        type=_seconds,
        default=0.0,
        metavar="SECONDS",
        help="a user's pause between a session's turns (default: 0, saturated; 2 with --sustained)",
    )
    lt.add_argument(
        "--sustained",
        action="store_true",
        help="search for the most sessions whose prepare p99 stays under 50 ms with the "
        "think time, starting at --sessions, and report it",
    )
    lt.add_argument(
        "--json",
        type=Path,
        metavar="FILE",
        help="write the report as JSON; '-' is standard output (the text report then goes "
        "to standard error)",
    )
    lt.add_argument(
        "--plot",
        type=Path,
        metavar="FILE",
        help="draw prepare latency, loop lag, GC pauses and throughput over the run "
        "(FILE.png or FILE.svg; needs the plot extra)",
    )
    _add_run_options(lt)
    lt.add_argument(
        "--store",
        metavar="URL",
        help="keep sessions in a durable store: sqlite:PATH or redis://HOST:PORT/DB "
        "(every commit is flushed before its prepare)",
    )
    lt.add_argument(
        "--processes",
        type=_positive,
        default=1,
        help="spread the sessions over N processes (sharing --store) and add them up (1)",
    )
    lt.add_argument(
        "--takeover",
        action="store_true",
        help="with --processes and --store: a process that finished its sessions claims the "
        "others' once their leases are free and replays what is left of them, so the "
        "sessions of a process that dies are finished by the survivors; contexts stay in "
        "the store",
    )
    lt.add_argument(
        "--lease-ttl",
        type=float,
        default=10.0,
        metavar="SECONDS",
        help="with --store: seconds a lease lasts unless renewed (10)",
    )
    lt.add_argument("--takeover-sessions", type=int, default=None, help=argparse.SUPPRESS)
    lt.add_argument("--acknowledged-log", type=Path, default=None, help=argparse.SUPPRESS)
    lt.add_argument("--first-session", type=int, default=0, help=argparse.SUPPRESS)
    lt.add_argument("--run-id", default=None, help=argparse.SUPPRESS)
    add_memory_parser(commands)
    return parser


# -- the door ----------------------------------------------------------------------


def _check_run_options(args: argparse.Namespace) -> list[str]:
    problems: list[str] = []
    try:
        get_gateway(args.gateway)
    except InputError as exc:
        problems.append(str(exc))
    if args.backend == "trio" and importlib.util.find_spec("trio") is None:
        problems.append("the trio backend needs the 'trio' package (pip install trio).")
    return problems


def _load_config(args: argparse.Namespace) -> RuntimeConfig | None:
    """The ``--config`` file, checked (its plugin builds a manager); None without one.

    Raises:
        _Refused: the file cannot be read or checked (one line naming the key), or
            its plugin cannot build a manager from it.
    """
    if args.config is None:
        return None
    try:
        config = load_config(args.config)
        # Built once, unbound, and dropped: a plugin that cannot build is refused here.
        build_context_manager(config, gateway=args.gateway)
    except (ConfigError, InputError) as exc:
        raise _Refused(str(exc)) from None
    return config


def _check_store(url: str, backend: str) -> list[str]:
    """Whether ``--store URL`` can serve a run on ``backend`` (its folder, its server)."""
    try:
        check_context_store(url, backend=backend)
    except TurnloomError as exc:
        return [f"--store: {exc}"]
    return []


def _same_file(a: Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return a.resolve() == b.resolve()


def _check_output(option: str, path: Path | None, inputs: Sequence[Path]) -> list[str]:
    """Whether ``path`` can be written, without creating or truncating it.

    ``-`` is standard output: always writable, and never one of the inputs.
    """
    if path is None or path == _STDOUT:
        return []
    if any(_same_file(path, source) for source in inputs):
        return [f"{option} {path} is one of the inputs; it would be overwritten."]
    if path.is_dir():
        return [f"cannot write {option} {path}: it is a directory."]
    parent = path.parent
    if not parent.is_dir():
        return [f"cannot write {option} {path}: the folder {parent} does not exist."]
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        return [f"cannot write {option} {path}: permission denied."]
    return []


def _open_output(option: str, path: Path) -> BinaryIO:
    """``path`` opened for writing; ``-`` is standard output, left open when closed."""
    if path == _STDOUT:
        sys.stdout.flush()
        return open(sys.stdout.fileno(), "wb", closefd=False)
    try:
        return path.open("wb")
    except OSError as exc:
        raise _Refused(f"cannot write {option} {path}: {exc.strerror}.") from None


def _write_json(option: str, path: Path, value: object) -> None:
    """``value`` as indented JSON in ``path`` (``-``: standard output), newline-terminated."""
    with _open_output(option, path) as file:
        file.write(msgspec.json.format(msgspec.json.encode(value)) + b"\n")


def _text_out(args: argparse.Namespace) -> TextIO:
    """Where a load test's text report goes: standard error when ``--json -`` takes stdout."""
    return sys.stderr if args.json == _STDOUT else sys.stdout


def _load(paths: Sequence[Path]) -> tuple[list[Trajectory], list[ReplayError]]:
    """Read every input with the one loader: the trajectories and the trajectory-level errors.

    Raises:
        _Refused: a file cannot be read as a whole (one line per such file).
    """
    trajectories: list[Trajectory] = []
    file_errors: list[str] = []
    errors: list[ReplayError] = []
    for path in paths:
        loaded, problems = load_trajectories(path)
        trajectories.extend(loaded)
        for problem in problems:
            if problem.file_level:
                file_errors.append(str(problem))
            else:
                errors.append(problem)
    if file_errors:
        raise _Refused(*file_errors)
    return trajectories, errors


def _run(args: argparse.Namespace, job: Callable[[], Awaitable[_T]]) -> _T:
    """Run ``job`` on the chosen backend; Ctrl-C cancels it and raises KeyboardInterrupt.

    SIGINT is turned into a cancellation of the job, the shutdown path the
    runtime is built for (the Foundation closes in order, worker threads
    finish), instead of a KeyboardInterrupt landing at an arbitrary point.
    """

    async def watch(scope: anyio.CancelScope, *, task_status: anyio.abc.TaskStatus[None]) -> None:
        with anyio.open_signal_receiver(signal.SIGINT) as signals:
            task_status.started()
            async for _ in signals:
                scope.cancel()
                return

    async def supervised() -> _T:
        done: list[_T] = []
        try:
            async with anyio.create_task_group() as group:
                await group.start(watch, group.cancel_scope)
                done.append(await job())
                group.cancel_scope.cancel()
        except BaseExceptionGroup as failed:
            if len(failed.exceptions) == 1:
                raise failed.exceptions[0] from None
            raise
        if not done:
            raise KeyboardInterrupt
        return done[0]

    return anyio.run(supervised, backend=args.backend)


def _progress(args: argparse.Namespace, *, total: int, unit: str, delay: float = 0.0) -> tqdm:
    return tqdm(
        total=total,
        unit=unit,
        desc=args.command,
        delay=delay,
        disable=args.no_progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )


# -- replay ------------------------------------------------------------------------


def _print_summary(summary: ReplaySummary, out: TextIO) -> None:
    print(
        f"sessions: {summary.sessions}  turns: {summary.turns}  "
        f"model calls prepared: {summary.model_calls}  items: {summary.items}  "
        f"bytes: {summary.bytes}",
        file=out,
    )
    print(
        f"prepare latency: p50 {summary.prepare_p50_ms:.2f} ms  "
        f"p99 {summary.prepare_p99_ms:.2f} ms",
        file=out,
    )
    print(
        f"normalized: {summary.normalized}  added items: {summary.added_items}  "
        f"errors: {len(summary.errors)}  "
        f"wall: {summary.seconds:.2f} s",
        file=out,
    )
    _print_share(summary.prefix_reuse, summary.prefix_reuse_tokens, out)
    if summary.strategy is not None:
        print(
            f"strategy: {summary.strategy}  hydrated entries: {summary.hydrated_entries}  "
            f"prefix reuse: {summary.prefix_reuse:.1%}",
            file=out,
        )


def _open_memory(args: argparse.Namespace) -> tuple[SQLiteMemory | None, TenantScope | None]:
    """The memory database and tenant of ``replay --strategy``, checked at the door.

    Raises:
        _Refused: ``--memory`` without ``--strategy``, a bad tenant, or a
            database that is missing or unusable.
    """
    if args.strategy is None:
        if args.memory is not None:
            raise _Refused("--memory needs --strategy jit or --strategy stratified.")
        return None, None
    try:
        scope = check_tenant_scope(TenantScope(tenant_id=args.tenant), "--tenant")
        memory = SQLiteMemory(args.memory, create=False) if args.memory is not None else None
    except TurnloomError as exc:
        raise _Refused(str(exc)) from None
    return memory, scope


def _replay(args: argparse.Namespace) -> int:
    paths: list[Path] = [*args.paths, *([SAMPLE] if args.sample else [])]
    to_stdout = args.out == _STDOUT
    problems = _check_run_options(args) + _check_output("--out", args.out, paths)
    if problems:
        raise _Refused(*problems)
    config = _load_config(args)
    load_errors: list[ReplayError] = []
    if paths:
        # Trajectory-level problems are reported with the summary, beside the
        # ones the replay finds while checking each trajectory.
        trajectories, load_errors = _load(paths)
        if args.sessions is not None:
            trajectories = trajectories[: args.sessions]
    else:
        trajectories = builtin_trajectories(args.sessions or _REPLAY_SESSIONS)
    if config is not None and args.strategy is not None:
        raise _Refused(
            "--strategy cannot be combined with --config: the configured plugin builds the manager."
        )
    memory, scope = _open_memory(args)
    out: BinaryIO | None = None
    if to_stdout:
        out = sys.stdout.buffer
    elif args.out is not None:
        out = _open_output("--out", args.out)
    bar = _progress(args, total=len(trajectories), unit="session", delay=_PROGRESS_DELAY)
    try:
        summary = _run(
            args,
            lambda: replay(
                trajectories,
                gateway=args.gateway,
                concurrency=args.concurrency,
                out=out,
                load_errors=load_errors,
                on_session=lambda: bar.update(),
                config=config,
                strategy=args.strategy,
                memory=memory,
                scope=scope,
            ),
        )
    finally:
        bar.close()
        if memory is not None:
            memory.close()
        if to_stdout:
            sys.stdout.flush()
            sys.stdout.buffer.flush()
        elif out is not None:
            out.close()
    for error in summary.errors:
        print(f"turnloom replay: error: {error}", file=sys.stderr)
    # With the inputs on standard output, the summary goes beside the errors.
    _print_summary(summary, sys.stderr if to_stdout else sys.stdout)
    return 1 if summary.errors else 0


# -- loadtest ----------------------------------------------------------------------


def _per_second(count: int, seconds: float) -> str:
    """``count / seconds`` rounded, as the progress bar's rate of the same count."""
    return f"{count / seconds:.0f}" if seconds > 0 else "0"


def _print_report(report: LoadtestReport, out: TextIO) -> None:
    print(
        f"sessions: {report.sessions}  failed: {report.sessions_failed}  turns: {report.turns}  "
        f"model calls: {report.model_calls}  prepares: {report.prepares}",
        file=out,
    )
    print(
        f"throughput: {report.prepares_per_second:.0f} prepares/s  "
        f"{_per_second(report.model_calls, report.seconds)} model calls/s  "
        f"wall: {report.seconds:.2f} s",
        file=out,
    )
    print(
        f"prepare latency: p50 {report.prepare_p50_ms:.2f} ms  p95 {report.prepare_p95_ms:.2f} ms"
        f"  p99 {report.prepare_p99_ms:.2f} ms",
        file=out,
    )
    print(
        f"event-loop lag: p99 {report.loop_lag_p99_ms:.2f} ms  max {report.loop_lag_max_ms:.2f} ms"
        f"  (longest GC pause {report.gc_pause_max_ms:.2f} ms, "
        f"{report.gc_full_collections} full collections)",
        file=out,
    )
    print(
        f"full collections: {report.gc_full_steady} after the ramp-up (the policy's steps "
        f"aside), longest {report.gc_full_cpu_max_ms:.2f} ms CPU  collector policy: "
        f"{report.collector_steps} steps, {report.collector_thorough_steps} thorough, "
        f"longest {report.collector_step_cpu_max_ms:.2f} ms CPU",
        file=out,
    )
    _print_cpu(report.cpu_seconds, report.render_seconds, report.prepares, out)
    print(
        f"peak RSS: {report.peak_rss_bytes / 2**20:.1f} MiB  rejections: {report.rejections}  "
        f"evictions: {report.evicted_turns} turns",
        file=out,
    )
    _print_share(report.prefix_reuse, report.prefix_reuse_tokens, out)
    if report.store:
        print(f"store: {report.store}  lease takeovers: {report.takeovers}", file=out)


def _print_share(share: float, tokens: float, out: TextIO) -> None:
    # What a provider's prefix cache could serve: statistics().prefix, per context.
    print(
        f"prompt cache share: {share:.1%} of bytes, {tokens:.1%} of tokens "
        "(each context's previous input repeated by its next)",
        file=out,
    )


def _print_cpu(cpu_seconds: float, render_seconds: float, prepares: int, out: TextIO) -> None:
    if prepares:
        print(
            f"CPU per prepare: {cpu_seconds / prepares * 1e6:.0f} us  (worker render "
            f"{render_seconds / prepares * 1e6:.0f} us)",
            file=out,
        )


def _print_errors(errors: Sequence[str], failed: int) -> None:
    """The error lines of a load test: the first sessions' errors, then how many more failed."""
    for message in errors:
        print(f"turnloom loadtest: error: {message}", file=sys.stderr)
    if failed > len(errors):
        more = failed - len(errors)
        print(
            f"turnloom loadtest: error: and {more} more failed session{'s' * (more != 1)}.",
            file=sys.stderr,
        )


def _fleet(args: argparse.Namespace) -> int:
    common = ["--turns", str(args.turns), "--source", args.source, "--gateway", args.gateway]
    common += ["--backend", args.backend, "--think-time", repr(args.think_time)]
    if args.config is not None:
        common += ["--config", str(args.config)]
    if args.store is not None:
        common += ["--store", args.store, "--lease-ttl", repr(args.lease_ttl)]
    if args.takeover:
        common += ["--takeover-sessions", str(args.sessions)]
    try:
        report = run_fleet(
            common,
            processes=args.processes,
            sessions=args.sessions,
            run_id=args.run_id or f"{uuid.uuid4().hex[:8]}:",
        )
    except InputError as exc:
        raise _Refused(str(exc)) from None
    out = _text_out(args)
    print(
        f"processes: {report.processes}  sessions: {report.sessions}  failed: "
        f"{report.sessions_failed}  turns: {report.turns}  prepares: {report.prepares}",
        file=out,
    )
    print(
        f"throughput: {report.prepares_per_second:.0f} prepares/s  "
        f"{_per_second(report.model_calls, report.seconds)} model calls/s  "
        f"wall: {report.seconds:.2f} s"
        f"  store: {report.store or 'off'}  lease takeovers: {report.takeovers}",
        file=out,
    )
    print(
        f"prepare latency (worst process): p50 {report.prepare_p50_ms:.2f} ms  "
        f"p95 {report.prepare_p95_ms:.2f} ms  p99 {report.prepare_p99_ms:.2f} ms",
        file=out,
    )
    print(
        f"event-loop lag (worst process): p99 {report.loop_lag_p99_ms:.2f} ms  max "
        f"{report.loop_lag_max_ms:.2f} ms  (longest GC pause {report.gc_pause_max_ms:.2f} ms, "
        f"{report.gc_full_collections} full collections in all)",
        file=out,
    )
    print(
        f"full collections: {report.gc_full_steady} after the ramp-up in all, longest "
        f"{report.gc_full_cpu_max_ms:.2f} ms CPU  collector policy: {report.collector_steps} "
        f"steps, {report.collector_thorough_steps} thorough in all",
        file=out,
    )
    _print_cpu(report.cpu_seconds, report.render_seconds, report.prepares, out)
    rss = "  ".join(f"{b / 2**20:.1f}" for b in report.peak_rss_bytes)
    print(f"peak RSS per process: {rss} MiB", file=out)
    _print_share(report.prefix_reuse, report.prefix_reuse_tokens, out)
    _print_errors(report.errors, report.sessions_failed)
    if args.json is not None:
        _write_json("--json", args.json, report)
    return 1 if report.sessions_failed else 0


def _loadtest(args: argparse.Namespace) -> int:
    source = {"builtin": None, "sample": SAMPLE}.get(args.source, Path(args.source))
    paths = [source] if source is not None else []
    problems = _check_run_options(args) + _check_output("--json", args.json, paths)
    if args.plot is not None:
        unusable = check_plot_path(args.plot)
        problems += [unusable] if unusable else _check_output("--plot", args.plot, paths)
        if args.sustained:
            problems.append("--plot draws one run; it cannot be used with --sustained.")
    if args.processes > 1:
        given = {
            "--sustained": args.sustained,
            "--metrics-port": args.metrics_port is not None,
            "--plot": args.plot is not None,
            "--source -": args.source == "-",
        }
        problems += [
            f"{option} runs in one process; it cannot be used with --processes."
            for option, used in given.items()
            if used
        ]
    if args.takeover and (args.processes < 2 or args.store is None):
        problems.append("--takeover needs --processes 2 or more and a --store.")
    if not (math.isfinite(args.lease_ttl) and args.lease_ttl > 0):
        problems.append(f"--lease-ttl must be a positive number of seconds, not {args.lease_ttl}.")
    if not problems and args.store is not None:
        problems += _check_store(args.store, args.backend)
    if problems:
        raise _Refused(*problems)
    if args.processes > 1:
        return _fleet(args)
    config = _load_config(args)
    errors: list[ReplayError] = []
    if source is None:
        # Every process of a takeover fleet replays session i the same way.
        count = args.takeover_sessions or args.sessions
        trajectories = builtin_trajectories(min(count, 64), turns=(args.turns, args.turns))
    else:
        loaded, errors = _load(paths)
        trajectories = []
        for trajectory in loaded:
            checked = check_trajectory(trajectory)
            if isinstance(checked, ReplayError):
                errors.append(checked)
            else:
                trajectories.append(trajectory)
    for error in errors:
        print(f"turnloom loadtest: error: {error}", file=sys.stderr)
    if not trajectories:
        return 1
    if args.sustained:
        return _sustained(args, trajectories, config, errors)
    total = count_model_calls(trajectories, sessions=args.sessions, turns=args.turns)
    # The bar counts model calls (prepares plus builds), as "model calls/s" in the
    # summary does; "prepares/s" there counts prepares only.
    bar = _progress(args, total=total, unit="model call")
    servers: list[MetricsServer] = []
    samples = LoadtestSamples() if args.plot is not None else None

    def on_open(foundation: Foundation) -> None:
        if args.metrics_port is not None:
            try:
                server = serve_metrics(foundation.manager.statistics, port=args.metrics_port)
            except OSError as exc:
                raise _Refused(
                    f"cannot serve metrics on 127.0.0.1:{args.metrics_port}: {exc.strerror or exc}."
                ) from None
            servers.append(server)
            # Through tqdm, which clears the bar, writes the line and redraws it.
            tqdm.write(f"serving metrics at {server.url}", file=sys.stderr)
            sys.stderr.flush()

    acknowledged = (
        open(args.acknowledged_log, "a", encoding="utf-8")  # closed below
        if args.acknowledged_log is not None
        else None
    )
    try:
        report = _run(
            args,
            lambda: loadtest(
                trajectories,
                sessions=args.sessions,
                turns=args.turns,
                gateway=args.gateway,
                on_model_call=lambda: bar.update(),
                on_open=on_open,
                config=config,
                think_time=args.think_time,
                store=args.store,
                first_session=args.first_session,
                run_id=args.run_id or (f"{uuid.uuid4().hex[:8]}:" if args.store else ""),
                takeover_sessions=args.takeover_sessions,
                lease_ttl=args.lease_ttl,
                acknowledged_log=acknowledged,
                samples=samples,
            ),
        )
    except (InputError, StoreError) as exc:
        raise _Refused(str(exc)) from None
    finally:
        bar.close()
        for server in servers:
            server.close()
        if acknowledged is not None:
            acknowledged.close()
    _print_report(report, _text_out(args))
    _print_errors(report.errors, report.sessions_failed)
    if args.json is not None:
        # Checked at the door; the text report is out even if this write fails.
        _write_json("--json", args.json, report)
    if samples is not None:
        try:
            plot_loadtest(samples, report, args.plot)
        except OSError as exc:
            raise _Refused(f"cannot write --plot {args.plot}: {exc.strerror or exc}.") from None
    return 1 if report.sessions_failed or errors else 0


def _sustained(
    args: argparse.Namespace,
    trajectories: list[Trajectory],
    config: RuntimeConfig | None,
    errors: list[ReplayError],
) -> int:
    think_time = args.think_time or 2.0

    def on_run(report: LoadtestReport) -> None:
        print(
            f"{report.sessions:>6} sessions: prepare p99 {report.prepare_p99_ms:8.2f} ms  "
            f"failed {report.sessions_failed}  loop lag max {report.loop_lag_max_ms:.2f} ms",
            file=sys.stderr,
            flush=True,
        )

    result = _run(
        args,
        lambda: sustained_sessions(
            trajectories,
            start=args.sessions,
            turns=args.turns,
            think_time=think_time,
            gateway=args.gateway,
            config=config,
            on_run=on_run,
        ),
    )
    print(
        f"sustained: {result.sessions} sessions at prepare p99 < {result.p99_limit_ms:g} ms "
        f"with a {result.think_time:g} s think time (backend {args.backend}, "
        f"{len(result.runs)} runs)",
        file=_text_out(args),
    )
    if args.json is not None:
        _write_json("--json", args.json, result)
    return 1 if errors else 0


# -- entry point -------------------------------------------------------------------

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {
    "replay": _replay,
    "loadtest": _loadtest,
    "memory": run_memory,
}


def _broken_pipe(exc: BaseException) -> bool:
    """True when the reader of the output went away: a BrokenPipeError, also one
    raised in a task (the replay writes ``--out`` from a worker thread)."""
    if isinstance(exc, BrokenPipeError):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(BrokenPipeError)[1] is None
    return False


def _interrupted(exc: BaseException) -> bool:
    if isinstance(exc, KeyboardInterrupt):
        return True
    if isinstance(exc, BaseExceptionGroup):
        return exc.split(KeyboardInterrupt)[1] is None
    return False


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status.

    Usage errors exit through ``SystemExit(2)`` from argparse (``--help`` and
    ``--version`` through ``SystemExit(0)``); every other status is returned.
    """
    args = _parser().parse_args(argv)
    command = f"turnloom {args.command}"
    try:
        return _COMMANDS[args.command](args)
    except _Refused as refused:
        for line in refused.args:
            print(f"{command}: error: {line}", file=sys.stderr)
        return 2
    except BaseException as exc:
        if _broken_pipe(exc):
            # Python's documented recipe: no more output, and no second error
            # when the interpreter flushes stdout at exit.
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
            return 141
        if not _interrupted(exc):
            raise
        print(f"{command}: interrupted.", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
