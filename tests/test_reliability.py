"""Reliability under faults (issue 13 items 3, 6, 7): store failures after a grant, a deleted
SQLite file, fork, and cancellation. Each test goes through the public API only."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import sqlite3
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import InMemoryMetricReader, NumberDataPoint
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from outage import OPERATIONS, one_fault, store_down

import policyhook
from policyhook import Guard, MemoryStore, SQLiteStore, UnsafeRecompactionError, decisionlog

CONFIG = "config read: retry_ceiling = 7 (agent.yaml), backoff 250ms, jitter on"
SUMMARY = "S1: retry ceiling is 7 (from config), backoff 250ms"
ROOT = os.geteuid() == 0


class Observed:
    """A guard's spans, metric points and decision log, in memory."""

    def __init__(self, tmp_path: Path, **options: Any) -> None:
        self.spans = InMemorySpanExporter()
        tracer = TracerProvider()
        tracer.add_span_processor(SimpleSpanProcessor(self.spans))
        self.reader = InMemoryMetricReader()
        self.log = tmp_path / "decisions.jsonl"
        self.guard = Guard(
            tracer_provider=tracer,
            meter_provider=MeterProvider(metric_readers=[self.reader]),
            decision_log=self.log,
            **options,
        )

    def counts(self, name: str) -> dict[tuple[tuple[str, Any], ...], int]:
        data = self.reader.get_metrics_data()
        out: dict[tuple[tuple[str, Any], ...], int] = {}
        for resource in data.resource_metrics if data else ():
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    if metric.name == name:
                        for point in metric.data.data_points:
                            assert isinstance(point, NumberDataPoint)
                            attributes = dict(point.attributes or {})
                            out[tuple(sorted(attributes.items()))] = int(point.value)
        return out

    def outcomes(self) -> list[str]:
        self.guard.close()
        return [r["outcome"] for _, r in decisionlog.read(self.log)]

    def guard_span(self) -> Any:
        (span,) = [s for s in self.spans.get_finished_spans() if s.name == "policyhook.guard"]
        return span


class Faulty:
    """Wraps a store; the named operation raises `error` while `failing` is set."""

    def __init__(self, inner: Any, operation: str, error: Exception) -> None:
        self.inner, self.operation, self.error = inner, operation, error
        self.failing = False

    def __getattr__(self, name: str) -> Any:
        attribute = getattr(self.inner, name)
        if name != self.operation or not callable(attribute):
            return attribute

        def call(*args: Any, **kwargs: Any) -> Any:
            if self.failing:
                raise self.error
            return attribute(*args, **kwargs)

        return call


def stores(tmp_path: Path) -> dict[str, Callable[[], Any]]:
    return {"memory": MemoryStore, "sqlite": lambda: SQLiteStore(tmp_path / "store.db")}


class TestStoreFaults:
    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_one_failing_operation_never_allows_a_dead_summary_nor_loses_output(
        self, tmp_path: Path, kind: str, operation: str
    ) -> None:
        """Any single store operation raising: granted calls return their output, and a summary
        whose source is evicted is never allowed."""
        store = Faulty(stores(tmp_path)[kind](), operation, OSError(5, "Input/output error"))
        guard = Guard(store=store)
        summarize = guard(constant, summarizer="s")
        guard.record_source(CONFIG, "config_read", "cfg-7")
        store.failing = True
        try:
            out = summarize(CONFIG)
        except UnsafeRecompactionError as refusal:
            assert refusal.store_failed  # an original refused: only for the store's failure
            out = None  # refused while the store could not answer: fail closed, nothing ran
        else:
            assert out == SUMMARY  # granted: the output is the caller's whatever the store did
        store.failing = False
        if out is None:
            out = summarize(CONFIG)
        store.evict("cfg-7")
        for failing in (True, False):
            store.failing = failing
            with pytest.raises(UnsafeRecompactionError) as refused:
                summarize(out)
        assert not refused.value.store_failed  # the store answered: the refusal stands

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    def test_a_refusal_says_whether_the_store_failed(self, tmp_path: Path, kind: str) -> None:
        """`store_failed` is what lets a caller ask again later: True on every refusal a store
        fault caused (the store down, or any one call of the decision failing), False on one
        the store answered (a source evicted)."""
        store = stores(tmp_path)[kind]()
        guard = Guard(store=store)
        summarize = guard(summary_of, summarizer="s")
        guard.record_source(CONFIG, "config_read", "cfg-7")
        summary = summarize(CONFIG)
        with store_down(store), pytest.raises(UnsafeRecompactionError) as refused:
            summarize(summary)
        assert refused.value.store_failed
        with one_fault([store], at=0) as calls:
            summarize(summary)  # allowed: every source live
        assert calls  # the decision reads the store
        for at in range(1, len(calls) + 1):
            with one_fault([store], at) as made:
                try:
                    summarize(summary)
                except UnsafeRecompactionError as refusal:
                    assert refusal.store_failed, made[at - 1]
        store.evict("cfg-7")
        with pytest.raises(UnsafeRecompactionError) as refused:
            summarize(summary)
        assert not refused.value.store_failed

    @pytest.mark.parametrize("kind", ["memory", "sqlite"])
    @pytest.mark.parametrize("operation", OPERATIONS)
    def test_one_failing_operation_while_an_evicted_source_comes_back(
        self, tmp_path: Path, kind: str, operation: str
    ) -> None:
        """The evicted config back in the input, `archive_originals` storing it again, any
        single store operation raising: a granted call returns its output, and a summary of it
        is allowed only when every source it rests on is held (once the store answers, exactly
        then)."""
        store = Faulty(stores(tmp_path)[kind](), operation, OSError(5, "Input/output error"))
        guard = Guard(store=store, archive_originals=True)
        summarize = guard(constant_of, summarizer="s")
        guard.record_source(CONFIG, "config_read", "cfg-7")
        store.evict("cfg-7")
        store.failing = True
        try:
            out = summarize([CONFIG, "a turn nobody registered"])
        except UnsafeRecompactionError:  # the decision's reads failing: fail closed, nothing ran
            assert operation in {"lookup", "view"}
            return
        assert out == SUMMARY
        store.failing = False
        region = guard.provenance([out])
        derivable = store.live(region.sources) == region.sources
        assert derivable or operation == "put_source"  # the one write storing it again
        for failing in (True, False):
            store.failing = failing
            try:
                allowed = summarize([out]) == SUMMARY
            except UnsafeRecompactionError:
                allowed = False
            assert allowed == derivable if not failing else derivable or not allowed

    @pytest.mark.parametrize("operation", ["put_summary", "put_source"])
    def test_a_write_failing_after_a_grant_is_logged_counted_and_on_the_span(
        self, tmp_path: Path, operation: str, caplog: pytest.LogCaptureFixture
    ) -> None:
        """The caller gets its output; outcome store_error on span, metric and decision log."""
        store = Faulty(MemoryStore(), operation, OSError(28, "No space left on device"))
        seen = Observed(tmp_path, store=store, archive_originals=True)
        summarize = seen.guard(constant, summarizer="s")
        store.failing = True
        with caplog.at_level(logging.WARNING, logger="policyhook"):
            assert summarize(f"an original turn nobody registered: {CONFIG}") == SUMMARY
        assert f"store {operation} failed" in caplog.text
        assert "an original turn" not in caplog.text  # no region text in the log
        span = seen.guard_span()
        assert dict(span.attributes or {})["policyhook.outcome"] == "store_error"
        assert dict(span.attributes or {})["policyhook.store.error"] == operation
        assert [e.name for e in span.events] == ["policyhook.store.error"]
        assert seen.counts("policyhook.store.errors") == {(("operation", operation),): 1}
        assert seen.outcomes() == ["store_error"]
        if operation == "put_summary":  # still recognised by this process: never evidence
            assert seen.guard.provenance(SUMMARY).depth == 1

    def test_a_summary_whose_write_failed_is_written_before_the_next_decision(
        self, tmp_path: Path
    ) -> None:
        """Another process on the same file must not take the output for an original: once the
        store is back, the summary is written before the guard next reads the store."""
        store = Faulty(SQLiteStore(tmp_path / "store.db"), "put_summary", OSError(5, "EIO"))
        guard = Guard(store=store)
        summarize = guard(summary_of, summarizer="s")
        guard.record_source(CONFIG, "config_read", "cfg-7")
        store.failing = True
        first = summarize(CONFIG)  # granted; its record failed
        assert first == f"summary of {CONFIG}"
        other = SQLiteStore(tmp_path / "store.db")  # another process: knows nothing of it yet
        assert Guard(store=other).provenance(first).depth == 0
        summarize("a new original turn")  # still failing: owed, not lost
        assert Guard(store=other).provenance(first).depth == 0
        store.failing = False
        summarize("another original turn")  # the store is back: written before deciding
        seen = Guard(store=other).provenance(first)
        assert (seen.depth, seen.sources) == (1, frozenset({"cfg-7"}))
        store.evict("cfg-7")
        with pytest.raises(UnsafeRecompactionError):  # in the other process too
            Guard(store=other)(summary_of, summarizer="s")(first)
        other.close()

    def test_an_unwritten_summary_is_written_on_close(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """A process that stops right after the failed write still leaves the record behind; if
        the store is still down, close() says how many summaries other processes will not know."""
        store = Faulty(SQLiteStore(tmp_path / "store.db"), "put_summary", OSError(5, "EIO"))
        guard = Guard(store=store)
        guard.record_source(CONFIG, "config_read", "cfg-7")
        store.failing = True
        first = guard(summary_of, summarizer="s")(CONFIG)
        with caplog.at_level(logging.WARNING, logger="policyhook"):
            guard.close()
        assert "1 granted summaries could not be written" in caplog.text
        store.failing = False
        guard.close()
        assert Guard(store=SQLiteStore(tmp_path / "store.db")).provenance(first).depth == 1

    def test_a_locked_sqlite_store_waits_a_bounded_time_then_returns_the_output(
        self, tmp_path: Path
    ) -> None:
        """Another writer holding the database: the write gives up within its busy timeout."""
        seen = Observed(tmp_path, store=SQLiteStore(tmp_path / "store.db"))
        summarize = seen.guard(constant, summarizer="s")
        other = sqlite3.connect(tmp_path / "store.db", isolation_level=None)
        other.execute("BEGIN IMMEDIATE")  # holds the write lock
        try:
            started = time.monotonic()
            assert summarize(CONFIG) == SUMMARY
            waited = time.monotonic() - started
        finally:
            other.execute("ROLLBACK")
            other.close()
        assert waited < 15
        assert seen.outcomes() == ["store_error"]
        assert seen.counts("policyhook.store.errors") == {(("operation", "put_summary"),): 1}

    def test_a_read_only_sqlite_store_keeps_the_output(self, tmp_path: Path) -> None:
        """The database turned read-only under an open store (SQLite's own query_only)."""
        store = SQLiteStore(tmp_path / "store.db")
        seen = Observed(tmp_path, store=store)
        summarize = seen.guard(summary_of, summarizer="s")
        seen.guard.record_source(CONFIG, "config_read", "cfg-7")
        first = summarize(CONFIG)
        store._db.execute("PRAGMA query_only = 1")  # fault injection: every write now fails
        assert summarize(first) == f"summary of {first}"  # granted: cfg-7 is live
        store._db.execute("PRAGMA query_only = 0")
        assert seen.outcomes() == ["summarized", "store_error"]
        assert seen.counts("policyhook.store.errors") == {(("operation", "put_summary"),): 1}

    @pytest.mark.skipif(not ROOT and not os.environ.get("CI"), reason="mounting needs root")
    def test_a_full_disk_keeps_the_output_and_the_log_stays_readable(self, tmp_path: Path) -> None:
        """SQLite store and decision log on a 512 KiB tmpfs filled to the last byte."""
        with tmpfs(tmp_path / "mnt", "512k") as mnt:
            log = mnt / "decisions.jsonl"
            seen = Observed(tmp_path, store=SQLiteStore(mnt / "store.db"))
            seen.guard.decision_log = policyhook.DecisionLog(log)
            summarize = seen.guard(summary_of, summarizer="s")
            seen.guard.record_source(CONFIG, "config_read", "cfg-7")
            first = summarize(CONFIG)
            fill(mnt)
            turn = "another original turn, long enough to need pages of its own " * 200
            for _ in range(3):
                assert summarize(turn) == f"summary of {turn}"  # never thrown away
            assert seen.counts("policyhook.store.errors")  # the failed writes were counted
            (mnt / "filler").unlink()
            assert summarize(first) == f"summary of {first}"  # cfg-7 live: granted again
            seen.guard.close()
            damaged: list[decisionlog.Damaged] = []
            records = [r for _, r in decisionlog.read(log, damaged)]
            assert records[0]["outcome"] == "summarized"
            assert records[-1]["outcome"] == "summarized"  # the log goes on after the fault
            assert all(str(d).startswith(f"{log}:") for d in damaged)


class TestDeletedSQLiteFile:
    def test_a_store_file_deleted_while_open_fails_closed(self, tmp_path: Path) -> None:
        """Deleting the database under an open store: the next decision counts its sources dead,
        and content the guard caches as a source is refused too (`store_failed`)."""
        path = tmp_path / "store.db"
        seen = Observed(tmp_path, store=SQLiteStore(path))
        summarize = seen.guard(summary_of, summarizer="s")
        seen.guard.record_source(CONFIG, "config_read", "cfg-7")
        first = summarize(CONFIG)
        assert seen.guard.check(first, summarizer="s").effect == "allow"
        for leftover in tmp_path.glob("store.db*"):
            leftover.unlink()
        refused = seen.guard.check(first, summarizer="s")
        assert refused.effect == "deny" and refused.dead_sources == ("cfg-7",)
        # a text cached as a source is unverifiable, as new content is: another process may
        # have recorded it as a summary since the store was last read (fail closed)
        with pytest.raises(policyhook.UnsafeRecompactionError) as again:
            summarize(CONFIG)
        assert again.value.store_failed and seen.outcomes()[-1] == "refused"
        with pytest.raises(policyhook.StoreUnavailableError, match="deleted or replaced"):
            seen.guard.record_source("more evidence", "tool_output")


class TestCancellation:
    def test_a_timed_out_call_is_marked_cancelled_and_records_nothing(self, tmp_path: Path) -> None:
        """asyncio timeout mid-summarize: both spans ERROR + cancelled event, log and metric."""
        seen = Observed(tmp_path)
        produced: list[str] = []

        @seen.guard(summarizer="slow")
        async def summarize(text: str) -> str:
            await asyncio.sleep(30)
            produced.append("never")
            return "a summary that never came back"

        async def main() -> None:
            async with asyncio.timeout(0.05):
                await summarize("an original turn")

        with pytest.raises(TimeoutError):
            asyncio.run(main())
        assert produced == []
        spans = {s.name: s for s in seen.spans.get_finished_spans()}
        for name in ("policyhook.guard", "policyhook.summarize"):
            span = spans[name]
            assert span.status.status_code is StatusCode.ERROR, name
            assert dict(span.attributes or {})["policyhook.outcome"] == "cancelled"
            assert dict(span.attributes or {})["error.type"] == "CancelledError"
            assert "policyhook.cancelled" in [e.name for e in span.events]
        assert seen.guard.provenance("a summary that never came back").depth == 0
        assert seen.counts("policyhook.calls") == {
            (("outcome", "cancelled"), ("summarizer", "slow")): 1
        }
        assert seen.outcomes() == ["cancelled"]

    def test_a_cancelled_task_inside_the_seam_records_nothing(self, tmp_path: Path) -> None:
        """task.cancel() while the guarded block awaits: CancelledError propagates unchanged."""
        seen = Observed(tmp_path)
        started = asyncio.Event

        async def main() -> None:
            entered = started()

            async def work() -> None:
                with seen.guard.guarding("an original turn", summarizer="seam") as call:
                    entered.set()
                    await asyncio.sleep(30)
                    call.record("never recorded")

            task = asyncio.create_task(work())
            await entered.wait()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert seen.guard.provenance("never recorded").depth == 0
        assert seen.outcomes() == ["cancelled"]
        assert dict(seen.guard_span().attributes or {})["policyhook.outcome"] == "cancelled"


FORK_CHILD = textwrap.dedent(
    """
    import os, sys, threading, time
    from pathlib import Path
    import policyhook

    folder, store_path, log_path = map(Path, sys.argv[1:4])
    policy = ("apiVersion: policyhook.dev/v1\\nkind: CompactionPolicy\\n"
              "metadata: {{name: {name}}}\\nspec: {{mode: audit, rules: [{{name: r, "
              "expression: 'true', message: m}}]}}\\n")
    (folder / "p.yaml").write_text(policy.format(name="parent"))
    store = policyhook.SQLiteStore(store_path)
    guard = policyhook.Guard.from_path(folder, reload_interval=0.05, store=store,
                                       decision_log=log_path)
    summarize = guard(lambda text: "summary of " + text, summarizer="s")
    summarize("a turn in the parent")
    holding, release = threading.Event(), threading.Event()

    def hold():  # another thread inside every lock at the moment of the fork
        with store._lock, guard.ledger._lock, guard.decision_log._lock:
            holding.set()
            release.wait()

    threading.Thread(target=hold, daemon=True).start()
    holding.wait()
    pid = os.fork()
    if pid == 0:
        try:
            out = summarize("a turn in the child")  # would deadlock on an inherited lock
            assert out == "summary of a turn in the child", out
            assert guard.provenance(out).depth == 1
            revision = guard.policies.revision
            (folder / "p.yaml").write_text(policy.format(name="child"))
            deadline = time.monotonic() + 10
            while guard.policies.revision == revision and time.monotonic() < deadline:
                time.sleep(0.02)  # the child's own watcher thread must pick the edit up
            assert guard.policies.policies[0].name == "child", "child never reloaded"
            guard.close()
            os._exit(0)
        except BaseException as error:
            print("child:", repr(error), file=sys.stderr)
            os._exit(1)
    release.set()
    _, status = os.waitpid(pid, 0)
    summarize("a turn in the parent again")
    guard.close()
    sys.exit(os.waitstatus_to_exitcode(status))
    """
)


class TestFork:
    def test_a_forked_child_decides_records_and_follows_policy_edits(self, tmp_path: Path) -> None:
        """Fork while another thread holds the store, ledger and log locks: the child's first
        call completes, its summary is recorded, and its watcher reloads an edited policy."""
        folder = tmp_path / "policies"
        folder.mkdir()
        log = tmp_path / "decisions.jsonl"
        run = subprocess.run(
            [sys.executable, "-c", FORK_CHILD, str(folder), str(tmp_path / "s.db"), str(log)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert run.returncode == 0, run.stderr
        records = [r for _, r in decisionlog.read(log)]
        assert [r["outcome"] for r in records] == ["summarized"] * 3
        assert SQLiteStore(tmp_path / "s.db").live(["nothing"]) == frozenset()

    def test_an_unhashable_store_subclass_is_still_renewed_after_fork(self) -> None:
        """A store subclass defining __eq__ (so unhashable) can be used and forked with."""

        class Compared(MemoryStore):
            def __eq__(self, other: object) -> bool:
                return isinstance(other, Compared)

        guard = Guard(store=Compared())
        pid = os.fork()
        if pid == 0:  # the child: one guarded call, then out without running pytest's exit
            try:
                ok = guard.check("an original turn", summarizer="s").effect == "allow"
            finally:
                os._exit(0 if ok else 1)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0


# -- helpers ------------------------------------------------------------------------------------


def constant(text: str) -> str:
    return SUMMARY


def constant_of(messages: list[str]) -> str:
    return SUMMARY


def summary_of(text: str) -> str:
    return f"summary of {text}"


@contextlib.contextmanager
def tmpfs(where: Path, size: str) -> Iterator[Path]:
    where.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], check=True)
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def fill(where: Path) -> None:
    """Fill a filesystem to the last byte."""
    fd = os.open(where / "filler", os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (65536, 4096, 1):
            with contextlib.suppress(OSError):
                while os.write(fd, b"\0" * size):
                    pass
    finally:
        os.close(fd)
