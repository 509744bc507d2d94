"""Counting the tokens of a 10,000-item history: approximate vs exact, and a sliced view.

The history is real GPT-4o traffic: the tau-bench airline trajectories
(``../shared/data/tau-bench/airline-150.json``) parsed by the OpenAI Chat
gateway and repeated until it holds ``--items`` messages. For each counter it
prints the token total, the median wall time of ``count()`` over ``--repeat``
runs, and the time per message; then the ratio of each exact counter to the
approximate one (time and tokens), the cost of ``WorkingContext.slice(
LastNTurns(4)).tokens()`` on the same history, and the serialized-bytes/4
figure for comparison. Numbers are measured in one run; nothing is asserted.

Usage: python scripts/bench_tokens.py [--items N] [--repeat R] [--data PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from turnloom.context import (
    ApproxTokenCounter,
    LastNTurns,
    Message,
    OpenAITokenCounter,
    WorkingContext,
    get_gateway,
    message_size,
)

_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "tau-bench"


def _history(path: Path, items: int) -> list[Message]:
    chat = get_gateway("openai_chat")
    trajectories = json.loads(path.read_text(encoding="utf-8"))
    source = [chat.parse(m) for t in trajectories for m in t["traj"]]
    return [source[i % len(source)] for i in range(items)]


def _median_seconds(fn: Callable[[], object], repeat: int) -> float:
    times = []
    for _ in range(repeat):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--items", type=int, default=10_000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--data", type=Path, default=_DATA / "airline-150.json")
    args = parser.parse_args()

    history = _history(args.data, args.items)
    print(f"history: {len(history)} messages from {args.data.name}")
    counters = {
        "approx": ApproxTokenCounter(),
        "o200k_base": OpenAITokenCounter("o200k_base"),
        "cl100k_base": OpenAITokenCounter("cl100k_base"),
    }
    results: dict[str, tuple[int, float]] = {}
    for name, counter in counters.items():
        tokens = counter.count(history)
        seconds = _median_seconds(lambda c=counter: c.count(history), args.repeat)
        results[name] = (tokens, seconds)
        print(
            f"{name:12} tokens {tokens:>10,}  count() {seconds * 1e3:8.1f} ms"
            f"  {seconds / len(history) * 1e6:6.2f} us/message"
        )
    approx_tokens, approx_seconds = results["approx"]
    for name in ("o200k_base", "cl100k_base"):
        tokens, seconds = results[name]
        print(
            f"{name} / approx: time x{seconds / approx_seconds:.1f}, "
            f"tokens {tokens / approx_tokens:.3f} (approx is off by "
            f"{(approx_tokens - tokens) / tokens * 100:+.1f} %)"
        )
    size_bytes = sum(message_size(m) for m in history)
    print(f"serialized bytes/4 for comparison: {size_bytes // 4:,} tokens")

    ctx = WorkingContext(messages=history)
    sliced = ctx.slice(LastNTurns(4))
    seconds = _median_seconds(lambda: ctx.slice(LastNTurns(4)).tokens(), args.repeat)
    print(
        f"slice(LastNTurns(4)).tokens(): {len(sliced.messages)} messages, "
        f"{sliced.tokens():,} tokens, {seconds * 1e3:.2f} ms "
        f"(x{seconds / approx_seconds:.3f} of counting the whole history)"
    )


if __name__ == "__main__":
    main()
