"""Shared stores under faults: a server killed, hung, restarted; connections dropped.

What must hold (issue 17): the decision that cannot reach its store counts the sources as dead
(fail closed) with a warning naming the store and the reason, within the store's timeout; the
store reconnects by itself when the server is back; nothing recorded before is lost. Each test
gets its own schema / namespace on a server of its own module, and leaves the server running.
"""

from __future__ import annotations

import itertools
import logging
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import servers

from policyhook import (
    Guard,
    PostgresStore,
    RedisStore,
    Source,
    SQLiteStore,
    StoreUnavailableError,
    remedies,
)
from policyhook.stores import Store

CONFIG = "config/agent.yaml: retry_ceiling: 7  # max retries for flaky tool calls"
SUMMARY = "Summary: the retry ceiling is 7, read from the agent config."
KINDS = ["postgres", "redis"]
_names = itertools.count()


@pytest.fixture(scope="module", params=KINDS)
def server(request: pytest.FixtureRequest) -> Iterator[servers.Restartable]:
    managed = servers.postgres() if request.param == "postgres" else servers.redis()
    yield managed
    servers.remove(managed)


@pytest.fixture
def running(server: servers.Restartable) -> Iterator[servers.Restartable]:
    """The server, started again after the test if the test left it down or stopped."""
    yield server
    if server.server is not None and server.server.process.poll() is None:
        server.signal(signal.SIGCONT)
    else:
        server.start()


@pytest.fixture
def make(running: servers.Restartable) -> Iterator[Callable[..., Store]]:
    """Open a store on the server: a fresh schema / namespace, or `name` to share one."""
    opened: list[Any] = []

    def open_(name: str | None = None, **options: Any) -> Store:
        name = name or f"faults_{next(_names)}"
        store: Any
        if running.name == "postgres":
            store = PostgresStore(running.url, schema=name, **options)
        else:
            store = RedisStore(running.url, namespace=name, **options)
        opened.append(store)
        return store  # type: ignore[no-any-return]

    yield open_
    for store in opened:
        store.close()


def guarded(store: Store) -> tuple[Guard, str]:
    """A guard on `store` with a config source and a granted depth-1 summary of it."""
    guard = Guard(store=store)
    guard.record_source(CONFIG, kind="config_read", source_id="cfg-retry-ceiling")

    def compact(text: str) -> str:
        return SUMMARY

    summarize = guard(compact, summarizer="compact")
    return guard, str(summarize(CONFIG))


def store_warnings(caplog: pytest.LogCaptureFixture) -> list[logging.LogRecord]:
    return [r for r in caplog.records if "store unreachable" in r.getMessage()]


class TestServerDown:
    def test_a_killed_server_fails_closed_then_reconnects(
        self,
        running: servers.Restartable,
        make: Callable[..., Store],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """Server killed: the summary's source counts as dead, with a warning naming the store; restarted: live again."""
        guard, out = guarded(make(timeout=1.0))
        assert guard.check(out, summarizer="compact").effect == "allow"

        running.kill()
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="policyhook"):
            down = guard.check(out, summarizer="compact")
        assert time.monotonic() - started < 10  # bounded by the timeout, never a hang
        assert (down.effect, down.depth, down.dead_sources) == ("deny", 1, ("cfg-retry-ceiling",))
        (warning,) = store_warnings(caplog)
        assert warning.exc_info is not None
        reason = str(warning.exc_info[1])
        assert isinstance(warning.exc_info[1], StoreUnavailableError)
        assert "127.0.0.1" in reason and "view failed" in reason, reason

        running.start()
        back = guard.check(out, summarizer="compact")
        assert (back.effect, back.dead_sources) == ("allow", ())

    def test_recording_while_down_raises_and_loses_nothing_after(
        self, running: servers.Restartable, make: Callable[..., Store]
    ) -> None:
        """A write to a dead server raises StoreUnavailableError (the caller knows it was not kept); later writes land."""
        store = make(timeout=1.0)
        running.kill()
        with pytest.raises(StoreUnavailableError, match=r"put_source failed"):
            store.put_source(Source("a", "tool_output"), "written while the server was down")
        running.start()
        store.put_source(Source("a", "tool_output"), "written after the restart")
        assert store.get_source("a") == "written after the restart"

    def test_unreachable_at_open_is_a_clear_error(self) -> None:
        """Opening a store on a port nothing listens on fails fast, naming the address."""
        port = servers.free_port()
        with pytest.raises(StoreUnavailableError, match=rf"127\.0\.0\.1:{port}"):
            PostgresStore(f"postgresql://postgres@127.0.0.1:{port}/postgres", timeout=1)
        with pytest.raises(StoreUnavailableError, match=rf"127\.0\.0\.1:{port}"):
            RedisStore(f"redis://127.0.0.1:{port}/0", timeout=1)


class TestHungServer:
    def test_a_hung_server_times_out_within_the_bound(
        self,
        running: servers.Restartable,
        make: Callable[..., Store],
        caplog: pytest.LogCaptureFixture,
    ) -> None:
        """A stopped (SIGSTOP) server never answers: the call gives up after `timeout`, and the decision denies."""
        store = make(timeout=0.5)
        guard, out = guarded(store)
        running.signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            with pytest.raises(StoreUnavailableError, match=r"0\.5s timeout"):
                store.live(["cfg-retry-ceiling"])
            assert time.monotonic() - started < 5
            with caplog.at_level(logging.WARNING, logger="policyhook"):
                assert guard.check(out, summarizer="compact").effect == "deny"
            assert store_warnings(caplog)
        finally:
            running.signal(signal.SIGCONT)
        assert guard.check(out, summarizer="compact").effect == "allow"


class TestDroppedConnections:
    def test_connections_killed_by_the_server_are_replaced(
        self, running: servers.Restartable, make: Callable[..., Store]
    ) -> None:
        """The server drops every client connection: the next call reconnects and answers right."""
        store = make(timeout=2.0)
        store.put_source(Source("a", "tool_output"), "A")
        assert store.live(["a"]) == {"a"}
        drop_all_clients(running)
        assert store.live(["a", "b"]) == {"a"}
        assert store.get_source("a") == "A"


def drop_all_clients(server: servers.Restartable) -> None:
    """Close every client connection from the server side (as a failover or restart would)."""
    if server.name == "postgres":
        import psycopg

        with psycopg.connect(server.url, autocommit=True) as admin:
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE application_name = 'policyhook'"
            )
    else:
        import redis

        client = redis.Redis.from_url(server.url)
        client.client_kill_filter(_type="normal", skipme=True)
        client.close()


class TestCrash:
    def test_nothing_recorded_is_lost_across_a_crash(
        self, running: servers.Restartable, make: Callable[..., Store]
    ) -> None:
        """SIGKILL and restart: sources, tombstones, summaries with provenance and the secret are all still there."""
        store = make()
        name = getattr(store, "schema", None) or getattr(store, "namespace")  # noqa: B009
        _, out = guarded(store)
        store.put_source(Source("gone", "tool_output"), "evicted before the crash")
        store.evict("gone")
        before = (
            store.secret(),
            store.summaries("default", 10),
            store.states(["cfg-retry-ceiling", "gone", "never"]),
        )

        running.kill()
        running.start()
        again = make(name)
        after = (
            again.secret(),
            again.summaries("default", 10),
            again.states(["cfg-retry-ceiling", "gone", "never"]),
        )
        assert after == before
        assert after[2] == {"cfg-retry-ceiling": "live", "gone": "evicted"}
        fresh = Guard(store=again)  # another worker, nothing cached
        decision = fresh.check(out, summarizer="compact")
        assert (decision.effect, decision.depth) == ("allow", 1)


class TestTheSpool:
    def test_a_killed_server_still_leaves_the_window_in_budget(
        self, running: servers.Restartable, make: Callable[..., Store], tmp_path: Path
    ) -> None:
        """The server killed: the pass cannot be decided and is refused, and the remedy archives
        in the worker's local spool: the pointer takes the region's place and the archive reads
        back meanwhile. Restarted: the next decision moves the spool to the server, where
        another worker reads the archive and takes the pointer for original evidence."""
        name = f"spool_{next(_names)}"
        spool = SQLiteStore(tmp_path / "spool.db")
        guard = Guard(store=make(name, timeout=1.0), spool=spool)
        guard.record_source(CONFIG, kind="config_read", source_id="cfg-retry-ceiling")
        summarize = guard(lambda texts: SUMMARY, summarizer="compact", remedy=True)
        summary = summarize([CONFIG])
        region = [summary, "user: the deploy timed out again, page the on-call"]

        running.kill()
        pointer = summarize(region)
        [ref] = remedies.pointers(pointer)
        assert guard.retrieve(ref) == region
        assert len(pointer) < 300 and len(spool.sources(10)) == 2

        running.start()
        guard.check("user: and now?", summarizer="compact")
        assert spool.sources(10) == []
        other = Guard(store=make(name))  # another worker, nothing cached
        assert other.retrieve(ref) == region
        assert other.provenance(pointer).source_kinds == {remedies.POINTER_KIND}
        assert other.check(pointer, summarizer="compact").allowed
        spool.close()


class TestWithoutTheExtras:
    def test_importable_without_drivers_and_names_the_extra(self) -> None:
        """`import policyhook` works without psycopg/redis; making a store names the extra to install."""
        script = (
            "import sys\n"
            "sys.modules.update({m: None for m in ('psycopg', 'psycopg_pool', 'redis')})\n"
            "import policyhook\n"
            "for make, url in ((policyhook.PostgresStore, 'postgresql://x'),\n"
            "                  (policyhook.RedisStore, 'redis://x')):\n"
            "    try:\n"
            "        make(url)\n"
            "    except ImportError as exc:\n"
            "        print(exc)\n"
        )
        done = subprocess.run(
            [sys.executable, "-c", script], capture_output=True, text=True, timeout=60
        )
        assert done.returncode == 0, done.stderr
        assert 'pip install "policyhook[postgres]"' in done.stdout
        assert 'pip install "policyhook[redis]"' in done.stdout


class TestOptions:
    @pytest.mark.parametrize(
        ("options", "message"),
        [
            ({"ttl": 0}, '"ttl" must be > 0'),
            ({"timeout": -1}, '"timeout" must be > 0'),
            ({"ttl": float("nan")}, '"ttl" must be > 0 seconds: nan'),
            ({"timeout": float("nan")}, '"timeout" must be > 0 seconds: nan'),
            ({"ttl": float("inf")}, r'"ttl" must be finite: inf \(None: no ttl\)'),
        ],
    )
    def test_bad_options_are_clear_errors(self, options: dict[str, Any], message: str) -> None:
        """Bad ttl/timeout values fail at construction, naming the option and value (NaN
        passes a `<= 0` test, then an expiry of NaN is never or always past)."""
        with pytest.raises(ValueError, match=message):
            PostgresStore("postgresql://127.0.0.1:1/x", **options)
        with pytest.raises(ValueError, match=message):
            RedisStore("redis://127.0.0.1:1/0", **options)

    def test_bad_names_are_clear_errors(self) -> None:
        """A schema or namespace that could break out of its quoting is refused."""
        with pytest.raises(ValueError, match='"schema" must be'):
            PostgresStore("postgresql://127.0.0.1:1/x", schema="a; DROP TABLE x")
        with pytest.raises(ValueError, match='"namespace" must'):
            RedisStore("redis://127.0.0.1:1/0", namespace="a}b")
