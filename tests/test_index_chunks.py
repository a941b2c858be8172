"""A long input searched only where it is new (`Index._chunked`): what the index remembers of
the chunks and seams of inputs searched before never hides a place where an indexed text lies.

The inputs are built the way a window rendered as one string changes between calls: a new one
from known texts and filler, or an earlier one edited, extended at either end, spliced with
another, overwritten in place or with its lines re-ordered; known texts hold line ends (a cut may fall inside one, so
anchors lie across seams) and share prefixes; texts are indexed, discarded and indexed again
between searches, sometimes more of them than the log of additions holds. Every input is
searched as it is made and again later, and each search is compared with brute force: the
candidates that are the text they name are exactly every place an indexed text occurs.
"""

from __future__ import annotations

import random
from typing import Any
from unittest import mock

import deep
from hypothesis import given, settings
from hypothesis import strategies as st
from index_history import placed

from policyhook import _index
from policyhook._index import _LOG, Index, _cuts

_HEADER = "=== tool output, shared header of the nightly jobs ===\n"
#: Known texts: short ones (anchored whole), long ones sharing a header (anchored further in),
#: ones holding line ends near their start and all through them, and a periodic one.
TEXTS = [
    *(f"ok {i}\nfine then {i}".encode() for i in range(6)),
    *(f"{_HEADER}exit status {i}\nretry ceiling {i}".encode() for i in range(8)),
    *(f"a\nb\nline {i} of a summary\nthat goes on\n and on ({i})".encode() for i in range(8)),
    *(
        f"summary {i}: the deploy window closed and the jitter was {i} ms".encode()
        for i in range(8)
    ),
    "café au lait\nthe billing window reopened for everyone".encode(),
    b"ab" * 20,
]
FILLER = [
    b"\n",
    b"plain words between the known texts. ",
    b"a filler line of moderate length, ending here\n",
    "non-ASCII filler: naïve café résumé\n".encode(),
    b"x" * 700,  # a long line: cuts land in it only where lines run past `_CHUNK_MAX`
    b"short\n" * 40,
    b"ab" * 9,
]
#: (`_CHUNKED`, `_CHUNK`, `_CHUNK_MAX`, `_MEMO_BYTES`, `_MEMMEM_BYTES`): the shipped cuts and
#: memory; small cuts (many chunks and seams in a short input; `_CHUNK` no shorter than an
#: anchor, as shipped), texts added since found by an automaton of one anchor; small cuts in a
#: memory so small that the least recently used pieces go within one search.
SHAPES = [
    (_index._CHUNKED, _index._CHUNK, _index._CHUNK_MAX, _index._MEMO_BYTES, _index._MEMMEM_BYTES),
    (64, 32, 96, 1 << 24, 0),
    (48, 40, 200, 600, _index._MEMMEM_BYTES),
]

_PART = st.one_of(
    st.integers(0, len(TEXTS) - 1), st.integers(0, len(FILLER) - 1).map(lambda i: FILLER[i])
)
_PARTS = st.lists(_PART, min_size=1, max_size=12)
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, len(TEXTS) - 1)),
        st.tuples(st.just("discard"), st.integers(0, len(TEXTS) - 1)),
        st.tuples(
            st.just("churn"), st.integers(0, len(TEXTS) - 1), st.integers(_LOG - 2, _LOG + 3)
        ),
        st.tuples(st.just("new"), _PARTS, st.integers(1, 8)),
        st.tuples(st.just("edit"), st.integers(0, 99), st.integers(0, 1 << 16), _PART),
        st.tuples(st.just("overwrite"), st.integers(0, 99), st.integers(0, 1 << 16), _PART),
        st.tuples(
            st.just("at_cut"), st.integers(0, 99), st.integers(0, 99), st.integers(-3, 3), _PART
        ),
        st.tuples(
            st.just("delete"), st.integers(0, 99), st.integers(0, 1 << 16), st.integers(1, 400)
        ),
        st.tuples(st.just("extend"), st.integers(0, 99), _PARTS, st.booleans()),
        st.tuples(
            st.just("splice"), st.integers(0, 99), st.integers(0, 99), st.integers(0, 1 << 16)
        ),
        st.tuples(st.just("reorder"), st.integers(0, 99), st.integers(0, 1 << 16)),
        st.tuples(st.just("find"), st.integers(0, 99)),
    ),
    max_size=40,
)


def _built(parts: list[Any], times: int = 1) -> bytes:
    return b"".join(TEXTS[p] if isinstance(p, int) else p for p in parts) * times


class _History:
    """Applies the ops to an index, checking every search against brute force."""

    def __init__(self) -> None:
        self.index = Index()
        self.indexed: set[int] = set()
        self.inputs: list[bytes] = [_built([0, FILLER[2], 9, FILLER[5], 20], 3)]
        self.churned = 0

    def pick(self, number: int) -> bytes:
        return self.inputs[number % len(self.inputs)]

    def search(self, value: bytes) -> None:
        got = self.index.find(value)
        named = {d for _, _, d in got}
        assert named <= {f"d{i}" for i in self.indexed}, "a text not indexed was found"
        confirmed = {
            (s, e, d) for s, e, d in got if d[1:].isdigit() and value[s:e] == TEXTS[int(d[1:])]
        }
        assert confirmed == placed(value, TEXTS, self.indexed), "a place a text lies was missed"

    def made(self, value: bytes) -> None:
        self.inputs.append(value)
        self.search(value)

    def apply(self, op: tuple[Any, ...]) -> None:
        kind = op[0]
        if kind == "add":
            self.index.add(TEXTS[op[1]], f"d{op[1]}")
            self.indexed.add(op[1])
        elif kind == "discard":
            self.index.discard(f"d{op[1]}")
            self.indexed.discard(op[1])
        elif kind == "churn":  # a text, then texts in no input: the pieces searched grow old
            self.apply(("add", op[1]))
            for _ in range(op[2]):
                self.churned += 1
                self.index.add(f"a text no input holds, number {self.churned}".encode(), "churn")
                self.index.discard("churn")
        elif kind == "new":
            self.made(_built(op[1], op[2]))
        elif kind == "edit":
            value = self.pick(op[1])
            at = op[2] % (len(value) + 1)
            self.made(value[:at] + _built([op[3]]) + value[at:])
        elif kind == "at_cut":  # what follows (or precedes) a cut changes, the rest stays
            value = self.pick(op[1])
            cuts = _cuts(value)
            at = min(max(cuts[op[2] % len(cuts)] + op[3], 0), len(value))
            self.made(value[:at] + _built([op[4]]) + value[at:])
        elif kind == "overwrite":  # the same size, other bytes: a chunk's ends may stay
            value = self.pick(op[1])
            at = op[2] % (len(value) + 1)
            self.made(
                value[:at] + _built([op[3]])[: len(value) - at] + value[at + len(_built([op[3]])) :]
            )
        elif kind == "delete":
            value = self.pick(op[1])
            at = op[2] % (len(value) + 1)
            self.made(value[:at] + value[at + op[3] :])
        elif kind == "extend":
            value, more = self.pick(op[1]), _built(op[2])
            self.made(value + more if op[3] else more + value)
        elif kind == "splice":
            one, other = self.pick(op[1]), self.pick(op[2])
            self.made(one[: op[3] % (len(one) + 1)] + other[op[3] % (len(other) + 1) :])
        elif kind == "reorder":
            lines = self.pick(op[1]).split(b"\n")
            random.Random(op[2]).shuffle(lines)
            self.made(b"\n".join(lines))
        else:
            self.search(self.pick(op[1]))


class TestChunkedSearch:
    @deep.scaled(settings(max_examples=150, deadline=None))
    @given(
        first=st.lists(st.integers(0, len(TEXTS) - 1), max_size=8),
        ops=_OPS,
        shape=st.sampled_from(SHAPES),
    )
    def test_every_occurrence_is_found_whatever_was_searched_before(
        self, first: list[int], ops: list[tuple[Any, ...]], shape: tuple[int, ...]
    ) -> None:
        """Inputs made by editing, extending, splicing and re-ordering earlier ones, searched
        as they are made and again, between texts indexed, discarded, indexed again and more
        added than the log holds: every search confirms exactly the places an indexed text
        occurs (brute force), and names no text that is not indexed."""
        chunked, chunk, chunk_max, memory, memmem = shape
        with (
            mock.patch.object(_index, "_CHUNKED", chunked),
            mock.patch.object(_index, "_CHUNK", chunk),
            mock.patch.object(_index, "_CHUNK_MAX", chunk_max),
            mock.patch.object(_index, "_MEMO_BYTES", memory),
            mock.patch.object(_index, "_MEMMEM_BYTES", memmem),
        ):
            history = _History()
            for i in first:
                history.apply(("add", i))
            history.search(history.inputs[0])
            for op in ops:
                history.apply(op)
            for value in history.inputs:  # every input again, after all that happened
                history.search(value)

    def test_a_text_across_a_cut_is_found_when_only_its_neighbours_are_new(self) -> None:
        """An input whose cut falls inside a known text, searched once; then the same input
        with its first and last chunks changed: the text across the seam between the two
        middle chunks (remembered) is found, and so is a text indexed after the first search
        that lies across that seam."""
        index = Index()
        text, later = TEXTS[16], TEXTS[17]
        index.add(text, "d16")
        middle = b"m" * 1100 + b"\n" + b"n" * 1030 + text + b"\n" + b"o" * 1100 + later
        first = b"head\n" * 300 + middle + b"\n" + b"tail\n" * 300
        found = {d for _, _, d in index.find(first)}
        assert "d16" in found
        assert any(cut for cut in _cuts(first) if first.find(text) < cut < first.find(text) + 32)
        index.add(later, "d17")
        second = b"HEAD\n" * 290 + middle + b"\n" + b"TAIL\n" * 310
        got = {(s, e, d) for s, e, d in index.find(second) if second[s:e] in (text, later)}
        assert got == placed(second, TEXTS, {16, 17})

    def test_pieces_searched_before_are_not_searched_again(self) -> None:
        """An input extended at its end is searched with the automata only where it is new:
        the bytes the levels search grow by the new chunk and its seam, not by the input."""
        index = Index()
        for i in range(len(TEXTS)):
            index.add(TEXTS[i], f"d{i}")
        lines = b"".join(b"line %d of the window, words and more words\n" % i for i in range(400))
        index.find(lines)
        searched = []
        real = Index._hits

        def counting(self: Index, data: bytes) -> Any:
            searched.append(len(data))
            return real(self, data)

        with mock.patch.object(Index, "_hits", counting):
            found = index.find(lines + TEXTS[20] + b"\n")
        assert {d for _, _, d in found} == {"d20"}
        assert sum(searched) < _index._CHUNK_MAX + len(TEXTS[20]) + 2 * _index.ANCHOR

    def test_a_piece_searched_before_more_additions_than_the_log_holds_is_searched_again(
        self,
    ) -> None:
        """An input searched, then a text inside it indexed, then more texts than the log of
        additions holds: the next search of the input (its pieces remembered, too old for the
        log to bring up to date) finds the text."""
        index = Index()
        value = b"".join(b"line %d of the window, words and more words\n" % i for i in range(400))
        value += TEXTS[20] + b"\n" + value
        assert index.find(value) == []
        index.add(TEXTS[20], "d20")
        for i in range(_LOG + 1):
            index.add(b"a text no input holds, number %d" % i, f"other{i}")
        assert {(s, e) for s, e, _ in index.find(value)} == {
            (s, e) for s, e, _ in placed(value, TEXTS, {20})
        }

    def test_a_seam_is_remembered_by_both_its_sides(self) -> None:
        """Two inputs cut at the same place after the same bytes, then different ones: the
        second holds a text across that cut (the first does not); remembering the seam by what
        precedes the cut alone would take the first input's empty seam for it."""
        index = Index()
        text = TEXTS[16]  # b"a\nb\n...": a cut can fall after its first line end
        index.add(text, "d16")
        head = b"m" * 1100 + b"\n" + b"n" * 1030
        first = head + b"a\n" + b"other words, no known text in them\n" * 60
        second = head + text + b"\n" + b"other words, no known text in them\n" * 60
        cut = len(head) + 2
        assert cut in _cuts(first) and cut in _cuts(second)
        assert index.find(first) == []
        assert {(s, e, d) for s, e, d in index.find(second)} >= {
            (len(head), len(head) + len(text), "d16")
        }

    def test_a_periodic_text_added_since_is_found_at_every_overlapping_place(self) -> None:
        """A text made of one short run repeated, indexed after an input holding a longer run of
        it was searched: each place it starts (they overlap) is found, whether the texts added
        since are looked for with `bytes.find` or with an automaton of one anchor."""
        value = b"".join(b"line %d of the window, words and more words\n" % i for i in range(200))
        value += b"ab" * 40 + b"\n" + value
        for memmem in (_index._MEMMEM_BYTES, 0):
            with mock.patch.object(_index, "_MEMMEM_BYTES", memmem):
                index = Index()
                assert index.find(value) == []
                index.add(TEXTS[-1], "periodic")  # b"ab" * 20
                places = {s for s, _, _ in index.find(value)}
                assert places == {s for s, _, _ in placed(value, TEXTS, {len(TEXTS) - 1})}
                assert len(places) == 21
                found = index.find_added(value, index.added - 1)
                assert found is not None and {s for s, _, _ in found} == places


class TestAChunkRememberedIsTheChunkSearched:
    """Each of these fails if a remembered chunk is taken for one it is not (planted: the
    bytes not compared, the bytes after the cut left out of the key, a text added since not
    written into the chunk's entry)."""

    LINES = b"".join(b"line %04d of the window\n" % i for i in range(200))

    def test_other_bytes_between_the_same_ends_are_searched(self) -> None:
        """Two inputs alike but for bytes inside a chunk, its size and ends the same: the text
        in the second is found."""
        index = Index()
        index.add(TEXTS[24], "d24")
        assert index.find(self.LINES) == []
        at = 400
        second = self.LINES[:at] + TEXTS[24] + self.LINES[at + len(TEXTS[24]) :]
        assert len(second) == len(self.LINES) and _cuts(second) == _cuts(self.LINES)
        assert {(s, e) for s, e, _ in index.find(second)} == {(at, at + len(TEXTS[24]))}

    def test_a_chunk_that_ended_its_input_is_not_taken_for_it_followed_by_more(self) -> None:
        """A chunk that ended one input, then the same chunk followed by more, ending alike
        (repeated lines): a text starting in it and going on past its cut is found."""
        line = b"r" * 30 + b"\n"  # 31 bytes: the chunk's last 32 bytes and those after its cut
        text = line + line + b"and what follows the repeated lines"
        more = text[len(line) :] + b"\n" + self.LINES
        first = next(  # (agree when what follows is the same line) cut where `first` ends
            first
            for first in (self.LINES + line * n for n in range(1, 80))
            if len(first) in _cuts(first + more)
        )
        index = Index()
        index.add(text, "t")
        assert index.find(first) == []
        second = first + more
        got = {(s, e) for s, e, _ in index.find(second) if second[s:e] == text}
        assert got == {(len(first) - len(line), len(first) - len(line) + len(text))}

    def test_a_text_added_since_stays_found_in_a_chunk_searched_again(self) -> None:
        """An input searched, a text in it indexed, the input searched again (the text found
        with the log of additions) and again with nothing added since: found every time."""
        index = Index()
        value = self.LINES + TEXTS[24] + b"\n" + self.LINES
        assert index.find(value) == []
        index.add(TEXTS[24], "d24")
        want = {(s, e) for s, e, _ in placed(value, TEXTS, {24})}
        for _ in range(3):
            assert {(s, e) for s, e, _ in index.find(value)} == want
