"""The decision log: one JSON line per guarded call, to audit and to replay under new policies.

Record format, version 1 (`"v": 1`): decision_id, time (RFC 3339, UTC), revision, decision
(allow | deny | would_deny), mode, policy, rule, message, trace_id and span_id (hex: the guard's
span, or the caller's when no SDK records; empty when no trace is active), outcome (how the call
ended, see `Outcome`; absent in records written before it existed), and the activation — plain
data, never region text or summaries, whatever content capture says.

Bounded: a list in the activation keeps its first `MAX_IDS` items (sorted) and the record says how
many it left out under `omitted` (`{"region.sources": 99968}`), ids and other strings are cut to a
bounded length, so a record stays far below `MAX_RECORD_BYTES` whatever the region's size.

Whole or absent: each record is one `write(2)` to a file opened for appending, under a lock:
threads of a process never interleave, and processes appending to one file on a local filesystem
get whole lines too. A writer killed mid-write or a full disk can still leave a fragment; the
reader skips it and reports it (`path:line`), and recovers a record that was appended right after
it on the same line. A writer whose write failed starts its next record on a new line.

Rotation by size: once the file would pass `max_bytes`, it is renamed `NAME.1` (older ones shift to
`NAME.2` … `NAME.<backups>`, the oldest is dropped) and a new file is started. Processes sharing
the file rotate it once between them (under `flock`) and follow each other's rotations.

Only regular files are opened: a FIFO, a device or a directory is refused at once, never waited on.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import stat
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from policyhook import _fork
from policyhook._policy import Decision

FORMAT_VERSION = 1
#: How a guarded call ended. `summarized`: output returned and recorded; `store_error`: output
#: returned, but recording it in the store failed; `failed`: the summarizer raised; `cancelled`:
#: cancelled, timed out or interrupted before an output came; `refused`: denied, nothing ran;
#: `unrecorded`: the block ended without `record`; `checked`: a decision only (`Guard.check`).
Outcome = Literal[
    "summarized", "store_error", "failed", "cancelled", "refused", "unrecorded", "checked"
]
OUTCOMES: tuple[Outcome, ...] = (
    "summarized",
    "store_error",
    "failed",
    "cancelled",
    "refused",
    "unrecorded",
    "checked",
)
#: Items kept of each list in the activation (source ids, kinds); the rest are counted.
MAX_IDS = 32
#: Characters kept of an item of such a list, and of any other string in a record.
MAX_ID_CHARS = 200
MAX_TEXT_CHARS = 4096
#: A record's size never exceeds this (it is far smaller in practice).
MAX_RECORD_BYTES = 64 * 1024
DEFAULT_MAX_BYTES = 100 * 1024 * 1024
DEFAULT_BACKUPS = 5
_MARK = '{"v":'  # how every record starts: where a record glued to a fragment is found again


def record(
    decision: Decision,
    activation: Mapping[str, Any],
    trace_id: str = "",
    span_id: str = "",
    outcome: Outcome | None = None,
) -> dict[str, Any]:
    """The log record of one decision, bounded in size (see the module docstring)."""
    omitted: dict[str, int] = {}
    entry: dict[str, Any] = {
        "v": FORMAT_VERSION,
        "decision_id": decision.decision_id,
        "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "revision": decision.revision,
        "decision": decision.effect,
        "mode": decision.mode,
        "policy": decision.policy,
        "rule": decision.rule,
        "message": _cut(decision.message, MAX_TEXT_CHARS),
        "trace_id": trace_id,
        "span_id": span_id,
    }
    if outcome is not None:
        entry["outcome"] = outcome
    entry["activation"] = _bounded(activation, "", omitted)
    if omitted:
        entry["omitted"] = omitted
    return entry


def activation_of(entry: Mapping[str, Any]) -> dict[str, Any]:
    """A record's activation with every shortened list back at its full length, for replay.

    Left-out items come back as placeholders (`"~omitted:1"`, …) that name no real source, so
    rules over sizes and ratios decide as they did; a rule naming a specific left-out id cannot.
    """
    # A copy of each mapping on the way down (lists are replaced, never changed in place): the
    # record stays as read. JSON values are trees, so copying the mappings is enough.
    activation: dict[str, Any] = _copy_mappings(entry["activation"])
    for dotted, count in (entry.get("omitted") or {}).items():
        *parents, name = str(dotted).split(".")
        holder: Any = activation
        for key in parents:
            holder = holder.get(key) if isinstance(holder, dict) else None
        if isinstance(holder, dict) and isinstance(holder.get(name), list):
            holder[name] = holder[name] + [f"~omitted:{n}" for n in range(1, int(count) + 1)]
    return activation


def _copy_mappings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _copy_mappings(v) for k, v in value.items()}
    return value


def _bounded(value: Any, path: str, omitted: dict[str, int]) -> Any:
    if isinstance(value, Mapping):
        return {
            str(k): _bounded(v, f"{path}.{k}" if path else str(k), omitted)
            for k, v in value.items()
        }
    if isinstance(value, list | tuple | set | frozenset):
        items = sorted(value, key=str) if isinstance(value, set | frozenset) else list(value)
        if len(items) > MAX_IDS:
            omitted[path] = len(items) - MAX_IDS
            items = items[:MAX_IDS]
        return [_cut(i, MAX_ID_CHARS) if isinstance(i, str) else i for i in items]
    if isinstance(value, str):
        return _cut(value, MAX_TEXT_CHARS)
    return value


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _open_regular(path: Path, flags: int) -> int:
    """Open `path` only if it is a regular file; a FIFO or device is refused, never waited on."""
    try:
        fd = os.open(path, flags | os.O_NONBLOCK | os.O_CLOEXEC, 0o644)
    except OSError as exc:
        if exc.errno == errno.ENXIO:  # a FIFO nobody reads
            raise ValueError(f"decision log {path} is not a regular file (a FIFO?)") from None
        raise
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise ValueError(f"decision log {path} is not a regular file")
        os.set_blocking(fd, True)
    except BaseException:
        os.close(fd)
        raise
    return fd


class DecisionLog:
    """Appends decision records to a JSONL file, one whole line per call, rotated by size.

    `max_bytes` (default 100 MiB; 0: never rotate) and `backups` (default 5) bound the disk it
    uses to about `max_bytes * (backups + 1)`.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_bytes: int = DEFAULT_MAX_BYTES,
        backups: int = DEFAULT_BACKUPS,
    ) -> None:
        if max_bytes < 0 or backups < 0:
            raise ValueError(f'"max_bytes" and "backups" must be >= 0: {max_bytes}, {backups}')
        self.path = Path(path)
        self.max_bytes = max_bytes
        self.backups = backups
        self._lock = threading.Lock()
        self._fd: int | None = self._open()
        self._torn = False  # the last write failed: it may have left a fragment
        _fork.register(self, DecisionLog._after_fork)

    def _open(self) -> int:
        return _open_regular(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT)

    def write(
        self,
        decision: Decision,
        activation: Mapping[str, Any],
        trace_id: str = "",
        span_id: str = "",
        outcome: Outcome | None = None,
    ) -> None:
        """Append the record of one decision; raises ValueError once the log is closed.

        An OSError (disk full, file gone read-only) is raised to the caller, which logs it; the
        next record then starts on a new line so a fragment never swallows it.
        """
        entry = record(decision, activation, trace_id, span_id, outcome)
        data = (json.dumps(entry, separators=(",", ":")) + "\n").encode("ascii")
        if len(data) > MAX_RECORD_BYTES:  # only if a caller put unusual keys in the activation
            entry["activation"], entry["omitted"] = {}, {"activation": 1}
            data = (json.dumps(entry, separators=(",", ":")) + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"decision log {self.path} is closed")
            if self.max_bytes:
                self._follow_or_rotate(len(data))
            if self._torn:
                data = b"\n" + data
            self._torn = True
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file takes it whole; this is for the rest
                written += os.write(self._fd, data[written:])
            self._torn = False

    def _follow_or_rotate(self, size: int) -> None:
        """Reopen if another process rotated the file; rotate if this record would overfill it."""
        assert self._fd is not None
        if self._moved():
            self._reopen()
        if os.fstat(self._fd).st_size + size <= self.max_bytes:
            return
        fcntl.flock(self._fd, fcntl.LOCK_EX)  # one rotation among the processes sharing it
        try:
            if self._moved():  # another process rotated it while we waited
                self._reopen()
                return
            if self.backups == 0:
                os.truncate(self.path, 0)
                return
            for n in range(self.backups - 1, 0, -1):
                older = self.path.with_name(f"{self.path.name}.{n}")
                if older.exists():
                    os.replace(older, self.path.with_name(f"{self.path.name}.{n + 1}"))
            os.replace(self.path, self.path.with_name(f"{self.path.name}.1"))
        finally:
            fcntl.flock(self._fd, fcntl.LOCK_UN)
        self._reopen()

    def _moved(self) -> bool:
        assert self._fd is not None
        try:
            here = os.stat(self.path)
        except FileNotFoundError:
            return True
        mine = os.fstat(self._fd)
        return (here.st_dev, here.st_ino) != (mine.st_dev, mine.st_ino)

    def _reopen(self) -> None:
        fd = self._open()
        if self._fd is not None:
            os.close(self._fd)
        self._fd = fd
        self._torn = False

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def _after_fork(self) -> None:
        self._lock = threading.Lock()  # another thread may have held it at the fork

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


@dataclass(frozen=True)
class Damaged:
    """A line of a log that is not a whole v1 record (torn by a crash or a full disk, or edited)."""

    path: Path
    line: int
    reason: str

    def __str__(self) -> str:
        return f"{self.path}:{self.line}: {self.reason}"


def files(path: str | Path) -> list[Path]:
    """A log and its rotated backups that exist, oldest first (`NAME.5` … `NAME.1`, `NAME`)."""
    path = Path(path)
    backups: list[tuple[int, Path]] = []
    for candidate in path.parent.glob(f"{path.name}.*"):
        suffix = candidate.name[len(path.name) + 1 :]
        if suffix.isdigit():
            backups.append((int(suffix), candidate))
    return [p for _, p in sorted(backups, reverse=True)] + ([path] if path.exists() else [])


def read(
    path: str | Path, damaged: list[Damaged] | None = None
) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for every record of a log file.

    A line that is not a whole v1 record raises ValueError naming `path:line`, unless a list is
    passed as `damaged`: then such lines are skipped and reported there, and a record appended
    right after a fragment on the same line is still given back. Only a regular file is read.
    """
    path = Path(path)
    fd = _open_regular(path, os.O_RDONLY)
    with open(fd, encoding="utf-8", errors="replace", newline="\n") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                yield number, _parse(line)
                continue
            except ValueError as exc:
                problem = Damaged(path, number, str(exc))
            if damaged is None:
                raise ValueError(str(problem))
            damaged.append(problem)
            glued = line.rfind(_MARK, 1)
            recovered = _recover(line[glued:]) if glued > 0 else None
            if recovered is not None:
                yield number, recovered


def _recover(tail: str) -> dict[str, Any] | None:
    """The record appended right after a fragment on the same line, if it is whole."""
    try:
        return _parse(tail)
    except ValueError:
        return None


def _parse(line: str) -> dict[str, Any]:
    try:
        entry = json.loads(line)
    except json.JSONDecodeError as exc:
        raise ValueError(f"not a JSON record: {exc.msg}") from None
    if not isinstance(entry, dict) or not isinstance(entry.get("activation"), dict):
        raise ValueError("not a decision record (no activation)")
    if entry.get("v") != FORMAT_VERSION:
        raise ValueError(
            f"record format v={entry.get('v')!r}, this version reads v={FORMAT_VERSION}"
        )
    return entry
