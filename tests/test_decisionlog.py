"""The decision log: whole lines from many threads and processes, no text, trace ids, and `read`."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any
from unittest import mock

import pytest
from opentelemetry import context, trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import NonRecordingSpan, SpanContext

import policyhook
from policyhook import decisionlog
from policyhook._policy import Decision, Effect, Mode
from policyhook.decisionlog import FORMAT_VERSION, DecisionLog

RECORD_KEYS = {
    "v",
    "decision_id",
    "time",
    "revision",
    "decision",
    "mode",
    "policy",
    "rule",
    "message",
    "trace_id",
    "span_id",
    "activation",
}
ACTIVATION = {
    "region": {"id": "r:1", "kind": "summary", "depth": 2, "sources": ["cfg-42"]},
    "request": {"trigger": "automatic", "budget_pressure": 0.5, "attempt": 1},
    "window": {"id": "w", "tokens": 0, "budget": 0, "max_depth": 2},
    "summarizer": {"name": "s", "lossless": False, "idempotent": False},
}


def decision(n: int, effect: Effect = Effect.DENY) -> Decision:
    return Decision(
        decision_id=f"{n:032x}",
        effect=effect,
        revision="rev-1",
        region_id="r:1",
        depth=2,
        dead_sources=("cfg-42",),
        policy="default",
        rule="live-sources",
        message="re-summarizing a summary whose sources are gone " + "x" * 2000,  # > pipe buffer
        mode=Mode.ENFORCE,
    )


class TestWriting:
    def test_many_threads_write_whole_lines(self, tmp_path: Path) -> None:
        """16 threads x 300 decisions → 4800 well-formed records, every decision id once."""
        path = tmp_path / "decisions.jsonl"
        log = DecisionLog(path)
        threads_n, each = 16, 300
        barrier = threading.Barrier(threads_n)

        def work(t: int) -> None:
            barrier.wait()
            for i in range(each):
                log.write(decision(t * each + i), ACTIVATION, "ab" * 16, "cd" * 8)

        threads = [threading.Thread(target=work, args=(t,)) for t in range(threads_n)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(60)
        log.close()
        records = [r for _, r in decisionlog.read(path)]
        assert len(records) == threads_n * each
        assert len({r["decision_id"] for r in records}) == threads_n * each
        assert len(path.read_text().splitlines()) == threads_n * each

    def test_processes_appending_to_one_file_write_whole_lines(self, tmp_path: Path) -> None:
        """4 processes x 200 decisions appending to one log → 800 whole records."""
        path = tmp_path / "shared.jsonl"
        code = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_decisionlog import ACTIVATION, decision
            from policyhook.decisionlog import DecisionLog
            worker = int(sys.argv[1])
            with DecisionLog({str(path)!r}) as log:
                for i in range(200):
                    log.write(decision(worker * 1000 + i), ACTIVATION)
            """
        )
        workers = [subprocess.Popen([sys.executable, "-c", code, str(n)]) for n in range(4)]
        assert [w.wait(60) for w in workers] == [0, 0, 0, 0]
        records = [r for _, r in decisionlog.read(path)]
        assert len(records) == 800
        assert len({r["decision_id"] for r in records}) == 800

    def test_record_format_v1(self, tmp_path: Path) -> None:
        """A record has exactly the documented v1 keys, an RFC 3339 UTC time and the activation."""
        path = tmp_path / "one.jsonl"
        with DecisionLog(path) as log:
            log.write(
                decision(7), ACTIVATION, "0af7651916cd43dd8448eb211c80319c", "b7ad6b7169203331"
            )
        ((number, record),) = list(decisionlog.read(path))
        assert number == 1
        assert set(record) == RECORD_KEYS
        assert record["v"] == FORMAT_VERSION == 1
        assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", record["time"])
        assert record["decision"] == "deny" and record["mode"] == "enforce"
        assert record["trace_id"] == "0af7651916cd43dd8448eb211c80319c"
        assert record["span_id"] == "b7ad6b7169203331"
        assert record["activation"] == ACTIVATION

    def test_writing_after_close_is_an_error_the_guard_survives(
        self, tmp_path: Path, caplog: pytest.LogCaptureFixture
    ) -> None:
        """write() after close() raises ValueError; a guard whose log is closed still summarizes."""
        log = DecisionLog(tmp_path / "closed.jsonl")
        log.close()
        log.close()  # twice is fine
        with pytest.raises(ValueError, match="closed"):
            log.write(decision(1), ACTIVATION)
        guard = policyhook.Guard(decision_log=log)

        @guard(summarizer="s")
        def summarize(text: str) -> str:
            return "a summary of the turn"

        assert summarize("an original turn") == "a summary of the turn"
        assert "failed to write the decision log" in caplog.text


class TestFromTheGuard:
    def test_guard_records_carry_the_span_ids_and_no_text(self, tmp_path: Path) -> None:
        """Each guarded call logs one record whose trace/span ids are its policyhook.guard span's."""
        spans = InMemorySpanExporter()
        provider = TracerProvider()
        provider.add_span_processor(SimpleSpanProcessor(spans))
        guard = policyhook.Guard(tracer_provider=provider, decision_log=tmp_path / "log.jsonl")
        secret = "password=hunter2-correct-horse-battery-staple"

        @guard(summarizer="s")
        def summarize(text: str) -> str:
            return f"a summary that repeats {secret}"

        guard.record_source(f"the config says {secret}", kind="config_read", source_id="cfg")
        first = summarize(f"the config says {secret}")
        guard.store.evict("cfg")
        with pytest.raises(policyhook.UnsafeRecompactionError) as refused:
            summarize(first)
        guard.close()
        text = (tmp_path / "log.jsonl").read_text()
        assert "hunter2" not in text and "the config says" not in text
        records = [r for _, r in decisionlog.read(tmp_path / "log.jsonl")]
        by_span = {f"{s.context.span_id:016x}": s for s in spans.get_finished_spans()}
        assert [r["decision"] for r in records] == ["allow", "deny"]
        assert records[1]["decision_id"] == refused.value.decision_id
        for record in records:
            span = by_span[record["span_id"]]
            assert span.name == "policyhook.guard"
            assert record["trace_id"] == f"{span.context.trace_id:032x}"
            assert dict(span.attributes or {})["policyhook.decision_id"] == record["decision_id"]

    def test_without_a_recording_span_the_ids_are_empty(self, tmp_path: Path) -> None:
        """With no tracer provider configured, trace_id and span_id are empty strings."""
        guard = policyhook.Guard(decision_log=tmp_path / "log.jsonl")
        guard.check("an original turn", summarizer="s")
        guard.close()
        ((_, record),) = list(decisionlog.read(tmp_path / "log.jsonl"))
        assert (record["trace_id"], record["span_id"]) == ("", "")

    def test_an_incoming_trace_is_logged_without_any_sdk(self, tmp_path: Path) -> None:
        """With no provider configured, a propagated caller trace id still lands in the log."""
        incoming = SpanContext(0x0AF7651916CD43DD8448EB211C80319C, 0xB7AD6B7169203331, True)
        guard = policyhook.Guard(decision_log=tmp_path / "log.jsonl")
        token = context.attach(trace.set_span_in_context(NonRecordingSpan(incoming)))
        try:
            guard.check("an original turn", summarizer="s")
        finally:
            context.detach(token)
        guard.close()
        ((_, record),) = list(decisionlog.read(tmp_path / "log.jsonl"))
        assert record["trace_id"] == "0af7651916cd43dd8448eb211c80319c"


class TestReading:
    def test_read_yields_line_numbers_and_skips_blank_lines(self, tmp_path: Path) -> None:
        """read() gives (line number, record), counting blank lines but not yielding them."""
        path = tmp_path / "log.jsonl"
        line = json.dumps(decisionlog.record(decision(1), ACTIVATION))
        path.write_text(f"{line}\n\n{line}\n")
        assert [n for n, _ in decisionlog.read(path)] == [1, 3]

    @pytest.mark.parametrize(
        ("bad", "message"),
        [
            ("{not json", r"log\.jsonl:2: not a JSON record"),
            ('["a", "list"]', r"log\.jsonl:2: not a decision record \(no activation\)"),
            (
                '{"v": 2, "activation": {}}',
                r"log\.jsonl:2: record format v=2, this version reads v=1",
            ),
        ],
    )
    def test_a_bad_line_is_named_by_path_and_number(
        self, tmp_path: Path, bad: str, message: str
    ) -> None:
        """A line that is not a v1 record raises ValueError naming path:line."""
        path = tmp_path / "log.jsonl"
        path.write_text(json.dumps(decisionlog.record(decision(1), ACTIVATION)) + "\n" + bad + "\n")
        records = decisionlog.read(path)
        assert next(records)[0] == 1
        with pytest.raises(ValueError, match=message):
            next(records)


def big_activation(sources: int) -> dict[str, Any]:
    ids = [f"langchain:{n:08d}-message-id" for n in range(sources)]
    return {
        **ACTIVATION,
        "region": {
            "id": "r:1",
            "kind": "summary",
            "depth": 2,
            "sources": ids,
            "live_sources": ids[: sources // 2],
            "dead_sources": ids[sources // 2 :],
            "source_kinds": ["user_turn"],
        },
    }


class TestBounded:
    def test_a_record_stays_small_whatever_the_source_count(self, tmp_path: Path) -> None:
        """100,000 sources: one line far below MAX_RECORD_BYTES, with what was left out counted."""
        path = tmp_path / "log.jsonl"
        with DecisionLog(path) as log:
            log.write(decision(1), big_activation(100_000), outcome="summarized")
        assert path.stat().st_size < 16 * 1024 < decisionlog.MAX_RECORD_BYTES
        ((_, record),) = list(decisionlog.read(path))
        assert len(record["activation"]["region"]["sources"]) == decisionlog.MAX_IDS
        assert record["omitted"] == {
            "region.sources": 100_000 - decisionlog.MAX_IDS,
            "region.live_sources": 50_000 - decisionlog.MAX_IDS,
            "region.dead_sources": 50_000 - decisionlog.MAX_IDS,
        }

    def test_replay_sees_the_lists_at_their_full_length(self, tmp_path: Path) -> None:
        """`activation_of` restores each shortened list's size with placeholders."""
        path = tmp_path / "log.jsonl"
        with DecisionLog(path) as log:
            log.write(decision(1), big_activation(1_000))
        ((_, record),) = list(decisionlog.read(path))
        region = decisionlog.activation_of(record)["region"]
        assert (len(region["sources"]), len(region["dead_sources"])) == (1_000, 500)
        assert region["sources"][: decisionlog.MAX_IDS] == record["activation"]["region"]["sources"]
        assert region["sources"][-1] == f"~omitted:{1_000 - decisionlog.MAX_IDS}"

    def test_restoring_the_lists_leaves_the_record_as_read(self, tmp_path: Path) -> None:
        """A record replayed twice (or printed after replay) still holds what the file holds."""
        path = tmp_path / "log.jsonl"
        with DecisionLog(path) as log:
            log.write(decision(1), big_activation(1_000))
        ((_, record),) = list(decisionlog.read(path))
        as_read = json.dumps(record, sort_keys=True)
        first = decisionlog.activation_of(record)
        first["region"]["sources"].append("changed by a caller")
        first["window"]["id"] = "changed by a caller"
        assert json.dumps(record, sort_keys=True) == as_read
        assert decisionlog.activation_of(record)["region"]["sources"][-1].startswith("~omitted:")


class TestTornLines:
    def test_a_fragment_is_reported_and_the_record_glued_to_it_recovered(
        self, tmp_path: Path
    ) -> None:
        """A writer killed mid-line, then another appending: both whole records come back."""
        path = tmp_path / "log.jsonl"
        whole = json.dumps(decisionlog.record(decision(1), ACTIVATION), separators=(",", ":"))
        glued = json.dumps(decisionlog.record(decision(2), ACTIVATION), separators=(",", ":"))
        path.write_text(f"{whole}\n{whole[:300]}{glued}\n{whole[:10]}\n")
        damaged: list[decisionlog.Damaged] = []
        records = list(decisionlog.read(path, damaged))
        assert [(n, r["decision_id"]) for n, r in records] == [(1, f"{1:032x}"), (2, f"{2:032x}")]
        assert [d.line for d in damaged] == [2, 3]
        assert str(damaged[0]).startswith(f"{path}:2: not a JSON record")
        with pytest.raises(ValueError, match=r"log\.jsonl:2: not a JSON record"):
            list(decisionlog.read(path))  # without a list to report into: strict

    def test_after_a_failed_write_the_next_record_starts_on_a_new_line(
        self, tmp_path: Path
    ) -> None:
        """A short write (disk full) leaves a fragment; the next record is not glued to it."""
        path = tmp_path / "log.jsonl"
        log = DecisionLog(path)
        real_write, calls = os.write, []

        def short_then_fail(fd: int, data: bytes) -> int:
            calls.append(len(data))
            if len(calls) == 1:
                return real_write(fd, data[:100])
            if len(calls) == 2:
                raise OSError(28, "No space left on device")
            return real_write(fd, data)

        with mock.patch("os.write", short_then_fail), pytest.raises(OSError):
            log.write(decision(1), ACTIVATION)
        log.write(decision(2), ACTIVATION)
        log.close()
        damaged: list[decisionlog.Damaged] = []
        records = [r["decision_id"] for _, r in decisionlog.read(path, damaged)]
        assert records == [f"{2:032x}"] and [d.line for d in damaged] == [1]

    def test_writers_killed_mid_write_never_cost_a_later_record(self, tmp_path: Path) -> None:
        """100 forked writers SIGKILLed while appending 1,000-source records, then one clean
        writer: every line is a whole record or reported, and every later record is there."""
        path = tmp_path / "log.jsonl"
        code = textwrap.dedent(
            f"""
            import os, random, signal, sys, time
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_decisionlog import big_activation, decision
            from policyhook.decisionlog import DecisionLog
            activation, rng = big_activation(1_000), random.Random(7)
            for kill in range(100):
                pid = os.fork()
                if pid == 0:
                    log, n = DecisionLog({str(path)!r}), 0
                    while True:
                        n += 1
                        log.write(decision(kill * 100_000 + n), activation)
                time.sleep(rng.uniform(0.001, 0.01))
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
            """
        )
        subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
        with DecisionLog(path) as log:
            for n in range(10):
                log.write(decision(10_000_000 + n), ACTIVATION)
        damaged: list[decisionlog.Damaged] = []
        records = [r for _, r in decisionlog.read(path, damaged)]
        lines = path.read_bytes().count(b"\n")
        assert len(records) >= lines - 2 * len(damaged)  # only the damaged lines are missing
        assert [r["decision_id"] for r in records[-10:]] == [
            f"{10_000_000 + n:032x}" for n in range(10)
        ]
        assert all(r["v"] == 1 and "activation" in r for r in records)
        print(f"{lines} lines, {len(records)} records, {len(damaged)} damaged")


class TestRotation:
    def test_the_log_rotates_by_size_and_keeps_its_backups(self, tmp_path: Path) -> None:
        """max_bytes=20 KiB, backups=3: no file over the limit, the oldest dropped, none lost
        among those kept."""
        path = tmp_path / "log.jsonl"
        with DecisionLog(path, max_bytes=20_000, backups=3) as log:
            for n in range(200):
                log.write(decision(n), ACTIVATION)
        files = decisionlog.files(path)
        assert [f.name for f in files] == ["log.jsonl.3", "log.jsonl.2", "log.jsonl.1", "log.jsonl"]
        assert all(f.stat().st_size <= 20_000 for f in files)
        ids = [int(r["decision_id"], 16) for f in files for _, r in decisionlog.read(f)]
        assert ids == list(range(200 - len(ids), 200))  # the newest, in order, none missing

    def test_processes_sharing_a_rotating_log_lose_nothing(self, tmp_path: Path) -> None:
        """4 processes x 300 records, rotating every ~30 KiB with room for all backups."""
        path = tmp_path / "shared.jsonl"
        code = textwrap.dedent(
            f"""
            import sys
            sys.path.insert(0, {str(Path(__file__).parent)!r})
            from test_decisionlog import ACTIVATION, decision
            from policyhook.decisionlog import DecisionLog
            worker = int(sys.argv[1])
            with DecisionLog({str(path)!r}, max_bytes=30_000, backups=1000) as log:
                for i in range(300):
                    log.write(decision(worker * 1000 + i, "allow"), ACTIVATION)
            """
        )
        workers = [subprocess.Popen([sys.executable, "-c", code, str(n)]) for n in range(4)]
        assert [w.wait(120) for w in workers] == [0, 0, 0, 0]
        files = decisionlog.files(path)
        ids = [r["decision_id"] for f in files for _, r in decisionlog.read(f)]
        assert len(files) > 10
        assert sorted(ids) == sorted(f"{w * 1000 + i:032x}" for w in range(4) for i in range(300))

    def test_bad_limits_are_refused(self, tmp_path: Path) -> None:
        with pytest.raises(ValueError, match='"max_bytes" and "backups" must be >= 0'):
            DecisionLog(tmp_path / "log.jsonl", max_bytes=-1)


class TestOnlyRegularFiles:
    def test_a_fifo_is_refused_at_once_for_writing_and_reading(self, tmp_path: Path) -> None:
        """A FIFO as --decision-log or replay input: a clear error within a second, no hang."""
        fifo = tmp_path / "log.fifo"
        os.mkfifo(fifo)
        started = time.monotonic()
        with pytest.raises(ValueError, match="not a regular file"):
            DecisionLog(fifo)
        with pytest.raises(ValueError, match="not a regular file"):
            policyhook.Guard(decision_log=fifo)
        with pytest.raises(ValueError, match="not a regular file"):
            list(decisionlog.read(fifo))
        reader = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # even with a reader attached
        try:
            with pytest.raises(ValueError, match="not a regular file"):
                DecisionLog(fifo)
        finally:
            os.close(reader)
        assert time.monotonic() - started < 1.0

    def test_a_directory_is_refused(self, tmp_path: Path) -> None:
        with pytest.raises((ValueError, IsADirectoryError)):
            DecisionLog(tmp_path)
