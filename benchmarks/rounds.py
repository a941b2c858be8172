"""Several full runs of `benchmarks/run.py`, each in its own process, as one report: every cell
the median of the runs' figures.

    .venv/bin/python benchmarks/rounds.py                      # 3 runs of every section
    .venv/bin/python benchmarks/rounds.py --rounds 5 --only guard --only loop
    .venv/bin/python benchmarks/rounds.py --from a.json b.json c.json   # runs made before

On a shared machine a single row of one run can move by up to 2x against the next run of the
same code; the median of several runs, each a fresh interpreter (its own hash seed, memory
layout and neighbours), moves far less. Each figure in a cell is the median run's own (the
lower median for an even count; a cell of several figures, "median / mean / p99", takes each
from its own median run), not a number re-computed, so it reads as run.py prints it. Under
each table: how far its figures spread across the runs, the widest named.
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from itertools import zip_longest
from pathlib import Path
from typing import Any

import run

HERE = Path(__file__).resolve().parent
# A figure in a cell as run.py prints it: 35.24, 1,234, -1.47 (of 1.35x, 53%, 3.40 / 4.55 / 25.69).
_FIGURE = re.compile(r"-?\d[\d,]*(?:\.\d+)?")


@dataclass
class Table:
    title: str
    header: list[str]
    rows: list[list[str]]
    note: str


class RoundsError(ValueError):
    """The runs cannot be put together: they hold different tables, rows or labels."""


def load(path: Path) -> tuple[dict[str, Any], list[Table]]:
    """What one run wrote with `run.py --json`, and its tables."""
    try:
        data = json.loads(path.read_text())
        return data, [Table(**table) for table in data["tables"]]
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise RoundsError(f"{path}: not a run.py --json file with its tables ({error})") from error


def combine(runs: dict[str, list[Table]]) -> list[tuple[Table, str]]:
    """Each table of the runs with every figure the median run's, and a line on the spread.

    `runs`: each run's name (its file) and tables, which must match in titles, headers, rows
    and the words around every figure: a mismatch names the run, table, row and column."""
    names = list(runs)
    first = runs[names[0]]
    for name in names[1:]:
        titles = [t.title for t in runs[name]]
        if titles != [t.title for t in first]:
            raise RoundsError(f"{name}: other tables than {names[0]}: {titles}")
    combined = []
    for number, table in enumerate(first):
        versions = [runs[name][number] for name in names]
        labels = [row[0] for row in table.rows]
        for name, version in zip(names, versions, strict=True):
            if version.header != table.header:
                raise RoundsError(f"{name}: table {table.title!r} has columns {version.header}")
            theirs = [row[0] for row in version.rows]
            for r, (label, their) in enumerate(zip_longest(labels, theirs)):
                if label != their:
                    where = f"{name}: table {table.title!r}, row {r + 1}"
                    raise RoundsError(f"{where} is {their!r}, not {label!r} as in {names[0]}")
        rows: list[list[str]] = []
        spreads: list[tuple[float, str, str]] = []  # (spread, figure's column, where)
        for r, row in enumerate(table.rows):
            cells = []
            for c, column in enumerate(table.header):
                seen = [version.rows[r][c] for version in versions]
                where = f"table {table.title!r}, row {r + 1} ({row[0]}), column {column!r}"
                cells.append(_median_cell(seen, column, where, f"{row[0]}, {column}", spreads))
            rows.append(cells)
        table = Table(table.title, table.header, rows, table.note)
        combined.append((table, _spread(spreads, len(names))))
    return combined


def _median_cell(
    seen: list[str], column: str, where: str, short: str, spreads: list[tuple[float, str, str]]
) -> str:
    """One cell from the runs' `seen`: each figure in it the median run's, the words around
    them the same in every run (else an error saying `where`); how far each figure moved is
    added to `spreads`, said `short`ly."""
    words = {tuple(_FIGURE.split(cell)) for cell in seen}
    if len(words) != 1:
        raise RoundsError(f"{where}: other words around the figures: {seen}")
    (between,) = words
    figures = list(zip(*map(_FIGURE.findall, seen), strict=True))
    parts = column.split(" / ")  # a column of several figures names each: "median / p99 µs"
    named = parts if len(parts) == len(figures) > 1 else [column] * len(figures)
    cell = between[0]
    for printed, text, name in zip(figures, between[1:], named, strict=True):
        values = [float(figure.replace(",", "")) for figure in printed]
        median = statistics.median_low(values)
        middle = printed[values.index(median)]
        cell += middle + text
        if len(middle.strip("-").replace(",", "").replace(".", "").lstrip("0")) > 1:
            # (a figure printed with one digit, 0.01 or 2x, moves by its rounding alone)
            spread = (max(values) - min(values)) / abs(median)
            spreads.append((spread, name, f"{short}: {min(values):g} to {max(values):g}"))
    return cell


def _spread(spreads: list[tuple[float, str, str]], runs: int) -> str:
    """A line on how far a table's figures moved between the runs: the widest move of all, and
    of the medians alone (a p99 column moves most, and would hide how steady the medians are)."""
    if not spreads:
        return f"Median of {runs} runs; it holds no figure of two digits or more."
    widest = max(spreads)
    line = (
        f"Median of {runs} runs; its figures spread across the runs by up to {widest[0]:.0%} "
        f"of their median ({widest[2]})"
    )
    medians = [s for s in spreads if "median" in s[1]]
    if medians and max(medians) != widest:
        line += f", the medians by up to {max(medians)[0]:.0%} ({max(medians)[2]})"
    return line + "."


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3, metavar="N", help="runs (default 3)")
    parser.add_argument("--quick", action="store_true", help="each run with --quick")
    parser.add_argument("--only", action="append", help="run.py's --only (repeatable)")
    parser.add_argument("--from", dest="files", nargs="+", metavar="JSON", type=Path,
                        help="combine these run.py --json files; run nothing")  # fmt: skip
    parser.add_argument("--json", metavar="PATH", help="also write the medians and every run")
    args = parser.parse_args(argv)
    if args.rounds < 1:
        parser.error("--rounds: at least 1")
    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        files = args.files or [Path(scratch) / f"run-{n + 1}.json" for n in range(args.rounds)]
        for n, path in enumerate([] if args.files else files):
            command = [sys.executable, str(HERE / "run.py"), "--json", str(path)]
            command += ["--quick"] * args.quick
            command += [f"--only={section}" for section in args.only or []]
            print(f"run {n + 1} of {len(files)}: {' '.join(command[1:])}", file=sys.stderr)
            done = subprocess.run(command, stdout=subprocess.DEVNULL)  # (its stderr shows)
            if done.returncode:
                print(f"rounds.py: run {n + 1} failed (exit {done.returncode})", file=sys.stderr)
                return 1
        try:
            loaded = {str(path): load(path) for path in files}
            combined = combine({name: tables for name, (_, tables) in loaded.items()})
        except RoundsError as error:
            print(f"rounds.py: {error}", file=sys.stderr)
            return 2
    machines = [data.get("machine") for data, _ in loaded.values()]
    print(f"## policyhook benchmarks, the median of {len(files)} runs\n")
    if any(machine != machines[0] for machine in machines):
        print("The runs were made on different machines: their medians mean little.\n")
    elif isinstance(machines[0], dict):
        print(run.described(machines[0]) + "\n")
    for table, spread in combined:
        note = f"{table.note}\n\n{spread}" if table.note else spread
        print(run.render(table.title, table.header, table.rows, note), flush=True)
    elapsed = time.perf_counter() - started
    print(f"Whole run: {elapsed:.0f} s.")
    if args.json:
        out: dict[str, Any] = {
            "runs": [data for data, _ in loaded.values()],  # each run's own figures
            "tables": [vars(t) | {"spread": s} for t, s in combined],
        }
        Path(args.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
