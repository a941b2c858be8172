"""`policyhook claude-precompact` through the installed entry point, on Claude Code transcripts."""

from __future__ import annotations

import dataclasses
import io
import json
import os
import re
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path
from typing import Any

import pytest
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from outage import one_fault, store_down
from test_telemetry import OtlpReceiver
from test_telemetry import receiver as receiver  # the fixture

from policyhook import Effect, Guard, MemoryStore, Region, SQLiteStore, Store, remedies
from policyhook._telemetry import SPAN_NAME
from policyhook.adapters.claude_code import answer, decide, read_transcript
from policyhook.testing import capture_decisions

FIXTURES = Path(__file__).parent / "fixtures" / "claude"
POLICYHOOK = Path(sys.executable).parent / "policyhook"
SESSION = "5d1a6f0e-3b7c-4c55-9a11-0c2f4e8b9d01"


def source(uuid: str) -> str:
    return f"claude:{SESSION}:{uuid}"


def hook_input(transcript: str | Path, trigger: str = "manual") -> dict[str, Any]:
    """A PreCompact input; manual by default (a refused manual compaction is blocked; a refused
    automatic one is let through with its facts pinned, tested in TestAutomaticRefusals)."""
    path = transcript if isinstance(transcript, Path) else FIXTURES / f"{transcript}.jsonl"
    return {
        "session_id": SESSION,
        "transcript_path": str(path),
        "cwd": "/home/dev/app",
        "hook_event_name": "PreCompact",
        "trigger": trigger,
        "custom_instructions": "",
    }


class Hook:
    """Runs the real command with a store and a decision log under tmp_path."""

    def __init__(self, tmp_path: Path) -> None:
        self.store = tmp_path / "store.sqlite"
        self.log = tmp_path / "decisions.jsonl"
        self.state = tmp_path / "state"

    def __call__(
        self, stdin: dict[str, Any] | str, *options: str
    ) -> subprocess.CompletedProcess[str]:
        text = stdin if isinstance(stdin, str) else json.dumps(stdin)
        command = [str(POLICYHOOK), "claude-precompact", "--store", str(self.store)]
        command += ["--decision-log", str(self.log), "--state-dir", str(self.state), *options]
        return subprocess.run(command, input=text, capture_output=True, text=True, timeout=60)

    def last(self) -> dict[str, Any]:
        record: dict[str, Any] = json.loads(self.log.read_text().splitlines()[-1])
        return record

    def held(self, *ids: str) -> frozenset[str]:
        with SQLiteStore(self.store) as store:
            return store.live(ids)


@pytest.fixture
def hook(tmp_path: Path) -> Hook:
    return Hook(tmp_path)


def blocked(result: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    """The block answer, checked against the protocol: exit 0, one JSON object on stdout."""
    assert result.returncode == 0, result.stderr
    answer: dict[str, Any] = json.loads(result.stdout)
    assert answer["decision"] == "block" and set(answer) == {"decision", "reason"}
    return answer


def allowed(result: subprocess.CompletedProcess[str]) -> None:
    assert (result.returncode, result.stdout, result.stderr) == (0, "", "")


class TestDecisions:
    def test_first_compaction_is_allowed_and_archives_the_window(self, hook: Hook) -> None:
        """Compacting originals is allowed; every original on the chain is put in the store."""
        allowed(hook(hook_input("fresh")))
        record = hook.last()
        assert record["decision"] == "allow"
        assert record["activation"]["region"]["depth"] == 0
        assert record["activation"]["summarizer"]["name"] == "claude-code.compact"
        ids = [source(u) for u in ("u1-0000", "a1-0000", "u2-0000", "a2-0000", "a3-0000")]
        assert hook.held(*ids, source("m1-0000")) == frozenset(ids)  # isMeta is not evidence
        with SQLiteStore(hook.store) as store:
            kinds = {s.id: s.kind for s, _ in store.sources(100)}
            assert store.get_source(source("a1-0000")) == (
                "Let me read the retry settings first.\n"
                '[tool call] Read({"file_path": "/home/dev/app/config/agent.yaml"})'
            )
        assert kinds[source("u2-0000")] == "tool_output"
        assert kinds[source("u1-0000")] == "user_turn"
        assert kinds[source("a2-0000")] == "ai_turn"

    def test_recompaction_is_allowed_while_the_history_is_readable(self, hook: Hook) -> None:
        """The summary's originals are in the transcript, so they are archived and live."""
        allowed(hook(hook_input("compacted")))
        region = hook.last()["activation"]["region"]
        assert (region["depth"], region["dead_sources"]) == (1, [])
        assert source("u2-0000") in region["live_sources"]  # the config read behind the summary
        # the abandoned branch and the subagent sidechain are not in the active window
        assert hook.held(source("x1-0000"), source("sc1-0000")) == frozenset()

    def test_summary_without_history_is_blocked(self, hook: Hook) -> None:
        """A continued session whose summary's originals nobody archived is blocked."""
        answer = blocked(hook(hook_input("resumed")))
        assert "live-sources" in answer["reason"]
        record = hook.last()
        assert record["decision"] == "deny"
        assert [d.split(":")[0] for d in record["activation"]["region"]["dead_sources"]] == [
            "untraced"
        ]

    def test_store_keeps_the_originals_for_a_continued_session(self, hook: Hook) -> None:
        """Once the store archived the history, the same summary is allowed without it."""
        allowed(hook(hook_input("compacted")))
        allowed(hook(hook_input("resumed")))
        region = hook.last()["activation"]["region"]
        assert region["depth"] == 1 and source("u2-0000") in region["live_sources"]

    def test_evicted_original_blocks_the_next_compaction(self, hook: Hook) -> None:
        """When the store evicts an original the transcript no longer has, re-compaction stops."""
        allowed(hook(hook_input("compacted")))
        with SQLiteStore(hook.store) as store:
            assert store.evict(source("u2-0000"))
        answer = blocked(hook(hook_input("resumed")))
        assert "1 of 10 sources gone" in answer["reason"]
        assert hook.last()["activation"]["region"]["dead_sources"] == [source("u2-0000")]

    @pytest.mark.parametrize("evicted", [True, False])
    def test_an_entry_rewritten_under_its_old_id_is_archived_under_its_own(
        self, hook: Hook, tmp_path: Path, evicted: bool
    ) -> None:
        """An entry whose text changed (a transcript rewritten, or read differently) while the
        store holds or has evicted its old text: a source id names one text, so the new text is
        archived under an id derived from it, and the compaction is decided, not failed."""
        allowed(hook(hook_input("fresh")))
        if evicted:
            with SQLiteStore(hook.store) as store:
                assert store.evict(source("u1-0000"))
        rewritten = tmp_path / "rewritten.jsonl"
        lines = (FIXTURES / "fresh.jsonl").read_text().splitlines()
        for n, line in enumerate(lines):
            entry = json.loads(line)
            if entry.get("uuid") == "u1-0000":
                entry["message"]["content"] = "The deploy step times out. Retry it, per config."
                lines[n] = json.dumps(entry)
        rewritten.write_text("\n".join(lines) + "\n")
        allowed(hook(hook_input(rewritten)))
        with SQLiteStore(hook.store) as store:
            held = {text: s.id for s, text in store.sources(100)}
        new_id = held["The deploy step times out. Retry it, per config."]
        assert new_id.startswith(source("u1-0000") + ":")
        assert hook.held(source("u1-0000")) == (set() if evicted else {source("u1-0000")})
        region = hook.last()["activation"]["region"]
        assert new_id in region["live_sources"] and region["dead_sources"] == []

    def test_second_compaction_goes_one_pass_deeper(self, hook: Hook) -> None:
        """After two boundaries the window holds a depth-2 summary resting on every original."""
        allowed(hook(hook_input("compacted_twice")))
        region = hook.last()["activation"]["region"]
        assert region["depth"] == 2 and len(region["live_sources"]) == 12

    def test_policy_sees_the_trigger(self, hook: Hook) -> None:
        """--policies: a depth limit for automatic compaction refuses auto (blocked with
        --on-auto-refusal block), lets manual through."""
        policy = str(FIXTURES / "depth-limit.yaml")
        refused = hook(
            hook_input("compacted_twice", "auto"),
            "--policies",
            policy,
            "--on-auto-refusal",
            "block",
        )
        answer = blocked(refused)
        assert "summary of a summary" in answer["reason"]
        allowed(hook(hook_input("compacted_twice", "manual"), "--policies", policy))
        assert hook.last()["activation"]["request"]["trigger"] == "manual"

    def test_audit_mode_warns_without_blocking(self, hook: Hook, tmp_path: Path) -> None:
        """An audit-mode policy answers with a systemMessage and lets the compaction run."""
        text = resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")
        audit = tmp_path / "audit.yaml"
        audit.write_text(text.replace("mode: enforce", "mode: audit"))
        result = hook(hook_input("resumed"), "--policies", str(audit))
        assert result.returncode == 0
        answer = json.loads(result.stdout)
        assert set(answer) == {"systemMessage"} and "would block" in answer["systemMessage"]
        assert hook.last()["decision"] == "would_deny"

    def test_budget_pressure_comes_from_the_last_turn_usage(self, hook: Hook) -> None:
        """request.budget_pressure is the last assistant turn's context over --context-window."""
        allowed(hook(hook_input("fresh"), "--context-window", "321804"))
        activation = hook.last()["activation"]
        assert activation["window"]["tokens"] == 160902
        assert activation["request"]["budget_pressure"] == pytest.approx(0.5)

    def test_torn_last_line_is_skipped(self, hook: Hook, tmp_path: Path) -> None:
        """A half-written last line (the transcript is written asynchronously) is ignored."""
        transcript = tmp_path / "torn.jsonl"
        shutil.copy(FIXTURES / "compacted.jsonl", transcript)
        with transcript.open("a") as f:
            f.write('{"parentUuid":"a5-0000","type":"user","message":{"role":"us')
        allowed(hook(hook_input(transcript)))
        assert hook.last()["activation"]["region"]["depth"] == 1


def stuck_run(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    """The hook run with --time-budget 0.5 on a stdin that never closes, until it exits."""
    command = [str(POLICYHOOK), "claude-precompact", "--store", str(tmp_path / "s.sqlite")]
    command += ["--time-budget", "0.5"]
    with subprocess.Popen(
        command,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    ) as process:
        assert process.stdout is not None and process.stderr is not None
        out, err = process.stdout.read(), process.stderr.read()  # EOF: the hook has exited
        code = process.wait(timeout=60)
    return subprocess.CompletedProcess(command, code, out, err)


def calls(receiver: OtlpReceiver) -> list[dict[str, str]]:
    """The attributes of every `policyhook.calls` point the receiver was sent."""
    from opentelemetry.proto.collector.metrics.v1.metrics_service_pb2 import (
        ExportMetricsServiceRequest,
    )

    return [
        {a.key: a.value.string_value for a in point.attributes}
        for r in receiver.requests
        if r.path == "/v1/metrics"
        for rm in ExportMetricsServiceRequest.FromString(r.body).resource_metrics
        for sm in rm.scope_metrics
        for m in sm.metrics
        if m.name == "policyhook.calls"
        for point in m.sum.data_points
    ]


def undecided(result: subprocess.CompletedProcess[str], error: str) -> str:
    """The fail-closed answer: exit 0, a block whose reason says the hook could not decide."""
    reason: str = blocked(result)["reason"]
    assert reason.startswith("policyhook could not decide, so the compaction is blocked")
    assert error in reason and error in result.stderr, (reason, result.stderr)
    return reason


def write_lines(path: Path, *lines: dict[str, Any] | str | bytes) -> Path:
    """A transcript of the given lines: dicts as JSON, str and bytes as they are."""
    with path.open("wb") as f:
        for line in lines:
            if isinstance(line, dict):
                line = json.dumps(line)
            f.write(line if isinstance(line, bytes) else line.encode("utf-8", "surrogatepass"))
            f.write(b"\n")
    return path


def entry(uuid: str, parent: Any, text: str, kind: str = "user", **extra: Any) -> dict[str, Any]:
    """One conversation entry in Claude Code's shape."""
    content: Any = [{"type": "text", "text": text}] if kind == "assistant" else text
    return {
        "parentUuid": parent,
        "isSidechain": False,
        "sessionId": SESSION,
        "type": kind,
        "message": {"role": kind, "content": content},
        "uuid": uuid,
        **extra,
    }


def boundary(uuid: str, logical: Any) -> dict[str, Any]:
    return {
        "parentUuid": None,
        "logicalParentUuid": logical,
        "isSidechain": False,
        "type": "system",
        "subtype": "compact_boundary",
        "content": "Conversation compacted",
        "sessionId": SESSION,
        "uuid": uuid,
        "compactMetadata": {"trigger": "auto", "preTokens": 167094},
    }


def summary(uuid: str, parent: str, text: str) -> dict[str, Any]:
    return entry(uuid, parent, text, isCompactSummary=True, isVisibleInTranscriptOnly=True)


HISTORY = [
    entry("h1", None, "Deploy with retries; config/agent.yaml sets the ceiling."),
    entry("h2", "h1", "The retry ceiling is 7.", "assistant"),
]
COMPACTED = [
    *HISTORY,
    boundary("b1", "h2"),
    summary("s1", "b1", "Summary: deploying with a retry ceiling of 7 (config/agent.yaml)."),
    entry("n1", "s1", "Go on."),
]


class TestTranscriptsAsClaudeCodeWritesThem:
    """Shapes real Claude Code versions write, each read the way Claude Code reads it."""

    def test_boundary_whose_logical_parent_was_never_written(self, hook: Hook) -> None:
        """2.1.39: logicalParentUuid names an entry never written; the boundary links to the last
        main-chain entry before it, so the history is traced and re-compaction is allowed."""
        allowed(hook(hook_input("lost_parent")))
        region = hook.last()["activation"]["region"]
        assert (region["depth"], region["dead_sources"]) == (1, [])
        assert source("u2-0000") in region["live_sources"]  # the config read behind the summary
        assert source("x1-0000") not in region["live_sources"]  # the abandoned branch

    def test_boundary_logical_parent_not_in_the_file(self, hook: Hook, tmp_path: Path) -> None:
        """The same, hand-written: the boundary links to the last main-chain entry before it."""
        lines = [*HISTORY, boundary("b1", "never-written"), *COMPACTED[3:]]
        allowed(hook(hook_input(write_lines(tmp_path / "t.jsonl", *lines))))
        assert hook.last()["activation"]["region"]["live_sources"] == [
            source("h1"),
            source("h2"),
            source("n1"),
        ]

    def test_preserved_segment_follows_the_summary(self) -> None:
        """Messages a boundary preserved are read after its summary, not as summarized history."""
        first, second = read_transcript(FIXTURES / "preserved.jsonl").segments
        before = [o.source_id.rsplit(":", 1)[1] for o in first.originals]
        after = [o.source_id.rsplit(":", 1)[1] for o in second.originals]
        assert before == ["u1-0000", "a1-0000", "u2-0000", "a2-0000"]
        assert after[:3] == ["u3-0000", "a3-0000", "u4-0000"] and second.summary is not None

    def test_preserved_segment_is_allowed_once_archived(self, hook: Hook) -> None:
        """The summary rests on the history before the preserved messages, all archived."""
        allowed(hook(hook_input("preserved")))
        region = hook.last()["activation"]["region"]
        assert (region["depth"], region["dead_sources"]) == (1, [])
        assert source("u2-0000") in region["live_sources"]

    def test_results_of_parallel_tool_calls_are_read_beside_the_chain(
        self, hook: Hook, tmp_path: Path
    ) -> None:
        """One record per content block: the first of two parallel tool calls' results hangs
        off the chain, and is still evidence, archived."""

        def call(tool: str) -> dict[str, Any]:
            block = {"type": "tool_use", "id": tool, "name": "Read", "input": {}}
            return {"role": "assistant", "id": "msg_1", "content": [block]}

        def result(tool: str, text: str) -> dict[str, Any]:
            block = {"type": "tool_result", "tool_use_id": tool, "content": text}
            return {"role": "user", "content": [block]}

        transcript = write_lines(
            tmp_path / "parallel.jsonl",
            entry("u1", None, "Read both files."),
            entry("c1", "u1", "", "assistant", message=call("t1")),
            entry("c2", "c1", "", "assistant", message=call("t2")),
            entry("r1", "c1", "", message=result("t1", "ceiling: 7")),
            entry("r2", "c2", "", message=result("t2", "no match")),
            entry("a1", "r2", "Done.", "assistant"),
        )
        allowed(hook(hook_input(transcript)))
        assert hook.held(source("r1"), source("r2")) == {source("r1"), source("r2")}


class TestMalformedTranscripts:
    """Every malformed transcript gets a deliberate answer (docs/claude-code.md lists them)."""

    def test_invalid_utf8_bytes_are_replaced(self, hook: Hook, tmp_path: Path) -> None:
        """A byte that is not UTF-8 is read as U+FFFD, never a crash."""
        line = json.dumps(entry("u1", None, "ceiling 7 XX")).encode().replace(b"XX", b"\xff\xfe")
        allowed(hook(hook_input(write_lines(tmp_path / "t.jsonl", line))))
        with SQLiteStore(hook.store) as store:
            assert store.get_source(source("u1")) == "ceiling 7 \ufffd\ufffd"

    def test_lone_surrogate_escape_is_replaced(self, hook: Hook, tmp_path: Path) -> None:
        """A cut emoji (a lone `\\ud83d` escape) in the JSON is stored as U+FFFD."""
        line = json.dumps(entry("u1", None, "done CUT")).replace("CUT", "\\ud83d")
        allowed(hook(hook_input(write_lines(tmp_path / "t.jsonl", line))))
        with SQLiteStore(hook.store) as store:
            assert store.get_source(source("u1")) == "done \ufffd"

    def test_lines_off_the_chain_that_are_not_objects_are_left_out(
        self, hook: Hook, tmp_path: Path
    ) -> None:
        """A line that is not a JSON object and that the chain does not need changes nothing."""
        lines: list[Any] = [HISTORY[0], "not json", "[1, 2]", "", HISTORY[1]]
        allowed(hook(hook_input(write_lines(tmp_path / "t.jsonl", *lines))))
        assert hook.last()["activation"]["region"]["depth"] == 0

    def test_wrong_types_are_not_evidence(self, hook: Hook, tmp_path: Path) -> None:
        """A message that is not an object, content that is not text and usage counts that are
        not token counts are ignored; the rest is read."""
        usage = {"input_tokens": "9", "output_tokens": 1e300, "cache_read_input_tokens": True}
        transcript = write_lines(
            tmp_path / "t.jsonl",
            entry("u1", None, "hello"),
            entry("a1", "u1", "", "assistant", message="not an object"),
            entry("a2", "a1", "hi", "assistant", isSidechain="no"),
            entry("a3", "a2", "", "assistant", message={"content": 42, "usage": usage}),
        )
        allowed(hook(hook_input(transcript)))
        assert hook.last()["activation"]["window"]["tokens"] == 0
        assert hook.held(source("u1"), source("a2")) == {source("u1"), source("a2")}

    @pytest.mark.parametrize(
        ("lines", "error"),
        [
            (["{torn", *COMPACTED[1:]], "its parent h1 is not in the transcript"),
            ([entry("u1", "u2", "a"), entry("u2", "u1", "b")], "parentUuid links form a cycle"),
            ([entry("u1", 7, "a")], "parentUuid is a int"),
            ([*HISTORY, boundary("b1", "h2")], "summary of compaction 1 is not in the transcript"),
            ([*HISTORY, boundary("b1", 5), *COMPACTED[3:]], "logicalParentUuid is a int"),
            ([*HISTORY, boundary("b1", None), *COMPACTED[3:]], "dead source"),
            (
                [*HISTORY, '{"type":"user","isCompactSummary":true,"message":{"content":"Sum'],
                "line 3 names a compaction but is not JSON",
            ),
            ([*COMPACTED[:3], summary("s1", "b1", " "), COMPACTED[4]], "summary without text"),
        ],
        ids=[
            "chain-gap",
            "cycle",
            "parent-type",
            "no-summary",
            "logical-type",
            "logical-none",
            "torn-summary",
            "empty-summary",
        ],
    )
    def test_what_cannot_be_read_counts_as_untraced(
        self, hook: Hook, tmp_path: Path, lines: list[Any], error: str
    ) -> None:
        """History or a summary the hook cannot read is an untraced summary: blocked by the
        default policy, and the reason names the line."""
        answer = blocked(hook(hook_input(write_lines(tmp_path / "t.jsonl", *lines))))
        assert error in answer["reason"], answer["reason"]
        dead = hook.last()["activation"]["region"]["dead_sources"]
        assert any(d.startswith("untraced:") for d in dead)

    def test_over_long_line_is_left_out_unless_it_names_a_compaction(
        self, hook: Hook, tmp_path: Path
    ) -> None:
        """--max-line-bytes: a longer line is skipped in bounded memory; one naming a compaction
        blocks."""
        big = json.dumps(entry("x1", None, "y" * 5000))
        allowed(
            hook(
                hook_input(write_lines(tmp_path / "t.jsonl", big, *HISTORY)),
                "--max-line-bytes",
                "4096",
            )
        )
        marked = big.replace('"isSidechain"', '"isCompactSummary":true,"isSidechain"')
        transcript = write_lines(tmp_path / "t.jsonl", marked, *HISTORY)
        answer = blocked(hook(hook_input(transcript), "--max-line-bytes", "4096"))
        assert "line 1 names a compaction but is over 4,096 bytes" in answer["reason"]


class TestUndecidable:
    """When the hook cannot decide it blocks with exit 0: any non-zero exit but 2 would let
    Claude Code compact ungated, and 2 is lost when hooks run through PowerShell."""

    @pytest.mark.parametrize(
        ("stdin", "options", "error"),
        [
            ("not json", (), "not the hook input JSON"),
            ("[" * 100_000, (), "not the hook input JSON"),
            ('["PreCompact"]', (), "must be a JSON object"),
            ({**hook_input("fresh"), "trigger": "sometimes"}, (), '"trigger" must be auto'),
            ({**hook_input("fresh"), "trigger": ["auto"]}, (), '"trigger" must be auto'),
            ({**hook_input("fresh"), "hook_event_name": "Stop"}, (), "must be PreCompact"),
            ({**hook_input("fresh"), "session_id": 7}, (), '"session_id" must be'),
            ({**hook_input("fresh"), "transcript_path": None}, (), '"transcript_path" must be'),
            (hook_input(Path("/nonexistent/t.jsonl")), (), "cannot read transcript"),
            (hook_input(Path("/dev/zero")), (), "not a regular file (a character device)"),
            (hook_input(FIXTURES), (), "not a regular file (a directory)"),
            (hook_input("fresh"), ("--no-such-option",), "unrecognized arguments"),
            (hook_input("fresh"), ("--context-window", "0"), "must be > 0"),
            (hook_input("fresh"), ("--time-budget", "nan"), "must be > 0"),
            (hook_input("fresh"), ("--policies", "/nonexistent/policies"), "nonexistent"),
            (hook_input("fresh"), ("--max-transcript-bytes", "100"), "over the limit of 100"),
        ],
    )
    def test_bad_input_is_blocked_with_the_reason(
        self, hook: Hook, stdin: Any, options: tuple[str, ...], error: str
    ) -> None:
        """Each kind of bad input: a block naming the problem (also on stderr), exit 0."""
        undecided(hook(stdin, *options), error)

    def test_stdin_over_the_limit(self, hook: Hook) -> None:
        undecided(hook(" " * (1024 * 1024 + 1)), "over 1,048,576 bytes")

    @pytest.mark.parametrize(
        ("content", "error"),
        [
            (b"", "the transcript is empty"),
            (b"\n\n", "no main-chain user or assistant entry"),
            (b'{"type":"summary","summary":"x","leafUuid":"u1"}\n', "no main-chain user"),
        ],
    )
    def test_transcript_without_a_conversation(
        self, hook: Hook, tmp_path: Path, content: bytes, error: str
    ) -> None:
        """An empty file or one without any conversation entry cannot be traced: blocked."""
        path = tmp_path / "t.jsonl"
        path.write_bytes(content)
        undecided(hook(hook_input(path)), error)

    def test_fifo_transcript_is_refused_at_once(self, hook: Hook, tmp_path: Path) -> None:
        """A FIFO is never opened for a blocking read (nobody writes to it)."""
        fifo = tmp_path / "t.jsonl"
        os.mkfifo(fifo)
        undecided(hook(hook_input(fifo)), "not a regular file (a FIFO)")

    def test_sparse_gigabyte_transcript_is_refused_unread(self, hook: Hook, tmp_path: Path) -> None:
        """A 1 GB sparse file is over --max-transcript-bytes: refused from its size alone."""
        path = tmp_path / "t.jsonl"
        with path.open("wb") as f:
            f.truncate(1 << 30)
        undecided(hook(hook_input(path)), "is 1,073,741,824 bytes, over the limit")

    def test_zeros_without_a_newline_are_read_in_bounded_memory(
        self, hook: Hook, tmp_path: Path
    ) -> None:
        """A 64 MB line of NULs under the size limit is skipped in chunks, then refused empty."""
        path = tmp_path / "t.jsonl"
        with path.open("wb") as f:
            f.truncate(64 << 20)
        undecided(hook(hook_input(path), "--max-line-bytes", "1048576"), "no main-chain user")

    @pytest.mark.parametrize("option", ["--decision-log", "--store"])
    @pytest.mark.parametrize(
        ("path", "kind"), [("fifo", "a FIFO"), ("/dev/zero", "a character device")]
    )
    def test_fifo_or_device_log_or_store_is_refused(
        self, tmp_path: Path, option: str, path: str, kind: str
    ) -> None:
        """A FIFO would block the open, /dev/zero fill the disk: refused before opening."""
        target = tmp_path / path
        if path == "fifo":
            os.mkfifo(target)
        command = [str(POLICYHOOK), "claude-precompact", "--store", str(tmp_path / "s.sqlite")]
        result = subprocess.run(
            [*command, option, str(target)],
            input=json.dumps(hook_input("fresh")),
            capture_output=True,
            text=True,
            timeout=60,
        )
        undecided(result, f"is not a regular file ({kind})")

    def test_fifo_in_the_policy_folder_is_blocked(self, hook: Hook, tmp_path: Path) -> None:
        """A FIFO among the policies never hangs the session: blocked, naming the file."""
        fifo = tmp_path / "policies" / "p.yaml"
        fifo.parent.mkdir()
        os.mkfifo(fifo)
        options = ("--policies", str(fifo.parent), "--time-budget", "5")
        undecided(hook(hook_input("fresh"), *options), str(fifo))

    def test_bad_policy_file_is_blocked(self, hook: Hook, tmp_path: Path) -> None:
        policy = tmp_path / "p.yaml"
        policy.write_text("apiVersion: [")
        undecided(hook(hook_input("fresh"), "--policies", str(policy)), str(policy))

    def test_time_budget_answers_instead_of_hanging(self, tmp_path: Path) -> None:
        """Whatever hangs (here stdin never closes), past --time-budget the hook blocks and
        exits."""
        undecided(stuck_run(tmp_path), "no decision within the time budget of 0.5 s")

    def test_help_exits_0(self) -> None:
        command = [str(POLICYHOOK), "claude-precompact", "--help"]
        result = subprocess.run(command, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0 and "--time-budget" in result.stdout


class TestTelemetry:
    """The hook exports over OTLP when the environment names an endpoint (policyhook.otel)."""

    @pytest.fixture
    def env(self, monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
        for name in list(os.environ):
            if name.startswith("OTEL_"):
                monkeypatch.delenv(name)
        return monkeypatch

    @pytest.mark.parametrize(
        ("variable", "path"),
        [("OTEL_EXPORTER_OTLP_ENDPOINT", ""), ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "/v1/traces")],
    )
    def test_decisions_are_exported_when_an_endpoint_is_set(
        self,
        hook: Hook,
        receiver: OtlpReceiver,
        env: pytest.MonkeyPatch,
        variable: str,
        path: str,
    ) -> None:
        """The decision span reaches the collector, as service policyhook-claude-code."""
        env.setenv(variable, receiver.endpoint + path)
        env.setenv("OTEL_METRICS_EXPORTER", "none")
        allowed(hook(hook_input("fresh")))
        spans = [(resource, s) for resource, s in receiver.spans() if s.name == SPAN_NAME]
        assert [resource["service.name"] for resource, _ in spans] == ["policyhook-claude-code"]

    def test_an_undecidable_run_is_traced_and_counted(
        self, hook: Hook, receiver: OtlpReceiver, env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A run the hook cannot decide (here: an empty transcript) is blocked, and operators
        see it beside the decisions: a guard span with status ERROR, `error.type` and
        `policyhook.outcome=undecided`, counted in `policyhook.calls`; the reason's text stays
        out of telemetry (it goes to stderr and the answer)."""
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        empty = tmp_path / "empty.jsonl"
        empty.write_bytes(b"")
        undecided(hook(hook_input(empty)), "the transcript is empty")
        (span,) = [s for _, s in receiver.spans() if s.name == SPAN_NAME]
        attributes = {a.key: a.value.string_value for a in span.attributes}
        assert attributes["policyhook.outcome"] == "undecided"
        assert attributes["error.type"] == "HookError"
        assert span.status.code == 2 and span.status.message == "undecided: HookError"
        assert "empty" not in str(span)  # (the reason: on stderr and in the answer only)
        assert calls(receiver) == [{"outcome": "undecided", "summarizer": "claude-code.compact"}]
        assert hook.log.read_text() == ""  # no decision, so no decision-log line

    def test_a_run_past_its_time_budget_is_traced_and_counted(
        self, receiver: OtlpReceiver, env: pytest.MonkeyPatch, tmp_path: Path
    ) -> None:
        """A run stuck past --time-budget (stdin never closes) answers block, then exports
        its undecided span (`error.type` TimeoutError) and count before it exits: the stuck
        worker never would, and operators would not see the refusal."""
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        undecided(stuck_run(tmp_path), "time budget of 0.5 s")
        (span,) = [s for _, s in receiver.spans() if s.name == SPAN_NAME]
        attributes = {a.key: a.value.string_value for a in span.attributes}
        assert attributes["policyhook.outcome"] == "undecided"
        assert attributes["error.type"] == "TimeoutError"
        assert span.status.code == 2 and span.status.message == "undecided: TimeoutError"
        assert calls(receiver) == [{"outcome": "undecided", "summarizer": "claude-code.compact"}]

    def test_no_endpoint_no_export(
        self, hook: Hook, receiver: OtlpReceiver, env: pytest.MonkeyPatch
    ) -> None:
        """Without an endpoint variable nothing is set up (no exporter trying localhost)."""
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")  # would fail if configured
        allowed(hook(hook_input("fresh")))
        assert receiver.requests == []

    def test_a_telemetry_set_up_failure_never_breaks_the_hook(
        self, hook: Hook, receiver: OtlpReceiver, env: pytest.MonkeyPatch
    ) -> None:
        """An unusable OTLP configuration is noted on stderr; the decision is made and answered."""
        env.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", receiver.endpoint)
        env.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "carrier-pigeon")
        result = hook(hook_input("fresh"))
        assert (result.returncode, result.stdout) == (0, "")
        assert "telemetry disabled" in result.stderr and "carrier-pigeon" in result.stderr
        assert hook.last()["decision"] == "allow"


def test_read_transcript_follows_the_active_chain() -> None:
    """Segments follow parentUuid and logicalParentUuid; branches and sidechains are left out."""
    transcript = read_transcript(FIXTURES / "compacted.jsonl")
    assert transcript.history_complete
    first, second = transcript.segments
    assert first.summary is None and second.summary is not None
    assert [o.source_id.rsplit(":", 1)[1] for o in second.originals] == [
        "u4-0000",
        "a4-0000",
        "u5-0000",
        "a5-0000",
    ]
    assert not read_transcript(FIXTURES / "resumed.jsonl").history_complete


def test_decision_is_traced_like_a_decorated_call() -> None:
    """In-process `decide` emits the policyhook.guard span and notifies listeners."""
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    guard = Guard(tracer_provider=provider)
    with capture_decisions(guard) as seen:
        decision = decide(hook_input("resumed", "manual"), guard)
    assert decision.effect == "deny" and seen[0][0] is decision
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "policyhook.guard"]
    assert span.attributes is not None
    assert span.attributes["policyhook.summarizer"] == "claude-code.compact"
    assert span.attributes["policyhook.trigger"] == "manual"
    assert span.attributes["policyhook.window.id"] == SESSION
    assert span.status.status_code.name == "ERROR"


@pytest.mark.parametrize("kind", ["memory", "sqlite"])
def test_a_refused_compaction_stays_refused_whichever_store_call_fails(
    tmp_path: Path, kind: str
) -> None:
    """The history archived by an earlier run, one of its originals evicted since: the continued
    session's compaction is refused. With any one store call of the decision failing, or the
    store down, it is refused still, or the decision raises (`run` then blocks the compaction
    as undecided): never allowed."""
    store: Store = MemoryStore() if kind == "memory" else SQLiteStore(tmp_path / "s.db")
    guard = Guard(store=store)
    assert decide(hook_input("compacted"), guard).effect == "allow"  # the history archived
    assert store.evict(source("u2-0000"))  # the config read behind the summary
    with one_fault([store], 0) as calls:
        assert decide(hook_input("resumed"), guard).effect == "deny"
    assert len(calls) > 5  # the sweep is not vacuous

    def refused() -> bool:
        try:
            return decide(hook_input("resumed"), guard).effect == "deny"
        except OSError:  # (ConnectionError and StoreUnavailableError are OSErrors)
            return True

    for at in range(1, len(calls) + 1):
        with one_fault([store], at) as made:
            assert refused(), (at, made)
    with store_down(store):
        assert refused()


REAL = FIXTURES / "real"
REAL_SESSION = "4d5611e5-241a-462a-8d15-5122611a9569"


class TestRealTranscripts:
    """Transcripts Claude Code wrote, from public repositories (real/README.md says whence)."""

    def hook_input(self, name: str, trigger: str = "manual") -> dict[str, Any]:
        return {**hook_input(REAL / name, trigger), "session_id": REAL_SESSION}

    def test_read_as_claude_code_wrote_it(self) -> None:
        """2.1.39 after an automatic compaction: the boundary (whose logical parent was never
        written), the real 16 KB summary, SessionStart hook progress records on the chain."""
        transcript = read_transcript(REAL / "spotter-4d5611e5-after-compaction.jsonl")
        (segment,) = transcript.segments
        assert segment.summary is not None and segment.originals == [] and segment.unread == []
        assert segment.summary[1].startswith("This session is being continued")
        assert len(segment.summary[1]) > 15_000
        assert not transcript.history_complete
        assert transcript.tokens == 3 + 14600 + 21478 + 9  # the last assistant record's usage

    def test_summary_without_its_history_is_blocked(self, hook: Hook) -> None:
        """The file holds none of the history the summary replaced and the store never saw it
        made: the summary rests on an untraced source, so it is not summarized again."""
        answer = blocked(hook(self.hook_input("spotter-4d5611e5-after-compaction.jsonl")))
        assert "live-sources" in answer["reason"]
        region = hook.last()["activation"]["region"]
        assert region["depth"] == 1 and region["dead_sources"][0].startswith("untraced:")

    def test_summary_recorded_by_an_earlier_run_is_allowed(self, hook: Hook) -> None:
        """When an earlier run archived the history and recorded the summary, the same real file
        is allowed: the summary's source is in the store."""
        transcript = read_transcript(REAL / "spotter-4d5611e5-after-compaction.jsonl")
        assert transcript.segments[0].summary is not None
        text = transcript.segments[0].summary[1]
        with SQLiteStore(hook.store) as store:
            guard = Guard(store=store)
            config = guard.record_source("retry ceiling: 7", "tool_output", "claude:earlier:u1")
            history = Region.original("retry ceiling: 7", [config], region_id=config.id)
            guard.ledger.record_summary(text, history, REAL_SESSION)
        allowed(hook(self.hook_input("spotter-4d5611e5-after-compaction.jsonl", "manual")))
        region = hook.last()["activation"]["region"]
        assert (region["depth"], region["live_sources"]) == (1, ["claude:earlier:u1"])


def test_decision_log_folder_is_created(tmp_path: Path) -> None:
    """A --decision-log in a folder that does not exist yet is created, like the store's."""
    log = tmp_path / "new" / "folder" / "decisions.jsonl"
    command = [str(POLICYHOOK), "claude-precompact", "--store", str(tmp_path / "s.sqlite")]
    result = subprocess.run(
        [*command, "--decision-log", str(log)],
        input=json.dumps(hook_input("fresh")),
        capture_output=True,
        text=True,
        timeout=60,
    )
    allowed(result)
    assert json.loads(log.read_text().splitlines()[-1])["decision"] == "allow"


def session_start(hook: Hook, session: str = SESSION) -> dict[str, Any] | None:
    """What the SessionStart(compact) hook hands to the new window, through the real command."""
    stdin = json.dumps(
        {"session_id": session, "hook_event_name": "SessionStart", "source": "compact"}
    )
    command = [str(POLICYHOOK), "claude-postcompact", "--state-dir", str(hook.state)]
    result = subprocess.run(command, input=stdin, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    if not result.stdout:
        return None
    output: dict[str, Any] = json.loads(result.stdout)["hookSpecificOutput"]
    return output


class TestAutomaticRefusals:
    """A refused automatic compaction at a full context must not strand the session: it goes
    ahead with its history archived, and the next window gets the pointer and the exact facts."""

    def test_goes_ahead_archived_and_pinned_for_the_next_window(self, hook: Hook) -> None:
        """Auto + dead source: no block; a systemMessage; SessionStart hands on ref and facts."""
        allowed(hook(hook_input("compacted")))
        with SQLiteStore(hook.store) as store:
            assert store.evict(source("u2-0000"))  # the config read behind the summary
        result = hook(hook_input("resumed", "auto"))
        assert result.returncode == 0, result.stderr
        answer = json.loads(result.stdout)
        assert set(answer) == {"systemMessage"} and "goes ahead" in answer["systemMessage"]
        counted = r"\((\d+) messages?\), with (\d+) exact facts? for the new window"
        assert re.search(counted, answer["systemMessage"])
        assert hook.last()["decision"] == "deny"  # the refusal is what the logs say
        context = session_start(hook)
        assert context is not None and context["hookEventName"] == "SessionStart"
        text = context["additionalContext"]
        (ref,) = re.findall(r"offload:[0-9a-f]+", text.split("policyhook retrieve ")[1])[:1]
        assert f"policyhook retrieve {ref} --store {hook.store}" in text
        assert "/home/dev/app/config/agent.yaml" in text  # a live source's path, pinned verbatim
        assert session_start(hook) is None  # handed on once

    def test_the_message_counts_in_words(self) -> None:
        """One message, one fact: the system message reads as English, not "1 messages"."""
        decision = Guard().check("an original", summarizer="s")
        for items, facts, said in (
            (1, 1, "(1 message), with 1 exact fact"),
            (2, 0, "(2 messages), with 0 exact facts"),
        ):
            pinned = remedies.Remedied(
                "pin", "pin", "pointer", ref="offload:ab", archived_items=items,
                pinned=(remedies.Pinned("path", "", "/etc/app.yaml", "cfg"),) * facts,
            )  # fmt: skip
            out = io.StringIO()
            answer(dataclasses.replace(decision, effect=Effect.DENY), out, pinned=pinned)
            assert said in json.loads(out.getvalue())["systemMessage"]

    def test_retrieve_gives_the_archived_history_back_exactly(self, hook: Hook) -> None:
        """`policyhook retrieve REF --store` prints what the remedy archived; errors exit 2."""
        result = hook(hook_input("resumed", "auto"))
        (ref,) = re.findall(
            r"archived as (offload:[0-9a-f]+)", json.loads(result.stdout)["systemMessage"]
        )
        command = [str(POLICYHOOK), "retrieve", ref, "--store", str(hook.store), "--format", "json"]
        out = subprocess.run(command, capture_output=True, text=True, timeout=60, check=True)
        texts = json.loads(out.stdout)["texts"]
        assert texts[0].startswith("This session is being continued")  # the refused summary
        with SQLiteStore(hook.store) as store:
            assert Guard(store=store).retrieve(ref) == texts
        missing = subprocess.run(
            [str(POLICYHOOK), "retrieve", "offload:0", "--store", str(hook.store)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert missing.returncode == 2 and "no offloaded region 'offload:0'" in missing.stderr

    def test_manual_refusal_is_blocked_with_what_to_do(self, hook: Hook) -> None:
        """A refused manual compaction is blocked, and the reason says how to go on."""
        answer = blocked(hook(hook_input("resumed", "manual")))
        assert "To go on:" in answer["reason"] and "/clear" in answer["reason"]
        assert session_start(hook) is None  # nothing pinned: nothing compacted

    def test_block_mode_keeps_the_old_answer(self, hook: Hook) -> None:
        """--on-auto-refusal block: a refused automatic compaction is blocked, nothing pinned."""
        blocked(hook(hook_input("resumed", "auto"), "--on-auto-refusal", "block"))
        assert session_start(hook) is None


def test_a_turn_quoting_a_dead_summary_is_not_evidence(hook: Hook, tmp_path: Path) -> None:
    """A user turn that pastes an earlier summary rests on that summary's sources: once one is
    gone, compacting the new session is refused, never laundered into depth-0 evidence."""
    allowed(hook(hook_input("compacted")))  # the summary is recorded, its originals archived
    summary = next(
        json.loads(line)["message"]["content"]
        for line in (FIXTURES / "compacted.jsonl").read_text().splitlines()
        if json.loads(line).get("isCompactSummary")
    )
    with SQLiteStore(hook.store) as store:
        assert store.evict(source("u2-0000"))  # the config read behind the summary
    turn = json.loads((FIXTURES / "fresh.jsonl").read_text().splitlines()[1])
    turn.update(uuid="q1-0000", parentUuid=None)
    turn["message"]["content"] = "Notes from my last session:\n" + summary
    transcript = tmp_path / "quoting.jsonl"
    transcript.write_text(json.dumps(turn) + "\n")
    answer = blocked(hook(hook_input(transcript)))
    assert "live-sources" in answer["reason"]
    region = hook.last()["activation"]["region"]
    assert region["depth"] >= 1 and source("u2-0000") in region["dead_sources"]
