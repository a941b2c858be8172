"""The provenance model: sources, regions, and the ledger that recognises them in a call's input.

A region's provenance is computed, never trusted from the caller: the ledger finds the texts it has
seen before (registered sources, outputs of guarded summarizers) inside the input, whole or
embedded, and everything else counts as original content that no store holds yet.
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import ahocorasick_rs

if TYPE_CHECKING:
    from policyhook.stores import Store

#: Texts shorter than this are recognised only as a whole input or a whole message, never inside a
#: larger string: a short summary such as "OK" would otherwise match everywhere.
MIN_EMBEDDED_CHARS = 16
#: Known texts are found by this many leading characters, then confirmed in full.
_ANCHOR_CHARS = 64
#: Kind given to content the ledger did not recognise (it rests on no registered source).
UNREGISTERED = "window"


def text_id(prefix: str, text: str) -> str:
    """A stable, content-addressed id: the same text always gets the same id."""
    return f"{prefix}:{hashlib.sha256(text.encode('utf-8', 'surrogatepass')).hexdigest()[:16]}"


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

    Bounded: the least recently recorded texts are forgotten first.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._known: OrderedDict[str, Region] = OrderedDict()
        self._automaton: ahocorasick_rs.AhoCorasick | None = None
        self._anchors: list[str] = []
        self._by_anchor: dict[str, list[str]] = {}
        self._dirty = False

    def __len__(self) -> int:
        return len(self._known)

    def add(self, text: str, region: Region) -> None:
        self._known[text] = region
        self._known.move_to_end(text)
        while len(self._known) > self.capacity:
            self._known.popitem(last=False)
        self._dirty = True

    def exact(self, text: str) -> Region | None:
        return self._known.get(text)

    def max_depth(self) -> int:
        return max((r.depth for r in self._known.values()), default=0)

    def find(self, text: str) -> Iterator[tuple[int, int, Region]]:
        """Non-overlapping occurrences of known texts, leftmost first, longest on a tie."""
        if self._dirty:
            self._rebuild()
        if self._automaton is None or len(text) < MIN_EMBEDDED_CHARS:
            return
        hits: list[tuple[int, int, str]] = []
        for index, start, _end in self._automaton.find_matches_as_indexes(text, overlapping=True):
            for known in self._by_anchor[self._anchors[index]]:
                if text.startswith(known, start):
                    hits.append((start, -len(known), known))
        hits.sort()
        cursor = 0
        for start, negative_len, known in hits:
            if start >= cursor:
                cursor = start - negative_len
                yield start, cursor, self._known[known]

    def _rebuild(self) -> None:
        by_anchor: dict[str, list[str]] = {}
        for known in self._known:
            if len(known) >= MIN_EMBEDDED_CHARS:
                by_anchor.setdefault(known[:_ANCHOR_CHARS], []).append(known)
        self._by_anchor = by_anchor
        self._anchors = list(by_anchor)
        self._automaton = ahocorasick_rs.AhoCorasick(self._anchors) if self._anchors else None
        self._dirty = False


def content_of(item: Any) -> str | None:
    """The text of a message-like item: a str, `.content`, or a `"content"` key.

    Content given as a list of blocks (`[{"type": "text", "text": ...}]`, as chat APIs do) is
    joined with newlines.
    """
    if isinstance(item, str):
        return item
    content = item.get("content") if isinstance(item, Mapping) else getattr(item, "content", None)
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [
            b if isinstance(b, str) else b.get("text") if isinstance(b, Mapping) else None
            for b in content
        ]
        return "\n".join(t for t in texts if isinstance(t, str))
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
        self.store.put_summary(window, region, text)
        with self._lock:
            self._recognizer(window).add(text, region)
        return region

    def archive(self, unregistered: Iterable[tuple[str, str]]) -> None:
        """Store unrecognised original content as sources, so summaries of it stay derivable."""
        for source_id, text in unregistered:
            self.store.put_source(Source(source_id, UNREGISTERED), text)

    # -- recognition ----------------------------------------------------------------------------

    def resolve(
        self, value: Any, window: str, extractor: Callable[[Any], Any] | None = None
    ) -> Resolution:
        """What `value` (a str, list of str/messages/regions, message, or Region) rests on."""
        if extractor is not None:
            value = extractor(value)
        parts: list[Region] = []
        unregistered: list[tuple[str, str]] = []
        texts: list[str] = []
        with self._lock:
            recognizers = (self._recognizer(window), self._shared_recognizer())
            for item in value if isinstance(value, list | tuple) else (value,):
                if isinstance(item, Region):
                    parts.append(item)
                    texts.append(item.text or item.id)
                    continue
                text = content_of(item)
                if text is None:
                    raise TypeError(
                        "cannot tell what this input rests on: expected str, Region, a message "
                        "with .content or a 'content' key, or a list of those; got "
                        f"{type(item).__name__} (pass extractor= to the guard for other shapes)"
                    )
                texts.append(text)
                self._split(text, recognizers, parts, unregistered)
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
        spans = sorted(s for r in recognizers for s in r.find(text))
        cursor = 0
        for start, end, known in spans:
            if start < cursor:
                continue  # overlaps a text already matched by the other recognizer
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
            recognizer = _Recognizer(self.max_texts_per_window)
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
