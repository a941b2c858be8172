"""Property: what the ledger remembers of a message never hides a known text in it.

The ledger remembers, per message digest, where known texts lie and the index generation that
answer is complete for; a later resolve of the same message searches only for the texts indexed
since (`Index.find_added`), and only a discard or a text it cannot index (`Ledger._epoch`) makes
it search again whole. A hypothesis state machine records sources and summaries (texts sharing
a long prefix, embedded in others, overlapping others' ends, short, non-ASCII) from this ledger
(a tiny cache: discards) and from another one on the same SQLite file (a second process),
summarizes messages into summaries (chains), and resolves the same few messages
again and again, alone, side by side, and padded past `_LARGE_INPUT`. The oracle is a new
ledger over the same store, which remembers nothing: both must give the same resolution.
`ScanWindows` does the same with windows rendered as one string (the index remembers, by
content, where anchors lie in the chunks and seams of long inputs: `Index._chunked`), each made
by editing, extending, splicing or re-ordering an earlier one, cut small so that cuts fall
inside known texts. Fixed budget, derandomized: CI stays bounded.
"""

from __future__ import annotations

import random
import tempfile
from pathlib import Path
from unittest import mock

import deep
from hypothesis import HealthCheck
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, precondition, rule

from policyhook import Region, SQLiteStore, _index
from policyhook._index import _LARGE_INPUT, _LOG
from policyhook._provenance import Ledger, Resolution

#: A prefix longer than an anchor (32 bytes): texts starting with it are anchored further in.
HEADER = "tool output header shared by the nightly jobs: "
_BASE = [
    HEADER + "retry ceiling is seven",
    HEADER + "retry ceiling is eight",
    "summary of the deploy window and its backoff jitter settings",
    "jitter settings were tuned again; the deploy window is closed now",
    "ok fine",  # short: recognised only as a whole message
    "café au lait: the billing window reopened for everyone",  # not ASCII
]
#: Every text a step may record, built from the ones above: each index names one text forever.
TEXTS = [
    *_BASE,
    "quoting: " + _BASE[2] + " / " + _BASE[0],  # embeds two
    _BASE[2][-24:] + " and then unrelated words go on",  # starts inside another's end
    _BASE[0] + " and the rest of that report",  # another is its prefix (longest first)
    "billing window reopened for everyone and the café closed",  # overlaps 5's end
    _BASE[3] + _BASE[4],  # ends with a short text
    "a twelfth text, plain, about the backoff of the retry loop",
    "summary of the deploy window",  # a prefix of 2
]
#: Recorded as summaries (outputs) or as sources, never both. A text registered as a source that
#: quotes a summary and later recorded as a summary takes the summary's id in the store
#: (`Entry.merged`), so a summary made from it loses that source id when a fresh ledger walks
#: its parents, while a ledger that cached the closure keeps it: a question for the entries'
#: owner, not for the remembered splits this machine checks.
SUMMARIES = [0, 1, 2, 5, 8, 9, 12]
SOURCES = [3, 4, 6, 7, 10, 11]
FILLER = ["", " ", "\n", "plain words between the known texts. ", "café ", "x" * 40]


class Scan(RuleBasedStateMachine):
    """Two ledgers on one SQLite file; the first's remembered splits against a fresh ledger."""

    def __init__(self) -> None:
        super().__init__()
        self.tmp = tempfile.TemporaryDirectory()
        path = Path(self.tmp.name) / "store.sqlite"
        self.stores = [SQLiteStore(path), SQLiteStore(path)]
        self.messages: list[str] = [TEXTS[2] + " then " + TEXTS[0]]

    @initialize(max_texts=st.sampled_from([1, 2, 3, 6, 65_536]))
    def setup(self, max_texts: int) -> None:
        self.ledger = Ledger(self.stores[0], max_texts=max_texts)
        self.other = Ledger(self.stores[1])

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        self.tmp.cleanup()

    def by(self, here: bool) -> Ledger:
        return self.ledger if here else self.other

    @rule(text=st.sampled_from(SOURCES), here=st.booleans())
    def record_source(self, text: int, here: bool) -> None:
        self.by(here).record_source(TEXTS[text], "tool_output", f"src{text}")

    @rule(text=st.sampled_from(SUMMARIES), here=st.booleans(), base=st.integers(0, 3))
    def record_summary(self, text: int, here: bool, base: int) -> None:
        region = Region(f"r{base}", sources=frozenset({f"base{base}"}))
        self.by(here).record_summary(TEXTS[text], region, "w")

    @rule(text=st.sampled_from(SUMMARIES), here=st.booleans(), message=st.integers(0, 7))
    def summarize(self, text: int, here: bool, message: int) -> None:
        """A granted call: a message resolved, and a text recorded as its summary (chains)."""
        ledger = self.by(here)
        region = ledger.resolve(self.messages[message % len(self.messages)], "w").region
        ledger.record_summary(TEXTS[text], region, "w")

    @rule(count=st.integers(_LOG - 2, _LOG + 2), here=st.booleans())
    def many_new_texts(self, count: int, here: bool) -> None:
        """About as many new texts as the index's log holds, none in any message."""
        region = Region("r-many", sources=frozenset({"base-many"}))
        start = len(self.messages) * 1000 + count
        for i in range(count):
            text = f"a new output number {start + i} that no message holds"
            self.by(here).record_summary(text, region, "w")

    @precondition(lambda self: len(self.messages) < 8)
    @rule(
        parts=st.lists(
            st.one_of(st.integers(0, len(TEXTS) - 1), st.sampled_from(FILLER)),
            min_size=1,
            max_size=5,
        )
    )
    def compose(self, parts: list[int | str]) -> None:
        """A new message: known texts and filler side by side, some with nothing between."""
        self.messages.append("".join(TEXTS[p] if isinstance(p, int) else p for p in parts))

    @rule(
        picked=st.lists(st.integers(0, 7), min_size=1, max_size=3),
        large=st.sampled_from([False, False, False, True]),
    )
    def resolve(self, picked: list[int], large: bool) -> None:
        """The same messages again: equal to what a ledger remembering nothing resolves."""
        value = [self.messages[i % len(self.messages)] for i in picked]
        if large:  # past `_LARGE_INPUT`: levels merged, a pass per level, small ones `find`
            value = ["plain padding words. " * (_LARGE_INPUT // 21 + 1) + value[0], *value[1:]]
        got = self.ledger.resolve(value, "w")
        fresh = Ledger(self.stores[0]).resolve(value, "w")
        assert got.failure is None and fresh.failure is None
        assert _seen(got) == _seen(fresh)


def _seen(found: Resolution) -> tuple[object, ...]:
    return found.region, found.unregistered, found.summaries


#: Filler for windows: lines of several lengths (cut at line ends), and a long line (cut inside,
#: where lines run past `_CHUNK_MAX`: through known texts too).
LINES = ["\n", "user: a new turn about the deploy window\n", "café line\n", "y" * 150, " "]


class ScanWindows(Scan):
    """`Scan` with windows rendered as one string, cut small (chunks of 32 to 40 bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.patches = [
            mock.patch.object(_index, name, value)
            for name, value in (("_CHUNKED", 64), ("_CHUNK", 32), ("_CHUNK_MAX", 40))
        ]
        for patch in self.patches:
            patch.start()
        self.windows: list[str] = [TEXTS[2] + "\n" + LINES[3] + TEXTS[0] + LINES[1] + TEXTS[5]]

    def teardown(self) -> None:
        for patch in self.patches:
            patch.stop()
        super().teardown()

    def same_as_fresh(self, value: str) -> None:
        got = self.ledger.resolve(value, "w")
        fresh = Ledger(self.stores[0]).resolve(value, "w")
        assert got.failure is None and fresh.failure is None
        assert _seen(got) == _seen(fresh)

    @rule(
        parts=st.lists(
            st.one_of(st.integers(0, 7), st.sampled_from(LINES), st.sampled_from(TEXTS)),
            min_size=1,
            max_size=8,
        )
    )
    def window(self, parts: list[int | str]) -> None:
        """A new window: messages, known texts and lines in one string."""
        value = "".join(
            self.messages[p % len(self.messages)] if isinstance(p, int) else p for p in parts
        )
        self.windows.append(value)
        self.same_as_fresh(value)

    @rule(
        which=st.integers(0, 99),
        other=st.integers(0, 99),
        how=st.sampled_from(["insert", "delete", "append", "prepend", "splice", "reorder"]),
        at=st.integers(0, 1 << 16),
        part=st.sampled_from([*LINES, *TEXTS]),
    )
    def edit_window(self, which: int, other: int, how: str, at: int, part: str) -> None:
        """An earlier window edited as a loop edits its window between calls."""
        value = self.windows[which % len(self.windows)]
        at %= len(value) + 1
        if how == "insert":
            value = value[:at] + part + value[at:]
        elif how == "delete":
            value = value[:at] + value[at + len(part) :]
        elif how == "append":
            value += part
        elif how == "prepend":
            value = part + value
        elif how == "splice":
            rest = self.windows[other % len(self.windows)]
            value = value[:at] + rest[at % (len(rest) + 1) :]
        else:
            lines = value.split("\n")
            random.Random(at).shuffle(lines)
            value = "\n".join(lines)
        self.windows.append(value)
        self.same_as_fresh(value)

    @rule(which=st.integers(0, 99))
    def window_again(self, which: int) -> None:
        """An earlier window again, after whatever was recorded since."""
        self.same_as_fresh(self.windows[which % len(self.windows)])


for machine in (Scan, ScanWindows):
    machine.TestCase.settings = deep.suite(60, 40, HealthCheck.filter_too_much)
TestScan = Scan.TestCase
TestScanWindows = ScanWindows.TestCase


def test_a_text_learnt_from_the_store_mid_pass_splits_the_messages_before_it_again() -> None:
    """Found by `Scan` at 10x: with a cache of one text, a pass over `[m, m3, m]` learnt texts
    from the store by anchor after the first copy of `m` was split, and that copy kept its older
    reading: its summary went on without the source another ledger had added to it since."""
    machine = Scan()
    try:
        machine.setup(max_texts=1)
        machine.record_source(3, here=True)
        machine.record_summary(0, here=True, base=0)
        machine.compose([0])
        machine.many_new_texts(_LOG, here=True)
        machine.compose([0])
        machine.compose([10])
        machine.resolve([0, 0], large=False)
        machine.record_summary(0, here=False, base=2)
        machine.resolve([0, 3, 0], large=False)
    finally:
        machine.teardown()


def test_a_summary_evicted_in_the_pass_that_walked_it_learns_its_growth_elsewhere() -> None:
    """Found by `ScanWindows` at 20x (seed 4848): with a cache of three texts, a window holding
    a summary and three sources fetched the summary, walked its closure, and evicted it in the
    same pass; the closure stayed as if anchored. Another ledger then recorded the same text
    from other sources (merged in the store), and this ledger learnt the grown entry back as
    new without dropping the closure: the summary went on without the source it gained."""
    machine = ScanWindows()
    try:
        machine.setup(max_texts=3)
        machine.compose([0])
        machine.compose([0])
        machine.summarize(here=False, message=0, text=0)
        machine.record_source(here=False, text=11)
        machine.record_source(here=False, text=3)
        machine.compose([11, 6, 8])
        machine.record_source(here=False, text=10)
        machine.record_summary(base=2, here=True, text=8)
        machine.window([TEXTS[10], " ", 0, 3])
        machine.record_summary(base=3, here=False, text=8)
        machine.resolve([6, 3], large=False)
        machine.resolve([6, 3], large=True)
    finally:
        machine.teardown()
