"""`Index.find_added`: the search for only the texts indexed since an earlier search."""

from __future__ import annotations

from unittest import mock

import deep
from hypothesis import given, settings
from hypothesis import strategies as st
from index_history import placed

from policyhook import _index
from policyhook._index import _LOG, Index

TEXTS = [f"known text {i:03}: " + "abcdefghij"[i % 10] * (i % 40) + f" end {i}" for i in range(60)]
DATA = [t.encode() for t in TEXTS]


def confirmed(index: Index, value: bytes, found: list[tuple[int, int, str]]) -> set[object]:
    """The candidates that are the text they name (as the ledger confirms them)."""
    return {(s, e, d) for s, e, d in found if value[s:e] == DATA[int(d[1:])]}


class TestFindAdded:
    @deep.scaled(settings(max_examples=80, deadline=None))
    @given(
        before=st.lists(st.integers(0, 59), max_size=80),
        dropped=st.lists(st.integers(0, 59), max_size=10),
        after=st.lists(st.integers(0, 59), max_size=_LOG + 4),
        picked=st.lists(st.integers(0, 59), max_size=12),
        memmem=st.sampled_from([_index._MEMMEM_BYTES, 0]),
    )
    def test_the_earlier_search_and_the_added_texts_make_a_whole_search(
        self,
        before: list[int],
        dropped: list[int],
        after: list[int],
        picked: list[int],
        memmem: int,
    ) -> None:
        """Texts indexed (some discarded, before the earlier search), then more added (some of
        them added again after their discard): what the earlier `find` confirmed plus what
        `find_added` confirms is every occurrence of every text indexed now, exactly what a
        whole `find` confirms; past the log's length it answers None (search whole). Each
        added text is looked for with `bytes.find`, or (patched) with an automaton of its
        anchor alone, as in a long input."""
        with mock.patch.object(_index, "_MEMMEM_BYTES", memmem):
            self._check(before, dropped, after, picked)

    def _check(
        self, before: list[int], dropped: list[int], after: list[int], picked: list[int]
    ) -> None:
        index = Index()
        for i in before:
            index.add(DATA[i], f"d{i}")
        for i in dropped:
            index.discard(f"d{i}")
        value = b" filler ".join([b"", *(DATA[i] for i in picked), b""])
        since, earlier = index.added, confirmed(index, value, index.find(value))
        for i in after:
            index.add(DATA[i], f"d{i}")
        new = index.find_added(value, since)
        if index.added - since > _LOG:
            assert new is None
            return
        assert new is not None
        held = {int(d[1:]) for d in index._digests}
        assert earlier | confirmed(index, value, new) == placed(value, DATA, held)
        assert placed(value, DATA, held) == confirmed(index, value, index.find(value))

    def test_nothing_added_finds_nothing(self) -> None:
        """Asked for additions since the current count, it searches for none."""
        index = Index()
        index.add(DATA[0], "d0")
        assert index.find_added(DATA[0], index.added) == []
        assert index.find_added(DATA[0], index.added - 1) == [(0, len(DATA[0]), "d0")]
