"""`policyhook claude-postcompact`: the PostCompact check and the SessionStart hand-over, on real
Claude Code transcripts (tests/fixtures/grounding/README.md says where they come from)."""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from test_grounding import materialise

from policyhook.adapters.claude_postcompact import compaction_context, history_sources
from policyhook.adapters.claude_postcompact import run as postcompact_run
from policyhook.cli import main as cli_main
from policyhook.grounding import FactIndex, check

FIXTURES = Path(__file__).parent / "fixtures" / "grounding"


def transcript(name: str, tmp: Path, *, upto_boundary: bool = False) -> tuple[Path, str, str]:
    """(transcript path, session id, compact summary) of a fixture; with `upto_boundary`, the
    file as it may be when PostCompact runs: the boundary and summary not written yet."""
    lines = gzip.decompress((FIXTURES / f"{name}.jsonl.gz").read_bytes()).decode().splitlines()
    entries = [json.loads(line) for line in lines]
    (at,) = [i for i, e in enumerate(entries) if e.get("isCompactSummary")]
    summary = entries[at]["message"]["content"]
    assert isinstance(summary, str)
    keep = lines[: at - 1] if upto_boundary else lines
    path = tmp / f"{name}.jsonl"
    path.write_text("\n".join(keep) + "\n", encoding="utf-8")
    return path, entries[at]["sessionId"], summary


def run(hook_input: Any, state: Path) -> tuple[int, str]:
    out = io.StringIO()
    raw = hook_input if isinstance(hook_input, str) else json.dumps(hook_input)
    code = postcompact_run(state, stdin=io.StringIO(raw), stdout=out)
    return code, out.getvalue()


def post(path: Path, session: str, summary: str) -> dict[str, Any]:
    return {
        "session_id": session,
        "transcript_path": str(path),
        "hook_event_name": "PostCompact",
        "trigger": "auto",
        "compact_summary": summary,
    }


def start(session: str, source: str = "compact") -> dict[str, Any]:
    return {"session_id": session, "hook_event_name": "SessionStart", "source": source}


class TestPostCompact:
    @pytest.mark.parametrize("upto_boundary", [False, True], ids=["written", "not-yet-written"])
    def test_real_summary_findings_reach_the_next_window(
        self, tmp_path: Path, upto_boundary: bool
    ) -> None:
        """The summary is checked against the history before it; SessionStart gets the findings."""
        path, session, summary = transcript("apollo-23", tmp_path, upto_boundary=upto_boundary)
        state = tmp_path / "state"
        code, out = run(post(path, session, summary), state)
        assert code == 0
        message = json.loads(out)["systemMessage"]
        assert message.startswith("policyhook: 7 of 158 facts of the compaction summary")
        code, out = run(start(session), state)
        context = json.loads(out)["hookSpecificOutput"]
        assert context["hookEventName"] == "SessionStart"
        text = context["additionalContext"]
        assert "151 of 158 facts appear in the history" in text
        assert "- number: Mitigation_plan md 1443" in text  # finding A of docs/grounding.md
        assert "- number: launched 2" in text  # C
        # 7 ungrounded, 6 distinct ("Infrastructure Foundation 9" twice): all listed
        assert "re-check before relying on them):\n- number" in text
        assert "(77 more not listed)" in text  # 87 distinct dropped facts, 10 listed
        assert "Key facts of the history the summary left out" in text
        # handed over once: the next SessionStart has nothing to add
        assert run(start(session), state) == (0, "")

    def test_faithful_summary_says_nothing_to_the_user(self, tmp_path: Path) -> None:
        """A summary whose facts all rest on the history gets no systemMessage."""
        path, session, _ = transcript("apollo-32", tmp_path)
        summary = "Created `docker/seccomp-latex.json` and `scripts/load-test.js`."
        code, out = run(post(path, session, summary), tmp_path / "state")
        assert (code, out) == (0, "")
        code, out = run(start(session), tmp_path / "state")
        text = json.loads(out)["hookSpecificOutput"]["additionalContext"]
        assert "2 of 2 facts appear" in text and "Not found" not in text

    def test_provenance_is_recorded_and_carried(self, tmp_path: Path) -> None:
        """Each fact is recorded with its sources; a later summary repeating it inherits them."""
        path, session, _ = transcript("apollo-32", tmp_path)
        state = tmp_path / "state"
        first = "Created `docker/seccomp-latex.json`; 324/324 tests pass."
        assert run(post(path, session, first), state)[0] == 0
        (record,) = [json.loads(p.read_text()) for p in state.iterdir()]
        (facts,) = record["summaries"].values()
        by_text = {f["text"]: f for f in facts}
        assert by_text["docker/seccomp-latex.json"]["sources"][0].startswith(f"claude:{session}:")
        # the next pass reads a history without those originals (here: another session's), so
        # the fact rests only on the recorded provenance, whose sources are gone
        other, _, _ = transcript("apollo-23", tmp_path)
        second = "The profile docker/seccomp-latex.json exists."
        code, out = run(post(other, session, second), state)
        assert code == 0 and "1 of 1 facts" in json.loads(out)["systemMessage"]
        text = json.loads(run(start(session), state)[1])["hookSpecificOutput"]["additionalContext"]
        assert "Found only in sources no longer available (unverifiable):\n- path: " in text
        # an invented fact has no recorded provenance to inherit: it stays ungrounded
        code, out = run(
            post(other, session, "The profile docker/seccomp-python.json exists."), state
        )
        assert "Not found anywhere" in run(start(session), state)[1]

    def test_hook_context_the_compaction_agent_saw_is_evidence(self, tmp_path: Path) -> None:
        """A linter's findings reach the model as PostToolUse hook context, which only the
        compaction agent's transcript keeps: the summary's "(cyclomatic 10 > max 9)" rests on
        it, and without that file the same numbers rest on nothing."""
        path, session, summary = materialise("spotter-8463", tmp_path)
        sources = history_sources(path, session, summary)
        hooks = [sid for sid, _ in sources if ":agent-acompact-f46190:" in sid]
        assert len(hooks) == 5  # five <system-reminder> entries; not the summarization prompt
        claim = "Credo complexity (cyclomatic 10 > max 9) in `transcript_row_classes`"
        index = FactIndex()
        for sid, text in sources:
            index.add(sid, text)
        assert check(claim, index).ungrounded == ()
        without = FactIndex()
        for sid, text in sources:
            if sid not in hooks:
                without.add(sid, text)
        assert {f.text for f in check(claim, without).ungrounded} == {"10", "9"}

    def test_unreadable_compaction_agent_files_add_nothing(self, tmp_path: Path) -> None:
        """A FIFO, a directory or a damaged line among the agent files is passed over at once
        (less evidence: more findings, never fewer), never waited on."""
        folder = tmp_path / "s9" / "subagents"
        folder.mkdir(parents=True)
        os.mkfifo(folder / "agent-acompact-fifo.jsonl")
        (folder / "agent-acompact-dir.jsonl").mkdir()
        reminder = {"type": "user", "message": {"content": "<system-reminder>max is 9"}}
        (folder / "agent-acompact-ok.jsonl").write_text(
            "{not json\n" + json.dumps(reminder) + "\n", encoding="utf-8"
        )
        sources = compaction_context(tmp_path / "s9.jsonl", "s9")
        assert sources == [("claude:s9:agent-acompact-ok:2", "<system-reminder>max is 9")]

    def test_other_source_and_no_pending(self, tmp_path: Path) -> None:
        """SessionStart for startup/resume, or with nothing pending, adds nothing."""
        assert run(start("s1", "startup"), tmp_path) == (0, "")
        assert run(start("s1"), tmp_path) == (0, "")


class TestErrors:
    @pytest.mark.parametrize(
        ("hook_input", "message"),
        [
            ("not json", "hook input is not JSON"),
            ("[1]", "hook input must be a JSON object, got list"),
            ({"hook_event_name": "Stop"}, "expected a PostCompact or SessionStart hook input"),
            (
                {"hook_event_name": "PostCompact", "transcript_path": "/x"},
                "hook input field 'session_id' must be a non-empty string: None",
            ),
            (
                {"hook_event_name": "PostCompact", "session_id": "s", "transcript_path": "/x"},
                "hook input field 'compact_summary' must be a string: None",
            ),
        ],
    )
    def test_bad_input_is_a_clear_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str], hook_input: Any, message: str
    ) -> None:
        """Bad hook input exits 1 (a non-blocking error) and names what was wrong."""
        code, out = run(hook_input, tmp_path)
        assert (code, out) == (1, "")
        assert message in capsys.readouterr().err

    def test_unreadable_transcript_is_told_to_the_next_window(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A transcript that cannot be read: exit 1, and SessionStart says nothing was checked."""
        state = tmp_path / "state"
        fifo = tmp_path / "fifo"
        os.mkfifo(fifo)
        code, _ = run(post(fifo, "s2", "retries capped at 5"), state)
        assert code == 1 and "is not a regular file (a FIFO)" in capsys.readouterr().err
        text = json.loads(run(start("s2"), state)[1])["hookSpecificOutput"]["additionalContext"]
        assert text.startswith("policyhook could not check the compaction summary")
        assert "unverified" in text

    def test_corrupt_state_file_is_an_error(
        self, tmp_path: Path, capsys: pytest.CaptureFixture[str]
    ) -> None:
        """A damaged state file is reported, never silently replaced."""
        path, session, _ = transcript("apollo-32", tmp_path)
        state = tmp_path / "state"
        assert run(post(path, session, "x"), state)[0] == 0
        (file,) = state.iterdir()
        file.write_text("{not json", encoding="utf-8")
        assert run(start(session), state)[0] == 1
        assert "cannot read grounding state" in capsys.readouterr().err


class TestCommand:
    def test_cli_runs_the_hook(self, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
        """`policyhook claude-postcompact` takes its own options, hook JSON on stdin."""
        monkeypatch.setattr(sys, "stdin", io.StringIO(json.dumps(start("s", "startup"))))
        assert cli_main(["claude-postcompact", "--state-dir", str(tmp_path)]) == 0

    def test_installed_command(self, tmp_path: Path) -> None:
        """The installed entry point answers a SessionStart with nothing pending."""
        exe = Path(sys.executable).parent / "policyhook"
        done = subprocess.run(
            [str(exe), "claude-postcompact", "--state-dir", str(tmp_path)],
            input=json.dumps(start("s")),
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert (done.returncode, done.stdout, done.stderr) == (0, "", "")
