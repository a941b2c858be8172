"""SQLiteStore's schema 6: the newest changes logged in a small table (`changes`) that every
liveness lookup reads instead of the 10^6-row `sources` (issue 12).

What a user relies on: a file made by policyhook 5 opens and keeps its data; a policyhook 5
handle still open on it goes on seeing every write and being seen; a newer file is refused;
and no writer, hand-made ones included, can make another connection answer a dead source
live (a wrong allow): every write to `sources` is logged by the file's own triggers, the
newest changes cannot be deleted or rewritten, and a reader the log no longer reaches back
to reads every id again.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from policyhook import SQLiteStore, StoreUnavailableError
from policyhook import stores as stores_module
from policyhook._provenance import Source

#: Schema 5's triggers, as policyhook 5 made them (numbering `sources.change`, no log).
_BUMP_5 = (
    "UPDATE meta SET value = value + 1 WHERE key = 'change'; UPDATE sources SET change = "
    "(SELECT value FROM meta WHERE key = 'change') WHERE rowid = NEW.rowid"
)
_TO_SCHEMA_5 = f"""
DROP TRIGGER sources_put; DROP TRIGGER sources_changed; DROP TRIGGER sources_named;
DROP TRIGGER changes_kept; DROP TRIGGER changes_fixed; DROP TABLE changes;
CREATE TRIGGER sources_put AFTER INSERT ON sources BEGIN {_BUMP_5}; END;
CREATE TRIGGER sources_changed AFTER UPDATE OF id, kind, text, expires, state, digest
ON sources BEGIN {_BUMP_5}; END;
PRAGMA user_version = 5;
"""
#: What a policyhook 5 handle reads to catch up (its `_X`) and writes to evict.
_CHANGED_5 = "SELECT change, state, id FROM sources WHERE change > ? ORDER BY change LIMIT 1024"
_EVICT_5 = "UPDATE sources SET text = NULL, state = 'evicted' WHERE id = ? AND state = 'live'"


def _schema_5_file(path: Path) -> None:
    """A schema-5 file: sources a and b put, b evicted, made as policyhook 5 left it."""
    with SQLiteStore(path) as store:
        store.put_source(Source("a", "config_read"), "retry_ceiling: 7")
        store.put_source(Source("b", "config_read"), "timeout: 30")
        store.evict("b")
    db = sqlite3.connect(path)
    db.executescript(_TO_SCHEMA_5)
    db.close()


def _version(store: SQLiteStore) -> int:
    return int(store._db.execute("PRAGMA user_version").fetchone()[0])


class _Handle5:
    """A policyhook 5 handle (its statements, by hand) open on the file: it catches up from
    the change number it last saw through `sources.change`, as policyhook 5 does."""

    def __init__(self, path: Path) -> None:
        self.db = sqlite3.connect(path, isolation_level=None)
        self.seen = int(self.db.execute("SELECT max(change) FROM sources").fetchone()[0])
        self.states: dict[str, str] = {}
        self.catch_up()  # its statements prepared before any upgrade

    def catch_up(self) -> dict[str, str]:
        for change, state, source_id in self.db.execute(_CHANGED_5, (self.seen,)).fetchall():
            self.seen = max(self.seen, change)
            self.states[source_id] = state
        return self.states

    def evict(self, source_id: str) -> None:
        self.db.execute(_EVICT_5, (source_id,))


class TestMigration:
    def test_a_schema_5_file_is_migrated(self, tmp_path: Path) -> None:
        """Opened by this version, a schema-5 file gains the log, data kept; writes by any
        connection are seen at once, and opening it again is a no-op."""
        path = tmp_path / "v5.db"
        _schema_5_file(path)
        for _ in range(2):  # migrating once, then opening a version-6 file
            mine, other = SQLiteStore(path), SQLiteStore(path)
            assert _version(mine) == 6
            assert mine.states(["a", "b"]) == {"a": "live", "b": "evicted"}
            assert mine.live(["a", "b"]) == {"a"}
            other.evict("a")
            assert mine.live(["a", "b"]) == frozenset()
            other.put_source(Source("a", "config_read"), "retry_ceiling: 7")
            assert mine.view(0, 1, [], frozenset({"a", "b"})).live == {"a"}
            mine.close()
            other.close()

    def test_a_policyhook_5_handle_open_through_the_upgrade(self, tmp_path: Path) -> None:
        """A handle of the old version, open before another process upgrades the file: its
        evictions are logged by the file's new triggers (seen by the new handles at once), and
        it still sees theirs through `sources.change`, which schema 6 goes on numbering."""
        path = tmp_path / "v5.db"
        _schema_5_file(path)
        old = _Handle5(path)
        mine = SQLiteStore(path)  # the upgrade
        other = SQLiteStore(path)
        assert _version(mine) == 6
        mine.put_source(Source("c", "tool_output"), "text c")
        assert mine.live(["a", "c"]) == {"a", "c"} == other.live(["a", "c"])
        old.evict("c")
        assert mine.live(["a", "c"]) == {"a"}
        assert other.view(0, 1, [], frozenset({"a", "c"})).live == {"a"}
        other.evict("a")
        mine.put_source(Source("d", "tool_output"), "text d")
        assert old.catch_up() == {"c": "evicted", "a": "evicted", "d": "live"}
        assert mine.live(["a", "c", "d"]) == {"d"}
        old.db.close()
        mine.close()
        other.close()

    @pytest.mark.parametrize("version", [7, 99])
    def test_a_newer_schema_is_refused_by_name(self, tmp_path: Path, version: int) -> None:
        """A file of a later schema is never opened (nor downgraded): the error names the
        file, its version and this version's."""
        path = tmp_path / "new.db"
        SQLiteStore(path).close()
        db = sqlite3.connect(path)
        db.execute(f"PRAGMA user_version = {version}")
        db.close()
        with pytest.raises(StoreUnavailableError) as refused:
            SQLiteStore(path)
        message = str(refused.value)
        assert str(path) in message and f"version {version}" in message
        assert "knows up to 6" in message and "upgrade policyhook" in message


@pytest.fixture
def short_log(monkeypatch: pytest.MonkeyPatch) -> int:
    """Files made while this is in use log only their 4 newest changes; lookups re-read at
    most 8 at once, so a reader 5-7 changes behind is one the log no longer reaches back to
    while its scan would not say so by its length."""
    monkeypatch.setattr(stores_module, "_CHANGES", stores_module._change_log(4))
    monkeypatch.setattr(stores_module, "_CHANGES_MAX", 8)
    return 4


class TestTheLog:
    def test_it_keeps_the_newest_changes(self, tmp_path: Path) -> None:
        """Past `_KEPT` writes (any writer's: a hand-made batch here), the log holds exactly
        the newest `_KEPT`, numbered as `sources.change`."""
        with SQLiteStore(tmp_path / "ph.db") as store:
            db = sqlite3.connect(tmp_path / "ph.db")
            rows = [(f"s{i}", "tool_output", f"text {i}") for i in range(stores_module._KEPT + 50)]
            db.executemany("INSERT INTO sources (id, kind, text) VALUES (?, ?, ?)", rows)
            db.commit()
            count, low, high = db.execute(
                "SELECT count(*), min(change), max(change) FROM changes"
            ).fetchone()
            assert count == stores_module._KEPT and high - low == count - 1
            assert high == db.execute("SELECT max(change) FROM sources").fetchone()[0]
            db.close()
            assert len(store.live([r[0] for r in rows])) == len(rows)

    def test_its_newest_rows_are_never_deleted_or_rewritten(
        self, tmp_path: Path, short_log: int
    ) -> None:
        """A reader that finds no change after its last one takes it that nothing was
        written: a hand-made DELETE or UPDATE of the log would make that false (a wrong
        allow), so the file refuses them; the other connection still sees the eviction."""
        mine, other = SQLiteStore(tmp_path / "ph.db"), SQLiteStore(tmp_path / "ph.db")
        for i in range(6):
            mine.put_source(Source(f"s{i}", "tool_output"), f"text {i}")
        assert mine.live(["s0", "s5"]) == {"s0", "s5"}
        other.evict("s5")
        db = sqlite3.connect(tmp_path / "ph.db", isolation_level=None)
        for statement in (
            "DELETE FROM changes",
            "DELETE FROM changes WHERE change = (SELECT max(change) FROM changes)",
        ):
            with pytest.raises(sqlite3.IntegrityError, match="newest changes are kept"):
                db.execute(statement)
        with pytest.raises(sqlite3.IntegrityError, match="never rewritten"):
            db.execute("UPDATE changes SET state = 'live'")
        assert db.execute("SELECT count(*) FROM changes").fetchone()[0] == short_log
        db.close()
        assert mine.live(["s0", "s5"]) == {"s0"}

    def test_a_source_id_is_never_renamed(self, tmp_path: Path) -> None:
        """Renamed by hand, a source's old id would vanish with no change logged under it:
        another connection would go on answering it live. The file refuses it."""
        mine = SQLiteStore(tmp_path / "ph.db")
        mine.put_source(Source("a", "tool_output"), "text a")
        assert mine.live(["a"]) == {"a"}
        db = sqlite3.connect(tmp_path / "ph.db", isolation_level=None)
        with pytest.raises(sqlite3.IntegrityError, match="keeps its id"):
            db.execute("UPDATE sources SET id = 'b' WHERE id = 'a'")
        db.execute("UPDATE sources SET id = 'a', text = NULL, state = 'evicted' WHERE id = 'a'")
        db.close()
        assert mine.live(["a"]) == frozenset()

    def test_a_reader_the_log_no_longer_reaches_reads_every_id_again(
        self, tmp_path: Path, short_log: int
    ) -> None:
        """More changes since a reader last looked than the log keeps, fewer than a scan
        reads: the reader sees the log does not start right after its last change, drops its
        cache and reads every id again: exact, by `live` and by `view`."""
        mine, other = SQLiteStore(tmp_path / "ph.db"), SQLiteStore(tmp_path / "ph.db")
        ids = [f"s{i}" for i in range(10)]
        for i in ids:
            mine.put_source(Source(i, "tool_output"), f"text {i}")
        assert mine.live(ids) == set(ids) and mine.view(0, 1, [], frozenset(ids)).live == set(ids)
        for i in ids[: short_log + 2]:
            other.evict(i)
        expected = set(ids[short_log + 2 :])
        assert mine.live(ids) == expected
        for i in ids[short_log + 2 :][: short_log + 1]:
            other.evict(i)
            expected.discard(i)
        assert mine.view(0, 1, [], frozenset(ids)).live == expected
        assert mine.live(ids) == expected
