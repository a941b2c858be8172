"""Finding known texts inside an input in one linear pass, with no full rebuilds as texts arrive.

Each known text is indexed by one anchor (up to `ANCHOR` bytes of it) in Aho-Corasick automata
over UTF-8 bytes. New texts wait in a small batch searched with `bytes.find`; a full batch becomes
an automaton of tier 0, and `_FANOUT` automata of one tier merge into one of the next (tiered
merging, a counter in base `_FANOUT`), so a text is rebuilt into an automaton O(log n) times in
all, a merge of n anchors happens once per n/`_FANOUT` new texts, and a search runs O(log n)
automata. Anchors are chosen unique: texts sharing a long prefix (a tool-output header)
are anchored further in, so one hit in the input means one candidate to confirm, not N.

The index returns candidates only; the ledger confirms each by digest.
"""

from __future__ import annotations

import ahocorasick_rs

#: Texts shorter than this many bytes are never searched for inside larger strings.
MIN_BYTES = 16
#: Bytes in an anchor; shorter texts are anchored whole.
ANCHOR = 32
#: Bytes at the end of each text compared before a candidate is confirmed by digest: a cheap
#: filter for anchors that recur in unrelated input.
_TAIL = 16
#: New texts searched one by one until there are this many; then they become an automaton.
_BATCH = 32
#: Automata of one tier that merge into one of the next.
_FANOUT = 4
#: Offsets tried for a unique anchor before sharing one.
_TRIES = 16
#: Inputs at least this long fold the batch into an automaton first (one pass per automaton
#: beats one `find` per batched text) and are searched with DFAs, built once per level on demand
#: (twice as fast to search, ten times dearer to build: only for levels of tier 2 and up, which
#: are rebuilt rarely) ...
_LARGE_INPUT = 64 * 1024
#: ... for levels of at most this many anchors (a DFA takes ~14 KB per anchor).
_DFA_MAX_ANCHORS = 2048

Candidate = tuple[int, int, str, bytes]  # (anchor offset in its text, text size, digest, tail)


class _Level:
    """One immutable automaton over a set of anchors."""

    __slots__ = ("_dfa", "anchors", "automaton", "candidates", "size", "tier")

    def __init__(self, items: list[tuple[bytes, Candidate]], tier: int) -> None:
        self.size = len(items)
        self.tier = tier
        by_anchor: dict[bytes, list[Candidate]] = {}
        for anchor, candidate in items:
            by_anchor.setdefault(anchor, []).append(candidate)
        self.anchors = list(by_anchor)
        self.candidates = list(by_anchor.values())
        self.automaton = ahocorasick_rs.BytesAhoCorasick(
            self.anchors, implementation=ahocorasick_rs.Implementation.ContiguousNFA
        )
        self._dfa: ahocorasick_rs.BytesAhoCorasick | None = None

    def items(self) -> list[tuple[bytes, Candidate]]:
        return [(a, c) for a, cs in zip(self.anchors, self.candidates, strict=True) for c in cs]

    def searcher(self, large: bool) -> ahocorasick_rs.BytesAhoCorasick:
        if not large or self.tier < 2 or len(self.anchors) > _DFA_MAX_ANCHORS:
            return self.automaton
        if self._dfa is None:
            self._dfa = ahocorasick_rs.BytesAhoCorasick(
                self.anchors, implementation=ahocorasick_rs.Implementation.DFA
            )
        return self._dfa


class Index:
    """Anchors of known texts; `find` gives every place a known text may start in an input."""

    def __init__(self) -> None:
        self._levels: list[_Level] = []  # largest first
        self._fresh: list[tuple[bytes, Candidate]] = []
        self._used: dict[bytes, int] = {}  # anchor -> texts using it
        self._digests: set[str] = set()
        self._dropped: set[str] = set()  # digests to leave out at the next merge

    def __len__(self) -> int:
        return len(self._digests)

    def __contains__(self, digest: str) -> bool:
        return digest in self._digests

    def add(self, data: bytes, digest: str) -> None:
        """Index a text (`data`: its UTF-8 bytes) under `digest`; shorter than MIN_BYTES: no-op."""
        if len(data) < MIN_BYTES or digest in self._digests:
            return
        self._dropped.discard(digest)
        anchor, offset = self._anchor(data)
        self._used[anchor] = self._used.get(anchor, 0) + 1
        self._digests.add(digest)
        self._fresh.append((anchor, (offset, len(data), digest, data[-_TAIL:])))
        if len(self._fresh) >= _BATCH:
            self._fold()

    def _fold(self) -> None:
        """The batch becomes a tier-0 automaton; full tiers merge upwards."""
        self._levels.append(_Level(self._fresh, 0))
        self._fresh = []
        while len(self._levels) >= _FANOUT:
            tier = self._levels[-1].tier
            group = self._levels[-_FANOUT:]
            if any(level.tier != tier for level in group):
                return
            del self._levels[-_FANOUT:]
            kept = [i for level in group for i in level.items() if self._keep(i)]
            if kept:
                self._levels.append(_Level(kept, tier + 1))

    def discard(self, digest: str) -> None:
        """Stop finding a text (it is left out of the automaton at its level's next merge)."""
        if digest in self._digests:
            self._digests.discard(digest)
            self._dropped.add(digest)

    def _anchor(self, data: bytes) -> tuple[bytes, int]:
        if len(data) <= ANCHOR:
            return data, 0
        last = len(data) - ANCHOR
        for offset in range(0, min(last, _TRIES * ANCHOR) + 1, ANCHOR):
            anchor = data[offset : offset + ANCHOR]
            if anchor not in self._used:
                return anchor, offset
        return data[last:], last  # the tail: unique unless the texts are all but identical

    def _keep(self, item: tuple[bytes, Candidate]) -> bool:
        anchor, (_, _, digest, _) = item
        if digest not in self._dropped:
            return True
        self._dropped.discard(digest)
        left = self._used.pop(anchor) - 1
        if left:
            self._used[anchor] = left
        return False

    def find(self, data: bytes) -> list[tuple[int, int, str]]:
        """(start, end, digest) of every place in `data` where a known text may lie; unconfirmed."""
        if len(data) < MIN_BYTES:
            return []
        found: list[tuple[int, int, str]] = []
        size = len(data)
        large = size >= _LARGE_INPUT
        if large and self._fresh:
            self._fold()
        dropped = self._dropped
        for level in self._levels:
            candidates = level.candidates
            for index, at, _ in level.searcher(large).find_matches_as_indexes(
                data, overlapping=True
            ):
                for offset, length, digest, tail in candidates[index]:
                    start = at - offset
                    end = start + length
                    if (
                        start >= 0
                        and end <= size
                        and data.endswith(tail, start, end)
                        and digest not in dropped
                    ):
                        found.append((start, end, digest))
        for anchor, (offset, length, digest, tail) in self._fresh:
            at = data.find(anchor)
            while at != -1:
                start = at - offset
                end = start + length
                if (
                    start >= 0
                    and end <= size
                    and data.endswith(tail, start, end)
                    and digest not in dropped
                ):
                    found.append((start, end, digest))
                at = data.find(anchor, at + 1)
        return found
