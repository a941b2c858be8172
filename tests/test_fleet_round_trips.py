"""One round trip per decision, counted by the servers themselves (issue 17).

A decision reads the store once (`Store.view`: other workers' writes, the texts this worker has
not cached, and the liveness of every source the region rests on) whatever the number of
sources; recording a summary (with its per-fact provenance) is one write. PostgreSQL logs every
statement a counted role runs (`log_statement = all`); Redis reports every command a client sends
(`MONITOR`, where the commands a script runs show as `lua`, not as round trips); SQLite's trace
callback sees every statement. The worker deciding never saw the summary being made: another
worker (another store handle) recorded it, as in a fleet.
"""

from __future__ import annotations

import itertools
import re
import threading
from pathlib import Path
from typing import Any

import servers

from policyhook import Guard, SQLiteStore
from policyhook.stores import Store

SOURCES = 1000
_names = itertools.count()


def fleet_of_two(writer: Store, reader: Store) -> tuple[Guard, str, str]:
    """Worker A (on `writer`) records SOURCES sources and a summary resting on all of them, and
    a new turn; worker B (on `reader`, returned) has seen nothing yet. Returns B, the summary and
    the turn."""
    a = Guard(store=writer)
    texts = [f"tool output {i}: exit status {i % 7}, took {i}ms" for i in range(SOURCES)]
    for i, text in enumerate(texts):
        a.record_source(text, "tool_output", f"tool-{i}")
    summary = a(lambda m: "Summary of the tool runs: all exited", summarizer="s")(texts)
    turn = a.record_source("user: and now the deploy, please", "user_turn", "turn").id
    return Guard(store=reader), summary, writer.get_source(turn) or ""


def decide(guard: Guard, value: Any) -> Any:
    return guard.check(value, summarizer="s")


class TestPostgres:
    def test_one_statement_per_decision_and_per_summary(
        self, postgres: servers.Restartable
    ) -> None:
        """A fresh worker's first decision over a summary of 1,000 sources is one statement, the next one too, and still one after another worker evicts a source; recording a summary is one."""
        import psycopg

        from policyhook._postgres import PostgresStore

        with psycopg.connect(postgres.url, autocommit=True) as conn:
            conn.execute("DROP ROLE IF EXISTS counted")
            conn.execute("CREATE ROLE counted LOGIN SUPERUSER")
            conn.execute("ALTER ROLE counted SET log_statement = 'all'")
        assert postgres.server is not None
        log = postgres.server.log

        def statements() -> int:  # every statement a `counted` session ran, as the server logs it
            text = log.read_text(errors="replace")
            return len(re.findall(r"LOG:  (?:statement|execute [^:]*):", text))

        schema = f"trips_{next(_names)}"
        counted_url = postgres.url.replace("postgres@", "counted@", 1)
        with (
            PostgresStore(postgres.url, schema=schema) as writer,
            PostgresStore(counted_url, schema=schema, pool_size=1) as reader,
        ):
            guard, summary, turn = fleet_of_two(writer, reader)
            for _ in range(2):  # the fresh worker's first decision, then a steady one
                before = statements()
                decision = decide(guard, [summary, turn])
                assert statements() - before == 1
                assert (decision.effect, decision.depth, decision.dead_sources) == ("allow", 1, ())
            assert len(guard.provenance([summary, turn]).sources) == SOURCES + 1  # and the turn
            writer.evict("tool-7")
            before = statements()
            decision = decide(guard, [summary, turn])
            assert statements() - before == 1
            assert (decision.effect, decision.dead_sources) == ("deny", ("tool-7",))

            region = guard.ledger.resolve([summary, turn], "w").region
            before = statements()
            guard.ledger.record_summary("A summary of everything", region, "w", [("f", ("x",))])
            assert statements() - before == 1

            # a granted, output-checked call of a worker that has indexed none of the 1,000
            # sources: the decision, the summaries' fact provenance, every live source's text,
            # and recording the summary: four statements, whatever the number of sources
            other, summary2, turn2 = fleet_of_two(writer, reader)
            summarize = other(lambda m: "Summary: deploys ran; each exited.", summarizer="s")
            before = statements()
            assert summarize([summary2, turn2]).startswith("Summary")
            assert statements() - before == 4


class TestRedis:
    def test_one_command_per_decision_and_per_summary(self, redis: servers.Restartable) -> None:
        """The same on Redis: one script per decision (1,000 sources) and per summary, the commands it runs inside the server not being round trips."""
        import redis as redis_py

        from policyhook._redis import RedisStore

        namespace = f"trips{next(_names)}"
        with (
            RedisStore(redis.url, namespace=namespace) as writer,
            RedisStore(redis.url, namespace=namespace) as reader,
        ):
            guard, summary, turn = fleet_of_two(writer, reader)
            decide(guard, ["warm the scripts' cache"])  # EVALSHA, NOSCRIPT, SCRIPT LOAD once
            guard.ledger.record_summary("warm", guard.ledger.resolve(["x"], "w").region, "w")
            monitor = _Monitor(redis_py.Redis.from_url(redis.url))
            with monitor:
                decision = decide(guard, [summary, turn])
            assert (decision.effect, decision.depth) == ("allow", 1)
            assert len(monitor.commands) == 1, monitor.commands
            assert monitor.commands[0].startswith("EVALSHA")
            writer.evict("tool-7")
            with monitor:
                decision = decide(guard, [summary, turn])
            assert len(monitor.commands) == 1, monitor.commands
            assert (decision.effect, decision.dead_sources) == ("deny", ("tool-7",))
            region = guard.ledger.resolve([summary, turn], "w").region
            with monitor:
                guard.ledger.record_summary("A summary of everything", region, "w", [("f", ("x",))])
            assert len(monitor.commands) == 1, monitor.commands


class _Monitor:
    """The commands clients send to Redis between entering and leaving (MONITOR), less the
    commands scripts run inside the server and the markers this uses to know where it is."""

    def __init__(self, client: Any) -> None:
        self.client = client
        self.commands: list[str] = []

    def __enter__(self) -> None:
        self.commands = []
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._watch)
        self._thread.start()
        assert self._ready.wait(10)
        self.client.echo("policyhook-monitor-start")

    def _watch(self) -> None:
        with self.client.monitor() as m:
            self._ready.set()
            started = False
            while True:
                got = m.next_command()
                command = str(got["command"])
                if command == "ECHO policyhook-monitor-start":
                    started = True
                elif command == "ECHO policyhook-monitor-end":
                    return
                elif started and got.get("client_type") != "lua":
                    self.commands.append(command)

    def __exit__(self, *exc: object) -> None:
        self.client.echo("policyhook-monitor-end")
        self._thread.join(10)


class TestSQLite:
    def test_one_statement_per_decision_and_per_summary(self, tmp_path: Path) -> None:
        """On SQLite, a decision is one statement (a compound SELECT) from another process's handle; recording a summary is one transaction."""
        path = tmp_path / "fleet.db"
        with SQLiteStore(path) as writer, SQLiteStore(path) as reader:
            guard, summary, turn = fleet_of_two(writer, reader)
            statements: list[str] = []
            # Statements run, not what SQLite traces inside one (`-- PRAGMA data_version`: the
            # view's liveness-cache check, a table-valued function of the same SELECT).
            reader._db.set_trace_callback(
                lambda s: None if s.startswith("-- ") else statements.append(s)
            )
            for _ in range(2):
                statements.clear()
                decision = decide(guard, [summary, turn])
                assert len(statements) == 1, statements
                assert (decision.effect, decision.depth) == ("allow", 1)
            writer.evict("tool-7")
            statements.clear()
            decision = decide(guard, [summary, turn])
            assert len(statements) == 1, statements
            assert (decision.effect, decision.dead_sources) == ("deny", ("tool-7",))
            region = guard.ledger.resolve([summary, turn], "w").region
            statements.clear()
            guard.ledger.record_summary("A summary of everything", region, "w", [("f", ("x",))])
            assert [s.split()[0] for s in statements].count("BEGIN") == 1
            assert statements[-1] == "COMMIT", statements
