"""The rolling agent loop: each call summarizes [last summary, new turn], so the k-th pass rests
on all k turns so far (issue 12).

What a user relies on here: the ledger's cached closures stay exact (a cached closure that
misses a source, or hides a dead one, is a wrong allow), and caching them costs no k-sized
object the cyclic GC must visit at every collection (that was the loop's p99: benchmarks/).
The property test drives rolling chains through evictions, expiries, revivals, restarts and a
small text cache, and compares every region and decision with a from-scratch oracle.
"""

from __future__ import annotations

import gc
import time
import types
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import deep
import pytest
from hypothesis import HealthCheck, given
from hypothesis import strategies as st

from policyhook import Guard, MemoryStore, SQLiteStore
from policyhook._backends import default_backend
from policyhook._closures import CLOSURES, Closures
from policyhook._loader import compile_sources
from policyhook._policy import PolicySet
from policyhook._provenance import Source
from policyhook.testing import capture_decisions

#: The default policy's input rule in audit mode: a chain with a dead source goes on (the
#: decision says `would_deny` and names the dead sources), so one chain sees every case.
AUDIT = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata:
  name: live-sources-audit
spec:
  mode: audit
  failurePolicy: deny
  rules:
    - name: live-sources
      expression: 'region.kind != "summary" || size(region.dead_sources) == 0'
      message: dead sources
"""


def audit_policies() -> PolicySet:
    return compile_sources([("audit.yaml", AUDIT)], backend=default_backend())


def big_tracked_frozensets(size: int) -> int:
    """GC-tracked frozensets of at least `size` turn ids alive now (a collection visits each
    item by item)."""
    gc.collect()
    return sum(
        1
        for o in gc.get_objects()
        if type(o) is frozenset
        and len(o) >= size
        and all(isinstance(i, str) and i.startswith("user_turn:") for i in o)
    )


def rolling(guard: Guard, passes: int, window: str = "w", tag: str = "") -> str:
    """Run a rolling chain of `passes` guarded calls; the last summary."""
    last: list[str] = []
    for i in range(passes):
        turn = f"user turn {tag}{i}: the deploy of service {tag}{i} moved to a later window"
        guard.record_source(turn, kind="user_turn")
        out = f"summary {tag}{i}: everything so far about the deploys, pass {i} of {window}"
        with _window(window):
            last = [guard(lambda messages, out=out: out, summarizer="s")([*last, turn])]
    return last[0]


def _window(window: str) -> Any:
    from policyhook._hook import request

    return request(window=window)


class TestClosuresOutOfTheGCsSight:
    """The ledger caches what recent summaries rest on without k-sized GC-tracked objects."""

    def test_a_rolling_chain_keeps_at_most_its_newest_closure_as_a_frozenset(self) -> None:
        """After 300 passes, no more than two frozensets of 100+ ids are alive (the newest
        closure and its parent's), not one per cached summary."""
        store = MemoryStore()
        guard = Guard(audit_policies(), store=store)
        last = rolling(guard, 300)
        assert guard.provenance([last]).sources >= {s.id for s, _ in store.sources(1)}
        assert len(guard.provenance([last]).sources) == 300
        assert big_tracked_frozensets(100) <= 2

    def test_interleaved_chains_keep_older_closures_untracked_and_bounded(self) -> None:
        """Three chains in turn: the closures of the other chains' heads are kept (not walked
        again) as dicts the GC does not track; the cache holds at most `CLOSURES`."""
        guard = Guard(audit_policies(), store=MemoryStore())
        lasts: dict[str, list[str]] = {w: [] for w in "abc"}
        for i in range(120):
            for w, last in lasts.items():
                turn = f"turn {w}{i}: a long enough user turn about the deploy of {w}{i}"
                guard.record_source(turn, kind="user_turn")
                with _window(w):
                    out = f"summary {w}{i}: the chain of window {w} so far"
                    last[:] = [guard(lambda m, out=out: out, summarizer="s")([*last, turn])]
        closures = guard.ledger._closures
        assert 1 <= len(closures) <= CLOSURES
        assert all(not gc.is_tracked(d) for d in closures._older.values())
        assert big_tracked_frozensets(100) <= 2
        for last in lasts.values():
            region = guard.provenance(last)
            assert region.depth == 120 and len(region.sources) == 120
            assert all(s.startswith("user_turn:") for s in region.sources)

    def test_the_cache_keeps_the_newest_as_given_and_older_ones_equal(self) -> None:
        closures = Closures()
        first, second = frozenset({"a", "b"}), frozenset({"a", "b", "c"})
        closures.put("s1", first)
        closures.put("s2", second)  # s1 is not a parent of s2: kept, out of the GC's sight
        assert closures.get("s2") is second
        assert closures.get("s1") == first and not gc.is_tracked(closures._older["s1"])
        closures.put("s3", second | {"d"}, parents=("s2",))  # made from s2: kept as given
        assert closures.get("s2") is second and closures.get("s1") == first
        closures.put("s4", second | {"e"}, parents=("s3",))  # a chain moves on: s2 dropped
        assert closures.get("s2") is None and closures.get("s3") == second | {"d"}
        closures.pop("s3")
        closures.pop("s4")
        assert closures.get("s3") is None and len(closures) == 1
        for i in range(2 * CLOSURES):
            closures.put(f"x{i}", frozenset({str(i)}))
        assert len(closures) == CLOSURES and closures.get("s1") is None
        closures.clear()
        assert len(closures) == 0 and closures.get(f"x{2 * CLOSURES - 1}") is None


class TestAClosureTheStoreGaveOutgrown:
    """A worker that did not cache a summary's parent took the summary's closure from the
    store and kept it. The parent was then recorded again elsewhere (the same output from
    another input), so the summary rests on more sources; the worker learnt the parent's new
    record as a text new to its cache, which cleared nothing, and decided on the old closure:
    it allowed the summary after a source it now rests on was evicted. Such closures now go
    when a summary new to the cache arrives, and the decision that brought it is redone."""

    @pytest.mark.parametrize(
        ("max_texts", "fillers", "between"), [(1, 0, False), (2, 1, True), (6, 5, True)]
    )
    def test_a_parent_recorded_again_elsewhere_is_seen(
        self, max_texts: int, fillers: int, between: bool
    ) -> None:
        store = MemoryStore()
        worker, other = Guard(store=store), Guard(store=store, max_texts=max_texts)
        texts = [
            "config read: the deploy window opens in the morning on weekdays",
            "tool output: the billing files changed today, three of them",
            "user turn: the retry ceiling is seven for the billing job, says ops",
        ]
        for i, text in enumerate(texts):
            worker.record_source(text, "tool_output", f"src{i + 1}")
        parent = "Summary A: nothing changed that matters for the deploy."
        worker(lambda v: parent, summarizer="s")(texts[0])
        summary = "Summary S: the billing files changed; otherwise nothing new."
        worker(lambda v: summary, summarizer="s")([parent, texts[1]])
        other.check([summary], summarizer="p")  # takes the summary's closure from the store
        for i in range(fillers):
            worker.record_source(f"another long registered text {i} for the cache", "user_turn")
            if between:
                other.check([f"an unrelated new turn {i}, long enough to search"], summarizer="p")
        assert other.check([summary], summarizer="p").effect == "allow"
        worker(lambda v: parent, summarizer="s")(texts[2])  # the parent now rests on src3 too
        for i in range(0 if between else fillers):
            worker.record_source(f"more long registered text {i} for the cache", "user_turn")
        store.evict("src3")
        assert worker.check([summary], summarizer="p").effect == "deny"
        assert other.check([summary], summarizer="p").effect == "deny"
        assert "src3" in other.provenance([summary]).sources


class TestLivenessOfARollingChain:
    """Every source held: the store answers with the region's own set (nothing k-sized
    made); one dead: exactly the held ones."""

    def stores(self, tmp_path: Path) -> Iterator[Any]:
        yield MemoryStore()
        sqlite = SQLiteStore(tmp_path / "s.db")
        yield sqlite
        sqlite.close()

    def test_all_held_is_the_same_set_and_one_evicted_is_left_out(self, tmp_path: Path) -> None:
        for store in self.stores(tmp_path):
            ids = frozenset(f"src-{i}" for i in range(50))
            for i in ids:
                store.put_source(Source(i, "tool_output"), f"the text of {i}")
            assert store.live(ids) == ids  # (SQLite: its cache filled by this first read)
            assert store.live(ids) is ids
            view = store.view(0, 1024, [], ids)
            assert view.live == ids
            assert store.view(view.cursor, 1024, [], ids).live is ids
            store.evict("src-7")
            assert store.live(ids) == ids - {"src-7"}
            assert store.view(view.cursor, 1024, [], ids).live == ids - {"src-7"}
            assert store.live(sorted(ids)) == ids - {"src-7"}  # not a set: the same answer
            assert store.live(ids | {"never-put"}) == ids - {"src-7"}

    def test_an_eviction_by_another_handle_is_seen_at_once(self, tmp_path: Path) -> None:
        """SQLite answers a chain's liveness from its cache while no other connection
        committed; another handle's eviction is seen by the next view and live()."""
        store, other = SQLiteStore(tmp_path / "s.db"), SQLiteStore(tmp_path / "s.db")
        ids = frozenset(f"src-{i}" for i in range(50))
        for i in ids:
            store.put_source(Source(i, "tool_output"), f"the text of {i}")
        store.live(ids)
        cursor = store.view(0, 1024, [], ids).cursor
        assert store.view(cursor, 1024, [], ids).live is ids
        other.evict("src-8")
        assert store.view(cursor, 1024, [], ids).live == ids - {"src-8"}
        other.evict("src-9")
        assert store.live(ids) == ids - {"src-8", "src-9"}
        store.close()
        other.close()


# -- the property: rolling chains against a from-scratch oracle -----------------------------------

TTL = 100.0
OPS = st.lists(
    st.one_of(
        st.tuples(st.just("pass"), st.integers(0, 1)),  # a new turn and a pass of chain 0 or 1
        st.tuples(st.just("evict"), st.integers(0, 60)),  # evict the n-th turn put (mod count)
        st.tuples(st.just("revive"), st.integers(0, 60)),  # put the n-th turn's text again
        st.tuples(st.just("wait"), st.sampled_from([10.0, 60.0, 101.0])),  # expiries
        st.tuples(st.just("restart"), st.just(0)),  # a new guard (and handle) on the store
        # Another worker records one of chain 0's or 1's last three summaries again, as the
        # output of a call on a new turn: the chain then rests on that turn too (merged
        # provenance: every later summary of the chain rests on the one recorded again).
        st.tuples(st.just("again"), st.tuples(st.integers(0, 1), st.integers(0, 2))),
    ),
    min_size=1,
    max_size=30,
)
PROPERTY = deep.suite(60, None, HealthCheck.function_scoped_fixture)


class _Oracle:
    """What each chain rests on and which turns are held, computed from scratch."""

    def __init__(self) -> None:
        self.put_at: dict[str, float] = {}  # turn id -> when last put (TTL counts from it)
        self.evicted: set[str] = set()
        self.chains: list[set[str]] = [set(), set()]  # the turn ids each chain rests on
        self.passes = [0, 0]  # each chain's passes: its last summary's depth

    def dead(self, ids: set[str], now: float) -> set[str]:
        return {i for i in ids if i in self.evicted or self.put_at[i] + TTL <= now}


def run_chains(
    store_kind: str, ops: list[tuple[str, Any]], max_texts: int, other_max: int, tmp: Path
) -> None:
    clock = [1_000_000.0]
    fake = types.SimpleNamespace(
        time=lambda: clock[0], monotonic=lambda: clock[0], sleep=time.sleep
    )
    path = tmp / f"chain-{time.monotonic_ns()}.db"

    def open_store() -> Any:
        return MemoryStore(ttl=TTL) if store_kind == "memory" else SQLiteStore(path, ttl=TTL)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("policyhook.stores.time", fake)
        store, handle = open_store(), open_store() if store_kind == "sqlite" else None
        guard = Guard(audit_policies(), store=store, max_texts=max_texts)
        other = Guard(audit_policies(), store=handle or store, max_texts=other_max)
        oracle = _Oracle()
        texts: list[tuple[str, str]] = []  # (turn id, text) in the order put
        lasts: list[str | None] = [None, None]
        made: list[list[str]] = [[], []]  # each chain's summaries, in order
        for step, (op, arg) in enumerate(ops):
            if op == "pass":
                text = f"user turn {step}: the deploy of service {step} moved to a later window"
                source = guard.record_source(text, kind="user_turn")
                texts.append((source.id, text))
                oracle.put_at[source.id] = clock[0]
                oracle.evicted.discard(source.id)
                chain = oracle.chains[arg]
                chain.add(source.id)
                oracle.passes[arg] += 1
                value = [text] if lasts[arg] is None else [lasts[arg], text]
                out = f"summary {step} of chain {arg}: all of its turns so far"
                with capture_decisions(guard, phase="input") as seen, _window(f"w{arg}"):
                    lasts[arg] = guard(lambda m, out=out: out, summarizer="s")(value)
                made[arg].append(out)
                ((decision, _),) = seen
                # The pass decided on the chain's region as of now: every turn so far.
                assert decision.depth == oracle.passes[arg] - 1
                assert set(decision.dead_sources) == oracle.dead(chain, clock[0])
            elif op == "evict" and texts:
                source_id = texts[arg % len(texts)][0]
                store.evict(source_id)
                if oracle.put_at[source_id] + TTL > clock[0]:
                    oracle.evicted.add(source_id)  # (an expired one stays expired: dead)
            elif op == "revive" and texts:
                source_id, text = texts[arg % len(texts)]
                guard.record_source(text, kind="user_turn", source_id=source_id)
                oracle.put_at[source_id] = clock[0]
                oracle.evicted.discard(source_id)
            elif op == "wait":
                clock[0] += arg
            elif op == "restart":
                if handle is not None:
                    store.close()
                    handle.close()
                    store, handle = open_store(), open_store()
                guard = Guard(audit_policies(), store=store, max_texts=max_texts)
                other = Guard(audit_policies(), store=handle or store, max_texts=other_max)
            elif op == "again" and made[arg[0]]:
                chain_index, back = arg
                text = f"another worker's turn {step}: a deploy note from elsewhere entirely"
                source = other.record_source(text, kind="user_turn")
                texts.append((source.id, text))
                oracle.put_at[source.id] = clock[0]
                oracle.evicted.discard(source.id)
                oracle.chains[chain_index].add(source.id)
                same = made[chain_index][-1 - min(back, len(made[chain_index]) - 1)]
                with _window("elsewhere"):
                    assert other(lambda m, same=same: same, summarizer="s")([text]) == same
            for index, last in enumerate(lasts):
                if last is None:
                    continue
                chain = oracle.chains[index]
                dead = oracle.dead(chain, clock[0])
                for deciding in (guard, other):
                    region = deciding.provenance([last])
                    assert region.sources == frozenset(chain)
                    assert region.depth == oracle.passes[index]
                    decision = deciding.check([last], summarizer="p")
                    assert set(decision.dead_sources) == dead
                    assert decision.effect == ("would_deny" if dead else "allow")
        if handle is not None:
            store.close()
            handle.close()


class TestRollingChainsAgainstAnOracle:
    """Each chain's region (sources, depth) and dead sources, after every step, equal what
    the oracle computes from scratch, through evictions, expiries, revivals, restarts and
    another worker recording a chain's summary again, seen by both workers, each with a text
    cache big enough for everything or far too small."""

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @PROPERTY
    @given(ops=OPS, max_texts=st.sampled_from([3, 65_536]), other=st.sampled_from([2, 65_536]))
    def test_store(
        self, kind: str, ops: list[tuple[str, Any]], max_texts: int, other: int, tmp_path: Path
    ) -> None:
        run_chains(kind, ops, max_texts, other, tmp_path)
