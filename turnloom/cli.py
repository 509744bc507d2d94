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

from turnloom.context.gateway import GatewayType, get_gateway
from turnloom.errors import InputError
from turnloom.runtime.replay import (
    ReplayError,
    ReplaySummary,
    Trajectory,
    builtin_trajectories,
    load_trajectories,
    replay,
)


def _positive(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not an integer") from None
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
    rp.add_argument("--concurrency", type=_positive, default=4, help="sessions replayed at once (4)")
    rp.add_argument(
        "--sessions", type=_positive, default=24, help="sessions of the built-in workload (24)"
    )
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


def _replay(args: argparse.Namespace) -> int:
    try:
        get_gateway(args.gateway)
    except InputError as exc:
        print(f"turnloom replay: error: {exc}", file=sys.stderr)
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


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line with ``argv`` (default ``sys.argv[1:]``); return the exit status."""
    args = _parser().parse_args(argv)
    if args.command == "replay":
        return _replay(args)
    raise AssertionError(f"unhandled command {args.command!r}")


if __name__ == "__main__":
    sys.exit(main())
