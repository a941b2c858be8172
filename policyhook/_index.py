"""Finding known texts inside an input in one linear pass, with no full rebuilds as texts arrive.

Most known texts are indexed by a key found by content: the `_KEY` bytes right after or right
before a cut byte (a newline, a rare Latin letter, a few UTF-8 continuation bytes: `_CUT_BYTES`)
in a dict. An input is cut at the same bytes (`bytes.translate` and `bytes.split`, in C) and the
`_KEY` bytes on each side of each cut are looked up, so a search costs the same whatever the
number of texts indexed (no pass per automaton, as below): a new turn recorded is searched for
the summaries it quotes in a few microseconds per KB.

A text with no such key (short, or with no cut byte: hex, base64) is indexed by one anchor (up to
`ANCHOR` bytes of it) in Aho-Corasick automata over UTF-8 bytes. New texts wait in a small batch
searched with `bytes.find`; a full batch becomes an automaton of tier 0, and `_FANOUT` automata
of one tier merge into one of the next (tiered merging, a counter in base `_FANOUT`), so a text
is rebuilt into an automaton O(log n) times in all, a merge of n anchors happens once per
n/`_FANOUT` new texts, and a search runs O(log n) automata; once searches of `_CHUNKED` bytes or
more have paid in passes beyond the first what merging them all costs, they merge into one (ski
rental, `_Pool.passes`): long new turns are searched in about one pass. Anchors and keys are
chosen unique: texts sharing a long prefix (a tool-output header) are anchored further in, so
one hit in the input means one candidate to confirm, not N.

Anchored texts are kept in two pools, sources and summaries, each its own batch and levels:
a new turn is recorded only after a search for the summaries it may quote (`find(data,
summaries=True)`), and the texts without a key are mostly short turns and tool outputs, so that
search runs no automaton of theirs whatever their number. A source's text later known as a
summary (`promote`) makes that search run the sources' pool too, until it is discarded.

The index returns candidates only; the ledger confirms each by digest.

A long input is searched only where it is new: it is cut into chunks at line ends, and where
anchors lie (a key with its cut byte is its text's anchor) is remembered by content, with the
addition count it is complete for: per chunk (the anchors wholly in it) and per seam (the
`ANCHOR` - 1 bytes each side of a cut: the anchors across it). A piece seen before is searched
again only for the texts added since (a `bytes.find` each, from the log of the last additions),
so a window rendered as one string, new every call but sharing most of its bytes with the last,
costs its new pieces, not a pass per level over it all.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import OrderedDict, deque
from itertools import accumulate, compress, islice, pairwise
from operator import itemgetter
from typing import Any

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
#: Offsets tried for a unique anchor before sharing one, and keys for a unique key ...
_TRIES = 16
#: ... in the first this many bytes of a text: one whose first cuts give no key (a log or a CSV
#: of short lines: a cut every few bytes) is anchored after a bounded look, not after a Python
#: step per cut of all of it (4 MB of 14-byte lines took 0.4 s).
_KEY_SPAN = 1024
#: Inputs at least this long are searched in as few passes as pays: every level merges into one
#: (else the levels under the largest do) when that build costs less than the passes it saves,
#: and a batch of more than `_FIND_MAX` texts becomes a level first ...
_LARGE_INPUT = 64 * 1024
#: ... where building an anchor into an automaton costs about as much as searching this many
#: input bytes with one (measured with ahocorasick-rs on 32-byte anchors: 1,000 anchors build
#: in 1.9 ms, an NFA searches 4 MB in 31 ms) ...
_BUILD_BYTES = 256
#: ... and one `bytes.find` of an anchor costs about a fifteenth of an automaton pass (4 MB:
#: 1.3 ms, a DFA pass 20 ms), so up to this many anchors (the batch, the smallest levels) are
#: found with `find`, not with a pass each ...
_FIND_MAX = 8
#: ... and a level is searched with a DFA (two to four times as fast as an NFA, ten times dearer
#: to build) once the bytes it has searched cover the DFA's build, `size * _DFA_BUILD_BYTES`
#: (at once for an input that long): ski rental, so a level searched often, whatever the input
#: sizes, costs at most about twice what the better automaton known in hindsight would have ...
_DFA_BUILD_BYTES = 4096
#: ... for levels of up to this many anchors (a DFA takes about 6 KB per anchor, an NFA under
#: 1 KB): the small, recent levels, about 12 MB for full tiers of 32, 128 and 512 anchors (more
#: only while merges that left out discarded texts keep extra small levels); larger levels only
#: for an input whose single pass covers the build.
_DFA_MAX = 512
#: Additions `find_added` can search for alone: a caller whose last search is older than this
#: many additions searches again whole (16 `bytes.find` of a 4 MB input cost about one pass).
_LOG = 16

#: Bytes a text and an input are cut at to find keys by content (`Index._key_of`): ones that
#: recur every few dozen bytes in prose, code and logs alike (a newline, the six rarest Latin
#: letters), and four of the 64 UTF-8 continuation bytes (one in eight characters of a CJK text,
#: one in sixteen of Cyrillic). Content without them is anchored in the automata instead.
_CUT_BYTES = b"\nkvxjqzKVXJQZ\x80\x81\x82\x83"
_CUT = 10  # what every cut byte becomes before the split (a newline)
_CUTS = bytes.maketrans(_CUT_BYTES, bytes([_CUT]) * len(_CUT_BYTES))
#: Bytes of a key: the run of bytes right after a cut (a head) or right before one (a tail),
#: with no cut byte inside; with the cut byte itself, the key's place (`_EXTENT` bytes) is the
#: text's anchor, so the automata's bookkeeping (the log, the remembered chunks) holds it too.
_KEY = 24
_EXTENT = _KEY + 1
_HEAD, _TAIL_KEY = itemgetter(slice(0, _KEY)), itemgetter(slice(-_KEY, None))
#: Inputs at least this long are cut into chunks whose anchors are remembered (`Index.find`) ...
_CHUNKED = 4096
#: ... each ending at the first line end at least this many bytes past its start (no fewer than
#: `ANCHOR`: an anchor then lies across at most one cut, in the seam `_chunked` gives it) ...
_CHUNK = 1024
#: ... or this many bytes past it, where a line is longer (a line end is not sought further) ...
_CHUNK_MAX = 16 * 1024
#: ... and at most this many bytes of chunks are remembered (least recently used out); an input
#: of more than half of it is searched whole, not cycled through the memory.
_MEMO_BYTES = 16 * 1024 * 1024
#: What one remembered hit is charged in `_MEMO_BYTES` (a tuple and a list slot).
_HIT_BYTES = 96
#: Bytes at each end of a chunk that, with its size, look it up (`Index._chunked`).
_ENDS = 32
#: Inputs at least this long are searched for a text added since with an automaton of its
#: anchor alone, not with `bytes.find` (`_placed`; with more anchors its prefilter is slower).
_MEMMEM_BYTES = 128 * 1024

#: (anchor offset in its text, text size, digest, tail, anchor size): the anchor's size places a
#: hit in the chunk or the seam it lies in (`Index._chunked`).
Candidate = tuple[int, int, str, bytes, int]
#: Where an anchor lies (its offset in the bytes searched) and the text it points to.
Hit = tuple[int, Candidate]
_NO_CANDIDATE: Candidate = (0, 0, "", b"", 0)
#: A batch item's anchor, read in C (`map`).
_ANCHOR_OF = itemgetter(0)


class _Level:
    """One immutable set of anchors, searched with an automaton built on first use.

    The anchors are grouped (`anchors`, `candidates`) only when the level is first searched: a
    level merged into a bigger one before any search (most are, once searches look only for
    the texts added since: `Index.find_added`) costs a list, not a dict and an automaton."""

    __slots__ = ("_dfa", "_items", "_nfa", "_searched", "anchors", "candidates", "size", "tier")

    def __init__(self, items: list[tuple[bytes, Candidate]], tier: int) -> None:
        self.size = len(items)
        self.tier = tier
        self._items: list[tuple[bytes, Candidate]] | None = items
        self.anchors: list[bytes] = []
        self.candidates: list[list[Candidate]] = []
        self._nfa: ahocorasick_rs.BytesAhoCorasick | None = None
        self._dfa: ahocorasick_rs.BytesAhoCorasick | None = None
        self._searched = 0  # input bytes searched with this level so far

    def items(self) -> list[tuple[bytes, Candidate]]:
        if self._items is not None:
            return self._items
        return [(a, c) for a, cs in zip(self.anchors, self.candidates, strict=True) for c in cs]

    def _group(self) -> None:
        """Group the candidates by anchor, for an automaton (kept instead of the items)."""
        if self._items is None:
            return
        by_anchor: dict[bytes, list[Candidate]] = {}
        for anchor, candidate in self._items:
            by_anchor.setdefault(anchor, []).append(candidate)
        self.anchors = list(by_anchor)
        self.candidates = list(by_anchor.values())
        self._items = None

    def searcher(self, size: int) -> ahocorasick_rs.BytesAhoCorasick:
        """The automaton to search an input of `size` bytes with (built on first use): an NFA
        until the DFA has paid (`_DFA_BUILD_BYTES`), then the DFA for good. Both find every
        occurrence of every anchor, so which one searches changes only the time it takes."""
        self._group()
        self._searched += size
        if self._dfa is None:
            build = self.size * _DFA_BUILD_BYTES
            if build <= size or (self.size <= _DFA_MAX and build <= self._searched):
                self._dfa = ahocorasick_rs.BytesAhoCorasick(
                    self.anchors, implementation=ahocorasick_rs.Implementation.DFA
                )
                self._nfa = None  # no longer searched with
        if self._dfa is not None:
            return self._dfa
        if self._nfa is None:
            self._nfa = ahocorasick_rs.BytesAhoCorasick(
                self.anchors, implementation=ahocorasick_rs.Implementation.ContiguousNFA
            )
        return self._nfa


def _cuts(data: bytes) -> list[int]:
    """Where `data` is cut into chunks: 0, then after the first line end at least `_CHUNK`
    bytes past the last cut (or `_CHUNK_MAX` bytes past it, in a longer line), then its size.
    Cut by content, so text added at the end or the start leaves the other chunks as they were;
    an edit inside changes the chunks from it to where the cuts fall in step again."""
    size, find = len(data), data.find
    cuts, at = [0], 0
    while size - at > _CHUNK:
        end = find(b"\n", at + _CHUNK - 1, at + _CHUNK_MAX - 1)
        at = end + 1 if end != -1 else at + _CHUNK_MAX
        if at >= size:
            break
        cuts.append(at)
    cuts.append(size)
    return cuts


def _placed(data: bytes, items: list[tuple[bytes, Candidate]], hits: list[Hit]) -> None:
    """Add to `hits` where the anchor of each item lies in `data`, with its candidate,
    overlapping places too: `bytes.find` after `bytes.find`, in one loop for all (a small
    input's batch of up to 31 anchors, most not there, was mostly calls: 28 -> 18 µs for 30
    anchors on 1 KB), or in a long input one ahocorasick-rs pass over it with each anchor alone
    (memchr's SIMD search: about six times as fast as `bytes.find` here, for ~25 µs to build)."""
    if len(data) >= _MEMMEM_BYTES:
        for anchor, candidate in items:
            searcher = ahocorasick_rs.BytesAhoCorasick([anchor])
            matches = searcher.find_matches_as_indexes(data, overlapping=True)
            hits.extend([(at, candidate) for _, at, _ in matches])
        return
    find, append = data.find, hits.append
    for anchor, candidate in items:
        at = find(anchor)
        while at != -1:
            append((at, candidate))
            at = find(anchor, at + 1)


def _fitting(data: bytes, hits: list[Hit], digests: set[str]) -> list[tuple[int, int, str]]:
    """(start, end, digest) of each hit whose text fits in `data` where its anchor lies, with
    its tail there, and is indexed now (`digests`): the places a known text may lie."""
    size, ends, found = len(data), data.endswith, []
    for at, (offset, length, digest, tail, _) in hits:
        start = at - offset
        end = start + length
        if start >= 0 and end <= size and ends(tail, start, end) and digest in digests:
            found.append((start, end, digest))
    return found


def _places(data: bytes, anchor: bytes) -> list[int]:
    """Where `anchor` lies in `data`, overlapping places too (`_placed`)."""
    hits: list[Hit] = []
    _placed(data, [(anchor, _NO_CANDIDATE)], hits)
    return [at for at, _ in hits]


def _charge(key: Any, entry: list[Any]) -> int:
    """What a remembered piece is charged in `_MEMO_BYTES`: its bytes (a chunk's key holds
    its ends) and its hits."""
    held = len(entry[2]) + 2 * _ENDS if len(entry) > 2 else len(key)
    return held + _HIT_BYTES * len(entry[1])


def _spans(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """The ranges (start, end), sorted by start, merged where they overlap or touch."""
    spans: list[tuple[int, int]] = []
    for start, end in ranges:
        if spans and start <= spans[-1][1]:
            spans[-1] = (spans[-1][0], max(spans[-1][1], end))
        else:
            spans.append((start, end))
    return spans


def _tier(size: int) -> int:
    """The tier of a level of `size` anchors: t for _BATCH * _FANOUT**t <= size (0 below)."""
    tier, bound = 0, _BATCH * _FANOUT
    while size >= bound:
        tier, bound = tier + 1, bound * _FANOUT
    return tier


class _Pool:
    """Anchored texts of one kind (sources or summaries): the batch searched with `bytes.find`
    (`fresh`) and the tiered levels, largest first.

    `passes`: bytes of inputs of `_CHUNKED` or more searched by levels past the first since they
    last all merged into one: once that costs as much as the merge would (`_BUILD_BYTES` an
    anchor), they merge (ski rental: a long new turn is searched in a bounded number of passes
    whatever the texts indexed). Smaller inputs are left to the tiers: a pass over one costs
    little beside its call, and merges would be builds inside a loop."""

    __slots__ = ("fresh", "levels", "passes")

    def __init__(self) -> None:
        self.levels: list[_Level] = []
        self.fresh: list[tuple[bytes, Candidate]] = []
        self.passes = 0


class Index:
    """Anchors of known texts; `find` gives every place a known text may start in an input."""

    def __init__(self) -> None:
        #: Texts found by content: key -> candidates (their anchor the key with its cut byte),
        #: for keys right after a cut (heads) and right before one (tails); and digest -> the
        #: table and key each is under, for `discard`.
        self._heads: dict[bytes, list[Candidate]] = {}
        self._tails: dict[bytes, list[Candidate]] = {}
        self._keyed: dict[str, tuple[dict[bytes, list[Candidate]], bytes]] = {}
        self._sources, self._summaries = _Pool(), _Pool()
        #: Digests with an item in the summaries' pool (indexed or discarded), and those indexed
        #: in the sources' pool whose text is known as a summary since (`promote`).
        self._in_summaries: set[str] = set()
        self._promoted: set[str] = set()
        self._used: dict[bytes, int] = {}  # anchor -> texts using it
        self._digests: set[str] = set()
        self._dropped: set[str] = set()  # digests to leave out at the next merge
        #: Texts made findable so far (added, or added again after a discard): a caller that
        #: remembers what `find` gave for an input knows it still stands while this is unchanged
        #: and nothing was discarded, and that `find_added` gives the rest while it is close.
        self.added = 0
        #: The last `_LOG` additions, oldest first (the last one is addition number `added`),
        #: each as a batch item to search for with `bytes.find`.
        self._log: list[tuple[bytes, Candidate]] = []
        #: Pieces of long inputs searched before (`_chunked`), LRU: a chunk (by its size and
        #: ends) or a seam (by its bytes) -> [the addition count its hits are complete for, its
        #: hits: (offset in the piece, candidate) of every anchor, of an indexed or a discarded
        #: text, lying wholly in the chunk or across the seam's middle, and a chunk's bytes].
        self._chunks: OrderedDict[tuple[int, bytes, bytes], list[Any]] = OrderedDict()
        self._seams: OrderedDict[bytes, list[Any]] = OrderedDict()
        self._memo_bytes = 0  # what both are charged (`_charge`)

    def __len__(self) -> int:
        return len(self._digests)

    def __contains__(self, digest: str) -> bool:
        return digest in self._digests

    def add(self, data: bytes, digest: str, summary: bool = False) -> None:
        """Index a text (`data`: its UTF-8 bytes) under `digest`, a summary's or a source's;
        shorter than MIN_BYTES: no-op. A source's text indexed again as a summary's is promoted.

        Each digest has one copy in the automata: a text discarded and added again before its
        level merged (a ledger's cache forgetting it and finding it again) is kept where it is,
        so a working set cycling through a bounded cache does not pile up copies."""
        if len(data) < MIN_BYTES:
            return
        if digest in self._digests:
            if summary:
                self.promote(digest)
            return
        self.added += 1
        if len(self._log) >= _LOG:
            del self._log[0]
        if digest in self._dropped:  # discarded but still in its automaton: find it there again
            self._dropped.discard(digest)  # (a second copy would outlive every merge)
            self._digests.add(digest)
            if summary:
                self.promote(digest)
            # Searched for by its first bytes: any piece of a text finds every place it lies.
            anchor = data[:ANCHOR]
            self._log.append((anchor, (0, len(data), digest, data[-_TAIL:], len(anchor))))
            return
        keyed = self._key_of(data)
        if keyed is not None:  # found by content: a dict entry, no automaton
            table, key, offset = keyed
            candidate = (offset, len(data), digest, data[-_TAIL:], _EXTENT)
            table.setdefault(key, []).append(candidate)
            self._keyed[digest] = (table, key)
            self._digests.add(digest)
            self._log.append((data[offset : offset + _EXTENT], candidate))
            return
        anchor, offset = self._anchor(data)
        self._used[anchor] = self._used.get(anchor, 0) + 1
        self._digests.add(digest)
        item = (anchor, (offset, len(data), digest, data[-_TAIL:], len(anchor)))
        pool = self._summaries if summary else self._sources
        if summary:
            self._in_summaries.add(digest)
        pool.fresh.append(item)
        self._log.append(item)
        if len(pool.fresh) >= _BATCH:
            self._fold(pool)

    def promote(self, digest: str) -> None:
        """An indexed text is known as a summary's now: if its anchor lies in the sources'
        pool, a search for summaries runs that pool too while it is indexed (rare: a turn
        returned as a summary, a source another process recorded as one)."""
        indexed = digest in self._digests
        if indexed and digest not in self._keyed and digest not in self._in_summaries:
            self._promoted.add(digest)

    def _fold(self, pool: _Pool) -> None:
        """The pool's batch becomes a tier-0 automaton; full tiers merge upwards. A level's tier
        is set by its size, so a merge that left out many discarded texts lands where its peers
        are; once discarded texts outnumber live ones, every level of both pools is rebuilt
        without them (memory stays within twice the texts indexed)."""
        levels = pool.levels
        levels.append(_Level(pool.fresh, 0))
        pool.fresh = []
        while len(levels) >= _FANOUT:
            tier = levels[-1].tier
            group = levels[-_FANOUT:]
            if any(level.tier != tier for level in group):
                break
            del levels[-_FANOUT:]
            kept = self._kept(group)
            if kept:
                levels.append(_Level(kept, _tier(len(kept))))
        if len(self._dropped) > max(len(self._digests), _BATCH):
            for each in (self._sources, self._summaries):
                kept = self._kept(each.levels)
                each.levels = [_Level(kept, _tier(len(kept)))] if kept else []

    def discard(self, digest: str) -> None:
        """Stop finding a text (a key's entry goes now; an anchor is left out of the automaton
        at its level's next merge)."""
        if digest not in self._digests:
            return
        self._digests.discard(digest)
        self._promoted.discard(digest)
        keyed = self._keyed.pop(digest, None)
        if keyed is None:
            self._dropped.add(digest)
            return
        table, key = keyed
        kept = [c for c in table[key] if c[2] != digest]
        if kept:
            table[key] = kept
        else:
            del table[key]

    def _key_of(self, data: bytes) -> tuple[dict[bytes, list[Candidate]], bytes, int] | None:
        """The table, key and anchor offset (its cut byte's, for a head; the key's, for a tail)
        a text is found by in `_keyed_hits`: its first key, in order, that no other text uses,
        of the first `_TRIES` in its first `_KEY_SPAN` bytes; None for a text with none (it is
        anchored in the automata). Cut bytes are found one after the other (`bytes.find`), not
        split out: the first one or two usually give the key."""
        cut = data[:_KEY_SPAN].translate(_CUTS)
        find, size = cut.find, len(cut)
        start, tries = 0, 0  # where the piece before the next cut starts
        end = find(_CUT)
        while end != -1:
            if end - start >= _KEY:  # a tail: the key before this cut
                key = data[end - _KEY : end]
                if key not in self._tails:
                    return self._tails, key, end - _KEY
                tries += 1
            start = end + 1
            end = find(_CUT, start)
            if (end if end != -1 else size) - start >= _KEY:  # a head: the key after the cut
                key = data[start : start + _KEY]
                if key not in self._heads:
                    return self._heads, key, start - 1
                tries += 1
            if tries >= _TRIES:
                return None
        return None

    def _anchor(self, data: bytes) -> tuple[bytes, int]:
        if len(data) <= ANCHOR:
            return data, 0
        last = len(data) - ANCHOR
        for offset in range(0, min(last, _TRIES * ANCHOR) + 1, ANCHOR):
            anchor = data[offset : offset + ANCHOR]
            if anchor not in self._used:
                return anchor, offset
        return data[last:], last  # the tail: unique unless the texts are all but identical

    def _kept(self, levels: list[_Level]) -> list[tuple[bytes, Candidate]]:
        """The items of `levels` not discarded (all, copied at C speed, when none was)."""
        if not self._dropped:
            return [i for level in levels for i in level.items()]
        return [i for level in levels for i in level.items() if self._keep(i)]

    def _keep(self, item: tuple[bytes, Candidate]) -> bool:
        anchor, digest = item[0], item[1][2]
        if digest not in self._dropped:
            return True
        self._dropped.discard(digest)
        self._in_summaries.discard(digest)  # (its one copy, in whichever pool)
        left = self._used.pop(anchor) - 1
        if left:
            self._used[anchor] = left
        return False

    def find(self, data: bytes, summaries: bool = False) -> list[tuple[int, int, str]]:
        """(start, end, digest) of every place in `data` where a known text may lie; unconfirmed.

        `summaries`: only the places of texts that may be summaries are needed (a new turn
        searched for the summaries it quotes): the sources' pool is not searched, unless one of
        its texts is promoted, and a long input is searched whole, its pieces not remembered
        (they would not be complete); places of keyed sources are given too."""
        size = len(data)
        if size < MIN_BYTES:
            return []
        # (longer than half the memory: searched whole, not cycled through it)
        chunked = not summaries and _CHUNKED <= size <= _MEMO_BYTES // 2
        hits = self._chunked(data) if chunked else self._hits(data, summaries)
        return _fitting(data, hits, self._digests)

    def _hits(self, data: bytes, summaries: bool = False) -> list[Hit]:
        """Every place in `data` where a key or an anchor of a pool lies, with its candidate (a
        discarded text's too: `find` leaves those out); with `summaries`, the sources' pool
        only while one of its texts is promoted."""
        hits: list[Hit] = []
        if self._keyed:
            self._keyed_hits(data, hits)
        self._search(self._summaries, data, hits)
        if not summaries or self._promoted:
            self._search(self._sources, data, hits)
        return hits

    def _search(self, pool: _Pool, data: bytes, hits: list[Hit]) -> None:
        """Add to `hits` every place in `data` where an anchor of `pool`'s levels or batch lies."""
        size = len(data)
        levels = pool.levels
        fresh = pool.fresh
        if size >= _CHUNKED and len(fresh) > _FIND_MAX:  # the batch becomes a level: a pass,
            self._fold(pool)  # not many `find`s (a find of 4 KB costs about an eighth of a pass)
            levels, fresh = pool.levels, pool.fresh  # (a fold may rebuild the list)
        if size >= _CHUNKED and len(levels) > 1:  # every pass past the first since the last
            pool.passes += size * (len(levels) - 1)  # merge of them all ...
            if pool.passes >= _BUILD_BYTES * sum(level.size for level in levels):
                self._merge_all(pool)  # ... has cost as much as merging them: one pass from now
                levels = pool.levels
        if size >= _LARGE_INPUT:
            self._consolidate(pool, size)
            levels, fresh = [], list(pool.fresh)
            for level in sorted(pool.levels, key=lambda level: level.size):
                if len(fresh) + level.size <= _FIND_MAX:  # a few `find`s cost less than a pass
                    fresh.extend(level.items())
                else:
                    levels.append(level)
        for level in levels:
            searcher = level.searcher(size)  # (groups `candidates`)
            candidates = level.candidates
            for index, at, _ in searcher.find_matches_as_indexes(data, overlapping=True):
                for candidate in candidates[index]:
                    hits.append((at, candidate))
        _placed(data, fresh, hits)

    def _keyed_hits(self, data: bytes, hits: list[Hit]) -> None:
        """Add to `hits` where a key of the texts found by content lies in `data` next to a cut
        byte (its anchor's place, with its candidate): every such place whose key and cut byte
        are both in `data`, so what a piece of an input gives depends on its bytes alone (as
        `_chunked` needs). The cut, the keys of each piece and their lookup run in C; only the
        keys found (rare in a new input) are placed, by the pieces' offsets."""
        pieces = data.translate(_CUTS).split(bytes([_CUT]))
        if len(pieces) < 2:
            return
        heads, tails = self._heads, self._tails
        # Each key sliced once: the lookups and the placing below read the same objects (a
        # bytes object keeps its hash), so a found key is not sliced and hashed a second time.
        head_keys = list(map(_HEAD, islice(pieces, 1, None)))
        tail_keys = list(map(_TAIL_KEY, islice(pieces, len(pieces) - 1)))
        found_heads = heads.keys() & head_keys
        found_tails = tails.keys() & tail_keys
        if not found_heads and not found_tails:
            return
        ends = list(accumulate(map(len, pieces)))  # piece n starts at ends[n - 1] + n
        if found_heads:
            for number in compress(range(1, len(pieces)), map(found_heads.__contains__, head_keys)):
                at = ends[number - 1] + number - 1  # the cut byte before it
                for candidate in heads[head_keys[number - 1]]:
                    hits.append((at, candidate))
        if found_tails:
            for number in compress(
                range(len(pieces) - 1), map(found_tails.__contains__, tail_keys)
            ):
                at = ends[number] + number - _KEY  # the key before the cut after it
                for candidate in tails[tail_keys[number]]:
                    hits.append((at, candidate))

    def _chunked(self, data: bytes) -> list[Hit]:
        """`_hits(data)`, searching only the pieces of `data` not remembered: its chunks
        (`_cuts`) and the seams between them (the `ANCHOR` - 1 bytes on each side of a cut).

        A chunk's entry holds the anchors lying wholly in it, a seam's those across its cut,
        so every anchor in `data` is in one entry, and each entry is a function of its key's
        bytes alone. A remembered entry is complete for the texts added up to its count: the
        ones added since are found with a `bytes.find` each from the log (then it is complete
        for the count now); one older than the log reaches is searched again. The pieces not
        remembered are searched in runs, one piece of `data` each (a pass a level). The
        lookups run in C (`map`): a long input has thousands of pieces, most remembered."""
        added, reach = self.added, ANCHOR - 1
        cuts = _cuts(data)
        inner = cuts[1:-1]
        # A chunk is looked up by its size and ends (hashing every byte of it costs more than
        # the rest of the lookup), then compared whole with the bytes its entry holds.
        chunk_keys = [(b - a, data[a : a + _ENDS], data[b - _ENDS : b]) for a, b in pairwise(cuts)]
        chunk_entries = list(map(self._chunks.get, chunk_keys))
        for number, entry in enumerate(chunk_entries):
            if entry is not None and not data.startswith(entry[2], cuts[number]):
                chunk_entries[number] = None  # other bytes with the same size and ends
        seam_keys = [data[c - reach : c + reach] for c in inner]
        seam_entries = list(map(self._seams.get, seam_keys))
        # Piece 2j is chunk j, piece 2k - 1 the seam at cut k (k >= 1), in the order of `data`.
        keys: list[Any] = [b""] * (2 * len(chunk_keys) - 1)
        keys[::2], keys[1::2] = chunk_keys, seam_keys
        entries: list[list[Any] | None] = [None] * len(keys)
        entries[::2], entries[1::2] = chunk_entries, seam_entries
        starts = [0] * len(keys)
        starts[::2], starts[1::2] = cuts[:-1], [c - reach for c in inner]
        ends = [0] * len(keys)
        ends[::2], ends[1::2] = cuts[1:], [min(c + reach, len(data)) for c in inner]
        oldest = added - len(self._log)  # an entry older than this is searched again
        new = [p for p, entry in enumerate(entries) if entry is None or entry[0] < oldest]
        for p in new:
            entries[p] = None
        hits: list[Hit] = []
        since = added
        for p, entry in enumerate(entries):
            if entry is not None:
                if entry[0] < since:
                    since = entry[0]
                if entry[1]:
                    start = starts[p]
                    hits.extend([(start + at, candidate) for at, candidate in entry[1]])

        def piece_of(at: int, length: int) -> int:
            """The piece whose entry holds an anchor of `length` bytes at `at`."""
            chunk = bisect_right(cuts, at) - 1
            return 2 * chunk if at + length <= cuts[chunk + 1] else 2 * chunk + 1

        if since < added:  # the texts added since some piece was searched, found in all of it
            log, grown = self._log, {}
            for number, (anchor, candidate) in enumerate(log[len(log) - (added - since) :]):
                addition = since + 1 + number
                for at in _places(data, anchor):
                    hits.append((at, candidate))
                    p = piece_of(at, candidate[4])
                    entry = entries[p]
                    if entry is not None and entry[0] < addition:
                        entry[1].append((at - starts[p], candidate))
                        grown[id(entry)] = entry
                        self._memo_bytes += _HIT_BYTES
            for entry in grown.values():  # (a key twice in `data` got the same hit twice)
                held = len(entry[1])
                entry[1] = list(dict.fromkeys(entry[1]))
                self._memo_bytes -= _HIT_BYTES * (held - len(entry[1]))
            for entry in entries:
                if entry is not None:
                    entry[0] = added
        fresh: dict[int, list[Hit]] = {p: [] for p in new}
        for start, end in _spans([(starts[p], ends[p]) for p in new]):
            for at, candidate in self._hits(data[start:end]):
                at += start
                hits.append((at, candidate))
                p = piece_of(at, candidate[4])
                piece_hits = fresh.get(p)
                if piece_hits is not None:
                    piece_hits.append((at - starts[p], candidate))
        for p, piece_hits in fresh.items():
            memo, key = self._chunks if p % 2 == 0 else self._seams, keys[p]
            old = memo.get(key)
            if old is not None:
                if old[0] == added and data.startswith(old[-1] if p % 2 == 0 else key, starts[p]):
                    continue  # the same piece earlier in `data`
                self._memo_bytes -= _charge(key, old)  # too old, or other bytes: replaced
            entry = [added, piece_hits] if p % 2 else [added, piece_hits, data[starts[p] : ends[p]]]
            memo[key] = entry
            self._memo_bytes += _charge(key, entry)
        deque(map(self._chunks.move_to_end, chunk_keys), maxlen=0)  # just used: most recent
        deque(map(self._seams.move_to_end, seam_keys), maxlen=0)
        while self._memo_bytes > _MEMO_BYTES:  # the least recently used out, chunks first
            if self._chunks:
                self._memo_bytes -= _charge(*self._chunks.popitem(last=False))
            else:
                self._memo_bytes -= _charge(*self._seams.popitem(last=False))
        return hits

    def find_added(self, data: bytes, since: int) -> list[tuple[int, int, str]] | None:
        """What `find(data)` gives for the texts added after addition number `since` (the
        `added` of an earlier search of the same input), a search for each anchor alone
        (`_placed`); None when more were added than the log holds (then search whole). The
        caller's earlier result stands only while nothing was discarded since (a discarded
        text may be in it)."""
        count = self.added - since
        if count < 0 or count > len(self._log):
            return None
        if count == 0 or len(data) < MIN_BYTES:
            return []
        recent = self._log[len(self._log) - count :]
        if len(data) < _MEMMEM_BYTES and not any(map(data.__contains__, map(_ANCHOR_OF, recent))):
            return []  # no anchor added since lies in it (the usual: one `in` in C per text)
        digests, dropped = self._digests, self._dropped
        added = [i for i in recent if i[1][2] not in dropped]
        hits: list[Hit] = []
        _placed(data, added, hits)
        return _fitting(data, hits, digests)

    def _merge_all(self, pool: _Pool) -> None:
        """Every level of `pool` merges into one (the texts discarded left out), counted as
        searched with the bytes every one of them was: its DFA is paid for as theirs were, and
        the level is not searched with an NFA again until it has been (`_Level.searcher`)."""
        levels = pool.levels
        kept = self._kept(levels)
        pool.levels = [_Level(kept, _tier(len(kept)))] if kept else []
        if kept:
            pool.levels[0]._searched = min(level._searched for level in levels)
        pool.passes = 0

    def _consolidate(self, pool: _Pool, size: int) -> None:
        """Before a large input: every level of `pool` merges into one when building it costs
        less than the passes it saves (each level is one pass over the input), else the levels
        under the largest do, on the same condition."""
        if len(pool.levels) < 2:
            return
        if sum(level.size for level in pool.levels) * _BUILD_BYTES <= size * (len(pool.levels) - 1):
            kept = self._kept(pool.levels)
            pool.levels = [_Level(kept, _tier(len(kept)))] if kept else []
            return
        if len(pool.levels) < 3:
            return
        largest = max(pool.levels, key=lambda level: level.size)
        rest = [level for level in pool.levels if level is not largest]
        if sum(level.size for level in rest) * _BUILD_BYTES > size * (len(rest) - 1):
            return
        kept = self._kept(rest)
        pool.levels = [largest]
        if kept:
            pool.levels.append(_Level(kept, max(level.tier for level in rest)))
