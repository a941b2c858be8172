"""Property: whatever the caches forget, a summary whose sources are gone is never re-summarized.

A hypothesis state machine records sources, runs granted summaries (whose outputs quote, repeat
or contain known texts, short and long, with the whitespace an LLM adds), evicts sources or lets
them expire (a store `ttl`, on the machine's clock), starts new guards on the same store (a
restart, a second process) and decides, on guards with tiny cache bounds (`max_texts`,
`max_windows`) over bounded MemoryStores (`max_sources`, `max_tombstones`) and SQLite files,
and, in two machines of their own, PostgreSQL and Redis (real servers). A from-scratch oracle
says what each text rests on, by the rules of docs/inputs.md and docs/provenance.md (whole
units, stripped; known texts of 16 bytes or more inside longer ones, leftmost and longest first;
quoting texts keep what they quote; a dead source's content is what of it is not a known text
found inside it), with the store's `get_source` as the truth of liveness. At every decision:
what the oracle says rests on a dead source at depth > 0 is refused, and the guard's depth is
never below the oracle's.

Texts hold no digits, so the default policy's output check (grounded numbers) has nothing to
refuse. Fixed budgets, derandomized: CI stays bounded.
"""

from __future__ import annotations

import contextlib
import itertools
import random
import string
import tempfile
import threading
import time
import types
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, ClassVar, TypeVar
from unittest import mock

import deep
import pytest
from hypothesis import HealthCheck, event, given
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)
from outage import STORE_METHODS, one_fault, raised, store_down

import policyhook
from policyhook import Guard, MemoryStore, Region, SQLiteStore, Store, UnsafeRecompactionError
from policyhook._provenance import Entry, View
from policyhook.stores import State
from policyhook.testing import capture_decisions

#: Bytes under which a known text is recognised only as a whole unit (docs/inputs.md).
EMBEDDED = 16
WORDS = ["retry", "ceiling", "deploy", "window", "billing", "backoff", "jitter", "ok", "the"]
SPACES = ["", " ", "\n", "  \n", "\t", "\r\n"]
#: Seconds a source is held for, in the machines whose store expires sources.
TTL = 8.0
#: Names of the server stores' schemas and key namespaces: one per example.
_NAMESPACES = itertools.count()
T = TypeVar("T")


class ShuffledStore(MemoryStore):
    """A MemoryStore answering in another order on every call, where the protocol sets none:
    the dicts, sets and lists a server returns in the order its rows lie on disk (PostgreSQL's
    `= ANY(...)`, which a vacuum changes). Which order comes back must decide nothing. The
    orders come from `seed` (drawn), so an example replays."""

    def __init__(self, seed: bytes, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._orders = random.Random(seed)

    def _mixed(self, items: Iterable[T]) -> list[T]:
        mixed = list(items)
        self._orders.shuffle(mixed)
        return mixed

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        return dict(self._mixed(super().lookup(digests).items()))

    def by_anchor(self, anchors: Collection[str]) -> list[Entry]:
        return self._mixed(super().by_anchor(anchors))

    def rests_on(self, summary_ids: Collection[str]) -> dict[str, frozenset[str]]:
        found = super().rests_on(summary_ids).items()
        return {s: frozenset(self._mixed(ids)) for s, ids in self._mixed(found)}

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        return frozenset(self._mixed(super().live(source_ids)))

    def get_sources(self, source_ids: Collection[str]) -> dict[str, str]:
        return dict(self._mixed(super().get_sources(source_ids).items()))

    def states(self, source_ids: Collection[str]) -> dict[str, State]:
        return dict(self._mixed(super().states(source_ids).items()))

    def view(self, *args: Any, **kwargs: Any) -> View:  # (passed on: `held` is still given)
        view = super().view(*args, **kwargs)
        return replace(
            view,
            entries=dict(self._mixed(view.entries.items())),
            rests_on={s: frozenset(self._mixed(i)) for s, i in self._mixed(view.rests_on.items())},
            live=frozenset(self._mixed(view.live)),
        )


# Its view is MemoryStore's own (`as_of` and `Held` included), shuffled after: not the one
# made of the reads a subclass overrides.
ShuffledStore._heard = False


def encode(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


@dataclass
class Known:
    """What the oracle says one known text rests on."""

    depth: int
    sources: set[str] = field(default_factory=set)  # source ids
    gaps: set[str] = field(default_factory=set)  # unregistered content it was made from


@dataclass
class Found:
    """What the oracle says one input rests on."""

    depth: int = 0
    sources: set[str] = field(default_factory=set)
    gaps: set[str] = field(default_factory=set)  # of this input, and of the summaries in it


class Oracle:
    """What each text rests on, computed from scratch by the documented rules.

    `held(source_id)` is the truth of liveness. A registered text whose sources are all gone
    counts as unregistered content where it appears: the ledger may no longer know its text (an
    evicted source's text is not kept), and either way it rests on nothing held, unless the
    guard archives it again (`archive_originals`).
    """

    def __init__(self, held: Callable[[str], bool] = lambda source_id: True) -> None:
        self.known: dict[str, Known] = {}
        self.held = held
        self.shared: set[str] = set()  # ids of texts held under more than one id
        #: The ids each text was registered under (its own, or archived): a text held under
        #: two ids is held while one of them is, a summary's text since too.
        self.registered: dict[str, set[str]] = {}
        #: Where each gap was found: (the unit's bytes, the gap's byte offset in it). The guard
        #: archives a unit's unrecognised content in pieces around the known texts it holds,
        #: which need not be the oracle's pieces (`covered`).
        self.places: dict[str, set[tuple[bytes, int]]] = {}

    def unit(
        self, unit: str, into: Found, wrapped: bool = False, recording: bool = False
    ) -> list[str]:
        """Add what one unit rests on to `into`; returns its gaps (unrecognised content).
        `wrapped` (a Region's text): a source whose ids are all dead is unknown text there, so
        it hides nothing it holds (a known text inside it is found). `recording` (a text being
        recorded as a source): so is every source, live or not (the text holds it verbatim)."""
        if not unit.strip():
            return []
        data = encode(unit)
        for whole in (unit, unit.strip()):
            if whole in self.known and not self._unknown(whole, wrapped, recording):
                if self._dead(whole):  # a dead source hides nothing it holds: found below
                    continue  # as one inside a longer unit is (the texts inside it found)
                own = self._add(whole, into)
                for gap in own:
                    self._place(gap, data, data.find(encode(whole)))
                return own
        hits: list[tuple[int, int, str]] = []
        for text in self.known:
            needle = encode(text)
            if len(needle) < EMBEDDED or self._unknown(text, wrapped, recording):
                continue
            at = data.find(needle)
            while at != -1:
                hits.append((at, at + len(needle), text))
                at = data.find(needle, at + 1)
        hits.sort(key=lambda h: (h[0], h[0] - h[1]))
        # A dead source holding nothing of its own, every byte of it but whitespace inside
        # another known text found here, is as if it were not found (docs/inputs.md).
        covered = {
            i for start, end, text in hits if not self._dead(text) for i in range(start, end)
        }
        hits = [
            (start, end, text)
            for start, end, text in hits
            if not self._dead(text)
            or any(
                run.decode("utf-8", "surrogatepass").strip()
                for run in self._uncovered(data, start, end, covered)
            )
        ]
        cursor = 0
        placed: list[tuple[str, int]] = []
        # A dead source hides nothing it holds (docs/inputs.md): the known texts inside it are
        # found, and its content is the rest of it, as a guard that cannot find it sees it:
        # [start, end, spans of the texts found inside it that rest on something held].
        dead: list[tuple[int, int, list[tuple[int, int]]]] = []
        inside = within = 0  # the span of the last dead source found, and a cursor in it
        shadow = 0  # the furthest end of a held source running past the last text found

        def unfound(start: int, end: int) -> tuple[str, int]:
            """Bytes `start:end` but those a held source's end covers (its own)."""
            start = max(start, min(shadow, end))
            return data[start:end].decode("utf-8", "surrogatepass"), start

        for start, end, text in hits:
            if start >= cursor:
                placed.append(unfound(cursor, start))
                if self._dead(text):
                    dead.append((start, end, []))
                    inside, within = end, start
                else:
                    placed += [(gap, start) for gap in self._add(text, into)]
                cursor = end
            elif end > cursor:  # overlapping the end of the last one found: rests on it too,
                own = self._add(text, into)  # its end its own
                placed += [(gap, start) for gap in own]
                if self.known[text].depth > 0:
                    cursor = end
                elif not own:  # a held source's end is searched on, and is its own where
                    shadow = max(shadow, end)  # no text found there covers it
            elif within <= start < inside:  # inside a dead source: found as if it were unknown
                if not self._add(text, into):
                    dead[-1][2].append((start, end))
                within = end
        for start, end, found in dead:
            for found_start, found_end in found:
                placed.append((data[start:found_start].decode("utf-8", "surrogatepass"), start))
                start = found_end
            placed.append((data[start:end].decode("utf-8", "surrogatepass"), start))
        placed.append(unfound(cursor, len(data)))
        kept = [gap for gap, _ in placed if gap.strip()]
        for gap, at in placed:
            if gap.strip():
                self._place(gap, data, at)
        into.gaps.update(kept)
        return kept

    @staticmethod
    def _uncovered(data: bytes, start: int, end: int, covered: set[int]) -> list[bytes]:
        """The runs of bytes `start:end` of `data` not in `covered`."""
        runs: list[bytes] = []
        run = bytearray()
        for i in range(start, end):
            if i in covered:
                runs.append(bytes(run))
                run.clear()
            else:
                run.append(data[i])
        return [*runs, bytes(run)]

    def _dead(self, text: str) -> bool:
        """Whether a known text is a source held under none of its ids."""
        known = self.known[text]
        return known.depth == 0 and not any(map(self.held, known.sources))

    def _unknown(self, text: str, wrapped: bool, recording: bool) -> bool:
        """Whether a known text counts as unknown text where it lies (see `unit`)."""
        known = self.known[text]
        if known.depth > 0:
            return False
        return recording or (wrapped and not any(map(self.held, known.sources)))

    def text_held(self, source_id: str) -> bool:
        """Whether the text `source_id` names is held: under it, or, for a text held under
        more than one id (`shared`), under another (the same content, as retrievable)."""
        if self.held(source_id):
            return True
        if source_id not in self.shared:
            return False
        return any(
            source_id in ids and any(map(self.held, ids)) for ids in self.registered.values()
        )

    def _place(self, gap: str, data: bytes, at: int) -> None:
        self.places.setdefault(gap, set()).add((data, at))

    def covered(self, gap: str, held: list[str]) -> bool:
        """Whether the store holds `gap`'s content: inside one held text, or, where it was
        found, every byte of it but whitespace inside held texts found around it (a dead text
        archived again in pieces around a live one it quotes)."""
        if any(gap in text for text in held):
            return True
        needles = [encode(text) for text in held if text.strip()]
        size = len(encode(gap))
        for data, at in self.places.get(gap, ()):
            inside = bytearray(len(data))
            for needle in needles:
                start = data.find(needle)
                while start != -1:
                    inside[start : start + len(needle)] = b"\x01" * len(needle)
                    start = data.find(needle, start + 1)
            if all(inside[i] or data[i : i + 1].isspace() for i in range(at, at + size)):
                return True
        return False

    def _add(self, text: str, into: Found) -> list[str]:
        """Add what a known text rests on to `into`; [text] if it counts as a gap instead."""
        known = self.known[text]
        if known.depth == 0:  # evidence: held under any of its ids is enough
            held = {s for s in known.sources if self.held(s)}
            if not held:
                into.gaps.add(text)
                return [text]
            into.sources |= held
            return []
        into.depth = max(into.depth, known.depth)
        into.sources |= known.sources
        into.gaps |= known.gaps
        return []

    def value(self, units: list[str]) -> Found:
        found = Found()
        for unit in units:
            self.unit(unit, found)
        return found

    def record_source(self, text: str, source_id: str) -> None:
        self.registered.setdefault(text, set()).add(source_id)
        earlier = self.known.get(text)
        if earlier is not None and earlier.depth > 0:  # a summary's own text stays that summary
            earlier.sources.add(source_id)
            return
        if earlier is not None and earlier.depth == 0:  # held under one more id: the store
            self.shared |= earlier.sources | {source_id}  # finds it under any it still holds
            earlier.sources.add(source_id)
            return
        for whole in (text, text.strip()):  # a known source's text: evidence, whatever it holds
            if (known := self.known.get(whole)) is not None and known.depth == 0:
                self.known[text] = Known(0, {source_id})
                return
        found = Found()
        own = self.unit(text, found, recording=True)
        if found.depth == 0:
            self.known[text] = Known(0, {source_id})
        else:  # quoting summaries: their provenance, and the new source (holding the gaps)
            self.known[text] = Known(
                found.depth, found.sources | {source_id}, found.gaps - set(own)
            )

    def archived(self, text: str, source_id: str) -> None:
        """Unregistered content the guard stored as a source (`archive_originals`)."""
        known = self.known.setdefault(text, Known(0))
        if known.depth == 0 and source_id not in known.sources:
            self.registered.setdefault(text, set()).add(source_id)
            if known.sources:  # held under two ids: the guard finds it under the later one
                self.shared |= known.sources | {source_id}
            known.sources.add(source_id)

    def record_summary(self, text: str, of: Found) -> None:
        made = Known(of.depth + 1, set(of.sources), set(of.gaps))
        earlier = self.known.get(text)
        if earlier is not None and earlier.depth > 0:  # recorded again: provenance only grows
            made.depth = max(made.depth, earlier.depth)
            made.sources |= earlier.sources
            made.gaps |= earlier.gaps
        self.known[text] = made


def fresh_words(n: int) -> str:
    """A letters-only tag no other text holds (so texts meet only where a rule puts them)."""
    tag = ""
    n += 1
    while n:
        n, r = divmod(n - 1, 26)
        tag = string.ascii_lowercase[r] + tag
    return f"zq{tag}x"


class Provenance(RuleBasedStateMachine):
    """Sources, summaries, evictions and restarts on small caches, against the oracle."""

    def __init__(self) -> None:
        super().__init__()
        self.oracle = Oracle(lambda source_id: self.stores[0].get_source(source_id) is not None)
        self.counter = itertools.count()
        self.source_ids: list[str] = []
        #: The least depth each window's deepest summary has: a granted call's output is at
        #: least one deeper than what the oracle found its input to be.
        self.window_depths: dict[str, int] = {}
        self.guards: list[Guard] = []
        self.reopen: Callable[[], Store] | None = None  # another handle on the store
        self.stores: list[Store] = []
        self.tmp = tempfile.TemporaryDirectory()
        self.now = 1_000_000.0
        clock = types.SimpleNamespace(
            time=lambda: self.now, monotonic=lambda: self.now, sleep=time.sleep
        )
        self.clock = mock.patch("policyhook.stores.time", clock)

    # -- set-up ---------------------------------------------------------------------------------

    #: The stores a run draws from ("postgres" and "redis", servers at `url`, in the machines
    #: of their own: `ProvenanceOnPostgres`, `ProvenanceOnRedis`).
    KINDS: ClassVar[tuple[str, ...]] = ("memory", "bounded", "shuffled", "sqlite")
    #: A server's URL (set by the test that starts it).
    url: ClassVar[str] = ""

    @initialize(
        data=st.data(),
        max_texts=st.sampled_from([1, 2, 3, 8, 65_536]),
        max_windows=st.sampled_from([1, 2]),
        max_sources=st.integers(2, 8),
        max_tombstones=st.integers(0, 3),
        archive=st.booleans(),
        ttl=st.sampled_from([None, TTL]),
        key=st.binary(min_size=32, max_size=32),
    )
    def setup(
        self,
        data: st.DataObject,
        max_texts: int,
        max_windows: int,
        max_sources: int,
        max_tombstones: int,
        archive: bool,
        ttl: float | None,
        key: bytes,
    ) -> None:
        kind = data.draw(st.sampled_from(self.KINDS))
        self.kind = kind
        self.max_texts, self.max_windows, self.archive = max_texts, max_windows, archive
        # The stores' clock is the machine's (`expire`): sources put with a `ttl` expire when
        # a rule says, and every decision of a step sees the same time. A server expires them
        # on its own clock: no `ttl` there.
        self.ttl = ttl = None if kind in ("postgres", "redis") else ttl
        self.clock.start()
        path = Path(self.tmp.name) / "store.sqlite"
        namespace = f"provenance{next(_NAMESPACES)}"

        def opened() -> Store:
            """The store, or another handle on it (another process's)."""
            if kind == "sqlite":
                return SQLiteStore(path, ttl=ttl)
            if kind == "postgres":
                from policyhook._postgres import PostgresStore

                return PostgresStore(self.url, schema=namespace)
            if kind == "redis":
                from policyhook._redis import RedisStore

                return RedisStore(self.url, namespace=namespace)
            if kind == "bounded":
                return MemoryStore(max_sources=max_sources, max_tombstones=max_tombstones, ttl=ttl)
            if kind == "shuffled":
                bounds = {"max_sources": max_sources, "max_tombstones": max_tombstones}
                return ShuffledStore(key, **bounds, ttl=ttl)
            return MemoryStore(ttl=ttl)

        # The store's secret key drawn, not random: every digest, id and order made from it is
        # then part of the example, so a failure replays and shrinks (with a key new on every
        # run, the same steps may take another path: at 4x its steps the machine once reported
        # Hypothesis's FlakyStrategyDefinition instead of a failure).
        with mock.patch("os.urandom", lambda size: key[:size]):
            store = opened()
        self.reopen = None if isinstance(store, MemoryStore) else opened
        self.stores = [store]
        self.guards = [self.new(store)]

    def new(self, store: Store) -> Guard:
        return Guard(
            store=store,
            max_texts=self.max_texts,
            max_windows=self.max_windows,
            archive_originals=self.archive,
        )

    def teardown(self) -> None:
        for guard in self.guards:
            guard.close()
        for store in self.stores:
            close = getattr(store, "close", None)  # (a MemoryStore holds nothing to close)
            if close is not None:
                close()
        self.tmp.cleanup()
        if self.stores:  # (set up: the clock was started)
            self.clock.stop()

    # -- what inputs and outputs are made of ----------------------------------------------------

    def text(self, data: st.DataObject, *, short: bool = False) -> str:
        """A new text: a fresh tag with words, sometimes short, sometimes quoting known texts."""
        tag = fresh_words(next(self.counter))
        if short or data.draw(st.integers(0, 5)) == 0:
            return f"{tag} ok"[: data.draw(st.integers(4, 15))]
        words = " ".join(data.draw(st.lists(st.sampled_from(WORDS), min_size=2, max_size=6)))
        text = f"{tag} {words}"
        if bool(self.oracle.known) and data.draw(st.booleans()):
            quoted = data.draw(st.sampled_from(sorted(self.oracle.known)))
            text = data.draw(
                st.sampled_from([f"{text} {quoted}", f"{quoted}\n{text}", f"{text}{quoted}"])
            )
        return text

    def piece(self, data: st.DataObject) -> str:
        if self.oracle.known and data.draw(st.integers(0, 3)) > 0:
            text = data.draw(st.sampled_from(sorted(self.oracle.known)))
            choice = data.draw(st.integers(0, 4))
            if choice == 0 and len(text) > 8:  # a part of it: a text split across units
                cut = data.draw(st.integers(1, len(text) - 1))
                return data.draw(st.sampled_from([text[:cut], text[cut:]]))
            if choice == 1:  # with the whitespace an LLM or a transcript adds
                return (
                    data.draw(st.sampled_from(SPACES)) + text + data.draw(st.sampled_from(SPACES))
                )
            return text
        return self.text(data)

    def units(self, data: st.DataObject) -> list[str]:
        units = []
        for _ in range(data.draw(st.integers(1, 3))):
            pieces = [self.piece(data) for _ in range(data.draw(st.integers(1, 3)))]
            units.append(data.draw(st.sampled_from([" ", "\n", ""])).join(pieces))
        return units

    def guard(self, data: st.DataObject) -> Guard:
        return self.guards[data.draw(st.integers(0, len(self.guards) - 1))]

    # -- the property ---------------------------------------------------------------------------

    def live(self, found: Found) -> bool:
        """Every source the oracle says `found` rests on is held now (the store is the truth)."""
        store = self.stores[0]
        if not all(map(self.oracle.text_held, found.sources)):
            return False
        if not found.gaps:
            return True
        if not self.archive:
            return False
        held = [text for _, text in store.sources(1_000_000)]  # archived: the gaps, or more
        return all(self.oracle.covered(gap, held) for gap in found.gaps)

    def must_refuse(self, found: Found) -> bool:
        return found.depth > 0 and not self.live(found)

    def value(self, units: list[str], wrapped: list[bool]) -> tuple[list[str | Region], Found]:
        """`units` as a guard is given them, those marked in `wrapped` handed over as
        `Region.original(unit)`, and what the oracle finds them made of."""
        value: list[str | Region] = []
        found = Found()
        for unit, wrap in zip(units, wrapped, strict=True):
            value.append(Region.original(unit) if wrap else unit)
            own = self.oracle.unit(unit, found, wrap)
            if wrap:  # (a Region's own unrecognised content is declared content, not a gap)
                found.gaps -= set(own)
        return value, found

    def decide(
        self, guard: Guard, units: list[str], window: str, wrapped: list[bool] | None = None
    ) -> None:
        """Decide on `units`, those marked in `wrapped` handed over as `Region.original(unit)`
        (a framework's seam): what is known of a Region's text counts as of any unit; its own
        unrecognised content is the caller's declared content, not a gap."""
        wrapped = wrapped or [False] * len(units)
        value, found = self.value(units, wrapped)
        with (
            policyhook.request(window=window),
            capture_decisions(guard) as seen,
            self.watching() as errors,
        ):
            region = guard.provenance(value)
            decision = guard.check(value, summarizer="property")
        assert region.depth >= found.depth, (units, region, found)
        # What the cache held decides nothing: a guard that never saw a text (a restart) decides
        # as this one, whose caches of 1-8 texts may still hold an evicted one's (inside a
        # Region's text too, where a dead source is the caller's declared content either way).
        restarted = Guard(guard.policies, store=self.stores[0], archive_originals=self.archive)
        with policyhook.request(window=window), self.watching() as their_errors:
            theirs = restarted.check(value, summarizer="property")
        restarted.close()
        # (unless a server failed on its own, a timeout under load, and that guard refused on it)
        failed = (decision.effect == "deny" and errors) or (
            theirs.effect == "deny" and their_errors
        )
        if failed:
            event(f"a server failed on its own: {(errors or their_errors)[0].split(':')[0]}")
        assert theirs.effect == decision.effect or failed, (
            "the cache decided",
            units,
            wrapped,
            decision,
            theirs,
        )
        # A window ceiling sees the region and every summary granted in the window before.
        deepest = seen[-1][1]["window"]["max_depth"]
        assert deepest >= max(region.depth, self.window_depths.get(window, 0)), (window, units)
        held = {s for s in found.sources - self.oracle.shared if self.oracle.held(s)}
        assert held <= region.sources, ("a live source not found", units, region, found)
        if self.must_refuse(found):
            assert decision.effect == "deny", (units, region, found)

    def watching(self) -> contextlib.AbstractContextManager[list[str]]:
        """What the store's calls raise (`raised`), on a server, which can fail on its own. An
        in-process store is left as it is: wrapped, its view would be made of the wrapped
        reads, not its own (`MemoryStore.view`), and the decisions checked would not be."""
        if self.kind in ("postgres", "redis"):
            return raised(self.stores)
        none: list[str] = []
        return contextlib.nullcontext(none)

    # -- rules ----------------------------------------------------------------------------------

    @rule(data=st.data(), kind=st.sampled_from(["config_read", "tool_output", "ai_turn"]))
    def record_source(self, data: st.DataObject, kind: str) -> None:
        """Register a new text (maybe quoting known ones), or a known text again."""
        if self.oracle.known and data.draw(st.integers(0, 4)) == 0:
            text = data.draw(st.sampled_from(sorted(self.oracle.known)))
        else:
            text = self.text(data)
        source_id = f"src-{next(self.counter)}"
        guard = self.guard(data)
        with policyhook.request(window=data.draw(st.sampled_from(["w1", "w2"]))):
            guard.record_source(text, kind, source_id)
        self.oracle.record_source(text, source_id)
        self.source_ids.append(source_id)

    @rule(data=st.data(), window=st.sampled_from(["w1", "w2", "w3"]))
    def summarize(self, data: st.DataObject, window: str) -> None:
        """A guarded call: refused when the oracle says it must be; its output recorded."""
        self._summarize(data, window, contextlib.nullcontext)

    @rule(data=st.data(), window=st.sampled_from(["w1", "w2", "w3"]), at=st.integers(0, 16))
    def summarize_while_the_store_fails(self, data: st.DataObject, window: str, at: int) -> None:
        """The same with the store failing during the call (every handle): some of its methods
        (`at` 0), or its `at`-th call. Refused, or granted with the output returned whole and
        known as a summary from then on (written when the store answers again: the next
        decision of that guard owes it first)."""
        failing = () if at else data.draw(st.sets(st.sampled_from(STORE_METHODS)))
        self._summarize(data, window, lambda: self.faults(failing, at))

    def faults(self, failing: Collection[str], at: int) -> contextlib.ExitStack:
        """The methods of `failing` failing on every store handle, or the `at`-th store call."""
        stack = contextlib.ExitStack()
        if at:
            stack.enter_context(one_fault(self.stores, at))
        for store in self.stores:
            stack.enter_context(store_down(store, failing))
        return stack

    def _summarize(
        self,
        data: st.DataObject,
        window: str,
        outage: Callable[[], contextlib.AbstractContextManager[object]],
    ) -> None:
        units = self.units(data)
        found = self.oracle.value(units)
        choice = data.draw(st.integers(0, 5))
        if choice == 0 and self.oracle.known:  # the same output as an earlier call
            output = data.draw(st.sampled_from(sorted(self.oracle.known)))
        elif choice == 1:  # a summary that contains a part of its input verbatim
            output = f"{fresh_words(next(self.counter))} says {units[0]}"
        elif choice == 5:  # ... or starts with it
            output = f"{units[0].strip()} so {fresh_words(next(self.counter))}"
        else:
            output = self.text(data, short=choice == 2)
        written = output + data.draw(st.sampled_from(["", "\n", " \n"]))
        guard = self.guard(data)
        summarize = guard(lambda value: written, summarizer="property")
        try:
            with policyhook.request(window=window), outage():
                got = summarize(units)
        except UnsafeRecompactionError:
            return
        finally:  # what the store could not take, written now as that guard's next read would
            # (docs/reliability.md): until then, no other guard knows the output
            assert guard.ledger.write_unwritten() == 0
        assert not self.must_refuse(found), ("granted", units, found)
        assert got == written
        if output.strip():
            self.oracle.record_summary(output.strip(), found)
            deeper = max(self.window_depths.get(window, 0), found.depth + 1)
            self.window_depths[window] = deeper
        if self.archive:  # what the guard archived is registered evidence from now on
            for source, text in self.stores[0].sources(1_000_000):
                if source.kind == "window":
                    self.oracle.archived(text, source.id)

    @precondition(
        lambda self: any(k.depth > 0 and len(k.sources) > 1 for k in self.oracle.known.values())
    )
    @rule(data=st.data(), window=st.sampled_from(["w1", "w2"]))
    def summarize_again_from_less(self, data: st.DataObject, window: str) -> None:
        """A summarizer gives a known summary's text again for an input resting on only part of
        its sources (a retry, a cached model answer); one of its other sources then goes: the
        summary still rests on it, so it must be refused."""
        known = self.oracle.known
        text = data.draw(
            st.sampled_from(
                sorted(t for t, k in known.items() if k.depth > 0 and len(k.sources) > 1)
            )
        )
        sources = known[text].sources
        originals = sorted(
            t for t, k in known.items() if k.depth == 0 and k.sources and k.sources < sources
        )
        if not originals:
            return
        original = data.draw(st.sampled_from(originals))
        found = self.oracle.value([original])
        guard = self.guard(data)
        try:
            with policyhook.request(window=window):
                guard(lambda value: text, summarizer="property")([original])
        except UnsafeRecompactionError:
            return
        assert not self.must_refuse(found), ("granted", original, found)
        self.oracle.record_summary(text, found)
        others = sorted(known[text].sources - known[original].sources)
        self.stores[0].evict(data.draw(st.sampled_from(others)))
        self.decide(self.guard(data), [text], window)

    @precondition(lambda self: self.source_ids)
    @rule(data=st.data())
    def evict(self, data: st.DataObject) -> None:
        self.stores[0].evict(data.draw(st.sampled_from(self.source_ids)))

    @precondition(lambda self: self.ttl is not None)
    @rule(seconds=st.sampled_from([TTL / 4, TTL / 2, TTL]))
    def expire(self, seconds: float) -> None:
        """Time passes: the sources put `ttl` ago or more expire (each put or archive restarts
        its id's time), in every store handle and guard at once."""
        self.now += seconds

    @rule(data=st.data())
    def check(self, data: st.DataObject) -> None:
        self.decide(self.guard(data), self.units(data), data.draw(st.sampled_from(["w1", "w2"])))

    @rule(data=st.data())
    def check_regions(self, data: st.DataObject) -> None:
        units = self.units(data)
        wrapped = [data.draw(st.booleans()) for _ in units]
        window = data.draw(st.sampled_from(["w1", "w2"]))
        self.decide(self.guard(data), units, window, wrapped)

    @rule(data=st.data(), whole=st.booleans(), at=st.integers(0, 16))
    def check_while_the_store_is_down(self, data: st.DataObject, whole: bool, at: int) -> None:
        """The store unreachable (every handle on it): every source is dead, so a guard allows
        only what was never summarized, whatever its caches still hold. Some of its methods
        failing, or its `at`-th call (`whole` False): what must be refused still is."""
        units = self.units(data)
        value, found = self.value(units, [data.draw(st.booleans()) for _ in units])
        failing: Collection[str] = ()
        if whole:
            failing, at = STORE_METHODS, 0
        elif not at:
            failing = data.draw(st.sets(st.sampled_from(STORE_METHODS)))
        guard = self.guard(data)
        with self.faults(failing, at):
            decision = guard.check(value, summarizer="property")
        assert decision.effect == "deny" or not self.must_refuse(found), (units, found, failing)
        assert decision.effect == "deny" or not whole or found.depth == 0, (units, found)

    @precondition(lambda self: any(k.depth > 0 for k in self.oracle.known.values()))
    @rule(data=st.data(), sep=st.sampled_from(["\n", " ", ""]))
    def check_region_holding_an_evicted_text(self, data: st.DataObject, sep: str) -> None:
        """A Region whose text holds a known summary and a source's text, that source evicted
        now: a guard caching the text finds it there, a restarted one cannot (the store keeps
        no text), and both must decide alike (`decide` compares them)."""
        known = self.oracle.known
        summary = data.draw(st.sampled_from(sorted(t for t, k in known.items() if k.depth > 0)))
        originals = sorted(
            t for t, k in known.items() if k.depth == 0 and k.sources and len(encode(t)) >= EMBEDDED
        )
        if not originals:
            return
        original = data.draw(st.sampled_from(originals))
        for source_id in sorted(known[original].sources):
            self.stores[0].evict(source_id)
        unit = data.draw(
            st.sampled_from([f"{summary}{sep}{original}", f"{original}{sep}{summary}"])
        )
        self.decide(self.guard(data), [unit], data.draw(st.sampled_from(["w1", "w2"])), [True])

    @rule(replace=st.booleans())
    def new_guard(self, replace: bool) -> None:
        """A restart (the guard replaced) or a second process (another guard on the store)."""
        if self.reopen is not None:
            store = self.reopen()
            self.stores.append(store)
        else:
            store = self.stores[0]
        guard = self.new(store)
        if replace:
            self.guards[-1].close()
            self.guards[-1] = guard
        elif len(self.guards) < 3:
            self.guards.append(guard)

    @invariant()
    def known_texts_whole(self) -> None:
        """Every known text given whole, as the newest guard sees it."""
        if not self.oracle.known:
            return
        guard = self.guards[-1]
        for text in sorted(self.oracle.known)[-4:]:
            self.decide(guard, [text], "w1")


Provenance.TestCase.settings = deep.suite(45, 30, HealthCheck.filter_too_much)
TestProvenance = Provenance.TestCase


class ProvenanceOnPostgres(Provenance):
    """The machine on PostgresStore (a real server, tests/servers.py): a schema of its own per
    example, another connection for each new guard (another process's)."""

    KINDS = ("postgres",)


class ProvenanceOnRedis(Provenance):
    """The machine on RedisStore: a key namespace of its own per example, another client for
    each new guard."""

    KINDS = ("redis",)


@pytest.mark.parametrize("machine", [ProvenanceOnPostgres, ProvenanceOnRedis], ids=["pg", "redis"])
def test_the_oracle_holds_on_a_server_store(
    machine: type[Provenance], request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """What the server stores do their own way (one statement or script per view, anchors and
    entries read back by another handle) decides as the oracle says."""
    server = request.getfixturevalue(machine.KINDS[0])  # started here, stopped after
    monkeypatch.setattr(machine, "url", server.url)
    run_state_machine_as_test(machine, settings=deep.suite(20, 30, HealthCheck.filter_too_much))


def test_the_oracle_finds_what_the_docs_say() -> None:
    """The oracle itself: whole units stripped, short texts only whole, leftmost-longest."""
    oracle = Oracle()
    oracle.record_source("a source text long enough here", "s1")
    oracle.record_summary("short one", oracle.value(["a source text long enough here"]))
    assert oracle.value(["  short one\n"]).depth == 1
    assert oracle.value(["say short one"]).depth == 0
    found = oracle.value(["x a source text long enough here y"])
    assert (found.depth, found.sources, found.gaps) == (0, {"s1"}, {"x ", " y"})
    oracle.record_source("quoting: short one", "s2")
    assert oracle.known["quoting: short one"].depth == 0  # short texts are not searched for
    # A text held under two ids stays held while one of them is (the same content).
    twice = Oracle(held=lambda source_id: source_id != "first")
    twice.record_source("one text registered, then archived again", "first")
    twice.archived("one text registered, then archived again", "second")
    assert twice.text_held("first") and not Oracle(held=lambda _: False).text_held("first")
    # Registered again under a new id, the newer one gone: still held under the first.
    again = Oracle(held=lambda source_id: source_id != "second")
    for source_id in ("first", "second"):
        again.record_source("one text registered twice, by two callers", source_id)
    found = again.value(["one text registered twice, by two callers"])
    assert (found.sources, found.gaps) == ({"first"}, set())
    # ... and returned as a summary since: its text is still held under either id.
    again.record_summary("one text registered twice, by two callers", found)
    assert again.text_held("second") and not again.held("second")
    # A unit that is a dead source's whole text hides nothing either: archived, then a
    # summary's text with whitespace around it, it is that summary (found by a deep run, where
    # the oracle took the unit for the dead source's content and asked a refusal).
    gone = Oracle(held=lambda source_id: source_id != "old")
    gone.archived(" an archived gap, a summary's text since", "old")
    gone.record_summary("an archived gap, a summary's text since", Found())
    found = gone.value([" an archived gap, a summary's text since"])
    assert (found.depth, found.gaps) == (1, set())
    # A dead source's content is what of it is not a known text found inside it.
    dead = Oracle(held=lambda source_id: source_id != "s2")
    dead.record_source("a source text long enough here", "s1")
    dead.record_source("x a source text long enough here y", "s2")
    found = dead.value(["x a source text long enough here y z"])
    assert (found.sources, found.gaps) == ({"s1"}, {"x ", " y", " z"})


@pytest.mark.parametrize("max_texts", [1, 65_536])
def test_a_summary_whose_text_was_registered_twice_rests_on_the_id_still_held(
    max_texts: int,
) -> None:
    """A text registered under two ids, then returned by a summarizer as the summary of an
    input holding it (found by `POLICYHOOK_DEEP=30`, where the oracle wrongly asked for both
    ids): the summary rests on one of them. While that one holds the text, the summary's
    content is retrievable and it may be summarized again; once it goes, it is refused."""
    store = MemoryStore(max_sources=2, max_tombstones=0)
    guard = Guard(store=store, max_texts=max_texts, archive_originals=True)
    text = "zqax retry retry"
    for source_id in ("src-1", "src-2"):
        guard.record_source(text, "config_read", source_id)
    with policyhook.request(window="w1"):
        assert guard(lambda value: text, summarizer="t")([f"{text} zqdx"]) == text
    assert store.live(["src-1", "src-2"]) == {"src-2"}  # the archived " zqdx" took src-1's place
    with policyhook.request(window="w1"):
        held = guard.check([text], summarizer="t")
    assert (held.effect, held.depth, held.dead_sources) == ("allow", 1, ())
    store.evict("src-2")
    with policyhook.request(window="w1"):
        gone = guard.check([text], summarizer="t")
    assert (gone.effect, gone.dead_sources) == ("deny", ("src-2",))


@pytest.mark.parametrize("recorded_elsewhere", [True, False])
def test_a_dead_text_back_in_the_input_is_archived_whether_cached_or_not(
    recorded_elsewhere: bool,
) -> None:
    """(The Provenance machine at 20x its budget.) A registered text quoting an archived one is
    evicted, then comes back inside a new input, with `archive_originals`. A guard that recorded
    it finds it as that dead source and stores its text again (its id revived); a guard that
    never kept its text (recorded by another guard on the store, while this one's cache of one
    text held another) finds unrecognised content around the archived one and archives it as
    new. Either way the summary rests on live pieces holding every byte of the input and is
    allowed: what the cache held changes the ids, not the decision."""
    store = MemoryStore()
    guard = Guard(store=store, max_texts=1, archive_originals=True)
    recorder = Guard(store=store, max_texts=1) if recorded_elsewhere else guard
    oracle = Oracle(lambda source_id: store.get_source(source_id) is not None)
    archived = "zqax zqbx retry retry"
    guard(lambda value: "zqcx", summarizer="p")([archived])
    ((window, text),) = [(s.id, t) for s, t in store.sources(10)]
    oracle.archived(text, window)
    guard.check(["zqdx"], summarizer="p")  # the deciding guard's one-text cache moves on
    quoting = "zqhx retry retry " + archived
    recorder.record_source(quoting, "config_read", "quoting")
    oracle.record_source(quoting, "quoting")
    store.evict("quoting")
    value = ["zqjx retry retry " + quoting]
    found = oracle.value(value)
    # the dead text's content is a gap: what of it is not a known text found inside it
    assert found.gaps == {"zqjx retry retry ", "zqhx retry retry "}
    assert guard(lambda v: archived, summarizer="p")(value) == archived  # originals: allowed
    held = [t for _, t in store.sources(10)]
    region = guard.provenance([archived])
    assert region.depth == 1 and store.live(region.sources) == region.sources
    assert guard.check([archived], summarizer="p").effect == "allow"
    if recorded_elsewhere:  # archived as new, in two pieces
        assert held == [archived, "zqjx retry retry zqhx retry retry "]
        assert "quoting" not in region.sources and store.states(["quoting"]) == {
            "quoting": "evicted"
        }
    else:  # the source's own text put back under its id, and the gap before it
        assert held == [archived, "zqjx retry retry ", quoting]
        assert "quoting" in region.sources
    assert all(oracle.covered(gap, held) for gap in found.gaps)


@pytest.mark.parametrize("max_texts", [1, 65_536], ids=["small-cache", "cached"])
def test_a_dead_source_of_a_summary_and_whitespace_is_no_content(max_texts: int) -> None:
    """(The Provenance machine at 100x its budget.) An archived text that is a summary's text
    and a space, evicted, comes back before a live source in one unit: the unit is the summary
    (its sources live), whitespace and the live source: allowed. A guard that found the dead
    text (cached, or by anchor with a small cache) rested on its id too and refused; the oracle
    counted that text as content of the input's own and said refuse. Found by that run."""
    store = MemoryStore()
    guard = Guard(store=store, max_texts=max_texts, archive_originals=True)
    oracle = Oracle(lambda source_id: store.get_source(source_id) is not None)
    summary, turn = "zqax backoff billing the", "zqbx retry retry retry zqcx retry retry"
    guard(lambda value: "zqdx", summarizer="p")([summary + " "])  # archived as it came
    found = oracle.value([turn])
    guard(lambda value: summary, summarizer="p")([turn])
    oracle.record_summary(summary, found)
    for source, text in store.sources(10):
        oracle.archived(text, source.id)
    (dead,) = [source.id for source, text in store.sources(10) if text == summary + " "]
    assert store.evict(dead)
    value = [f"{summary} {turn}"]
    found = oracle.value(value)
    held = [text for _, text in store.sources(10)]
    assert found.depth == 1 and all(oracle.covered(gap, held) for gap in found.gaps), found
    region = guard.provenance(value)
    assert dead not in region.sources and store.live(region.sources) == region.sources
    assert guard.check(value, summarizer="p").allowed
    assert Guard(store=store).check(value, summarizer="p").allowed


#: What the messages of `test_dead_sources_cut_anywhere_decide_nothing` are made of: two
#: summaries (of a live base), a live source, whitespace, and words no store holds.
CUT_SUMMARIES = ["zqax backoff billing the ceiling", "zqbx jitter window deploy retry ok"]
CUT_SOURCE = "zqcx config: retry ceiling 7, backoff 2s, billing window 30"
CUT_PIECES = [*CUT_SUMMARIES, CUT_SOURCE, " ", "\n", "  \n\t", "zqdx own words"]


@given(data=st.data())
@deep.suite(120)
def test_dead_sources_cut_anywhere_decide_nothing(data: st.DataObject) -> None:
    """Sources cut anywhere from a message of known texts, whitespace and words of its own,
    recorded before or after the summaries, then evicted but for a few (from a MemoryStore, one
    forgetting their tombstones, a SQLite file): whether a guard finds them (the one
    that recorded them, caching them; one with a one-text cache, by anchor; a new one, never)
    decides nothing. One holding only known texts and whitespace is those texts, so with the
    cuts recorded first and no words of its own the message rests on live sources: allowed.
    (Recorded after the summaries, a text quoting one is a record resting on itself too:
    `test_record_quoting.py`; gone, it is refused wherever it is found, as it is found
    everywhere.) With the store down every source is dead: each guard then allows only a
    message that was never summarized (depth 0), whatever its cache holds."""
    pieces = data.draw(st.lists(st.sampled_from(CUT_PIECES), min_size=1, max_size=6))
    message = "".join(pieces)
    anywhere = st.tuples(st.integers(0, len(message)), st.integers(0, len(message))).map(sorted)
    whole = st.just([0, len(message)])  # (a message recorded as a source, as a tool output is)
    cuts = data.draw(st.lists(st.one_of(whole, anywhere), min_size=1, max_size=3))
    texts = [message[a:b] for a, b in cuts if message[a:b].strip()]
    # (a text cut to one of the known texts exactly is that text put under a second id:
    # another case, docs/stores.md)
    texts = [t for t in dict.fromkeys(texts) if t not in (*CUT_SUMMARIES, CUT_SOURCE)]
    before = data.draw(st.booleans())
    kind = data.draw(st.sampled_from(["memory", "forgetting", "sqlite"]))
    with tempfile.TemporaryDirectory() as tmp:
        store: Store = (
            MemoryStore()
            if kind == "memory"
            else MemoryStore(max_tombstones=1)  # a dead source's entry forgotten, but the last
            if kind == "forgetting"
            else SQLiteStore(Path(tmp) / "cut.sqlite")
        )
        kept = data.draw(st.sets(st.integers(0, len(texts) - 1))) if texts else set()
        try:
            _cut_and_decide(store, message, pieces, texts, before, kept)
        finally:
            if isinstance(store, SQLiteStore):
                store.close()


def _cut_and_decide(
    store: Store, message: str, pieces: list[str], texts: list[str], before: bool, kept: set[int]
) -> None:
    guard = Guard(store=store)
    if before:
        for i, text in enumerate(texts):
            guard.record_source(text, "tool_output", source_id=f"cut-{i}")
    guard.record_source("zqex the live base of the summaries", "tool_output", source_id="base")
    guard.record_source(CUT_SOURCE, "config_read", source_id="live")
    based = guard.provenance(["zqex the live base of the summaries"])
    for summary in CUT_SUMMARIES:
        guard.ledger.record_summary(summary, based, "w")
    if not before:
        for i, text in enumerate(texts):
            guard.record_source(text, "tool_output", source_id=f"cut-{i}")
    for i in range(len(texts)):
        if i not in kept:
            store.evict(f"cut-{i}")
    readers = [guard, Guard(store=store, max_texts=1), Guard(store=store)]
    # As a message, and as a Region's text (a framework's seam: its unrecognised content is
    # the caller's declared content, a dead source in it unknown text)
    values: list[list[str | Region]] = [[message], [Region.original(message)]]
    decisions = [
        [reader.check(value, summarizer="p", enforce=False).effect for reader in readers]
        for value in values
    ]
    depths = [readers[2].provenance(value).depth for value in values]
    with store_down(store):  # every source dead: only what was never summarized is allowed
        for value, depth in zip(values, depths, strict=True):
            for reader in readers:
                decision = reader.check(value, summarizer="p", enforce=False)
                assert decision.effect == "deny" or depth == 0, (value, texts, before, store)
    for reader in readers:
        reader.close()
    for value, effects in zip(values, decisions, strict=True):
        assert len(set(effects)) == 1, (value, texts, before, store, effects)
    if before and "zqdx own words" not in pieces:
        assert decisions[0][0] == decisions[1][0] == "allow", (pieces, texts)


class TestThreads:
    """Threads deciding on one guard at once, the ledger's caches far smaller than what they
    record (every thread's texts push the others' out), each thread with its own chain."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_no_thread_sees_a_dead_summary_as_evidence(self, tmp_path: Path, kind: str) -> None:
        """Each thread: a source, a summary of it, a summary of both, a turn quoting the first;
        every grant expected is granted, and once the source is evicted all three are refused
        (checked while the other threads keep recording)."""
        store: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.sqlite")
        guard = Guard(store=store, max_texts=3, max_windows=1)
        errors: list[BaseException] = []

        def chain(thread: int) -> None:
            try:
                for i in range(12):
                    tag = f"{fresh_words(thread * 100 + i)} thread chain"
                    source = f"{tag}: config read, the retry ceiling and the backoff"
                    first, second = f"{tag}: summary of the config", f"{tag}: summary of both"
                    with policyhook.request(window=f"w{thread}"):
                        guard.record_source(source, "config_read", f"cfg-{thread}-{i}")
                        assert guard(lambda v, out=first: out, summarizer="s")(source) == first
                        both = [first, source]
                        assert guard(lambda v, out=second: out, summarizer="s")(both) == second
                        guard.record_source(f"quoting {first}", "ai_turn", f"turn-{thread}-{i}")
                        store.evict(f"cfg-{thread}-{i}")
                        for value in (first, second, f"quoting {first}", [f"  {first}\n"]):
                            assert guard.check(value, summarizer="p").effect == "deny", value
            except BaseException as error:  # reported by the main thread
                errors.append(error)

        threads = [threading.Thread(target=chain, args=(n,)) for n in range(4)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert errors == []
