"""`policyhook claude-precompact` through the installed entry point, on Claude Code transcripts."""

from __future__ import annotations

import json
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

from policyhook import Guard, SQLiteStore
from policyhook.adapters.claude_code import decide, read_transcript
from policyhook.testing import capture_decisions

FIXTURES = Path(__file__).parent / "fixtures" / "claude"
POLICYHOOK = Path(sys.executable).parent / "policyhook"
SESSION = "5d1a6f0e-3b7c-4c55-9a11-0c2f4e8b9d01"


def source(uuid: str) -> str:
    return f"claude:{SESSION}:{uuid}"


def hook_input(transcript: str | Path, trigger: str = "auto") -> dict[str, Any]:
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

    def __call__(
        self, stdin: dict[str, Any] | str, *options: str
    ) -> subprocess.CompletedProcess[str]:
        text = stdin if isinstance(stdin, str) else json.dumps(stdin)
        command = [str(POLICYHOOK), "claude-precompact", "--store", str(self.store)]
        command += ["--decision-log", str(self.log), *options]
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

    def test_second_compaction_goes_one_pass_deeper(self, hook: Hook) -> None:
        """After two boundaries the window holds a depth-2 summary resting on every original."""
        allowed(hook(hook_input("compacted_twice")))
        region = hook.last()["activation"]["region"]
        assert region["depth"] == 2 and len(region["live_sources"]) == 12

    def test_policy_sees_the_trigger(self, hook: Hook) -> None:
        """--policies: a depth limit for automatic compaction blocks auto, lets manual through."""
        policy = str(FIXTURES / "depth-limit.yaml")
        answer = blocked(hook(hook_input("compacted_twice", "auto"), "--policies", policy))
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


class TestFailures:
    """The hook's own failures exit 1 (shown, compaction proceeds), never 2 (which blocks)."""

    @pytest.mark.parametrize(
        ("stdin", "options", "error"),
        [
            ("not json", (), "not the hook input JSON"),
            ('["PreCompact"]', (), "must be a JSON object"),
            ({**hook_input("fresh"), "trigger": "sometimes"}, (), '"trigger" must be auto'),
            ({**hook_input("fresh"), "hook_event_name": "Stop"}, (), "expected a PreCompact"),
            (hook_input(Path("/nonexistent/t.jsonl")), (), "cannot read transcript"),
            (hook_input("fresh"), ("--no-such-option",), "unrecognized arguments"),
            (hook_input("fresh"), ("--policies", "/nonexistent/policies"), "nonexistent"),
        ],
    )
    def test_failure_exits_1_with_the_error_on_stderr(
        self, hook: Hook, stdin: Any, options: tuple[str, ...], error: str
    ) -> None:
        """Each kind of bad input is reported on stderr with exit 1 and nothing on stdout."""
        result = hook(stdin, *options)
        assert (result.returncode, result.stdout) == (1, "")
        assert error in result.stderr


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
