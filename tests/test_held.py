"""A view given what was held (`Held`): a rolling chain's k-th pass checks only what changed
since its last pass, not its k sources again (issue 12).

What a user relies on: the answer is exactly the full check's, whoever evicted, expired or
revived an id since (this handle, another connection, a writer that is not policyhook, a
TTL, capacity), whatever the store forgot meanwhile (its liveness cache, a log cut short, a
restart). The state machine drives a store through all of those and compares every view
given `Held` with a from-scratch model; a store without `held` is never given it.
"""

from __future__ import annotations

import sqlite3
import tempfile
import threading
import time
import types
from collections import OrderedDict
from collections.abc import Collection, Iterator
from pathlib import Path
from typing import Any

import deep
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from test_rolling import OPS, PROPERTY, run_chains

from policyhook import Guard, MemoryStore, SQLiteStore, Store, _provenance
from policyhook import stores as stores_module
from policyhook._provenance import Held, Source, View, _Grown

IDS = [f"src-{i}" for i in range(10)]


@pytest.fixture(autouse=True)
def _held_from_any_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """The ledger hands closures of 256+ sources to the store as `Held`; these chains are short."""
    monkeypatch.setattr(_provenance, "_HELD_FROM", 1)


TTL = 100.0


def text(source_id: str) -> str:
    return f"the one text of {source_id}, long enough to be anchored"


class _Model:
    """Which ids are held, computed from what was done (a MemoryStore's capacity: oldest put
    out first)."""

    def __init__(self, max_sources: int | None = None) -> None:
        self.until: OrderedDict[str, float] = OrderedDict()  # held id -> expiry, in put order
        self.max_sources = max_sources

    def expire(self, now: float) -> None:
        for i in [i for i, t in self.until.items() if t <= now]:
            del self.until[i]

    def put(self, source_id: str, now: float, ttl: float | None) -> None:
        self.expire(now)
        self.until.pop(source_id, None)
        self.until[source_id] = now + ttl if ttl else float("inf")
        while self.max_sources is not None and len(self.until) > self.max_sources:
            self.until.popitem(last=False)

    def evict(self, source_id: str, now: float) -> None:
        self.expire(now)
        self.until.pop(source_id, None)

    def held(self, ids: Collection[str], now: float) -> frozenset[str]:
        self.expire(now)
        return frozenset(i for i in ids if i in self.until)


class HeldViews(RuleBasedStateMachine):
    """Views given `Held` against the model, over puts, evictions, expiries and forgetting."""

    kind = "memory"
    max_sources: int | None = None

    def __init__(self) -> None:
        super().__init__()
        self.clock = [1_000_000.0]
        fake = types.SimpleNamespace(
            time=lambda: self.clock[0], monotonic=lambda: self.clock[0], sleep=time.sleep
        )
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr(stores_module, "time", fake)
        # Small logs and scans, so that "the log no longer reaches back" happens often.
        self.patch.setattr(stores_module, "_DEATHS", 3)
        self.patch.setattr(stores_module, "_CHANGES_MAX", 8)
        self.tmp = tempfile.TemporaryDirectory()
        self.path = Path(self.tmp.name) / "held.db"
        self.model = _Model(self.max_sources if self.kind == "memory" else None)
        # (ids, as_of) found all held by some view: what a ledger keeps with a closure
        self.known: list[tuple[frozenset[str], object]] = []
        self.store: Any
        self.other: Any = None

    @initialize()
    def open(self) -> None:
        if self.kind == "memory":
            self.store = MemoryStore(ttl=TTL, max_sources=self.max_sources)
        else:
            self.store = SQLiteStore(self.path, ttl=TTL)
            self.other = SQLiteStore(self.path)  # another connection, holding forever

    def teardown(self) -> None:
        for store in (self.store, self.other):
            if isinstance(store, SQLiteStore):
                store.close()
        self.tmp.cleanup()
        self.patch.undo()

    def _writer(self, other: bool) -> tuple[Any, float | None]:
        if other and self.other is not None:
            return self.other, None
        return self.store, TTL

    @rule(i=st.sampled_from(IDS), other=st.booleans())
    def put(self, i: str, other: bool) -> None:
        writer, ttl = self._writer(other)
        writer.put_source(Source(i, "tool_output"), text(i))
        self.model.put(i, self.clock[0], ttl)

    @rule(i=st.sampled_from(IDS), other=st.booleans())
    def evict(self, i: str, other: bool) -> None:
        self._writer(other)[0].evict(i)
        self.model.evict(i, self.clock[0])

    @rule(i=st.sampled_from(IDS))
    def evict_by_hand(self, i: str) -> None:
        """A writer that is not policyhook (its triggers still number the change)."""
        if self.kind != "sqlite":
            return self.evict(i, False)
        db = sqlite3.connect(self.path)
        db.execute("UPDATE sources SET text = NULL, state = 'evicted' WHERE id = ?", (i,))
        db.commit()
        db.close()
        self.model.evict(i, self.clock[0])

    @rule(many=st.integers(4, 9))
    def flood(self, many: int) -> None:
        """Evict and put again more ids than the log or the scan keeps."""
        for i in IDS[:many]:
            self.evict(i, True)
            self.put(i, True)

    @rule(seconds=st.sampled_from([10.0, 60.0, 101.0]))
    def wait(self, seconds: float) -> None:
        self.clock[0] += seconds

    @rule()
    def forget(self) -> None:
        """The handle's liveness cache dropped, or the handle reopened (a restart)."""
        if self.kind == "sqlite":
            self.store._expiry.clear()

    @rule()
    def restart(self) -> None:
        if self.kind == "sqlite":
            self.store.close()
            self.store = SQLiteStore(self.path, ttl=TTL)

    @rule(other=st.booleans())
    def put_all(self, other: bool) -> None:
        for i in IDS:
            self.put(i, other)

    @rule(data=st.data(), some=st.frozensets(st.sampled_from(IDS), max_size=2))
    def view(self, data: st.DataObject, some: frozenset[str]) -> None:
        """A plain view (a decision the ledger knows nothing for), mostly of held ids."""
        held = sorted(self.model.held(IDS, self.clock[0]))
        ids = some | (data.draw(st.frozensets(st.sampled_from(held))) if held else frozenset())
        if not ids:
            return
        got = self.store.view(0, 1024, [], ids)
        assert got.live == self.model.held(ids, self.clock[0])
        self._keep(ids, got)

    @rule(at=st.integers(0, 50), rest=st.frozensets(st.sampled_from(IDS), max_size=3))
    def view_held(self, at: int, rest: frozenset[str]) -> None:
        self._view_held(at, rest)

    @rule(at=st.integers(0, 50), rest=st.frozensets(st.sampled_from(IDS), max_size=3))
    def view_held_again(self, at: int, rest: frozenset[str]) -> None:
        self._view_held(at, rest)

    def _view_held(self, at: int, rest: frozenset[str]) -> None:
        """A view given an earlier all-held answer and some more ids: exactly the model's."""
        if not self.known:
            return
        ids, as_of = self.known[at % len(self.known)]
        asked = ids | rest
        got = self.store.view(0, 1024, [], asked, held=Held(ids, as_of, rest))
        assert got.live == self.model.held(asked, self.clock[0])
        self._keep(asked, got)

    def _keep(self, ids: frozenset[str], got: View) -> None:
        if got.as_of is not None and got.live == ids:
            self.known.append((ids, got.as_of))
            del self.known[:-8]

    @invariant()
    def plain_live_is_the_model(self) -> None:
        if hasattr(self, "store"):
            assert self.store.live(IDS) == self.model.held(IDS, self.clock[0])


HELD_SETTINGS = settings(max_examples=120, stateful_step_count=30, deadline=None)


class HeldViewsMemory(HeldViews):
    kind = "memory"


class HeldViewsMemoryBounded(HeldViews):
    kind = "memory"
    max_sources = 6


class HeldViewsSQLite(HeldViews):
    kind = "sqlite"


TestHeldViewsMemory = HeldViewsMemory.TestCase
TestHeldViewsMemory.settings = deep.scaled(HELD_SETTINGS)
TestHeldViewsMemoryBounded = HeldViewsMemoryBounded.TestCase
TestHeldViewsMemoryBounded.settings = deep.scaled(HELD_SETTINGS)
TestHeldViewsSQLite = HeldViewsSQLite.TestCase
TestHeldViewsSQLite.settings = deep.scaled(
    settings(HELD_SETTINGS, max_examples=200, stateful_step_count=40)
)


# -- the ledger: `held` given to stores that take it, never to one that does not -------------


class NoHeld:
    """A store implementing the protocol by hand, its `view` without `held`: what a user's
    store (or a wrapper written out in full) is. Its views still say `as_of` (the inner
    store's), which must not make the ledger pass `held`."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.views = 0

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def view(
        self,
        cursor: int,
        limit: int,
        digests: Collection[str],
        source_ids: Collection[str],
        window: str | None = None,
    ) -> View:
        self.views += 1
        return self.inner.view(cursor, limit, digests, source_ids, window)


class Spy:
    """Passes every call on, noting the `held` each view was given."""

    def __init__(self, inner: Store) -> None:
        self.inner = inner
        self.held: list[Held | None] = []

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)

    def view(self, *args: Any, held: Held | None = None, **kwargs: Any) -> View:
        self.held.append(held)
        if held is None:
            return self.inner.view(*args, **kwargs)
        inner: Any = self.inner
        return inner.view(*args, held=held, **kwargs)  # type: ignore[no-any-return]


def chain(guard: Guard, passes: int, tag: str = "") -> tuple[str, list[str]]:
    """A rolling chain of `passes` granted calls: its last summary and the turns' ids."""
    last: list[str] = []
    turns = []
    for i in range(passes):
        turn = f"user turn {tag}{i}: the deploy of service {tag}{i} moved to a later window"
        turns.append(guard.record_source(turn, kind="user_turn").id)
        out = f"summary {tag}{i}: everything about the deploys so far, pass {i}"
        last = [guard(lambda messages, out=out: out, summarizer="s")([*last, turn])]
    return last[0], turns


def stores(tmp_path: Path) -> list[Any]:
    return [MemoryStore(), SQLiteStore(tmp_path / "a.db")]


class TestTheLedgerGivesHeld:
    def test_a_rolling_chain_is_checked_from_what_was_held(self, tmp_path: Path) -> None:
        """From the second pass on, each view is given the previous pass's closure as held
        (the k-1 ids) with the new turn as the rest."""
        for inner in stores(tmp_path):
            spy = Spy(inner)
            guard = Guard(store=spy)
            chain(guard, 6)
            given = [h for h in spy.held if h is not None]
            assert len(given) >= 4
            assert [len(h.ids) for h in given[-3:]] == [3, 4, 5]
            assert all(len(h.rest) == 1 for h in given[-3:])

    def test_an_old_turn_evicted_is_refused_on_the_next_pass(self, tmp_path: Path) -> None:
        """The fast path sees an eviction of the chain's first turn, by another handle."""
        for inner in stores(tmp_path):
            guard = Guard(store=inner)
            last, turns = chain(guard, 8)
            evicting = SQLiteStore(inner.path) if isinstance(inner, SQLiteStore) else inner
            evicting.evict(turns[0])
            turn = "user turn 8: the deploy of service 8 moved to a later window"
            guard.record_source(turn, kind="user_turn")
            decision = guard.check([last, turn], summarizer="s")
            assert decision.effect == "deny" and decision.dead_sources == (turns[0],)

    def test_a_store_without_held_is_never_given_it(self, tmp_path: Path) -> None:
        """Its views are the full check; an eviction is still refused at once."""
        for inner in stores(tmp_path):
            store = NoHeld(inner)
            guard = Guard(store=store)
            last, turns = chain(guard, 8)  # (a TypeError had `held` been passed)
            assert store.views >= 8
            inner.evict(turns[3])
            decision = guard.check([last], summarizer="s")
            assert decision.effect == "deny" and decision.dead_sources == (turns[3],)


# -- a region's source set grown, not copied (`_Grown`) -------------------------------------


class TestGrownSets:
    """A rolling chain's region rests on its previous summary's set with the new turn added
    (`_Grown`), made a frozenset only when read: it must hold exactly what the copy held."""

    def test_versions_of_one_line_hold_what_they_were_made_with(self) -> None:
        base = _Grown.of(frozenset({"a", "b"}))
        one = base.plus({"c"})
        two = one.plus({"d"})
        again = one.plus({"d"})  # the same input resolved again: the next version's ids
        other = one.plus({"e"})  # another summary of the same input: a line of its own
        assert (set(base), set(one), set(two), set(again), set(other)) == (
            {"a", "b"}, {"a", "b", "c"}, {"a", "b", "c", "d"}, {"a", "b", "c", "d"},
            {"a", "b", "c", "e"},
        )  # fmt: skip
        assert "d" not in one and "e" not in two and "d" not in other
        assert [len(g) for g in (base, one, two, again, other)] == [2, 3, 4, 4, 4]
        assert one.plus({"a", "c"}) is one and two.plus(()) is two
        assert one - {"a"} == frozenset({"b", "c"}) and type(one - {"a"}) is frozenset

    @given(
        steps=st.lists(
            st.tuples(st.integers(0, 5), st.frozensets(st.sampled_from("abcdefgh"))),
            max_size=25,
        )
    )
    def test_any_versions_against_frozensets(self, steps: list[tuple[int, frozenset[str]]]) -> None:
        """Versions grown from any earlier one hold what the frozenset union holds."""
        versions: list[tuple[_Grown, frozenset[str]]] = [
            (_Grown.of(frozenset("a")), frozenset("a"))
        ]
        for back, ids in steps:
            grown, plain = versions[-1 - back % len(versions)]
            versions.append((grown.plus(ids), plain | ids))
        for grown, plain in versions:
            assert len(grown) == len(plain) and set(grown) == plain
            assert all(i in grown for i in plain) and not any(i in grown for i in "xyz")

    def test_one_version_grown_by_two_threads_at_once(self) -> None:
        """Two ledgers may grow one line (a Region handed from one to the other): each version
        holds its own ids, never the other thread's. The first thread is held inside its
        `plus` (its ids come from a generator that waits) while the second grows the same
        version."""
        start = _Grown.of(frozenset(f"s{i}" for i in range(300)))
        second_done = threading.Event()
        got: dict[str, _Grown] = {}

        def first_ids() -> Iterator[str]:
            threading.Thread(target=second).start()
            second_done.wait(timeout=0.5)  # (with the lock, the second waits for the first)
            yield from ("a0", "a1")

        def second() -> None:
            got["b"] = start.plus(["b0", "b1"])
            second_done.set()

        got["a"] = start.plus(first_ids())
        assert second_done.wait(timeout=5)
        assert set(got["a"]) == set(start) | {"a0", "a1"}
        assert set(got["b"]) == set(start) | {"b0", "b1"}

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @PROPERTY
    @given(ops=OPS, max_texts=st.sampled_from([3, 65_536]), other=st.sampled_from([2, 65_536]))
    def test_rolling_chains_with_grown_sets_against_the_oracle(
        self, kind: str, ops: list[tuple[str, Any]], max_texts: int, other: int, tmp_path: Path
    ) -> None:
        """tests/test_rolling.py's oracle, with every region of 2 sources or more grown."""
        with pytest.MonkeyPatch.context() as patch:
            patch.setattr(_provenance, "_GROWN_FROM", 2)
            run_chains(kind, ops, max_texts, other, tmp_path)
