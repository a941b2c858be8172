"""Stores: where original evidence lives so that a summary can be re-derived from it.

A source is live while its store can give it back. The guard asks once per decision, for every
source of the region at once (`live`), so a store costs one round-trip whatever the region's size.
"""

from __future__ import annotations

import json
import sqlite3
import threading
from collections import OrderedDict
from collections.abc import Collection
from pathlib import Path
from typing import Protocol, runtime_checkable

from policyhook.provenance import Region, Source


@runtime_checkable
class Store(Protocol):
    """What the ledger needs from a store. Implementations must be safe for concurrent threads."""

    def put_source(self, source: Source, text: str) -> None:
        """Hold `text` under `source.id` until evicted (re-putting the same id replaces it)."""

    def get_source(self, source_id: str) -> str | None:
        """Give the original back, or None when it is gone."""

    def evict(self, source_id: str) -> bool:
        """Drop a source; it is dead for every later decision. True if it was held."""

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        """The subset of `source_ids` still held, in one lookup."""

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        """The most recently put sources (for recognition after a restart)."""

    def put_summary(self, window: str, region: Region, text: str) -> None:
        """Remember a granted summary of `window` with its provenance."""

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        """The most recent summaries of `window`, oldest first."""


class MemoryStore:
    """A process-local store: for tests, demos and runtimes that keep originals in memory."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._sources: OrderedDict[str, tuple[Source, str]] = OrderedDict()
        self._summaries: dict[str, OrderedDict[str, tuple[Region, str]]] = {}

    def put_source(self, source: Source, text: str) -> None:
        with self._lock:
            self._sources[source.id] = (source, text)
            self._sources.move_to_end(source.id)

    def get_source(self, source_id: str) -> str | None:
        with self._lock:
            held = self._sources.get(source_id)
        return None if held is None else held[1]

    def evict(self, source_id: str) -> bool:
        with self._lock:
            return self._sources.pop(source_id, None) is not None

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        with self._lock:
            return frozenset(s for s in source_ids if s in self._sources)

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        with self._lock:
            return list(self._sources.values())[-limit:]

    def put_summary(self, window: str, region: Region, text: str) -> None:
        with self._lock:
            held = self._summaries.setdefault(window, OrderedDict())
            held[region.id] = (region, text)
            held.move_to_end(region.id)

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        with self._lock:
            return list(self._summaries.get(window, {}).values())[-limit:]


_SCHEMA = """
CREATE TABLE IF NOT EXISTS sources (
    id TEXT PRIMARY KEY, kind TEXT NOT NULL, text TEXT NOT NULL
);
-- rowid order is insertion order: INSERT OR REPLACE gives a replaced row a new, larger rowid.
CREATE TABLE IF NOT EXISTS summaries (
    id TEXT NOT NULL, window TEXT NOT NULL, depth INTEGER NOT NULL, sources TEXT NOT NULL,
    source_kinds TEXT NOT NULL, text TEXT NOT NULL,
    PRIMARY KEY (window, id)
);
"""


class SQLiteStore:
    """The embedded durable store: one SQLite file, survives restarts, safe across threads.

    One connection guarded by a lock: SQLite serialises writers anyway, and a single connection
    keeps every thread's view consistent. WAL lets other processes read while we write.
    """

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._db = sqlite3.connect(self.path, check_same_thread=False, isolation_level=None)
        with self._lock:
            self._db.execute("PRAGMA journal_mode=WAL")
            self._db.execute("PRAGMA synchronous=NORMAL")
            self._db.executescript(_SCHEMA)

    def close(self) -> None:
        with self._lock:
            self._db.close()

    def __enter__(self) -> SQLiteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def put_source(self, source: Source, text: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO sources (id, kind, text) VALUES (?, ?, ?)",
                (source.id, source.kind, text),
            )

    def get_source(self, source_id: str) -> str | None:
        with self._lock:
            row = self._db.execute("SELECT text FROM sources WHERE id = ?", (source_id,)).fetchone()
        return None if row is None else str(row[0])

    def evict(self, source_id: str) -> bool:
        with self._lock:
            return self._db.execute("DELETE FROM sources WHERE id = ?", (source_id,)).rowcount > 0

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        if not source_ids:
            return frozenset()
        with self._lock:
            rows = self._db.execute(
                "SELECT s.id FROM json_each(?) AS j JOIN sources AS s ON s.id = j.value",
                (json.dumps(list(source_ids)),),
            ).fetchall()
        return frozenset(r[0] for r in rows)

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, kind, text FROM sources ORDER BY rowid DESC LIMIT ?", (limit,)
            ).fetchall()
        return [(Source(i, k), t) for i, k, t in reversed(rows)]

    def put_summary(self, window: str, region: Region, text: str) -> None:
        with self._lock:
            self._db.execute(
                "INSERT OR REPLACE INTO summaries VALUES (?, ?, ?, ?, ?, ?)",
                (
                    region.id,
                    window,
                    region.depth,
                    json.dumps(sorted(region.sources)),
                    json.dumps(sorted(region.source_kinds)),
                    text,
                ),
            )

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        with self._lock:
            rows = self._db.execute(
                "SELECT id, depth, sources, source_kinds, text FROM summaries WHERE window = ? "
                "ORDER BY rowid DESC LIMIT ?",
                (window, limit),
            ).fetchall()
        return [
            (
                Region(
                    id=i,
                    depth=d,
                    sources=frozenset(json.loads(s)),
                    source_kinds=frozenset(json.loads(k)),
                    chars=len(t),
                ),
                t,
            )
            for i, d, s, k, t in reversed(rows)
        ]
