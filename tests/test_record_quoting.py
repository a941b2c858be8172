"""`Ledger.record_source` decides whether a new text quotes a known summary without resolving it
when it quotes none (`Ledger._may_quote_summaries`): what it records must be what resolving it
whole records (docs/inputs.md), for every text: a known text again, one quoting summaries or
sources whole, inside, stripped or with whitespace around them, short ones, and with a cache too
small to hold every text (the store asked by anchor)."""

from __future__ import annotations

from typing import Any
from unittest import mock

import deep
from hypothesis import example, given, settings
from hypothesis import strategies as st

from policyhook import MemoryStore, Region
from policyhook._provenance import KeyedHashes, Ledger

WORDS = ["retry", "ceiling", "vault", "jitter", "backoff", "ok", "zone", "key", "the"]
_SECRET = b"s" * 32

#: Steps: record a source, record a summary of some known texts, or record a turn made of
#: pieces (words, a known text as it is, stripped, or with whitespace around it).
_PIECE = st.one_of(
    st.lists(st.sampled_from(WORDS), min_size=1, max_size=8).map(" ".join),
    st.tuples(st.just("known"), st.integers(0, 30), st.sampled_from(["", " ", "\n", "  \n"])),
)
_STEP = st.one_of(
    st.tuples(st.just("source"), st.lists(st.sampled_from(WORDS), min_size=1, max_size=12)),
    st.tuples(st.just("summary"), st.lists(st.integers(0, 30), min_size=1, max_size=3)),
    st.tuples(st.just("turn"), st.lists(_PIECE, min_size=1, max_size=5)),
    # A known text (a source's, mostly) recorded as a summary of some known texts after.
    st.tuples(st.just("again"), st.integers(0, 30), st.lists(st.integers(0, 30), max_size=3)),
)


def _ledger(max_texts: int) -> Ledger:
    store = MemoryStore()
    store._secret = _SECRET  # both ledgers give every text the same digest and id
    store._hashes = KeyedHashes(_SECRET)  # (the store's own hashes: keyed with it too)
    return Ledger(store, max_texts=max_texts)


class TestRecordedAsResolvingWhole:
    @deep.scaled(settings(max_examples=150, deadline=None))
    @given(steps=st.lists(_STEP, min_size=1, max_size=25), max_texts=st.sampled_from([3, 1000]))
    @example(  # a turn quoting a summary-bearing turn the 3-text cache dropped meanwhile
        steps=[
            ("source", ["retry", "retry", "retry"]),
            ("summary", [0]),
            ("turn", [("known", 1, ""), ("known", 0, "")]),
            ("source", ["retry"]),
            ("turn", [("known", 2, ""), ("known", 0, "")]),
        ],
        max_texts=3,
    )
    @example(  # a turn given again with whitespace around it, after a text it quotes was
        # recorded as a summary (found at POLICYHOOK_DEEP=10: its stripped form's entry, a
        # source recorded before, answered "quotes no summary")
        steps=[
            ("source", ["retry", "retry", "retry"]),
            ("turn", ["retry", ("known", 0, "")]),
            ("again", 0, []),
            ("turn", [("known", 1, " ")]),
        ],
        max_texts=3,
    )
    def test_each_text_is_recorded_as_when_resolved_whole(
        self, steps: list[tuple[Any, ...]], max_texts: int
    ) -> None:
        """Two ledgers, one always resolving the new text whole (the path before the check),
        record the same texts: every store entry and every Source returned is the same."""
        fast, whole = _ledger(max_texts), _ledger(max_texts)
        texts: list[str] = []
        with mock.patch.object(whole, "_may_quote_summaries", return_value=True):
            for number, step in enumerate(steps):
                text = self._text(step, texts, number)
                if text is None:
                    continue
                if step[0] in ("summary", "again"):
                    for ledger in (fast, whole):
                        rest = [texts[i % len(texts)] for i in step[-1]]
                        ledger.record_summary(text, ledger.resolve(rest, "w").region, "w")
                else:
                    got = [ledger.record_source(text, "turn") for ledger in (fast, whole)]
                    assert got[0] == got[1]
                texts.append(text)
                key = fast._message_digests(text, text.encode())[0]
                assert fast.store.lookup([key]) == whole.store.lookup([key])
        final = [ledger.resolve(texts, "w").region for ledger in (fast, whole)] if texts else []
        assert not final or final[0] == final[1]

    @staticmethod
    def _text(step: tuple[Any, ...], texts: list[str], number: int) -> str | None:
        if step[0] == "source":
            return " ".join(step[1]) + f" {number}"
        if step[0] == "again":
            return texts[step[1] % len(texts)] if texts else None
        if step[0] == "summary":
            if not texts:
                return None
            if number % 3 == 0:  # short: recognised only whole (stripped), never inside
                return f"ok {number}"
            return f"summary {number}: " + " ".join(WORDS[: 1 + number % len(WORDS)])
        parts = []
        for piece in step[1]:
            if isinstance(piece, str):
                parts.append(piece)
            elif texts:
                _, which, space = piece
                known = texts[which % len(texts)]
                parts.append(space + (known.strip() if space else known) + space)
        return " ".join(parts) if parts and "".join(parts).strip() else None

    def test_a_turn_quoting_a_summary_inside_is_still_summary_bearing(self) -> None:
        """The check finds the summary, so the turn is resolved and recorded resting on it."""
        ledger = _ledger(1000)
        ledger.record_source("the retry ceiling is seven, from the config", "config")
        summary = "summary: retries are capped at seven by the config file"
        ledger.record_summary(summary, Region("r:x", sources=frozenset({"config"})), "w")
        ledger.record_source(f"assistant: as said, {summary}, so no more", "turn", "t1")
        entry = ledger.resolve("assistant: as said, " + summary + ", so no more", "w").region
        assert entry.depth == 1 and "t1" in entry.sources and "config" in entry.sources

    def test_a_text_another_ledger_made_a_summary_since_is_recorded_as_one(self) -> None:
        """A text this ledger holds as a source that another ledger on the store recorded as a
        summary since: caught up before the check, it is recorded summary-bearing."""
        store = MemoryStore()
        mine, other = Ledger(store), Ledger(store)
        text = "the deploy window closed at noon and the jitter was high"
        mine.record_source(text, "turn")
        other.record_summary(text, Region("r:x", depth=1, sources=frozenset({"cfg"})), "w")
        mine.record_source(text, "turn", "again")
        key = mine._message_digests(text, text.encode())[0]
        assert "again" in store.lookup([key])[key].sources
        assert mine.resolve(text, "w").region.depth >= 1

    def test_a_source_another_ledger_made_a_summary_is_found_quoted_inside(self) -> None:
        """A text with no key by content (no cut byte: anchored in the sources' automata) held
        as a source, recorded as a summary by another ledger since: a turn quoting it inside is
        recorded summary-bearing (the search for summaries runs the sources' pool while it is
        promoted), as when the same ledger records it as a summary."""
        for same in (False, True):
            store = MemoryStore()
            mine = Ledger(store)
            other = mine if same else Ledger(store)
            text = "the retry ceiling is 7 for the billing ops team"
            assert mine._index._key_of(text.encode()) is None  # anchored, not keyed
            mine.record_source(text, "config", "cfg")
            other.record_summary(text, Region("r:x", depth=1, sources=frozenset({"gone"})), "w")
            turn = f"assistant: as noted, {text}, so on"
            mine.record_source(turn, "turn", "t1")
            region = mine.resolve(turn, "w").region
            assert region.depth >= 1 and "gone" in region.sources, same

    def test_a_short_summary_with_whitespace_around_it_is_recorded_as_bearing_it(self) -> None:
        """A summary too short to be searched inside longer text, registered again as a turn
        with the whitespace a chat adds: found by its stripped form, as `_resolve` finds it."""
        ledger = _ledger(1000)
        ledger.record_summary("ok, capped", Region("r:x", sources=frozenset({"cfg"})), "w")
        ledger.record_source("\nok, capped\n", "turn", "t1")
        found = ledger.resolve("\nok, capped\n", "w").region
        assert found.depth == 1 and {"cfg", "t1"} <= found.sources
