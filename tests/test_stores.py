"""Stores: liveness, eviction, durability across restarts, and concurrent use."""

from __future__ import annotations

import shutil
import sqlite3
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Literal

import deep
import pytest
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, rule
from store_contract import MakeStore, Reopen, StoreContract, summary

from policyhook import (
    Guard,
    MemoryStore,
    Source,
    SourceIdConflictError,
    SQLiteStore,
    UnsafeRecompactionError,
)
from policyhook._errors import StoreUnavailableError
from policyhook._provenance import anchor_of, digest, encode, text_id
from policyhook.stores import Store, _inherited, open_store


class TestMemoryStoreContract(StoreContract):
    @pytest.fixture
    def make_store(self) -> MakeStore:
        return MemoryStore

    @pytest.fixture
    def reopen(self) -> Reopen:
        return lambda store: store  # process-local: every handle is the store itself


class TestSQLiteStoreContract(StoreContract):
    @pytest.fixture
    def make_store(self, tmp_path: Path) -> Iterator[MakeStore]:
        opened: list[SQLiteStore] = []

        def make(**options: Any) -> SQLiteStore:
            opened.append(SQLiteStore(tmp_path / f"ph{len(opened)}.db", **options))
            return opened[-1]

        yield make
        for s in opened:
            s.close()

    @pytest.fixture
    def reopen(self) -> Iterator[Reopen]:
        opened: list[SQLiteStore] = []

        def again(store: Store) -> SQLiteStore:
            assert isinstance(store, SQLiteStore)
            opened.append(SQLiteStore(store.path, ttl=store.ttl))
            return opened[-1]

        yield again
        for s in opened:
            s.close()


class TestMemoryStoreBounds:
    def test_max_sources_evicts_oldest_with_tombstones(self) -> None:
        """Past max_sources, the oldest sources are evicted and known as evicted."""
        store = MemoryStore(max_sources=3)
        for i in range(5):
            store.put_source(Source(f"s{i}", "tool_output"), f"text {i}")
        assert store.live([f"s{i}" for i in range(5)]) == {"s2", "s3", "s4"}
        assert store.states(["s0", "s1", "s9"]) == {"s0": "evicted", "s1": "evicted"}

    def test_summary_texts_are_bounded_but_stay_known(self) -> None:
        """Past max_sources summary texts, the oldest text is dropped and its entry kept."""
        store = MemoryStore(max_sources=2)
        entries = [summary(store, f"summary number {i} text") for i in range(4)]
        for i, e in enumerate(entries):
            store.put_summary(e, f"summary number {i} text")
        assert [t for _, t in store.summaries("w", 10)] == [
            "summary number 2 text",
            "summary number 3 text",
        ]
        assert store.lookup([entries[0].digest]) == {entries[0].digest: entries[0]}

    def test_bad_bounds_are_clear_errors(self) -> None:
        """max_sources < 1 and ttl <= 0 are refused, naming the parameter and value."""
        with pytest.raises(ValueError, match='"max_sources" must be >= 1: 0'):
            MemoryStore(max_sources=0)
        with pytest.raises(ValueError, match='"ttl" must be > 0 seconds: -1'):
            MemoryStore(ttl=-1)
        with pytest.raises(ValueError, match='"max_tombstones" must be >= 0: -1'):
            MemoryStore(max_tombstones=-1)

    @pytest.mark.parametrize(
        ("ttl", "message"),
        [(float("nan"), '"ttl" must be > 0 seconds: nan'), (float("inf"), '"ttl" must be finite')],
    )
    def test_a_ttl_that_is_no_number_of_seconds_is_refused(
        self, tmp_path: Path, ttl: float, message: str
    ) -> None:
        """NaN passes `ttl <= 0`: before, MemoryStore then read every source dead at once and
        SQLiteStore every source live for ever (its NaN expiry stored as NULL)."""
        with pytest.raises(ValueError, match=message):
            MemoryStore(ttl=ttl)
        with pytest.raises(ValueError, match=message):
            SQLiteStore(tmp_path / "ph.db", ttl=ttl)

    def test_tombstones_are_bounded_and_the_oldest_forgotten_is_still_dead(self) -> None:
        """Past max_tombstones the oldest tombstone goes with its entry: the id is unknown but
        never live again, and its text is new evidence; newer tombstones still say evicted."""
        store = MemoryStore(max_sources=2, max_tombstones=2)
        for i in range(6):
            store.put_source(Source(f"s{i}", "tool_output"), f"the text of source number {i}")
        assert store.states([f"s{i}" for i in range(6)]) == {
            "s2": "evicted",
            "s3": "evicted",
            "s4": "live",
            "s5": "live",
        }
        assert store.live(["s0", "s1"]) == frozenset()
        old = digest(store.secret(), encode("the text of source number 0"))
        assert store.lookup([old]) == {}
        anchor = anchor_of(store.secret(), encode("the text of source number 0"))
        assert anchor is not None
        assert {e.id for e in store.by_anchor([anchor])} == {"s2", "s3", "s4", "s5"}

    def test_a_text_still_held_under_another_id_stays_known_when_one_is_forgotten(self) -> None:
        """A text put under two ids, the later one evicted and its tombstone forgotten: the text
        is still held under the earlier id, so its entry goes to that id, never dropped (a
        guard would no longer recognise a live source's text, found only as new content)."""
        store = MemoryStore(max_sources=3, max_tombstones=0)
        text = "retry ceiling 7 for the deploy job, from deploy.yaml"
        store.put_source(Source("first", "config_read"), text)
        store.put_source(Source("second", "tool_output"), text)
        key = digest(store.secret(), encode(text))
        assert store.lookup([key])[key].id == "second"  # found under the later id
        assert store.evict("second") and store.states(["second"]) == {}  # forgotten at once
        entry = store.lookup([key])[key]
        assert (entry.id, entry.kind, entry.sources) == ("first", "config_read", ("first",))
        anchor = anchor_of(store.secret(), encode(text))
        assert anchor is not None and [e.id for e in store.by_anchor([anchor])] == ["first"]
        _, written = store.since(0, 100)
        assert any(e.digest == key and e.id == "first" for e, _ in written)  # others catch up
        guard = Guard(store=store)
        region = guard.provenance([f"the agent read: {text}"])
        assert "first" in region.sources and region.depth == 0
        assert store.evict("first")  # no id holds it now: forgotten with it, as a lone text is
        assert store.lookup([key]) == {} and store._shared == {}

    def test_a_long_run_stays_bounded(self) -> None:
        """20,000 rounds of new sources, evictions, re-puts and summaries: every structure of
        the store stays within its bound except one small entry per summary made, and every
        summary made is still recognised as one."""
        store = MemoryStore(max_sources=50)
        made = []
        for i in range(20_000):
            sid = text_id("s", f"tool output number {i}", store.secret())  # names its text
            store.put_source(Source(sid, "tool_output"), f"tool output number {i}")
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")  # re-put
            if i % 3 == 0:
                store.evict(sid)
            if i % 100 == 0:
                text = f"summary number {i} of the run"
                entry = summary(store, text, sources=(sid,))
                store.put_summary(entry, text, [("n", (sid,))])
                made.append(entry)
        sizes = {
            name: len(getattr(store, name))
            for name in ("_held", "_dead", "_texts", "_facts", "_named", "_retired", "_shared")
        }
        assert sizes == {
            "_held": 50,
            "_dead": 50,
            "_texts": 50,
            "_facts": 50,
            "_named": 100,
            "_retired": 4096,
            "_shared": 0,
        }
        assert len(store._entries) == len(store._order) <= 50 + 50 + len(made) + 1
        assert len(store._of_source) <= 50 + 50 + 1
        assert len(store._log_seqs) == len(store._log_digests) <= 2 * len(store._order) + 1024
        assert sum(len(store._anchored(a)) for a in store._by_anchor) <= len(store._entries)
        found = store.lookup([e.digest for e in made])
        assert len(found) == len(made) and all(e.depth == 1 for e in found.values())
        _, every = store.since(0, 100_000)
        assert len(every) == len(store._entries)  # each entry once, none forgotten listed


class TestMemoryStoreIds:
    """A bounded MemoryStore's record of the ids it held: what it remembers, and past its bound."""

    def test_a_forgotten_tombstones_id_still_names_its_text(self) -> None:
        """Past max_tombstones the tombstone and entry go, the id and its text's digest stay:
        another text under it is refused, the same text revives it."""
        store = MemoryStore(max_sources=1, max_tombstones=0)
        store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        store.evict("cfg")
        assert store.states(["cfg"]) == {}  # forgotten: unknown
        with pytest.raises(SourceIdConflictError, match="'cfg' already names another text"):
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 5")
        store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        assert store.get_source("cfg") == "retry_ceiling: 7"

    def test_past_max_ids_only_ids_naming_their_text_are_taken(self) -> None:
        """Once an id fell off the record (max_ids), an id the store does not know may be one
        it forgot: refused (fail closed), naming the bound; ids derived from the text (kind or
        prefix + keyed digest) and the ledger's ids of unrecognised content are still taken."""
        store = MemoryStore(max_sources=1, max_tombstones=0, max_ids=1)
        store.put_source(Source("a", "tool_output"), "text of a")
        store.put_source(Source("b", "tool_output"), "text of b")  # evicts a: retired
        store.put_source(Source("c", "tool_output"), "text of c")  # retires b, drops a
        with pytest.raises(SourceIdConflictError, match=r"'a' is not known .*max_ids=1"):
            store.put_source(Source("a", "tool_output"), "another text of a")
        with pytest.raises(SourceIdConflictError, match="'new' is not known"):
            store.put_source(Source("new", "tool_output"), "a new text")
        with pytest.raises(SourceIdConflictError, match="'b' already names another text"):
            store.put_source(Source("b", "tool_output"), "another text of b")
        derived = text_id("tool_output", "a new text", store.secret())
        store.put_source(Source(derived, "tool_output"), "a new text")
        assert store.get_source(derived) == "a new text"
        gap = f"window:{'0' * 16}"
        store.put_source(Source(gap, "window"), "unrecognised content")
        assert store.get_source(gap) == "unrecognised content"
        with pytest.raises(SourceIdConflictError, match="is not known"):  # not a derived id
            store.put_source(Source(f"x:{derived[-16:]}", "tool_output"), "a third text")

    def test_a_guard_on_a_reused_forgotten_id_never_allows(self) -> None:
        """The wrong allow past every bound: a summary of cfg's first text, cfg's tombstone
        forgotten, cfg registered again with another text: refused at registration, and the
        summary is still refused (cfg dead)."""
        guard = Guard(store=MemoryStore(max_sources=1, max_tombstones=0, max_ids=1))
        guard.record_source("retry_ceiling: seven, from the config", "config_read", "cfg")
        summarize = guard(lambda t: "Summary: the retry ceiling is seven.", summarizer="s")
        out = summarize("retry_ceiling: seven, from the config")
        for i in range(3):  # cfg evicted, its tombstone and then its id forgotten
            guard.record_source(f"turn number {'x' * i}", "user_turn")
        for text in ("retry_ceiling: five, from the config", "retry_ceiling: seven, from it"):
            with pytest.raises(SourceIdConflictError):
                guard.record_source(text, "config_read", "cfg")
        with pytest.raises(UnsafeRecompactionError):
            guard.check(out, summarizer="s", enforce=True)

    def test_bad_max_ids_is_a_clear_error(self) -> None:
        """max_ids < 0 is refused, naming the parameter and value."""
        with pytest.raises(ValueError, match='"max_ids" must be >= 0: -1'):
            MemoryStore(max_ids=-1)


class TestSQLite:
    def test_liveness_cache_stays_bounded(self, tmp_path: Path) -> None:
        """A long run of new ids (here 70,000 asked at once) leaves at most 65,536 in the
        liveness cache after the next read, which still answers exactly."""
        store = SQLiteStore(tmp_path / "ph.db")
        store.put_source(Source("a", "tool_output"), "text a")
        store.put_source(Source("b", "tool_output"), "text b")
        assert store.live([f"new-{i}" for i in range(70_000)] + ["a"]) == {"a"}
        assert store.live(["a", "b", "new-1"]) == {"a", "b"}
        assert len(store._expiry) <= 65_536
        store.close()

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

    def test_liveness_cache_starts_over_with_a_new_connection(self, tmp_path: Path) -> None:
        """A forked child's connection counts data_version from its own start, so liveness
        cached under the parent's count is dropped: else a source another process evicted
        meanwhile would still read as live (a wrong allow)."""
        store = SQLiteStore(tmp_path / "ph.db")
        store.put_source(Source("s1", "tool_output"), "the original")
        assert store.live(["s1"]) == {"s1"}
        assert store.view(0, 1, [], ["s1"]).live == {"s1"}
        with SQLiteStore(tmp_path / "ph.db") as other:
            other.evict("s1")
        store._after_fork()  # what a forked child runs: a new connection, a new lock
        assert store.live(["s1"]) == frozenset()
        assert store.view(0, 1, [], ["s1"]).live == frozenset()
        store.close()

    def test_checkpoints_come_every_4096_wal_pages_on_every_connection(
        self, tmp_path: Path
    ) -> None:
        """SQLite's default (1,000 pages) put a checkpoint in 1 of ~55 agent-loop calls (its
        p99); the interval holds on a forked child's new connection too."""
        store = SQLiteStore(tmp_path / "ph.db")
        assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 4096
        store._after_fork()
        assert store._db.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == 4096
        store.close()

    def test_a_decision_asks_only_the_ids_its_cache_lacks(self, tmp_path: Path) -> None:
        """A view asks SQLite only for ids it has not cached (a rolling chain's k sources are k
        dictionary reads, not a k-row join); after another connection's commit, the same one
        statement brings the source rows written since (here one), not every id again."""
        store = SQLiteStore(tmp_path / "ph.db")
        ids = [f"s{i}" for i in range(50)]
        for i in ids:
            store.put_source(Source(i, "tool_output"), f"text {i}")
        store._expiry.clear()
        asked: list[str] = []
        store._db.set_trace_callback(asked.append)
        assert store.view(0, 1, [], ids).live == set(ids)
        assert store.view(0, 1, [], [*ids, "new"]).live == set(ids)
        first, second = [s for s in asked if "WITH RECURSIVE" in s]
        asks = [s.split("SELECT value FROM json_each(")[1] for s in (first, second)]
        assert all(f'"{i}"' in asks[0] for i in ids)  # the cache was empty: every id
        assert asks[1].startswith("""'["new"]')""")  # then only the one it lacked
        seen = store._changes
        with SQLiteStore(tmp_path / "ph.db") as other:
            other.evict("s7")  # commits one change
        asked.clear()
        assert store.view(0, 1, [], ids).live == set(ids) - {"s7"}
        assert "json_each" not in asked[0]  # nothing missing, and nothing asked again
        assert len([s for s in asked if not s.startswith("-- ")]) == 1
        assert store._changes == seen + 1
        store.close()

    def test_one_statement_per_liveness_lookup(self, tmp_path: Path) -> None:
        """live() over 1,000 sources is one statement, asking every id while none is cached
        and then only the source rows written since (no PRAGMA first); another connection's
        eviction is seen at once."""
        store = SQLiteStore(tmp_path / "ph.db")
        for i in range(1000):
            store.put_source(Source(f"s{i}", "tool_output"), "x")
        store._expiry.clear()
        statements: list[str] = []
        store._db.set_trace_callback(statements.append)
        ids = [f"s{i}" for i in range(1000)]
        assert len(store.live(ids)) == 1000
        queries = [s for s in statements if not s.startswith("-- ")]
        assert len(queries) == 1 and "json_each" in queries[0]
        statements.clear()
        assert len(store.live(ids)) == 1000
        assert len(statements) == 1 and "json_each" not in statements[0]
        with SQLiteStore(tmp_path / "ph.db") as other:
            other.evict("s7")
        assert len(store.live(ids)) == 999 and "s7" not in store.live(ids)
        store.close()

    def test_bad_path_is_a_clear_error(self, tmp_path: Path) -> None:
        """A store path in a missing folder fails at construction, naming the problem."""
        with pytest.raises(sqlite3.OperationalError, match="unable to open"):
            SQLiteStore(tmp_path / "missing" / "ph.db")

    def test_bad_ttl_is_a_clear_error(self, tmp_path: Path) -> None:
        """ttl <= 0 is refused, naming the parameter and value."""
        with pytest.raises(ValueError, match='"ttl" must be > 0 seconds: 0'):
            SQLiteStore(tmp_path / "ph.db", ttl=0)

    @pytest.mark.parametrize(("synchronous", "level"), [("NORMAL", 1), ("FULL", 2)])
    def test_synchronous_is_every_connections(
        self, tmp_path: Path, synchronous: Literal["NORMAL", "FULL"], level: int
    ) -> None:
        """`synchronous` is SQLite's on the store's connection, and on the one a forked child
        makes (FULL: a commit is on disk before the call returns, so a power loss cannot take
        a recorded summary back and leave it reading as an original)."""
        store = open_store(f"sqlite:///{tmp_path / 'ph.db'}", synchronous=synchronous)
        assert isinstance(store, SQLiteStore)
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == level
        store._after_fork()  # what a forked child runs first
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == level
        store.close()

    def test_a_url_carries_the_stores_options(self, tmp_path: Path) -> None:
        """`sqlite:///path?synchronous=FULL&ttl=60`, for places that take a URL only
        ($POLICYHOOK_STORE, --store): the file is the path before the query."""
        store = open_store(f"sqlite://{tmp_path}/ph.db?synchronous=full&ttl=60")
        assert isinstance(store, SQLiteStore)
        assert (store.path, store.synchronous, store.ttl) == (tmp_path / "ph.db", "FULL", 60.0)
        assert store._db.execute("PRAGMA synchronous").fetchone()[0] == 2
        store.close()
        assert [p.name for p in tmp_path.iterdir() if p.suffix == ".db"] == ["ph.db"]

    @pytest.mark.parametrize(
        ("query", "message"),
        [
            ("synchronus=FULL", "unknown option 'synchronus' .*takes synchronous and ttl"),
            ("ttl=soon", "ttl must be seconds: 'soon'"),
            ("ttl", "'ttl' is not name=value"),
            ("ttl=", "'ttl=' is not name=value"),
            ("ttl=1&ttl=2", "'ttl' is given twice"),
            ("synchronous=OFF", '"synchronous" must be "NORMAL" or "FULL": \'OFF\''),
            ("ttl=nan", '"ttl" must be > 0 seconds: nan'),
        ],
    )
    def test_a_bad_url_option_is_a_clear_error(
        self, tmp_path: Path, query: str, message: str
    ) -> None:
        """A misspelt or malformed option is refused, naming the URL and the option (ignored,
        `synchronus=FULL` would leave commits a power loss takes back), and no file is made."""
        url = f"sqlite:///{tmp_path / 'ph.db'}?{query}"
        with pytest.raises(ValueError, match=message):
            open_store(url)
        with pytest.raises(ValueError, match="'synchronous' is given twice"):
            open_store(f"sqlite:///{tmp_path / 'ph.db'}?synchronous=FULL", synchronous="FULL")
        assert list(tmp_path.iterdir()) == []

    def test_bad_synchronous_is_a_clear_error(self, tmp_path: Path) -> None:
        """Another level (OFF would lose commits to a crashed OS) is refused before the file is
        made, naming the option and value."""
        with pytest.raises(ValueError, match='"synchronous" must be "NORMAL" or "FULL": \'OFF\''):
            SQLiteStore(tmp_path / "ph.db", synchronous="OFF")  # type: ignore[arg-type]
        assert not (tmp_path / "ph.db").exists()

    def test_schema_1_file_is_migrated(self, tmp_path: Path) -> None:
        """A store file written before normalisation keeps its sources and summaries."""
        path = tmp_path / "old.db"
        db = sqlite3.connect(path)
        db.executescript(
            """
            CREATE TABLE sources (id TEXT PRIMARY KEY, kind TEXT NOT NULL, text TEXT NOT NULL);
            CREATE TABLE summaries (
                id TEXT NOT NULL, window TEXT NOT NULL, depth INTEGER NOT NULL,
                sources TEXT NOT NULL, source_kinds TEXT NOT NULL, text TEXT NOT NULL,
                PRIMARY KEY (window, id));
            INSERT INTO sources VALUES ('cfg', 'config_read', 'config: retry_ceiling = 7');
            INSERT INTO summaries VALUES ('s:1', 'w', 2, '["cfg", "t1"]', '["config_read"]',
                                          'Summary: retry ceiling is 7.');
            """
        )
        db.commit()
        db.close()
        with SQLiteStore(path) as store:
            assert store.get_source("cfg") == "config: retry_ceiling = 7"
            [(region, text)] = store.summaries("w", 10)
            assert (region.id, region.depth, set(region.sources), text) == (
                "s:1",
                2,
                {"cfg", "t1"},
                "Summary: retry ceiling is 7.",
            )
            assert store.window_depth("w") == 2
        with SQLiteStore(path) as again:  # migrating twice is a no-op
            assert len(again.summaries("w", 10)) == 1

    def test_schema_2_file_gains_fact_provenance(self, tmp_path: Path) -> None:
        """A version-2 file (before per-fact provenance) is migrated on open, data kept."""
        path = tmp_path / "v2.db"
        with SQLiteStore(path) as store:
            store.put_source(Source("cfg", "config_read"), "retry_ceiling: 7")
        db = sqlite3.connect(path)
        db.executescript("DROP TABLE facts; PRAGMA user_version = 2;")
        db.close()
        with SQLiteStore(path) as store:
            assert store._db.execute("PRAGMA user_version").fetchone()[0] == 5
            assert store.get_source("cfg") == "retry_ceiling: 7"
            entry = summary(store, "retries are capped at 7", sources=("cfg",))
            store.put_summary(entry, "retries are capped at 7", [("n:7", ("cfg",))])
            assert store.facts([entry.id]) == {entry.id: [("n:7", ("cfg",))]}

    def test_schema_3_file_learns_the_text_each_id_names(self, tmp_path: Path) -> None:
        """A version-3 file (sources without their text's digest) is migrated on open: a held
        source names its text, a tombstone the one text the entries know under its id, and a
        tombstone whose id held two texts (the earlier versions let an id be given another
        text) takes no text again: none can be shown to be what its summaries were made of."""
        path = tmp_path / "v3.db"
        with SQLiteStore(path) as store:
            store.put_source(Source("held", "config_read"), "retry_ceiling: 7")
            store.put_source(Source("gone", "config_read"), "timeout: 30")
            store.evict("gone")
            store.put_source(Source("twice", "config_read"), "first text")
            store.evict("twice")
        db = sqlite3.connect(path)
        db.executescript(
            f"""
            INSERT INTO entries (digest, id, depth, kind, size, anchor, parents, direct,
                source_kinds, window) VALUES ('{"f" * 32}', 'twice', 0, 'config_read', 11,
                NULL, '[]', '["twice"]', '["config_read"]', '');
            ALTER TABLE sources DROP COLUMN digest;
            PRAGMA user_version = 3;
            """
        )
        db.close()
        for _ in range(2):  # migrating once, then opening a version-5 file
            with SQLiteStore(path) as store:
                assert store._db.execute("PRAGMA user_version").fetchone()[0] == 5
                for source_id, state in (("held", "live"), ("gone", "evicted")):
                    with pytest.raises(SourceIdConflictError, match=f"now {state}"):
                        store.put_source(Source(source_id, "config_read"), "another text")
                for text in ("first text", "second text"):
                    with pytest.raises(SourceIdConflictError, match="cannot identify"):
                        store.put_source(Source("twice", "config_read"), text)
                store.put_source(Source("held", "config_read"), "retry_ceiling: 7")
                store.put_source(Source("gone", "config_read"), "timeout: 30")
                assert store.live(["held", "gone", "twice"]) == {"held", "gone"}
                store.evict("gone")

    def test_newer_schema_is_refused(self, tmp_path: Path) -> None:
        """A file written by a newer policyhook is refused, never downgraded."""
        path = tmp_path / "new.db"
        SQLiteStore(path).close()
        db = sqlite3.connect(path)
        db.execute("PRAGMA user_version = 99")
        db.close()
        with pytest.raises(StoreUnavailableError, match=r"version 99 .*upgrade policyhook"):
            SQLiteStore(path)


class _Clock:
    """A clock `policyhook.stores` reads instead of `time` (expiry without waiting)."""

    def __init__(self) -> None:
        self.now = 1_000_000.0

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


def _two(path: Path, ttl: float | None = None) -> tuple[SQLiteStore, SQLiteStore]:
    """Two connections on one file, each with a warm liveness cache of nothing yet."""
    return SQLiteStore(path), SQLiteStore(path, ttl=ttl)


class TestAnotherConnectionsWrites:
    """A liveness cache brought up to date by the source rows written since it last looked
    (schema 5's change numbers) is exact: what another connection did is seen on the very
    next lookup, by `live` and by `view`, never a lookup later."""

    def test_an_eviction_is_seen_dead_at_once(self, tmp_path: Path) -> None:
        """Warm on both paths, then another connection evicts: the next `live` and the next
        `view` (a frozenset: the everlasting shortcut) say dead (else a wrong allow)."""
        mine, other = _two(tmp_path / "ph.db")
        ids = frozenset(f"s{i}" for i in range(20))
        for i in sorted(ids):
            mine.put_source(Source(i, "tool_output"), f"text {i}")
        assert mine.live(ids) == ids and mine.view(0, 1, [], ids).live == ids
        other.evict("s3")
        assert mine.live(ids) == ids - {"s3"}
        other.evict("s4")
        assert mine.view(0, 1, [], ids).live == ids - {"s3", "s4"}
        assert mine.live(ids) == ids - {"s3", "s4"}

    def test_a_hand_made_delete_is_refused(self, tmp_path: Path) -> None:
        """A DELETE leaves no change number for another connection's cache to read, so it
        would go on answering the id live (a wrong allow): the file refuses it, the row stays
        and the other connection still sees it held; evicting is the way, and is seen."""
        mine, other = _two(tmp_path / "ph.db")
        mine.put_source(Source("s1", "tool_output"), "text s1")
        assert other.live(["s1"]) == {"s1"}
        db = sqlite3.connect(tmp_path / "ph.db", isolation_level=None)
        with pytest.raises(sqlite3.IntegrityError, match=r"never deleted.*evict"):
            db.execute("DELETE FROM sources WHERE id = 's1'")
        with pytest.raises(sqlite3.IntegrityError, match="never deleted"):
            db.execute("DELETE FROM sources")
        assert db.execute("SELECT count(*) FROM sources").fetchone()[0] == 1
        db.close()
        assert other.live(["s1"]) == {"s1"} and mine.get_source("s1") == "text s1"
        mine.evict("s1")
        assert other.live(["s1"]) == frozenset()

    def test_a_hand_made_rename_is_refused(self, tmp_path: Path) -> None:
        """Renamed by hand, a source's old id would vanish with no change under it: another
        connection would go on answering it live (a wrong allow). The file refuses it, in a
        schema-5 file made before the refusal too; writing the row under its own id is seen."""
        mine = SQLiteStore(tmp_path / "ph.db")
        mine.put_source(Source("a", "tool_output"), "text a")
        db = sqlite3.connect(tmp_path / "ph.db", isolation_level=None)
        db.execute("DROP TRIGGER sources_named")  # as policyhook 5 left the file
        SQLiteStore(tmp_path / "ph.db").close()  # any later open makes it again
        assert mine.live(["a"]) == {"a"}
        with pytest.raises(sqlite3.IntegrityError, match="keeps its id"):
            db.execute("UPDATE sources SET id = 'b' WHERE id = 'a'")
        assert mine.live(["a", "b"]) == {"a"}
        db.execute("UPDATE sources SET id = 'a', text = NULL, state = 'evicted' WHERE id = 'a'")
        db.close()
        assert mine.live(["a"]) == frozenset()

    def test_a_put_is_seen_live_at_once(self, tmp_path: Path) -> None:
        """An id cached as not held (asked before it was put) is live once another
        connection puts it."""
        mine, other = _two(tmp_path / "ph.db")
        assert mine.live(["a", "b"]) == frozenset()
        assert mine.view(0, 1, [], frozenset({"a", "b"})).live == frozenset()
        other.put_source(Source("a", "tool_output"), "text a")
        assert mine.live(["a", "b"]) == {"a"}
        other.put_source(Source("b", "tool_output"), "text b")
        assert mine.view(0, 1, [], frozenset({"a", "b"})).live == {"a", "b"}

    def test_a_re_registration_after_an_eviction_is_seen(self, tmp_path: Path) -> None:
        """Evicted by one connection, put again by another (a REPLACE of the row that held
        the newest change number), then evicted again: each is seen. Numbering changes by
        `max(change) + 1` went backwards on the REPLACE and missed the revival."""
        mine, other = _two(tmp_path / "ph.db")
        mine.put_source(Source("a", "tool_output"), "text a")
        mine.put_source(Source("b", "tool_output"), "text b")
        assert mine.live(["a", "b"]) == {"a", "b"}
        other.evict("b")
        assert mine.live(["a", "b"]) == {"a"}
        other.put_source(Source("b", "tool_output"), "text b")
        assert mine.live(["a", "b"]) == {"a", "b"}
        assert mine.view(0, 1, [], frozenset({"a", "b"})).live == {"a", "b"}
        other.evict("b")
        assert mine.view(0, 1, [], frozenset({"a", "b"})).live == {"a"}

    def test_an_expiry_another_connection_set_is_kept(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """A source cached as held for good, put again by a connection with a TTL: the cache
        learns its expiry, so it is dead once the TTL passes, with no write in between."""
        clock = _Clock()
        monkeypatch.setattr("policyhook.stores.time", clock)
        mine, other = _two(tmp_path / "ph.db", ttl=10.0)
        mine.put_source(Source("a", "tool_output"), "text a")
        assert mine.view(0, 1, [], frozenset({"a"})).live == {"a"}
        other.put_source(Source("a", "tool_output"), "text a")
        clock.now += 5
        assert mine.live(["a"]) == {"a"}
        clock.now += 6
        assert mine.live(["a"]) == frozenset()
        assert mine.view(0, 1, [], frozenset({"a"})).live == frozenset()

    def test_far_behind_the_cache_starts_over_exactly(self, tmp_path: Path) -> None:
        """More changes since the cache last looked than it re-reads at once (1,024): it is
        dropped and every id asked is read again, in the same statement."""
        mine, other = _two(tmp_path / "ph.db")
        ids = frozenset(f"s{i}" for i in range(1100))
        for i in sorted(ids):
            mine.put_source(Source(i, "tool_output"), f"text {i}")
        assert mine.view(0, 1, [], ids).live == ids
        for i in sorted(ids)[:1030]:
            other.evict(i)
        expected = ids - set(sorted(ids)[:1030])
        assert mine.view(0, 1, [], ids).live == expected
        other.evict(sorted(expected)[0])
        assert mine.live(ids) == expected - {sorted(expected)[0]}

    def test_ids_given_as_a_list_are_asked_when_not_cached(self, tmp_path: Path) -> None:
        """A list is read once (the cached ones picked in one pass): an id another connection
        put, not cached yet, is still asked, with ids repeated in the list too (a repeat
        must not make the cached ones pass for all of them)."""
        mine, other = _two(tmp_path / "ph.db")
        for i in ("a", "b"):
            mine.put_source(Source(i, "tool_output"), f"text {i}")
        assert mine.live(["a", "b"]) == {"a", "b"}
        other.put_source(Source("c", "tool_output"), "text c")
        assert mine.live(["a", "a", "c"]) == {"a", "c"}
        assert mine.live(("b", "d", "b")) == {"b"}
        other.evict("a")
        assert mine.live(["a", "a", "b", "c"]) == {"b", "c"}

    def test_many_ids_dead_at_once_are_all_seen(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Evictions by another connection of a few and then of most of the ids asked (the
        dead ones picked from those cached as not held, whatever their share), with some
        held until a time among them: each lookup is exact, by `live` and by `view`, and
        once that time passes those are dead too."""
        clock = _Clock()
        monkeypatch.setattr("policyhook.stores.time", clock)
        mine, other = _two(tmp_path / "ph.db", ttl=10.0)
        ids = [f"s{i:03d}" for i in range(400)]
        for i in ids:
            mine.put_source(Source(i, "tool_output"), f"text {i}")
        for i in ids[:5]:  # held until a time, through the connection with a TTL
            other.put_source(Source(i, "tool_output"), f"text {i}")
        assert mine.live(ids) == set(ids)
        dead: set[str] = set()
        for step in (3, 350):
            for i in ids[5 : 5 + step]:
                other.evict(i)
                dead.add(i)
            assert mine.live(ids) == set(ids) - dead
            assert mine.view(0, 1, [], frozenset(ids)).live == set(ids) - dead
        clock.now += 11
        expected = set(ids) - dead - set(ids[:5])
        assert mine.live(ids) == expected
        assert mine.view(0, 1, [], frozenset(ids)).live == expected

    def test_a_writer_that_is_not_policyhook_is_seen(self, tmp_path: Path) -> None:
        """The change number is a trigger's: an UPDATE by hand (or an older policyhook still
        open on the file) is seen like the store's own statements."""
        mine = SQLiteStore(tmp_path / "ph.db")
        mine.put_source(Source("a", "tool_output"), "text a")
        assert mine.live(["a"]) == {"a"}
        db = sqlite3.connect(tmp_path / "ph.db")
        db.execute("UPDATE sources SET text = NULL, state = 'evicted' WHERE id = 'a'")
        db.commit()
        db.close()
        assert mine.live(["a"]) == frozenset()

    def test_a_guard_refuses_after_another_process_evicts(self, tmp_path: Path) -> None:
        """The decision itself: a rolling chain whose oldest turn another connection evicted
        is refused on its next pass."""
        guard = Guard(store=SQLiteStore(tmp_path / "ph.db"))
        other = SQLiteStore(tmp_path / "ph.db")
        words = ["first", "second", "third", "fourth"]
        turns = [f"user turn {w}: the deploy of the {w} service moved" for w in words]
        ids = [guard.record_source(t, kind="user_turn").id for t in turns]
        last = guard(lambda m: "the first pass over the deploys", summarizer="s")([turns[0]])
        for w, turn in zip(words[1:3], turns[1:3], strict=True):
            summarize = guard(lambda m, w=w: f"the {w} pass over the deploys", summarizer="s")
            last = summarize([last, turn])
        other.evict(ids[0])
        with pytest.raises(UnsafeRecompactionError) as refused:
            guard(lambda m: "never called", summarizer="s")([last, turns[3]])
        assert refused.value.dead_sources == (ids[0],)

    def test_a_schema_4_file_is_migrated(self, tmp_path: Path) -> None:
        """A version-4 file (no change numbers) gains them on open, data kept; its rows count
        as unchanged since, and the next write by any connection is seen."""
        path = tmp_path / "v4.db"
        with SQLiteStore(path) as store:
            store.put_source(Source("a", "config_read"), "retry_ceiling: 7")
            store.put_source(Source("b", "config_read"), "timeout: 30")
            store.evict("b")
        db = sqlite3.connect(path)
        db.executescript(
            """
            DROP TRIGGER sources_put; DROP TRIGGER sources_changed; DROP INDEX sources_change;
            ALTER TABLE sources DROP COLUMN change; DELETE FROM meta WHERE key = 'change';
            PRAGMA user_version = 4;
            """
        )
        db.close()
        for _ in range(2):  # migrating once, then opening a version-5 file
            mine, other = SQLiteStore(path), SQLiteStore(path)
            assert mine._db.execute("PRAGMA user_version").fetchone()[0] == 5
            assert mine.states(["a", "b"]) == {"a": "live", "b": "evicted"}
            assert mine.live(["a", "b"]) == {"a"}
            other.evict("a")
            assert mine.live(["a", "b"]) == frozenset()
            other.put_source(Source("a", "config_read"), "retry_ceiling: 7")
            assert mine.view(0, 1, [], frozenset({"a", "b"})).live == {"a"}
            mine.close()
            other.close()


class TestChainLiveness:
    """A rolling chain's older turn that stops being live, through this connection or another,
    refuses the chain's next pass (the liveness cache must not keep answering it held)."""

    @staticmethod
    def chain(guard: Guard, passes: int) -> tuple[list[str], list[str], str]:
        words = ["first", "second", "third", "fourth", "fifth", "sixth"][:passes]
        turns = [f"user turn {w}: the deploy of the {w} service moved" for w in words]
        ids = [guard.record_source(t, kind="user_turn").id for t in turns]
        last = guard(lambda m: "the first pass over the deploys", summarizer="s")([turns[0]])
        for w, turn in zip(words[1:-1], turns[1:-1], strict=True):
            summarize = guard(lambda m, w=w: f"the {w} pass over the deploys", summarizer="s")
            last = summarize([last, turn])
        return turns, ids, last

    def test_an_older_turn_evicted_by_this_connection_is_refused(self, tmp_path: Path) -> None:
        """Evicted through the guard's own store: the next pass is refused."""
        store = SQLiteStore(tmp_path / "ph.db")
        guard = Guard(store=store)
        turns, ids, last = self.chain(guard, 5)
        store.evict(ids[1])
        with pytest.raises(UnsafeRecompactionError) as refused:
            guard(lambda m: "never called", summarizer="s")([last, turns[-1]])
        assert refused.value.dead_sources == (ids[1],)

    def test_an_older_turn_given_a_ttl_elsewhere_expires(
        self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        """Put again by another connection with a TTL: once it passes, the next pass is
        refused, with no write in between."""
        clock = _Clock()
        monkeypatch.setattr("policyhook.stores.time", clock)
        store = SQLiteStore(tmp_path / "ph.db")
        guard = Guard(store=store)
        turns, ids, last = self.chain(guard, 6)
        with SQLiteStore(tmp_path / "ph.db", ttl=10.0) as other:
            other.put_source(Source(ids[2], "user_turn"), turns[2])
        summarize = guard(lambda m: "the sixth pass over the deploys", summarizer="s")
        last = summarize([last, turns[-2]])
        clock.now += 11
        with pytest.raises(UnsafeRecompactionError) as refused:
            guard(lambda m: "never called", summarizer="s")([last, turns[-1]])
        assert refused.value.dead_sources == (ids[2],)


_ID_POOL = [f"s{i}" for i in range(4)]
_IDS = st.sampled_from(_ID_POOL)


class TwoConnections(RuleBasedStateMachine):
    """Two SQLiteStore connections on one file (one with a TTL), random puts, evictions and
    waits through either, liveness asked through either by `live` and by `view`; the oracle
    is a fresh connection's `states`. The re-read bound is lowered to 3 changes, so the cache
    is dropped and refilled too, and `fork` gives a connection a new one (an empty cache)."""

    def __init__(self) -> None:
        super().__init__()
        self.clock = _Clock()
        self.patch = pytest.MonkeyPatch()
        self.patch.setattr("policyhook.stores.time", self.clock)
        self.patch.setattr("policyhook.stores._CHANGES_MAX", 3)
        self.dir = Path(tempfile.mkdtemp(prefix="policyhook-two-"))
        self.path = self.dir / "ph.db"
        self.stores = [SQLiteStore(self.path), SQLiteStore(self.path, ttl=10.0)]

    def teardown(self) -> None:
        for store in self.stores:
            store.close()
        self.patch.undo()
        shutil.rmtree(self.dir)

    @initialize()
    def held(self) -> None:
        """Every id starts held (put through the first connection)."""
        for source_id in _ID_POOL:
            self.put(0, source_id)

    def expected(self, ids: frozenset[str]) -> frozenset[str]:
        with SQLiteStore(self.path) as fresh:
            return frozenset(i for i, state in fresh.states(ids).items() if state == "live")

    @rule(which=st.integers(0, 1), source_id=_IDS)
    def put(self, which: int, source_id: str) -> None:
        self.stores[which].put_source(Source(source_id, "tool_output"), f"text of {source_id}")

    @rule(which=st.integers(0, 1), source_id=_IDS)
    def evict(self, which: int, source_id: str) -> None:
        self.stores[which].evict(source_id)

    @rule(seconds=st.sampled_from([1.0, 6.0, 11.0]))
    def wait(self, seconds: float) -> None:
        self.clock.now += seconds

    @rule(which=st.integers(0, 1))
    def fork(self, which: int) -> None:
        self.stores[which]._after_fork()
        # No fork happened: the connection a child leaves open is this process's to close (a
        # deep run made thousands, and ran out of file descriptors)
        _inherited.pop().close()

    @rule(which=st.integers(0, 1), ids=st.frozensets(_IDS, min_size=1))
    def live(self, which: int, ids: frozenset[str]) -> None:
        assert self.stores[which].live(sorted(ids)) == self.expected(ids)

    @rule(which=st.integers(0, 1), ids=st.frozensets(_IDS, min_size=1))
    def view(self, which: int, ids: frozenset[str]) -> None:
        assert self.stores[which].view(0, 1, [], ids).live == self.expected(ids)


TwoConnections.TestCase.settings = deep.suite(80, 40)
TestTwoConnections = TwoConnections.TestCase
