"""A source gone from the store (evicted, expired) whose text comes back in the input verbatim.

That text is content the call reads, as unrecognised content is. A guard finds it as the dead
source when it can (its text cached, or the whole message looked up by digest) and as
unrecognised content when it cannot (its text never cached in this process: nothing to search
for). Which one is the cache's doing, so it must never change a decision: with
`archive_originals` both store the text again (the source's id revived, or a new id), and
summaries of the output are allowed; without it both rest on a source no store holds, and are
refused. The output check grounds facts on it either way.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Collection
from pathlib import Path

import pytest

from policyhook import (
    Guard,
    MemoryStore,
    Region,
    Source,
    SourceIdConflictError,
    SQLiteStore,
    UnsafeRecompactionError,
    request,
)
from policyhook._provenance import Entry
from policyhook.testing import capture_decisions

CONFIG = (
    "deploy.yaml, as read at the start of the session: retry ceiling 7 for the deploy job, "
    "timeouts after 30 s per attempt, rollback on the third failure, alerts to #ops-deploys"
)
SHAPES: dict[str, Callable[[str], list[str]]] = {
    "whole": lambda text: [text, "and then the deploy timed out again"],
    "padded": lambda text: [f"\n{text}  \n", "and then the deploy timed out again"],
    "embedded": lambda text: [f"tool output follows:\n{text}\nend of tool output"],
}


def summarized(store: MemoryStore, summary: str, **sources: str) -> Guard:
    """A guard on `store` that recorded the live source `base`, then `sources` (id=text), then
    `summary` as a summarizer's output made of `base` (recorded as such)."""
    guard = Guard(store=store)
    guard.record_source("the live base of the summary", "tool_output", source_id="base")
    for source_id, text in sources.items():
        guard.record_source(text, "tool_output", source_id=source_id)
    guard.ledger.record_summary(summary, guard.provenance(["the live base of the summary"]), "w")
    return guard


def summarizer() -> Callable[[object], str]:
    """A new summary every pass (one recorded text each), stating one fact of the config."""
    passes = iter(["first", "second", "third"])
    return lambda messages: f"Summary, {next(passes)} pass: the deploy job's retry ceiling is 7."


def restarted(tmp_path: Path, cached: bool, **options: object) -> tuple[Guard, SQLiteStore]:
    """A guard over a store whose config was recorded, then evicted. `cached`: the same guard
    that recorded it (its text in memory); otherwise a new process's, which never saw it."""
    store = SQLiteStore(tmp_path / "store.db")
    recorder = Guard(store=store, **options)  # type: ignore[arg-type]
    recorder.record_source(CONFIG, "config_read", source_id="cfg")
    assert store.evict("cfg")
    if cached:
        return recorder, store
    store = SQLiteStore(tmp_path / "store.db")
    return Guard(store=store, **options), store  # type: ignore[arg-type]


@pytest.mark.parametrize("shape", sorted(SHAPES))
@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
class TestWhateverTheCacheHeld:
    def test_archived_again_and_its_summaries_allowed(
        self, tmp_path: Path, cached: bool, shape: str
    ) -> None:
        guard, store = restarted(tmp_path, cached, archive_originals=True)
        summarize = guard(summarizer(), summarizer="s")
        value = SHAPES[shape](CONFIG)
        with capture_decisions(guard, phase="input") as seen, request(window="w"):
            output = summarize(value)
            assert summarize([output]).startswith("Summary, ")
        first, second = (activation["region"] for _, activation in seen)
        assert first["depth"] == 0 and first["dead_sources"]  # the text: dead at decision time
        assert second["depth"] == 1 and not second["dead_sources"]
        assert any(text == CONFIG or CONFIG in text for _, text in store.sources(10))
        found_as_the_source = cached or shape != "embedded"  # else: unrecognised, a new id
        assert store.states(["cfg"]) == {"cfg": "live" if found_as_the_source else "evicted"}
        assert ("cfg" in guard.provenance([output]).sources) == found_as_the_source

    def test_without_archive_originals_its_summaries_are_refused(
        self, tmp_path: Path, cached: bool, shape: str
    ) -> None:
        guard, store = restarted(tmp_path, cached)
        summarize = guard(summarizer(), summarizer="s")
        output = summarize(SHAPES[shape](CONFIG))  # originals: allowed
        with pytest.raises(UnsafeRecompactionError, match="live-sources"):
            summarize([output])
        assert store.states(["cfg"]) == {"cfg": "evicted"}
        assert all(CONFIG not in text for _, text in store.sources(10))

    def test_its_facts_are_grounded_on_it(self, tmp_path: Path, cached: bool, shape: str) -> None:
        """The output's "retry ceiling of 7" is stated by the text in the input: grounded,
        not unverifiable (only dead sources state it), with or without archiving."""
        guard, _ = restarted(tmp_path, cached)
        with capture_decisions(guard, phase="output") as seen:
            guard(summarizer(), summarizer="s")(SHAPES[shape](CONFIG))
        ((decision, activation),) = seen
        facts = activation["summary"]
        assert decision.effect == "allow"
        assert facts["grounded"] >= 1 and facts["unverifiable"] == 0 and facts["ungrounded"] == 0


@pytest.mark.parametrize("cached", [True, False, None], ids=["cached", "restarted", "small-cache"])
class TestInsideARegionsText:
    """A `Region`'s unrecognised text is the caller's declared content (neither a gap nor
    archived). A dead source's text inside it is found as that source only where a cache still
    holds the text (the store keeps none), so it is declared content too: whatever the cache
    held, a summary inside the Region decides the call."""

    TURN = "the deploy job failed twice today; its retry ceiling is 7 per run"

    def summary_then_evicted(
        self, tmp_path: Path, cached: bool | None, quoted: str | None = None
    ) -> tuple[Guard, str]:
        """A summary of a held turn, then the config recorded and evicted; the guard that saw
        it all, or a restarted one (`None`: caching one text, so that it asks the store by
        anchor, and finds the config's tombstone inside the Region's text)."""
        store = SQLiteStore(tmp_path / "store.db")
        recorder = Guard(store=store)
        recorder.record_source(self.TURN, "tool_output", source_id="turn")
        summary = recorder(lambda messages: "Summary: the retry ceiling is 7.", summarizer="s")(
            [self.TURN]
        )
        recorder.record_source(CONFIG, "config_read", source_id="cfg")
        if quoted is not None:  # a summary of the config that is a piece of its text
            assert recorder(lambda messages: quoted, summarizer="s")([CONFIG]) == quoted
        assert store.evict("cfg")
        if cached:
            return recorder, summary
        small = {"max_texts": 1} if cached is None else {}
        return Guard(store=SQLiteStore(tmp_path / "store.db"), **small), summary  # type: ignore[arg-type]

    @pytest.mark.parametrize("sep", ["\n", " ", ""])
    def test_the_summary_inside_decides(
        self, tmp_path: Path, cached: bool | None, sep: str
    ) -> None:
        guard, summary = self.summary_then_evicted(tmp_path, cached)
        value = [Region.original(f"{summary}{sep}{CONFIG}")]
        region = guard.provenance(value)
        assert (region.depth, region.sources) == (1, frozenset({"turn"}))
        assert guard.check(value, summarizer="s").effect == "allow"

    def test_a_summary_of_many_sources_inside(self, tmp_path: Path, cached: bool | None) -> None:
        """The same with a summary resting on 300 sources (past the ledger's grown-set bound:
        its sets are not copied) and another message beside the Region."""
        guard, _ = self.summary_then_evicted(tmp_path, cached)
        turns = [f"turn {i}: the deploy job ran step {i} of the rollout" for i in range(300)]
        for i, turn in enumerate(turns):
            guard.record_source(turn, "tool_output", source_id=f"t{i}")
        big = guard(lambda messages: "Summary: every rollout step ran.", summarizer="s")(turns)
        value = [Region.original(f"{big}\n{CONFIG}"), turns[0]]
        region = guard.provenance(value)
        assert region.depth == 1 and region.sources == {f"t{i}" for i in range(300)}
        assert guard.check(value, summarizer="s").effect == "allow"
        guard.store.evict("t7")
        decision = guard.check(value, summarizer="s")
        assert decision.effect == "deny" and decision.dead_sources == ("t7",)

    def test_it_hides_no_summary_inside_it(self, tmp_path: Path, cached: bool | None) -> None:
        """A dead source is unknown text there, so a summary inside it is found as a guard that
        cannot find the source finds it: resting on the dead config, refused by every guard."""
        inner = "retry ceiling 7 for the deploy job"
        guard, summary = self.summary_then_evicted(tmp_path, cached, quoted=inner)
        assert inner in CONFIG
        value = [Region.original(f"{summary}\n{CONFIG}")]
        region = guard.provenance(value)
        assert region.depth == 1 and region.sources == {"turn", "cfg"}
        decision = guard.check(value, summarizer="s")
        assert decision.effect == "deny" and decision.dead_sources == ("cfg",)

    def test_nor_in_a_plain_message(self, tmp_path: Path, cached: bool | None) -> None:
        """The same in a plain message: a guard caching the config found it, dead, covering the
        summary inside it, and allowed the message as original content (depth 0) where any
        other guard finds the summary and refuses."""
        inner = "retry ceiling 7 for the deploy job"
        guard, _ = self.summary_then_evicted(tmp_path, cached, quoted=inner)
        value = [f"tool output follows:\n{CONFIG}\nend of tool output"]
        region = guard.provenance(value)
        assert region.depth == 1 and "cfg" in region.sources
        decision = guard.check(value, summarizer="s")
        assert decision.effect == "deny" and "cfg" in decision.dead_sources

    def test_declared_as_its_source_it_is_dead(self, tmp_path: Path, cached: bool | None) -> None:
        """What the caller declares a Region rests on is kept: a dead source, refused."""
        guard, summary = self.summary_then_evicted(tmp_path, cached)
        value = [Region.original(f"{summary}\n{CONFIG}", [Source("cfg", "config_read")])]
        assert guard.provenance(value).sources == {"turn", "cfg"}
        decision = guard.check(value, summarizer="s")
        assert decision.effect == "deny" and decision.rule == "live-sources"

    def test_beside_the_region_it_is_dead(self, tmp_path: Path, cached: bool | None) -> None:
        """The same text as a message of its own is found either way (looked up whole): dead."""
        guard, summary = self.summary_then_evicted(tmp_path, cached)
        value = [Region.original(summary), CONFIG]
        assert guard.provenance(value).sources == {"turn", "cfg"}
        assert guard.check(value, summarizer="s").effect == "deny"

    def test_a_live_source_inside_is_kept(self, tmp_path: Path, cached: bool | None) -> None:
        """Only a dead one is declared content: a held source found inside stays a source."""
        guard, summary = self.summary_then_evicted(tmp_path, cached)
        other = "runbook.md: page the on-call engineer after the third failed deploy in a row"
        guard.record_source(other, "config_read", source_id="runbook")
        value = [Region.original(f"{summary}\n{other}")]
        assert guard.provenance(value).sources == {"turn", "runbook"}
        assert guard.check(value, summarizer="s").effect == "allow"


@pytest.mark.parametrize("tombstones", [0, 1024], ids=["forgotten", "tombstone-kept"])
@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
def test_a_dead_source_given_whole_hides_no_summary(cached: bool, tombstones: int) -> None:
    """A dead source the store no longer knows (no tombstone kept), its whole text given back
    as a message, holding a summary's text: a guard still caching the source found it whole
    (depth 0) and allowed, where a guard that cannot find it found the summary inside and
    refused (the cache decided). Given whole, a dead source hides nothing it holds either,
    whether the store still keeps its tombstone (found whole by digest) or not."""
    store = MemoryStore(max_tombstones=tombstones)
    inner = "retry ceiling 7 for the deploy job"
    assert inner in CONFIG
    recorder = summarized(store, inner, cfg=CONFIG)
    assert store.evict("cfg")
    guard = recorder if cached else Guard(store=store)
    region = guard.provenance([CONFIG])
    assert region.depth == 1 and "base" in region.sources
    decision = guard.check([CONFIG], summarizer="s", enforce=False)
    assert decision.effect == "deny" and decision.dead_sources


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
def test_a_dead_source_inside_a_dead_source_hides_nothing(cached: bool) -> None:
    """A dead source whose text lies inside another dead source's, the summary inside the
    inner one: where a guard uncovered the outer source it still skipped past the inner one
    whole, so the summary in it went unseen where both were cached (allowed), and found where
    neither was (refused). Nested, a dead source hides nothing either."""
    store = MemoryStore(max_tombstones=0)
    outer = CONFIG + "\nand the deploy runbook, read after it: page the on-call owner first"
    recorder = summarized(store, "retry ceiling 7 for the deploy job", cfg=CONFIG, runbook=outer)
    assert store.evict("cfg") and store.evict("runbook")
    guard = recorder if cached else Guard(store=store)
    region = guard.provenance([outer])
    assert region.depth == 1 and "base" in region.sources
    assert guard.check([outer], summarizer="s", enforce=False).effect == "deny"


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
def test_a_source_quoting_a_dead_source_keeps_the_summary_inside_it(cached: bool) -> None:
    """A new source quoting a dead source whose text holds a summary: the guard recording it
    found the dead source covering the summary and recorded the new text as plain evidence
    (depth 0), where one that cannot find the dead source records it resting on the summary.
    Its record now keeps the summary's depth and sources either way, so the new text given
    back is judged as summary-bearing (depth 1), never allowed as original evidence. The dead
    source's text in it is the new source's own (it holds it, live), whichever guard recorded
    it: the record rests on the new source, not the dead one, and so is decided the same."""
    store = MemoryStore(max_tombstones=0)
    recorder = summarized(store, "retry ceiling 7 for the deploy job", cfg=CONFIG)
    assert store.evict("cfg")
    guard = recorder if cached else Guard(store=store)
    quoting = "the agent pasted the config back: " + CONFIG
    guard.record_source(quoting, "ai_turn", source_id="turn")
    for reader in (guard, Guard(store=store)):  # this guard, and one restarted since
        region = reader.provenance([quoting])
        assert region.depth == 1 and region.sources == {"base", "turn"}
        decision = reader.check([quoting], summarizer="s", enforce=False)
        assert decision.depth == 1 and decision.allowed, decision.message


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
def test_a_dead_source_that_is_a_summary_with_whitespace_around_it_is_that_summary(
    cached: bool,
) -> None:
    """A message that is a dead source's whole text, that text a summary's with whitespace
    around it (the summary recorded after the source): a guard still caching the source found
    it covering the summary and refused on it, one that cannot find it read the message as
    the summary (whitespace around a known text) and allowed. Both read it as the summary now.
    Found by a deep run of the stateful property test."""
    store = MemoryStore()
    summary = "retry ceiling 7 for the deploy job, as summarized"
    message = f"\n{summary} \t"
    recorder = summarized(store, summary, padded=message)
    assert store.evict("padded")
    guard = recorder if cached else Guard(store=store)
    region = guard.provenance([message])
    assert region.depth == 1 and region.sources == {"base"}
    decision = guard.check([message], summarizer="s", enforce=False)
    assert decision.allowed, decision.message


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
@pytest.mark.parametrize("sep", [" ", "\n\t"], ids=["space", "newline"])
def test_a_dead_source_of_a_summary_and_whitespace_inside_a_longer_unit_is_that_summary(
    cached: bool, sep: str
) -> None:
    """The same inside a longer unit: a dead source whose text is a summary's and whitespace,
    followed by a live source. A guard caching the dead source rested on its id as well as on
    the summary inside it and refused; one that cannot find it read the summary, whitespace
    (no content) and the live source, and allowed. It holds nothing of its own, so both read
    it as the summary now, with the same characters. Found by a deep run of the stateful
    property test (through the test's oracle, which counted that source's text as content)."""
    store = MemoryStore()
    summary = "retry ceiling 7 for the deploy job, as summarized"
    padded = f"{sep}{summary}{sep}"
    recorder = summarized(store, summary, padded=padded, turn=CONFIG)
    assert store.evict("padded")
    guard = recorder if cached else Guard(store=store)
    unit = f"{padded}{CONFIG}"
    region = guard.provenance([unit])
    assert region.depth == 1 and region.sources == {"base", "turn"}
    assert region.chars == len(summary) + len(CONFIG)  # (whitespace is no content)
    assert guard.check([unit], summarizer="s", enforce=False).allowed


SUMMARY = "retry ceiling 7 for the deploy job, as summarized"
#: Dead sources holding nothing of their own, each beside another known text: (the sources,
#: evicted, then the live turn CONFIG; the unit). Nested: one inside the other; running on:
#: its last bytes the first of the turn, which runs past its end; two: one holding the
#: summary, the other the summary and the turn; nested again, with non-ASCII whitespace.
HOLDING_NOTHING = {
    "nested": ({"inner": f" {SUMMARY}\n", "outer": f"\n {SUMMARY}\n "}, f"\n {SUMMARY}\n {CONFIG}"),
    "running-on": ({"dead": f" {SUMMARY} {CONFIG[:30]}"}, f" {SUMMARY} {CONFIG}"),
    "two": ({"padded": f" {SUMMARY}\n", "joined": f"{SUMMARY}\n{CONFIG}"}, f" {SUMMARY}\n{CONFIG}"),
    "non-ascii-nested": (
        {"inner": f"\u00a0{SUMMARY}\u3000", "outer": f"\u3000\u00a0{SUMMARY}\u3000\u2003"},
        f"\u3000\u00a0{SUMMARY}\u3000\u2003{CONFIG}",
    ),
}


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
@pytest.mark.parametrize("shape", sorted(HOLDING_NOTHING))
def test_dead_sources_holding_only_known_texts_and_whitespace_are_those_texts(
    shape: str, cached: bool
) -> None:
    """The same, wherever the texts lie: a dead source nested in another, one whose last bytes
    start a known text that runs past its end, and one covered by a summary and the turn
    beside another dead one. A guard caching them found them and refused on their ids (and,
    running on, on the turn's tail as unrecognised content); one that cannot find them read
    the summary, whitespace and the turn, and allowed. Every byte of theirs that is not
    whitespace lies in a known text, so both read them as those texts now."""
    sources, unit = HOLDING_NOTHING[shape]
    store = MemoryStore()
    recorder = summarized(store, SUMMARY, **sources, turn=CONFIG)
    for source_id in sources:
        assert store.evict(source_id)
    guard = recorder if cached else Guard(store=store)
    region = guard.provenance([unit])
    assert region.depth == 1 and region.sources == {"base", "turn"}
    assert region.chars == len(SUMMARY) + len(CONFIG)
    assert guard.check([unit], summarizer="s", enforce=False).allowed


@pytest.mark.parametrize("max_texts", [65_536, 1], ids=["cached", "small-cache"])
def test_a_dead_source_running_past_a_found_text_hides_nothing_it_holds(max_texts: int) -> None:
    """A dead source starting inside a live source's text found in the message and running past
    it, over a summary and a byte of content of its own: the summary inside it is found, as
    where the dead source is not. Taking its end for its own (as a live text's end is) hid the
    summary, and the message read as original content (depth 0): re-summarizing a summary
    whose sources are gone was allowed by every guard that found the dead source. Found by
    `test_dead_sources_cut_anywhere_decide_nothing` at 50x."""
    store = MemoryStore()
    guard = Guard(store=store, max_texts=max_texts)
    message = f"{CONFIG}{SUMMARY}zqdx own words"
    guard.record_source(message[1 : len(CONFIG) + len(SUMMARY) + 1], "tool_output", "dead")
    guard.record_source("the live base of the summary", "tool_output", source_id="base")
    guard.record_source(CONFIG, "config_read", source_id="turn")
    guard.ledger.record_summary(SUMMARY, guard.provenance(["the live base of the summary"]), "w")
    assert store.evict("dead") and store.evict("base")
    for reader in (guard, Guard(store=store)):
        region = reader.provenance([message])
        assert region.depth == 1 and "base" in region.sources
        decision = reader.check([message], summarizer="s", enforce=False)
        assert decision.effect == "deny" and "base" in decision.dead_sources


@pytest.mark.parametrize("max_texts", [65_536, 1], ids=["cached", "small-cache"])
def test_a_summary_overlapping_a_live_source_inside_a_dead_one_is_found(max_texts: int) -> None:
    """A dead source given whole, holding a live source that runs into a summary's first
    bytes: inside the dead source a text starting in the last one found and ending past it
    was skipped, so the summary went unseen (depth 0, allowed) by every guard that found the
    dead source, and was found (refused) by one that could not. Inside a dead source, the
    known texts are found as where it is not known: a summary's end is its own. Found by
    `test_dead_sources_cut_anywhere_decide_nothing` at 10x."""
    store = MemoryStore()
    guard = Guard(store=store, max_texts=max_texts)
    message = f"zqdx own words{SUMMARY}"
    guard.record_source(message, "tool_output", source_id="dead")
    guard.record_source(message[1:17], "tool_output", source_id="live")  # into SUMMARY's start
    guard.record_source("the live base of the summary", "tool_output", source_id="base")
    guard.ledger.record_summary(SUMMARY, guard.provenance(["the live base of the summary"]), "w")
    assert store.evict("dead")
    for reader in (guard, Guard(store=store)):
        region = reader.provenance([message])
        assert region.depth == 1 and {"base", "live"} <= region.sources
        decision = reader.check([message], summarizer="s", enforce=False)
        assert decision.effect == "deny" and decision.dead_sources


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
@pytest.mark.parametrize("inside", [True, False], ids=["in-the-inner", "in-the-outer"])
def test_nested_dead_sources_with_content_of_their_own_are_refused(
    inside: bool, cached: bool
) -> None:
    """Nested dead sources, one of them holding a word of its own: that word is content no
    store holds, so the input is refused wherever the sources are found or not."""
    inner = f" {SUMMARY}\nx" if inside else f" {SUMMARY}\n"
    outer = f"\n{inner} " if inside else f"x\n{inner} "
    store = MemoryStore()
    recorder = summarized(store, SUMMARY, inner=inner, outer=outer, turn=CONFIG)
    assert store.evict("inner") and store.evict("outer")
    guard = recorder if cached else Guard(store=store)
    unit = f"{outer}{CONFIG}"
    region = guard.provenance([unit])
    assert region.depth == 1 and {"base", "turn"} < region.sources
    decision = guard.check([unit], summarizer="s", enforce=False)
    assert decision.effect == "deny" and decision.dead_sources


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
def test_a_regions_text_that_is_a_dead_source_of_a_short_summary_and_whitespace_is_that_summary(
    cached: bool,
) -> None:
    """A Region's text that is a dead source's whole text, that text a short summary's (under
    16 bytes: recognised only whole) with whitespace around it: the Region's text was searched
    as unknown text, where a short summary is never found, so it read as original (depth 0)
    and was allowed though the summary's sources are gone: a wrong allow. It is that summary
    now, as the same text given as a plain message is. Found by a deep run of the stateful
    property test (`POLICYHOOK_DEEP=30`)."""
    store = MemoryStore()
    guard = Guard(store=store, archive_originals=True)
    summary = "Retries: capped"
    padded = f" {summary}\n"
    guard(lambda value: "an earlier summary", summarizer="s")([padded])  # archived as it came
    guard(lambda value: summary, summarizer="s")([CONFIG])  # resting on CONFIG, archived
    assert sorted(text for _, text in store.sources(10)) == sorted([padded, CONFIG])
    for source, _ in store.sources(10):
        assert store.evict(source.id)
    reader = guard if cached else Guard(store=store)
    for value in ([Region.original(padded)], [padded]):
        assert reader.provenance(value).depth == 1
        decision = reader.check(value, summarizer="s", enforce=False)
        assert decision.effect == "deny" and decision.dead_sources, value


def test_a_record_made_between_a_decision_and_its_summary_changes_nothing_it_rests_on() -> None:
    """A turn decided on (resting on the source it quotes), then recorded as a source by another
    caller before the decision's summary is: the summary still rests on the quoted source (the
    record, which leaves quoted sources out, never stands in for the decision's provenance)."""
    store = MemoryStore()
    summary = "retry ceiling 7 for the deploy job, as summarized"
    guard = summarized(store, summary, cfg=CONFIG)
    turn = f"the agent pasted the config back:\n{CONFIG}\nand said: {summary}"
    decided = guard.ledger.resolve([turn], "w").region
    assert {"cfg", "base"} <= decided.sources
    guard.record_source(turn, "ai_turn", source_id="turn")  # meanwhile, another caller
    output = "Summary: the deploy job retries up to 7 times"
    guard.ledger.record_summary(output, decided, "w")
    assert {"cfg", "base"} <= Guard(store=store).provenance([output]).sources


def test_a_quoting_record_asks_no_liveness() -> None:
    """What a quoting record rests on never depends on whether a quoted source is live (the new
    source holds its text): recorded the same while the store cannot answer liveness, not
    failed or guessed."""

    class Failing(MemoryStore):
        down = False

        def live(self, ids: Collection[str]) -> frozenset[str]:
            if self.down:
                raise ConnectionError("store down")
            return super().live(ids)

    store = Failing(max_tombstones=0)
    guard = summarized(store, "retry ceiling 7 for the deploy job", cfg=CONFIG)
    assert store.evict("cfg")
    store.down = True
    guard.record_source("pasted back: " + CONFIG, "ai_turn", source_id="turn")
    store.down = False
    region = Guard(store=store).provenance(["pasted back: " + CONFIG])
    assert region.depth == 1 and region.sources == {"base", "turn"}


@pytest.mark.parametrize("evicted", ["before", "after"])
def test_a_live_source_quoted_beside_a_summary_is_the_new_sources_own(evicted: str) -> None:
    """A turn quoting a summary and a source: the turn holds the source's text verbatim, so
    its record rests on the summary and the turn, not on the quoted source, as a turn quoting
    no summary does (plain evidence). Whether that source was evicted before the turn was
    recorded or after, re-summarizing the turn is decided the same: allowed (it used to rest
    on the source when it was live at record, and was refused once it was evicted)."""
    store = MemoryStore()
    summary = "retry ceiling 7 for the deploy job, from the runbook"
    guard = summarized(store, summary, cfg=CONFIG)
    turn = f"the agent pasted the config back:\n{CONFIG}\nand said: {summary}"
    if evicted == "before":
        assert store.evict("cfg")
    guard.record_source(turn, "ai_turn", source_id="turn")
    if evicted == "after":
        assert store.evict("cfg")
    for reader in (guard, Guard(store=store)):  # this guard, and one restarted since
        region = reader.provenance([turn])
        assert region.depth == 1 and region.sources == {"base", "turn"}
        decision = reader.check([turn], summarizer="s", enforce=False)
        assert decision.allowed, decision.message


@pytest.mark.parametrize("cached", [True, False], ids=["cached", "restarted"])
def test_a_summarizer_emptying_its_input_list_changes_nothing(tmp_path: Path, cached: bool) -> None:
    """A summarizer that consumes the list it is given (`messages.clear()`, as a compacting
    loop may do in place) leaves the output checked and archived against the input as it was
    decided: the config's text in it grounds the output's "7" and is stored again."""
    guard, store = restarted(tmp_path, cached, archive_originals=True)
    passes = summarizer()

    def consuming(messages: list[str]) -> str:
        written = passes(messages)
        messages.clear()
        return written

    output = guard(consuming, summarizer="s")([CONFIG, "and then the deploy timed out again"])
    assert output.startswith("Summary, first pass")
    assert store.states(["cfg"]) == {"cfg": "live"}
    assert guard(summarizer(), summarizer="s")([output]).startswith("Summary, ")


def test_an_expired_source_is_archived_again() -> None:
    """Past the store's TTL is dead as evicted is: its text back in the input is stored again."""
    store = MemoryStore(ttl=0.05)
    guard = Guard(store=store, archive_originals=True)
    guard.record_source(CONFIG, "config_read", source_id="cfg")
    time.sleep(0.1)
    assert store.states(["cfg"]) == {"cfg": "expired"}
    summarize = guard(summarizer(), summarizer="s")
    output = summarize([CONFIG])
    assert store.states(["cfg"]) == {"cfg": "live"}
    assert summarize([output]).startswith("Summary, ")


def test_adapters_recording_summaries_themselves_archive_it_too(tmp_path: Path) -> None:
    """`Guard.record_summary` (no decision: the Claude Code adapter's PostCompact) archives the
    dead sources its input holds, as a granted call does."""
    guard, store = restarted(tmp_path, cached=False, archive_originals=True)
    (region,) = guard.record_summary("the deploy retries up to 7 times", of=[CONFIG, "a turn"])
    assert region.depth == 1 and "cfg" in region.sources
    assert store.states(["cfg"]) == {"cfg": "live"}
    assert guard.check(["the deploy retries up to 7 times"], summarizer="s").effect == "allow"


class Refusing(MemoryStore):
    """A store that will not take `cfg` again: `fault` raised on its put."""

    def __init__(self, fault: Callable[[], Exception]) -> None:
        super().__init__()
        self.fault, self.failing = fault, False

    def put_source(self, source: Source, text: str) -> None:
        if self.failing and source.id == "cfg":
            raise self.fault()
        super().put_source(source, text)


def refusing_guard(fault: Callable[[], Exception]) -> tuple[Guard, Refusing]:
    store = Refusing(fault)
    guard = Guard(store=store, archive_originals=True)
    guard.record_source(CONFIG, "config_read", source_id="cfg")
    store.evict("cfg")
    store.failing = True
    return guard, store


def test_a_store_that_cannot_take_the_id_back_leaves_it_dead(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A bounded store that forgot the id refuses it (`SourceIdConflictError`): not a store
    failure, the output is returned, and the source stays dead (its summaries refused)."""
    guard, store = refusing_guard(lambda: SourceIdConflictError("cfg", "is not known here"))
    summarize = guard(summarizer(), summarizer="s")
    with caplog.at_level(logging.WARNING, logger="policyhook"):
        output = summarize([CONFIG, "a turn"])
    assert caplog.text == ""
    assert output.startswith("Summary, ")
    assert store.states(["cfg"]) == {"cfg": "evicted"}
    with pytest.raises(UnsafeRecompactionError, match="live-sources"):
        summarize([output])


def test_a_store_failing_to_take_it_back_is_a_store_error(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """Any other failure is the store's: logged as one, the output still the caller's."""
    guard, store = refusing_guard(lambda: OSError(28, "No space left on device"))
    with caplog.at_level(logging.WARNING, logger="policyhook"):
        output = guard(summarizer(), summarizer="s")([CONFIG, "a turn"])
    assert output.startswith("Summary, ")
    assert "store put_source failed" in caplog.text
    assert CONFIG not in caplog.text  # no region text in the log
    assert store.states(["cfg"]) == {"cfg": "evicted"}


def test_a_store_failing_while_the_output_is_checked_grounds_nothing_on_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """The store failing while the output check looks for the input's dead sources (the guard
    caches one text: the rest is asked of the store): their texts vouch for nothing, so the
    number only the config states is ungrounded and the output refused (fail closed)."""

    class Failing(MemoryStore):
        failing = False

        def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
            if self.failing:
                raise OSError(5, "Input/output error")
            return super().lookup(digests)

    store = Failing()
    guard = Guard(store=store, max_texts=1)
    guard.record_source(CONFIG, "config_read", source_id="cfg")
    store.evict("cfg")
    passes = summarizer()

    def summarize(messages: object) -> str:
        store.failing = True  # after the decision, before the output is checked
        return passes(messages)

    with (
        caplog.at_level(logging.WARNING, logger="policyhook"),
        pytest.raises(UnsafeRecompactionError, match="ungrounded: number"),
    ):
        guard(summarize, summarizer="s")([CONFIG, "a turn"])
    assert "store lookup failed after 's' was granted; the output is checked without" in caplog.text
    assert CONFIG not in caplog.text
    store.failing = False
    assert guard(summarizer(), summarizer="s")([CONFIG, "a turn"]).startswith("Summary, ")
