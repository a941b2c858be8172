"""The provenance model: sources, regions, and the ledger that recognises them in a call's input.

A region's provenance is computed, never trusted from the caller: the ledger finds the texts it has
seen before (registered sources, outputs of guarded summarizers) inside the input, whole or
embedded, and everything else counts as original content that no store holds yet.
"""

from __future__ import annotations

import hashlib
import secrets
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ahocorasick_rs

from policyhook import _shapes

if TYPE_CHECKING:
    from policyhook.stores import Store

#: Texts shorter than this are recognised only as a whole input or a whole message, never inside a
#: larger string: a short summary such as "OK" would otherwise match everywhere.
MIN_EMBEDDED_CHARS = 16
#: Known texts are found by this many leading characters, then confirmed in full.
_ANCHOR_CHARS = 64
#: Texts recorded since the automaton was built are searched one by one, up to this many.
_PENDING = 16
#: Inputs at least this long are searched with a DFA (built on demand) instead of an NFA.
_LARGE_INPUT = 256 * 1024
#: ... unless there are more anchors than this (a DFA takes ~14 KB per anchor).
_DFA_MAX_ANCHORS = 512
_DFA = ahocorasick_rs.Implementation.DFA
_NFA = ahocorasick_rs.Implementation.ContiguousNFA
#: Kind given to content the ledger did not recognise (it rests on no registered source).
UNREGISTERED = "window"


#: Leading UTF-8 bytes of a text that a store indexes it by, for finding it inside longer input.
ANCHOR_BYTES = MIN_EMBEDDED_CHARS
#: Key for ids made without a store (`Region.original`, adapters): random per process, so an id
#: that leaves the process cannot be reversed by hashing guesses of a short text.
_PROCESS_KEY = secrets.token_bytes(32)


def encode(text: str) -> bytes:
    """A text's UTF-8 bytes; lone surrogates pass through so every str has a digest."""
    return text.encode("utf-8", "surrogatepass")


def digest(key: bytes, data: bytes) -> str:
    """Keyed hash of `data` (BLAKE2b-128 keyed with a store's secret): the text's lookup key."""
    return hashlib.blake2b(data, key=key, digest_size=16).hexdigest()


def anchor_of(key: bytes, data: bytes) -> str | None:
    """Keyed hash of a text's first `ANCHOR_BYTES` bytes; None for texts too short to embed."""
    if len(data) < ANCHOR_BYTES:
        return None
    return hashlib.blake2b(
        data[:ANCHOR_BYTES], key=key, digest_size=8, person=b"anchor"
    ).hexdigest()


def text_id(prefix: str, text: str, key: bytes | None = None) -> str:
    """A content-addressed id, keyed: the same text and key always give the same id.

    Ids leave the process (spans, decision logs), so they are keyed hashes: a store's secret
    (shared by every process using that store) or, without one, a per-process random key.
    """
    return f"{prefix}:{digest(key or _PROCESS_KEY, encode(text))[:16]}"


@dataclass(frozen=True)
class Entry:
    """What a store knows about one text, found by its keyed digest.

    Stored normalised, so a store's size is linear in texts: a summary names the summaries it was
    made from (`parents`) and only the sources it rests on directly (`sources`); everything it
    rests on is the closure over parents (`Store.rests_on`). A source's entry has depth 0 and
    `sources == (id,)`. `source_kinds` is the full set of kinds (small, not normalised).
    """

    digest: str
    id: str
    depth: int = 0
    kind: str = "summary"  # a source's kind, or "summary"
    size: int = 0  # UTF-8 bytes
    anchor: str | None = None
    parents: tuple[str, ...] = ()
    sources: tuple[str, ...] = ()
    source_kinds: tuple[str, ...] = ()
    window: str = ""

    @classmethod
    def of_source(cls, key: bytes, source: Source, text: str) -> Entry:
        data = encode(text)
        return cls(
            digest=digest(key, data),
            id=source.id,
            kind=source.kind,
            size=len(data),
            anchor=anchor_of(key, data),
            sources=(source.id,),
            source_kinds=(source.kind,),
        )


@dataclass(frozen=True)
class Source:
    """Original evidence (config read, tool output, user turn, …) held by a store under `id`."""

    id: str
    kind: str


@dataclass(frozen=True)
class Region:
    """A piece of window content and what it rests on.

    `depth` 0 is original evidence; a summary of regions has depth max(inputs) + 1. `sources` is
    every source id it transitively rests on. Liveness is not stored here: it is looked up at
    decision time, because a store can evict at any moment.
    """

    id: str
    depth: int = 0
    sources: frozenset[str] = frozenset()
    source_kinds: frozenset[str] = frozenset()
    chars: int = 0
    text: str | None = field(default=None, repr=False, compare=False)

    @property
    def kind(self) -> str:
        return "original" if self.depth == 0 else "summary"

    @classmethod
    def original(
        cls, text: str, sources: Iterable[Source] = (), region_id: str | None = None
    ) -> Region:
        """An explicit original region, for callers that know what their content rests on."""
        srcs = tuple(sources)
        return cls(
            id=region_id or text_id("r", text),
            sources=frozenset(s.id for s in srcs),
            source_kinds=frozenset(s.kind for s in srcs),
            chars=len(text),
            text=text,
        )

    @classmethod
    def merge(cls, parts: Iterable[Region], region_id: str) -> Region:
        """The region made of `parts` side by side: deepest part's depth, union of sources."""
        parts = tuple(parts)
        return cls(
            id=region_id,
            depth=max((p.depth for p in parts), default=0),
            sources=frozenset().union(*(p.sources for p in parts)),
            source_kinds=frozenset().union(*(p.source_kinds for p in parts)),
            chars=sum(p.chars for p in parts),
        )

    def summarized_as(self, text: str) -> Region:
        """The region a summary of this one is: one pass deeper, resting on the same sources."""
        return Region(
            id=text_id("s", text),
            depth=self.depth + 1,
            sources=self.sources,
            source_kinds=self.source_kinds,
            chars=len(text),
            text=text,
        )


@dataclass(frozen=True)
class Resolution:
    """What a call's input is made of: the merged region, and the unrecognised content in it."""

    region: Region
    unregistered: tuple[tuple[str, str], ...] = ()  # (source id, text) of content no store holds


class _Recognizer:
    """Finds known texts inside an input in one linear pass (Aho-Corasick over short anchors).

    A window's recognizer also finds the texts of the `shared` one (registered sources): one
    automaton, one pass over the input for both. The automaton runs over UTF-8 bytes (several
    times faster than over `str`). Texts recorded since it was built are searched with
    `str.find` until there are `_PENDING` of them or the input is large, so a granted call does
    not rebuild the automaton over every tracked text. Bounded: the least recently recorded
    texts are forgotten first.
    """

    def __init__(self, capacity: int, shared: _Recognizer | None = None) -> None:
        self.capacity = capacity
        self.shared = shared
        self._known: OrderedDict[str, Region] = OrderedDict()
        self._automaton: ahocorasick_rs.BytesAhoCorasick | None = None
        self._anchors: list[str] = []
        self._by_anchor: dict[str, list[str]] = {}
        self._pending: list[str] = []  # embeddable texts recorded since the last build
        self._stale = False  # too many were recorded to keep them pending: rebuild
        self._scans = 0  # searches since a text was last recorded
        self._dfa = False
        self._max_depth = 0  # deepest region known; -1 when it must be recomputed
        self._log: list[str] = []  # recent embeddable texts, for recognizers sharing this one
        self._log_start = 0  # how many texts were dropped from the front of `_log`
        self._shared_seen = 0  # position in `shared`'s log when the automaton was built

    def __len__(self) -> int:
        return len(self._known)

    def add(self, text: str, region: Region) -> None:
        previous = self._known.get(text)
        self._known[text] = region
        self._known.move_to_end(text)
        if previous is not None and previous.depth >= self._max_depth:
            self._max_depth = -1  # the deepest may have been replaced: recomputed when asked
        elif self._max_depth >= 0:
            self._max_depth = max(self._max_depth, region.depth)
        while len(self._known) > self.capacity:
            _, forgotten = self._known.popitem(last=False)  # in the automaton until rebuilt
            if forgotten.depth >= self._max_depth:
                self._max_depth = -1
        if previous is None and len(text) >= MIN_EMBEDDED_CHARS:
            self._scans = 0
            if len(self._pending) < _PENDING:
                self._pending.append(text)
            else:
                self._pending, self._stale = [], True
            self._log.append(text)
            if len(self._log) > 2 * _PENDING:
                del self._log[:_PENDING]
                self._log_start += _PENDING

    def exact(self, text: str) -> Region | None:
        return self._known.get(text)

    def max_depth(self) -> int:
        if self._max_depth < 0:
            self._max_depth = max((r.depth for r in self._known.values()), default=0)
        return self._max_depth

    def _shared_pending(self) -> list[str] | None:
        """Shared texts recorded since the automaton was built; None if too many to search."""
        shared = self.shared
        if shared is None:
            return []
        seen, start = self._shared_seen, shared._log_start
        if seen < start or start + len(shared._log) - seen > _PENDING:
            return None
        return shared._log[seen - start :]

    def _region(self, known: str) -> Region | None:
        region = self._known.get(known)
        if region is None and self.shared is not None:
            region = self.shared._known.get(known)
        return region  # None: forgotten since the automaton was built

    def find(self, text: str) -> Iterator[tuple[int, int, Region]]:
        """Non-overlapping occurrences of known texts, leftmost first, longest on a tie."""
        if len(text) < MIN_EMBEDDED_CHARS:
            return
        large = len(text) >= _LARGE_INPUT
        extra = self._shared_pending()
        if extra is None or self._stale:
            self._rebuild(dfa=large)
            extra = []
        elif self._pending or extra:
            self._scans += 1
            # Fold recent texts in when there are many, when they have been searched a while
            # with nothing new recorded (a quiet window), or when the input is large.
            if len(self._pending) + len(extra) > _PENDING or self._scans > _PENDING or large:
                self._rebuild(dfa=large)
                extra = []
        elif large and self._automaton is not None and not self._dfa:
            self._rebuild(dfa=True)
        hits: list[tuple[int, int, str]] = []
        if self._automaton is not None:
            data = text.encode("utf-8", "surrogatepass")
            matches = self._automaton.find_matches_as_indexes(data, overlapping=True)
            starts = [m[1] for m in matches]
            if len(data) != len(text):  # not ASCII: byte offsets to character offsets
                starts = _char_offsets(data, starts)
            for (index, _, _), start in zip(matches, starts, strict=True):
                for known in self._by_anchor[self._anchors[index]]:
                    if text.startswith(known, start):
                        hits.append((start, -len(known), known))
        for known in (*self._pending, *extra):  # may hold a forgotten text: skipped below
            start = text.find(known)
            while start != -1:
                hits.append((start, -len(known), known))
                start = text.find(known, start + 1)
        hits.sort()
        cursor = 0
        for start, negative_len, known in hits:
            if start >= cursor:
                region = self._region(known)
                if region is not None:
                    cursor = start - negative_len
                    yield start, cursor, region

    def _rebuild(self, dfa: bool = False) -> None:
        texts = list(self._known)
        if self.shared is not None:
            texts += self.shared._known
            self._shared_seen = self.shared._log_start + len(self.shared._log)
        by_anchor: dict[str, list[str]] = {}
        for known in texts:
            if len(known) >= MIN_EMBEDDED_CHARS:
                by_anchor.setdefault(known[:_ANCHOR_CHARS], []).append(known)
        self._by_anchor = by_anchor
        self._anchors = list(by_anchor)
        self._automaton = (
            ahocorasick_rs.BytesAhoCorasick(
                [a.encode("utf-8", "surrogatepass") for a in self._anchors],
                # A DFA searches up to twice as fast but costs ten times more to build and
                # twenty times the memory: worth it only for large inputs.
                implementation=_DFA if dfa and len(self._anchors) <= _DFA_MAX_ANCHORS else _NFA,
            )
            if self._anchors
            else None
        )
        self._pending, self._stale, self._scans, self._dfa = [], False, 0, dfa


def _char_offsets(data: bytes, starts: list[int]) -> list[int]:
    """Character offsets of UTF-8 byte offsets (each at a character boundary), in one pass."""
    result: list[int] = []
    byte = char = 0
    for start in sorted(set(starts)):
        char += len(data[byte:start].decode("utf-8", "surrogatepass"))
        byte = start
        result.append(char)
    where = dict(zip(sorted(set(starts)), result, strict=True))
    return [where[s] for s in starts]


def content_of(item: Any) -> str | None:
    """The text of a message-like item as the guard reads it (`policyhook._shapes`), or None
    when its shape cannot be read. For adapters that read known shapes; the guard itself reads
    with `_shapes.read`, which refuses what it cannot read."""
    try:
        return _shapes.text(item)
    except TypeError:
        return None


class Ledger:
    """Remembers sources and granted summaries, and tells what a call's input rests on.

    Thread-safe. Recognition memory is bounded per window (`max_texts_per_window`) and in the
    number of windows kept (`max_windows`, least recently used first out); the store keeps the
    durable record, and a window forgotten here is reloaded from it on next use.
    """

    def __init__(
        self, store: Store, *, max_texts_per_window: int = 1024, max_windows: int = 256
    ) -> None:
        self.store = store
        self.max_texts_per_window = max_texts_per_window
        self.max_windows = max_windows
        self._lock = threading.RLock()
        self._windows: OrderedDict[str, _Recognizer] = OrderedDict()
        self._shared: _Recognizer | None = None

    # -- recording ------------------------------------------------------------------------------

    def record_source(self, text: str, kind: str, source_id: str | None = None) -> Source:
        """Put original evidence in the store, so that summaries resting on it stay derivable."""
        if not isinstance(text, str):
            raise TypeError(f'"text" must be a str: {type(text).__name__}')
        if not kind:
            raise ValueError('"kind" must be a non-empty string, e.g. "config_read"')
        source = Source(id=source_id or text_id(kind, text), kind=kind)
        self.store.put_source(source, text)
        region = Region(
            id=source.id,
            sources=frozenset({source.id}),
            source_kinds=frozenset({kind}),
            chars=len(text),
        )
        with self._lock:
            self._shared_recognizer().add(text, region)
        return source

    def record_summary(self, text: str, summarized: Region, window: str) -> Region:
        """Remember a granted summary's output, so it is recognised when it comes back."""
        region = summarized.summarized_as(text)
        key, data = self.store.secret(), encode(text)
        entry = Entry(
            digest=digest(key, data),
            id=region.id,
            depth=region.depth,
            size=len(data),
            anchor=anchor_of(key, data),
            sources=tuple(sorted(region.sources)),
            source_kinds=tuple(sorted(region.source_kinds)),
            window=window,
        )
        self.store.put_summary(entry, text)
        with self._lock:
            self._recognizer(window).add(text, region)
        return region

    def archive(self, unregistered: Iterable[tuple[str, str]]) -> None:
        """Store unrecognised original content as sources, so summaries of it stay derivable."""
        for source_id, text in unregistered:
            self.store.put_source(Source(source_id, UNREGISTERED), text)

    # -- recognition ----------------------------------------------------------------------------

    def resolve(self, value: Any, window: str) -> Resolution:
        """What `value` rests on: any shape `policyhook._shapes` reads (str, messages, content
        blocks, Regions, nested lists); TypeError naming the part it cannot read."""
        units = _shapes.read(value, keep=(Region,))
        parts: list[Region] = []
        unregistered: list[tuple[str, str]] = []
        texts: list[str] = []
        with self._lock:
            recognizers = (self._recognizer(window), self._shared_recognizer())
            for unit in units:
                if isinstance(unit, Region):
                    parts.append(unit)
                    texts.append(unit.text or unit.id)
                else:
                    texts.append(unit)
                    self._split(unit, recognizers, parts, unregistered)
        region_id = text_id("r", "\x1e".join(texts))
        return Resolution(Region.merge(parts, region_id), tuple(unregistered))

    def _split(
        self,
        text: str,
        recognizers: tuple[_Recognizer, ...],
        parts: list[Region],
        unregistered: list[tuple[str, str]],
    ) -> None:
        for recognizer in recognizers:
            known = recognizer.exact(text)
            if known is not None:
                parts.append(known)
                return
        cursor = 0
        for start, end, known in recognizers[0].find(text):  # the window's: sources included
            self._gap(text[cursor:start], parts, unregistered)
            parts.append(known)
            cursor = end
        self._gap(text[cursor:] if cursor else text, parts, unregistered)

    @staticmethod
    def _gap(text: str, parts: list[Region], unregistered: list[tuple[str, str]]) -> None:
        if not text.strip():
            return
        source_id = text_id(UNREGISTERED, text)
        unregistered.append((source_id, text))
        parts.append(
            Region(
                id=source_id,
                sources=frozenset({source_id}),
                source_kinds=frozenset({UNREGISTERED}),
                chars=len(text),
            )
        )

    def max_depth(self, window: str) -> int:
        """The deepest summary the window is known to hold."""
        with self._lock:
            return self._recognizer(window).max_depth()

    # -- memory ---------------------------------------------------------------------------------

    def _recognizer(self, window: str) -> _Recognizer:
        recognizer = self._windows.get(window)
        if recognizer is None:
            recognizer = _Recognizer(self.max_texts_per_window, self._shared_recognizer())
            for region, text in self.store.summaries(window, self.max_texts_per_window):
                recognizer.add(text, region)
            self._windows[window] = recognizer
            while len(self._windows) > self.max_windows:
                self._windows.popitem(last=False)
        self._windows.move_to_end(window)
        return recognizer

    def _shared_recognizer(self) -> _Recognizer:
        if self._shared is None:
            self._shared = _Recognizer(self.max_texts_per_window)
            for source, text in self.store.sources(self.max_texts_per_window):
                region = Region(
                    id=source.id,
                    sources=frozenset({source.id}),
                    source_kinds=frozenset({source.kind}),
                    chars=len(text),
                )
                self._shared.add(text, region)
        return self._shared
