"""Wrong allows found by hunting (shapes, cache bounds, faults), each kept as the test that failed
on the code before its fix: a summary whose sources are gone must never be re-summarized because
of how it came back.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, cast

import pytest
from outage import one_fault, store_down

from policyhook import (
    Guard,
    MemoryStore,
    Region,
    SQLiteStore,
    Store,
    UnsafeRecompactionError,
)

SOURCE = "config read: retry_ceiling = 7 for the billing job"


def summarized_then_evicted(output: str) -> tuple[Guard, str]:
    """A guard that granted one call over SOURCE returning `output`; SOURCE is then evicted.
    Returns the guard and what the caller got back (the output as the summarizer wrote it)."""
    guard = Guard(store=MemoryStore())
    guard.record_source(SOURCE, "config_read", "cfg")
    got = guard(lambda text: output, summarizer="s")(SOURCE)
    guard.store.evict("cfg")
    return guard, got


def store_of(kind: str, path: Path) -> tuple[Store, Callable[[], Store]]:
    """A store of `kind` ("memory" or "sqlite", at `path`), and how another process opens the
    same one (a MemoryStore is shared as it is)."""
    if kind == "memory":
        memory = MemoryStore()
        return memory, lambda: memory
    return SQLiteStore(path), lambda: SQLiteStore(path)


class TestShortOutputsWithWhitespace:
    """Outputs are recorded stripped; a short one (under the 16 bytes searched inside longer
    text) that comes back as the summarizer wrote it, with its trailing newline, was original
    content resting on nothing (allowed)."""

    @pytest.mark.parametrize("written", ["Ceiling: seven.\n", "  OK\n", "\tdone. \r\n"])
    @pytest.mark.parametrize("shape", ["str", "list", "message", "block"])
    def test_a_short_output_as_returned_is_still_a_summary(self, written: str, shape: str) -> None:
        """The caller's copy of a short output (whitespace around it) is refused once its
        source is gone, whole or as one message of a list, a message dict or a text block."""
        guard, got = summarized_then_evicted(written)
        assert got == written  # the caller gets the output unchanged
        value: object = {
            "str": got,
            "list": ["a new user turn about the deploy", got],
            "message": [{"role": "assistant", "content": got}],
            "block": {"role": "assistant", "content": [{"type": "text", "text": got}]},
        }[shape]
        region = guard.provenance(value)
        assert region.depth == 1
        assert "cfg" in region.sources
        assert guard.check(value, summarizer="p").effect == "deny"

    def test_another_process_recognises_the_returned_short_output(self, tmp_path: Path) -> None:
        """A guard on the same SQLite file, which caches nothing yet, finds it in the store."""
        path = tmp_path / "store.sqlite"
        first = Guard(store=SQLiteStore(path))
        first.record_source(SOURCE, "config_read", "cfg")
        got = first(lambda text: "Ceiling: seven.\n", summarizer="s")(SOURCE)
        first.store.evict("cfg")
        later = Guard(store=SQLiteStore(path))
        assert later.check([{"role": "assistant", "content": got}], summarizer="p").effect == "deny"


class Faulty:
    """Wraps a store; `operation` raises OSError while `failing` is set, once it has been
    called `after` times since."""

    def __init__(self, inner: Store, operation: str, after: int = 0) -> None:
        self.inner, self.operation, self.after = inner, operation, after
        self._failing, self.calls = False, 0

    @property
    def failing(self) -> bool:
        return self._failing

    @failing.setter
    def failing(self, on: bool) -> None:
        self._failing, self.calls = on, 0

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name != self.operation:
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self._failing:
                self.calls += 1
                if self.calls > self.after:
                    raise OSError(5, "Input/output error")
            return attribute(*args, **kwargs)

        return call


class TestRegisteringASummaryWhileTheStoreFails:
    """Registering a text that is, or quotes, a summary writes twice: the text as a source, and
    its provenance over it. The second write failing left the store (and the ledger's cache)
    holding the text as plain evidence: a summary of dead sources allowed for good, in every
    process, even after the store came back and the text was registered again."""

    TEXTS: ClassVar[dict[str, str]] = {
        "exact": "Summary: the retry ceiling is seven for the billing job",
        "quoting": "Assistant: as summarized, Summary: the retry ceiling is seven for the billing job",
    }

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @pytest.mark.parametrize("operation", ["put_summary", "put_source"])
    @pytest.mark.parametrize("text", sorted(TEXTS))
    def test_a_failed_registration_never_turns_a_summary_into_evidence(
        self, tmp_path: Path, kind: str, operation: str, text: str
    ) -> None:
        """Either write failing: record_source raises, and the summary (or the text quoting it)
        is still refused once its source is gone, by this guard and by a new one, and after
        the text is registered again."""
        path = tmp_path / "store.sqlite"
        inner, reopen = store_of(kind, path)
        store = Faulty(inner, operation)
        guard = Guard(store=cast(Store, store))
        guard.record_source(SOURCE, "config_read", "cfg")
        guard(lambda t: self.TEXTS["exact"], summarizer="s")(SOURCE)
        inner.evict("cfg")
        registered = self.TEXTS[text]
        store.failing = True
        with pytest.raises(OSError):
            guard.record_source(registered, "ai_turn", "msg-1")
        store.failing = False
        later = Guard(store=reopen())
        for deciding in (guard, later):
            assert deciding.check(registered, summarizer="p").effect == "deny"
        guard.record_source(registered, "ai_turn", "msg-1")
        for deciding in (guard, later, Guard(store=reopen())):
            region = deciding.provenance(registered)
            assert region.depth == 1 and "cfg" in region.sources
            assert deciding.check(registered, summarizer="p").effect == "deny"


class TestRegisteringWhileTheStoreFailsToRead:
    """False refusal (found with tests/test_fault_sweep.py): a store read failing while a new text
    was being registered made the ledger record the text as a summary of an unverifiable source,
    in the store: one transient failure refused every later summary of that original, in every
    process. Registering now raises the failure, and nothing is recorded."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_a_read_failing_during_registration_is_raised_not_recorded(
        self, tmp_path: Path, kind: str
    ) -> None:
        """record_source raises the store's error; registered again, the text is evidence."""
        path = tmp_path / "store.sqlite"
        inner, reopen = store_of(kind, path)
        store = Faulty(inner, "lookup", after=0)  # its lookup, before it is recognised
        guard = Guard(store=cast(Store, store))
        store.failing = True
        with pytest.raises(OSError):
            guard.record_source(SOURCE, "config_read", "cfg")
        store.failing = False
        guard.record_source(SOURCE, "config_read", "cfg")
        for deciding in (guard, Guard(store=reopen())):
            assert deciding.provenance(SOURCE).depth == 0
            assert deciding.check(SOURCE, summarizer="p").effect == "allow"


class TestSummariesStartingInsideAFoundText:
    """A summary the ledger's cache does not hold is looked for in the store by anchor, but not
    at positions inside a known text already found: a summary starting with (or inside) a live
    source's text, verbatim, and going on past it was missed there, and the input rested on the
    live source alone (allowed). Seen when the cache is past `max_texts` or the store no longer
    holds the summary's text (a bounded MemoryStore), e.g. in a new process."""

    TOOL = "tool output: 3 files changed in billing/"
    TAIL = " and the retry ceiling is seven"
    SUMMARIES: ClassVar[dict[str, str]] = {
        "same start": TOOL + TAIL,
        "starts inside": TOOL[14:] + TAIL,
    }

    def record(self, guard: Guard, summary: str) -> None:
        guard.record_source(self.TOOL, "tool_output", "tool")
        guard.record_source(SOURCE, "config_read", "cfg")
        guard(lambda v: summary, summarizer="s")([self.TOOL, SOURCE])

    @pytest.mark.parametrize("shape", sorted(SUMMARIES))
    def test_past_the_ledgers_cache(self, shape: str) -> None:
        """The source registered again (an adapter archiving the turn) is the one text cached."""
        store = MemoryStore()
        guard = Guard(store=store, max_texts=1)
        self.record(guard, self.SUMMARIES[shape])
        guard.record_source(self.TOOL, "tool_output", "tool")
        store.evict("cfg")
        value = "Note: " + self.TOOL + self.TAIL
        region = guard.provenance(value)
        assert region.depth == 1 and "cfg" in region.sources
        assert guard.check(value, summarizer="p").effect == "deny"

    @pytest.mark.parametrize("shape", sorted(SUMMARIES))
    def test_a_new_guard_on_a_store_that_forgot_the_summarys_text(self, shape: str) -> None:
        """A bounded MemoryStore keeps the summary's entry, not its text: a restarted guard
        caches the source's text and must ask the store about the summary."""
        store = MemoryStore(max_sources=3)
        guard = Guard(store=store)
        self.record(guard, self.SUMMARIES[shape])
        for letter in "abcd":  # newer summaries push the first one's text out of the store
            guard(lambda v, t=letter: f"another summary {t} of the billing job", summarizer="s")(
                self.TOOL
            )
        store.evict("cfg")
        later = Guard(store=store)
        value = "Note: " + self.TOOL + self.TAIL
        region = later.provenance(value)
        assert region.depth == 1 and "cfg" in region.sources
        assert later.check(value, summarizer="p").effect == "deny"


class TestLangChainServerToolCallChunks:
    """False refusal: LangChain v1's `server_tool_call_chunk` block (a streamed server-side
    tool call, beside `tool_call_chunk`) was an unsupported block type: a TypeError, so the call
    was refused. It is read like the other tool calls, its (partial) arguments verbatim."""

    def test_a_server_tool_call_chunk_is_read_and_a_summary_in_it_found(self) -> None:
        guard, summary = summarized_then_evicted("Summary: the retry ceiling is seven for billing")
        block = {"type": "server_tool_call_chunk", "name": "web_search", "args": summary}
        value = {"role": "assistant", "content": [block]}
        assert guard.provenance(value).depth == 1
        assert guard.check(value, summarizer="p").effect == "deny"
        fresh = {"type": "server_tool_call_chunk", "name": "web_search", "args": '{"q": "dep'}
        assert guard.check({"role": "assistant", "content": [fresh]}, summarizer="p").effect == (
            "allow"
        )


class TestArchivingASummarysText:
    """With `archive_originals`, unrecognised content is stored as a source after a grant. A
    short summary inside a longer unit is not recognised there (docs/inputs.md), so its text
    could be archived exactly; the ledger then cached it as plain evidence over the summary (the
    store keeps the summary, 577fedf), and this guard allowed the summary itself for good."""

    def test_an_archived_copy_of_a_short_summary_leaves_it_a_summary(self) -> None:
        """The summary, given whole, is still refused by this guard and a new one (texts
        without numbers: the output check has nothing to say)."""
        store = MemoryStore()
        guard = Guard(store=store, archive_originals=True)
        tool = "tool output: the billing files changed today"
        config = "config read: the deploy window opens in the morning on weekdays"
        guard.record_source(tool, "tool_output", "tool")
        guard.record_source(config, "config_read", "cfg")
        summary = guard(lambda text: "OK, mornings.", summarizer="s")(config)
        guard(lambda text: "a summary of the tool output", summarizer="s")([tool + summary])
        store.evict("cfg")
        for deciding in (guard, Guard(store=store)):
            assert deciding.provenance([summary]).depth == 1
            assert deciding.check([summary], summarizer="p").effect == "deny"


class TestAClosureCachedPastItsSummarysEntry:
    """The ledger caches what each summary rests on (`_closures`, 256 most recent) apart from
    its entries (`max_texts`). A summary recorded again elsewhere (the same output from another
    input: "No new information.") rests on more sources; a worker whose cache had dropped the
    summary's entry but kept its closure learnt the new entry and still decided on the old
    closure, so it allowed the summary once a source it now rests on was evicted. Closures are
    now forgotten when a summary's entry leaves the cache."""

    def test_a_summary_recorded_again_elsewhere_rests_on_both_inputs(self) -> None:
        store = MemoryStore()
        worker, other = Guard(store=store), Guard(store=store, max_texts=2)
        first = "config read: the deploy window opens in the morning on weekdays"
        second = "tool output: the billing files changed today, three of them"
        summary = "No new information."
        worker.record_source(first, "config_read", "first")
        worker.record_source(second, "tool_output", "second")
        worker(lambda v: summary, summarizer="s")(first)
        assert other.check([summary], summarizer="p").effect == "allow"  # caches its closure
        for tag in "xyz":  # the other worker's small cache moves on: the summary's entry drops
            worker.record_source(f"another long registered text {tag} for the cache", "user_turn")
            other.check(["an unrelated new turn, long enough to search"], summarizer="p")
        worker(lambda v: summary, summarizer="s")(second)  # the same output, another input
        other.check(["an unrelated new turn, long enough to search"], summarizer="p")
        store.evict("second")
        assert worker.check([summary], summarizer="p").effect == "deny"
        assert other.check([summary], summarizer="p").effect == "deny"


class TestARegionsOwnText:
    """A `Region` in the input passed through with the provenance its caller declared, its text
    never read: a known summary of dead sources handed over as `Region.original(text)` (an
    adapter's or a framework's seam) was original content, and re-summarizing it was allowed.
    What the stores know of a Region's text now adds to what was declared."""

    SUMMARY = "Summary: the billing job has a retry ceiling, per the config read."

    def region_of(self, how: str, text: str) -> Region:
        return {
            "original": Region.original(text),
            "declared": Region(id="mine", depth=0, sources=frozenset({"cfg"}), text=text),
            "embedded": Region.original(f"an earlier turn said this.\n{text}\nthen it went on"),
        }[how]

    @pytest.mark.parametrize("how", ["original", "declared", "embedded"])
    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_a_known_summary_in_a_region_is_refused_once_its_source_is_gone(
        self, tmp_path: Path, how: str, kind: str
    ) -> None:
        store, _ = store_of(kind, tmp_path / "s.sqlite")
        guard = Guard(store=store)
        guard.record_source(SOURCE, "config_read", "cfg")
        guard(lambda text: self.SUMMARY, summarizer="s")(SOURCE)
        store.evict("cfg")
        region = guard.provenance([self.region_of(how, self.SUMMARY)])
        assert region.depth == 1
        assert "cfg" in region.sources
        decision = guard.check([self.region_of(how, self.SUMMARY)], summarizer="p")
        assert decision.effect == "deny"

    def test_another_process_that_learns_the_summary_later_reads_the_region(
        self, tmp_path: Path
    ) -> None:
        """The second guard resolved the Region before the summary existed; it learns the summary
        from the store's log (`since`) and must see that the Region's text holds it."""
        path = tmp_path / "s.sqlite"
        first, later = Guard(store=SQLiteStore(path)), Guard(store=SQLiteStore(path))
        first.record_source(SOURCE, "config_read", "cfg")
        value = [Region.original(f"an earlier turn said this.\n{self.SUMMARY}\nthen it went on")]
        assert later.provenance(value).depth == 0
        first(lambda text: self.SUMMARY, summarizer="s")(SOURCE)
        first.store.evict("cfg")
        assert later.check(value, summarizer="p").effect == "deny"

    def test_a_region_of_unknown_text_keeps_what_was_declared(self) -> None:
        """Nothing known in it: the declared region as it was, its text not registered again."""
        guard = Guard(store=MemoryStore())
        guard.record_source(SOURCE, "config_read", "cfg")
        text = "a framework's own message, which no store holds, long enough to be searched"
        declared = Region(id="mine", sources=frozenset({"cfg"}), source_kinds=frozenset({"x"}))
        declared = replace(declared, chars=len(text), text=text)
        resolution = guard.ledger.resolve([declared], "w")
        assert resolution.region.depth == 0
        assert resolution.region.sources == {"cfg"}
        assert resolution.region.source_kinds == {"x"}
        assert resolution.region.chars == len(text)
        assert resolution.unregistered == ()
        assert guard.check([declared], summarizer="p").effect == "allow"

    def test_a_region_whose_text_cannot_be_checked_is_refused(self) -> None:
        """The store failing while the Region's text is looked up: fail closed."""
        inner = MemoryStore()
        store = Faulty(inner, "view")
        guard = Guard(store=cast(Store, store))
        guard.record_source(SOURCE, "config_read", "cfg")
        store.failing = True
        decision = guard.check(
            [Region.original("some text the guard has never seen before")], summarizer="p"
        )
        assert decision.effect == "deny"


class TestATextKeepsItsIdWhenRecordedAgain:
    """A registered text quoting a summary is held under its source id, with provenance; a
    summary may be made of it (resting on it by that id). When a summarizer later wrote that same
    text, its merged entry took the summary's id instead: whatever rested on the old id lost
    that source in the store, and a new process allowed it once the source was gone."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_what_rests_on_a_quoting_text_keeps_it(self, tmp_path: Path, kind: str) -> None:
        store, reopen = store_of(kind, tmp_path / "s.sqlite")
        guard = Guard(store=store)
        base = "tool output: the nightly deploy notes, and the backoff jitter settings"
        summary = "Summary: the nightly deploy keeps its backoff jitter settings."
        quoting = f"user turn: about this, {summary} and nothing else changed"
        guard.record_source(base, "tool_output", "base")
        guard(lambda text: summary, summarizer="s")(base)
        guard.record_source(quoting, "user_turn", "quoting")  # held with its provenance
        guard(lambda text: summary, summarizer="s")(quoting)  # the summary rests on it too
        guard(lambda text: quoting, summarizer="s")(base)  # the quoting text written again
        store.evict("quoting")
        later = Guard(store=reopen())
        for deciding in (guard, later):
            assert "quoting" in deciding.provenance([summary]).sources
            assert deciding.check([summary], summarizer="p").effect == "deny"


class TestATurnGivenAgainWithWhitespace:
    """A turn quoting a text that a summarizer wrote only after the turn was recorded, given
    again with whitespace around it: recorded as a new turn, it quotes a summary, so it rests on
    the summary's sources. The record's quick check answered from the entry of its stripped form
    (the first turn, recorded as evidence before the text was a summary's) and recorded it as
    evidence: its summary was allowed with the summary's source gone. Found by
    `tests/test_record_quoting.py` at `POLICYHOOK_DEEP=10`."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_it_rests_on_the_summary_it_quotes(self, tmp_path: Path, kind: str) -> None:
        store, reopen = store_of(kind, tmp_path / "s.sqlite")
        guard = Guard(store=store)
        quoted = "the retry ceiling is seven, read from agent.yaml by the deploy job"
        turn = f"assistant: as the tool said, {quoted}"
        guard.record_source(SOURCE, "config_read", source_id="config")
        guard.record_source(turn, "assistant_turn", source_id="turn")
        guard(lambda text: quoted, summarizer="s")(SOURCE)  # the turn's words, a summary's now
        assert store.evict("config")
        again = f" {turn}\n"
        guard.record_source(again, "assistant_turn", source_id="again")
        later = Guard(store=reopen())
        for deciding in (guard, later):
            assert "config" in deciding.provenance([again]).sources
            decision = deciding.check([again], summarizer="s", enforce=False)
            assert decision.effect == "deny" and "config" in decision.dead_sources


class TestAStoreDownWithADeadSourceCached:
    """A tool output recorded as a source, holding a summary's text, then evicted: with the
    store up it hides nothing (the summary inside it is found, its base gone: refused). With the
    store down, the guard that recorded it still found its text whole in its cache, and read it
    as a source not known to be dead: the summary inside was hidden, the message read as original
    content (depth 0), and original content is allowed with every source dead. Re-summarizing a
    summary whose sources are gone was allowed for as long as the store was down."""

    SHAPES: ClassVar[list[str]] = ["message", "padded", "list", "region"]

    @staticmethod
    def recorded(store: Store, shape: str) -> tuple[Guard, Any]:
        """The guard that recorded the tool output (caching it), and the input of `shape`."""
        guard = Guard(store=store)
        summary = "Summary: the billing job retries up to retry_ceiling = 7."
        output = f"tool output: the last run said {summary} and exited 0"
        guard.record_source(output, "tool_output", "tool")  # before the summary: evidence
        guard.record_source(SOURCE, "config_read", "cfg")
        assert guard(lambda text: summary, summarizer="s")(SOURCE) == summary
        assert store.evict("tool") and store.evict("cfg")
        value: Any = {
            "message": output,
            "padded": f"  {output}\n",
            "list": [output, SOURCE],
            "region": [Region.original(output)],
        }[shape]
        assert guard.check(value, summarizer="p").effect == "deny"  # the store up
        return guard, value

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @pytest.mark.parametrize("shape", SHAPES)
    def test_it_is_refused_while_the_store_is_down(
        self, tmp_path: Path, kind: str, shape: str
    ) -> None:
        store, _ = store_of(kind, tmp_path / "s.db")
        guard, value = self.recorded(store, shape)
        with store_down(store):
            assert guard.provenance(value).depth >= 1
            decision = guard.check(value, summarizer="p")
            assert decision.effect == "deny" and decision.rule == "live-sources"
            with pytest.raises(UnsafeRecompactionError):
                guard(lambda text: "never", summarizer="s")(value)

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @pytest.mark.parametrize("shape", SHAPES)
    def test_it_is_refused_whichever_store_call_fails(
        self, tmp_path: Path, kind: str, shape: str
    ) -> None:
        """One dropped call was enough: any one of the view's reads failing (MemoryStore's
        view makes five) allowed it on the old code. Every call of the decision, failing
        alone, refuses it; so does none failing."""
        store, _ = store_of(kind, tmp_path / "s.db")
        guard, value = self.recorded(store, shape)
        with one_fault([store], 0) as calls:
            assert guard.check(value, summarizer="p").effect == "deny"
        assert "view" in calls and len(calls) >= 2  # the sweep is not vacuous
        for at in range(1, len(calls) + 1):
            with one_fault([store], at) as made:
                decision = guard.check(value, summarizer="p")
            assert decision.effect == "deny", (at, made)


class TestAClosureWalkedAfterItsSummaryLeftTheCache:
    """Found by `tests/test_property_scan.py::ScanWindows` at 20x (seed 4848). A guard with a
    small cache read a window holding one of its summaries and three sources another process
    had registered: learning those evicted the summary, found and walked in the same pass, and
    its closure was kept as if the summary were cached. The other process then recorded the same
    text from another source (merged in the store), which died; the guard learnt the grown entry
    back as new, kept the closure, and allowed the summary on the sources it had before."""

    HEADER = "tool output header shared by the nightly jobs: "
    QUOTED = HEADER + "retry ceiling is seven"  # a summary inside the next one
    SUMMARY = QUOTED + " and the rest of that report"
    TURN = "a twelfth text, plain, about the backoff of the retry loop"
    JITTER = "jitter settings were tuned again; the deploy window is closed now"

    def test_a_source_the_summary_gained_elsewhere_is_read_and_refused_dead(
        self, tmp_path: Path
    ) -> None:
        path = tmp_path / "store.sqlite"
        guard, other = Guard(store=SQLiteStore(path), max_texts=3), Guard(store=SQLiteStore(path))
        other.record_source("base two: what the summary was first made from", "config_read", "b2")
        other.record_source("base three: what it was made from again, later", "config_read", "b3")
        report = "summary of the deploy window and its backoff jitter settings then " + self.QUOTED
        other.ledger.record_summary(self.QUOTED, other.ledger.resolve(report, "w").region, "w")
        other.record_source(self.TURN, "tool_output", "turn")
        other.record_source(self.JITTER, "tool_output", "jitter")
        other.record_source(self.JITTER + "ok fine", "tool_output", "jitter-ok")
        guard.ledger.record_summary(self.SUMMARY, Region("r2", sources=frozenset({"b2"})), "w")
        window = self.JITTER + "ok fine " + report + self.TURN + self.SUMMARY
        guard.ledger.resolve(window, "w")  # (the summary found, walked and evicted in one pass)
        other.ledger.record_summary(self.SUMMARY, Region("r3", sources=frozenset({"b3"})), "w")
        other.store.evict("b3")

        value = self.TURN + "\n" + self.SUMMARY
        assert guard.provenance(value, "w").sources == {"turn", "b2", "b3"}
        decision = guard.check(value, summarizer="s")
        assert decision.effect.value == "deny" and decision.dead_sources == ("b3",)


class TestASourceSummarizedElsewhereWhileTheStoreIsDown:
    """A guard caches a text as a source; another process is granted a summary whose output is
    that very text (a summarizer handing a turn back verbatim), resting on content no store
    holds. With the store down the first guard cannot learn that: its cache still says source.
    It allowed the text as original content; a text it does not cache it refuses as
    unverifiable, so what the cache held decided. Found by the `Provenance` property at 20x
    (seed 5050: a one-text cache, a second guard on one MemoryStore, every store call failing)."""

    TEXT = "the retry ceiling applies to the billing ops team only"

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_it_is_refused_while_the_store_is_down(self, tmp_path: Path, kind: str) -> None:
        store, reopen = store_of(kind, tmp_path / "s.db")
        cached, other = Guard(store=store), Guard(store=reopen())
        cached.record_source(self.TEXT, "config_read", "cfg")
        handed_back = other(lambda text: self.TEXT, summarizer="s")("a turn no store holds")
        assert handed_back == self.TEXT and other.provenance(self.TEXT).depth == 1
        summarize = cached(lambda text: "never", summarizer="s")
        with store_down(store), pytest.raises(UnsafeRecompactionError) as refused:
            summarize(self.TEXT)
        assert refused.value.store_failed
        # the store up, the guard learns the summary and refuses it on its own terms
        with pytest.raises(UnsafeRecompactionError) as refused:
            summarize(self.TEXT)
        assert not refused.value.store_failed and refused.value.decision.rule == "live-sources"
