"""The entries stores make of what they are given: the same as the provenance model's."""

from __future__ import annotations

import deep
from hypothesis import given, settings
from hypothesis import strategies as st

from policyhook import MemoryStore, Source
from policyhook._provenance import ANCHOR_BYTES, Entry, KeyedHashes, anchor_of, digest, encode

#: Texts around the anchor's length (in bytes: multi-byte letters), with lone surrogates.
_TEXTS = st.one_of(
    st.text(max_size=3 * ANCHOR_BYTES),
    st.text(alphabet=st.sampled_from("aé€😀\ud800"), min_size=ANCHOR_BYTES // 4, max_size=40),
    st.integers(0, 2 * ANCHOR_BYTES).map(lambda n: "x" * n),
)


class TestMemoryStoreSourceEntries:
    @deep.scaled(settings(max_examples=300, deadline=None))
    @given(texts=st.lists(_TEXTS, min_size=1, max_size=6, unique=True))
    def test_a_source_is_indexed_as_entry_of_source_makes_it(self, texts: list[str]) -> None:
        """A source put is found by its keyed digest and anchor, as `Entry.of_source` makes
        its entry from the key or from hashes keyed once: the entry the dataclass makes of
        `digest` and `anchor_of`."""
        store = MemoryStore()
        key = store.secret()
        for i, text in enumerate(texts):
            source = Source(f"src-{i}", "tool_output")
            store.put_source(source, text)
            data = encode(text)
            expected = Entry(  # the dataclass's own constructor, from `digest` and `anchor_of`
                digest(key, data),
                source.id,
                kind=source.kind,
                size=len(data),
                anchor=anchor_of(key, data),
                sources=(source.id,),
                source_kinds=(source.kind,),
            )
            assert Entry.of_source(key, source, text) == expected
            assert Entry.of_source(KeyedHashes(key), source, text) == expected
            assert store.lookup([digest(key, data)]) == {expected.digest: expected}
            anchor = anchor_of(key, data)
            if anchor is not None:
                assert expected in store.by_anchor([anchor])
            again = MemoryStore()  # another secret: another digest and anchor
            again.put_source(source, text)
            assert again.lookup([expected.digest]) == {}

    def test_the_digest_is_keyed_anew_for_each_text(self) -> None:
        """Two texts put one after the other get their own digests (the keyed hash is copied,
        never updated in place)."""
        store = MemoryStore()
        key = store.secret()
        store.put_source(Source("a", "k"), "the first text, long enough for an anchor")
        store.put_source(Source("b", "k"), "the second text, long enough for an anchor")
        for source_id, text in (
            ("a", "the first text, long enough for an anchor"),
            ("b", "the second text, long enough for an anchor"),
        ):
            found = store.lookup([digest(key, encode(text))])
            assert [e.id for e in found.values()] == [source_id]
            assert [e.id for e in store.by_anchor([anchor_of(key, encode(text)) or ""])] == [
                source_id
            ]


class TestMemoryStoreSummaryEntries:
    def test_a_summary_recorded_again_is_listed_once_under_its_anchor(self) -> None:
        """Recording the same text again merges it into its entry (one lookup of the earlier
        record): its anchor still lists one text, and `since` gives it once."""
        store = MemoryStore()
        key = store.secret()
        text = "retries are capped at 7 by the config read at startup"
        data = encode(text)
        anchor = anchor_of(key, data)
        assert anchor is not None
        first = Entry(digest(key, data), "s1", depth=1, anchor=anchor, sources=("cfg",))
        deeper = Entry(digest(key, data), "s2", depth=2, anchor=anchor, sources=("run",))
        store.put_summary(first, text)
        stored = store.put_summary(deeper, text)
        assert stored.id == "s1" and stored.depth == 2 and stored.sources == ("cfg", "run")
        assert store.by_anchor([anchor]) == [stored]
        assert [e for e, _ in store.since(0, 10)[1]] == [stored]
