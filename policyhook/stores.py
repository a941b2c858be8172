"""Stores: where original evidence lives, and the durable record of every text the guard knows.

A source is live while its store can give it back. The guard asks once per decision, for every
source of the region at once (`live`), so a store costs one round-trip whatever the region's size.
A store also indexes every text it was given (sources and granted summaries) by a keyed digest, so
that recognition never depends on what a process happens to cache: a cache miss asks the store.
The contract every store keeps is written as tests in tests/store_contract.py and in docs/stores.md.
"""

from __future__ import annotations

import bisect
import json
import os
import sqlite3
import threading
import time
from array import array
from collections import OrderedDict
from collections.abc import Callable, Collection, Iterable, Sequence
from collections.abc import Set as AbstractSet
from dataclasses import replace
from pathlib import Path
from typing import Any, ClassVar, Literal

from policyhook import _fork
from policyhook._errors import StoreUnavailableError
from policyhook._provenance import (
    UNREGISTERED,
    Entry,
    FactRecord,
    Held,
    KeyedHashes,
    Region,
    Source,
    SourceIdConflictError,
    State,
    Store,
    View,
    _Grown,
    _made,
    anchor_of,
    check_seconds,
    digest,
    encode,
)

__all__ = ["MemoryStore", "SQLiteStore", "State", "Store", "open_store"]


#: The reads `MemoryStore.view` is made of; a subclass or instance overriding one is heard.
_VIEW_PARTS = frozenset({"since", "lookup", "rests_on", "live", "window_depth"})
#: Deaths (evictions, expiries, capacity) a MemoryStore keeps in order, for a view given what
#: was held as of an earlier one (`Held`): past twice this many the older half goes, and a
#: `Held.as_of` from before what is kept is answered by checking every id.
_DEATHS = 4_096
#: The set types the ledger gives a view (`type(x) in`: `_Grown` is an ABC, whose
#: `isinstance` check runs in Python).
_SETS = (frozenset, _Grown)


def _names_only(source: Source, text_digest: str) -> bool:
    """Whether `source.id` can only ever name the text of `text_digest`, whatever was forgotten:
    an id made by `text_id(prefix, text)` with the store's secret ends with the text's keyed
    digest (derived ids, `guard.text_id`, the adapters' ids, offload refs), and the ids the
    ledger gives unrecognised content (`window:` + a keyed hash of where it was found) are one
    text's each by construction."""
    if source.id.endswith(":" + text_digest[:16]):
        return True
    head, _, tail = source.id.partition(":")
    return source.kind == UNREGISTERED and head == UNREGISTERED and len(tail) == 16


class MemoryStore:
    """A process-local store: for tests, demos and runtimes that keep originals in memory.

    Bounded: at most `max_sources` source texts and as many summary texts (with their per-fact
    provenance) are held, oldest put first out; a source put more than `ttl` seconds ago
    expires. A source evicted (by `evict`, capacity or TTL) leaves a tombstone; at most
    `max_tombstones` (default: `max_sources`) are kept, the oldest forgotten with its source's
    entry: its id is then unknown (still dead) and its text new evidence. Summaries' entries (a
    few hundred bytes each, no text) are never forgotten: a forgotten summary would come back as
    original evidence, a wrong allow.

    A source id names one text: another text under an id held or tombstoned is refused
    (`SourceIdConflictError`). A forgotten tombstone's id is still remembered with its text's
    digest, for at most `max_ids` ids (default: 16 x `max_tombstones`, at least 4,096; ~200
    bytes each). Past that, an id the store does not know may be one it forgot, so only ids that
    name their text by construction are taken (`_names_only`): fail closed. See docs/stores.md.
    """

    #: Whether a subclass overrides a read `view` is made of (then `view` makes those calls).
    _heard: ClassVar[bool] = False

    def __init__(
        self,
        *,
        max_sources: int | None = None,
        ttl: float | None = None,
        max_tombstones: int | None = None,
        max_ids: int | None = None,
    ) -> None:
        if max_sources is not None and max_sources < 1:
            raise ValueError(f'"max_sources" must be >= 1: {max_sources}')
        if ttl is not None:
            check_seconds("ttl", ttl)
        if max_tombstones is not None and max_tombstones < 0:
            raise ValueError(f'"max_tombstones" must be >= 0: {max_tombstones}')
        if max_ids is not None and max_ids < 0:
            raise ValueError(f'"max_ids" must be >= 0: {max_ids}')
        self.max_sources = max_sources
        self.ttl = ttl
        self.max_tombstones = max_sources if max_tombstones is None else max_tombstones
        if max_ids is None and self.max_tombstones is not None:
            max_ids = max(4_096, 16 * self.max_tombstones)
        self.max_ids = max_ids
        self._secret = os.urandom(32)
        self._hashes = KeyedHashes(self._secret)  # every source put is hashed with these
        self._lock = threading.Lock()
        self._held: OrderedDict[str, tuple[Source, str, float]] = OrderedDict()  # id -> expiry
        self._dead: OrderedDict[str, State] = OrderedDict()  # the tombstones, oldest first
        self._timed = False  # a source was put with an expiry (`ttl`): `_expire` has work
        self._of_source: dict[str, set[str]] = {}  # source id -> digests of its entries
        # source id -> digest of the one text it names: every id held or tombstoned (`_named`),
        # then the ids of forgotten tombstones, oldest first (`_retired`, at most `max_ids`)
        self._named: dict[str, str] = {}
        # text digest -> the ids naming it, for a source's text put under more than one id
        # (rare): forgetting the id its entry names hands the entry to one still held
        self._shared: dict[str, set[str]] = {}
        self._retired: OrderedDict[str, str] = OrderedDict()
        self._forgotten = 0  # ids dropped from `_retired`: past it, unknown ids may be reused
        self._entries: dict[str, Entry] = {}  # digest -> entry
        self._by_id: dict[str, Entry] = {}  # summary id -> entry
        # anchor -> the digest of the one text starting with it, or of each (a list, rare):
        # a list per text would cost ~90 bytes each, and almost every anchor has one text
        self._by_anchor: dict[str, str | list[str]] = {}
        self._texts: OrderedDict[str, str] = OrderedDict()  # summary digest -> text, bounded
        # summary id -> fact -> ids of the sources stating it; bounded with the summary texts
        self._facts: OrderedDict[str, dict[str, set[str]]] = OrderedDict()
        # For `since`: each entry's last write (digest -> seq) and the writes in order, as two
        # parallel columns (seqs unboxed: 16 bytes a write, not a 56-byte tuple and a slot); a
        # write superseded by a later one of the same text, or forgotten, is blanked (""),
        # skipped, and dropped when they pile up.
        self._seq = 0
        self._order: dict[str, int] = {}
        self._log_seqs = array("q")
        self._log_digests: list[str] = []
        self._depths: dict[str, int] = {}
        # Every id that stopped being held (`_bury`), in order: `_deaths[i]` is death number
        # `_dead_before + i`. A view's `as_of` is (this store's token, the deaths so far).
        self._deaths: list[str] = []
        self._dead_before = 0
        self._token = object()
        _fork.register(self, MemoryStore._after_fork)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls._heard = any(getattr(cls, n) is not getattr(MemoryStore, n) for n in _VIEW_PARTS)

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def secret(self) -> bytes:
        return self._secret

    def _index(self, entry: Entry, previous: Entry | None) -> None:
        """Index `entry`; `previous`: the entry held under its digest before (None: new)."""
        if previous is None and entry.anchor is not None:
            listed = self._by_anchor.get(entry.anchor)
            if listed is None:
                self._by_anchor[entry.anchor] = entry.digest
            elif isinstance(listed, str):
                self._by_anchor[entry.anchor] = [listed, entry.digest]
            else:
                listed.append(entry.digest)
        self._entries[entry.digest] = entry
        if entry.depth == 0:
            self._of_source.setdefault(entry.id, set()).add(entry.digest)
        self._seq += 1
        written = self._order.get(entry.digest)
        if written is not None:
            self._unlog(written)
        self._order[entry.digest] = self._seq
        self._log_seqs.append(self._seq)
        self._log_digests.append(entry.digest)
        if len(self._log_digests) > 2 * len(self._order) + 1024:
            order, seqs = self._order, self._log_seqs
            keep = [i for i, d in enumerate(self._log_digests) if order.get(d) == seqs[i]]
            self._log_seqs = array("q", [seqs[i] for i in keep])
            self._log_digests = [self._log_digests[i] for i in keep]

    def _bury(self, source_id: str, state: State) -> None:
        """Leave a tombstone; past `max_tombstones`, forget the oldest with its entries. The
        one place an id stops being held: logged for views given `Held` (`_died_since`)."""
        self._dead[source_id] = state
        self._dead.move_to_end(source_id)
        self._deaths.append(source_id)
        if len(self._deaths) > 2 * _DEATHS:
            del self._deaths[:_DEATHS]
            self._dead_before += _DEATHS
        while self.max_tombstones is not None and len(self._dead) > self.max_tombstones:
            forgotten, _ = self._dead.popitem(last=False)
            self._retired[forgotten] = self._named.pop(forgotten)
            if self.max_ids is not None and len(self._retired) > self.max_ids:
                self._retired.popitem(last=False)
                self._forgotten += 1
            for d in self._of_source.pop(forgotten, ()):
                heir = self._heir(d, forgotten)
                entry = self._entries.get(d)
                if entry is None or entry.depth > 0 or entry.id != forgotten:
                    continue  # a summary now, or the same text put under another id since
                if heir is not None:  # the same text, put earlier under an id still held
                    source, text, _ = self._held[heir]
                    self._index(Entry.of_source(self._hashes, source, text, d), entry)
                    continue
                del self._entries[d]
                self._unlog(self._order.pop(d, None))
                if entry.anchor is not None:
                    self._unanchor(entry.anchor, d)

    def _heir(self, text_digest: str, forgotten: str) -> str | None:
        """An id other than `forgotten` that names the text of `text_digest` and is held;
        `forgotten` is dropped from the ids sharing it (and the record with one id left)."""
        ids = self._shared.get(text_digest)
        if ids is None:
            return None
        ids.discard(forgotten)
        if len(ids) < 2:
            del self._shared[text_digest]
        return next((i for i in sorted(ids) if i in self._held), None)

    def _unlog(self, seq: int | None) -> None:
        """Mark the write `seq` superseded (its text written again, or forgotten): `since`
        skips it, and it no longer keeps the digest alive until the log is compacted."""
        if seq is not None:
            self._log_digests[bisect.bisect_left(self._log_seqs, seq)] = ""

    def _unanchor(self, anchor: str, text_digest: str) -> None:
        listed = self._by_anchor.get(anchor)
        if listed == text_digest:
            del self._by_anchor[anchor]
        elif isinstance(listed, list) and text_digest in listed:
            listed.remove(text_digest)
            if len(listed) == 1:
                self._by_anchor[anchor] = listed[0]

    def _anchored(self, anchor: str) -> Sequence[str]:
        """The digests of the texts starting with `anchor`."""
        listed = self._by_anchor.get(anchor, ())
        return (listed,) if isinstance(listed, str) else listed

    def _expire(self, now: float) -> None:
        if not self._timed:  # every source held was put to be held forever
            return
        while self._held:
            source_id, (_, _, expires) = next(iter(self._held.items()))
            if expires > now:
                return
            del self._held[source_id]
            self._bury(source_id, "expired")

    def put_source(self, source: Source, text: str) -> None:
        self._put_source(source, text, None)

    def put_source_hashed(self, source: Source, text: str, text_digest: str) -> None:
        """`put_source` given the text's keyed digest, made already by the ledger: not hashed
        again. A `put_source` overridden (by a subclass, or on the instance) is called instead."""
        if type(self).put_source is MemoryStore.put_source and "put_source" not in self.__dict__:
            self._put_source(source, text, text_digest)
        else:
            self.put_source(source, text)

    def _put_source(self, source: Source, text: str, text_digest: str | None) -> None:
        entry = Entry.of_source(self._hashes, source, text, text_digest)
        with self._lock:
            now = time.monotonic()
            self._expire(now)
            named = self._named.get(source.id)
            if named is None:
                named = self._retired.get(source.id)
                state = "forgotten: its tombstone was dropped past max_tombstones"
            else:
                state = "live" if source.id in self._held else self._dead[source.id]
            if named is None and self._forgotten and not _names_only(source, entry.digest):
                raise SourceIdConflictError(
                    source.id,
                    f"is not known to this MemoryStore, which has forgotten {self._forgotten:,} "
                    f"ids it held (past max_ids={self.max_ids:,}) and cannot tell whether it "
                    "was one of them",
                    "leave source_id out so one is derived from the text, or use "
                    "guard.text_id(prefix, text); or raise max_ids, or use a store that keeps "
                    "every id (SQLiteStore, PostgresStore, RedisStore)",
                )
            if named is not None and named != entry.digest:
                raise SourceIdConflictError.taken(source.id, state)
            self._retired.pop(source.id, None)
            self._named[source.id] = entry.digest
            self._held.pop(source.id, None)
            self._held[source.id] = (source, text, now + self.ttl if self.ttl else float("inf"))
            self._timed = self._timed or bool(self.ttl)
            self._dead.pop(source.id, None)
            known = self._entries.get(entry.digest)
            if known is not None and known.depth == 0 and known.id != source.id:
                self._shared.setdefault(entry.digest, {known.id}).add(source.id)
            if known is None or known.depth == 0:  # a summary's text stays that summary
                self._index(entry, known)
            if self.max_sources is not None:
                while len(self._held) > self.max_sources:
                    dropped, _ = self._held.popitem(last=False)
                    self._bury(dropped, "evicted")

    def _held_now(self, source_id: str) -> tuple[Source, str, float] | None:
        self._expire(time.monotonic())
        return self._held.get(source_id)

    def get_source(self, source_id: str) -> str | None:
        with self._lock:
            held = self._held_now(source_id)
        return None if held is None else held[1]

    def get_sources(self, source_ids: Collection[str]) -> dict[str, str]:
        with self._lock:
            self._expire(time.monotonic())
            return {s: held[1] for s in source_ids if (held := self._held.get(s)) is not None}

    def evict(self, source_id: str) -> bool:
        with self._lock:
            if self._held_now(source_id) is None:
                return False
            del self._held[source_id]
            self._bury(source_id, "evicted")
            return True

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        with self._lock:
            self._expire(time.monotonic())
            return _held(self._held, source_ids)

    def states(self, source_ids: Collection[str]) -> dict[str, State]:
        with self._lock:
            self._expire(time.monotonic())
            out: dict[str, State] = {}
            for s in source_ids:
                if s in self._held:
                    out[s] = "live"
                elif s in self._dead:
                    out[s] = self._dead[s]
            return out

    def put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        with self._lock:
            earlier = self._entries.get(entry.digest)
            if earlier is not None:
                entry = entry.merged(earlier)
            self._index(entry, earlier)
            self._by_id[entry.id] = entry
            texts = self._texts
            texts[entry.digest] = text
            texts.move_to_end(entry.digest)
            if facts and any(ids for _, ids in facts):
                known = self._facts.setdefault(entry.id, {})
                for fact, ids in facts:
                    if ids:
                        known.setdefault(fact, set()).update(ids)
            if entry.id in self._facts:
                self._facts.move_to_end(entry.id)
            if self.max_sources is not None:
                while len(self._texts) > self.max_sources:
                    self._texts.popitem(last=False)
                while len(self._facts) > self.max_sources:
                    self._facts.popitem(last=False)
            self._depths[entry.window] = max(self._depths.get(entry.window, 0), entry.depth)
            return entry

    def facts(self, summary_ids: Collection[str]) -> dict[str, list[FactRecord]]:
        with self._lock:
            return {
                s: [(f, tuple(sorted(ids))) for f, ids in self._facts[s].items()]
                for s in summary_ids
                if s in self._facts
            }

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        with self._lock:
            return {d: self._entries[d] for d in digests if d in self._entries}

    def by_anchor(self, anchors: Collection[str]) -> list[Entry]:
        with self._lock:
            return [self._entries[d] for a in anchors for d in self._anchored(a)]

    def rests_on(self, summary_ids: Collection[str]) -> dict[str, frozenset[str]]:
        with self._lock:
            return {s: frozenset(_closure(s, self._by_id.get)) for s in summary_ids}

    def window_depth(self, window: str) -> int:
        with self._lock:
            return self._depths.get(window, 0)

    def since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        with self._lock:
            return self._since(cursor, limit)

    def _since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        self._expire(time.monotonic())
        seqs, digests = self._log_seqs, self._log_digests
        at = bisect.bisect_right(seqs, cursor)  # the first write after cursor
        out: list[tuple[Entry, str | None]] = []
        while at < len(seqs) and len(out) < limit:
            cursor, d = seqs[at], digests[at]
            at += 1
            if self._order.get(d) != cursor:
                continue  # written again later, or forgotten
            entry = self._entries[d]
            if entry.depth == 0:
                held = self._held.get(entry.id)
                out.append((entry, held[1] if held is not None else None))
            else:
                out.append((entry, self._texts.get(d)))
        return cursor, out

    def _died_since(self, held: Held) -> list[str] | None:
        """The ids that stopped being held since `held.as_of` (some may be held again), or
        None when this store cannot tell: not its token, or deaths since then forgotten."""
        as_of = held.as_of
        if type(as_of) is not tuple or len(as_of) != 2 or as_of[0] is not self._token:
            return None
        at = as_of[1] - self._dead_before
        if at < 0:  # the log no longer reaches back to it
            return None
        return self._deaths[at:]

    def view(
        self,
        cursor: int,
        limit: int,
        digests: Collection[str],
        source_ids: Collection[str],
        window: str | None = None,
        *,
        held: Held | None = None,
    ) -> View:
        """In process: one lock, one pass. A subclass (or an instance) overriding one of the
        reads it is made of (`since`, `lookup`, `rests_on`, `live`, `window_depth`: a test's
        faulty store) is still heard: the view is then made of those calls (and says no
        `as_of`). Given `held`, what died since `held.as_of` is looked up in `held.ids`, and
        `held.rest` is checked: a rolling chain's k ids are not looked up again."""
        if type(self)._heard or not _VIEW_PARTS.isdisjoint(self.__dict__):
            cursor, items = self.since(cursor, limit)
            entries = self.lookup(digests)
            rests_on = self.rests_on([e.id for e in entries.values() if e.depth > 0])
            view = View(cursor, items, entries, rests_on, frozenset())
            depth = None if window is None else self.window_depth(window)
            return replace(view, live=self.live(view.asked(source_ids)), depth=depth)
        with self._lock:
            cursor, items = self._since(cursor, limit)
            known = self._entries
            entries = {}
            for d in digests:  # (a loop, not a comprehension: usually one digest, not found)
                found = known.get(d)
                if found is not None:
                    entries[d] = found
            by_id = self._by_id.get
            rests_on = (
                {e.id: frozenset(_closure(e.id, by_id)) for e in entries.values() if e.depth > 0}
                if entries
                else {}
            )
            holding = self._held
            died = None
            if held is not None and not entries and (died := self._died_since(held)) is not None:
                live = _held_since(holding, source_ids, held, died)  # (expired: among `died`)
            else:
                asked: Collection[str] = source_ids
                if entries:
                    asked = set(source_ids).union(*rests_on.values())
                    asked.update(e.id for e in entries.values() if e.depth == 0)
                live = _held(holding, asked)  # (expired ones were dropped by `_since`)
            depth = None if window is None else self._depths.get(window, 0)
            as_of = (self._token, self._dead_before + len(self._deaths))
        return _made(  # `View(...)`, without the frozen dataclass's `__setattr__` per field
            View,
            {
                "cursor": cursor,
                "since": items,
                "entries": entries,
                "rests_on": rests_on,
                "live": live,
                "depth": depth,
                "as_of": as_of,
            },
        )

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        with self._lock:
            self._expire(time.monotonic())
            return [(s, t) for s, t, _ in list(self._held.values())[-limit:]]

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        with self._lock:
            held = [
                (self._entries[d], t)
                for d, t in self._texts.items()
                if self._entries[d].window == window
            ][-limit:]
            return [(e.region(frozenset(_closure(e.id, self._by_id.get))), t) for e, t in held]


def _held(held: dict[str, Any], ids: Collection[str]) -> frozenset[str]:
    """Those of `ids` that are keys of `held`, in C. When every one is (a rolling chain's k
    sources, all held), a frozenset `ids` is given back as it is: nothing k-sized is made,
    and the guard then sees in O(1) that none is dead (`_activation.build`)."""
    if not ids:
        return frozenset()
    if isinstance(ids, frozenset) and held.keys() >= ids:  # k lookups, nothing allocated
        return ids
    return frozenset(held.keys() & ids)


def _held_since(
    held: dict[str, Any], ids: Collection[str], known: Held, died: Sequence[str]
) -> frozenset[str]:
    """Those of `ids` (`known.ids` and `known.rest`) that are keys of `held`, when every one
    of `known.ids` was held as of `known.as_of` and `died` stopped being held since: those
    of them among `known.ids`, and `known.rest`, are looked up; the other ids of
    `known.ids` are held still. `ids` itself when all are (as `_held`)."""
    dead = {i for i in died if i in known.ids and i not in held}
    dead.update(i for i in known.rest if i not in held)
    if not dead:  # (a region's set, as the ledger gave it: a frozenset, or one not made yet)
        return ids if type(ids) in _SETS else frozenset(ids)  # type: ignore[return-value]
    return frozenset(ids).difference(dead)


class _Liveness:
    """SQLiteStore's cache of when each source id stops being live, kept as sets so that the
    liveness of k ids (a rolling chain's) is a few set operations in C, not k Python steps:
    every id cached (`known`) and, among them, those not held for good (`unheld`: not held,
    or held until a time kept in `until`); the rest of `known` is held for good. Dead ids
    are the few looked up, not the many live ones: an answer with d of its k ids dead costs
    one pass over the k (are they all cached?), one over the smaller of the d and `unheld`,
    and one copy of the k less the d, whatever the d (no set of the held ones is built)."""

    __slots__ = ("known", "unheld", "until")

    def __init__(self) -> None:
        self.known: set[str] = set()
        self.unheld: set[str] = set()
        self.until: dict[str, float] = {}

    def __len__(self) -> int:
        return len(self.known)

    def clear(self) -> None:
        self.known.clear()
        self.unheld.clear()
        self.until.clear()

    def set(self, source_id: str, expires: float) -> None:
        """`expires`: `_FOREVER`, a unix time, or 0 (not held)."""
        self.known.add(source_id)
        if expires == _FOREVER:
            self.unheld.discard(source_id)
            if self.until:
                self.until.pop(source_id, None)
        else:
            self.unheld.add(source_id)
            if expires > 0:
                self.until[source_id] = expires
            elif self.until:
                self.until.pop(source_id, None)

    def not_held(self, ids: Collection[str]) -> None:
        """`set(i, 0.0)` for each of `ids`, in C (none is cached as expiring, usually)."""
        self.known.update(ids)
        self.unheld.update(ids)
        if self.until:
            for i in ids:
                self.until.pop(i, None)

    def earliest(self, ids: AbstractSet[str]) -> float:
        """The earliest time any of `ids` (all cached and held) stops being held: `_FOREVER`
        when none is held until a time (at once when no id is)."""
        until = self.until
        if not until:
            return _FOREVER
        if len(until) <= len(ids):
            return min((t for i, t in until.items() if i in ids), default=_FOREVER)
        return min((until[i] for i in ids if i in until), default=_FOREVER)

    def missing(self, ids: frozenset[str]) -> list[str]:
        """Those of `ids` not cached: one C pass over `ids` (a difference: `ids <= known`
        took a third longer, ~41-47 against ~31 µs for 3,000 ids, in the same process)."""
        missing = ids - self.known
        return list(missing) if missing else []

    def asked(self, source_ids: Collection[str]) -> tuple[AbstractSet[str], list[str]]:
        """`source_ids` as a set, with those of them not cached (`missing`). A frozenset is
        given back as it is. Any other collection is read once, as MemoryStore reads one:
        the cached ones among them picked in one C pass and, when that is as many as given
        (every one, none repeated), that new set is given (`held` may take the dead out of
        it in place, then copies it once into the answer); else as a frozenset."""
        if isinstance(source_ids, frozenset):
            return source_ids, self.missing(source_ids)
        cached = self.known.intersection(source_ids)
        if len(cached) == len(source_ids):
            return cached, []
        ids = frozenset(source_ids)
        return ids, self.missing(ids)

    def held(self, ids: AbstractSet[str], now: float) -> frozenset[str]:
        """Those of `ids` (from `asked`) held at `now`, every one of them cached (ask
        `missing` first: an id not cached would count as held for good, a wrong allow):
        `ids` itself when none is among `unheld` (a C pass over the smaller of the two,
        stopping at the first found; nothing k-sized made for a frozenset), else `ids` less
        the unheld ones not held until after `now`: one C pass over the smaller of those and
        `ids`, and one copy (a set from `asked` loses them in place first)."""
        unheld = self.unheld
        if not unheld or unheld.isdisjoint(ids):
            return ids if isinstance(ids, frozenset) else frozenset(ids)
        until = self.until
        dead: AbstractSet[str] = unheld  # nothing expiring: every unheld id is dead
        if until:
            dead = unheld.intersection(ids)
            dead.difference_update([i for i in dead if until.get(i, 0.0) > now])
        if isinstance(ids, frozenset):
            return ids - dead
        if isinstance(ids, set) and len(dead) <= len(ids):
            ids.difference_update(dead)
            return frozenset(ids)
        return frozenset(ids - dead)


def _closure(summary_id: str, get: Callable[[str], Entry | None]) -> set[str]:
    """Every source id a summary rests on, walking parent links once each."""
    sources: set[str] = set()
    seen = {summary_id}
    todo = [summary_id]
    while todo:
        entry = get(todo.pop())
        if entry is None:
            continue
        sources.update(entry.sources)
        for parent in entry.parents:
            if parent not in seen:
                seen.add(parent)
                todo.append(parent)
    return sources


#: 1: summaries copying their source lists; 2: normalised entries; 3: per-fact provenance;
#: 4: the digest of the text each source id names (`sources.digest`); 5: a change sequence on
#: `sources` (`sources.change`, kept by triggers), so a liveness cache re-reads only what changed.
_SCHEMA_VERSION = 5
_FOREVER = float("inf")
#: Cached liveness entries before the cache is dropped (and filled again from the next reads):
#: about 160 bytes an id (its sets' share and the id), so a long loop of new sources stays
#: within ~10 MB (1,000,000 kept ~160 MB); dropping it costs one k-row join, once per 65,536 ids.
_CACHE_MAX = 65_536
#: Source rows written by other connections that a liveness cache re-reads at once; past this
#: many since it last looked, it is dropped instead (and the ids asked are read afresh).
_CHANGES_MAX = 1_024
#: WAL pages written before a commit copies them into the database file (SQLite's default is
#: 1,000). A guarded call writes ~8 pages (its summary, four index leaves, the window's depth)
#: and recording a turn ~10, so the default made every ~55th call of an agent loop pay a
#: checkpoint (~1.5 ms CPU here): 1% of calls, the loop's p99. At 4,096 one call in ~220 does
#: (~3 ms: fewer pages per frame, as pages written again between checkpoints are copied once),
#: for a WAL file of up to 16 MB beside the database.
_CHECKPOINT_PAGES = 4_096
_SCHEMA = """
CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value BLOB NOT NULL);
-- A source's text is NULL once evicted (the row is its tombstone), expires is a unix time,
-- digest is the keyed digest of the one text the id names (NULL: not known, see `_name_sources`).
-- change: the sequence number of the row's last write (`_CHANGES`), for liveness caches.
CREATE TABLE IF NOT EXISTS sources (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, text TEXT, expires REAL,
    state TEXT NOT NULL DEFAULT 'live', digest TEXT, change INTEGER NOT NULL DEFAULT 0
);
-- One row per text known, normalised: parents and direct sources only, so size is linear.
CREATE TABLE IF NOT EXISTS entries (
    seq INTEGER PRIMARY KEY AUTOINCREMENT, digest TEXT NOT NULL UNIQUE, id TEXT NOT NULL,
    depth INTEGER NOT NULL, kind TEXT NOT NULL, size INTEGER NOT NULL, anchor TEXT,
    parents TEXT NOT NULL, direct TEXT NOT NULL, source_kinds TEXT NOT NULL,
    window TEXT NOT NULL, text TEXT
);
CREATE INDEX IF NOT EXISTS sources_live ON sources (id, state, expires);
CREATE INDEX IF NOT EXISTS entries_anchor ON entries (anchor) WHERE anchor IS NOT NULL;
CREATE INDEX IF NOT EXISTS entries_id ON entries (id);
CREATE INDEX IF NOT EXISTS entries_window ON entries (window, seq) WHERE depth > 0;
CREATE TABLE IF NOT EXISTS windows (window TEXT PRIMARY KEY, depth INTEGER NOT NULL);
-- Per-fact provenance of a summary: each fact with the ids of the sources stating it (JSON).
CREATE TABLE IF NOT EXISTS facts (
    summary TEXT NOT NULL, fact TEXT NOT NULL, sources TEXT NOT NULL,
    PRIMARY KEY (summary, fact)
) WITHOUT ROWID;
"""
#: Schema 5: every write to a source row gives it the next change number (counted in `meta`,
#: key 'change': not `max(change)`, which a REPLACE of the newest row would send back), whoever
#: writes it (this version's statements, an older policyhook still open on the file, a
#: hand-made INSERT): a trigger, so no writer can skip it. A deleted row would leave no change
#: for other connections' caches to read (they would go on answering it live: a wrong allow),
#: so a DELETE from `sources` is refused; evicting keeps the row as a tombstone. (A REPLACE
#: deletes without firing triggers and inserts the id again, with a new number.)
_BUMP = (
    "UPDATE meta SET value = value + 1 WHERE key = 'change'; UPDATE sources SET change = "
    "(SELECT value FROM meta WHERE key = 'change') WHERE rowid = NEW.rowid"
)
_CHANGES = (
    "INSERT OR IGNORE INTO meta SELECT 'change', coalesce(max(change), 0) FROM sources",
    "CREATE INDEX IF NOT EXISTS sources_change ON sources (change)",
    f"CREATE TRIGGER IF NOT EXISTS sources_put AFTER INSERT ON sources BEGIN {_BUMP}; END",
    "CREATE TRIGGER IF NOT EXISTS sources_changed AFTER UPDATE OF id, kind, text, expires, "
    f"state, digest ON sources BEGIN {_BUMP}; END",
    "CREATE TRIGGER IF NOT EXISTS sources_kept BEFORE DELETE ON sources BEGIN SELECT RAISE(ABORT, "
    "'policyhook: a source row is never deleted (other connections would miss it); evict it "
    "instead (SQLiteStore.evict)'); END",
    # A row given another id: its change is read under the new id, and the old one vanishes
    # unseen (other connections' caches would go on answering it live). Made on every open,
    # so files of schema 5 gain it too (policyhook 5 opens them as before).
    "CREATE TRIGGER IF NOT EXISTS sources_named BEFORE UPDATE OF id ON sources WHEN NEW.id "
    "IS NOT OLD.id BEGIN SELECT RAISE(ABORT, 'policyhook: a source row keeps its id (other "
    "connections would go on answering the old one); put the text under the new id'); END",
)
#: The highest change number given (`_CHANGES`), in SQL.
_LAST_CHANGE = "(SELECT value FROM meta WHERE key = 'change')"
_ENTRY_COLUMNS = "digest, id, depth, kind, size, anchor, parents, direct, source_kinds, window"
_E_COLUMNS = ", ".join(f"e.{c}" for c in _ENTRY_COLUMNS.split(", "))


def _sql_text(text: str | None) -> str | bytes | None:
    """A text as SQLite can bind it: one holding a lone surrogate (a cut emoji) is stored as its
    UTF-8 bytes with the surrogates passed through, as a BLOB; texts are never compared in SQL."""
    if text is None or text.isascii():
        return text
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return encode(text)
    return text


def _text(value: object) -> str:
    """A text read back from SQLite (see `_sql_text`)."""
    return value.decode("utf-8", "surrogatepass") if isinstance(value, bytes) else str(value)


#: JSON lists of source kinds read back (`entries.source_kinds`) and their tuples: a store
#: has a handful of distinct ones, and `json.loads` costs ~2 µs a call (a view's entry row
#: read three). Cleared when it reaches `_KINDS_MAX` (a store of many kinds: parsed again).
_kinds: dict[str, tuple[str, ...]] = {}
_KINDS_MAX = 1_024


def _strings(value: object) -> tuple[str, ...]:
    """A JSON list of strings written by `json.dumps` (an entry's parents or sources)."""
    text = str(value)
    return () if text == "[]" else tuple(json.loads(text))


def _entry(row: Iterable[object]) -> Entry:
    d, i, depth, kind, size, anchor, parents, direct, kinds, window = row
    key = str(kinds)
    source_kinds = _kinds.get(key)
    if source_kinds is None:
        if len(_kinds) >= _KINDS_MAX:
            _kinds.clear()
        source_kinds = _kinds[key] = _strings(key)
    return _made(  # `Entry(...)`, without the frozen dataclass's `__setattr__` per field
        Entry,
        {
            "digest": str(d),
            "id": str(i),
            "depth": int(depth),  # type: ignore[call-overload]
            "kind": str(kind),
            "size": int(size),  # type: ignore[call-overload]
            "anchor": None if anchor is None else str(anchor),
            "parents": _strings(parents),
            "sources": _strings(direct),
            "source_kinds": source_kinds,
            "window": str(window),
        },
    )


def _identity(path: str | Path) -> tuple[int, int] | None:
    """(device, inode) of a store file; None when there is no file to watch (`:memory:`)."""
    try:
        st = os.stat(path)
    except OSError:
        return None
    return st.st_dev, st.st_ino


#: Connections a forked child inherited: kept open and unused for the child's lifetime.
_inherited: list[sqlite3.Connection] = []


class SQLiteStore:
    """The embedded durable store: one SQLite file, survives restarts, safe across threads and
    processes.

    One connection guarded by a lock: SQLite serialises writers anyway, and a single connection
    keeps every thread's view consistent. WAL lets other processes read while we write. `ttl`
    (seconds) makes sources expire; `since` answers from memory while `PRAGMA data_version`
    says no other connection wrote.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        ttl: float | None = None,
        synchronous: Literal["NORMAL", "FULL"] = "NORMAL",
    ) -> None:
        if ttl is not None:
            check_seconds("ttl", ttl)
        if synchronous not in ("NORMAL", "FULL"):
            raise ValueError(f'"synchronous" must be "NORMAL" or "FULL": {synchronous!r}')
        # NORMAL: a crashed process loses nothing, a power loss the last commits; FULL: neither
        self.synchronous = synchronous
        self.path = Path(path)
        self._file = os.fspath(self.path)  # what `_check_file` stats
        self.ttl = ttl
        self._lock = threading.Lock()
        self._data_version = -1  # of the other connections' commits, when `since` last read
        self._head = 0  # highest entry seq this connection has seen or written
        # Liveness cache: id -> time its source stops being live (0: not live), valid while no
        # other connection commits; this connection's own writes update it.
        self._expiry = _Liveness()
        self._changes = 0  # the highest `sources.change` the cache is in step with (`_caught_up`)
        # What this handle's `View.as_of` starts with: (token, change number, earliest expiry)
        self._token = object()
        self._db = self._connect()
        with self._lock:
            _wal(self._db)
            self._db.execute("BEGIN IMMEDIATE")
            try:
                version = self._db.execute("PRAGMA user_version").fetchone()[0]
                if version > _SCHEMA_VERSION:
                    raise StoreUnavailableError(
                        f"SQLite store {self.path}: schema version {version} was written by a "
                        f"newer policyhook (this one knows up to {_SCHEMA_VERSION}); upgrade "
                        "policyhook"
                    )
                legacy = version < _SCHEMA_VERSION and self._has_table("summaries")
                if legacy:
                    self._db.execute("ALTER TABLE sources RENAME TO legacy_sources")
                    self._db.execute("ALTER TABLE summaries RENAME TO legacy_summaries")
                for statement in _SCHEMA.split(";"):
                    if statement.strip():
                        self._db.execute(statement)
                self._db.execute(
                    "INSERT OR IGNORE INTO meta VALUES ('secret', ?)", (os.urandom(32),)
                )
                self._secret = bytes(
                    self._db.execute("SELECT value FROM meta WHERE key = 'secret'").fetchone()[0]
                )
                if legacy:
                    self._migrate()
                if not self._has_column("sources", "digest"):
                    self._name_sources()
                if not self._has_column("sources", "change"):  # schema 4 to 5
                    self._db.execute(
                        "ALTER TABLE sources ADD COLUMN change INTEGER NOT NULL DEFAULT 0"
                    )
                for statement in _CHANGES:
                    self._db.execute(statement)
                # The cache is empty, so it is in step with every change up to now.
                self._changes = int(self._db.execute(f"SELECT {_LAST_CHANGE}").fetchone()[0])
                self._db.execute(f"PRAGMA user_version = {_SCHEMA_VERSION}")
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._db.close()
                raise
        self._identity = _identity(self.path)
        _fork.register(self, SQLiteStore._after_fork)

    def _check_file(self) -> None:
        """Refuse to go on with a file deleted or replaced while open: its writes would land in
        an unlinked inode and its answers come from a store nobody else sees (fail closed)."""
        if self._identity is not None and _identity(self._file) != self._identity:
            raise StoreUnavailableError(
                f"SQLite store {self.path} was deleted or replaced while open; "
                "reopen the store (its sources count as dead until then)"
            )

    def _after_fork(self) -> None:
        """A child must not use its parent's connection (SQLite: do not carry an open connection
        across a fork): it gets its own, and a lock no other thread holds."""
        _inherited.append(self._db)  # never closed in the child: that could disturb the parent
        self._lock = threading.Lock()
        self._data_version = -1
        # data_version counts per connection: the new one's could equal the cached one's while
        # another process evicted meanwhile, so the liveness cache starts over (fail closed).
        self._expiry.clear()
        self._token = object()  # (the parent's views' `as_of` are not taken here)
        self._db = self._connect()

    def _connect(self) -> sqlite3.Connection:
        db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        db.execute("PRAGMA busy_timeout=5000")
        db.execute(f"PRAGMA synchronous={self.synchronous}")  # (one of two words, checked)
        db.execute(f"PRAGMA wal_autocheckpoint={_CHECKPOINT_PAGES}")
        return db

    def _has_table(self, name: str) -> bool:
        row = self._db.execute(
            "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)
        ).fetchone()
        return row is not None

    def _has_column(self, table: str, column: str) -> bool:
        return any(r[1] == column for r in self._db.execute(f"PRAGMA table_info({table})"))

    def _name_sources(self) -> None:
        """Schema 2 or 3 to 4: the digest of the text each source id names. A held text gives
        its own; a tombstone, the one text the entries know under its id, if there is exactly
        one. Otherwise the id stays unidentified (NULL): no text can be registered under it
        again, since none can be shown to be the one its summaries were made from."""
        self._db.execute("ALTER TABLE sources ADD COLUMN digest TEXT")
        at = 0
        while rows := self._db.execute(
            "SELECT rowid, text FROM sources WHERE rowid > ? AND text IS NOT NULL "
            "ORDER BY rowid LIMIT 4096",
            (at,),
        ).fetchall():
            at = rows[-1][0]
            self._db.executemany(
                "UPDATE sources SET digest = ? WHERE rowid = ?",
                [(digest(self._secret, encode(_text(t))), r) for r, t in rows],
            )
        self._db.execute(
            "UPDATE sources SET digest = (SELECT CASE WHEN count(DISTINCT e.digest) = 1 "
            "THEN max(e.digest) END FROM entries AS e WHERE e.id = sources.id) "
            "WHERE text IS NULL"
        )

    def _migrate(self) -> None:
        """Schema 1 (summaries copying their full source lists) to normalised entries."""
        for source_id, kind, text in self._db.execute(
            "SELECT id, kind, text FROM legacy_sources ORDER BY rowid"
        ).fetchall():
            self._put_source(Source(source_id, kind), text)
        for summary_id, window, depth, sources, kinds, text in self._db.execute(
            "SELECT id, window, depth, sources, source_kinds, text FROM legacy_summaries "
            "ORDER BY rowid"
        ).fetchall():
            data = encode(text)
            self._put_summary(
                Entry(
                    digest=digest(self._secret, data),
                    id=summary_id,
                    depth=depth,
                    size=len(data),
                    anchor=anchor_of(self._secret, data),
                    sources=tuple(json.loads(sources)),
                    source_kinds=tuple(json.loads(kinds)),
                    window=window,
                ),
                text,
            )
        self._db.execute("DROP TABLE legacy_sources")
        self._db.execute("DROP TABLE legacy_summaries")

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def secret(self) -> bytes:
        return self._secret

    def _put_entry(self, entry: Entry, text: str | None) -> None:
        # A source's entry never replaces a summary's (the same text registered as a source):
        # the summary would pass for original evidence.
        keep = "WHERE NOT EXISTS (SELECT 1 FROM entries WHERE digest = ? AND depth > 0)"
        cursor = self._db.execute(
            f"INSERT OR REPLACE INTO entries ({_ENTRY_COLUMNS}, text) "
            f"SELECT ?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ? {keep if entry.depth == 0 else ''}",
            (
                entry.digest,
                entry.id,
                entry.depth,
                entry.kind,
                entry.size,
                entry.anchor,
                json.dumps(entry.parents),
                json.dumps(entry.sources),
                json.dumps(entry.source_kinds),
                entry.window,
                _sql_text(text),
                *((entry.digest,) if entry.depth == 0 else ()),
            ),
        )
        self._head = max(self._head, cursor.lastrowid or 0)

    def _put_source(self, source: Source, text: str) -> None:
        """Hold `text` under `source.id` (inside a write transaction, so the check that the id
        names no other text and the write are one step for every process)."""
        entry = Entry.of_source(self._secret, source, text)
        row = self._db.execute(
            "SELECT digest, CASE WHEN state = 'live' AND expires <= ? THEN 'expired' "
            "ELSE state END FROM sources WHERE id = ?",
            (time.time(), source.id),
        ).fetchone()
        if row is not None and row[0] is None:
            raise SourceIdConflictError(
                source.id,
                f"is a tombstone ({row[1]}) whose text this store cannot identify (recorded "
                "before source ids named one text, under more than one text or none kept)",
            )
        if row is not None and row[0] != entry.digest:
            raise SourceIdConflictError.taken(source.id, row[1])
        expires = time.time() + self.ttl if self.ttl else None
        self._expiry.set(source.id, _FOREVER if expires is None else expires)
        self._db.execute(
            "INSERT OR REPLACE INTO sources (id, kind, text, expires, state, digest) "
            "VALUES (?, ?, ?, ?, 'live', ?)",
            (source.id, source.kind, _sql_text(text), expires, entry.digest),
        )
        self._put_entry(entry, None)

    def put_source(self, source: Source, text: str) -> None:
        with self._lock:
            self._check_file()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                self._put_source(source, text)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                self._expiry.clear()
                raise

    def get_source(self, source_id: str) -> str | None:
        with self._lock:
            row = self._db.execute(
                "SELECT text FROM sources WHERE id = ? AND state = 'live' "
                "AND (expires IS NULL OR expires > ?)",
                (source_id, time.time()),
            ).fetchone()
        return None if row is None else _text(row[0])

    def get_sources(self, source_ids: Collection[str]) -> dict[str, str]:
        if not source_ids:
            return {}
        with self._lock:
            rows = self._db.execute(
                "SELECT s.id, s.text FROM json_each(?) AS j JOIN sources AS s ON s.id = j.value "
                "WHERE s.state = 'live' AND (s.expires IS NULL OR s.expires > ?)",
                (json.dumps(list(source_ids)), time.time()),
            ).fetchall()
        return {i: _text(t) for i, t in rows}

    def evict(self, source_id: str) -> bool:
        with self._lock:
            self._expiry.set(source_id, 0.0)
            return (
                self._db.execute(
                    "UPDATE sources SET text = NULL, state = 'evicted' WHERE id = ? "
                    "AND state = 'live' AND (expires IS NULL OR expires > ?)",
                    (source_id, time.time()),
                ).rowcount
                > 0
            )

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        """One statement brings the source rows written since the cache last looked, by any
        connection (`_caught_up`), with the ids the cache lacks; the rest is set work in C.

        No `PRAGMA data_version` first to skip it when no other connection committed: after
        a commit the PRAGMA cost as much as the scan it guarded (SQLite empties the page
        cache at the first statement either way), and with nothing changed the scan is one
        probe of the `sources_change` index, about a microsecond more than the PRAGMA."""
        if not source_ids:
            return frozenset()
        with self._lock:
            self._check_file()
            cache = self._expiry
            if len(cache) > _CACHE_MAX:
                cache.clear()
            now = time.time()
            ids, missing = cache.asked(source_ids)
            params: dict[str, Any] = {"seen": self._changes, "cap": _CHANGES_MAX}
            if missing:
                params.update(missing=json.dumps(missing), now=now)
            rows = self._db.execute(_LIVE if missing else _CHANGED, params).fetchall()
            self._caught_up(rows, ids, missing)
            return cache.held(ids, now)

    def _caught_up(self, rows: list[Any], ids: AbstractSet[str], missing: list[str]) -> bool:
        """Bring the liveness cache up to a statement's snapshot (`_CHANGED`, `_LIVE`,
        `_VIEW`): its `x` rows are the source rows written since change `_changes` (by any
        connection, in change order), and each cached id among them takes its state there;
        its `l` rows are the held ones among the ids it asked (`missing`, which were not
        cached, and for `_VIEW` the sources of the entries it found), and the rest of
        `missing` is cached as not held. Exact: a row not among the `x` rows was not written
        since the cache last looked, so what the cache holds for it stands. At
        `_CHANGES_MAX` of them there may be more: the cache is dropped, and `ids` with the
        rest asked are read again, with the highest change, in one statement of their own
        (`_ASK`: the same snapshot, so the cache is in step with it), and False is returned
        (the `x` rows were not all there were). Afterwards every one of `ids` and `missing`
        is cached (what `_Liveness.held` needs)."""
        cache = self._expiry
        changed = 0
        known = cache.known
        held: list[Any] = []
        for r in rows:
            tag = r[0]
            if tag == "x":
                changed += 1
                self._changes = max(self._changes, int(r[1]))
                source_id = _text(r[3])
                if source_id in known:  # not cached: read from the file when asked
                    expires = (_FOREVER if r[4] is None else r[4]) if r[2] == "live" else 0.0
                    cache.set(source_id, expires)
            elif tag == "l":
                held.append(r)
        if changed >= _CHANGES_MAX:
            self._ask({*ids, *missing, *(_text(r[3]) for r in held)})
            return False
        cache.not_held(missing)  # not held, unless the statement said so
        for r in held:
            cache.set(_text(r[3]), _FOREVER if r[1] is None else r[1])
        return True

    def _ask(self, ids: Collection[str]) -> None:
        """Drop the liveness cache and read `ids` into it afresh, with the highest change
        number, in one snapshot (`_ASK`)."""
        cache = self._expiry
        cache.clear()
        rows = self._db.execute(_ASK, {"ids": json.dumps(list(ids)), "now": time.time()}).fetchall()
        cache.not_held(ids)
        for r in rows:
            if r[0] == "m":
                if r[1] is not None:
                    self._changes = int(r[1])
            else:
                cache.set(_text(r[3]), _FOREVER if r[1] is None else r[1])

    def states(self, source_ids: Collection[str]) -> dict[str, State]:
        if not source_ids:
            return {}
        with self._lock:
            self._check_file()
            rows = self._db.execute(
                "SELECT s.id, CASE WHEN s.state = 'live' AND s.expires <= ? THEN 'expired' "
                "ELSE s.state END FROM json_each(?) AS j JOIN sources AS s ON s.id = j.value",
                (time.time(), json.dumps(list(source_ids))),
            ).fetchall()
        return {i: s for i, s in rows}

    def _put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        row = self._db.execute(
            f"SELECT {_ENTRY_COLUMNS} FROM entries WHERE digest = ?", (entry.digest,)
        ).fetchone()
        entry = entry.merged(None if row is None else _entry(row))
        self._put_entry(entry, text)
        self._db.execute(
            "INSERT INTO windows VALUES (?, ?) ON CONFLICT (window) "
            "DO UPDATE SET depth = max(depth, excluded.depth)",
            (entry.window, entry.depth),
        )
        if facts:
            summary = _sql_text(entry.id)
            known = {
                _text(f): json.loads(str(ids))
                for f, ids in self._db.execute(
                    "SELECT fact, sources FROM facts WHERE summary = ?", (summary,)
                )
            }
            self._db.executemany(
                "INSERT OR REPLACE INTO facts VALUES (?, ?, ?)",
                [
                    (summary, _sql_text(f), json.dumps(sorted({*known.get(f, ()), *ids})))
                    for f, ids in facts
                    if ids
                ],
            )
        return entry

    def put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        with self._lock:
            self._check_file()
            self._db.execute("BEGIN IMMEDIATE")
            try:
                entry = self._put_summary(entry, text, facts)
                self._db.execute("COMMIT")
            except BaseException:
                self._db.execute("ROLLBACK")
                raise
        return entry

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        if not digests:
            return {}
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_E_COLUMNS} "
                "FROM json_each(?) AS j JOIN entries AS e ON e.digest = j.value",
                (json.dumps(list(digests)),),
            ).fetchall()
        return {e.digest: e for e in map(_entry, rows)}

    def facts(self, summary_ids: Collection[str]) -> dict[str, list[FactRecord]]:
        if not summary_ids:
            return {}
        with self._lock:
            rows = self._db.execute(
                "SELECT f.summary, f.fact, f.sources FROM json_each(?) AS j "
                "JOIN facts AS f ON f.summary = j.value",
                (json.dumps(list(summary_ids)),),
            ).fetchall()
        out: dict[str, list[FactRecord]] = {}
        for summary, fact, ids in rows:
            out.setdefault(_text(summary), []).append((_text(fact), tuple(json.loads(ids))))
        return out

    def by_anchor(self, anchors: Collection[str]) -> list[Entry]:
        if not anchors:
            return []
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_E_COLUMNS} "
                "FROM json_each(?) AS j JOIN entries AS e ON e.anchor = j.value",
                (json.dumps(list(anchors)),),
            ).fetchall()
        return [_entry(r) for r in rows]

    def rests_on(self, summary_ids: Collection[str]) -> dict[str, frozenset[str]]:
        if not summary_ids:
            return {}
        with self._lock:
            rows = self._db.execute(
                """
                WITH RECURSIVE up (root, id) AS (
                    SELECT value, value FROM json_each(?)
                    UNION
                    SELECT up.root, p.value FROM up
                    JOIN entries AS e ON e.id = up.id AND e.depth > 0, json_each(e.parents) AS p
                )
                SELECT up.root, s.value FROM up
                JOIN entries AS e ON e.id = up.id AND e.depth > 0, json_each(e.direct) AS s
                """,
                (json.dumps(list(summary_ids)),),
            ).fetchall()
        out: dict[str, set[str]] = {s: set() for s in summary_ids}
        for root, source_id in rows:
            out[root].add(source_id)
        return {k: frozenset(v) for k, v in out.items()}

    def window_depth(self, window: str) -> int:
        with self._lock:
            row = self._db.execute(
                "SELECT depth FROM windows WHERE window = ?", (window,)
            ).fetchone()
        return 0 if row is None else int(row[0])

    def since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        with self._lock:
            version = self._db.execute("PRAGMA data_version").fetchone()[0]
            if version == self._data_version and cursor >= self._head:
                return cursor, []  # no other connection wrote, and we wrote nothing newer
            rows = self._db.execute(
                f"SELECT seq, {_E_COLUMNS}, CASE WHEN e.depth > 0 THEN e.text ELSE "
                "(SELECT s.text FROM sources AS s WHERE s.id = e.id AND s.state = 'live') END "
                "FROM entries AS e WHERE seq > ? ORDER BY seq LIMIT ?",
                (cursor, limit),
            ).fetchall()
            if len(rows) < limit:  # caught up with every commit up to `version`
                self._data_version = version
            if not rows:
                return cursor, []
            self._head = max(self._head, rows[-1][0])
        return rows[-1][0], [
            (_entry(r[1:-1]), None if r[-1] is None else _text(r[-1])) for r in rows
        ]

    def view(
        self,
        cursor: int,
        limit: int,
        digests: Collection[str],
        source_ids: Collection[str],
        window: str | None = None,
        *,
        held: Held | None = None,
    ) -> View:
        """One statement: each part of the view is a tagged row of one compound SELECT.

        Liveness comes from the cache `live` keeps, brought up to the statement's snapshot by
        the source rows written since it last looked (`_caught_up`: another connection's
        commit costs the rows it wrote, not a re-read of every id); the statement asks only
        the ids the cache lacks (so a rolling chain's k sources cost k dictionary reads, not a
        k-row join, per decision).

        Given `held` (`held.ids` all held as of an earlier view's `as_of`: its change number
        and the earliest expiry among them), the statement's scan starts at that change, so
        its rows are every source row written since, by any connection: those of `held.ids`
        among them are what may have died (nothing else of them was written, and nothing
        expired before that earliest expiry), and `held.rest` is checked as usual. Not one
        of the k ids is looked at otherwise. When the scan cannot reach back (more rows than
        it reads at once), the earliest expiry is past, or `as_of` is not this handle's,
        every id is checked.
        """
        now = time.time()
        with self._lock:
            self._check_file()
            cache = self._expiry
            if len(cache) > _CACHE_MAX:
                cache.clear()
            seen = self._changes
            known = None if held is None else self._known(held.as_of, now)
            ids: Any = source_ids  # a frozenset, or (given `held`) the region's set as it is
            if held is not None and known is not None and type(ids) in _SETS:
                seen = min(seen, known[0])  # every row written since, for `_held_since`
                missing = cache.missing(held.rest)
            else:
                known = None
                if not isinstance(ids, frozenset):
                    ids = frozenset(ids)
                # A rolling chain's k sources, all cached: one C pass, and when none is unheld
                # the region's own set is the answer (nothing k-sized made; see `_Liveness`).
                missing = cache.missing(ids)
            params: dict[str, Any] = {
                "seen": seen,
                "cap": _CHANGES_MAX,
                "cursor": cursor,
                "limit": limit,
                "window": window,
                "now": now,
            }
            if digests or missing:  # else nothing to look up: no CTE made (~half the cost)
                params.update(digests=json.dumps(list(digests)), missing=json.dumps(missing))
            rows = self._db.execute(
                _VIEW if digests or missing else _VIEW_CACHED, params
            ).fetchall()
            since = [r for r in rows if r[0] == "s"]
            if since:
                self._head = max(self._head, since[-1][1])
            if self._caught_up(rows, ids, missing) and held is not None and known is not None:
                live, until = self._held_since(rows, ids, held, known[1], now)
            else:  # (after a capped scan `_caught_up` read every one of `ids` afresh)
                live = cache.held(ids, now)
                until = cache.earliest(live)
            # The sources of the entries found, besides `ids`: as the statement read them,
            # or (after `_ask`) as the cache now holds them.
            found = {i for i in (_text(r[3]) for r in rows if r[0] == "l") if i not in ids}
            if found:
                live = frozenset(live).union(cache.held(frozenset(found), now))
                until = min(until, cache.earliest(live))
            as_of = (self._token, self._changes, until)
        entries = {e.digest: e for e in (_entry(r[2:12]) for r in rows if r[0] == "f")}
        rests_on: dict[str, set[str]] = {e.id: set() for e in entries.values() if e.depth > 0}
        for r in rows:
            if r[0] == "c":
                rests_on[_text(r[3])].add(_text(r[12]))
        depth = 0 if window is not None else None
        for r in rows:
            if r[0] == "w":
                depth = int(r[1])
        return _made(  # `View(...)`, without the frozen dataclass's `__setattr__` per field
            View,
            {
                "cursor": since[-1][1] if since else cursor,
                "since": [
                    (_entry(r[2:12]), None if r[12] is None else _text(r[12])) for r in since
                ],
                "entries": entries,
                "rests_on": {k: frozenset(v) for k, v in rests_on.items()},
                "live": live,
                "depth": depth,
                "as_of": as_of,
            },
        )

    def _known(self, as_of: object, now: float) -> tuple[int, float] | None:
        """(change number, earliest expiry) of a `View.as_of` this handle gave, if it still
        tells what may have died: not once that expiry is reached (an id not written since
        may have expired). None otherwise: then every id is checked."""
        if type(as_of) is not tuple or len(as_of) != 3 or as_of[0] is not self._token:
            return None
        _, change, until = as_of
        return (change, until) if now < until else None

    def _held_since(
        self, rows: list[Any], ids: AbstractSet[str], held: Held, until: float, now: float
    ) -> tuple[frozenset[str], float]:
        """Those of `ids` held at `now`, and the earliest expiry among them, when every one
        of `held.ids` was held at the change the statement's scan started from, none of them
        expiring before `until`: the `x` rows (every source row written since) say which of
        them died or were held again, and `held.rest` is read from the cache (`_caught_up`
        cached every one of it)."""
        dead: set[str] = set()
        for r in rows:
            if r[0] == "x":
                source_id = _text(r[3])
                if source_id in held.ids:
                    expires = _FOREVER if r[4] is None else r[4]
                    if r[2] != "live" or expires <= now:
                        dead.add(source_id)
                    elif expires < until:
                        until = expires
        if held.rest:
            cache = self._expiry
            rest = cache.held(held.rest, now)
            dead.update(held.rest - rest)
            until = min(until, cache.earliest(rest))
        if not dead:  # (the region's set as given: nothing made)
            return ids, until  # type: ignore[return-value]
        return frozenset(i for i in ids if i not in dead), until

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, kind, text FROM sources WHERE state = 'live' "
                "AND (expires IS NULL OR expires > ?) ORDER BY rowid DESC LIMIT ?",
                (time.time(), limit),
            ).fetchall()
        return [(Source(i, k), _text(t)) for i, k, t in reversed(rows)]

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        with self._lock:
            rows = self._db.execute(
                f"SELECT {_ENTRY_COLUMNS}, text FROM entries WHERE window = ? AND depth > 0 "
                "ORDER BY seq DESC LIMIT ?",
                (window, limit),
            ).fetchall()
        held = [(_entry(r[:-1]), _text(r[-1])) for r in reversed(rows)]
        closures = self.rests_on([e.id for e, _ in held])
        return [(e.region(closures[e.id]), t) for e, t in held]


#: The source rows written since change `:seen`, oldest first (at most `:cap`: at `:cap`
#: there may be more), as rows (x, change, state, source id, expiry), for
#: `SQLiteStore._caught_up`: found by the `sources_change` index, so a cache in step with the
#: file costs one index probe. Nothing else is read, so right after another connection's
#: commit (which empties SQLite's page cache) a lookup reads page 1 and that index's few pages.
_X = """SELECT 'x', change, state, id, expires FROM sources WHERE change > :seen
ORDER BY change LIMIT :cap"""
_CHANGED = _X
#: `_HELD` rows (l, expiry, NULL, source id, NULL): the held ones among the ids of `ask`.
_HELD = """SELECT 'l', s.expires, NULL, s.id, NULL FROM ask JOIN sources AS s ON s.id = ask.id
WHERE s.state = 'live' AND (s.expires IS NULL OR s.expires > :now)"""
#: `SQLiteStore.live` when the cache lacks some of the ids asked (`:missing`).
_LIVE = f"""WITH ask (id) AS (SELECT value FROM json_each(:missing))
SELECT * FROM ({_X})
UNION ALL
{_HELD}"""
#: `SQLiteStore._ask`: the highest change number (m) and the held ones among `:ids`, in one
#: snapshot.
_ASK = f"""WITH ask (id) AS (SELECT value FROM json_each(:ids))
SELECT 'm', max(change), NULL, NULL, NULL FROM sources
UNION ALL
{_HELD}"""

#: `SQLiteStore.view` when there is nothing to look up (no digests, every id cached): the
#: s, x and w rows of `_VIEW` only (its CTEs cost about as much again, empty).
_VIEW_CACHED = f"""
SELECT * FROM (
    SELECT 's', e.seq, {_E_COLUMNS}, CASE WHEN e.depth > 0 THEN e.text ELSE
        (SELECT s.text FROM sources AS s WHERE s.id = e.id AND s.state = 'live') END
    FROM entries AS e WHERE e.seq > :cursor ORDER BY e.seq LIMIT :limit)
UNION ALL
SELECT *, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL FROM ({_X})
UNION ALL
SELECT 'w', depth, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM windows WHERE window = :window"""
#: `SQLiteStore.view`: rows (tag, seq or depth, the entry's columns, text or source id), tagged
#: s (since, in order), f (found by digest), c (a found summary's root id and one of its sources,
#: transitively), l (a held source id among those the cache lacks and the sources found, its
#: expiry in the second column), x as in `_X` (change, state, id, expiry in columns 2-5), and
#: w (the window's depth).
_VIEW = f"""
WITH RECURSIVE
found AS (
    SELECT e.* FROM json_each(:digests) AS j JOIN entries AS e ON e.digest = j.value),
up (root, id) AS (
    SELECT id, id FROM found WHERE depth > 0
    UNION
    SELECT up.root, p.value FROM up
    JOIN entries AS e ON e.id = up.id AND e.depth > 0, json_each(e.parents) AS p),
closure (root, source) AS (
    SELECT up.root, d.value FROM up
    JOIN entries AS e ON e.id = up.id AND e.depth > 0, json_each(e.direct) AS d),
ask (id) AS (
    SELECT value FROM json_each(:missing)
    UNION SELECT source FROM closure
    UNION SELECT id FROM found WHERE depth = 0)
{_VIEW_CACHED}
UNION ALL
SELECT 'f', e.seq, {_E_COLUMNS}, NULL FROM found AS e
UNION ALL
SELECT 'c', NULL, NULL, root, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, source FROM closure
UNION ALL
SELECT 'l', s.expires, NULL, s.id, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL, NULL
FROM ask JOIN sources AS s ON s.id = ask.id
WHERE s.state = 'live' AND (s.expires IS NULL OR s.expires > :now)
"""


def _wal(db: sqlite3.Connection, timeout: float = 5.0) -> None:
    """Switch to WAL, waiting out other processes opening the same file at the same moment.

    Changing the journal mode reports "database is locked" at once, without the busy handler,
    while another connection is switching or creating the file: a fleet of workers starting
    together would crash on it.
    """
    deadline = time.monotonic() + timeout
    while True:
        try:
            db.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(0.01)


def _sqlite_options(url: str, query: str, given: dict[str, Any]) -> dict[str, Any]:
    """SQLiteStore's options from a `sqlite:` URL's query; anything else there is a clear error
    (a misspelt `synchronus=FULL` silently ignored would leave commits a power loss takes back).
    """
    options: dict[str, Any] = {}
    for field in query.split("&") if query else ():
        name, equals, value = field.partition("=")
        if not equals or not value:
            raise ValueError(f"store URL {url!r}: {field!r} is not name=value")
        if name in options or name in given:
            raise ValueError(f"store URL {url!r}: {name!r} is given twice")
        if name == "synchronous":
            options[name] = value.upper()  # (SQLite's pragma words are case-insensitive)
        elif name == "ttl":
            try:
                options[name] = float(value)
            except ValueError:
                raise ValueError(f"store URL {url!r}: ttl must be seconds: {value!r}") from None
        else:
            raise ValueError(
                f"store URL {url!r}: unknown option {name!r} (a sqlite: URL takes synchronous "
                "and ttl)"
            )
    return options


def open_store(url: str, **options: Any) -> Store:
    """A store from a URL, for settings and command lines (`policyhook demo --store URL`).

    `postgresql://...` or `postgres://...`: PostgresStore; `redis://`, `rediss://`, `unix://`:
    RedisStore; `sqlite:///abs/path.db` or `sqlite:rel/path.db`: SQLiteStore; `memory:`:
    MemoryStore. `options` go to the store's constructor (ttl, timeout, schema, namespace...).
    A `sqlite:` URL may carry SQLiteStore's own in its query (`?synchronous=FULL&ttl=86400`), for
    places that take a URL only (`$POLICYHOOK_STORE`, `--store`).
    """
    scheme = url.partition(":")[0].lower()
    if scheme in ("postgresql", "postgres"):
        from policyhook._postgres import PostgresStore

        return PostgresStore(url, **options)
    if scheme in ("redis", "rediss", "unix"):
        from policyhook._redis import RedisStore

        return RedisStore(url, **options)
    if scheme == "sqlite":
        path, _, query = url.partition(":")[2].partition("?")
        options = {**_sqlite_options(url, query, options), **options}
        return SQLiteStore(path[2:] if path.startswith("//") else path, **options)
    if url == "memory:":
        return MemoryStore(**options)
    raise ValueError(
        f"unknown store URL {url!r}: expected postgresql://..., redis://..., "
        "sqlite:///path/to/file.db or memory:"
    )
