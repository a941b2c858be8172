"""Which automaton searches a level (`_Level.searcher`): an NFA until a DFA has paid, then the
DFA. The choice must change only the time a search takes, never what it finds."""

from __future__ import annotations

from typing import Any
from unittest import mock

import deep
from hypothesis import given, settings
from hypothesis import strategies as st
from index_history import known_texts, replay

from policyhook import _index
from policyhook._index import _BATCH, Index

#: With no cut byte (`_index._CUT_BYTES`), so every text is anchored in the automata these
#: tests are about (texts with a key are found without them).
DATA = [text.translate(bytes.maketrans(b"kxj", b"csh")) for text in known_texts(120)]
assert not any(set(text) & set(_index._CUT_BYTES) for text in DATA)

#: An index's life: add text i, discard text i, or search an input made of some of the texts,
#: padded a little or a lot (the bytes a level has searched decide when it becomes a DFA).
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 119)),
        st.tuples(st.just("discard"), st.integers(0, 119)),
        st.tuples(st.just("find"), st.lists(st.integers(0, 119), max_size=10), st.integers(0, 200)),
    ),
    max_size=200,
)


def _levels_by_kind(index: Index) -> tuple[int, int]:
    """(levels searched with a DFA, levels searched with an NFA) in `index` now."""
    levels = index._sources.levels
    return sum(lv._dfa is not None for lv in levels), sum(lv._nfa is not None for lv in levels)


class TestSearcher:
    @deep.scaled(settings(max_examples=60, deadline=None))
    @given(
        first=st.integers(0, 120),
        ops=_OPS,
        build_bytes=st.sampled_from([1, 300, _index._DFA_BUILD_BYTES]),
        dfa_max=st.sampled_from([_index._DFA_MAX, 40]),
    )
    def test_every_occurrence_is_a_candidate_whichever_automaton_searches(
        self, first: int, ops: list[tuple[Any, ...]], build_bytes: int, dfa_max: int
    ) -> None:
        """Whatever adds, discards and searches came before, and whenever levels turn into DFAs
        (at once, after a few searches, never: patched costs and caps), every place an indexed
        text occurs in an input is among the candidates and no discarded text is: compared with
        a brute-force search of every indexed text."""
        adds: list[tuple[Any, ...]] = [("add", i) for i in range(first)]
        with (
            mock.patch.object(_index, "_DFA_BUILD_BYTES", build_bytes),
            mock.patch.object(_index, "_DFA_MAX", dfa_max),
        ):
            replay(Index(), DATA, adds + ops, lambda pad: b" plain words between. " * pad)

    def test_a_level_searched_enough_becomes_a_dfa_and_finds_the_same(self) -> None:
        """A level starts as an NFA for small inputs; once the bytes it searched cover the DFA's
        build it is a DFA (its NFA let go), and every search gives what the NFA gave."""
        index = Index()
        for i in range(_BATCH):
            index.add(DATA[i], f"d{i}")
        (level,) = index._sources.levels
        value = b" filler ".join([b"", *DATA[: _BATCH // 2], b""])
        first = sorted(index.find(value))
        assert len(first) >= _BATCH // 2 and _levels_by_kind(index) == (0, 1)
        searches = level.size * _index._DFA_BUILD_BYTES // len(value) + 1
        for _ in range(searches):
            assert sorted(index.find(value)) == first
        assert _levels_by_kind(index) == (1, 0)
        assert sorted(index.find(value)) == first

    def test_a_large_level_stays_an_nfa_for_small_inputs(self) -> None:
        """Past `_DFA_MAX` anchors a level (a DFA costs ~6 KB per anchor) stays an NFA however
        often it is searched, unless one input alone covers its DFA's build."""
        index = Index()
        with mock.patch.object(_index, "_DFA_MAX", _BATCH - 1):
            for i in range(_BATCH):
                index.add(DATA[i], f"d{i}")
            value = DATA[3] + b" and " + DATA[7]
            for _ in range(_BATCH * _index._DFA_BUILD_BYTES // len(value) + 2):
                index.find(value)
            assert _levels_by_kind(index) == (0, 1)
            long = value + b" padding." * (_BATCH * _index._DFA_BUILD_BYTES // 9)
            assert {d for _, _, d in index.find(long)} >= {"d3", "d7"}
            assert _levels_by_kind(index) == (1, 0)
