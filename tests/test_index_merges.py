"""Levels merged into one once the passes they cost beyond one add up to that merge's build
(`_Pool.passes`, ski rental): searches see a bounded number of levels whatever the texts
indexed. A merge must change only how many passes a search runs, never what it finds."""

from __future__ import annotations

from typing import Any
from unittest import mock

import deep
from hypothesis import given, settings
from hypothesis import strategies as st
from index_history import placed, replay
from test_index_searcher import DATA

from policyhook import _index
from policyhook._index import _BATCH, _BUILD_BYTES, _CHUNKED, Index

#: An index's life with small batches (many levels): add, discard, or search some texts
#: padded a little or a lot (the bytes searched decide when the levels merge).
_OPS = st.lists(
    st.one_of(
        st.tuples(st.just("add"), st.integers(0, 119)),
        st.tuples(st.just("discard"), st.integers(0, 119)),
        st.tuples(
            st.just("find"), st.lists(st.integers(0, 119), max_size=10), st.integers(0, 600)
        ),  # (up to 13 KB)
    ),
    max_size=200,
)


def _sizes(index: Index) -> list[int]:
    return [level.size for level in index._sources.levels]


class TestMergedLevels:
    @deep.scaled(settings(max_examples=80, deadline=None))
    @given(
        first=st.integers(0, 120),
        ops=_OPS,
        batch=st.sampled_from([2, 5, _BATCH]),
        build_bytes=st.sampled_from([1, 40, _BUILD_BYTES]),
    )
    def test_every_occurrence_is_a_candidate_whenever_the_levels_merge(
        self, first: int, ops: list[tuple[Any, ...]], batch: int, build_bytes: int
    ) -> None:
        """Whatever adds, discards (left out at a merge, or found again when added back before
        it) and searches came before, and whenever levels merge into one (after every search,
        after a few, rarely: patched costs), every place an indexed text occurs is among the
        candidates and no discarded text is: against brute force."""
        adds: list[tuple[Any, ...]] = [("add", i) for i in range(first)]
        with (
            mock.patch.object(_index, "_BATCH", batch),
            mock.patch.object(_index, "_BUILD_BYTES", build_bytes),
        ):
            replay(Index(), DATA, adds + ops, lambda pad: b" plain words between. " * pad)

    def test_levels_merge_once_their_extra_passes_cost_the_build(self) -> None:
        """Two levels: each search of n >= `_CHUNKED` bytes costs n bytes past one pass; the
        search that brings that to `_BUILD_BYTES` per anchor merges them (not one before), the
        count starts again from nothing, a smaller input is not counted, and every search finds
        every place."""
        index = Index()
        for i in range(2 * _BATCH):
            index.add(DATA[i], f"d{i}")
        assert _sizes(index) == [_BATCH, _BATCH]
        value = b" filler ".join([b"", *DATA[: 2 * _BATCH : 3], b""]).ljust(_CHUNKED, b".")
        expected = placed(value, DATA, set(range(2 * _BATCH)))

        def found(data: bytes) -> set[tuple[int, int, str]]:
            return set(_index._fitting(data, index._hits(data), index._digests))

        searches = _BUILD_BYTES * 2 * _BATCH // len(value)  # reaches the build exactly
        assert searches * len(value) == _BUILD_BYTES * 2 * _BATCH
        for _ in range(searches - 1):
            assert found(value) >= expected
        assert found(value[:-1]) >= expected  # under `_CHUNKED`: not counted
        assert _sizes(index) == [_BATCH, _BATCH]
        assert index._sources.passes == (searches - 1) * len(value)
        assert found(value) >= expected
        assert _sizes(index) == [2 * _BATCH] and index._sources.passes == 0
        for i in range(2 * _BATCH, 3 * _BATCH):  # a new level: counted from nothing again
            index.add(DATA[i], f"d{i}")
        assert _sizes(index) == [2 * _BATCH, _BATCH] and index._sources.passes == 0
        found(value)
        assert index._sources.passes == len(value)

    def test_a_merge_leaves_out_the_texts_discarded_and_keeps_one_added_back(self) -> None:
        """Texts discarded before the merge are not in the merged level (their anchors free
        again); one discarded and added back before it is there, once, and found."""
        index = Index()
        for i in range(2 * _BATCH):
            index.add(DATA[i], f"d{i}")
        for i in (1, 2, _BATCH + 3):
            index.discard(f"d{i}")
        index.add(DATA[2], "d2")  # back before the merge: kept where it is
        with mock.patch.object(_index, "_BUILD_BYTES", 0):
            found = {d for _, _, d in index.find(b" ".join(DATA[: 2 * _BATCH]).ljust(_CHUNKED))}
        assert _sizes(index) == [2 * _BATCH - 2]
        digests = [c[2] for _, c in index._sources.levels[0].items()]
        assert sorted(digests) == sorted(
            {f"d{i}" for i in range(2 * _BATCH)} - {"d1", f"d{_BATCH + 3}"}
        )
        assert found == set(digests)
        assert not index._dropped
        assert sum(index._used.values()) == 2 * _BATCH - 2

    def test_a_merged_level_counts_the_bytes_all_its_parts_were_searched_with(self) -> None:
        """The merged level starts with the bytes the least searched level had (every anchor
        in it was searched that much), so levels that were DFAs merge into one that is a DFA
        at its first search once those bytes cover its build, and it finds the same."""
        index = Index()
        for i in range(2 * _BATCH):
            index.add(DATA[i], f"d{i}")
        value = b" filler ".join([b"", *DATA[: 2 * _BATCH : 3], b""]).ljust(_CHUNKED, b".")
        expected = placed(value, DATA, set(range(2 * _BATCH)))
        older, newer = index._sources.levels
        older._searched, newer._searched = 10 * 2 * _BATCH * _index._DFA_BUILD_BYTES, 7
        with mock.patch.object(_index, "_BUILD_BYTES", 0):
            assert set(_index._fitting(value, index._hits(value), index._digests)) >= expected
        (merged,) = index._sources.levels
        assert merged._searched == 7 + len(value) and merged._dfa is None
        for i in range(2 * _BATCH, 3 * _BATCH):  # a batch more: the next search merges again
            index.add(DATA[i], f"d{i}")
        merged._searched = index._sources.levels[-1]._searched = (
            3 * _BATCH * _index._DFA_BUILD_BYTES
        )
        with mock.patch.object(_index, "_BUILD_BYTES", 0):
            assert set(_index._fitting(value, index._hits(value), index._digests)) >= expected
        (again,) = index._sources.levels
        assert again._dfa is not None and again._nfa is None
