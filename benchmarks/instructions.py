"""Instructions per call, counted by valgrind's callgrind: the guard beside the fair raw engine.

Timed ratios (`benchmarks/run.py`) on a shared machine move by up to 30% between runs of the
same code, and the targets' ratio moves with them. An instruction count does not: the same
code, inputs and Python give the same count whatever else the machine is doing. It is not a
time, though: the guard's Python runs fewer instructions per nanosecond than the compiled
engine (an interpreter's branches and dispatch, and the memory a growing ledger touches), so the
timed rows stay the targets' measure; these say which way a change moved the code, and by how
much.

Each shape runs in a child process under callgrind twice, with the same warm-up and then
`calls` and `6 * calls` calls: the difference over `5 * calls` is one call's, start-up, imports
and warm-up cancelling out. Children run side by side, one per CPU.

    .venv/bin/python benchmarks/instructions.py            # about 4 minutes on 2 CPUs
    .venv/bin/python benchmarks/instructions.py --quick    # the yardstick and the guard only
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from importlib.metadata import version
from pathlib import Path

import run
from run import render

from policyhook._backends import default_backend

#: name -> what is counted, as the row says it.
SHAPES = {
    "fair": "fair raw engine: new activation + conversion + the 4 expressions (cel-expr-python)",
    "guard": "guard, telemetry stubbed: the output merges into a known summary",
    "guard-new": "guard, telemetry stubbed, a new output every call",
    "guard-evaluated": "guard, telemetry stubbed, evaluated every call (no allow kept)",
    "decide-evaluated": "`PolicySet.decide`, evaluated (no allow kept)",
}
QUICK = ("fair", "guard")
_COLLECTED = re.compile(r"Collected : (\d+)")


def shape(name: str) -> Callable[[], object]:
    """The zero-argument call counted for `name`, set up as benchmarks/run.py times it."""
    backend = default_backend()
    if name == "fair":
        return run.fair_raw(run.input_policies(backend))
    if name.startswith("guard"):
        call, _, _ = run._guarded_setup(
            backend, "none", new_outputs=name == "guard-new", keep=name != "guard-evaluated"
        )
        return call
    if name == "decide-evaluated":
        policies = run.input_policies(backend)
        activation = run.make_activation(depth=2, sources=3, dead=0)
        return lambda: run._decide_next(policies, iter((activation,)), evaluate=True)
    raise ValueError(f"unknown shape {name!r}: one of {', '.join(SHAPES)}")


def _child(name: str, calls: int, warmup: int) -> None:
    """Run `name`'s call `warmup + calls` times (what callgrind counts, in a child)."""
    call = shape(name)
    with run.quiet_logs():
        for _ in range(warmup + calls):
            call()


def count(name: str, calls: int, warmup: int) -> int:
    """Instructions callgrind collects over a child running `name` `calls` times after warm-up."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, __file__, "--child", name, str(calls), str(warmup),
    ]  # fmt: skip
    env = {**os.environ, "PYTHONHASHSEED": "0"}  # the same dict and set layouts every run
    done = subprocess.run(command, capture_output=True, text=True, env=env, timeout=1800)
    found = _COLLECTED.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise RuntimeError(f"callgrind run of {name!r} failed:\n{done.stderr[-2000:]}")
    return int(found[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="the fair engine and the guard only")
    parser.add_argument("--calls", type=int, default=200, help="calls of the shorter run")
    parser.add_argument("--warmup", type=int, default=1000, help="calls before either is counted")
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
    calls, warmup = (40, 200) if args.quick else (args.calls, args.warmup)
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        runs = {(n, k): pool.submit(count, n, k * calls, warmup) for n in names for k in (1, 6)}
        counts = {n: (runs[n, 6].result() - runs[n, 1].result()) / (5 * calls) for n in names}
    fair = counts["fair"]
    valgrind = subprocess.run(["valgrind", "--version"], capture_output=True, text=True).stdout
    table = render(
        "Instructions per call (callgrind)",
        ["what", "instructions per call", "vs fair raw engine"],
        [[SHAPES[name], f"{counts[name]:,.0f}", f"{counts[name] / fair:.2f}x"] for name in names],
        f"Counted by {valgrind.strip()} ({platform.python_implementation()} "
        f"{platform.python_version()}, cel-expr-python {version('cel-expr-python')}, "
        f"{platform.machine()}): each shape in a child process after {warmup:,} calls, the "
        f"difference between {calls:,} and {6 * calls:,} calls over {5 * calls:,}. The same "
        "shapes as benchmarks/run.py's guard table. Instructions, not time: the guard's Python "
        "runs fewer instructions per ns than the compiled engine (an interpreter's branches "
        "and dispatch; the memory a growing ledger touches), so its timed ratio is the larger.",
    )
    print(table)
    if args.json:
        Path(args.json).write_text(json.dumps({"instructions_per_call": counts}, indent=2))


if __name__ == "__main__":
    main()
