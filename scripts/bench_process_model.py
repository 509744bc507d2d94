"""What a Foundation costs per process and per thread: the voice hosts' process model.

LiveKit Agents runs each job (one call) in its own process by default (its
process executor), or each in a thread of a worker process (its thread
executor); Pipecat hosts usually run many pipelines in one process. This
measures, each in a fresh child process so nothing is shared or cached:

* ``python``: a bare interpreter (start time, resident memory), the floor;
* ``import``: ``import turnloom.runtime`` (what a job process pays before
  its first call);
* ``1 job``: a process that opens one Foundation with a SQLite store and runs
  one call of 20 turns (the process executor: one Foundation per job process);
* ``N jobs, threads``: one process running N calls, each in its own thread
  with its own event loop and its own Foundation, all on one SQLite file
  (the thread executor: one Foundation per job thread; a Foundation serves
  one event loop);
* ``N jobs, one loop``: one process, one Foundation, N calls as tasks on its
  loop (a Pipecat or daemon host: one Foundation per worker process).

Printed per variant: wall time from spawning the child to its first
Foundation open (``start``; for the first two rows, to the end of the
interpreter start or of the import), the Foundation's own open time measured inside
the child (``open``), and the child's resident memory (VmRSS) at the end,
total and per job; then ratios measured in this run: a job process against
the bare interpreter, and a job's marginal memory in each shape.

Usage: python scripts/bench_process_model.py [--jobs N] [--rounds R]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time, threading
mode, jobs, folder = sys.argv[1], int(sys.argv[2]), sys.argv[3]

def rss_kib():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0

if mode == "python":
    print(json.dumps({"at": time.time(), "open": 0.0, "rss": rss_kib()}))
    sys.exit()

import anyio
from turnloom.runtime import ContextPrepareRequest, Foundation, TurnSnapshot
from turnloom.context import Message, Role
from turnloom.stores import open_context_store

if mode == "import":
    print(json.dumps({"at": time.time(), "open": 0.0, "rss": rss_kib()}))
    sys.exit()

SYSTEM = Message(role=Role.system, content="You are an airline agent. Be brief.")
opened = []

async def one_call(manager, cid):
    await manager.leases.claim(cid)
    for n in range(20):
        manager.accept_turn(TurnSnapshot(
            context_id=cid, turn_id=f"t{n}", instructions=(SYSTEM,) if n == 0 else None,
            input=(Message(role=Role.user, content=f"Question {n} about my booking."),)))
        prefix = await manager.prepare(ContextPrepareRequest(context_id=cid, turn_id=f"t{n}"))
        async with manager.invocation(cid, f"t{n}") as call:
            call.record([Message(role=Role.assistant, content=f"Answer {n}: it is confirmed.")])
        manager.build(prefix, recorded=True)
    await manager.leases.flush()

async def foundation(cids):
    url = f"sqlite:{folder}/contexts.db"
    async with open_context_store(url) as store:
        began = time.perf_counter()
        async with Foundation(store=store) as opened_foundation:
            opened.append((time.time(), time.perf_counter() - began))
            async with anyio.create_task_group() as group:
                for cid in cids:
                    group.start_soon(one_call, opened_foundation.manager, cid)

pid = str(__import__("os").getpid())
if mode == "process":
    anyio.run(foundation, [f"job-{pid}"])
elif mode == "threads":
    threads = [threading.Thread(target=anyio.run, args=(foundation, [f"job-{pid}-{n}"]))
               for n in range(jobs)]
    for thread in threads: thread.start()
    for thread in threads: thread.join()
elif mode == "loop":
    anyio.run(foundation, [f"job-{pid}-{n}" for n in range(jobs)])
first = min(opened)
print(json.dumps({"at": first[0], "open": first[1], "rss": rss_kib(),
                  "foundations": len(opened)}))
"""


def run_child(mode: str, jobs: int, folder: str) -> dict[str, float]:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    spawned = time.time()
    done = subprocess.run(
        [sys.executable, "-c", CHILD, mode, str(jobs), folder],
        capture_output=True,
        text=True,
        env=env,
        check=True,
        timeout=300,
    )
    result: dict[str, float] = json.loads(done.stdout.strip().splitlines()[-1])
    # From the spawn to the first Foundation open (interpreter start and imports included).
    result["start"] = result.pop("at") - spawned
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--jobs", type=int, default=16, help="jobs per worker process")
    parser.add_argument("--rounds", type=int, default=5, help="children per variant (medians)")
    args = parser.parse_args()
    if not Path("/proc/self/status").exists():
        sys.exit("needs Linux's /proc/self/status for resident memory")
    variants = [
        ("python", "python", 1),
        ("import", "import turnloom.runtime", 1),
        ("process", "1 job (process executor)", 1),
        ("threads", f"{args.jobs} jobs, threads", args.jobs),
        ("loop", f"{args.jobs} jobs, one loop", args.jobs),
    ]
    results: dict[str, dict[str, float]] = {}
    with tempfile.TemporaryDirectory() as folder:
        for mode, _, jobs in variants:
            runs = [run_child(mode, jobs, folder) for _ in range(args.rounds)]
            results[mode] = {
                key: statistics.median(r[key] for r in runs) for key in ("start", "open", "rss")
            }
    print(f"medians of {args.rounds} fresh processes each; RSS = VmRSS at the end")
    print(f"{'variant':<28}{'start ms':>10}{'open ms':>10}{'RSS MiB':>10}{'MiB/job':>10}")
    for mode, label, jobs in variants:
        r = results[mode]
        per_job = r["rss"] / 1024 / jobs
        print(
            f"{label:<28}{r['start'] * 1e3:>10.1f}{r['open'] * 1e3:>10.2f}"
            f"{r['rss'] / 1024:>10.1f}{per_job:>10.2f}"
        )
    base, job = results["python"]["rss"], results["process"]["rss"]
    imported = results["import"]["rss"]
    threads = (results["threads"]["rss"] - imported) / 1024 / args.jobs
    loop = (results["loop"]["rss"] - imported) / 1024 / args.jobs
    print()
    print(f"job process / bare interpreter, memory: {job / base:.2f}x")
    print(
        f"job process / bare interpreter, start:  "
        f"{results['process']['start'] / results['python']['start']:.1f}x"
    )
    print(f"marginal memory per job: process {(job - base) / 1024:.1f} MiB, ", end="")
    print(f"thread {threads:.2f} MiB, task on one loop {loop:.2f} MiB")
    print(f"process / thread per job: {(job - base) / 1024 / threads:.1f}x; ", end="")
    print(f"process / task: {(job - base) / 1024 / loop:.1f}x")


if __name__ == "__main__":
    started = time.perf_counter()
    main()
    print(f"(took {time.perf_counter() - started:.1f} s)")
