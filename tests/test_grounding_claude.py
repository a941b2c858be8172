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

from policyhook.adapters.claude_postcompact import run as postcompact_run
from policyhook.cli import main as cli_main

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
        assert message.startswith("policyhook: 34 of 234 facts of the compaction summary")
        code, out = run(start(session), state)
        context = json.loads(out)["hookSpecificOutput"]
        assert context["hookEventName"] == "SessionStart"
        text = context["additionalContext"]
        assert "200 of 234 facts appear in the history" in text
        assert "- number: Mitigation_plan md 1443" in text  # finding A of docs/grounding.md
        assert "- number: Upstash Redis 2.2" in text
        assert "(14 more not listed)" in text  # 34 ungrounded, 20 listed
        assert "(84 more not listed)" in text  # 94 dropped, 10 listed
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
        assert "4 of 4 facts appear" in text and "Not found" not in text

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
