"""The Claude Code hook never allows re-compacting a summary whose originals are gone, whatever
the transcript holds beside them (hypothesis, fixed budgets, derandomized).

A session of up to three compactions is written as Claude Code writes it (entries chained by
`parentUuid`, a `compact_boundary` naming the history it replaced by `logicalParentUuid`, the
`isCompactSummary` entry after it). An earlier hook run may have archived the originals; the
file may then start at a later boundary (the history before it gone from the file), some of the
archived originals may be evicted from the store, a line naming a compaction may be torn, and
noise lines (sidechains, progress records, blank lines, garbage) may lie anywhere. The oracle:
the window rests on a summary (at least one compaction), and something it rests on can be
given back by neither the file nor the store: refused; else allowed. Noise changes nothing.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import deep
from hypothesis import HealthCheck, given
from hypothesis import strategies as st
from test_adapter_claude_code import SESSION, boundary, entry

from policyhook import Effect, Guard
from policyhook.adapters.claude_code import decide
from policyhook.stores import MemoryStore, SQLiteStore

WORDS = ["retry", "ceiling", "deploy", "config", "agent", "budget", "seven", "window", "tool"]


class Session:
    """The lines of a session compacted `len(segments) - 1` times, and what each line holds."""

    def __init__(self, segments: list[int], seed: int) -> None:
        self.lines: list[dict[str, Any]] = []
        self.starts: list[int] = []  # the line each compaction's boundary is on
        self.originals: list[list[str]] = []  # the source ids of each segment's originals
        parent: str | None = None
        for number, size in enumerate(segments):
            if number > 0:
                assert parent is not None
                self.starts.append(len(self.lines))
                self.lines.append(boundary(f"b{number}", parent))
                words = " ".join(WORDS[(seed + number + i) % len(WORDS)] for i in range(12))
                text = f"Summary {number} of the session so far: {words}."
                self.lines.append(entry(f"s{number}", f"b{number}", text, "user"))
                self.lines[-1].update(isCompactSummary=True, isVisibleInTranscriptOnly=True)
                parent = f"s{number}"
            ids: list[str] = []
            for i in range(size):
                uuid = f"u{number}-{i}"
                words = " ".join(WORDS[(seed * 7 + i + number) % len(WORDS)] for _ in range(3))
                text = f"turn {number}.{i} of session {seed}: {words}, value {seed * 31 + i}"
                self.lines.append(entry(uuid, parent, text, ("user", "assistant")[i % 2]))
                ids.append(f"claude:{SESSION}:{uuid}")
                parent = uuid
            self.originals.append(ids)

    @property
    def compactions(self) -> int:
        return len(self.starts)


NOISE = st.one_of(
    st.just(""),
    st.text(st.sampled_from("abc xyz019.,;:"), min_size=1, max_size=40),  # not JSON
    st.builds(
        lambda n: json.dumps({"type": "progress", "uuid": f"p{n}", "sessionId": SESSION}),
        st.integers(0, 99),
    ),
    st.builds(
        lambda n, text: json.dumps(
            {**entry(f"side{n}", None, text, "assistant"), "isSidechain": True}
        ),
        st.integers(0, 99),
        st.text(st.sampled_from("abcdef "), min_size=16, max_size=40),
    ),
)


@st.composite
def scenarios(draw: st.DrawFn) -> dict[str, Any]:
    segments = draw(st.lists(st.integers(1, 4), min_size=1, max_size=4))
    if len(segments) > 1 and draw(st.booleans()):
        segments[-1] = 0  # compacting again right after a compaction: the summary alone
    session = Session(segments, draw(st.integers(0, 1000)))
    earlier = draw(st.booleans())  # an earlier hook run archived the whole file
    start = draw(st.integers(0, session.compactions))  # the file starts at boundary `start`
    archived = [i for ids in session.originals for i in ids] if earlier else []
    evicted: set[str] = set()
    if draw(st.booleans()) and archived:
        evicted = draw(st.sets(st.sampled_from(archived), min_size=1))
    torn = None  # a line naming a compaction written half
    if session.compactions and draw(st.integers(0, 3)) == 0:
        first = session.starts[start - 1] if start else 0
        named = [n for n in range(first, len(session.lines)) if _names_a_compaction(session, n)]
        torn = draw(st.sampled_from(named))
    noise = draw(st.lists(st.tuples(st.integers(0, 10**6), NOISE), max_size=4))
    trigger = draw(st.sampled_from(["auto", "manual"]))
    return {
        "session": session,
        "earlier": earlier,
        "start": start,
        "evicted": evicted,
        "torn": torn,
        "noise": noise,
        "trigger": trigger,
    }


def _names_a_compaction(session: Session, number: int) -> bool:
    line = session.lines[number]
    return line.get("subtype") == "compact_boundary" or line.get("isCompactSummary") is True


def _write(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


def _decide(guard: Guard, transcript: Path, trigger: str) -> Effect:
    hook_input = {
        "session_id": SESSION,
        "transcript_path": str(transcript),
        "hook_event_name": "PreCompact",
        "trigger": trigger,
    }
    return decide(hook_input, guard).effect


def _check(case: dict[str, Any], store: Any, folder: Path) -> None:
    session: Session = case["session"]
    full = [json.dumps(line, separators=(",", ":")) for line in session.lines]
    if case["earlier"]:  # the hook ran on the whole file before (each run is a new guard)
        assert _decide(Guard(store=store), _write(folder / "full.jsonl", full), "auto") in (
            Effect.ALLOW,
            Effect.DENY,
        )
    for source_id in case["evicted"]:
        store.evict(source_id)
    start = case["start"]
    first = session.starts[start - 1] if start else 0
    lines = list(full)
    if case["torn"] is not None:
        lines[case["torn"]] = lines[case["torn"]][: len(lines[case["torn"]]) // 2]
    lines = lines[first:]
    for at, noise in case["noise"]:
        lines.insert(at % (len(lines) + 1), noise)
    effect = _decide(Guard(store=store), _write(folder / "now.jsonl", lines), case["trigger"])

    gone_from_file = {i for ids in session.originals[:start] for i in ids}
    unrecoverable = (
        case["torn"] is not None
        or (start > 0 and not case["earlier"])  # the first summary read has no known history
        or bool(gone_from_file & case["evicted"])  # an original in neither the file nor the store
    )
    expected = Effect.DENY if session.compactions and unrecoverable else Effect.ALLOW
    assert effect == expected, (effect, case)


BUDGET = deep.suite(150, None, HealthCheck.function_scoped_fixture)


@BUDGET
@given(case=scenarios())
def test_refused_exactly_when_an_original_is_gone(case: dict[str, Any], tmp_path: Path) -> None:
    _check(case, MemoryStore(), tmp_path)


@deep.suite(40, None, HealthCheck.function_scoped_fixture)
@given(case=scenarios())
def test_refused_exactly_when_an_original_is_gone_on_sqlite(
    case: dict[str, Any], tmp_path_factory: Any
) -> None:
    folder = tmp_path_factory.mktemp("sqlite")
    with SQLiteStore(folder / "store.sqlite") as store:
        _check(case, store, folder)
