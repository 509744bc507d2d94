"""The ``turnloom`` command line: ``replay`` and ``loadtest``.

Exit status: 0 when everything succeeded, 1 when a session failed (the others
still ran and are reported), 2 for a usage error (bad option, a gateway not
available in this build).
"""

from __future__ import annotations

__all__ = ("main",)

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO

import anyio
import msgspec
from tqdm import tqdm  # type: ignore[import-untyped]

from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.errors import InputError, excerpt
from turnloom.runtime.foundation import Foundation
from turnloom.runtime.metrics import MetricsServer, serve_metrics
from turnloom.tools.loadtest import LoadtestReport, count_model_calls, loadtest
from turnloom.tools.replay import ReplaySummary, replay
from turnloom.tools.trajectories import (
    ReplayError,
    Trajectory,
    builtin_trajectories,
    load_trajectories,
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{excerpt(text)} is not an integer") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value} is not a positive integer")
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="turnloom",
        description="Cooperative context runtime for LLM agents: replay transcripts, load-test.",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    gateways = [g.value for g in GatewayType]

    rp = commands.add_parser(
        "replay",
        help="replay agent transcripts through the ContextManager",
        description="Replay OpenAI-chat transcripts (tau-bench list or JSONL) through one "
        "Foundation; with no PATH, a built-in generated workload.",
    )
    rp.add_argument("paths", nargs="*", metavar="PATH", help="tau-bench list or JSONL files")
    rp.add_argument("--gateway", choices=gateways, default=GatewayType.openai_chat.value)
    rp.add_argument("--out", type=Path, metavar="FILE.jsonl", help="write every prepared input")
    rp.add_argument(
        "--concurrency", type=_positive, default=4, help="sessions replayed at once (4)"
    )
    rp.add_argument(
        "--sessions", type=_positive, default=24, help="sessions of the built-in workload (24)"
    )
    lt = commands.add_parser(
        "loadtest",
        help="run many concurrent sessions through one Foundation",
        description="Run N concurrent sessions in one Foundation and report throughput, "
        "prepare latency, event-loop lag, peak RSS, rejections and evictions.",
    )
    lt.add_argument("--sessions", type=_positive, default=100, help="concurrent sessions (100)")
    lt.add_argument("--turns", type=_positive, default=40, help="turns per session, at most (40)")
    lt.add_argument(
        "--source",
        default="builtin",
        metavar="builtin|PATH",
        help="the built-in workload, or a tau-bench/JSONL file (builtin)",
    )
    lt.add_argument("--gateway", choices=gateways, default=GatewayType.openai_chat.value)
    lt.add_argument(
        "--metrics-port",
        type=int,
        metavar="P",
        help="serve Prometheus /metrics on 127.0.0.1:P while running (0: any free port)",
    )
    lt.add_argument("--json", type=Path, metavar="FILE", help="write the report as JSON")
    lt.add_argument("--no-progress", action="store_true", help="no progress bar")
    return parser


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
        f"normalized: {summary.normalized}  errors: {len(summary.errors)}  "
        f"wall: {summary.seconds:.2f} s",
        file=out,
    )


def _gateway_available(command: str, gateway: str) -> bool:
    """Whether ``gateway`` is in this build; prints the one-line usage error if not."""
    try:
        get_gateway(gateway)
    except InputError as exc:
        print(f"turnloom {command}: error: {exc}", file=sys.stderr)
        return False
    return True


def _replay(args: argparse.Namespace) -> int:
    if not _gateway_available("replay", args.gateway):
        return 2
    trajectories: list[Trajectory] = []
    load_errors: list[ReplayError] = []
    if args.paths:
        for path in args.paths:
            loaded, errors = load_trajectories(path)
            trajectories.extend(loaded)
            load_errors.extend(errors)
    else:
        trajectories = builtin_trajectories(args.sessions)
    out = None
    if args.out is not None:
        try:
            out = args.out.open("wb")
        except OSError as exc:
            print(
                f"turnloom replay: error: cannot write {args.out}: {exc.strerror}.", file=sys.stderr
            )
            return 2
    try:
        summary = anyio.run(
            lambda: replay(
                trajectories,
                gateway=args.gateway,
                concurrency=args.concurrency,
                out=out,
                load_errors=load_errors,
            )
        )
    finally:
        if out is not None:
            out.close()
    for error in summary.errors:
        print(f"turnloom replay: error: {error}", file=sys.stderr)
    _print_summary(summary, sys.stdout)
    return 1 if summary.errors else 0


def _print_report(report: LoadtestReport, out: TextIO) -> None:
    print(
        f"sessions: {report.sessions}  failed: {report.sessions_failed}  turns: {report.turns}  "
        f"model calls: {report.model_calls}  prepares: {report.prepares}",
        file=out,
    )
    print(
        f"throughput: {report.prepares_per_second:.0f} prepares/s  wall: {report.seconds:.2f} s",
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
        f"peak RSS: {report.peak_rss_bytes / 2**20:.1f} MiB  rejections: {report.rejections}  "
        f"evictions: {report.evicted_turns} turns",
        file=out,
    )


def _loadtest(args: argparse.Namespace) -> int:
    if not _gateway_available("loadtest", args.gateway):
        return 2
    if args.source == "builtin":
        trajectories = builtin_trajectories(min(args.sessions, 64), turns=(args.turns, args.turns))
    else:
        trajectories, load_errors = load_trajectories(args.source)
        problems = [str(e) for e in load_errors]
        if not trajectories:
            problems.append(f"{args.source}: the file holds no trajectories.")
        if problems:
            for problem in problems:
                print(f"turnloom loadtest: error: {problem}", file=sys.stderr)
            return 2
    total = count_model_calls(trajectories, sessions=args.sessions, turns=args.turns)
    bar = tqdm(
        total=total,
        unit="call",
        desc="loadtest",
        disable=args.no_progress or not sys.stderr.isatty(),
        file=sys.stderr,
    )
    servers: list[MetricsServer] = []

    def on_open(foundation: Foundation) -> None:
        if args.metrics_port is not None:
            server = serve_metrics(foundation.manager.statistics, port=args.metrics_port)
            servers.append(server)
            print(f"serving metrics at {server.url}", file=sys.stderr)

    try:
        report = anyio.run(
            lambda: loadtest(
                trajectories,
                sessions=args.sessions,
                turns=args.turns,
                gateway=args.gateway,
                on_model_call=lambda: bar.update(),
                on_open=on_open,
            )
        )
    except (InputError, OSError) as exc:
        print(f"turnloom loadtest: error: {exc}", file=sys.stderr)
        return 2
    finally:
        bar.close()
        for server in servers:
            server.close()
    _print_report(report, sys.stdout)
    for message in report.errors:
        print(f"turnloom loadtest: error: {message}", file=sys.stderr)
    if args.json is not None:
        args.json.write_bytes(msgspec.json.format(msgspec.json.encode(report)) + b"\n")
    return 1 if report.sessions_failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "replay":
        return _replay(args)
    if args.command == "loadtest":
        return _loadtest(args)
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
