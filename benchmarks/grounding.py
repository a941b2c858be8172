"""Grounding benchmark: speed of the check and its accuracy, printed as markdown.

    .venv/bin/python benchmarks/grounding.py            # a minute or two
    .venv/bin/python benchmarks/grounding.py --quick    # a few seconds

Speed: a real 2 KB slice of a Claude Code compaction summary checked against 100 KB of the real
history before its boundary (tests/fixtures/grounding/), median / mean / p99 of single calls,
beside a hand-written baseline measured in the same run: every number-or-identifier token of the
summary looked up verbatim (`str.find`) in the joined sources, the check validators in the wild
do. Then how the check scales with the summary and with the sources (it should be linear in the
first and flat in the second, since sources are indexed once, when recorded), and the cost of
indexing. Accuracy: precision and recall on the hand-written corpus (faithful and corrupted
summaries) and the counts on the real summaries.
"""

from __future__ import annotations

import argparse
import functools
import gzip
import json
import re
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from policyhook.adapters.claude_postcompact import history_sources
from policyhook.grounding import FactIndex, check, extract

ROOT = Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "tests" / "fixtures" / "grounding"
CORRUPTIONS = ("changed", "unit", "id", "invented", "dropped")


def measure(fn: Callable[[], object], repeat: int) -> list[float]:
    """Wall time of `repeat` single calls, in microseconds, after a warm-up."""
    for _ in range(max(3, repeat // 10)):
        fn()
    clock = time.perf_counter_ns
    samples = []
    for _ in range(repeat):
        start = clock()
        fn()
        samples.append((clock() - start) / 1000)
    return samples


def cpu_ms(fn: Callable[[], object], repeat: int) -> float:
    """Median CPU time of `repeat` calls in milliseconds (thread time: what the neighbours of a
    shared machine take is not counted, as it is in wall time)."""
    samples = []
    for _ in range(repeat):
        start = time.thread_time_ns()
        fn()
        samples.append((time.thread_time_ns() - start) / 1e6)
    return statistics.median(samples)


def row(name: str, samples: list[float], base: float | None = None) -> str:
    ordered = sorted(samples)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))]
    med = statistics.median(samples)
    ratio = f"{med / base:.2f}x" if base else "1.00x"
    mean = statistics.fmean(samples)
    return f"| {name} | {med:,.0f} | {mean:,.0f} | {p99:,.0f} | {ratio} |"


#: The real Claude Code sessions of tests/fixtures/grounding/ (README.md there says whence).
SESSIONS = ("apollo-23", "apollo-32", "spotter-8463", "spotter-ae4a")


def session(name: str) -> tuple[list[tuple[str, str]], str]:
    """(source id, text) of everything the summarizer was shown, and the compaction summary,
    read as `policyhook claude-postcompact` reads them (the compaction agent's own transcript
    beside the session's, when the fixture has one)."""
    data = gzip.decompress((FIXTURES / f"{name}.jsonl.gz").read_bytes())
    (entry,) = [e for e in map(json.loads, data.splitlines()) if e.get("isCompactSummary")]
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / f"{entry['sessionId']}.jsonl"
        path.write_bytes(data)
        for agent in FIXTURES.glob(f"{name}.agent-acompact-*.jsonl"):
            folder = Path(tmp) / entry["sessionId"] / "subagents"
            folder.mkdir(parents=True, exist_ok=True)
            (folder / agent.name.removeprefix(f"{name}.")).write_bytes(agent.read_bytes())
        summary = entry["message"]["content"]
        return history_sources(path, entry["sessionId"], summary), summary


def mutated(summary: str, start: int, end: int) -> str:
    """The summary with the first number of [start, end) changed (+1; a decimal's last digit
    +3): a plausible wrong value where the summarizer wrote a right one."""
    text = summary[start:end]
    m = re.search(r"\d+(?:\.\d+)?", text)
    assert m is not None
    digits = m.group()
    bumped = str((int(digits[-1]) + 3) % 10)
    new = digits[:-1] + bumped if "." in digits else str(int(digits) + 1)
    return summary[: start + m.start()] + new + summary[start + m.end() :]


def take(history: list[tuple[str, str]], chars: int) -> list[tuple[str, str]]:
    """The first entries of the history, the last one cut, so they total `chars` characters."""
    out, total = [], 0
    for sid, text in history:
        if total >= chars:
            break
        text = text[: chars - total]
        out.append((sid, text))
        total += len(text)
    return out


def cut(summary: str, chars: int) -> str:
    """A slice of the summary of about `chars` characters, ending at a line break."""
    text = summary[:chars]
    return text[: text.rfind("\n") + 1] or text


def indexed(sources: list[tuple[str, str]]) -> FactIndex:
    idx = FactIndex()
    for sid, text in sources:
        idx.add(sid, text)
    return idx


_TOKEN = re.compile(r"\d[\d,.]*\w*|[A-Za-z_][\w-]*[_\d][\w-]*|[\w.-]*/[\w./-]+")


def baseline(summary: str, joined: str) -> list[str]:
    """Hand-written verbatim check: tokens of the summary no source contains as a substring."""
    return [tok for tok in _TOKEN.findall(summary) if joined.find(tok) < 0]


def speed(quick: bool) -> None:
    repeat = 200 if quick else 2000
    history, summary = session("apollo-32")
    sources = take(history, 100_000)
    idx = indexed(sources)
    joined = "\n".join(text for _, text in sources)
    text = cut(summary, 2048)
    print(f"## Speed: {len(text):,} characters of summary, {len(joined):,} of live sources\n")
    print("| call | median us | mean us | p99 us | vs baseline |")
    print("|---|---:|---:|---:|---:|")
    base = measure(lambda: baseline(text, joined), repeat)
    base_median = statistics.median(base)
    print(row("baseline: verbatim str.find of each token", base))
    print(
        row(
            "grounding.check (extract + match + dropped)",
            measure(lambda: check(text, idx), repeat),
            base_median,
        )
    )
    print(
        row(
            "grounding.extract (the summary's facts)",
            measure(lambda: extract(text), repeat),
            base_median,
        )
    )
    live = frozenset(sid for sid, _ in sources[::2])
    print(
        row(
            "grounding.check, half the sources live",
            measure(lambda: check(text, idx, live), repeat),
            base_median,
        )
    )
    print()
    print("### Linear in the summary, flat in the sources (median us of check)\n")
    print("| summary chars | 50 KB sources | 100 KB | 200 KB | 300 KB |")
    print("|---:|---:|---:|---:|---:|")
    sizes = (50_000, 100_000, 200_000, 300_000)
    indexes = {size: indexed(take(history, size)) for size in sizes}
    for chars in (1024, 2048, 4096, 8192, 16384):
        part = cut(summary, chars)
        cells = [
            statistics.median(measure(functools.partial(check, part, indexes[s]), repeat // 4))
            for s in sizes
        ]
        print(f"| {len(part):,} | " + " | ".join(f"{c:,.0f}" for c in cells) + " |")
    print()
    print("### Indexing the sources (once per source, when it is recorded)\n")
    print("| sources | median ms | KB per ms | median CPU ms | KB per CPU ms |")
    print("|---:|---:|---:|---:|---:|")
    for size in sizes:
        chunk = take(history, size)
        ms = statistics.median(measure(functools.partial(indexed, chunk), 3 if quick else 7)) / 1000
        cpu = cpu_ms(functools.partial(indexed, chunk), 3 if quick else 7)
        print(
            f"| {size // 1000} KB | {ms:,.1f} | {size / 1000 / ms:.2f} | {cpu:,.1f} "
            f"| {size / 1000 / cpu:.2f} |"
        )
    print()


def accuracy() -> None:
    cases = json.loads((FIXTURES / "corpus.json").read_text(encoding="utf-8"))["cases"]
    print(f"## Accuracy: hand-written corpus ({len(cases)} cases)\n")
    false_refusals = 0
    caught = {k: 0 for k in CORRUPTIONS}
    flagged_total = 0
    for case in cases:
        idx = indexed(list(case["sources"].items()))
        faithful = check(case["faithful"], idx)
        if faithful.ungrounded or faithful.unverifiable:
            false_refusals += 1
            flagged_total += 1
        for kind in CORRUPTIONS:
            g = check(case["corrupted"][kind], idx)
            hit = bool(g.dropped) if kind == "dropped" else bool(g.ungrounded)
            caught[kind] += hit
            flagged_total += hit
    print("| corruption | caught | recall |")
    print("|---|---:|---:|")
    for kind in CORRUPTIONS:
        print(f"| {kind} | {caught[kind]}/{len(cases)} | {caught[kind] / len(cases):.0%} |")
    total = sum(caught.values())
    n = len(cases) * len(CORRUPTIONS)
    print(f"| all | {total}/{n} | {total / n:.0%} |")
    precision = total / flagged_total if flagged_total else 1.0
    print(f"\nFaithful summaries flagged (false refusals): {false_refusals}/{len(cases)}. ")
    print(f"Precision (flagged summaries that were corrupted): {precision:.0%}.\n")
    print("## Real compaction summaries (Claude Code, tests/fixtures/grounding/)\n")
    print(
        "| session | history chars | summary chars | facts | grounded | ungrounded (numbers) "
        "| dropped | changed numbers caught |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for name in SESSIONS:
        history, summary = session(name)
        idx = indexed(history)
        g = check(summary, idx)
        s = g.summary()
        chars = sum(len(t) for _, t in history)
        # every grounded number changed in turn: is the changed value caught?
        numbers = [f for f in g.grounded if f.kind == "number" and any(c.isdigit() for c in f.text)]
        spotted = 0
        for f in numbers:
            wrong = check(mutated(summary, f.start, f.end), idx)
            spotted += any(x.start == f.start for x in wrong.ungrounded)
        print(
            f"| {name} | {chars:,} | {len(summary):,} | {s['facts']} | {s['grounded']} "
            f"| {s['ungrounded']} ({s['ungrounded_counts']['number']}) "
            f"| {s['dropped']} of {s['key_facts']} | {spotted}/{len(numbers)} |"
        )
    print()


def memory(quick: bool) -> None:
    """The guard's grounding memory over a long agent loop: what tracemalloc sees allocated,
    and kept, in policyhook/grounding.py per 100k calls once the fact index is full, beside the
    whole guard's growth (its ledger and store keep their own) and the index's entries."""
    import itertools
    import random
    import tracemalloc

    from policyhook import Guard
    from policyhook.stores import MemoryStore

    bound = 256 if quick else 1024
    calls = 16 * bound  # the second half starts well past the bound and the caches' warm-up
    rng = random.Random(17)
    vocabulary = ["retry", "ceiling", "config", "tool", "output", "user", "turn", "window"]

    def turn(i: int) -> str:
        said = (rng.choice(vocabulary) + str(rng.randrange(1000)) for _ in range(40))
        return f"turn {i}: timeout_ms: {i % 5000} " + " ".join(said)

    guard = Guard(store=MemoryStore(max_sources=1024), max_fact_sources=bound)
    counter = itertools.count()
    summarize = guard(lambda messages: f"summary {next(counter)}: " + "x" * 400, summarizer="b")
    turns = [turn(i) for i in range(calls)]
    marks: list[tuple[int, int, int, tracemalloc.Snapshot]] = []
    tracemalloc.start()
    for i, text in enumerate(turns):
        guard.record_source(text, kind="user_turn")
        summarize([text])
        if i + 1 in (calls // 2, calls):
            index = guard._facts
            entries = sum(len(ids) for ids in index._keys.values())
            marks.append((i + 1, len(index._keys), entries, tracemalloc.take_snapshot()))
    tracemalloc.stop()
    guard.close()
    (n0, keys0, entries0, before), (n1, keys1, entries1, after) = marks
    per = 100_000 / (n1 - n0)
    total = sum(d.size_diff for d in after.compare_to(before, "filename")) * per
    only = [tracemalloc.Filter(True, "*/policyhook/grounding.py")]
    ours = sum(
        d.size_diff
        for d in after.filter_traces(only).compare_to(before.filter_traces(only), "filename")
    )
    print(f"## Memory: a guard over MemoryStore(max_sources=1,024), max_fact_sources={bound:,}\n")
    print(f"{calls:,} calls (a new 40-word turn recorded, a 400-char summary); growth over calls")
    print(f"{n0:,} to {n1:,}, the index full since call {bound:,} (tracemalloc).\n")
    print("| what | calls " + f"{n0:,} | calls {n1:,} | per 100k calls |")
    print("|---|---:|---:|---:|")
    print(f"| index keys | {keys0:,} | {keys1:,} | |")
    print(f"| index entries (source ids under the keys) | {entries0:,} | {entries1:,} | |")
    print(f"| allocated in policyhook/grounding.py | | | {ours * per / 1e6:+.1f} MB |")
    print(f"| the whole guard (ledger and store included) | | | {total / 1e6:+.1f} MB |")
    by_file = after.compare_to(before, "filename")
    for d in sorted(by_file, key=lambda d: -d.size_diff)[:4]:
        name = d.traceback[0].filename.rsplit("/policyhook/", 1)[-1]
        print(f"| of which allocated in {name} | | | {d.size_diff * per / 1e6:+.1f} MB |")
    print()


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    parser.add_argument(
        "--only", choices=("speed", "accuracy", "memory"), action="append", help="these sections"
    )
    args = parser.parse_args(argv)
    sections = args.only or ("speed", "accuracy", "memory")
    print(f"Python {sys.version.split()[0]}\n")
    if "speed" in sections:
        speed(args.quick)
    if "accuracy" in sections:
        accuracy()
    if "memory" in sections:
        memory(args.quick)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
