"""The benchmark scripts run: each one's quick mode, from the checkout, prints all its tables.

Nothing is timed here (benchmarks/README.md has the figures, from full runs). What this catches
is a script that no longer runs: fleet.py crashed once the default policy checked outputs (its
summary stated a number no source stated), and no test ran it.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import servers

BENCHMARKS = Path(__file__).resolve().parent.parent / "benchmarks"


def _run(script: str, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / script), *args],
        capture_output=True,
        text=True,
        timeout=600,  # (a quick run takes under 2 minutes here)
        cwd=BENCHMARKS.parent,
    )
    assert done.returncode == 0, f"{script} {' '.join(args)}:\n{done.stderr[-3000:]}"
    return done.stdout


def test_run_prints_every_section() -> None:
    """`benchmarks/run.py --quick`: every section's heading and a table under each."""
    out = _run("run.py", "--quick")
    sections = [line for line in out.splitlines() if line.startswith("### ")]
    for heading in (
        "### Policy engine",
        "### Guard: full overhead",
        "### Agent loop",
        "### Liveness of 1,000 ids on a large SQLite store",
        "### Provenance: recording a new turn every call",
        "### `policyhook replay` throughput",
    ):
        assert any(s.startswith(heading) for s in sections), heading
    for block in out.split("\n### ")[1:]:
        assert "\n|---" in block, block.splitlines()[0]


def test_grounding_prints_every_section() -> None:
    """`benchmarks/grounding.py --quick`: speed, accuracy, real summaries and memory."""
    out = _run("grounding.py", "--quick")
    for heading in ("## Speed", "## Accuracy", "## Real compaction summaries", "## Memory"):
        assert heading in out, heading


def test_fleet_decides_on_every_store(
    postgres: servers.Restartable, redis: servers.Restartable
) -> None:
    """`benchmarks/fleet.py --quick` on this suite's servers: a row per store, the default
    policy granting every decision (the script asserts it)."""
    out = _run(
        "fleet.py", "--quick", "--workers", "1", "--postgres", postgres.url, "--redis", redis.url
    )
    for store in ("sqlite", "postgres", "redis"):
        assert f"| {store} | 1 |" in out, store


def _counted(*args: str) -> dict[str, tuple[int, float]]:
    """`benchmarks/instructions.py` run with `args`: row -> (instructions per call, ratio)."""
    out = _run("instructions.py", *args)
    return {
        cells[0]: (int(cells[1].replace(",", "")), float(cells[2].rstrip("x")))
        for line in out.splitlines()
        if line.startswith("| ") and not line.startswith("| what")
        for cells in [[c.strip() for c in line.strip("|").split("|")]]
    }


def test_instructions_counts_the_guard_beside_the_engine() -> None:
    """`benchmarks/instructions.py --quick` under valgrind: a count per call for the fair raw
    engine and the guard, the guard's ratio to it, and a count that is one call's: the same
    with half as many calls counted after the same warm-up."""
    servers.executable("valgrind", "valgrind", "apt-get install valgrind (.ci/test does)")
    rows = _counted("--quick")
    fair = next(v for k, v in rows.items() if k.startswith("fair raw engine"))
    guard = next(v for k, v in rows.items() if k.startswith("guard"))
    assert fair[1] == 1.0
    # Tens of thousands of instructions a call, not millions (start-up and imports alone are
    # billions), nor near nothing (the calls missed).
    assert 10_000 < fair[0] < 5_000_000 and 10_000 < guard[0] < 5_000_000, rows
    assert abs(guard[1] - guard[0] / fair[0]) < 0.01, rows
    # Counting the warm-up or anything outside the calls would change with their number.
    half = _counted("--quick", "--calls", "50")
    fair_half = next(v for k, v in half.items() if k.startswith("fair raw engine"))
    assert abs(fair_half[0] - fair[0]) < 0.01 * fair[0], (rows, half)


MACHINE = {"cpus": "2", "cpu": "AMD EPYC", "python": "3.11.7", "cel-python": "0.5.0"}
MACHINE |= {"cel-expr-python": "0.1.3", "ahocorasick-rs": "1.0.3", "opentelemetry-sdk": "1.45.2"}


def _written(
    tmp_path: Path, name: str, rows: list[list[str]], title: str = "Guard", cpus: str = "2"
) -> Path:
    """A run.py --json file holding one table with `rows`, made on a machine of `cpus`."""
    header = ["what", "median µs", "p99 µs", "vs fair raw"]
    table = {"title": title, "header": header, "rows": rows, "note": "Input: 1 KB."}
    path = tmp_path / name
    path.write_text(json.dumps({"machine": MACHINE | {"cpus": cpus}, "tables": [table]}))
    return path


def test_rounds_takes_each_cell_from_the_median_run(tmp_path: Path) -> None:
    """`benchmarks/rounds.py --from`: every figure is the median run's own cell (as printed),
    labels and equal cells kept, and the widest spread named, the medians' apart."""
    runs = [
        _written(tmp_path, "a.json", [["stubbed", "35.24", "70.86", "1.35x"], ["sdk", "281", "434", "10.77x"], ["loop", "1", "3.40 / 4.55 / 25.69", "2x"]]),
        _written(tmp_path, "b.json", [["stubbed", "37.01", "98.10", "1.41x"], ["sdk", "174", "434", "6.70x"], ["loop", "1", "3.54 / 3.93 / 7.10", "2x"]]),
        _written(tmp_path, "c.json", [["stubbed", "36.50", "65.00", "1.29x"], ["sdk", "1,249", "434", "12.0x"], ["loop", "1", "3.60 / 4.00 / 9.00", "2x"]]),
    ]  # fmt: skip
    out = _run("rounds.py", "--from", *map(str, runs))
    assert "| stubbed | 36.50 | 70.86 | 1.35x |" in out, out
    assert "| sdk | 281 | 434 | 10.77x |" in out, out
    assert "| loop | 1 | 3.54 / 4.00 / 9.00 | 2x |" in out, out  # each figure's own median
    assert "Input: 1 KB." in out
    assert "2 CPUs, AMD EPYC; Python 3.11.7; cel-python 0.5.0" in out  # the runs' machine
    # sdk's median column: 174 to 1,249 over its median 281 = 383%, the widest of all.
    assert (
        "spread across the runs by up to 383% of their median (sdk, median µs: 174 to 1249)." in out
    )


def test_rounds_says_when_the_runs_were_made_on_other_machines(tmp_path: Path) -> None:
    """Runs from machines unlike each other are combined, under a warning, not a machine line."""
    a = _written(tmp_path, "a.json", [["stubbed", "35.24", "70.86", "1.35x"]])
    b = _written(tmp_path, "b.json", [["stubbed", "30.10", "60.00", "1.10x"]], cpus="64")
    out = _run("rounds.py", "--from", str(a), str(b))
    assert "made on different machines" in out and "AMD EPYC" not in out
    assert "| stubbed | 30.10 | 60.00 | 1.10x |" in out  # the lower median of two


def test_rounds_names_what_does_not_match(tmp_path: Path) -> None:
    """Runs that cannot be put together: exit 2 and a line naming the file, table, row and
    column; a file that is not a run's JSON is named too."""
    a = _written(tmp_path, "a.json", [["stubbed", "35.24", "70.86", "1.35x"]])
    b = _written(tmp_path, "b.json", [["sdk", "36.10", "70.86", "1.35x"]])
    c = _written(tmp_path, "c.json", [["stubbed", "35.24"]], title="Loop")
    d = _written(tmp_path, "d.json", [["stubbed", "35.24", "70.86 / 3", "1.35x"]])
    broken = tmp_path / "e.json"
    broken.write_text('{"machine": {}}')
    for files, message in (
        ([a, b], f"{b}: table 'Guard', row 1 is 'sdk', not 'stubbed' as in {a}"),
        ([a, d], "table 'Guard', row 1 (stubbed), column 'p99 µs': other words around the"),
        ([a, c], f"{c}: other tables than {a}: ['Loop']"),
        ([a, broken], f"{broken}: not a run.py --json file with its tables"),
    ):
        done = subprocess.run(
            [sys.executable, str(BENCHMARKS / "rounds.py"), "--from", *map(str, files)],
            capture_output=True,
            text=True,
            timeout=120,
        )
        assert done.returncode == 2 and message in done.stderr, done.stderr
        assert "|---" not in done.stdout  # nothing half-combined printed


def test_rounds_stops_at_a_failed_run() -> None:
    """A run that fails (here: a section run.py does not have) stops the rounds: its own error
    shown, then which run failed, exit 1, no table."""
    done = subprocess.run(
        [sys.executable, str(BENCHMARKS / "rounds.py"), "--rounds", "2", "--only", "nothing"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr
    assert "invalid choice: 'nothing'" in done.stderr  # run.py's own message
    assert "rounds.py: run 1 failed (exit 2)" in done.stderr
    assert "run 2 of 2" not in done.stderr and "|---" not in done.stdout
