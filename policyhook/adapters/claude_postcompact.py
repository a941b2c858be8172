"""Claude Code `PostCompact` + `SessionStart` hook: `policyhook claude-postcompact`.

Claude Code cannot be stopped after it compacts, but the new window can be told what the summary
claims without a source. One command, registered for two events:

- `PostCompact` (input: `session_id`, `transcript_path`, `trigger`, `compact_summary`): checks
  every fact of the summary against the history before the compaction, read from the transcript
  with the PreCompact hook's reader (`policyhook.adapters.claude_code.read_transcript`). Records
  each fact with its sources (per-fact provenance, one JSON file per session in `--state-dir`,
  carried into the next compaction of the session) and the findings for the next event. Answers
  with a `systemMessage` for the user when facts rest on nothing.
- `SessionStart` with `source: "compact"`: hands those findings to the new window as
  `additionalContext`: the claims to re-check before relying on them, and the exact key facts
  of the history the summary dropped, with their source ids, worth pinning.

Exit 0 with nothing on stdout when there is nothing to say. When the check cannot run (bad
input, unreadable transcript) the hook exits 1 with the reason on stderr (Claude Code shows it
as a non-blocking error) and the next `SessionStart` says the summary was not checked, so the
session never continues as if it had been.
"""

from __future__ import annotations

import hashlib
import json
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any, TextIO

from policyhook._exit import HookExit
from policyhook.adapters.claude_code import (
    DEFAULT_STATE_DIR,
    HookError,
    SessionState,
    open_regular,
    read_transcript,
)
from policyhook.grounding import Fact, FactIndex, Grounding, check

__all__ = [
    "DEFAULT_STATE_DIR",
    "compaction_context",
    "history_sources",
    "postcompact",
    "run",
    "session_start",
]

MAX_STDIN_BYTES = 4 * 1024 * 1024
MAX_COMPACTION_BYTES = 16 * 1024 * 1024
#: At most this many facts of each list go into the new window's context.
MAX_LISTED = 20
MAX_DROPPED = 10
EXIT_OK, EXIT_ERROR = HookExit.ANSWERED, HookExit.ERROR  # policyhook._exit


def _fact_record(fact: Fact, sources: frozenset[str]) -> dict[str, Any]:
    return {
        "kind": fact.kind,
        "value": fact.value,
        "context": sorted(fact.context),
        "key": fact.key,
        "text": fact.text,
        "bare": fact.bare,
        "sources": sorted(sources),
    }


def _fact(record: Mapping[str, Any]) -> tuple[Fact, frozenset[str]]:
    fact = Fact(
        str(record["kind"]),
        str(record["value"]),
        frozenset(str(w) for w in record.get("context", ())),
        key=str(record.get("key", "")),
        text=str(record.get("text", "")),
        bare=str(record.get("bare", "")),
    )
    return fact, frozenset(str(s) for s in record.get("sources", ()))


def history_sources(transcript_path: Path, session: str, summary: str) -> list[tuple[str, str]]:
    """(source id, text) of everything the summarizer of `summary` was shown: every original
    before the compaction in the transcript, and the hook context only the compaction agent's
    own transcript keeps (`compaction_context`)."""
    segments = read_transcript(transcript_path, session=session).segments
    wanted = summary.strip()
    end = len(segments)  # Claude Code may not have written the new boundary yet: all of it
    for i, segment in enumerate(segments):
        if segment.summary is not None and wanted and wanted in segment.summary[1]:
            end = i
    originals = [(o.source_id, o.text) for s in segments[:end] for o in s.originals]
    return originals + compaction_context(transcript_path, session)


#: The compaction agent's transcripts, beside the session's: `<session>/subagents/…`.
_ACOMPACT_GLOB = "agent-acompact-*.jsonl"
_REMINDER = "<system-reminder>"


def compaction_context(transcript_path: Path, session: str) -> list[tuple[str, str]]:
    """The hook output the compaction agent was shown (`<system-reminder>` entries: a
    PostToolUse hook's "additional context" such as a linter's findings) as sources.

    Claude Code (2.1.3x) gives hook context to the model without writing it into the session's
    transcript; the compaction agent's own transcript (`<session>/subagents/agent-acompact-*`)
    has it, and summaries quote it. Its summarization prompt is not taken (instructions, not
    history). A file or line that cannot be read adds nothing: less evidence means more
    findings, never fewer.
    """
    folder = transcript_path.parent / transcript_path.stem / "subagents"
    sources: list[tuple[str, str]] = []
    try:
        files = sorted(folder.glob(_ACOMPACT_GLOB))
    except OSError:
        return sources
    for file in files:
        try:  # never a FIFO or a huge file: open_regular refuses both without blocking
            with open_regular(file, "compaction transcript", MAX_COMPACTION_BYTES) as stream:
                lines = stream.read().decode("utf-8", "replace").splitlines()
        except (HookError, OSError):
            continue
        for n, line in enumerate(lines, 1):
            try:
                entry = json.loads(line)
            except ValueError:
                continue
            message = entry.get("message") if isinstance(entry, dict) else None
            content = message.get("content") if isinstance(message, dict) else None
            is_user = isinstance(entry, dict) and entry.get("type") == "user"
            if is_user and isinstance(content, str) and content.lstrip().startswith(_REMINDER):
                sources.append((f"claude:{session}:{file.stem}:{n}", content))
    return sources


def postcompact(hook_input: Mapping[str, Any], state_dir: Path) -> Grounding:
    """Check the summary of a `PostCompact` hook input; record provenance and findings."""
    session = hook_input.get("session_id")
    path = hook_input.get("transcript_path")
    summary = hook_input.get("compact_summary")
    for name, value in (("session_id", session), ("transcript_path", path)):
        if not isinstance(value, str) or not value:
            raise HookError(f"hook input field {name!r} must be a non-empty string: {value!r}")
    if not isinstance(summary, str):
        raise HookError(f"hook input field 'compact_summary' must be a string: {summary!r}")
    assert isinstance(session, str) and isinstance(path, str)
    state = SessionState(state_dir, session)
    data = state.load()
    try:
        history = history_sources(Path(path).expanduser(), session, summary)
        # Claude Code ends the summary with "read the full transcript at: <this path>"
        history.append((f"claude:{session}:transcript_path", path))
        index = FactIndex()
        for source_id, text in history:
            index.add(source_id, text)
        carried = FactIndex()
        for records in data["summaries"].values():
            carried.add_facts(_fact(r) for r in records if isinstance(r, Mapping))
        result = check(summary, index, {sid for sid, _ in history}, carried=carried)
    except HookError as exc:
        data["pending"] = {"error": str(exc)}
        state.save(data)
        raise
    digest = hashlib.sha256(summary.encode("utf-8", "surrogatepass")).hexdigest()[:16]
    data["summaries"][digest] = [_fact_record(f, ids) for f, ids in result.provenance()]
    data["pending"] = _findings(result)
    state.save(data)
    return result


def _findings(result: Grounding) -> dict[str, Any]:
    found: dict[str, Any] = {"summary": result.summary()}
    for key, facts, limit in (
        ("ungrounded", result.ungrounded, MAX_LISTED),
        ("unverifiable", result.unverifiable, MAX_LISTED),
        ("dropped", result.dropped, MAX_DROPPED),
    ):
        shown = list(dict.fromkeys((f.kind, str(f)) for f in facts))  # once per kind and text
        found[key] = [{"kind": kind, "text": text} for kind, text in shown[:limit]]
        found[f"{key}_distinct"] = len(shown)
    return found


def _context(pending: Mapping[str, Any]) -> str:
    """The text the new window gets: what to re-check, what to keep verbatim."""
    if "error" in pending:
        return (
            "policyhook could not check the compaction summary against the history before it "
            f"({pending['error']}). Treat its numbers, paths and identifiers as unverified."
        )
    s = pending["summary"]
    lines = [
        f"policyhook checked the compaction summary: {s['grounded']} of {s['facts']} facts "
        "appear in the history before the compaction."
    ]
    for key, head in (
        ("ungrounded", "Not found anywhere in that history (re-check before relying on them):"),
        ("unverifiable", "Found only in sources no longer available (unverifiable):"),
        ("dropped", "Key facts of the history the summary left out (verbatim):"),
    ):
        items = pending.get(key) or []
        if items:
            total = pending.get(f"{key}_distinct", s.get(key, len(items)))
            more = f" ({total - len(items)} more not listed)" if total > len(items) else ""
            lines.append(head + more)
            lines.extend(f"- {i['kind']}: {i['text']}" for i in items)
    return "\n".join(lines)


def session_start(hook_input: Mapping[str, Any], state_dir: Path) -> str | None:
    """The `additionalContext` for a `SessionStart` after a compaction, once; else None.

    It holds what PreCompact pinned when it let a refused automatic compaction go ahead (the
    archive's ref and the exact facts of the live sources), then PostCompact's findings.
    """
    session = hook_input.get("session_id")
    if hook_input.get("source") != "compact" or not isinstance(session, str) or not session:
        return None
    state = SessionState(state_dir, session)
    data = state.load()
    pending, pins = data.get("pending"), data.get("pins")
    parts = [
        *([pins_context(pins)] if isinstance(pins, Mapping) else []),
        *([_context(pending)] if isinstance(pending, Mapping) else []),
    ]
    if not parts:
        return None
    data["pending"] = data["pins"] = None
    state.save(data)
    return "\n\n".join(parts)


def pins_context(pins: Mapping[str, Any]) -> str:
    """What the new window is told when a refused compaction went ahead with pinned facts."""
    lines = [
        f"policyhook: the compaction that made this summary was refused by policy "
        f"({pins.get('message', '')}) and allowed only so the session could go on. Claims the "
        "summary makes about the history may rest on sources no store holds any more.",
        f"The history before it is archived exactly as {pins['ref']}; read it back with "
        f"`policyhook retrieve {pins['ref']} --store {pins['store']}`.",
    ]
    facts = pins.get("pinned") or []
    if facts:
        lines.append("Exact facts of its live sources (verbatim, with source ids):")
        lines.extend(f"- {fact}" for fact in facts)
    return "\n".join(lines)


def _message(result: Grounding) -> str | None:
    if not result.ungrounded and not result.unverifiable:
        return None
    shown = "; ".join(f"{f.kind} {str(f)!r}" for f in result.ungrounded[:5])
    n = len(result.ungrounded) + len(result.unverifiable)
    return (
        f"policyhook: {n} of {len(result.facts)} facts of the compaction summary rest on no "
        f"source in the history ({shown}{', ...' if n > 5 else ''}); the next window is told."
    )


def _read_input(stdin: TextIO) -> Mapping[str, Any]:
    raw = stdin.read(MAX_STDIN_BYTES + 1)
    if len(raw) > MAX_STDIN_BYTES:
        raise HookError(f"hook input is over {MAX_STDIN_BYTES:,} bytes")
    try:
        value = json.loads(raw)
    except ValueError as exc:
        raise HookError(f"hook input is not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise HookError(f"hook input must be a JSON object, got {type(value).__name__}")
    return value


def run(state_dir: Path, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the hook for one event (options parsed by policyhook.cli); see the module docstring."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    try:
        hook_input = _read_input(stdin)
        event = hook_input.get("hook_event_name")
        if event == "SessionStart":
            text = session_start(hook_input, state_dir)
            if text:
                output = {"hookEventName": "SessionStart", "additionalContext": text}
                json.dump({"hookSpecificOutput": output}, stdout)
            return EXIT_OK
        if event != "PostCompact":
            raise HookError(f"expected a PostCompact or SessionStart hook input, got {event!r}")
        message = _message(postcompact(hook_input, state_dir))
        if message:
            json.dump({"systemMessage": message}, stdout)
        return EXIT_OK
    except (HookError, OSError) as exc:
        print(f"policyhook claude-postcompact: {exc}", file=sys.stderr)
        return EXIT_ERROR
