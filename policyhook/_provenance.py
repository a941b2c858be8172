"""The provenance model: sources, regions, and the ledger that recognises them in a call's input.

A region's provenance is computed, never trusted from the caller: the ledger finds the texts it has
seen before (registered sources, outputs of guarded summarizers) inside the input, whole or
embedded, and everything else counts as original content that no store holds yet.
"""

from __future__ import annotations

import bisect
import hashlib
import inspect
import itertools
import logging
import math
import operator
import re
import secrets
import threading
from collections import OrderedDict
from collections.abc import Collection, Iterable, Iterator, Mapping, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import dataclass, field, replace
from typing import Any, Literal, Protocol, TypeVar, runtime_checkable

from policyhook import _fork, _shapes
from policyhook._closures import Closures
from policyhook._index import MIN_BYTES, Index

_logger = logging.getLogger("policyhook")

#: Texts shorter than this (in UTF-8 bytes) are recognised only as a whole input or a whole
#: message, never inside a larger string: a short summary such as "OK" would otherwise match
#: everywhere.
MIN_EMBEDDED_CHARS = MIN_BYTES
#: Kind given to content the ledger did not recognise (it rests on no registered source).
UNREGISTERED = "window"
#: Messages whose known texts found are remembered for the next input holding them (most recently
#: used): a chat resent with one more turn is not searched, nor asked of the store, again.
_SPLITS = 256
#: ... and the known texts found in them that are remembered in all: a window rendered as one
#: 4 MB string holds a thousand, and 256 such splits held ~140 MB (and were most of what the
#: cyclic GC visited).
_SPLIT_PLACES = 4096
#: Region ids of recent inputs kept (by their parts' digests), so an input seen again is not
#: hashed a second time for its id; all dropped at once past this many, and kept only for
#: inputs of up to about 60 parts (the key is their digests joined: at most ~0.5 MB in all).
_REGION_IDS = 256
_REGION_ID_KEY = 2048
#: Messages whose digests are remembered (`Ledger._message_digests`): at most this many, all
#: dropped at once past it, each of at most `_HASHED_CHARS` characters (~4 MB of text in all).
_HASHED = 256
_HASHED_CHARS = 16_384
#: Granted summaries whose store write failed kept for writing again; past this many (a store
#: down for long), the oldest are dropped with a warning and only this process knows them.
_UNWRITTEN = 1_024
#: The kinds of an unrecognised gap's region (one set, shared).
_GAP_KINDS = frozenset((UNREGISTERED,))
#: Kind given to content that could not be checked because the store did not answer.
UNVERIFIABLE = "unverifiable"
#: A character that is not whitespace (`str.isspace`'s, the one `str.strip` strips): a gap
#: with none is dropped, found without copying the gap out of its message.
_NONSPACE = re.compile(r"\S")


#: Leading UTF-8 bytes of a text that a store indexes it by, for finding it inside longer input.
ANCHOR_BYTES = MIN_EMBEDDED_CHARS
#: Key for ids made without a store (`Region.original`, adapters): random per process, so an id
#: that leaves the process cannot be reversed by hashing guesses of a short text.
_PROCESS_KEY = secrets.token_bytes(32)


_T = TypeVar("_T")


def _made(cls: type[_T], fields: dict[str, Any]) -> _T:
    """An instance of a frozen dataclass from every one of its fields, without the generated
    `__init__` (which sets each field with `object.__setattr__`: twice the cost). The hot path
    builds several per call; the instance is the one `cls(**fields)` would make."""
    made = object.__new__(cls)
    made.__dict__.update(fields)
    return made


def encode(text: str) -> bytes:
    """A text's UTF-8 bytes; lone surrogates pass through so every str has a digest."""
    return text.encode("utf-8", "surrogatepass")


def digest(key: bytes, data: bytes) -> str:
    """Keyed hash of `data` (BLAKE2b-128 keyed with a store's secret): the text's lookup key."""
    return hashlib.blake2b(data, key=key, digest_size=16).hexdigest()


def prefix_digests(key: bytes, data: bytes, cut: int) -> tuple[str, str]:
    """`(digest(key, data[:cut]), digest(key, data))` in one pass over `data`: a unit and the
    same unit without its trailing whitespace share every byte up to `cut`, and BLAKE2b is
    streamed, so the state after the prefix is copied instead of the prefix hashed again."""
    view = memoryview(data)
    hashed = hashlib.blake2b(view[:cut], key=key, digest_size=16)
    prefix = hashed.copy()
    hashed.update(view[cut:])
    return prefix.hexdigest(), hashed.hexdigest()


def _anchor_hash(key: bytes) -> hashlib.blake2b:
    """The keyed hash anchors are made with, before any data."""
    return hashlib.blake2b(key=key, digest_size=8, person=b"anchor")


def anchor_of(key: bytes, data: bytes) -> str | None:
    """Keyed hash of a text's first `ANCHOR_BYTES` bytes; None for texts too short to embed."""
    if len(data) < ANCHOR_BYTES:
        return None
    hashed = _anchor_hash(key)
    hashed.update(data[:ANCHOR_BYTES])
    return hashed.hexdigest()


class KeyedHashes:
    """`digest` and `anchor_of` under one key, keyed once: copying a keyed BLAKE2b costs less
    than keying a new one, and every text recorded or found is hashed (the ledger's and
    MemoryStore's; `Entry.of_source` takes either these or the key)."""

    __slots__ = ("anchored", "digested")

    def __init__(self, key: bytes) -> None:
        self.digested = hashlib.blake2b(key=key, digest_size=16)  # before any data
        self.anchored = _anchor_hash(key)

    def digest(self, data: bytes | memoryview) -> str:
        """`digest(key, data)`."""
        hashed = self.digested.copy()
        hashed.update(data)
        return hashed.hexdigest()

    def anchor(self, data: bytes) -> str | None:
        """`anchor_of(key, data)`."""
        if len(data) < ANCHOR_BYTES:
            return None
        hashed = self.anchored.copy()
        hashed.update(data[:ANCHOR_BYTES])
        return hashed.hexdigest()


def text_id(prefix: str, text: str, key: bytes | None = None) -> str:
    """A content-addressed id, keyed: the same text and key always give the same id.

    Ids leave the process (spans, decision logs), so they are keyed hashes: a store's secret
    (shared by every process using that store) or, without one, a per-process random key.
    """
    return f"{prefix}:{digest(key or _PROCESS_KEY, encode(text))[:16]}"


class SourceIdConflictError(ValueError):
    """A source id the store has held names another text: registering this one is refused.

    A source id names one text forever. Summaries made from the text an id held rest on that id;
    if the id could take a new text, they would count it live while the store can only give
    back the new one (a wrong allow). A ValueError because the caller chose the id: nothing was
    changed, and the way forward is another id.
    """

    #: The way forward, for most conflicts.
    NEW_ID = (
        "register this text under a new id (e.g. a version suffix, or guard.text_id(prefix, "
        "text)), or leave source_id out so one is derived from the text"
    )

    def __init__(self, source_id: str, reason: str, way: str = NEW_ID) -> None:
        self.source_id = source_id
        super().__init__(f"source id {source_id!r} {reason}; a source id names one text: {way}")

    @classmethod
    def taken(cls, source_id: str, state: str) -> SourceIdConflictError:
        """The refusal every store gives when `source_id` (now `state`) named another text."""
        return cls(source_id, f"already names another text (now {state})")


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

    def merged(self, earlier: Entry | None) -> Entry:
        """This summary entry recorded again over `earlier` (the same text): provenance only
        grows (union of parents and sources, deepest depth), so no summary resting on the
        earlier record can lose a source by it. It keeps the earlier id (a registered text
        that quotes a summary has its source's id): summaries rest on their parents by id."""
        if earlier is None or earlier.depth == 0 or _same(earlier, self):
            return self
        parents = {*self.parents, *earlier.parents}
        parents.discard(self.id)
        parents.discard(earlier.id)
        return _made(
            Entry,
            {
                "digest": self.digest,
                "id": earlier.id,
                "depth": max(self.depth, earlier.depth),
                "kind": self.kind,
                "size": self.size,
                "anchor": self.anchor,
                "parents": tuple(sorted(parents)),
                "sources": tuple(sorted({*self.sources, *earlier.sources})),
                "source_kinds": tuple(sorted({*self.source_kinds, *earlier.source_kinds})),
                "window": self.window,
            },
        )

    def region(self, sources: frozenset[str], chars: int | None = None) -> Region:
        """The region this summary's entry stands for, resting on `sources` (the closure over
        its parents, `Store.rests_on`); `chars` defaults to the stored size."""
        return Region(
            id=self.id,
            depth=self.depth,
            sources=sources,
            source_kinds=frozenset(self.source_kinds),
            chars=self.size if chars is None else chars,
        )

    @classmethod
    def of_source(
        cls,
        key: bytes | KeyedHashes,
        source: Source,
        text: str,
        text_digest: str | None = None,
    ) -> Entry:
        """The entry of original evidence held under `source`; `key`: the store's secret, or
        its hashes keyed once (a store or ledger recording many); `text_digest`: the text's
        keyed digest when the caller has it already (`digest(key, encode(text))`)."""
        hashes = key if isinstance(key, KeyedHashes) else KeyedHashes(key)
        data = encode(text)
        return _made(  # `cls(...)`, without the frozen dataclass's `__setattr__` per field
            cls,
            {
                "digest": hashes.digest(data) if text_digest is None else text_digest,
                "id": source.id,
                "depth": 0,
                "kind": source.kind,
                "size": len(data),
                "anchor": hashes.anchor(data),
                "parents": (),
                "sources": (source.id,),
                "source_kinds": (source.kind,),
                "window": "",
            },
        )


def _same(one: Entry, other: Entry) -> bool:
    """`one == other`, as one comparison of their fields in C: the dataclass's `==` builds a
    tuple of each one's fields first, and every record compares entries."""
    return one is other or one.__dict__ == other.__dict__


def _rests_otherwise(earlier: Entry, entry: Entry) -> bool:
    """Whether `entry` (the same text as `earlier`, recorded again) may rest on other sources:
    its id, kind (a source's text become a summary's), parents or direct sources differ. Only
    then can a closure over it (its own, or one of a summary resting on it) be outgrown; a
    record that only got deeper or gained source kinds (a summarizer giving the same text for
    the same sources) leaves every closure exact."""
    return (
        earlier.id != entry.id
        or earlier.kind != entry.kind
        or earlier.parents != entry.parents
        or earlier.sources != entry.sources
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
    def of_source(cls, source: Source, chars: int = 0) -> Region:
        """The region of original evidence held under `source`: the one constructor of it."""
        return cls(
            id=source.id,
            sources=frozenset({source.id}),
            source_kinds=frozenset({source.kind}),
            chars=chars,
        )

    @classmethod
    def merge(cls, parts: Iterable[Region], region_id: str) -> Region:
        """The region made of `parts` side by side: deepest part's depth, union of sources."""
        parts = tuple(parts)
        if len(parts) == 1:  # the common case: one message (its sets are shared, not copied)
            (part,) = parts
            return cls(region_id, part.depth, part.sources, part.source_kinds, part.chars)
        return cls(
            region_id,
            max((p.depth for p in parts), default=0),
            frozenset().union(*[p.sources for p in parts]),
            frozenset().union(*[p.source_kinds for p in parts]),
            sum([p.chars for p in parts]),
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


#: A region resting on at least this many sources gets them as a `_Grown` set (made whole only
#: when read); a smaller one as a frozenset, as always.
_GROWN_FROM = 256
_GROWING = threading.Lock()  # held while a `_Grown` line is added to
#: A closure of at least this many sources found all held is handed to the store as `Held`
#: on the next pass; a smaller one is checked in full (cheaper than the bookkeeping).
_HELD_FROM = 256


class _Grown(AbstractSet[str]):
    """A region's source set as a rolling chain grows it: a frozenset `base` and the ids added
    to it since, made a frozenset only when something reads it whole (`Region.sources`).

    Why: the k-th pass of a rolling chain rests on its previous summary's k - 1 sources and
    one new turn. As frozensets, each pass made a new k-sized set (a copy), freed the one of
    two passes before, and every young GC collection visited the new ones id by id: a third
    of the pass at k = 3,000. Here a pass adds one id. The versions of one line share one dict
    of the ids added (in order, each with its place), each version holding a prefix of it, so
    adding to the newest version is one insert and every version answers `in` and `len` in
    O(1); adding to an older one (two summaries of one input) starts a line of its own, from
    that version made whole. The dict (str keys, int values) is never tracked by the GC.
    Immutable to its readers: a version never changes what it holds."""

    __slots__ = ("_added", "_base", "_made", "_size")

    def __init__(self, base: frozenset[str], added: dict[str, int], size: int) -> None:
        self._base, self._added, self._size = base, added, size
        self._made: frozenset[str] | None = None if size else base

    @classmethod
    def of(cls, sources: AbstractSet[str]) -> _Grown:
        return sources if type(sources) is _Grown else cls(frozenset(sources), {}, 0)

    @classmethod
    def _from_iterable(cls, it: Iterable[Any]) -> AbstractSet[Any]:
        return frozenset(it)  # what `-`, `&`, `|` of the `Set` mixins give: a frozenset

    def __len__(self) -> int:
        return len(self._base) + self._size

    def __contains__(self, item: object) -> bool:
        return item in self._base or self._added.get(item, self._size) < self._size  # type: ignore[call-overload]

    def __iter__(self) -> Iterator[str]:
        return iter(self.frozen())

    def __hash__(self) -> int:
        return hash(self.frozen())

    def frozen(self) -> frozenset[str]:
        """The ids as a frozenset, made once (k ids: only when something reads them all)."""
        made = self._made
        if made is None:  # (one C call: no thread adds to the line meanwhile)
            made = self._made = self._base.union(itertools.islice(self._added, self._size))
        return made

    def plus(self, ids: Iterable[str]) -> _Grown:
        """This set with `ids` added: itself if it holds them all."""
        # One ledger grows its lines under its lock, but a Region handed to another ledger
        # (`record_summary`) shares its line: two inserts at one version would each give a
        # version holding the other's id.
        with _GROWING:
            return self._plus(ids)

    def _plus(self, ids: Iterable[str]) -> _Grown:
        added, size, base = self._added, self._size, self._base
        if size != len(added):  # not the newest of its line
            fresh = {i for i in ids if i not in self}
            if not fresh:
                return self
            places = sorted(added.get(i, -1) for i in fresh)
            if places == list(range(size, size + len(fresh))):  # what the next version added
                return _Grown(base, added, size + len(fresh))  # (the same input resolved again)
            return _Grown(self.frozen(), {}, 0)._plus(fresh)  # else a line of its own
        for i in ids:
            if i not in base and i not in added:
                added[i] = len(added)
        return self if len(added) == size else _Grown(base, added, len(added))


def sources_of(region: Region) -> AbstractSet[str]:
    """`region.sources` as the region holds them: a `_Grown` set is not made whole (its `len`
    and `in` are O(1)); what the guard reads on its hot path, and gives the stores."""
    grown = region.__dict__.get("_grown")
    return region.sources if grown is None else grown


class _LazySources:
    """`Region.sources` of a region made with a `_Grown` set (`_grown`): the frozenset made
    from it when first read, and kept. A region made any other way holds its frozenset in its
    own `sources`, which comes first."""

    def __get__(self, region: Region | None, owner: type) -> frozenset[str]:
        if region is None:
            return frozenset()  # (the field's default)
        made: frozenset[str] = region.__dict__["_grown"].frozen()
        region.__dict__["sources"] = made
        return made


Region.sources = _LazySources()  # type: ignore[assignment]


def _region_of(
    region_id: str,
    depth: int,
    sources: AbstractSet[str],
    kinds: frozenset[str],
    chars: int,
    text: str | None,
) -> Region:
    """`Region(...)` without its `__init__` (`_made`), resting on `sources`: a `_Grown` set
    kept as it is (`Region.sources` makes it whole when read), in the place of the field."""
    grown = type(sources) is _Grown  # (not `isinstance`: an ABC's check runs in Python)
    return _made(
        Region,
        {
            "id": region_id,
            "depth": depth,
            "_grown" if grown else "sources": sources,
            "source_kinds": kinds,
            "chars": chars,
            "text": text,
        },
    )


@dataclass(frozen=True)
class Resolution:
    """What a call's input is made of: the merged region, and the unrecognised content in it."""

    region: Region
    unregistered: tuple[tuple[str, str], ...] = ()  # (source id, text) of content no store holds
    summaries: tuple[str, ...] = ()  # ids of the summaries the input is made of
    #: The region's sources the store held, read in the same round trip as the provenance
    #: (`Store.view`); None when the store was not asked (then ask `Store.live`).
    live: frozenset[str] | None = None
    #: Why the store could not be read (the region was resolved from what is cached: fail closed).
    failure: Exception | None = field(default=None, compare=False)
    #: What the ledger already knows of the region's liveness, for the view (`Held`).
    held: Held | None = field(default=None, compare=False, repr=False)
    #: Sources found inside units, or as a Region's text: when dead, they hide nothing they
    #: hold, and in a Region's text they are its declared content (`Ledger._declared`).
    embedded: frozenset[str] = field(default=frozenset(), compare=False, repr=False)


#: One part of an input as the ledger resolves it: (id, depth, sources, source kinds, chars),
#: the fields of the `Region` it stands for (plain tuples: an input has many, built per call).
_Part = tuple[str, int, AbstractSet[str], frozenset[str], int]
#: A part's sources and source kinds, read in C (`map`), not by a comprehension's own frame.
_SOURCES_OF, _KINDS_OF = operator.itemgetter(2), operator.itemgetter(3)


def _sources_besides(parts: list[_Part], at: int) -> frozenset[str]:
    """The sources of every part but the one at `at` (a chain's closure): what is added to it."""
    return frozenset().union(*(p[2] for i, p in enumerate(parts) if i != at))


def _known(parts: list[_Part], unregistered: list[tuple[str, str]]) -> list[_Part]:
    """Of the parts a Region's text resolved to, what the stores know (summaries, sources, and
    what could not be checked: fail closed), each with no size of its own: the Region declared
    its content and size, so its unrecognised text is not registered again."""
    gaps = {source_id for source_id, _ in unregistered}
    return [(p[0], p[1], p[2], p[3], 0) for p in parts if p[0] not in gaps]


def _unverifiable(key: str, chars: int) -> _Part:
    """A message the ledger could not check because the store did not answer: it may be a
    summary, so it counts as one resting on a source no store holds (fail closed)."""
    unverifiable = f"{UNVERIFIABLE}:{key[:16]}"
    return (unverifiable, 1, frozenset({unverifiable}), frozenset({UNVERIFIABLE}), chars)


#: One fact of a summary and the ids of every source stating it (per-fact provenance). The fact
#: is the string its checker made of it (`policyhook.grounding.fact_records`); stores keep it as
#: given, and a fact recorded again for the same summary only gains sources.
FactRecord = tuple[str, tuple[str, ...]]

#: What a store knows of a source id: held, dropped by `evict` or capacity, or past its TTL.
#: An id absent from `states` was never put: unknown, which is not the same as dead.
State = Literal["live", "evicted", "expired"]


@dataclass(frozen=True)
class View:
    """What one decision reads from a store, in one round trip (`Store.view`)."""

    cursor: int  # where the next `since` (or view) starts
    since: list[tuple[Entry, str | None]]  # up to `limit` entries recorded after the cursor
    entries: dict[str, Entry]  # the digests asked for that the store knows
    rests_on: dict[str, frozenset[str]]  # every source each summary among `entries` rests on
    #: Held now, of: the ids asked, every source in `rests_on`, every source among `entries`.
    live: frozenset[str]
    depth: int | None = None  # the window's deepest summary (None: no window asked)
    #: Where in the store's history `live` was read (opaque; None: the store does not say):
    #: every id in `live` was held there. Handed back as `Held.as_of`, it lets the store
    #: check only what changed since instead of every id again (`Store.view`'s `held`).
    as_of: object | None = field(default=None, compare=False)

    def asked(self, source_ids: Collection[str]) -> set[str]:
        """The ids whose liveness this view answers, when `source_ids` were asked."""
        out = set(source_ids).union(*self.rests_on.values())
        out.update(e.id for e in self.entries.values() if e.depth == 0)
        return out


@dataclass(frozen=True)
class Held:
    """What the ledger already knows of a decision's sources, for `Store.view` (`held`): the
    ids of `ids` were all held as of `as_of` (a `View.as_of` of this store), and the sources
    asked are `ids` and `rest`. A rolling chain's k-th pass rests on its previous summary's
    closure (k - 1 ids, all held at the last pass) and one new turn: the store then checks
    what died since `as_of` and the one turn, not the k ids again.

    A store that cannot tell exactly what changed since `as_of` (not its own token, a log
    that no longer reaches back, an expiry it cannot rule out) checks every id, as without
    it."""

    ids: Collection[str]
    as_of: object
    rest: frozenset[str]


def check_seconds(name: str, value: float) -> None:
    """A store's `ttl` or `timeout` is a finite number of seconds > 0: NaN passes `<= 0` and
    then reads as "never expires" in one store and "expired at once" in another."""
    if not value > 0:
        raise ValueError(f'"{name}" must be > 0 seconds: {value}')
    if value == math.inf:
        raise ValueError(f'"{name}" must be finite: {value} (None: no {name})')


@runtime_checkable
class Store(Protocol):
    """What the ledger needs from a store; the stores (policyhook.stores, PostgresStore,
    RedisStore) implement it. Implementations must be safe for concurrent threads and, when
    shared, for concurrent processes (two processes on one store see the same secret, the same
    entries and the same liveness)."""

    def secret(self) -> bytes:
        """The key ids and digests are made with: created once, then the same for every process."""

    def put_source(self, source: Source, text: str) -> None:
        """Hold `text` under `source.id` (re-putting an id replaces it, reviving an evicted one)
        and index it by digest and anchor.

        Optional: a store may offer `put_source_hashed(source, text, text_digest)`, this given
        the text's keyed digest under its secret (`digest(secret, encode(text))`), which the
        ledger has made already, so the text is not hashed again; the ledger then calls it in
        place of this, if the store's class defines it (not a wrapper passing attributes on).
        It must be this exactly (MemoryStore's calls a `put_source` overridden by a subclass
        or on the instance)."""

    def get_source(self, source_id: str) -> str | None:
        """Give the original back, or None when it is gone (evicted, expired or never put)."""

    def get_sources(self, source_ids: Collection[str]) -> dict[str, str]:
        """The originals of those of `source_ids` held now, in one lookup (gone ones left out)."""

    def evict(self, source_id: str) -> bool:
        """Drop a source's text, leaving a tombstone: it is dead for every later decision and
        still known (its entry stays). True if it was held."""

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        """The subset of `source_ids` held now, in one lookup."""

    def states(self, source_ids: Collection[str]) -> dict[str, State]:
        """Each known id's state, in one lookup; ids never put are left out (unknown)."""

    def put_summary(
        self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()
    ) -> Entry | None:
        """Remember a granted summary (normalised `entry`) of `entry.window`, with its text and
        the per-fact provenance of its output (`facts`, under `entry.id`), in one write.

        A text recorded again is merged with its earlier record (`Entry.merged`: provenance only
        grows; a fact's sources too), atomically; returns the entry as stored, or None (then the
        ledger reads it back with `lookup`, one more round trip)."""

    def facts(self, summary_ids: Collection[str]) -> dict[str, list[FactRecord]]:
        """The per-fact provenance recorded for each of these summaries, in one lookup (every
        fact with every source stating it, live or not); summaries with none are left out."""

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        """The entries of the texts with these digests (sources, evicted ones too, and
        summaries), in one lookup. A digest not returned is a text this store never saw."""

    def by_anchor(self, anchors: Collection[str]) -> list[Entry]:
        """Entries whose anchor (keyed hash of the first bytes) is one of `anchors`."""

    def rests_on(self, summary_ids: Collection[str]) -> dict[str, frozenset[str]]:
        """Every source id each summary rests on, transitively through its parents."""

    def window_depth(self, window: str) -> int:
        """The deepest summary recorded in `window` (0 if none): O(1)."""

    def since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        """Up to `limit` entries recorded after `cursor` (0: from the start), oldest first, each
        with its text when still held; and the cursor to pass next. For caches to catch up with
        other processes' writes; cheap when nothing changed."""

    def view(
        self,
        cursor: int,
        limit: int,
        digests: Collection[str],
        source_ids: Collection[str],
        window: str | None = None,
    ) -> View:
        """A decision's reads in one round trip (one statement, one script): `since(cursor,
        limit)`, `lookup(digests)` with `rests_on` of the summaries found, which of
        `source_ids` and of those summaries' and found sources' ids are held, and `window`'s
        depth. Atomic where the store can make it so; never staler than the calls it replaces.

        Optional: a store may return `View.as_of` and take a keyword-only `held: Held | None`
        (what the ledger knows: `source_ids` are `held.ids` and `held.rest`, and `held.ids`
        were all held as of `held.as_of`), to answer from what changed since. The ledger
        passes `held` only to a store whose `view` accepts it and that gave an `as_of`;
        without either, every id is checked (MemoryStore and SQLiteStore offer it)."""

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        """The most recently put sources still held (for inspection and adapters' tests)."""

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        """The most recent summaries of `window` still held, oldest first, with provenance."""


def _takes_held(store: Store) -> bool:
    """Whether `store.view` takes the optional `held` keyword (or any keyword: a wrapper
    passing its arguments on). A store implementing the protocol without it is never given
    it, whatever its views say: it checks every id, as before."""
    try:
        parameters = inspect.signature(store.view).parameters.values()
    except (TypeError, ValueError):  # no signature to read: not given it
        return False
    return any(
        p.kind == p.VAR_KEYWORD or (p.name == "held" and p.kind == p.KEYWORD_ONLY)
        for p in parameters
    )


def _is_blank(text: str, data: bytes, start: int, end: int, ascii: bool) -> bool:
    """Whether bytes `start:end` of a message (`text`, encoded as `data`) are only whitespace
    (or none): no content of their own. `ascii`: byte offsets are character offsets."""
    if ascii:  # read in place
        return _NONSPACE.search(text, start, end) is None
    return not data[start:end].decode("utf-8", "surrogatepass").strip()


def _chars(data: bytes, start: int, end: int, ascii: bool) -> int:
    """How many characters bytes `start:end` of a message hold (`ascii`: one per byte)."""
    return end - start if ascii else len(data[start:end].decode("utf-8", "surrogatepass"))


def _holding_nothing(
    ordered: tuple[tuple[int, int, str], ...],
    known: Mapping[str, Entry],
    uncover: AbstractSet[str],
    text: str,
    data: bytes,
    ascii: bool,
) -> tuple[tuple[int, int, str], ...]:
    """`ordered` (`Ledger._found`) less the dead sources of `uncover` that hold nothing of their
    own: every byte of theirs that is not whitespace lies inside a known text found in the
    message that is not one of them (so one nested in another, or a text running past its end,
    counts as what it is made of). Where such a source is not found, the message splits into
    those texts and whitespace, which is no content (`Ledger._gap`); split without it, it
    splits the same where it is found. `ascii`: byte offsets are character offsets."""
    dead: list[int] = []
    covered: list[list[int]] = []  # the spans of the other known texts, merged, in order
    for at, (start, negative, text_digest) in enumerate(ordered):
        entry = known.get(text_digest)
        if entry is None:  # confirmed by digest, so known: only a racing eviction
            continue
        if entry.depth == 0 and entry.id in uncover:
            dead.append(at)
        elif covered and start <= covered[-1][1]:
            covered[-1][1] = max(covered[-1][1], start - negative)
        else:
            covered.append([start, start - negative])
    if not dead:
        return ordered
    ends = [end for _, end in covered]
    empty: set[int] = set()
    for at in dead:
        start, negative, _ = ordered[at]
        end, cursor = start - negative, start
        span = bisect.bisect_right(ends, start)  # the first span ending inside it or past it
        while span < len(covered) and covered[span][0] < end:
            if not _is_blank(text, data, cursor, covered[span][0], ascii):
                break
            cursor = max(cursor, covered[span][1])
            span += 1
        if cursor >= end or _is_blank(text, data, cursor, end, ascii):
            empty.add(at)
    return tuple(hit for at, hit in enumerate(ordered) if at not in empty)


class Ledger:
    """Remembers sources and granted summaries, and tells what a call's input rests on.

    Thread-safe. Recognition is exact whatever is cached: the store knows every text (by keyed
    digest, and by anchor for texts inside longer strings), and a miss here asks it. Memory holds
    at most `max_texts` texts (their entries and anchors, least recently used out) and the
    deepest summary of at most `max_windows` windows (idle ones out, reloaded in O(1)). Windows
    scope `max_depth`, not recognition: a text recorded in any window is recognised in all.
    """

    def __init__(
        self,
        store: Store,
        *,
        max_texts: int = 65_536,
        max_windows: int = 4_096,
    ) -> None:
        if max_texts < 1:
            raise ValueError(f'"max_texts" must be >= 1: {max_texts}')
        if max_windows < 1:
            raise ValueError(f'"max_windows" must be >= 1: {max_windows}')
        self.store = store
        self.max_texts = max_texts
        self.max_windows = max_windows
        self._key = store.secret()
        self._hashes = KeyedHashes(self._key)
        self._digest = self._hashes.digest  # (bound once: called for every text confirmed)
        self._reader: Store = store  # what recognition reads: the store, or see `resolve_units`
        self._lock = threading.RLock()
        self._entries: OrderedDict[str, Entry] = OrderedDict()  # digest -> entry, LRU
        self._summaries: dict[str, Entry] = {}  # summary id -> entry, for the cached ones
        self._index = Index()
        self._complete = True  # every text the store knows with an anchor is in `_index`
        self._cursor = 0  # position in the store's `since` log
        self._windows: OrderedDict[str, int] = OrderedDict()  # window -> deepest summary, LRU
        # What recently resolved regions are made of, for normalised summaries:
        # region id -> (summary ids it rests on, sources it rests on directly).
        self._made_of: OrderedDict[str, tuple[tuple[str, ...], frozenset[str]]] = OrderedDict()
        # Source sets of recently recorded or resolved summaries: a rolling chain's next pass
        # reuses its parent's instead of walking the chain.
        self._closures = Closures()
        # The last region whose sources the store found all held, and where (`View.as_of`):
        # (region id, its source set, as_of). A summary recorded of it keeps that with its
        # closure (`Closures.as_of`). One, not a map: each holds a k-sized set alive.
        self._all_held: tuple[str, AbstractSet[str], object] | None = None
        self._takes_held = _takes_held(store)  # whether `store.view` takes `held`
        # `put_source` given the digest made here, if the store's class offers it (optional;
        # not a wrapper's `__getattr__` passing it on past its own `put_source`)
        self._put_hashed: Any = None
        if hasattr(type(store), "put_source_hashed"):
            self._put_hashed = store.put_source_hashed  # type: ignore[attr-defined]
        self._region_ids: dict[str, str] = {}  # joined digests of recent inputs -> region id
        # Recent messages and recorded texts -> their digests (`_message_digests`).
        self._hashed: dict[str, tuple[str, str | None]] = {}
        # Where known texts lie in recently split messages, by message digest (`_found`).
        self._splits: OrderedDict[str, _Split] = OrderedDict()
        self._split_places = 0  # known texts found in them, in all (`_SPLIT_PLACES`)
        # Bumped whenever a text the index found may no longer be (a discard) or a text the store
        # knows cannot be found by the index (no text): remembered splits made before are redone.
        self._epoch = 0
        # Granted summaries whose store write failed, oldest first, written again before the
        # next read of the store: until then only this process knows them (docs/reliability.md).
        self._unwritten: OrderedDict[str, tuple[Entry, str, Sequence[FactRecord]]] = OrderedDict()
        _fork.register(self, Ledger._after_fork)

    def _after_fork(self) -> None:
        self._lock = threading.RLock()  # another thread may have held it at the fork

    def text_id(self, prefix: str, text: str) -> str:
        """An id for `text` keyed with the store's secret: the same in every process sharing it."""
        return text_id(prefix, text, self._key)

    # -- recording ------------------------------------------------------------------------------

    def record_source(
        self, text: str, kind: str, source_id: str | None = None, *, window: str = "default"
    ) -> Source:
        """Put original evidence in the store, so that summaries resting on it stay derivable.

        Returns the `Source` stored (id: `source_id`, or one derived from kind and text). A text
        that contains known summaries (a turn quoting one) keeps their provenance: it is recorded
        as summary-bearing, with their depth, resting on them and on the new source's id, in
        `window` (see docs/inputs.md). A text already known as a summary stays that summary, the
        new source added to what it rests on. Otherwise it is plain evidence on its own id.
        """
        if not isinstance(text, str):
            raise TypeError(f'"text" must be a str: {type(text).__name__}')
        if not kind:
            raise ValueError('"kind" must be a non-empty string, e.g. "config_read"')
        for name, value in (("kind", kind), ("source_id", source_id or ""), ("window", window)):
            _shapes.check_id(name, value)
        data = encode(text)
        # Hashed once (and remembered: the turn comes back in the next input as a message); the
        # id derived from it is `self.text_id(kind, text)`, the same digest of the same bytes
        key = self._message_digests(text, data)[0]
        source = Source(id=source_id or f"{kind}:{key[:16]}", kind=kind)
        carried = self._carried(text, data, key, source, window)
        if carried is None:
            self._put_source(source, text, key)  # refused if the id names another text
            with self._lock:
                entry = Entry.of_source(self._hashes, source, text, key)
                self._learn(entry, data)
            return source
        # Its provenance first, so no failure leaves it plain evidence; but never resting on an
        # id that names another text (`put_source` would refuse it after the provenance was
        # written), so that is asked first.
        self._refuse_taken(source, carried.digest)
        entry = self._put_summary(carried, text)
        try:
            self._put_source(source, text, key)  # stores keep a summary's entry over its text
        except SourceIdConflictError:
            # Another process took the id between the check and the write. A quoting text's
            # record (its own id) counts on that id for the text around the summaries it
            # quotes, and the id holds another text: make the record rest on a source no store
            # holds too (provenance only grows), so it is never counted derivable (fail
            # closed). A summary's own record only gained an id it does not need.
            if entry.id == source.id:
                unheld = f"unheld:{carried.digest[:16]}"
                entry = replace(entry, sources=tuple(sorted({*entry.sources, unheld})))
                entry = self._put_summary(entry, text)
            raise
        finally:
            with self._lock:
                self._learn(entry, data)
                if window in self._windows:
                    self._windows[window] = max(self._windows[window], entry.depth)
        return source

    def write_unwritten(self) -> int:
        """Write the granted summaries whose store write failed, oldest first; how many are
        still owed. Stops at the first failure (the store is still down): tried again later."""
        while True:
            with self._lock:
                if not self._unwritten:
                    return 0
                key, (entry, text, facts) = next(iter(self._unwritten.items()))
            try:  # the write, outside the lock, as record_summary's
                stored = self._put_summary(entry, text, facts)
            except Exception:
                _logger.debug("policyhook: writing an unwritten summary failed", exc_info=True)
                with self._lock:
                    return len(self._unwritten)
            with self._lock:
                owed = self._unwritten.get(key)
                if owed is not None and owed[0] is entry:  # not owed again meanwhile
                    del self._unwritten[key]
                if stored is not entry and stored != entry:  # merged with another record
                    self._learn(stored, encode(text))
                    self._closures.pop(stored.id)

    def _put_source(self, source: Source, text: str, text_digest: str) -> None:
        """`store.put_source`, handed the text's digest if it takes it (not hashed again)."""
        if self._put_hashed is None:
            self.store.put_source(source, text)
        else:
            self._put_hashed(source, text, text_digest)

    def _refuse_taken(self, source: Source, text_digest: str) -> None:
        """Raise `SourceIdConflictError` when `source.id` is known to name another text than
        `text_digest`'s (before a summary-bearing text's provenance is written under it). A
        tombstone's text is gone, but a text the store never saw cannot be the one it held.
        What this cannot tell is left to `put_source`, which decides atomically."""
        state = self.store.states([source.id]).get(source.id)
        if state is None:
            return
        if state == "live":
            held = self.store.get_source(source.id)
            if held is not None and digest(self._key, encode(held)) != text_digest:
                raise SourceIdConflictError.taken(source.id, state)
        elif text_digest not in self.store.lookup([text_digest]):
            raise SourceIdConflictError.taken(source.id, state)

    def _put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        """Store a summary's entry; the record as stored (merged with an earlier one)."""
        stored = self.store.put_summary(entry, text, facts)
        if stored is None:  # a store that does not return the merged record: read it back
            stored = self.store.lookup([entry.digest]).get(entry.digest)
        return stored if stored is not None else entry

    def _carried(
        self, text: str, data: bytes, key: str, source: Source, window: str
    ) -> Entry | None:
        """The entry `text` (`key`: its keyed digest) must keep once registered under
        `source`, if it bears summaries.

        Caught up first, then looked up whole in the cache or the store: what another process
        recorded since (a summary of this very text) is known before the text is called
        evidence, whatever the cache kept of it."""
        with self._lock:
            try:
                self._catch_up()
            except Exception:  # a miss below still asks the store, and fails if it cannot
                _logger.debug("policyhook: store catch-up failed", exc_info=True)
            known = self._fetch([key]).get(key)
            if known is not None:
                if known.depth == 0:
                    return None  # a known source's own text: evidence
                return replace(  # a summary's own text: keep its id
                    known,
                    sources=tuple(sorted({*known.sources, source.id})),
                    source_kinds=tuple(sorted({*known.source_kinds, source.kind})),
                )
            if not self._may_quote_summaries(text, data, key):
                return None  # quoting no summary: evidence
            found = self._resolve([text], recording=True)
            if found.failure is not None:  # never stored as resting on what it could not read
                raise found.failure
            if found.region.depth == 0:
                return None
            # Taken out: a decision's resolve of the same text made it with the sources it
            # quotes, which a summary recorded of that decision must rest on
            parents, direct = self._made_of.pop(found.region.id)
            gaps = {gap for gap, _ in found.unregistered}  # held by the new source itself
            kinds = found.region.source_kinds - ({UNREGISTERED} if gaps else set())
        return Entry(
            digest=key,
            id=source.id,
            depth=found.region.depth,
            kind=source.kind,
            size=len(data),
            anchor=anchor_of(self._key, data),
            parents=parents,
            sources=tuple(sorted((direct - gaps) | {source.id})),
            source_kinds=tuple(sorted(kinds | {source.kind})),
            window=window,
        )

    def _may_quote_summaries(self, text: str, data: bytes, key: str) -> bool:
        """False only when `text` (`key`: its digest, known to no store: caught up and looked
        up whole already) holds no known summary: then `_resolve([text])` would find it depth 0
        (original evidence), all `_carried` needs to know. The rest of `_resolve`'s search (its
        stripped form looked up whole, a summary's; a source's is searched on, as `_resolve`
        does when recording, for a text it quotes may have become a summary's since; the index,
        and the store while the cache is incomplete),
        without the region it builds, nor a split remembered for a text that comes back whole
        (it is recorded next). True when a text found is not cached (then `_resolve` decides);
        a store that fails raises, as it does there.

        Why: a loop records every new turn, and almost none quotes a summary; resolving it
        cost about as much again as searching it."""
        bare = self._message_digests(text, data)[1]
        if bare is not None:
            entry = self._fetch([bare]).get(bare)
            if entry is not None and entry.depth > 0:
                return True
        hits = self._confirmed(data, self._index.find(data, summaries=True))
        if not self._complete:  # texts the cache does not hold, asked of the store
            hits |= self._confirmed(data, self._ask_store(data))
        entries = self._entries
        for _, _, found in hits:
            entry = entries.get(found)
            if entry is None or entry.depth > 0:
                return True
        return False

    def record_summary(
        self, text: str, summarized: Region, window: str, facts: Sequence[FactRecord] = ()
    ) -> Region:
        """Remember a granted summary's output, so it is recognised when it comes back, with the
        per-fact provenance of its output (`facts`, shared through the store)."""
        if not window.isascii():  # (the check's own test, without its call per record)
            _shapes.check_id("window", window)
        data = encode(text)
        key = self._message_digests(text, data)[0]
        region_id, depth = f"s:{key[:16]}", summarized.depth + 1
        sources = sources_of(summarized)  # (a `_Grown` set is not made whole)
        region = _region_of(region_id, depth, sources, summarized.source_kinds, len(text), text)
        with self._lock:
            parents, direct = self._made_of.get(summarized.id, ((), sources))
        entry = _made(
            Entry,
            {
                "digest": key,
                "id": region_id,
                "depth": depth,
                "kind": "summary",
                "size": len(data),
                "anchor": self._hashes.anchor(data),
                "parents": parents,
                "sources": tuple(sorted(direct)),
                "source_kinds": tuple(sorted(summarized.source_kinds)),
                "window": window,
            },
        )
        merged = False
        try:
            stored = self._put_summary(entry, text, facts)
            merged = not _same(stored, entry)
            entry = stored
        except Exception:
            with self._lock:  # owed to the store: written before it is next read
                self._unwritten[key] = (entry, text, facts)
                if len(self._unwritten) > _UNWRITTEN:
                    self._unwritten.popitem(last=False)
                    _logger.warning(
                        "policyhook: more than %d summaries could not be written to the store; "
                        "the oldest is dropped: only this process recognises it",
                        _UNWRITTEN,
                    )
            raise
        finally:  # learnt even when the store write fails: recognised in this process still
            with self._lock:
                cached = self._entries.get(key)
                self._learn(entry, data)
                if merged:  # the closure cached stands only if what it rests on did not grow
                    if cached is None or _rests_otherwise(cached, entry):
                        self._closures.pop(entry.id)
                else:  # recorded as built: it rests on exactly what it summarized
                    anchored = self._closures.anchored(entry.parents)
                    held = self._all_held
                    as_of = None
                    if held is not None and held[0] == summarized.id and held[1] is sources:
                        as_of = held[2]
                    self._closures.put(
                        entry.id, sources, entry.parents, anchored=anchored, as_of=as_of
                    )
                if window in self._windows:
                    self._windows[window] = max(self._windows[window], region.depth)
        return region

    def archive(
        self,
        unregistered: Iterable[tuple[str, str]],
        returned: Iterable[tuple[Source, str]] = (),
    ) -> None:
        """Store unrecognised original content as sources, so summaries of it stay derivable;
        and the `returned` originals (`held_in`) again, which revives their ids.

        Not cached here: the content may be a known summary's text, not recognised where it was
        (a short one inside a longer unit), which must stay that summary; the store keeps it so
        (`put_source`), and the next catch-up (`since`) brings what the store holds."""
        for source_id, text in unregistered:
            self.store.put_source(Source(source_id, UNREGISTERED), text)
        for source, text in returned:
            try:  # the text its id names, so only a store that forgot the id refuses it
                self.store.put_source(source, text)
            except SourceIdConflictError:  # then it stays dead: refused later, never lost now
                _logger.debug("policyhook: %s not revived", source.id, exc_info=True)

    def held_in(
        self, items: Sequence[Region | str], resolution: Resolution, dead: AbstractSet[str]
    ) -> list[tuple[Source, str]]:
        """The sources of `dead` whose whole text the input holds (`items`, read as
        `resolve_units` takes them, and resolved as `resolution`), as a message or inside one
        (confirmed by digest), with that text: originals the input brings back. Its gaps are not
        looked for: dead until archived and no source's text, they are most inputs' only dead ids.

        Why: a source gone from the store (evicted, expired) but back in the window verbatim is
        content the call reads, as unrecognised content is. Whether the guard found it as that
        source (its text cached, or the whole message looked up) or as unrecognised content
        (its text never cached here: nothing to search for) is the cache's doing, so the guard
        treats both alike: as evidence in the input, and archived by `archive_originals`. A
        Region's text is the caller's declaration and is not read here (nor archived)."""
        gaps = resolution.unregistered
        source_ids = dead - {source_id for source_id, _ in gaps} if dead and gaps else dead
        if not source_ids:
            return []
        found: dict[str, tuple[Source, str]] = {}
        with self._lock:
            cached = self._entries.get  # (a resolve has just cached most of them)
            for item in items:
                if not isinstance(item, str):
                    continue
                data = encode(item)
                key, bare = self._message_digests(item, data)
                message = cached(key) or (None if bare is None else cached(bare))
                if message is None:
                    whole = self._fetch([key] if bare is None else [key, bare])
                    message = whole.get(key) or (None if bare is None else whole.get(bare))
                if message is not None:  # a known message is that text, searched no further
                    if message.depth == 0 and message.id in source_ids:
                        text = item if message.digest == key else item.strip()
                        source = _made(Source, {"id": message.id, "kind": message.kind})
                        found.setdefault(message.id, (source, text))
                    continue
                ordered = self._found(data, key)
                entries = self._fetch([d for *_, d in ordered])
                for start, negative, text_digest in ordered:
                    entry = entries.get(text_digest)
                    if entry is not None and entry.depth == 0 and entry.id in source_ids:
                        text = data[start : start - negative].decode("utf-8", "surrogatepass")
                        found.setdefault(entry.id, (Source(entry.id, entry.kind), text))
        return list(found.values())

    # -- recognition ----------------------------------------------------------------------------

    def resolve(self, value: Any, window: str) -> Resolution:
        """What `value` rests on: any shape `policyhook._shapes` reads (str, messages, content
        blocks, Regions, nested lists); TypeError naming the part it cannot read."""
        return self.resolve_units(_shapes.read(value, keep=(Region,)), window)  # a new list

    def resolve_units(self, items: list[Region | str], window: str) -> Resolution:
        """`resolve` of an input already read (`_shapes.read(value, keep=(Region,))`, not
        changed here), for a caller that reads its units again: the guard, at record.

        Resolve `items` and read the store once (`Store.view`): other processes' writes, the
        whole messages not cached, the liveness of every source the region rests on, and the
        window's depth (always: a summary granted in it elsewhere reaches this process's
        catch-up as of the window it was last recorded in, which may be another).

        Recognition runs first on what is cached, the store's reads deferred; the view then
        answers them all at once. Only when the view changes what the input is made of (a
        message this process had not cached, a text another process recorded that the input
        contains) is it resolved again, with what the view brought, and the store asked again
        only for what that still lacks (liveness of a newly found source, by anchor...).
        """
        if self._unwritten:  # what this process owes the store first, so that others see it
            self.write_unwritten()
        asked: list[str] = []
        with self._lock:
            index = (self._epoch, self._index.added)
            first = self._reading(_Deferred(self.store, asked), items)
            # A text learnt from the store during that pass (by anchor, while the cache is
            # incomplete) came after the messages before it were split: they are split again.
            learnt = index != (self._epoch, self._index.added)
            cursor = self._cursor
        try:  # the round trip, outside the lock: other threads decide meanwhile
            held = first.held
            if held is not None and self._takes_held:  # (optional: not in the protocol's)
                viewing: Any = self.store.view  # given a `_Grown` set as it is
                view = viewing(cursor, 1024, asked, sources_of(first.region), window, held=held)
            else:
                view = self.store.view(cursor, 1024, asked, first.region.sources, window)
        except Exception as exc:  # fail closed, from what is cached, asking nothing more
            with self._lock:
                resolution = replace(self._reading(_Failing(exc), items), failure=exc)
        else:
            with self._lock:
                resolution = self._seen(view, items, window, first, asked, learnt)
        # Sources found whole, inside units or as Regions' texts: when dead, they hide nothing.
        # (Most calls find them all live, as the view answered: nothing more to do.)
        embedded, live = resolution.embedded, resolution.live
        if embedded and (live is None or not all(map(live.__contains__, embedded))):
            return self._declared(items, resolution)
        return resolution

    def _declared(self, items: list[Region | str], resolution: Resolution) -> Resolution:
        """`resolution` resolved again with the dead sources it found inside units (and as
        Regions' texts) hiding nothing they hold, and in a Region's text as unknown text.

        Why: the store keeps no text of a dead source, so it is found inside a longer text only
        where a cache still holds that text, or by anchor while the cache is incomplete. Where
        it is not found, its bytes are searched like any unknown text: a summary inside it is
        found, and in a Region's text the rest is the Region's declared content. So where it
        is found it must do the same, or what the cache held would decide. (Found or not, it
        counts as dead in a plain message: unrecognised content is dead until archived.)
        A store that cannot answer holds none of them: all read as dead (fail closed), or one
        still cached would hide a summary inside it and the input read as original content."""
        live, failure = resolution.live, resolution.failure
        dead: frozenset[str] = frozenset()
        found = resolution
        while True:  # a dead source may hide others inside it, found once it is searched
            embedded = found.embedded - dead
            held: AbstractSet[str] = frozenset()  # a store that cannot answer holds none
            if live is not None and found is resolution:  # (the view answered the first ones)
                held = live
            elif failure is None:
                try:
                    held = self.store.live(embedded)
                except Exception as exc:  # fail closed: dead, so none hides what it holds
                    failure = exc
            more = frozenset(s for s in embedded if s not in held)  # (`held` may be `_Grown`)
            if not more:
                break
            dead |= more
            with self._lock:  # (a store that failed is not asked again: it fails at once)
                found = self._reading(_Failing(failure) if failure else self.store, items, dead)
            failure = failure or found.failure
        if failure is not None:  # every source dead to the caller (`Guard._live`)
            return replace(found, live=None, failure=failure)
        if found is resolution:
            return resolution
        sources, answered = sources_of(found.region), sources_of(resolution.region)
        if live is not None and all(s in answered for s in sources):  # what the view answered
            return replace(found, live=frozenset(s for s in sources if s in live))
        return found  # (live None: the caller asks the store)

    def _seen(
        self,
        view: View,
        items: list[Region | str],
        window: str,
        first: Resolution,
        asked: list[str],
        learnt: bool,
    ) -> Resolution:
        """`first` (resolved before `view`) with what the view brought: learnt, and resolved
        again if it changed what the input is made of, or if `first` learnt texts itself."""
        changed = self._take(view.since, items) or bool(view.entries) or learnt
        if view.cursor > self._cursor:  # (another thread's view may be newer)
            self._cursor = view.cursor
        if view.entries:  # (`rests_on` is of summaries among them)
            for entry in view.entries.values():
                self._remember(entry)
            for summary_id, sources in view.rests_on.items():
                self._closures.put(summary_id, sources)
        if view.depth is not None:  # (the store's; a thread here may have recorded deeper)
            self._windows[window] = max(self._windows.get(window, 0), view.depth)
            while len(self._windows) > self.max_windows:
                self._windows.popitem(last=False)
        if len(view.since) < 1024 and not changed:  # the view changed nothing: `first` stands
            # It found no entries (`changed` would be set), so it answered the liveness of
            # exactly the region's sources: no intersection to take (O(k) on a long chain).
            # `first` was made for this call and no one else holds it: completed in place.
            live = first.__dict__["live"] = view.live
            if len(live) >= _HELD_FROM and view.as_of is not None:  # (a small one: not kept)
                asked_ids = sources_of(first.region)
                if len(live) == len(asked_ids):
                    # Every source held (the view answered exactly them): a summary keeps that
                    self._all_held = (first.region.id, asked_ids, view.as_of)
            return first
        if len(view.since) >= 1024:  # far behind: catch up the usual way, then resolve
            found = self._resolve(items)
        else:  # caught up by the view: resolve again from what it brought
            again = _Deferred(self.store, None, answered=set(asked), entries=view.entries)
            found = self._reading(again, items)
        if found.region.sources <= view.asked(first.region.sources):
            live = view.live & found.region.sources
            return replace(found, live=live)
        return found  # a source found since: the caller asks the store (`live`)

    def _reading(
        self, reader: Any, items: list[Region | str], dead_inside: AbstractSet[str] = frozenset()
    ) -> Resolution:
        """Resolve `items` with recognition reading through `reader` (`_Deferred`, `_Failing`),
        without catching up: the view does that (or the store is down)."""
        self._reader = reader  # (`reader` is Any: it answers as a Store does)
        try:
            return self._resolve(items, catch_up=False, dead_inside=dead_inside)
        finally:
            self._reader = self.store

    def _resolve(
        self,
        items: list[Region | str],
        catch_up: bool = True,
        dead_inside: AbstractSet[str] = frozenset(),
        recording: bool = False,
    ) -> Resolution:
        """What `items` is made of (`resolve_units`). `recording`: `items` is one text being
        recorded as a source (`Ledger._carried`), which holds verbatim whatever source it
        quotes: only the summaries in it are found, the rest is its own (gaps), so what it
        rests on never depends on whether a quoted source is cached, live or dead."""
        # What the cache holds may be out of date when the store did not answer this call
        # (`unread`: a text cached as a source is then not verified, below) or could not bring
        # the cache up to date (nothing read from it is verified, as if a lookup had failed).
        failure: Exception | None = None
        unread = self._reader.error if type(self._reader) is _Failing else None
        if catch_up and unread is None:
            try:
                self._catch_up()
            except Exception as exc:  # recording: a miss below still asks the store
                _logger.debug("policyhook: store catch-up failed", exc_info=True)
                if not recording:
                    failure = exc
        secret = self._key
        # A Region's own text is recognised too: what a store knows of it only adds to what the
        # caller declared (a known summary handed over as `Region.original` is still one).
        declared = len(items)
        texts: list[str] = []  # (a loop, not a comprehension: no frame of its own per call)
        for item in items:
            if isinstance(item, Region) and item.text and item.text.strip():
                texts.append(item.text)
        if texts:
            items = [*items, *texts]
        encoded: list[bytes] = []
        digests: list[str] = []
        messages: list[str] = []  # the digests of the str items, to look up whole
        # Outputs are recorded stripped (`Guard._record`): a unit with whitespace around it is
        # looked up stripped too, or a short output (never searched inside longer text) that
        # comes back as the summarizer wrote it would pass for original content.
        bare: dict[int, str] = {}
        for at, item in enumerate(items):
            if isinstance(item, str):
                data = encode(item)
                keys = self._message_digests(item, data)
                messages.append(keys[0])
                if keys[1] is not None:
                    bare[at] = keys[1]
                digests.append(keys[0])
            else:
                data = b""
                digests.append(digest(secret, encode(item.text or item.id)))
            encoded.append(data)
        parts: list[_Part] = []
        unregistered: list[tuple[str, str]] = []
        closures: dict[str, AbstractSet[str]] = {}
        known: dict[str, Entry] = {}
        try:
            known = self._fetch(messages + list(bare.values()))
        except Exception as exc:  # what the cache holds is still recognised
            failure = exc
        tail = (0, 0)
        inside: list[str] = []  # sources found inside units, and as Regions' texts
        for at, (item, data, key) in enumerate(zip(items, encoded, digests, strict=True)):
            if at == declared:
                tail = (len(parts), len(unregistered))
            if isinstance(item, Region):
                parts.append((item.id, item.depth, item.sources, item.source_kinds, item.chars))
                continue
            entry = known.get(key) or self._entries.get(key)
            around = None  # the entry of its stripped form (whitespace around it)
            if at in bare:
                around = known.get(bare[at]) or self._entries.get(bare[at])
                if entry is None and around is not None:
                    entry, key = around, bare[at]
            whole = None  # a dead source given whole: split, as where it is not found
            if entry is not None and entry.depth == 0 and not recording:
                if failure is None and unread is not None:
                    failure = unread
                if failure is not None:
                    # A text cached as a source may be a summary's since the cache was last
                    # brought up to date (another process recorded it as one): unverifiable,
                    # as a text not cached is, so what the cache held does not decide
                    parts.append(_unverifiable(key, len(item)))
                    continue
            if entry is not None and entry.depth == 0:
                if recording:  # (its stripped form a known source's text: its own, too)
                    entry, key = None, digests[at]
                elif entry.id not in dead_inside:
                    inside.append(entry.id)  # (given whole: when dead, it hides nothing)
                elif (
                    around is not None
                    and around is not entry
                    and (around.depth > 0 or around.id not in dead_inside)
                ):  # Whitespace around a known text: that text, as where the source is not
                    # found (its own text, split, would cover the text inside it; in a
                    # Region's text, searched, would miss a short one)
                    entry, key = around, around.digest
                    if entry.depth == 0:
                        inside.append(entry.id)
                elif at >= declared:  # a Region's text that is a dead source: unknown
                    entry, key = None, digests[at]  # text, searched inside as such
                else:
                    whole, entry, key = entry, None, digests[at]
            if entry is not None:
                if key in self._entries:
                    self._entries.move_to_end(key)
                try:
                    parts.append(self._region(entry, len(item), closures))
                    continue
                except Exception as exc:
                    failure = exc
            if failure is not None:
                parts.append(_unverifiable(key, len(item)))
                continue
            mark = (len(parts), len(unregistered))
            try:
                found = self._split(
                    item,
                    data,
                    key,
                    parts,
                    unregistered,
                    closures,
                    inside,
                    dead_inside,
                    at >= declared,
                    recording,
                )
                if whole is not None and not found:  # its text not indexed, holding nothing
                    # known: it stays that source (its own id, archived again), not a gap
                    del parts[mark[0] :], unregistered[mark[1] :]
                    parts.append(self._region(whole, len(item), closures))
            except Exception as exc:
                failure = exc
                del parts[mark[0] :], unregistered[mark[1] :]
                parts.append(_unverifiable(key, len(item)))
        if texts:  # the Regions' texts: only what is known of them, no content of their own
            parts[tail[0] :] = _known(parts[tail[0] :], unregistered[tail[1] :])
            del unregistered[tail[1] :]
        if failure is not None:
            _logger.warning(
                "policyhook: store unreachable while recognising the input; what it could not "
                "tell apart counts as a summary of dead sources (fail closed)",
                exc_info=failure,
            )
        joined = "\x1e".join(digests)
        region_id = self._region_ids.get(joined)
        if region_id is None:  # an input not seen lately: its id is a hash of its parts' digests
            region_id = "r:" + self._digest(joined.encode())[:16]
            if len(joined) <= _REGION_ID_KEY:
                if len(self._region_ids) >= _REGION_IDS:
                    self._region_ids.clear()
                self._region_ids[joined] = region_id
        cached = self._summaries
        summaries: dict[str, None] = {}  # the summaries the input is made of, in order
        # Those of them the store holds (cached, or found in it now: `closures`): the region
        # rests on them by id, so what they are later found to rest on too counts for it.
        # Copying a closure instead would freeze it, and whether a part is still cached is
        # the memory bound's choice, which must not change what a record rests on.
        parents: set[str] = set()
        direct: list[AbstractSet[str]] = []  # the sources of every other part
        depth = chars = 0
        # The largest closure of a summary part found all held (`Held`): its part and as_of.
        held_at, held_as_of, held_size = -1, None, -1
        for at, (part_id, part_depth, sources, _, part_chars) in enumerate(parts):
            chars += part_chars
            if part_depth > 0:
                if part_depth > depth:
                    depth = part_depth
                summaries[part_id] = None
                size = len(sources)
                if size >= _HELD_FROM and size > held_size:
                    as_of = self._closures.as_of(part_id, sources)
                    if as_of is not None:
                        held_at, held_as_of, held_size = at, as_of, size
                if part_id in cached or part_id in closures:
                    parents.add(part_id)
                    continue
            direct.append(sources)
        held: Held | None = None
        if held_at >= 0 and failure is None:  # the other parts' sources are checked in full
            held = _made(
                Held,
                {
                    "ids": parts[held_at][2],
                    "as_of": held_as_of,
                    "rest": _sources_besides(parts, held_at),
                },
            )
        made_of = self._made_of
        made_of[region_id] = (tuple(sorted(parents)), frozenset().union(*direct))
        made_of.move_to_end(region_id)
        if len(made_of) > 256:
            made_of.popitem(last=False)
        if len(parts) == 1:  # the common case: one message (its sets are shared, not copied)
            sources, kinds = parts[0][2], parts[0][3]
        else:  # the region made of its parts side by side (`Region.merge`)
            largest = max(map(len, map(_SOURCES_OF, parts)), default=0)
            if largest >= _GROWN_FROM:  # a chain's closure and a turn: the turn added to it
                at = next(at for at, p in enumerate(parts) if len(p[2]) == largest)
                sources = _Grown.of(parts[at][2]).plus(_sources_besides(parts, at))
            else:
                sources = frozenset().union(*map(_SOURCES_OF, parts))
            kinds = frozenset().union(*map(_KINDS_OF, parts))
        region = _region_of(region_id, depth, sources, kinds, chars, None)
        return _made(
            Resolution,
            {
                "region": region,
                "unregistered": tuple(unregistered),
                "summaries": tuple(summaries),
                "live": None,
                "failure": failure,
                "held": held,
                "embedded": frozenset(inside) if inside else _NOTHING,
            },
        )

    def _split(
        self,
        text: str,
        data: bytes,
        key: str,
        parts: list[_Part],
        unregistered: list[tuple[str, str]],
        closures: dict[str, AbstractSet[str]],
        inside: list[str],
        hidden: AbstractSet[str] = frozenset(),
        declared: bool = False,
        summaries_only: bool = False,
    ) -> bool:
        """The known texts inside one message and the unrecognised gaps between them; the ids of
        the sources found in it added to `inside`; returns whether it found any known text. The
        sources of `hidden` (dead: `Ledger._declared`) hide nothing they hold; in a Region's
        text (`declared`) they are unknown text, as the rest of its unrecognised text is; with
        `summaries_only` (a text being recorded), so is every source.

        How the message splits (`_recipe`) is remembered with where its known texts lie
        (`_found`): the same message in the next input is rebuilt from it and the entries of
        the texts, as they are now (a text's depth and sources may have grown)."""
        ordered = self._found(data, key)
        memo = self._splits.get(key)
        recipe = memo[4] if memo is not None and memo[3] is ordered else None
        if hidden or summaries_only:  # (not remembered: the memo is of every text, as known)
            known = self._fetch([d for *_, d in ordered])
            if declared or summaries_only:  # split as if they were not known
                kept = []
                for hit in ordered:
                    entry = known.get(hit[2])
                    if (  # a summary, or a source neither recorded over nor hidden
                        entry is None
                        or entry.depth > 0
                        or not (summaries_only or entry.id in hidden)
                    ):
                        kept.append(hit)
                recipe = self._recipe(text, data, key, tuple(kept), known)
            else:
                recipe = self._recipe(text, data, key, ordered, known, hidden)
        elif recipe is not None:
            wanted = []  # (a loop, not a comprehension: no frame of its own per call)
            for step in recipe:
                if step[0] == _TEXT:
                    wanted.append(step[1])
            known = self._fetch(wanted)
            if not all(map(known.__contains__, wanted)):
                recipe = None  # confirmed by digest, so known: only a racing eviction
        else:
            known = self._fetch([d for *_, d in ordered])
        if recipe is None:
            recipe = self._recipe(text, data, key, ordered, known)
            if memo is not None and memo[3] is ordered and all(d in known for *_, d in ordered):
                self._splits[key] = (*memo[:4], recipe)  # every text it holds was read
        ascii = len(data) == len(text)  # then byte offsets are character offsets
        found = False
        for op, text_digest, start, end, part in recipe:
            if op == _TEXT:  # (its chars in `start`)
                found = True
                entry = known[text_digest]
                if entry.depth == 0:
                    inside.append(entry.id)
                parts.append(self._region(entry, start, closures))
            else:
                gap = text[start:end] if ascii else data[start:end].decode("utf-8", "surrogatepass")
                unregistered.append((part[0], gap))
                parts.append(part)
        return found

    def _recipe(
        self,
        text: str,
        data: bytes,
        key: str,
        ordered: tuple[tuple[int, int, str], ...],
        known: Mapping[str, Entry],
        uncover: AbstractSet[str] = frozenset(),
    ) -> tuple[_Op, ...]:
        """How a message splits: its known texts (non-overlapping, leftmost first, longest on a
        tie: `ordered`), the unrecognised gaps between them, and the known texts that start
        inside one of those and end past it (the region rests on them too; a summary's end is
        its own, not unrecognised content, its characters counted with it; a source's end is
        searched on, as a dead one's must be where it is not found, and what of it no text
        found there covers is its own too, unless it is of `uncover`: registered content, as
        where overlapping chunks of one document were registered). The sources of
        `uncover` (dead: `Ledger._declared`) hide nothing: the known texts inside one are found
        too, as where it is not known (leftmost first, longest, none of its characters). One
        holding nothing of its own is not found at all (`_holding_nothing`)."""
        ascii = len(data) == len(text)  # then byte offsets are character offsets
        if uncover:
            ordered = _holding_nothing(ordered, known, uncover, text, data, ascii)
        ops: list[_Op] = []
        over: list[_Op] = []
        cursor = 0
        inside = within = 0  # the span of the last uncovering source found, and a cursor in it
        shadow, shadowing = 0, ""  # the furthest end of a source running past the last text
        for start, negative, digest_ in ordered:
            entry = known.get(digest_)
            if entry is None:  # confirmed by digest, so known: only a racing eviction
                continue
            end = start - negative
            if start >= cursor:
                if start > cursor:
                    ops.extend(self._gap(text, data, key, cursor, start, ascii, shadow, shadowing))
                ops.append((_TEXT, digest_, _chars(data, start, end, ascii), 0, _NO_PART))
                cursor = end
                if uncover and entry.depth == 0 and entry.id in uncover:
                    inside, within = end, start
            elif end > cursor:  # starts inside the last one found, ends past it
                if entry.depth == 0:  # a source's end is searched on: one may turn out dead
                    over.append((_TEXT, digest_, 0, 0, _NO_PART))  # (and hide nothing)
                    if end > shadow and not (uncover and entry.id in uncover):
                        shadow, shadowing = end, digest_
                    continue
                # A summary's end is its own, not unrecognised content
                over.append((_TEXT, digest_, _chars(data, cursor, end, ascii), 0, _NO_PART))
                cursor = end
            elif start < inside:  # inside a dead source: found as where it is not known
                if start >= within:
                    over.append((_TEXT, digest_, 0, 0, _NO_PART))
                    if not (uncover and entry.depth == 0 and entry.id in uncover):
                        within = end  # (a dead source in it hides nothing either: searched on)
                elif end > within:  # starts inside the last one found in it, ends past it
                    over.append((_TEXT, digest_, 0, 0, _NO_PART))
                    if entry.depth > 0:  # a summary's end is its own; a source's searched on
                        within = end
        if cursor < len(data):
            ops.extend(self._gap(text, data, key, cursor, len(data), ascii, shadow, shadowing))
        return (*ops, *over)

    def _found(self, data: bytes, key: str) -> tuple[tuple[int, int, str], ...]:
        """(start, -length, digest) of every known text in `data`, in order: found by the index,
        and while the cache is incomplete by the store (`_ask_store`, every position hashed).

        Remembered per message digest with the index's addition count it is complete for:
        until the epoch moves (a text discarded from the index, or known with no text to index)
        the index only grows, so what was found stands and a later resolve searches only for
        the texts added since (`Index.find_added`, a `bytes.find` each), not the whole index
        again. Texts the store learns from other processes come through `since` and are indexed
        (or move the epoch) before they can be missed, so a remembered "not there" never hides
        one. Not used while the store is down: then the call fails closed."""
        failing = isinstance(self._reader, _Failing)
        memo = None if failing else self._splits.get(key)
        epoch, added = self._epoch, self._index.added
        stored: frozenset[tuple[int, int, str]] | None = None
        if memo is not None and memo[0] == epoch:
            self._splits.move_to_end(key)
            if memo[1] == added:
                return memo[3]
            new = self._index.find_added(data, memo[1])
            if new is not None:  # only the texts added since: what was found stands
                ordered, recipe = memo[3], memo[4]
                if not new:  # none is there: the same split, complete up to `added` now (it
                    # holds as many places as before, so no bound to check again)
                    self._splits[key] = (epoch, added, memo[2], ordered, recipe)
                    return ordered
                added_hits = self._confirmed(data, new) if new else None
                if added_hits:
                    ordered = tuple(sorted({*ordered, *((s, s - e, d) for s, e, d in added_hits)}))
                    recipe = None
                self._keep_split(key, (epoch, added, memo[2], ordered, recipe))
                return ordered
            stored = memo[2]
        hits = self._confirmed(data, self._index.find(data))
        if stored is None:
            stored = frozenset()
            if not self._complete:  # texts the cache does not hold, asked of the store
                stored = frozenset(self._confirmed(data, self._ask_store(data)))
        ordered = tuple(sorted((start, start - end, key) for start, end, key in hits | stored))
        if not failing:
            self._keep_split(key, (epoch, added, stored, ordered, None))
        return ordered

    def _keep_split(self, key: str, split: _Split) -> None:
        """Remember how the message of digest `key` splits, as the most recent: at most
        `_SPLITS` messages and `_SPLIT_PLACES` known texts found in them (a split holding more
        is not kept)."""
        splits = self._splits
        old = splits.get(key)
        if old is not None:
            self._split_places -= len(old[3])
        splits[key] = split
        splits.move_to_end(key)
        self._split_places += len(split[3])
        while len(splits) > _SPLITS or self._split_places > _SPLIT_PLACES:
            self._split_places -= len(splits.popitem(last=False)[1][3])

    def _confirmed(
        self, data: bytes, candidates: Iterable[tuple[int, int, str]]
    ) -> set[tuple[int, int, str]]:
        """The candidates whose bytes are the known text (same keyed digest, over a view of
        the bytes rather than a copy)."""
        view = memoryview(data)
        return {c for c in set(candidates) if self._digest(view[c[0] : c[1]]) == c[2]}

    def _ask_store(self, data: bytes) -> list[tuple[int, int, str]]:
        """Where texts the store knows but this process does not cache may start in `data`.

        Only while the cache does not hold every text: each position is looked up by anchor, in
        one store call, also inside known texts found there (a text the cache lacks may start
        inside one, or with it, and go on past it: a summary quoting a source verbatim).
        Linear, but hashing every position costs far more than the automaton: `max_texts`
        should hold a working set.
        """
        anchors: dict[str, list[int]] = {}
        keyed = self._hashes.anchored
        for at in range(len(data) - ANCHOR_BYTES + 1):
            if data[at] & 0xC0 == 0x80:  # not a char start
                continue
            hashed = keyed.copy()
            hashed.update(data[at : at + ANCHOR_BYTES])
            anchors.setdefault(hashed.hexdigest(), []).append(at)
        found: list[tuple[int, int, str]] = []
        for entry in self._reader.by_anchor(list(anchors)) if anchors else ():
            for at in anchors.get(entry.anchor or "", ()):
                if at + entry.size <= len(data):
                    found.append((at, at + entry.size, entry.digest))
                    if entry.digest not in self._entries:
                        self._learn(entry, data[at : at + entry.size], check=True)
        return found

    def _message_digests(self, text: str, data: bytes) -> tuple[str, str | None]:
        """The keyed digest of a message (`data`: its UTF-8 bytes) and, when whitespace
        surrounds it, of its stripped form (None when it has none); remembered by its text for
        the next call (`_hashed`), as a pure function of the text and the store's secret. Plain
        `str` only: a subclass may compare equal to another text, so it is never looked up.

        Why: a message comes back in the next inputs (a chat's history is resent, an output
        recorded here is the next input's message), and BLAKE2b over it was most of what
        resolving it again cost. Only texts of up to `_HASHED_CHARS` are kept (the dict holds
        them), all dropped at once past `_HASHED`."""
        plain = type(text) is str
        if plain:
            known = self._hashed.get(text)
            if known is not None:
                return known
        secret = self._key
        stripped = text.strip()
        if stripped == text:
            keys: tuple[str, str | None] = (digest(secret, data), None)
        elif text.startswith(stripped):  # trailing whitespace only: hashed once for both
            cut = len(data) - len(encode(text[len(stripped) :]))
            bare, whole = prefix_digests(secret, data, cut)
            keys = (whole, bare)
        else:
            keys = (digest(secret, data), digest(secret, encode(stripped)))
        if plain and len(text) <= _HASHED_CHARS:
            hashed = self._hashed
            if len(hashed) >= _HASHED:
                hashed.clear()
            hashed[text] = keys
        return keys

    def _fetch(self, digests: list[str]) -> dict[str, Entry]:
        """The known entries of `digests`: cached, or brought from the store in one lookup.

        Returned for the caller to use, not read back from the cache: caching one entry may
        evict another found in the same input."""
        found: dict[str, Entry] = {}
        missing: list[str] = []
        for key in dict.fromkeys(digests) if len(digests) > 1 else digests:
            entry = self._entries.get(key)
            if entry is None:
                missing.append(key)
            else:
                found[key] = entry
        if missing:
            for key, entry in self._reader.lookup(missing).items():
                self._remember(entry)
                found[key] = entry
        return found

    def _region(self, entry: Entry, chars: int, closures: dict[str, AbstractSet[str]]) -> _Part:
        """The part of an input a known text is (as `Entry.region` would make it)."""
        if entry.depth == 0:  # a source's entry rests on itself alone
            return (entry.id, 0, frozenset((entry.id,)), frozenset((entry.kind,)), chars)
        sources = closures.get(entry.id)
        if sources is None:
            sources = closures[entry.id] = self._rests_on(entry)
        return (entry.id, entry.depth, sources, frozenset(entry.source_kinds), chars)

    def _rests_on(self, entry: Entry) -> AbstractSet[str]:
        """Every source a summary rests on: remembered from when it was recorded or last
        resolved, else walked in memory, else asked of the store if a parent is not cached."""
        known = self._closures.get(entry.id)
        if known is not None:
            return known
        walked = self._walk(entry)
        if walked is None:  # a summary it rests on is not cached: the store walks it
            known = self._reader.rests_on([entry.id])[entry.id]
            self._closures.put(entry.id, known)
            return known
        # Anchored only while the summary itself is cached: one fetched for this input may be
        # evicted by another found in it (`_fetch`), and its growth elsewhere, learnt back as
        # new, would then leave the closure standing (a source it gained unseen).
        cached = self._summaries.get(entry.id) is entry
        self._closures.put(entry.id, walked, anchored=cached)
        return walked

    def _walk(self, entry: Entry) -> frozenset[str] | None:
        """What a summary rests on, from the cached entries; None if one is not cached."""
        sources: set[str] = set(entry.sources)
        seen = set(entry.parents)
        todo = list(entry.parents)
        while todo:
            parent = self._summaries.get(todo.pop())
            if parent is None:
                return None
            sources.update(parent.sources)
            for grand in parent.parents:
                if grand not in seen:
                    seen.add(grand)
                    todo.append(grand)
        return frozenset(sources)

    def _gap(
        self,
        text: str,
        data: bytes,
        key: str,
        start: int,
        end: int,
        ascii: bool,
        shadow: int = 0,
        shadowing: str = "",
    ) -> list[_Op]:
        """Unrecognised content (bytes `start:end` of the message): original, resting on a
        source of its own; none if it is only whitespace. A whole message's id is its digest;
        a gap's comes from the message's digest and the gap's place, so the input is hashed
        once. Its bytes up to `shadow` are the end of the source of digest `shadowing`
        (`_recipe`), counted with it."""
        if shadow > start:
            covered = min(shadow, end)
            own = (_TEXT, shadowing, _chars(data, start, covered, ascii), 0, _NO_PART)
            if covered == end:
                return [own]
            return [own, *self._gap(text, data, key, covered, end, ascii)]
        if ascii:  # (byte offsets are character offsets): whitespace only, read in place
            if _NONSPACE.search(text, start, end) is None:
                return []
            chars = end - start
        else:  # decoded once: checked and counted
            gap = data[start:end].decode("utf-8", "surrogatepass")
            if gap.isspace():
                return []
            chars = len(gap)
        if start == 0 and end == len(data):
            place = key
        else:
            place = self._digest(f"{key}:{start}:{end - start}".encode())
        source_id = f"{UNREGISTERED}:{place[:16]}"
        part = (source_id, 0, frozenset((source_id,)), _GAP_KINDS, chars)
        return [(_GAP, "", start, end, part)]

    def max_depth(self, window: str) -> int:
        """The deepest summary recorded in the window: O(1)."""
        with self._lock:
            depth = self._windows.get(window)
            if depth is None:
                depth = self.store.window_depth(window)
                self._windows[window] = depth
                while len(self._windows) > self.max_windows:
                    self._windows.popitem(last=False)  # the idlest window's state
            self._windows.move_to_end(window)
            return depth

    # -- memory ---------------------------------------------------------------------------------

    def _remember(self, entry: Entry) -> None:
        """Cache an entry (least recently used out: then the index no longer holds everything)."""
        earlier = self._entries.get(entry.digest)
        if earlier is not None and earlier is not entry and _rests_otherwise(earlier, entry):
            self._closures.clear()  # merged: what it and everything resting on it rest on grew
        elif earlier is None and entry.depth > 0:
            # A summary new to the cache may have been recorded again elsewhere (grown), and a
            # closure the store gave may rest on it: those go. (Anchored ones rest only on
            # summaries cached since they were made, whose growth is seen above.)
            self._closures.drop_unanchored()
        self._entries[entry.digest] = entry
        self._entries.move_to_end(entry.digest)
        if entry.depth > 0:
            self._summaries[entry.id] = entry
            if earlier is not None and earlier.depth == 0:  # a source's text, a summary's now:
                self._index.promote(entry.digest)  # (the index holds only cached texts)
        while len(self._entries) > self.max_texts:
            _, dropped = self._entries.popitem(last=False)
            if dropped.depth > 0:
                self._summaries.pop(dropped.id, None)
                # What rests on a summary no longer cached may grow unseen (recorded again
                # elsewhere, learnt back as new): no closure may outlive the entries it was
                # walked from, or a summary would be decided on sources it no longer rests on.
                self._closures.clear()
            if dropped.digest in self._index:
                self._index.discard(dropped.digest)
                self._complete = False
                self._epoch += 1

    def _learn(self, entry: Entry, data: bytes, check: bool = False) -> None:
        """Cache an entry and index its text (`data`) for finding it inside longer input."""
        if check and self._digest(data) != entry.digest:
            return
        self._remember(entry)
        self._index.add(data, entry.digest, entry.depth > 0)

    def _catch_up(self) -> None:
        """Index texts other processes (or this one) recorded since we last looked."""
        while True:
            cursor, items = self._reader.since(self._cursor, 1024)
            self._cursor = cursor
            self._take(items)
            if len(items) < 1024:
                return

    def _take(
        self, items: list[tuple[Entry, str | None]], within: list[Region | str] | None = None
    ) -> bool:
        """Learn entries recorded elsewhere (`since`); True when one may change what `within`
        (an input) is made of: it changed a cached entry, or its text is in the input, or it
        cannot be looked for (no text), or it dropped closures (a summary of the input may
        rest on one that grew)."""
        changed = False
        drops = self._closures.drops
        windows = self._windows
        for entry, text in items:
            if entry.depth > 0 and windows.get(entry.window, entry.depth) < entry.depth:
                windows[entry.window] = entry.depth  # a deeper pass elsewhere
            cached = self._entries.get(entry.digest)
            grew = cached is not None and not _same(cached, entry)
            if grew:  # recorded again elsewhere: merged
                self._remember(entry)
                changed = True
            if cached is not None and entry.digest in self._index:
                continue
            if text is not None:
                data = encode(text)
                self._learn(entry, data)
                if within is not None and not changed:
                    changed = any(
                        text in (i if isinstance(i, str) else i.text or "") for i in within
                    )
            else:
                self._remember(entry)
                # Known, text gone: a summary must still be found inside longer input, so
                # ask the store. (An evicted source found there or not is dead either way.)
                if entry.anchor is not None and entry.depth > 0:
                    self._complete = False
                    self._epoch += 1
                    changed = True
        return changed or self._closures.drops != drops


_NOTHING: frozenset[str] = frozenset()

#: One step of how a message splits (`Ledger._recipe`): (_TEXT, digest, chars, 0, _NO_PART) for
#: a known text, (_GAP, "", start, end, part) for unrecognised content at those bytes.
_Op = tuple[int, str, int, int, "_Part"]
_TEXT, _GAP = 0, 1
_NO_PART: _Part = ("", 0, frozenset(), frozenset(), 0)
#: A remembered split (`Ledger._found`, `Ledger._split`): the epoch and index additions it was
#: made at, what the store found, every known text found (ordered), and how it splits.
_Split = tuple[
    int,
    int,
    frozenset[tuple[int, int, str]],
    tuple[tuple[int, int, str], ...],
    tuple[_Op, ...] | None,
]


class _Deferred:
    """The store as recognition sees it around a `Store.view`: catching up is the view's; on the
    first pass looking up is too (the digests asked are noted in `asked`), and after it the
    digests the view `answered` are not asked again; anything else is asked at once."""

    def __init__(
        self,
        store: Store,
        asked: list[str] | None,
        answered: Collection[str] = (),
        entries: Mapping[str, Entry] | None = None,
    ) -> None:
        self._store, self._asked, self._answered = store, asked, answered
        self._entries = entries or {}  # the view's answers: given again, whatever the cache kept

    def __getattr__(self, name: str) -> Any:
        return getattr(self._store, name)

    def since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        return cursor, []

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        if self._asked is None:
            found = {d: self._entries[d] for d in digests if d in self._entries}
            missing = [d for d in digests if d not in self._answered]
            if missing:
                found.update(self._store.lookup(missing))
            return found
        self._asked.extend(digests)
        return {}


class _Failing:
    """The store when it did not answer a view: every read fails at once with the same error,
    so recognition fails closed from what is cached without waiting out a timeout per read."""

    def __init__(self, error: Exception) -> None:
        self.error = error

    def __getattr__(self, name: str) -> Any:
        def fail(*args: Any, **kwargs: Any) -> Any:
            raise self.error

        return fail
