"""Claude Code `PreCompact` hook: `policyhook claude-precompact` decides every compaction.

Claude Code runs the command before it compacts a session, with the hook input as JSON on stdin
(`session_id`, `transcript_path`, `hook_event_name: "PreCompact"`, `trigger`: `manual` | `auto`,
`custom_instructions`). The command always exits 0 and answers on stdout (docs/claude-code.md
cites the hook reference):

- allow: nothing on stdout;
- block (an enforce-mode refusal): `{"decision": "block", "reason": ...}`;
- would block (audit / warn mode): `{"systemMessage": ...}` (Claude Code discards it for
  PreCompact; the decision log and telemetry carry the would-be refusal);
- cannot decide (bad input, unreadable transcript, bad policy, store failure, time budget spent):
  `{"decision": "block", "reason": "policyhook could not decide ..."}` - fail closed. Never a
  non-zero exit: exit 2 blocks but is lost when Windows runs hooks through PowerShell, and every
  other non-zero exit is a "non-blocking error" after which Claude Code compacts *ungated*.

Provenance, rebuilt from the transcript (JSONL, one entry per line, read as bytes line by line
within a byte budget; only regular files are opened):

- The active conversation is the chain of `parentUuid` links from the last main-chain entry; a
  `compact_boundary` system entry continues it through `logicalParentUuid` into the history it
  replaced. When that entry was never written (Claude Code 2.1.39 does this), the boundary links
  to the last main-chain user/assistant entry written before it. A boundary's preserved messages
  (`compactMetadata.preservedSegment` / `preservedMessages`) belong after its summary, not in the
  history it replaced. Records Claude Code keeps beside the chain (the other content blocks of a
  chain message, results of parallel tool calls) are read with it.
- Originals are the user prompts (`user_turn`), tool results (`tool_output`) and assistant text
  and tool calls (`ai_turn`), with the source id `claude:<sessionId>:<uuid>` (an entry whose text
  changed while the store held its old one, a source id naming one text, under
  `claude:<sessionId>:<uuid>:<digest>`). `isMeta` entries, thinking blocks, other system entries
  and sidechains are not evidence.
- The entry flagged `isCompactSummary` after a boundary is the summary of the segment before it:
  it rests on that segment's originals and on that segment's own summary, one pass deeper.
- What cannot be read is never skipped silently: history the chain cannot reach (a missing
  parent, a cycle), a boundary whose summary is unreadable, an unreadable line that names a
  compaction, each counts as a summary resting on a dead `untraced:` source, so the default policy
  refuses to summarize it again, and the reason says which line. Other unreadable lines (a torn
  last line, a line that is not JSON) are left out and named in the reason when it blocks.

Liveness: a source is live while the store (`--store`, SQLite) holds it. Before deciding, the hook
copies into the store every original it can read on the chain, and records each summary with its
provenance. So re-compacting is allowed while the originals can be given back.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import stat
import sys
import tempfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, BinaryIO, Literal, TextIO

from policyhook import (
    Decision,
    Effect,
    Guard,
    Region,
    SourceIdConflictError,
    UnsafeRecompactionError,
    load,
    request,
)
from policyhook._exit import HookExit
from policyhook._telemetry import Telemetry
from policyhook.adapters import content_of, known, untraced_summary
from policyhook.otel import Setup, configure_from_environment
from policyhook.remedies import Remedied
from policyhook.stores import SQLiteStore

__all__ = [
    "DEFAULT_STATE_DIR",
    "SUMMARIZER",
    "AutoRefusal",
    "HookError",
    "Limits",
    "Options",
    "Segment",
    "SessionState",
    "Transcript",
    "answer",
    "archive_and_pin",
    "check_writable_path",
    "decide",
    "open_regular",
    "read_transcript",
    "run",
    "undecided",
]

#: The `summarizer.name` policies and telemetry see for Claude Code's own compaction.
SUMMARIZER = "claude-code.compact"
DEFAULT_STORE = Path("~/.claude/policyhook/store.sqlite")
DEFAULT_CONTEXT_WINDOW = 200_000
DEFAULT_TIME_BUDGET = 10.0  # seconds, for the whole hook run
#: Seconds a run past its time budget waits, its answer written, for its undecided span and
#: count to be exported (when telemetry is on) before it exits.
OVERRUN_EXPORT = 1.0
DEFAULT_MAX_TRANSCRIPT_BYTES = 256 * 1024 * 1024
DEFAULT_MAX_LINE_BYTES = 32 * 1024 * 1024
MAX_STDIN_BYTES = 1024 * 1024
TRIGGERS = {"auto": "automatic", "manual": "manual"}
#: What a refused automatic compaction gets: pinned and let through, or blocked.
AutoRefusal = Literal["pin", "block"]
AUTO_REFUSALS: tuple[AutoRefusal, ...] = ("pin", "block")
EXIT_OK = HookExit.ANSWERED  # always: see policyhook._exit
#: Raw markers of a compaction in a line that could not be parsed. Inside a JSON string (a tool
#: result quoting a transcript) the quotes are escaped, so these match only a record's own keys.
_COMPACTION_MARKERS = (b'"isCompactSummary":true', b'"subtype":"compact_boundary"')
_CHUNK = 1024 * 1024
_MAX_TOKENS = 2**53  # a usage count above this is not a token count


class HookError(Exception):
    """The hook cannot decide (bad input, unreadable transcript, bad policy): it blocks."""


@dataclass(frozen=True)
class Limits:
    """Bounds on what the hook reads: a bigger transcript or line is refused, not read."""

    max_transcript_bytes: int = DEFAULT_MAX_TRANSCRIPT_BYTES
    max_line_bytes: int = DEFAULT_MAX_LINE_BYTES


@dataclass
class Original:
    """One original entry of the transcript: a source once archived."""

    source_id: str
    kind: str
    text: str


@dataclass
class Segment:
    """The entries between two compactions: an optional summary, then the originals.

    `unread` names what the segment holds that could not be read (an untraced summary each).
    """

    summary: tuple[str, str] | None = None  # (source-style id, text) of the isCompactSummary entry
    originals: list[Original] = field(default_factory=list)
    unread: list[str] = field(default_factory=list)
    boundary: bool = False  # the segment starts at a compact boundary


@dataclass
class Transcript:
    """The active chain of a session transcript, oldest segment first."""

    segments: list[Segment]
    tokens: int  # context size reported by the last assistant turn (0 if unknown)
    history_complete: bool  # whether the chain reaches a root that is not a compact boundary
    notes: list[str] = field(default_factory=list)  # lines left out, and why


# -- reading the transcript -----------------------------------------------------------------------


def _clean(text: str) -> str:
    """`text` with lone surrogates (a cut emoji escaped as `\\ud83d`) replaced by U+FFFD."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return text.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    return text


def open_regular(path: Path, what: str, max_bytes: int | None = None) -> BinaryIO:
    """`path` opened for reading if it is a regular file of at most `max_bytes`, else HookError.

    Opened non-blocking first, so a FIFO is refused at once instead of waiting for a writer.
    """
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_NOCTTY", 0))
    except OSError as exc:
        raise HookError(f"cannot read {what} {path}: {exc.strerror}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise HookError(f"{what} {path} is not a regular file ({_file_kind(info.st_mode)})")
        if max_bytes is not None and info.st_size > max_bytes:
            raise HookError(
                f"{what} {path} is {info.st_size:,} bytes, over the limit of {max_bytes:,} "
                "(--max-transcript-bytes)"
            )
        if hasattr(os, "set_blocking"):
            os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def check_writable_path(path: Path, what: str) -> None:
    """HookError unless `path` is absent or a regular file: a FIFO or device would hang or fill."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        return
    except OSError as exc:
        raise HookError(f"cannot use {what} {path}: {exc.strerror}") from None
    if not stat.S_ISREG(mode):
        raise HookError(f"{what} {path} is not a regular file ({_file_kind(mode)})")


def _file_kind(mode: int) -> str:
    kinds = {
        stat.S_ISFIFO: "a FIFO",
        stat.S_ISCHR: "a character device",
        stat.S_ISBLK: "a block device",
        stat.S_ISDIR: "a directory",
        stat.S_ISSOCK: "a socket",
    }
    return next((name for test, name in kinds.items() if test(mode)), "not a file")


def _lines(stream: BinaryIO, limits: Limits) -> Iterator[tuple[int, bytes, bool, bool]]:
    """(line number, bytes, newline-terminated, over the line limit) for each line.

    An over-long line is read on in chunks and not kept: its bytes are only the compaction
    markers it contains, so memory stays bounded by the line limit.
    """
    total = 0
    number = 0
    while True:
        line = stream.readline(limits.max_line_bytes + 1)
        if not line:
            return
        number += 1
        total += len(line)
        _check_total(total, limits)
        if len(line) <= limits.max_line_bytes:
            yield number, line, line.endswith(b"\n"), False
            continue
        overlap = max(len(m) for m in _COMPACTION_MARKERS)
        found = {m for m in _COMPACTION_MARKERS if m in line}
        tail = line[-overlap:]
        while not line.endswith(b"\n"):
            line = stream.readline(_CHUNK)
            if not line:
                break
            total += len(line)
            _check_total(total, limits)
            found.update(m for m in _COMPACTION_MARKERS if m in tail + line)
            tail = line[-overlap:]
        yield number, b"".join(sorted(found)), line.endswith(b"\n"), True


def _check_total(total: int, limits: Limits) -> None:
    if total > limits.max_transcript_bytes:
        raise HookError(
            f"transcript grew past the limit of {limits.max_transcript_bytes:,} bytes while being "
            "read (--max-transcript-bytes)"
        )


@dataclass(slots=True)
class _Entry:
    """What the hook keeps of one transcript line: links, flags and the evidence it carries."""

    line: int
    uuid: str | None
    parent: Any  # str | None when well-formed
    kind: str  # "user", "assistant", "boundary" or "other"
    sidechain: bool
    summary: bool
    session: str
    message_id: str | None = None
    tool_uses: tuple[str, ...] = ()
    tool_results: tuple[str, ...] = ()
    original: Original | None = None  # the evidence it carries; the message itself is not kept
    summary_text: str = ""
    tokens: int = 0
    logical_parent: Any = None
    preserved_head: str | None = None
    preserved_anchor: str | None = None
    preserved: frozenset[str] = frozenset()


def _entry(number: int, value: Mapping[str, Any], session: str) -> _Entry:
    kind = value.get("type")
    boundary = kind == "system" and value.get("subtype") == "compact_boundary"
    uuid = value.get("uuid")
    sid = value.get("sessionId")
    entry = _Entry(
        line=number,
        uuid=_clean(uuid) if isinstance(uuid, str) and uuid else None,
        parent=_clean(value["parentUuid"])
        if isinstance(value.get("parentUuid"), str)
        else value.get("parentUuid"),
        kind="boundary" if boundary else kind if kind in ("user", "assistant") else "other",
        sidechain=value.get("isSidechain") is True,
        summary=bool(value.get("isCompactSummary")),  # any truthy flag: fail closed
        session=_clean(sid) if isinstance(sid, str) and sid else session,
    )
    message = value.get("message")
    if entry.kind in ("user", "assistant") and not entry.sidechain and isinstance(message, Mapping):
        _read_message(entry, message, meta=value.get("isMeta") is True)
    if boundary:
        logical = value.get("logicalParentUuid")
        entry.logical_parent = _clean(logical) if isinstance(logical, str) else logical
        _preservation(entry, value.get("compactMetadata"))
    return entry


def _preservation(entry: _Entry, metadata: Any) -> None:
    """The messages a boundary kept verbatim: they follow its summary, not the history before."""
    if not isinstance(metadata, Mapping):
        return
    uuids: set[str] = set()
    for key in ("preservedSegment", "preservedMessages"):
        part = metadata.get(key)
        if not isinstance(part, Mapping):
            continue
        ids = part.get("uuids")
        listed = [u for u in ids if isinstance(u, str)] if isinstance(ids, list) else []
        uuids.update(listed)
        head = part.get("headUuid")
        head = head if isinstance(head, str) else (listed[0] if listed else None)
        anchor = part.get("anchorUuid")
        entry.preserved_head = entry.preserved_head or (_clean(head) if head else None)
        entry.preserved_anchor = entry.preserved_anchor or (
            _clean(anchor) if isinstance(anchor, str) else None
        )
        for key_uuid in ("headUuid", "tailUuid"):
            if isinstance(part.get(key_uuid), str):
                uuids.add(part[key_uuid])
    entry.preserved = frozenset(_clean(u) for u in uuids)


class _Reader:
    """One pass over the file, then the active chain rebuilt from what was read."""

    def __init__(self, session: str) -> None:
        self.session = session
        self.entries: list[_Entry] = []
        self.by_uuid: dict[str, _Entry] = {}
        self.notes: list[str] = []
        self.unread_compactions: list[str] = []

    def read(self, stream: BinaryIO, limits: Limits) -> None:
        last = 0
        for number, raw, terminated, over in _lines(stream, limits):
            last = number
            if over:
                self._unreadable(number, f"is over {limits.max_line_bytes:,} bytes", raw)
                continue
            if not raw.strip():
                continue
            try:
                value = json.loads(raw.decode("utf-8", "replace"))
            except (ValueError, RecursionError):
                torn = "is cut short (written while being read)" if not terminated else ""
                self._unreadable(number, torn or "is not JSON", raw)
                continue
            if not isinstance(value, dict):
                self._unreadable(number, f"is a JSON {type(value).__name__}, not an object", raw)
                continue
            entry = _entry(number, value, self.session)
            self.entries.append(entry)
            if entry.uuid is not None:
                self.by_uuid[entry.uuid] = entry  # a uuid written twice: the later line wins
            elif entry.kind in ("user", "assistant", "boundary") and not entry.sidechain:
                self.notes.append(f"line {number} has no uuid (left out)")
        if last == 0:
            raise HookError("the transcript is empty: there is no conversation to trace")

    def _unreadable(self, number: int, why: str, raw: bytes) -> None:
        if any(marker in raw for marker in _COMPACTION_MARKERS):
            self.unread_compactions.append(f"line {number} names a compaction but {why}")
        else:
            self.notes.append(f"line {number} {why} (left out)")

    # -- the chain ------------------------------------------------------------------------------

    def _leaf(self) -> _Entry | None:
        kinds = ("user", "assistant", "boundary")
        return next(
            (
                e
                for e in reversed(self.entries)
                if e.kind in kinds and not e.sidechain and e.uuid is not None
            ),
            None,
        )

    def _before(self, boundary: _Entry) -> str | None:
        """The last main-chain user/assistant entry written before `boundary` (not preserved)."""
        for entry in reversed(self.entries):
            if entry.line >= boundary.line or entry.uuid is None:
                continue
            main = entry.kind in ("user", "assistant") and not entry.sidechain
            if main and entry.uuid not in boundary.preserved:
                return entry.uuid
        return None

    def _relinks(self) -> dict[str, tuple[str, str]]:
        """Preserved head -> (the boundary's anchor, normally its summary; the boundary)."""
        links: dict[str, tuple[str, str]] = {}
        for entry in self.entries:
            if entry.kind != "boundary" or entry.preserved_head is None:
                continue
            anchor = entry.preserved_anchor
            if anchor is None or anchor not in self.by_uuid or anchor == entry.preserved_head:
                anchor = next(
                    (
                        e.uuid
                        for e in self.entries
                        if e.summary and e.parent == entry.uuid and e.uuid is not None
                    ),
                    entry.uuid,
                )
            if anchor is not None and entry.uuid is not None:
                links[entry.preserved_head] = (anchor, entry.uuid)
        return links

    def _history(self, boundary: _Entry) -> tuple[str | None, str | None]:
        """Where the history a boundary replaced ends: (uuid or None, why it is unreadable).

        (None, None): the file starts at this boundary, so its summary is untraced unless the
        store knows it. A logical parent that was never written (Claude Code 2.1.39) is taken
        to be the last main-chain entry written before the boundary.
        """
        target = boundary.logical_parent
        if target is None:
            target = boundary.parent  # older boundaries chain with parentUuid
        if target is None:
            return None, None
        if not isinstance(target, str):
            return None, f"line {boundary.line}: logicalParentUuid is a {type(target).__name__}"
        if target not in self.by_uuid:
            return self._before(boundary), None
        hops = 0
        while target in boundary.preserved and hops <= len(boundary.preserved):
            nxt = self.by_uuid.get(target)
            target = nxt.parent if nxt is not None and isinstance(nxt.parent, str) else None
            hops += 1
            if target is None or target not in self.by_uuid:
                return self._before(boundary), None
        return target, None

    def chain(self) -> tuple[list[_Entry], str | None]:
        """The active chain, oldest first, and why it stops short of the session start, if so."""
        leaf = self._leaf()
        if leaf is None:
            raise HookError("the transcript has no main-chain user or assistant entry to trace")
        relinks = self._relinks()
        preserved = frozenset().union(*(e.preserved for e in self.entries if e.kind == "boundary"))
        chain: list[_Entry] = []
        seen: set[str] = set()
        passed: set[str] = set()  # preserved entries met again in the history they were cut from
        current: _Entry | None = leaf
        gap: str | None = None
        while current is not None:
            assert current.uuid is not None
            target: Any
            if current.uuid in seen:
                if current.uuid not in preserved or current.uuid in passed:
                    gap = f"line {current.line}: parentUuid links form a cycle"
                    break
                passed.add(current.uuid)
                target = current.parent
            else:
                seen.add(current.uuid)
                chain.append(current)
                link = relinks.get(current.uuid)
                if link is not None and link[1] not in seen:  # still after that boundary
                    target = link[0]
                elif current.kind == "boundary":
                    target, note = self._history(current)
                    if target is None:
                        gap = note  # None: the file starts at this boundary (summary untraced)
                        break
                else:
                    target = current.parent
            if target is None:
                break  # the session's first entry
            if not isinstance(target, str):
                gap = f"line {current.line}: parentUuid is a {type(target).__name__}"
                break
            parent = self.by_uuid.get(target)
            if parent is None:
                gap = f"line {current.line}: its parent {target} is not in the transcript"
            current = parent
        chain.reverse()
        return self._with_siblings(chain), gap

    def _with_siblings(self, chain: list[_Entry]) -> list[_Entry]:
        """The chain plus what Claude Code reads beside it: the other content blocks of a chain
        message (same `message.id`) and the results of the chain's tool calls, each placed after
        the chain entry it belongs to."""
        position = {id(e): float(i) for i, e in enumerate(chain)}
        messages: dict[str, float] = {}
        for e in chain:
            mid = e.message_id
            if e.kind == "assistant" and mid is not None:
                messages.setdefault(mid, position[id(e)])
        placed: list[tuple[float, int, _Entry]] = [(position[id(e)], e.line, e) for e in chain]
        calls: dict[str, float] = {}
        for e in self.entries:
            if e.kind != "assistant" or e.sidechain:
                continue
            at = position.get(id(e))
            if at is None:
                mid = e.message_id
                if mid is None or mid not in messages:
                    continue
                at = messages[mid] + 0.5
                placed.append((at, e.line, e))
            for call in e.tool_uses:
                calls.setdefault(call, at)
        for e in self.entries:
            if e.kind != "user" or e.sidechain or id(e) in position:
                continue
            at = min((calls[r] for r in e.tool_results if r in calls), default=None)
            if at is not None:
                placed.append((at + 0.5, e.line, e))
        placed.sort(key=lambda item: (item[0], item[1]))
        return [e for _, _, e in placed]


def _blocks(content: Any) -> list[Mapping[str, Any]]:
    if isinstance(content, str):
        return [{"type": "text", "text": content}]
    return [b for b in content if isinstance(b, Mapping)] if isinstance(content, list) else []


def _read_message(entry: _Entry, message: Mapping[str, Any], *, meta: bool) -> None:
    """Keep what the chain and the decision need of a message: ids, evidence, token counts."""
    mid = message.get("id")
    entry.message_id = mid if isinstance(mid, str) else None
    blocks = _blocks(message.get("content"))
    entry.tool_uses = tuple(
        b["id"] for b in blocks if b.get("type") == "tool_use" and isinstance(b.get("id"), str)
    )
    entry.tool_results = tuple(
        b["tool_use_id"]
        for b in blocks
        if b.get("type") == "tool_result" and isinstance(b.get("tool_use_id"), str)
    )
    entry.tokens = _tokens(message) if entry.kind == "assistant" else 0
    if entry.summary:
        entry.summary_text = _clean(content_of(message) or "")
    elif not meta:
        entry.original = _original(entry, blocks)


def _original(entry: _Entry, blocks: list[Mapping[str, Any]]) -> Original | None:
    """The evidence a message carries (isMeta entries and thinking blocks are not evidence)."""
    texts: list[str] = []
    kind = "ai_turn" if entry.kind == "assistant" else "user_turn"
    for block in blocks:
        if block.get("type") == "text" and isinstance(block.get("text"), str):
            texts.append(block["text"])
        elif block.get("type") == "tool_use":
            args = json.dumps(block.get("input", {}), sort_keys=True, default=str)
            texts.append(f"[tool call] {block.get('name')}({args})")
        elif block.get("type") == "tool_result":
            kind = "tool_output"
            texts.append(content_of(block) or "")
    text = _clean("\n".join(t for t in texts if t.strip()))
    if not text:
        return None
    return Original(f"claude:{entry.session}:{entry.uuid}", kind, text)


def _tokens(message: Mapping[str, Any]) -> int:
    usage = message.get("usage")
    if not isinstance(usage, Mapping):
        return 0
    keys = (
        "input_tokens",
        "cache_creation_input_tokens",
        "cache_read_input_tokens",
        "output_tokens",
    )
    counts = [usage.get(k) for k in keys]
    return sum(c for c in counts if type(c) is int and 0 <= c < _MAX_TOKENS)


def read_transcript(
    path: str | Path, *, session: str = "", limits: Limits | None = None
) -> Transcript:
    """Segments of the active chain of a Claude Code transcript file (HookError if unreadable)."""
    limits = limits or Limits()
    reader = _Reader(_clean(session))
    with open_regular(Path(path), "transcript", limits.max_transcript_bytes) as stream:
        reader.read(stream, limits)
    chain, gap = reader.chain()
    return _segments(reader, chain, gap)


def _segments(reader: _Reader, chain: list[_Entry], gap: str | None) -> Transcript:
    segments = [Segment()]
    tokens = 0
    for entry in chain:
        if entry.kind == "boundary":
            segments.append(Segment(boundary=True))
            continue
        if entry.summary:
            if segments[-1].summary is not None:
                segments[-1].unread.append(f"line {entry.line}: a second compaction summary")
                continue
            text = entry.summary_text
            if not text.strip():
                segments[-1].unread.append(f"line {entry.line}: a compaction summary without text")
                continue
            segments[-1].summary = (f"claude:{entry.session}:{entry.uuid}", text)
            continue
        tokens = entry.tokens or tokens
        if entry.original is not None:
            segments[-1].originals.append(entry.original)
    for number, segment in enumerate(segments):
        if segment.boundary and segment.summary is None and not segment.unread:
            where = "the compaction" if number == 0 else f"compaction {number}"
            segment.unread.append(f"the summary of {where} is not in the transcript")
    if gap is not None:
        segments[0].unread.insert(0, f"the history before it is unreadable ({gap})")
    segments[-1].unread.extend(reader.unread_compactions)
    first = segments[0]
    if len(segments) > 1 and not (first.originals or first.summary or first.unread):
        segments.pop(0)  # the chain started at a boundary: no history before it in this file
    complete = gap is None and not (chain and chain[0].kind == "boundary")
    notes = [*reader.notes]
    return Transcript(segments, tokens, complete, notes)


# -- deciding -------------------------------------------------------------------------------------


def _regions(guard: Guard, transcript: Transcript, window: str) -> list[Region]:
    """Archive every readable original, record each summary's provenance; the window's parts."""
    previous: Region | None = None  # the region the next segment's summary summarizes
    parts: list[Region] = []
    for number, segment in enumerate(transcript.segments):
        parts = [untraced_summary(f"[policyhook: {window}: {what}]") for what in segment.unread]
        if segment.summary is not None:
            _, text = segment.summary
            if previous is not None:
                parts += guard.record_summary(text, of=[previous], window=window)
            else:  # no history for it in this transcript: known from an earlier run, or untraced
                earlier = guard.provenance(text, window)
                parts.append(earlier if earlier.depth > 0 else untraced_summary(text))
        held = guard.store.live([o.source_id for o in segment.originals])
        for original in segment.originals:
            if original.source_id not in held:  # archived by an earlier run: not written again
                # SourceIdConflictError: its id named another text; archived below
                with contextlib.suppress(SourceIdConflictError):
                    guard.record_source(original.text, original.kind, original.source_id)
            # What the original rests on as the ledger knows it: a turn that quotes a summary
            # keeps that summary's depth and sources (never laundered into evidence).
            region = guard.provenance(original.text, window)
            if not known(region):  # the entry's id names another text (the entry rewritten):
                own = guard.text_id(original.source_id, original.text)  # this one under its own
                guard.record_source(original.text, original.kind, own)
                region = guard.provenance(original.text, window)
            parts.append(region)
        previous = Region.merge(parts, f"{window}#segment-{number}")
    return parts


def _hook_input(hook_input: Mapping[str, Any]) -> tuple[str, str, Path]:
    """(trigger, session id, transcript path) of a PreCompact hook input, or HookError."""
    event = hook_input.get("hook_event_name", "PreCompact")
    if event != "PreCompact":
        raise HookError(f'"hook_event_name" must be PreCompact: {event!r}')
    raw = hook_input.get("trigger")
    trigger = TRIGGERS.get(raw) if isinstance(raw, str) else None
    if trigger is None:
        raise HookError(f'"trigger" must be auto or manual: {hook_input.get("trigger")!r}')
    session = hook_input.get("session_id")
    path = hook_input.get("transcript_path")
    if not isinstance(session, str) or not session:
        raise HookError(f'"session_id" must be a non-empty string: {session!r}')
    if not isinstance(path, str) or not path or "\x00" in path:
        raise HookError(f'"transcript_path" must be a file path: {path!r}')
    return trigger, _clean(session), Path(_clean(path)).expanduser()


def decide(
    hook_input: Mapping[str, Any],
    guard: Guard,
    *,
    context_window: int = DEFAULT_CONTEXT_WINDOW,
    limits: Limits | None = None,
) -> Decision:
    """Decide the compaction a PreCompact hook input announces (the guard traces and logs it)."""
    return _decide(hook_input, guard, context_window, limits)[0]


def _decide(
    hook_input: Mapping[str, Any], guard: Guard, context_window: int, limits: Limits | None
) -> tuple[Decision, Transcript, list[Region]]:
    trigger, session, path = _hook_input(hook_input)
    transcript = read_transcript(path, session=session, limits=limits)
    tokens = min(transcript.tokens, 2**62)
    pressure = min(1.0, tokens / context_window) if context_window > 0 else 0.0
    with request(
        trigger=trigger,
        budget_pressure=pressure,
        window=session,
        window_tokens=tokens,
        window_budget=context_window,
    ):
        parts = _regions(guard, transcript, session)
        return guard.check(parts, summarizer=SUMMARIZER), transcript, parts


def _reason(decision: Decision, transcript: Transcript | None = None) -> str:
    dead = len(decision.dead_sources)
    reason = (
        f"policyhook kept the context as it is: {decision.message or 'refused by policy'} "
        f"(policy {decision.policy!r}, rule {decision.rule!r}, depth {decision.depth}, "
        f"{dead} dead source{'s' if dead != 1 else ''}, decision {decision.decision_id})"
    )
    if transcript is not None:
        unread = [u for s in transcript.segments for u in s.unread]
        if unread or transcript.notes:
            reason += "; transcript: " + "; ".join([*unread, *transcript.notes][:5])
    return reason


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def answer(
    decision: Decision,
    out: TextIO,
    transcript: Transcript | None = None,
    pinned: Remedied | None = None,
    advice: bool = False,
) -> None:
    """Write Claude Code's hook answer for `decision` (nothing for a plain allow).

    A refusal with `pinned` (an automatic compaction let through after its history was archived
    and its exact facts pinned for the next window) is not blocked: a blocked automatic
    compaction at a full context leaves the user nothing but /clear. `advice` adds what to do to
    a blocked manual compaction's reason.
    """
    if decision.effect == Effect.DENY and pinned is not None:
        message = (
            f"policyhook refused this compaction ({decision.message or 'refused by policy'}; "
            f"policy {decision.policy!r}, rule {decision.rule!r}, decision "
            f"{decision.decision_id}). It goes ahead so the session can continue: the history is "
            f"archived as {pinned.ref} "
            f"({_count(pinned.archived_items, 'message')}), with "
            f"{_count(len(pinned.pinned), 'exact fact')} for the new window (SessionStart)."
        )
        json.dump({"systemMessage": _clean(message)}, out)
    elif decision.effect == Effect.DENY:
        reason = _reason(decision, transcript)
        if advice:
            reason += (
                ". To go on: keep working (an automatic compaction is let through with the exact "
                "facts re-injected after it), re-read the sources you need and /compact again, "
                "or start afresh with /clear"
            )
        json.dump({"decision": "block", "reason": reason}, out)
    elif decision.effect == Effect.WOULD_DENY:
        message = f"({decision.mode}) would block: {_reason(decision, transcript)}"
        json.dump({"systemMessage": message}, out)
    else:
        return
    out.write("\n")


# -- per-session state shared with claude-postcompact (pins, findings) ----------------------

#: Where the hooks keep per-session state (`--state-dir`, $POLICYHOOK_GROUNDING_DIR).
DEFAULT_STATE_DIR = Path("~/.claude/policyhook/grounding")


class SessionState:
    """One Claude Code session's file: provenance of every checked summary (claude-postcompact),
    and what the next `SessionStart` after a compaction must hand on (findings, pinned facts)."""

    def __init__(self, directory: Path, session: str) -> None:
        name = hashlib.sha256(session.encode("utf-8", "surrogatepass")).hexdigest()[:32]
        self.path = directory.expanduser() / f"{name}.json"

    def load(self) -> dict[str, Any]:
        try:
            data = json.loads(self.path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            return {"summaries": {}, "pending": None, "pins": None}
        except (OSError, ValueError) as exc:
            raise HookError(f"cannot read grounding state {self.path}: {exc}") from None
        if not isinstance(data, dict) or not isinstance(data.get("summaries"), dict):
            raise HookError(f"grounding state {self.path} is not a policyhook state file")
        return data

    def save(self, data: Mapping[str, Any]) -> None:
        """Written to a temporary file and renamed: a crash never leaves half a state file."""
        check_writable_path(self.path, "grounding state")
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.path.parent, suffix=".tmp")
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                json.dump(data, out)
            os.replace(tmp, self.path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise


def archive_and_pin(
    guard: Guard,
    decision: Decision,
    parts: list[Region],
    session: str,
    state_dir: Path,
    store: Path,
) -> Remedied | None:
    """Archive a refused compaction's history and pin its live facts for the next window.

    None when the store cannot archive it (the refusal then stands: blocked).
    """
    try:
        remedied = guard.remedy(
            UnsafeRecompactionError(decision), parts, summarizer=SUMMARIZER, window=session
        )
    except UnsafeRecompactionError:
        return None
    state = SessionState(state_dir, session)
    data = state.load()
    data["pins"] = {
        "ref": remedied.ref,
        "store": str(store),
        "decision_id": decision.decision_id,
        "message": decision.message,
        "pinned": [str(fact) for fact in remedied.pinned],
    }
    state.save(data)
    return remedied


def undecided(error: str, out: TextIO) -> None:
    """The fail-closed answer when the hook cannot decide: block, saying why and what to do."""
    reason = (
        f"policyhook could not decide, so the compaction is blocked (fail closed): {error}. "
        "Fix the cause and compact again; to compact without the guard, remove or disable the "
        "PreCompact hook (see /hooks)."
    )
    json.dump({"decision": "block", "reason": _clean(reason)}, out)
    out.write("\n")
    print(f"policyhook claude-precompact: {_clean(error)}", file=sys.stderr)


# -- the command (its options are parsed by policyhook.cli) ---------------------------------------


@dataclass(frozen=True)
class Options:
    """What `policyhook claude-precompact` is told: its options (docs/claude-code.md)."""

    policies: Path | None = None  # None: the embedded default policy
    store: Path = DEFAULT_STORE
    store_synchronous: Literal["NORMAL", "FULL"] = "NORMAL"
    decision_log: Path | None = None
    on_auto_refusal: AutoRefusal = "pin"
    state_dir: Path = DEFAULT_STATE_DIR
    context_window: int = DEFAULT_CONTEXT_WINDOW
    time_budget: float = DEFAULT_TIME_BUDGET
    limits: Limits = Limits()


def _read_input(stdin: TextIO) -> Mapping[str, Any]:
    buffer = getattr(stdin, "buffer", None)
    raw = (
        buffer.read(MAX_STDIN_BYTES + 1) if buffer is not None else stdin.read(MAX_STDIN_BYTES + 1)
    )
    if len(raw) > MAX_STDIN_BYTES:
        raise HookError(f"the hook input on stdin is over {MAX_STDIN_BYTES:,} bytes")
    text = raw.decode("utf-8", "replace") if isinstance(raw, bytes) else raw
    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as exc:
        where = f" at line {exc.lineno}" if isinstance(exc, json.JSONDecodeError) else ""
        msg = exc.msg if isinstance(exc, json.JSONDecodeError) else "too deeply nested"
        raise HookError(f"stdin is not the hook input JSON: {msg}{where}") from None
    if not isinstance(value, dict):
        raise HookError(f"the hook input must be a JSON object: {type(value).__name__}")
    return value


def _telemetry() -> Setup | None:
    """OTLP export when the environment names an endpoint (a hook is a short-lived process)."""
    try:
        return configure_from_environment("policyhook-claude-code")
    except Exception as exc:  # telemetry must never break the hook
        print(f"policyhook claude-precompact: telemetry disabled: {exc}", file=sys.stderr)
        return None


def _answer(
    options: Options, stdin: TextIO, stdout: TextIO, setups: list[Setup] | None = None
) -> None:
    """Read, decide and answer; any failure is raised for `run` to answer fail-closed, and is
    traced and counted as an undecided call (a refusal operators see beside the decisions).
    The telemetry set up is added to `setups`, for `run` to trace a run past its budget."""
    telemetry = _telemetry()
    if telemetry is not None and setups is not None:
        setups.append(telemetry)
    try:
        _decide_and_answer(options, stdin, stdout)
    except Exception as error:
        Telemetry().undecided(SUMMARIZER, error)  # (the providers `_telemetry` set, if any)
        raise
    finally:
        if telemetry is not None:
            telemetry.shutdown()


def _decide_and_answer(options: Options, stdin: TextIO, stdout: TextIO) -> None:
    hook_input = _read_input(stdin)
    _hook_input(hook_input)  # a malformed input is refused before anything is opened
    policies = load(options.policies.expanduser()) if options.policies is not None else None
    store_path = options.store.expanduser()
    check_writable_path(store_path, "store")
    log = options.decision_log.expanduser() if options.decision_log is not None else None
    if log is not None:
        check_writable_path(log, "decision log")
        log.parent.mkdir(parents=True, exist_ok=True)
    store_path.parent.mkdir(parents=True, exist_ok=True)
    with SQLiteStore(store_path, synchronous=options.store_synchronous) as store:
        guard = Guard(policies, store=store, decision_log=log)
        try:
            decision, transcript, parts = _decide(
                hook_input, guard, options.context_window, options.limits
            )
            trigger, session, _ = _hook_input(hook_input)
            pinned = None
            if (
                decision.effect == Effect.DENY
                and trigger == "automatic"
                and options.on_auto_refusal == "pin"
            ):
                pinned = archive_and_pin(
                    guard, decision, parts, session, options.state_dir, store_path
                )
        finally:
            guard.close()
    advice = trigger == "manual" and options.on_auto_refusal == "pin"
    answer(decision, stdout, transcript, pinned, advice)


def run(options: Options, stdin: TextIO | None = None, stdout: TextIO | None = None) -> int:
    """Run the hook within its time budget: exit 0, the answer on stdout, errors fail closed.

    Past the budget the block answer is written, the run is traced and counted as undecided
    (exported within `OVERRUN_EXPORT` seconds), and, when running as the command (no `stdout`
    given), the process exits at once rather than wait for the stuck work.
    """
    hard_exit = stdout is None
    stdin = stdin or sys.stdin
    stdout = stdout or sys.stdout
    answered = threading.Event()
    failure: list[BaseException] = []
    buffer: list[str] = []
    setups: list[Setup] = []  # the worker's telemetry, once it is set up

    def work() -> None:
        out = io.StringIO()
        try:
            _answer(options, stdin, out, setups)
            buffer.append(out.getvalue())
        except BaseException as exc:  # HookError, PolicyError, sqlite3.Error, bugs: all blocked
            failure.append(exc)
        finally:
            answered.set()

    worker = threading.Thread(target=work, name="policyhook-claude-precompact", daemon=True)
    worker.start()
    if not answered.wait(options.time_budget):
        undecided(
            f"no decision within the time budget of {options.time_budget:g} s "
            "(--time-budget, $POLICYHOOK_CLAUDE_TIME_BUDGET)",
            stdout,
        )
        stdout.flush()  # (the answer first: exporting may take up to `OVERRUN_EXPORT`)
        _trace_overrun(setups)
        if hard_exit:
            sys.stderr.flush()
            os._exit(EXIT_OK)
        return EXIT_OK
    if failure:
        undecided(_describe(failure[0]), stdout)
    else:
        stdout.write("".join(buffer))
    return EXIT_OK


def _trace_overrun(setups: list[Setup]) -> None:
    """Trace and count a run past its time budget as undecided (`error.type` TimeoutError) and
    export it within `OVERRUN_EXPORT` s, as the stuck worker never will. Never raises."""
    if not setups:  # no endpoint (or stuck before telemetry was set up): nothing to export
        return
    setup = setups[0]
    try:
        telemetry = Telemetry(
            tracer_provider=setup.tracer_provider, meter_provider=setup.meter_provider
        )
        telemetry.undecided(SUMMARIZER, TimeoutError("the hook's time budget was spent"))
        setup.shutdown(timeout=OVERRUN_EXPORT)
    except Exception as exc:  # telemetry must never break the hook
        print(f"policyhook claude-precompact: telemetry: {_describe(exc)}", file=sys.stderr)


def _describe(error: BaseException) -> str:
    if isinstance(error, HookError):
        return str(error)
    text = str(error) or type(error).__name__
    return text if type(error).__name__ in text else f"{type(error).__name__}: {text}"
