"""Claude Code `PreCompact` hook: `policyhook claude-precompact` decides every compaction.

Claude Code runs the command before it compacts a session, with the hook input as JSON on stdin
(`session_id`, `transcript_path`, `hook_event_name: "PreCompact"`, `trigger`: `manual` | `auto`,
`custom_instructions`). The command answers with Claude Code's documented hook protocol:

- allow: exit 0, nothing on stdout;
- block (enforce-mode refusal): exit 0 and `{"decision": "block", "reason": ...}` on stdout;
  Claude Code (2.1.105 and later) then skips the compaction and shows the reason;
- would block (audit / warn mode): exit 0 and `{"systemMessage": ...}`, a warning to the user;
- the hook itself failed (unreadable input, bad policy file): exit 1 with the error on stderr, a
  non-blocking error: Claude Code shows it and compacts anyway. Never exit 2, which would block.

Provenance, rebuilt from the transcript (JSONL, one entry per line):

- The active conversation is the chain of `parentUuid` links from the last main-chain
  user/assistant entry; a `compact_boundary` system entry is a root whose `logicalParentUuid`
  continues the chain into the history it replaced. Boundaries cut the chain into segments.
- Originals are the user prompts (`user_turn`), tool results (`tool_output`) and assistant text
  and tool calls (`ai_turn`) on the chain, with the source id `claude:<sessionId>:<uuid>`.
  `isMeta` entries, thinking blocks, other system entries and sidechains are not evidence.
- The entry flagged `isCompactSummary` after a boundary is the summary of the segment before it:
  it rests on that segment's originals and on that segment's own summary, one pass deeper.

Liveness: a source is live while the store (`--store`, SQLite) holds it. Before deciding, the hook
copies into the store every original it can read on the chain, the window about to be compacted
and the pre-compaction history Claude Code keeps in the transcript file, and records each summary
with its provenance. So re-compacting is allowed while the originals can be given back. Sources
are dead when neither the transcript nor the store has them any more: a transcript whose history
is gone (a continued or trimmed session) and whose originals the store never held or has evicted.
A summary whose history the hook never saw counts as resting on a dead `untraced:` source.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from policyhook.adapters import untraced_summary
from policyhook.hook import Guard, request
from policyhook.loader import load
from policyhook.policy import Decision
from policyhook.provenance import Region, content_of
from policyhook.stores import SQLiteStore

__all__ = ["SUMMARIZER", "Segment", "Transcript", "answer", "decide", "main", "read_transcript"]

#: The `summarizer.name` policies and telemetry see for Claude Code's own compaction.
SUMMARIZER = "claude-code.compact"
DEFAULT_STORE = Path("~/.claude/policyhook/store.sqlite")
DEFAULT_CONTEXT_WINDOW = 200_000
TRIGGERS = {"auto": "automatic", "manual": "manual"}
EXIT_OK, EXIT_ERROR = 0, 1


class HookError(Exception):
    """The hook cannot decide (bad input, unreadable transcript, bad policy); exit 1."""


@dataclass
class Original:
    """One original entry of the transcript: a source once archived."""

    source_id: str
    kind: str
    text: str


@dataclass
class Segment:
    """The entries between two compactions: an optional summary, then the originals."""

    summary: tuple[str, str] | None = None  # (source-style id, text) of the isCompactSummary entry
    originals: list[Original] = field(default_factory=list)


@dataclass
class Transcript:
    """The active chain of a session transcript, oldest segment first."""

    segments: list[Segment]
    tokens: int  # context size reported by the last assistant turn (0 if unknown)
    history_complete: bool  # whether the chain reaches a root that is not a compact boundary


# -- reading the transcript -----------------------------------------------------------------------


def _entries(path: Path) -> Iterator[dict[str, Any]]:
    """Every JSON object in the file; a line that does not parse (a torn last write) is skipped."""
    try:
        with path.open(encoding="utf-8") as lines:
            for line in lines:
                try:
                    entry = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(entry, dict):
                    yield entry
    except OSError as exc:
        raise HookError(f"cannot read transcript {path}: {exc.strerror}") from None


def _is_boundary(entry: Mapping[str, Any]) -> bool:
    return entry.get("type") == "system" and entry.get("subtype") == "compact_boundary"


def _chain(entries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], bool]:
    """The active chain, oldest first, and whether it reaches the true start of the session."""
    by_uuid = {e["uuid"]: e for e in entries if isinstance(e.get("uuid"), str)}
    leaf = next(
        (
            e
            for e in reversed(entries)
            if e.get("type") in ("user", "assistant") and not e.get("isSidechain")
        ),
        None,
    )
    chain: list[dict[str, Any]] = []
    seen: set[str] = set()
    current, complete = leaf, leaf is not None
    while current is not None and current.get("uuid") not in seen:
        seen.add(current.get("uuid", ""))
        chain.append(current)
        parent = current.get("parentUuid")
        if parent is None and _is_boundary(current):
            parent = current.get("logicalParentUuid")
        if parent is None:
            break
        current = by_uuid.get(parent)
        if current is None:
            complete = False  # the history this entry continues is not in the file
    chain.reverse()
    return chain, complete and not (chain and _is_boundary(chain[0]))


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _original(entry: Mapping[str, Any]) -> Original | None:
    """The evidence an entry carries, or None for entries that are not evidence."""
    if entry.get("isMeta") or entry.get("type") not in ("user", "assistant"):
        return None
    message = entry.get("message")
    if not isinstance(message, Mapping):
        return None
    texts: list[str] = []
    kind = "ai_turn" if entry["type"] == "assistant" else "user_turn"
    for block in _blocks(message.get("content")):
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            args = json.dumps(block.get("input", {}), sort_keys=True, default=str)
            texts.append(f"[tool call] {block.get('name')}({args})")
        elif block.get("type") == "tool_result":
            kind = "tool_output"
            texts.append(content_of(block) or "")
    text = "\n".join(t for t in texts if t.strip())
    if not text:
        return None
    return Original(f"claude:{entry.get('sessionId', '')}:{entry.get('uuid', '')}", kind, text)


def _tokens(entry: Mapping[str, Any]) -> int:
    message = entry.get("message")
    usage = message.get("usage") if isinstance(message, Mapping) else None
    if not isinstance(usage, Mapping):
        return 0
    keys = (
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    )
    return sum(int(usage.get(k) or 0) for k in keys)


def read_transcript(path: str | Path) -> Transcript:
    """Segments of the active chain of a Claude Code transcript file."""
    chain, complete = _chain(list(_entries(Path(path))))
    segments = [Segment()]
    tokens = 0
    for entry in chain:
        if _is_boundary(entry):
            segments.append(Segment())
            continue
        if entry.get("isCompactSummary"):
            text = content_of(entry.get("message")) or ""
            segments[-1].summary = (f"claude:{entry.get('sessionId', '')}:{entry['uuid']}", text)
            continue
        tokens = _tokens(entry) or tokens
        original = _original(entry)
        if original is not None:
            segments[-1].originals.append(original)
    if len(segments) > 1 and not segments[0].originals and segments[0].summary is None:
        segments.pop(0)  # the chain started at a boundary: no history before it in this file
    return Transcript(segments, tokens, complete)


# -- deciding -------------------------------------------------------------------------------------


def _regions(guard: Guard, transcript: Transcript, window: str) -> list[Region]:
    """Archive every readable original, record each summary's provenance; the window's parts."""
    previous: Region | None = None  # the region the next segment's summary summarizes
    parts: list[Region] = []
    for number, segment in enumerate(transcript.segments):
        parts = []
        if segment.summary is not None:
            _, text = segment.summary
            if previous is not None:
                parts.append(guard.ledger.record_summary(text, previous, window))
            else:  # no history for it in this transcript: known from an earlier run, or untraced
                known = guard.ledger.resolve(text, window).region
                parts.append(known if known.depth > 0 else untraced_summary(text))
        for original in segment.originals:
            source = guard.record_source(original.text, original.kind, original.source_id)
            parts.append(Region.original(original.text, [source], region_id=source.id))
        previous = Region.merge(parts, f"{window}#segment-{number}")
    return parts


def decide(
    hook_input: Mapping[str, Any], guard: Guard, *, context_window: int = DEFAULT_CONTEXT_WINDOW
) -> Decision:
    """Decide the compaction a PreCompact hook input announces (the guard traces and logs it)."""
    if hook_input.get("hook_event_name", "PreCompact") != "PreCompact":
        raise HookError(f"expected a PreCompact hook input: {hook_input.get('hook_event_name')!r}")
    trigger = TRIGGERS.get(str(hook_input.get("trigger")))
    if trigger is None:
        raise HookError(f'"trigger" must be auto or manual: {hook_input.get("trigger")!r}')
    session = hook_input.get("session_id")
    path = hook_input.get("transcript_path")
    if not isinstance(session, str) or not isinstance(path, str):
        raise HookError('the hook input needs "session_id" and "transcript_path" strings')
    transcript = read_transcript(Path(path).expanduser())
    pressure = min(1.0, transcript.tokens / context_window) if context_window > 0 else 0.0
    with request(
        trigger=trigger,
        budget_pressure=pressure,
        window=session,
        window_tokens=transcript.tokens,
        window_budget=context_window,
    ):
        parts = _regions(guard, transcript, session)
        return guard.check(parts, summarizer=SUMMARIZER)


def _reason(decision: Decision) -> str:
    dead = len(decision.dead_sources)
    return (
        f"policyhook kept the context as it is: {decision.message or 'refused by policy'} "
        f"(policy {decision.policy!r}, rule {decision.rule!r}, depth {decision.depth}, "
        f"{dead} dead source{'s' if dead != 1 else ''}, decision {decision.decision_id})"
    )


def answer(decision: Decision, out: TextIO) -> None:
    """Write Claude Code's hook answer for `decision` (nothing for a plain allow)."""
    if decision.effect == "deny":
        json.dump({"decision": "block", "reason": _reason(decision)}, out)
    elif decision.effect == "would_deny":
        json.dump({"systemMessage": f"({decision.mode}) would block: {_reason(decision)}"}, out)
    else:
        return
    out.write("\n")


# -- the command ----------------------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """Usage errors exit 1, not argparse's 2: exit code 2 from a PreCompact hook blocks."""

    def error(self, message: str) -> Any:
        self.print_usage(sys.stderr)
        raise HookError(message)


def _parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="policyhook claude-precompact",
        description="Claude Code PreCompact hook: reads the hook input JSON on stdin, allows the "
        'compaction or answers {"decision": "block"}.',
    )
    parser.add_argument(
        "--policies",
        type=Path,
        help="policy YAML file or folder (default: the embedded default policy)",
    )
    parser.add_argument(
        "--store",
        type=Path,
        default=Path(os.environ.get("POLICYHOOK_CLAUDE_STORE", DEFAULT_STORE)),
        help="SQLite store where originals are archived (default: $POLICYHOOK_CLAUDE_STORE or "
        f"{DEFAULT_STORE})",
    )
    parser.add_argument(
        "--decision-log", type=Path, help="append one JSON line per decision to this file"
    )
    parser.add_argument(
        "--context-window",
        type=int,
        default=DEFAULT_CONTEXT_WINDOW,
        help="the model's context window in tokens, for request.budget_pressure "
        f"(default {DEFAULT_CONTEXT_WINDOW})",
    )
    return parser


def _read_input(stdin: TextIO) -> Mapping[str, Any]:
    try:
        value = json.load(stdin)
    except json.JSONDecodeError as exc:
        raise HookError(
            f"stdin is not the hook input JSON: {exc.msg} at line {exc.lineno}"
        ) from None
    if not isinstance(value, dict):
        raise HookError(f"the hook input must be a JSON object: {type(value).__name__}")
    return value


def _telemetry() -> Any:
    """OTLP export when OTEL_EXPORTER_OTLP_ENDPOINT is set (a hook is a short-lived process)."""
    if not os.environ.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        return None
    try:
        from policyhook.otel import configure

        return configure(service_name="policyhook-claude-code")
    except Exception as exc:  # telemetry must never break the hook
        print(f"policyhook claude-precompact: telemetry disabled: {exc}", file=sys.stderr)
        return None


def main(argv: Sequence[str], stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the hook: 0 with the answer on stdout, or 1 with the error on stderr."""
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    try:
        args = _parser().parse_args(list(argv))
        policies = load(args.policies.expanduser()) if args.policies is not None else None
        hook_input = _read_input(stdin)
        store_path = args.store.expanduser()
        store_path.parent.mkdir(parents=True, exist_ok=True)
        telemetry = _telemetry()
        with SQLiteStore(store_path) as store:
            log = args.decision_log.expanduser() if args.decision_log is not None else None
            guard = Guard(policies, store=store, decision_log=log)
            try:
                decision = decide(hook_input, guard, context_window=args.context_window)
            finally:
                guard.close()
                if telemetry is not None:
                    telemetry.shutdown()
        answer(decision, stdout)
        return EXIT_OK
    except SystemExit as exit_:  # --help
        return EXIT_OK if not exit_.code else EXIT_ERROR
    except Exception as exc:  # HookError, PolicyError, sqlite3.Error, ...
        print(f"policyhook claude-precompact: {exc}", file=sys.stderr)
        return EXIT_ERROR
