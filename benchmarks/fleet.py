"""Fleet benchmark: guarded decisions per second with 1, 4 and 8 worker processes on one store.

    .venv/bin/python benchmarks/fleet.py             # a few minutes; starts its own servers
    .venv/bin/python benchmarks/fleet.py --quick     # under a minute, fewer decisions
    .venv/bin/python benchmarks/fleet.py --postgres postgresql://... --redis redis://...
    .venv/bin/python benchmarks/fleet.py --memory 100000   # what a bounded MemoryStore keeps

Each worker is its own process (spawned) with its own Guard on the shared store: SQLite (one WAL
file), PostgreSQL, Redis. The workload is the common one in a fleet: a window whose summary rests
on 24 sources comes back with a new turn, and the guard decides whether it may be compacted again
(recognition from the worker's cache, then one round trip to the store, `Store.view`: other
workers' records, the new turn, the liveness of the 24 sources; the default policy). All workers
start together (a barrier); throughput is the decisions of all workers over the wall
time from the barrier to the last worker's end. Per-decision median, mean and p99 are over every
decision of every worker; the ratio column is the store's median against SQLite's with one
worker, measured in the same run. PostgreSQL and Redis are started by tests/servers.py on
127.0.0.1 (as the test suite does) unless URLs are given; they run on the same machine as the
workers, so with more workers than cores the server competes with them for CPU.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SOURCES = 24
WINDOW = "bench-window"


def open_store(kind: str, where: str, name: str) -> Any:
    from policyhook import PostgresStore, RedisStore, SQLiteStore

    if kind == "postgres":
        return PostgresStore(where, schema=name, pool_size=1)
    if kind == "redis":
        return RedisStore(where, namespace=name)
    return SQLiteStore(where)


def texts() -> tuple[list[str], str]:
    sources = [
        f"tool(run {i}): exit 0 after {i * 7} ms; wrote /tmp/out-{i}.json" for i in range(SOURCES)
    ]
    return sources, "user: and now, what is the status of the deploy?"


def prepare(kind: str, where: str, name: str) -> str:
    """Record the sources and one granted summary of them; returns the summary's text."""
    from policyhook import Guard, request

    store = open_store(kind, where, name)
    guard = Guard(store=store)
    sources, turn = texts()
    for i, text in enumerate(sources):
        guard.record_source(text, kind="tool_output", source_id=f"run-{i}")
    guard.record_source(turn, kind="user_turn", source_id="turn")  # held: the decision grants

    def summarize(messages: list[str]) -> str:
        # Every number is in a source: the default policy's output check grants it
        last = len(messages) - 1
        return f"Summary: runs 0 to {last} exit 0; run {last} took {last * 7} ms."

    with request(window=WINDOW):
        summary = str(guard(summarize, summarizer="compact")(sources))
    store.close()
    return summary


def worker(spec: tuple[str, str, str], summary: str, count: int, barrier: Any, out: Any) -> None:
    """Warm up, wait for the others, then time `count` decisions; send the samples back."""
    from policyhook import Guard, request

    store = open_store(*spec)
    guard = Guard(store=store)
    _, turn = texts()
    value = [summary, turn]
    with request(window=WINDOW):
        for _ in range(max(20, count // 10)):
            decision = guard.check(value, summarizer="compact")
            assert (decision.effect, decision.depth) == ("allow", 1), decision
        barrier.wait()
        clock = time.perf_counter_ns
        samples = []
        for _ in range(count):
            start = clock()
            guard.check(value, summarizer="compact")
            samples.append(clock() - start)
        ended = time.perf_counter()
    store.close()
    out.put((samples, ended))


def run(spec: tuple[str, str, str], summary: str, workers: int, count: int) -> dict[str, float]:
    context = multiprocessing.get_context("spawn")
    barrier = context.Barrier(workers + 1)
    out = context.Queue()
    processes = [
        context.Process(target=worker, args=(spec, summary, count, barrier, out))
        for _ in range(workers)
    ]
    for p in processes:
        p.start()
    barrier.wait(timeout=120)
    started = time.perf_counter()
    results = [out.get(timeout=600) for _ in processes]
    for p in processes:
        p.join(30)
    samples = [s for r, _ in results for s in r]
    wall = max(e for _, e in results) - started
    ordered = sorted(samples)
    return {
        "workers": workers,
        "per_second": len(samples) / wall,
        "median_us": statistics.median(samples) / 1000,
        "mean_us": statistics.fmean(samples) / 1000,
        "p99_us": ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] / 1000,
    }


@contextmanager
def servers_for(args: argparse.Namespace) -> Iterator[dict[str, str]]:
    """The stores' locations: given URLs, or servers started for this run (and stopped)."""
    with ExitStack() as stack:
        folder = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="ph-fleet-")))
        where = {"sqlite": str(folder / "fleet.db")}
        if args.postgres and args.redis:
            where.update(postgres=args.postgres, redis=args.redis)
        else:
            sys.path.insert(0, str(ROOT / "tests"))
            import servers

            for kind, start in (("postgres", servers.postgres), ("redis", servers.redis)):
                given = getattr(args, kind)
                if given:
                    where[kind] = given
                    continue
                managed = start()
                stack.callback(servers.remove, managed)
                where[kind] = managed.url
        yield where


def memory(calls: int) -> int:
    """A long agent loop on a bounded MemoryStore: what the store keeps, and what grows.

    Each call records a new tool output; every fourth call summarizes the window (the rolling
    summary and the new outputs), restarting from the newest output when a source of the rolling
    summary was evicted (a refusal). The store holds 1,000 sources (`max_sources`).
    """
    import gc
    import tracemalloc

    from policyhook import Guard, MemoryStore, UnsafeRecompactionError, request

    tracemalloc.start()
    base = tracemalloc.get_traced_memory()[0]
    store = MemoryStore(max_sources=1000)
    guard = Guard(store=store)
    summarize = guard(lambda m: f"Summary {len(m)}: " + " ".join(x[:30] for x in m), summarizer="s")
    window: list[str] = []
    made = 0
    names = ("_held", "_dead", "_texts", "_entries", "_order", "_log")
    print("| calls | summaries | traced MB (all) | " + " | ".join(names) + " |")
    print("|---:|---:|---:|" + "---:|" * len(names))
    for i in range(1, calls + 1):
        text = f"tool output {i}: exit 0 after {i} ms on host h{i % 13}"
        guard.record_source(text, "tool_output")
        window.append(text)
        if len(window) >= 5:
            with request(window="loop"):
                try:
                    window = [summarize(window)]
                    made += 1
                except UnsafeRecompactionError:
                    window = window[-1:]
        if i % (calls // 5) == 0:
            traced = (tracemalloc.get_traced_memory()[0] - base) / 1e6
            sizes = " | ".join(f"{len(getattr(store, n)):,}" for n in names)
            print(f"| {i:,} | {made:,} | {traced:.1f} | {sizes} |", flush=True)
    total = tracemalloc.get_traced_memory()[0] - base
    del guard, summarize
    gc.collect()
    kept = tracemalloc.get_traced_memory()[0] - base
    print(
        f"\nAll traced: {total / 1e6:.1f} MB; the store alone (guard dropped): "
        f"{kept / 1e6:.1f} MB for {made:,} summaries (and its held texts and tombstones)"
    )
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="fewer decisions per worker")
    parser.add_argument(
        "--postgres", metavar="URL", help="use this PostgreSQL (default: start one)"
    )
    parser.add_argument("--redis", metavar="URL", help="use this Redis (default: start one)")
    parser.add_argument("--workers", default="1,4,8", help="worker counts (default 1,4,8)")
    parser.add_argument(
        "--memory",
        metavar="CALLS",
        type=int,
        help="instead: a CALLS-long agent loop on a bounded MemoryStore, what it keeps",
    )
    args = parser.parse_args()
    if args.memory:
        return memory(args.memory)
    count = 200 if args.quick else 1000
    sizes = [int(n) for n in args.workers.split(",")]
    rows: list[tuple[str, dict[str, float]]] = []
    with servers_for(args) as where:
        for kind in ("sqlite", "postgres", "redis"):
            for n in sizes:
                name = f"bench_{os.getpid()}_{kind}_{n}"
                location = where[kind] if kind != "sqlite" else f"{where['sqlite']}.{n}"
                spec = (kind, location, name)
                summary = prepare(*spec)
                rows.append((kind, run(spec, summary, n, count)))
                print(f"  {kind} x{n}: {rows[-1][1]['per_second']:,.0f}/s", file=sys.stderr)
    base = next(r["median_us"] for k, r in rows if k == "sqlite" and r["workers"] == sizes[0])
    print(
        f"Fleet: {count} decisions per worker, region of {SOURCES} sources, default policy; "
        f"{os.cpu_count()} CPUs, Python {platform.python_version()}\n"
    )
    print(
        "| store | workers | decisions/s (all workers) | median µs | mean µs | p99 µs "
        "| median vs SQLite x1 |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for kind, r in rows:
        print(
            f"| {kind} | {r['workers']:.0f} | {r['per_second']:,.0f} | {r['median_us']:,.0f} | "
            f"{r['mean_us']:,.0f} | {r['p99_us']:,.0f} | {r['median_us'] / base:.2f}x |"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
