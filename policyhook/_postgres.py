"""PostgresStore: the fleet's reference store, one PostgreSQL schema shared by every worker.

Every method is one statement, so one round trip: liveness of any number of sources is
`id = ANY(%s)` on the primary key, recording a summary is one statement that writes the entry and
the window's depth together. Strings the caller gives (ids, kinds, windows, texts) are stored as
their UTF-8 bytes (`bytea`, lone surrogates passed through): PostgreSQL's `text` cannot hold NUL
or lone surrogates, and a store that cannot hold an id cannot tell it is dead.

Faults: each call gets at most `timeout` seconds (pool wait, connect, server-side statement
timeout, and a client-side deadline on the socket, so a hung server cannot hang a decision); a
connection found dead (the server restarted) is replaced and the call retried once within the
same deadline. What still fails raises `StoreUnavailableError`, which the guard turns into "every
source dead" for that decision. psycopg is imported when a store is made, so `policyhook` imports
without the `postgres` extra.
"""

from __future__ import annotations

import functools
import hashlib
import os
import re
import time
from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any, TypeVar

from policyhook._errors import StoreUnavailableError
from policyhook._provenance import (
    Entry,
    FactRecord,
    Region,
    Source,
    SourceIdConflictError,
    State,
    View,
    check_seconds,
)

if TYPE_CHECKING:
    import psycopg
    import psycopg_pool

T = TypeVar("T")

#: The schema version this code writes; older schemas are migrated on open (see `_MIGRATIONS`).
SCHEMA_VERSION = 3
_SCHEMA_NAME = re.compile(r"[a-z_][a-z0-9_]{0,62}")
#: Writers of `entries` serialise on this advisory lock (per schema), so an entry's `seq` order is
#: its commit order and `since` can never step over an entry that commits later.
_LOCK_CLASS = 0x70680001

#: Statements that bring schema version N-1 to N ({s} is the schema name). Never edit one that
#: shipped: add version N+1.
_MIGRATIONS: dict[int, tuple[str, ...]] = {
    1: (
        "CREATE SEQUENCE {s}.seq",
        # A source's text is NULL once evicted or expired: the row is its tombstone.
        """CREATE TABLE {s}.sources (
            id bytea PRIMARY KEY, kind bytea NOT NULL, digest text NOT NULL, text bytea,
            expires timestamptz, state text NOT NULL, seq bigint NOT NULL)""",
        "CREATE INDEX sources_expires ON {s}.sources (expires) WHERE state = 'live' "
        "AND expires IS NOT NULL",
        "CREATE INDEX sources_recent ON {s}.sources (seq) WHERE state = 'live'",
        # One row per text known, normalised like SQLiteStore's (parents + direct sources).
        """CREATE TABLE {s}.entries (
            digest text PRIMARY KEY, seq bigint NOT NULL UNIQUE, id bytea NOT NULL,
            depth integer NOT NULL, kind bytea NOT NULL, size bigint NOT NULL, anchor text,
            parents bytea[] NOT NULL, direct bytea[] NOT NULL, source_kinds bytea[] NOT NULL,
            win bytea NOT NULL, text bytea)""",
        "CREATE INDEX entries_anchor ON {s}.entries (anchor) WHERE anchor IS NOT NULL",
        "CREATE INDEX entries_id ON {s}.entries (id) WHERE depth > 0",
        "CREATE INDEX entries_window ON {s}.entries (win, seq) WHERE depth > 0",
        "CREATE TABLE {s}.windows (win bytea PRIMARY KEY, depth integer NOT NULL)",
    ),
    2: (
        # Per-fact provenance of a summary: each fact with the ids of the sources stating it.
        """CREATE TABLE {s}.facts (
            summary bytea NOT NULL, fact bytea NOT NULL, sources bytea[] NOT NULL,
            PRIMARY KEY (summary, fact))""",
    ),
    # A source id names one text: `put_source` refuses another text under an id whose
    # `sources.digest` (kept since version 1, on tombstones too) differs. No table changes;
    # the version is raised so that code which would still replace an id's text refuses to
    # open the schema ("upgrade policyhook") instead of writing a wrong allow.
    3: (),
}

_ENTRY = (
    "e.digest, e.id, e.depth, e.kind, e.size, e.anchor, e.parents, e.direct, e.source_kinds, e.win"
)
_HELD = "s.state = 'live' AND (s.expires IS NULL OR s.expires > now())"


def _b(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")


def _s(data: bytes | memoryview) -> str:
    return bytes(data).decode("utf-8", "surrogatepass")


def _entry(row: Sequence[Any]) -> Entry:
    d, i, depth, kind, size, anchor, parents, direct, kinds, win = row
    return Entry(
        digest=d,
        id=_s(i),
        depth=depth,
        kind=_s(kind),
        size=size,
        anchor=anchor,
        parents=tuple(map(_s, parents)),
        sources=tuple(map(_s, direct)),
        source_kinds=tuple(map(_s, kinds)),
        window=_s(win),
    )


@functools.cache
def _driver() -> tuple[Any, Any]:
    """psycopg and psycopg_pool, imported on first use, with the deadline-aware connection."""
    try:
        import psycopg
        import psycopg_pool
    except ImportError as exc:
        raise ImportError(
            'PostgresStore needs psycopg 3 and psycopg_pool: pip install "policyhook[postgres]"'
        ) from exc

    class DeadlineConnection(psycopg.Connection[Any]):
        """Waits on the socket no longer than the current call's deadline.

        statement_timeout is enforced by the server: a server that is hung (stopped, partitioned
        with the TCP connection still up) would never enforce it.
        """

        deadline: float | None = None

        def wait(self, gen: Any, interval: float = 0.1, timeout: float | None = None) -> Any:
            if timeout is None and self.deadline is not None:
                timeout = max(0.001, self.deadline - time.monotonic())
            return super().wait(gen, interval, timeout)

    return psycopg, (psycopg_pool, DeadlineConnection)


class PostgresStore:
    """Sources, summaries and tombstones in one PostgreSQL schema, shared by a fleet of workers.

    `dsn`: a libpq connection string or URL. `schema`: the PostgreSQL schema holding the tables
    (created, and migrated to `SCHEMA_VERSION`, on open; several stores can share a database
    under different schemas). `ttl`: seconds after which a source expires (measured on the
    server's clock, from its last put; reads never extend it). `timeout`: seconds any one call
    may take, connecting included. `pool_size`: connections kept (threads of this process).
    Make the store after forking: a pool's connections cannot be shared by two processes.
    """

    def __init__(
        self,
        dsn: str,
        *,
        schema: str = "policyhook",
        ttl: float | None = None,
        timeout: float = 5.0,
        pool_size: int = 4,
    ) -> None:
        if not _SCHEMA_NAME.fullmatch(schema):
            raise ValueError(
                f'"schema" must be a lowercase SQL identifier ([a-z_][a-z0-9_]*): {schema!r}'
            )
        if ttl is not None:
            check_seconds("ttl", ttl)
        check_seconds("timeout", timeout)
        if pool_size < 1:
            raise ValueError(f'"pool_size" must be >= 1: {pool_size}')
        psycopg, (pool_module, connection_class) = _driver()
        self._psycopg = psycopg
        self.schema, self.ttl, self.timeout = schema, ttl, timeout
        try:
            info = psycopg.conninfo.conninfo_to_dict(dsn)
        except psycopg.ProgrammingError as exc:
            raise ValueError(f"PostgresStore: invalid dsn: {exc}") from exc
        where = f"{info.get('host', 'localhost')}:{info.get('port', 5432)}"
        self._where = f"PostgreSQL at {where}/{info.get('dbname', '')} (schema {schema})"
        self._lock_key = int.from_bytes(
            hashlib.blake2b(_b(schema), digest_size=4).digest(), "big", signed=True
        )
        ms = int(timeout * 1000)
        self._pool: psycopg_pool.ConnectionPool[Any] = pool_module.ConnectionPool(
            dsn,
            connection_class=connection_class,
            min_size=1,
            max_size=pool_size,
            open=False,
            timeout=timeout,
            reconnect_timeout=0,  # no background retry storm: the next call connects again
            name=f"policyhook-{schema}",
            kwargs={
                "autocommit": True,
                "connect_timeout": max(2, round(timeout)),  # libpq's minimum is 2 s
                "tcp_user_timeout": ms,  # unacknowledged writes to a vanished host
                "options": f"-c statement_timeout={ms} -c lock_timeout={ms} "
                f"-c idle_in_transaction_session_timeout={max(ms, 10_000)}",
                "application_name": "policyhook",
            },
        )
        try:
            self._pool.open(wait=True, timeout=timeout)
        except Exception as exc:
            self._pool.close(timeout=0)
            raise StoreUnavailableError(
                f"{self._where}: cannot connect within {timeout:g}s: {_reason(exc)}"
            ) from exc
        try:
            self._secret = self._run("open", self._open)
        except BaseException:
            self._pool.close(timeout=0)
            raise

    def __repr__(self) -> str:
        return f"PostgresStore({self._where})"

    def close(self) -> None:
        self._pool.close()

    def __enter__(self) -> PostgresStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- plumbing -------------------------------------------------------------------------------

    def _run(self, what: str, work: Callable[[psycopg.Connection[Any]], T]) -> T:
        """`work(connection)` within the deadline, retried while connections turn out dead.

        After a server restart every pooled connection is dead; each fails at once on use and is
        dropped by the pool, so retrying costs little and the call gets a fresh connection.
        """
        deadline = time.monotonic() + self.timeout
        attempts = self._pool.max_size + 1
        while True:
            attempts -= 1
            try:
                with self._pool.connection(timeout=max(deadline - time.monotonic(), 0.001)) as conn:
                    conn.deadline = deadline
                    try:
                        return work(conn)
                    finally:
                        conn.deadline = None
            except self._psycopg.OperationalError as exc:
                if attempts and _dropped(exc) and time.monotonic() < deadline:
                    continue
                raise StoreUnavailableError(
                    f"{self._where}: {what} failed ({self.timeout:g}s timeout): {_reason(exc)}"
                ) from exc

    def _one(self, what: str, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> Any:
        """The first row of `sql` (None if no row), in one round trip."""
        return self._run(what, lambda c: c.execute(self._sql(sql), params).fetchone())

    def _all(self, what: str, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> list[Any]:
        return self._run(what, lambda c: c.execute(self._sql(sql), params).fetchall())

    def _write(self, what: str, sql: str, params: Sequence[Any] | dict[str, Any] = ()) -> None:
        self._run(what, lambda c: c.execute(self._sql(sql), params))

    def _sql(self, sql: str) -> bytes:
        return sql.replace("{s}", self.schema).encode()

    def _open(self, conn: psycopg.Connection[Any]) -> bytes:
        """Create or migrate the schema (one worker at a time), and read the secret."""
        with conn.transaction():
            conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (_LOCK_CLASS - 1, self._lock_key))
            conn.execute(self._sql("CREATE SCHEMA IF NOT EXISTS {s}"))
            conn.execute(
                self._sql("CREATE TABLE IF NOT EXISTS {s}.meta (key text PRIMARY KEY, value bytea)")
            )
            row = conn.execute(self._sql("SELECT value FROM {s}.meta WHERE key = 'version'"))
            found = row.fetchone()
            version = int(bytes(found[0])) if found else 0
            if version > SCHEMA_VERSION:
                raise StoreUnavailableError(
                    f"{self._where}: schema version {version} was written by a newer policyhook "
                    f"(this one knows up to {SCHEMA_VERSION}); upgrade policyhook"
                )
            for step in range(version + 1, SCHEMA_VERSION + 1):
                for statement in _MIGRATIONS[step]:
                    conn.execute(self._sql(statement))
            conn.execute(
                self._sql("INSERT INTO {s}.meta VALUES ('secret', %s) ON CONFLICT DO NOTHING"),
                (os.urandom(32),),
            )
            conn.execute(
                self._sql(
                    "INSERT INTO {s}.meta VALUES ('version', %s) "
                    "ON CONFLICT (key) DO UPDATE SET value = excluded.value"
                ),
                (str(SCHEMA_VERSION).encode(),),
            )
            secret = conn.execute(self._sql("SELECT value FROM {s}.meta WHERE key = 'secret'"))
            return bytes(secret.fetchone()[0])  # type: ignore[index]

    def schema_version(self) -> int:
        row = self._one("schema_version", "SELECT value FROM {s}.meta WHERE key = 'version'")
        return int(bytes(row[0]))

    # -- the Store protocol ---------------------------------------------------------------------

    def secret(self) -> bytes:
        return self._secret

    def put_source(self, source: Source, text: str) -> None:
        """One statement: the id is taken only if it names no other text (`sources.digest`, kept
        on its tombstone too), under the writers' lock, so of two workers putting different
        texts under one id exactly one wins; the loser changes nothing and is told which state
        the id is in."""
        entry = Entry.of_source(self._secret, source, text)
        row = self._one(
            "put_source",
            f"""
            WITH lock AS (SELECT pg_advisory_xact_lock({_LOCK_CLASS}, %(lock)s)),
            n AS (SELECT nextval('{{s}}.seq') AS seq FROM lock),
            purge AS (
                UPDATE {{s}}.sources SET text = NULL, state = 'expired'
                WHERE id IN (SELECT id FROM {{s}}.sources WHERE state = 'live'
                    AND expires <= now() AND id <> %(id)s ORDER BY expires LIMIT 16
                    FOR UPDATE SKIP LOCKED)),
            src AS (
                INSERT INTO {{s}}.sources AS cur (id, kind, digest, text, expires, state, seq)
                SELECT %(id)s, %(kind)s, %(digest)s, %(text)s,
                    now() + %(ttl)s::float8 * interval '1 second', 'live', n.seq FROM n
                ON CONFLICT (id) DO UPDATE SET kind = excluded.kind,
                    text = excluded.text, expires = excluded.expires, state = 'live',
                    seq = excluded.seq
                WHERE cur.digest = excluded.digest  -- an id names one text
                RETURNING 1),
            e AS ({_INSERT_ENTRY.replace("FROM n", "FROM n, src")} {_REPLACE}
                WHERE e.depth = 0)  -- a summary's text put as a source keeps the summary's entry
            SELECT count(*), (SELECT CASE WHEN s.state = 'live' AND s.expires <= now()
                THEN 'expired' ELSE s.state END FROM {{s}}.sources AS s WHERE s.id = %(id)s)
            FROM src
            """,
            {**_entry_params(entry, None), "lock": self._lock_key, "text": _b(text),
             "ttl": self.ttl},
        )  # fmt: skip
        if row[0] == 0:
            raise SourceIdConflictError.taken(source.id, row[1])

    def get_source(self, source_id: str) -> str | None:
        row = self._one(
            "get_source", f"SELECT s.text FROM {{s}}.sources AS s WHERE s.id = %s AND {_HELD}",
            (_b(source_id),),
        )  # fmt: skip
        return None if row is None else _s(row[0])

    def get_sources(self, source_ids: Collection[str]) -> dict[str, str]:
        if not source_ids:
            return {}
        rows = self._all(
            "get_sources",
            f"SELECT s.id, s.text FROM {{s}}.sources AS s WHERE s.id = ANY(%s) AND {_HELD}",
            ([_b(i) for i in source_ids],),
        )  # fmt: skip
        return {_s(i): _s(t) for i, t in rows}

    def evict(self, source_id: str) -> bool:
        row = self._one(
            "evict",
            "UPDATE {s}.sources AS s SET text = NULL, state = CASE WHEN s.expires <= now() "
            "THEN 'expired' ELSE 'evicted' END WHERE s.id = %s AND s.state = 'live' "
            "RETURNING s.state",
            (_b(source_id),),
        )
        return row is not None and row[0] == "evicted"

    def live(self, source_ids: Collection[str]) -> frozenset[str]:
        if not source_ids:
            return frozenset()
        rows = self._all(
            "live", f"SELECT s.id FROM {{s}}.sources AS s WHERE s.id = ANY(%s) AND {_HELD}",
            ([_b(i) for i in source_ids],),
        )  # fmt: skip
        return frozenset(_s(r[0]) for r in rows)

    def states(self, source_ids: Collection[str]) -> dict[str, State]:
        if not source_ids:
            return {}
        rows = self._all(
            "states",
            "SELECT s.id, CASE WHEN s.state = 'live' AND s.expires <= now() THEN 'expired' "
            "ELSE s.state END FROM {s}.sources AS s WHERE s.id = ANY(%s)",
            ([_b(i) for i in source_ids],),
        )
        return {_s(i): state for i, state in rows}

    def put_summary(self, entry: Entry, text: str, facts: Sequence[FactRecord] = ()) -> Entry:
        """Write `entry`, merged with the text's earlier record if any; the window's depth and
        the per-fact provenance with it.

        One statement: a text recorded again keeps the union of both records' parents and
        sources and the deeper depth (`Entry.merged`), and each fact the union of its sources,
        so provenance only grows.
        """
        row = self._one(
            "put_summary",
            f"""
            WITH lock AS (SELECT pg_advisory_xact_lock({_LOCK_CLASS}, %(lock)s)),
            n AS (SELECT nextval('{{s}}.seq') AS seq FROM lock),
            e AS ({_INSERT_ENTRY}
                , id = CASE WHEN e.depth = 0 THEN excluded.id ELSE e.id END
                , depth = CASE WHEN e.depth = 0 THEN excluded.depth
                    ELSE greatest(e.depth, excluded.depth) END
                , parents = CASE WHEN e.depth = 0 THEN excluded.parents ELSE ARRAY(
                    SELECT DISTINCT x FROM unnest(e.parents || excluded.parents) AS x
                    WHERE x <> excluded.id AND x <> e.id ORDER BY x) END
                , direct = CASE WHEN e.depth = 0 THEN excluded.direct ELSE ARRAY(
                    SELECT DISTINCT x FROM unnest(e.direct || excluded.direct) AS x
                    ORDER BY x) END
                , source_kinds = CASE WHEN e.depth = 0 THEN excluded.source_kinds ELSE ARRAY(
                    SELECT DISTINCT x FROM unnest(e.source_kinds || excluded.source_kinds) AS x
                    ORDER BY x) END
                RETURNING {_ENTRY}),
            w AS (
                INSERT INTO {{s}}.windows AS w (win, depth) SELECT e.win, e.depth FROM e
                ON CONFLICT (win) DO UPDATE SET depth = greatest(w.depth, excluded.depth)),
            f AS (
                INSERT INTO {{s}}.facts AS f (summary, fact, sources)
                SELECT e.id, k.fact, ARRAY(
                    SELECT DISTINCT x.src FROM unnest(%(fact_of)s::int[], %(fact_src)s::bytea[])
                    AS x(n, src) WHERE x.n = k.n ORDER BY 1)
                FROM e, unnest(%(facts)s::bytea[]) WITH ORDINALITY AS k(fact, n)
                ON CONFLICT (summary, fact) DO UPDATE SET sources = ARRAY(
                    SELECT DISTINCT x FROM unnest(f.sources || excluded.sources) AS x ORDER BY x))
            SELECT * FROM e
            """,
            {**_entry_params(entry, text), **_fact_params(facts), "lock": self._lock_key},
        )
        return _entry(row)

    def facts(self, summary_ids: Collection[str]) -> dict[str, list[FactRecord]]:
        if not summary_ids:
            return {}
        rows = self._all(
            "facts",
            "SELECT f.summary, f.fact, f.sources FROM {s}.facts AS f WHERE f.summary = ANY(%s)",
            ([_b(i) for i in summary_ids],),
        )
        out: dict[str, list[FactRecord]] = {}
        for summary, fact, ids in rows:
            out.setdefault(_s(summary), []).append((_s(fact), tuple(map(_s, ids))))
        return out

    def lookup(self, digests: Collection[str]) -> dict[str, Entry]:
        if not digests:
            return {}
        rows = self._all(
            "lookup", f"SELECT {_ENTRY} FROM {{s}}.entries AS e WHERE e.digest = ANY(%s)",
            (list(digests),),
        )  # fmt: skip
        return {e.digest: e for e in map(_entry, rows)}

    def by_anchor(self, anchors: Collection[str]) -> list[Entry]:
        if not anchors:
            return []
        rows = self._all(
            "by_anchor",
            f"SELECT {_ENTRY} FROM {{s}}.entries AS e WHERE e.anchor = ANY(%s) ORDER BY e.seq",
            (list(anchors),),
        )
        return [_entry(r) for r in rows]

    def rests_on(self, summary_ids: Collection[str]) -> dict[str, frozenset[str]]:
        if not summary_ids:
            return {}
        rows = self._all(
            "rests_on",
            """
            WITH RECURSIVE up (root, id) AS (
                SELECT r, r FROM unnest(%s::bytea[]) AS r
                UNION
                SELECT up.root, p FROM up
                JOIN {s}.entries AS e ON e.id = up.id AND e.depth > 0, unnest(e.parents) AS p
            )
            SELECT up.root, d FROM up
            JOIN {s}.entries AS e ON e.id = up.id AND e.depth > 0, unnest(e.direct) AS d
            """,
            ([_b(i) for i in summary_ids],),
        )
        out: dict[str, set[str]] = {s: set() for s in summary_ids}
        for root, source_id in rows:
            out[_s(root)].add(_s(source_id))
        return {k: frozenset(v) for k, v in out.items()}

    def window_depth(self, window: str) -> int:
        row = self._one(
            "window_depth", "SELECT depth FROM {s}.windows WHERE win = %s", (_b(window),)
        )
        return 0 if row is None else int(row[0])

    def since(self, cursor: int, limit: int) -> tuple[int, list[tuple[Entry, str | None]]]:
        rows = self._all(
            "since",
            f"""
            SELECT e.seq, {_ENTRY}, CASE WHEN e.depth > 0 THEN e.text ELSE
                (SELECT s.text FROM {{s}}.sources AS s
                 WHERE s.id = e.id AND s.digest = e.digest AND {_HELD}) END
            FROM {{s}}.entries AS e WHERE e.seq > %s ORDER BY e.seq LIMIT %s
            """,
            (cursor, limit),
        )
        if not rows:
            return cursor, []
        return rows[-1][0], [(_entry(r[1:-1]), None if r[-1] is None else _s(r[-1])) for r in rows]

    def view(
        self,
        cursor: int,
        limit: int,
        digests: Collection[str],
        source_ids: Collection[str],
        window: str | None = None,
    ) -> View:
        """One statement: each part of the view is a tagged row of one UNION ALL (`_VIEW`)."""
        rows = self._all(
            "view",
            _VIEW,
            {
                "cursor": cursor,
                "limit": limit,
                "digests": list(digests),
                "ids": [_b(i) for i in source_ids],
                "win": None if window is None else _b(window),
            },
        )
        since = sorted((r for r in rows if r[0] == "s"), key=lambda r: int(r[1]))
        entries = {e.digest: e for e in (_entry(r[2:12]) for r in rows if r[0] == "f")}
        rests_on: dict[str, set[str]] = {e.id: set() for e in entries.values() if e.depth > 0}
        depth = None if window is None else 0
        live = set()
        for r in rows:
            if r[0] == "c":
                rests_on[_s(r[3])].add(_s(r[12]))
            elif r[0] == "l":
                live.add(_s(r[3]))
            elif r[0] == "w":
                depth = int(r[1])
        return View(
            cursor=int(since[-1][1]) if since else cursor,
            since=[(_entry(r[2:12]), None if r[12] is None else _s(r[12])) for r in since],
            entries=entries,
            rests_on={k: frozenset(v) for k, v in rests_on.items()},
            live=frozenset(live),
            depth=depth,
        )

    def sources(self, limit: int) -> list[tuple[Source, str]]:
        rows = self._all(
            "sources",
            f"SELECT s.id, s.kind, s.text FROM {{s}}.sources AS s WHERE {_HELD} "
            "ORDER BY s.seq DESC LIMIT %s",
            (limit,),
        )
        return [(Source(_s(i), _s(k)), _s(t)) for i, k, t in reversed(rows)]

    def summaries(self, window: str, limit: int) -> list[tuple[Region, str]]:
        rows = self._all(
            "summaries",
            f"SELECT {_ENTRY}, e.text FROM {{s}}.entries AS e WHERE e.win = %s AND e.depth > 0 "
            "ORDER BY e.seq DESC LIMIT %s",
            (_b(window), limit),
        )
        held = [(_entry(r[:-1]), _s(r[-1])) for r in reversed(rows)]
        closures = self.rests_on([e.id for e, _ in held])
        return [(e.region(closures[e.id]), t) for e, t in held]


_NO_ENTRY = "NULL::text, NULL::bytea, NULL::int, NULL::bytea, NULL::bigint, NULL::text, " + (
    "NULL::bytea[], NULL::bytea[], NULL::bytea[], NULL::bytea"
)
#: `PostgresStore.view`: rows (tag, seq or depth, the entry's columns, text or source id), tagged
#: s (since), f (found by digest), c (a found summary's id and one of its sources, transitively),
#: l (a held source id: of those asked, of the closures, of the sources found), w (the window's
#: depth).
_VIEW = f"""
WITH RECURSIVE
found AS (SELECT * FROM {{s}}.entries AS e WHERE e.digest = ANY(%(digests)s::text[])),
up (root, id) AS (
    SELECT f.id, f.id FROM found AS f WHERE f.depth > 0
    UNION
    SELECT up.root, p FROM up
    JOIN {{s}}.entries AS e ON e.id = up.id AND e.depth > 0, unnest(e.parents) AS p),
closure (root, source) AS (
    SELECT up.root, d FROM up
    JOIN {{s}}.entries AS e ON e.id = up.id AND e.depth > 0, unnest(e.direct) AS d),
ask (id) AS (
    SELECT unnest(%(ids)s::bytea[]) UNION SELECT source FROM closure
    UNION SELECT f.id FROM found AS f WHERE f.depth = 0)
(SELECT 's'::text AS tag, e.seq, {_ENTRY}, CASE WHEN e.depth > 0 THEN e.text ELSE
    (SELECT s.text FROM {{s}}.sources AS s
     WHERE s.id = e.id AND s.digest = e.digest AND {_HELD}) END
 FROM {{s}}.entries AS e WHERE e.seq > %(cursor)s ORDER BY e.seq LIMIT %(limit)s)
UNION ALL
SELECT 'f', e.seq, {_ENTRY}, NULL::bytea FROM found AS e
UNION ALL
SELECT 'c', NULL::bigint, NULL::text, root, NULL::int, NULL::bytea, NULL::bigint, NULL::text,
    NULL::bytea[], NULL::bytea[], NULL::bytea[], NULL::bytea, source FROM closure
UNION ALL
SELECT 'l', NULL::bigint, NULL::text, s.id, NULL::int, NULL::bytea, NULL::bigint, NULL::text,
    NULL::bytea[], NULL::bytea[], NULL::bytea[], NULL::bytea, NULL::bytea
FROM ask JOIN {{s}}.sources AS s ON s.id = ask.id WHERE {_HELD}
UNION ALL
SELECT 'w', w.depth::bigint, {_NO_ENTRY}, NULL::bytea
FROM {{s}}.windows AS w WHERE w.win = %(win)s
"""

#: Both writers write the entry (a text recorded again moves to the end of `since`, like SQLite's
#: INSERT OR REPLACE); a source replaces what was there, a summary merges (`put_summary`).
_INSERT_ENTRY = """
    INSERT INTO {s}.entries AS e (digest, seq, id, depth, kind, size, anchor, parents, direct,
        source_kinds, win, text)
    SELECT %(digest)s, n.seq, %(id)s, %(depth)s, %(kind)s, %(size)s, %(anchor)s, %(parents)s,
        %(direct)s, %(kinds)s, %(win)s, %(stext)s FROM n
    ON CONFLICT (digest) DO UPDATE SET seq = excluded.seq,
        kind = excluded.kind, size = excluded.size, anchor = excluded.anchor,
        win = excluded.win, text = excluded.text
"""
_REPLACE = """
    , id = excluded.id, depth = excluded.depth, parents = excluded.parents,
    direct = excluded.direct, source_kinds = excluded.source_kinds
"""


def _entry_params(entry: Entry, text: str | None) -> dict[str, Any]:
    return {
        "digest": entry.digest,
        "id": _b(entry.id),
        "depth": entry.depth,
        "kind": _b(entry.kind),
        "size": entry.size,
        "anchor": entry.anchor,
        "parents": [_b(p) for p in entry.parents],
        "direct": [_b(s) for s in entry.sources],
        "kinds": [_b(k) for k in entry.source_kinds],
        "win": _b(entry.window),
        "stext": None if text is None else _b(text),
    }


def _fact_params(facts: Sequence[FactRecord]) -> dict[str, Any]:
    """Facts as flat arrays (PostgreSQL arrays cannot be ragged): fact n's sources are the
    `fact_src` whose `fact_of` is n (1-based). A fact given twice is given once (an upsert
    cannot touch a row twice)."""
    merged: dict[str, set[str]] = {}
    for fact, ids in facts:
        if ids:  # a fact no source states carries nothing
            merged.setdefault(fact, set()).update(ids)
    return {
        "facts": [_b(f) for f in merged],
        "fact_of": [n for n, ids in enumerate(merged.values(), 1) for _ in ids],
        "fact_src": [_b(i) for ids in merged.values() for i in ids],
    }


def _dropped(exc: BaseException) -> bool:
    """True when `exc` is a connection that died (not a statement the server refused)."""
    return getattr(exc, "sqlstate", None) in (None, "57P01", "57P02", "57P03", "08006", "08003")


def _reason(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:297] + "..."
