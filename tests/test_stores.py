"""Stores: liveness, eviction, durability across restarts, and concurrent use."""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from policyhook import Guard, MemoryStore, Region, Source, SQLiteStore, UnsafeRecompactionError
from policyhook.stores import Store


@pytest.fixture(params=["memory", "sqlite"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "memory":
        yield MemoryStore()
    else:
        with SQLiteStore(tmp_path / "ph.db") as s:
            yield s


class TestStore:
    def test_live_is_the_held_subset(self, store: Store) -> None:
        """live() returns exactly the ids the store holds."""
        store.put_source(Source("a", "config_read"), "A")
        store.put_source(Source("b", "user_turn"), "B")
        assert store.live(["a", "b", "c"]) == {"a", "b"}
        assert store.live([]) == frozenset()

    def test_evict_makes_a_source_dead(self, store: Store) -> None:
        """After evict(), the source is no longer live and cannot be given back."""
        store.put_source(Source("a", "config_read"), "A")
        assert store.evict("a") is True
        assert store.evict("a") is False
        assert store.live(["a"]) == frozenset()
        assert store.get_source("a") is None

    def test_gives_the_original_back(self, store: Store) -> None:
        """get_source returns the text that was put."""
        store.put_source(Source("a", "config_read"), "retry_ceiling: 7")
        assert store.get_source("a") == "retry_ceiling: 7"

    def test_summaries_are_kept_per_window_in_order(self, store: Store) -> None:
        """summaries() returns a window's most recent summaries, oldest first, with provenance."""
        for i in range(3):
            region = Region(
                id=f"s{i}",
                depth=i + 1,
                sources=frozenset({"a", f"t{i}"}),
                source_kinds=frozenset({"config_read"}),
            )
            store.put_summary("w", region, f"text {i}")
        store.put_summary("other", Region(id="x", depth=1), "other text")
        got = store.summaries("w", 2)
        assert [(r.id, r.depth, t) for r, t in got] == [("s1", 2, "text 1"), ("s2", 3, "text 2")]
        assert got[0][0].sources == {"a", "t1"}

    def test_concurrent_threads(self, store: Store) -> None:
        """Eight threads putting, checking and evicting lose nothing and raise nothing."""
        errors: list[BaseException] = []

        def work(n: int) -> None:
            try:
                for i in range(100):
                    store.put_source(Source(f"{n}-{i}", "tool_output"), f"text {n} {i}")
                    assert store.live([f"{n}-{i}"]) == {f"{n}-{i}"}
                    if i % 2:
                        store.evict(f"{n}-{i}")
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == []
        ids = [f"{n}-{i}" for n in range(8) for i in range(100)]
        assert len(store.live(ids)) == 8 * 50


class TestSQLite:
    def test_survives_restart(self, tmp_path: Path) -> None:
        """Sources and summaries outlive the process: a new guard on the same file decides the same."""
        path = tmp_path / "ph.db"
        first = Guard(store=SQLiteStore(path))
        cfg = first.record_source("config: retry_ceiling = 7 for deploys", "config_read", "cfg-1")
        s = first(lambda t: "Summary: retry ceiling is 7, from config.", summarizer="s")
        out = s("config: retry_ceiling = 7 for deploys")
        first.store.close()  # type: ignore[attr-defined]

        second = Guard(store=SQLiteStore(path))  # a restarted process
        assert second.store.get_source(cfg.id) == "config: retry_ceiling = 7 for deploys"
        decision = second.check(out, summarizer="s")
        assert (decision.effect, decision.depth) == ("allow", 1)
        second.store.evict("cfg-1")
        with pytest.raises(UnsafeRecompactionError) as refused:
            second.check(out, summarizer="s", enforce=True)
        assert refused.value.dead_sources == ("cfg-1",)

    def test_one_statement_per_liveness_lookup(self, tmp_path: Path) -> None:
        """live() over 1,000 sources is a single SQL statement: one round-trip per decision."""
        store = SQLiteStore(tmp_path / "ph.db")
        for i in range(1000):
            store.put_source(Source(f"s{i}", "tool_output"), "x")
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        assert len(store.live([f"s{i}" for i in range(1000)])) == 1000
        assert len(statements) == 1

    def test_bad_path_is_a_clear_error(self, tmp_path: Path) -> None:
        """A store path in a missing folder fails at construction, naming the problem."""
        with pytest.raises(sqlite3.OperationalError, match="unable to open"):
            SQLiteStore(tmp_path / "missing" / "ph.db")
