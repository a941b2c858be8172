"""Instructions per call, counted by valgrind's callgrind: the guard beside the fair raw engine.

Timed ratios (`benchmarks/run.py`) on a shared machine move by up to 30% between runs of the
same code, and the targets' ratio moves with them. An instruction count does not: the same
code, inputs and Python give the same count whatever else the machine is doing. It is not a
time, though: the guard's Python runs fewer instructions per nanosecond than the compiled
engine (an interpreter: its dispatch, branches and allocations), so the timed rows stay the
targets' measure; these say which way a change moved the code, and by how much.

Each shape runs in a child process under callgrind, which counts only inside the calls
measured (each made through `operator.call`, whose C function toggles the count: a call's
preparation, untimed in benchmarks/run.py, is not counted here either), after a warm-up. The
count over the calls, divided by their number, is one call's. Children run side by side, one per
CPU.

    .venv/bin/python benchmarks/instructions.py            # about 3 minutes on 2 CPUs
    .venv/bin/python benchmarks/instructions.py --quick    # the yardstick and the guard only
"""

from __future__ import annotations

import argparse
import itertools
import json
import operator
import os
import platform
import random
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from contextlib import nullcontext
from functools import partial
from importlib.metadata import version
from pathlib import Path

import run
from run import render

from policyhook._backends import default_backend
from policyhook.stores import MemoryStore

#: name -> what is counted, as the row says it.
SHAPES = {
    "fair": "fair raw engine: new activation + conversion + the 4 expressions",
    "guard": "guard, telemetry stubbed: the output merges into a known summary",
    "guard-new": "guard, telemetry stubbed, a new output every call",
    "guard-new-real": "guard, telemetry stubbed, a new output every call, real text",
    "guard-evaluated": "guard, telemetry stubbed, evaluated every call (no allow kept)",
    "decide-evaluated": "`PolicySet.decide`, evaluated (no allow kept)",
    "loop-window": "agent loop, 1 window: [a known summary, a new turn], a new output (the call)",
    "loop-rolling": "rolling agent loop, MemoryStore: [last summary, new turn] (the call)",
}
QUICK = ("fair", "guard")
_COLLECTED = re.compile(r"Collected : (\d+)")
#: The C function every counted call is made through: callgrind counts only inside it.
_TOGGLE = "_operator_call*"

Step = Callable[[int], Callable[[], object]]


def shape(name: str, calls: int) -> Step:
    """`step(i)`: call i of `name` (set up as benchmarks/run.py measures it), made ready."""
    backend = default_backend()
    if name == "fair":
        fair = run.fair_raw(run.input_policies(backend))
        return lambda i: fair
    if name.startswith("guard"):
        outputs = None
        if name == "guard-new-real":
            outputs = run.real_outputs(run.GUARDED_SUMMARY_CHARS)
            if len(outputs) < calls:
                raise ValueError(f"{name}: only {len(outputs):,} new outputs, for {calls:,} calls")
        call, _, _ = run._guarded_setup(
            backend,
            "none",
            new_outputs=name.startswith("guard-new"),
            keep=name != "guard-evaluated",
            outputs=None if outputs is None else iter(outputs),
        )
        return lambda i: call
    if name == "decide-evaluated":
        policies = run.input_policies(backend)
        activation = run.make_activation(depth=2, sources=3, dead=0)
        decide = partial(run._decide_next, policies, itertools.repeat(activation), evaluate=True)
        return lambda i: decide
    if name == "loop-window":
        return run._windows_loop(backend, random.Random(13), calls, 1)[1]
    if name == "loop-rolling":
        guard = run._loop_guard(MemoryStore(), backend)
        return run._rolling_steps(guard, random.Random(13), calls)
    raise ValueError(f"unknown shape {name!r}: one of {', '.join(SHAPES)}")


def _child(name: str, calls: int, warmup: int) -> None:
    """Make `warmup` calls of `name`, then `calls` through `operator.call` (what is counted)."""
    step = shape(name, warmup + calls)
    # The rolling loop's calls run in its window, as `run._rolling` runs them; the others as
    # run.py does (the windows loop's calls each set their own).
    window = run.request_window("w") if name == "loop-rolling" else nullcontext()
    with run.quiet_logs(), window:
        for i in range(warmup):
            step(i)()
        for i in range(warmup, warmup + calls):
            operator.call(step(i))


def count(name: str, calls: int, warmup: int) -> float:
    """Instructions per call of `name`: callgrind's count inside `calls` calls after warm-up."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        f"--toggle-collect={_TOGGLE}",  # (which starts with collection off)
        sys.executable, __file__, "--child", name, str(calls), str(warmup),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict and set layouts every run
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    found = _COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"callgrind run of {name!r} failed:\n{done.stderr[-2000:]}")
    return int(found[-1]) / calls


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the fair engine and the guard only")
    parser.add_argument("--calls", type=int, help="calls counted per shape (1,000; quick: 100)")
    parser.add_argument("--warmup", type=int, help="calls made before those (1,000; quick: 200)")
    parser.add_argument("--json", metavar="PATH", help="also write the counts as JSON")
    parser.add_argument(
        "--child", nargs=3, metavar=("SHAPE", "CALLS", "WARMUP"), help=argparse.SUPPRESS
    )
    args = parser.parse_args()
    if args.child:
        name, calls, warmup = args.child
        _child(name, int(calls), int(warmup))
        return
    if shutil.which("valgrind") is None:
        sys.exit("instructions.py: valgrind is not installed (Debian: apt-get install valgrind)")
    names = QUICK if args.quick else tuple(SHAPES)
    calls = args.calls or (100 if args.quick else 1000)
    warmup = args.warmup if args.warmup is not None else 200 if args.quick else 1000
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        futures = {name: pool.submit(count, name, calls, warmup) for name in names}
        counts = {name: future.result() for name, future in futures.items()}
    fair, backend = counts["fair"], default_backend().name  # (what every shape decides with)
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    table = render(
        "Instructions per call (callgrind)",
        ["what", "instructions per call", "vs fair raw engine"],
        [[SHAPES[name], f"{counts[name]:,.0f}", f"{counts[name] / fair:.2f}x"] for name in names],
        f"Counted by {valgrind.strip()} ({platform.python_implementation()} "
        f"{platform.python_version()}, {backend} {version(backend)}, "
        f"{platform.machine()}): each shape in a child process, {calls:,} calls counted after "
        f"{warmup:,} (each call alone, as benchmarks/run.py times it: a loop's turn, recorded "
        "before its call, is not counted). The same shapes as benchmarks/run.py's guard table "
        "and agent loop. Instructions, not time: the guard's Python "
        "runs fewer instructions per ns than the compiled engine (an interpreter: its dispatch, "
        "branches and allocations), so its timed ratio is the larger.",
    )
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"instructions_per_call": counts}, indent=2))


if __name__ == "__main__":
    main()
