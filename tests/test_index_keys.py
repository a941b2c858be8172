"""Texts found by content (`Index._keyed_hits`): the `_KEY` bytes right after or right before a
cut byte, looked up in a dict, must give every place such a text lies in an input, whatever the
input around it (cut bytes dense or absent, at its ends, across chunks), and nothing that a
search of the pieces of an input remembered by `_chunked` would miss later."""

from __future__ import annotations

from typing import ClassVar
from unittest import mock

import deep
from hypothesis import given, settings
from hypothesis import strategies as st
from index_history import placed

from policyhook import _index
from policyhook._index import _CHUNKED, _KEY, Index, _cuts

#: Bytes texts and inputs are drawn from: cut bytes (a newline, letters, a continuation byte)
#: among others, one in eight (keys of most texts) or one in two (few keys, short pieces).
_SPARSE = b"abcdefghilmnoprstuw ABCDEFGH.,;\n" + b"abcdefghilmnoprstuw ABCDEFGH.,vZ\x80"[:32]
_DENSE = b"ab c\nkvZ\x80"


def _found(index: Index, value: bytes) -> set[tuple[int, int, str]]:
    """The candidates that are the text they name (as the ledger confirms them)."""
    return {(s, e, d) for s, e, d in index.find(value) if value[s:e] == TEXTS[int(d[1:])]}


def _brute(value: bytes, count: int) -> set[tuple[int, int, str]]:
    return placed(value, TEXTS, set(range(count)))


#: A run of `_KEY` bytes with no cut byte: a key.
_RUN = b"0123456789abcdefghilmnoprstuw"[:_KEY]
TEXTS = [
    b"short v" + _RUN,  # one head key, at its very end
    _RUN + b"v tail",  # one tail key, at its very start
    b"a line of a summary\nthat goes on with more and more\nand more",
    b"no cut at all in this one, as in base 16: 0123456789abcdef0123",  # the automata's
    "ends in a continuation byte: caf\u00e9 au lait, na\u00efve".encode(),
    b"vvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvvv",  # only cut bytes: no key
]


class TestKeyedHits:
    def test_texts_with_a_key_are_kept_out_of_the_automata(self) -> None:
        """A text with a key is found by it (a dict entry); one with none in an automaton."""
        index = Index()
        for number, text in enumerate(TEXTS):
            index.add(text, f"d{number}")
        assert set(index._keyed) == {"d0", "d1", "d2", "d4"}
        assert {c[2] for _, c in index._sources.fresh} == {"d3", "d5"}

    @deep.scaled(settings(max_examples=300, deadline=None))
    @given(
        texts=st.lists(st.binary(min_size=16, max_size=60).map(bytes), min_size=1, max_size=8),
        parts=st.lists(st.tuples(st.integers(0, 7), st.binary(max_size=40)), max_size=8),
        alphabet=st.sampled_from([_SPARSE, _DENSE]),
        seed=st.integers(0, 1 << 30),
    )
    def test_every_place_is_found_in_inputs_of_cut_bytes_and_others(
        self,
        texts: list[bytes],
        parts: list[tuple[int, bytes]],
        alphabet: bytes,
        seed: int,
    ) -> None:
        """Against brute force: random texts and fillers over an alphabet dense in cut bytes,
        texts indexed by key or anchor, the input searched whole and again chunked."""
        table = bytes(alphabet[b % len(alphabet)] for b in range(256))
        known = list(dict.fromkeys(t.translate(table) for t in texts))
        value = (
            b"".join(known[n % len(known)] + filler.translate(table) for n, filler in parts)
            or known[0]
        )
        index = Index()
        for number, text in enumerate(known):
            index.add(text, f"d{number}")
        expected = placed(value, known, set(range(len(known))))
        got = {(s, e, d) for s, e, d in index.find(value) if value[s:e] == known[int(d[1:])]}
        assert got == expected
        long = value * (_CHUNKED // max(1, len(value)) + 2)
        expected = placed(long, known, set(range(len(known))))
        for _ in range(2):  # searched as new, then from the pieces remembered
            got = {(s, e, d) for s, e, d in index.find(long) if long[s:e] == known[int(d[1:])]}
            assert got == expected

    def test_a_key_at_the_very_end_of_a_long_input_is_found_there_and_followed_by_more(
        self,
    ) -> None:
        """A head key in the last bytes of a chunked input lies in its last chunk: found there,
        and the chunk remembered is complete when the same bytes are followed by more (its
        place is judged by the key's own size, not the anchors' `ANCHOR`)."""
        index = Index()
        for number, text in enumerate(TEXTS):
            index.add(text, f"d{number}")
        lines = b"".join(b"filler line %d of plain words\n" % i for i in range(200))
        assert len(lines) >= _CHUNKED
        ending = lines + TEXTS[0]
        followed = ending + b" and after it " + lines
        for value in (ending, followed, ending, followed):
            assert _found(index, value) == _brute(value, len(TEXTS))
        assert len(_cuts(ending)) > 2

    def test_a_removed_key_stops_being_found_and_comes_back_when_added_again(self) -> None:
        """`discard` takes a text's key out at once (another text under it stays); adding it
        again finds it again."""
        index = Index()
        index.add(TEXTS[0], "d0")
        index.add(TEXTS[0] + b" copy", "copy")  # the same key, taken: anchored further on
        value = b"before " + TEXTS[0] + b" after"
        assert {d for *_, d in index.find(value)} >= {"d0"}
        index.discard("d0")
        assert "d0" not in {d for *_, d in index.find(value)}
        index.add(TEXTS[0], "d0")
        assert (7, 7 + len(TEXTS[0]), "d0") in index.find(value)

    def test_a_long_text_of_short_lines_is_anchored_after_a_bounded_look(self) -> None:
        """A log of short lines (a cut every few bytes, none next to a key) whose only key lies
        far in is anchored, not keyed there: a key is looked for in its first `_KEY_SPAN` bytes
        only (each of 300,000 lines was a Python step, 0.4 s for 4 MB), and it is still found."""
        log = b"".join(b"row %06d ok\n" % i for i in range(20_000))
        text = log + _RUN + b"\n"  # a tail key, far past `_KEY_SPAN`
        index = Index()
        index.add(text, "d0")
        assert "d0" not in index._keyed
        value = b"before " + text + b" after"
        assert (7, 7 + len(text), "d0") in index.find(value)

    def test_a_box_drawing_keeps_the_key_of_the_line_after_it(self) -> None:
        """A table's border drawn with box characters cuts every 3 bytes (the 0x80 of "─"): the
        key of the prose line after 100 of them (300 bytes) is still in the span looked at."""
        text = ("─" * 100 + "\n| the deploy window closed at noon |\n").encode()
        index = Index()
        index.add(text, "d0")
        assert "d0" in index._keyed
        value = b"before " + text + b" after"
        assert (7, 7 + len(text), "d0") in index.find(value)

    def test_cut_bytes_are_one_byte_each_and_cut_to_the_newline(self) -> None:
        """The table maps every cut byte, and only those, to the one the input is split at."""
        cut = bytes(range(256)).translate(_index._CUTS)
        assert {b for b in range(256) if cut[b] == _index._CUT} == set(_index._CUT_BYTES)


class TestPools:
    """Texts with no key lie in one of two pools, sources' or summaries': a search for
    summaries (a new turn recorded) runs no automaton and finds no batch item of the sources'
    pool, unless one of its texts has become a summary's (promoted) while indexed."""

    SOURCES: ClassVar[list[bytes]] = [
        f"no cut at all in source {i:04}, base 16: 0123456789abcdef".encode() for i in range(200)
    ]

    def _index(self) -> Index:
        index = Index()
        for number, data in enumerate(self.SOURCES):
            index.add(data, f"s{number}")
        return index

    def test_a_search_for_summaries_leaves_the_sources_pool_alone(self) -> None:
        index = self._index()
        assert index._sources.levels and not index._summaries.levels
        value = b" | ".join(self.SOURCES[::7])
        assert {d for _, _, d in index.find(value)} == {f"s{i}" for i in range(0, 200, 7)}
        searched: list[object] = []
        real = _index._Level.searcher

        def searcher(level: _index._Level, size: int) -> object:
            searched.append(level)
            return real(level, size)

        with mock.patch.object(_index._Level, "searcher", searcher):
            assert index.find(value, summaries=True) == []
        assert searched == []

    def test_a_source_indexed_again_as_a_summary_is_searched_for_until_discarded(self) -> None:
        index = self._index()
        value = b"before " + self.SOURCES[3] + b" after"
        index.add(self.SOURCES[3], "s3", summary=True)  # (indexed already: promoted)
        assert index._promoted == {"s3"}
        assert {d for _, _, d in index.find(value, summaries=True)} == {"s3"}
        index.discard("s3")
        assert not index._promoted and index.find(value, summaries=True) == []
        index.add(self.SOURCES[3], "s3", summary=True)  # back, found where it lies, promoted
        assert {d for _, _, d in index.find(value, summaries=True)} == {"s3"}

    def test_a_summary_in_its_own_pool_is_not_promoted(self) -> None:
        index = self._index()
        summary = b"no cut at all in this summary either, 0123456789abcdef"
        index.add(summary, "m", summary=True)
        index.add(summary, "m", summary=True)
        assert index._summaries.fresh and not index._promoted
        assert {d for _, _, d in index.find(b"x " + summary, summaries=True)} == {"m"}
