"""The decision log: one JSON line per decision, to audit and to replay under new policies.

Record format, version 1 (`"v": 1`): decision_id, time (RFC 3339, UTC), revision, decision
(allow | deny | would_deny), mode, policy, rule, message, trace_id and span_id (hex: the guard's
span, or the caller's when no SDK records; empty when no trace is active), and the activation —
plain data, never region text or summaries, whatever content capture says. Each record is one
line written by a single `write(2)` to a file opened for appending, under a lock: threads of a
process never interleave, and processes appending to the same file on a local filesystem get whole
lines too. `read` gives the records back.
"""

from __future__ import annotations

import json
import os
import threading
from collections.abc import Iterator, Mapping
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from policyhook.policy import Decision

FORMAT_VERSION = 1


def record(
    decision: Decision, activation: Mapping[str, Any], trace_id: str = "", span_id: str = ""
) -> dict[str, Any]:
    """The log record of one decision."""
    return {
        "v": FORMAT_VERSION,
        "decision_id": decision.decision_id,
        "time": datetime.now(UTC).isoformat(timespec="microseconds").replace("+00:00", "Z"),
        "revision": decision.revision,
        "decision": decision.effect,
        "mode": decision.mode,
        "policy": decision.policy,
        "rule": decision.rule,
        "message": decision.message,
        "trace_id": trace_id,
        "span_id": span_id,
        "activation": activation,
    }


class DecisionLog:
    """Appends decision records to a JSONL file, one whole line per decision."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._lock = threading.Lock()
        self._fd: int | None = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)

    def write(
        self,
        decision: Decision,
        activation: Mapping[str, Any],
        trace_id: str = "",
        span_id: str = "",
    ) -> None:
        """Append the record of one decision; raises ValueError once the log is closed."""
        line = json.dumps(record(decision, activation, trace_id, span_id), separators=(",", ":"))
        data = (line + "\n").encode("utf-8")
        with self._lock:
            if self._fd is None:
                raise ValueError(f"decision log {self.path} is closed")
            written = os.write(self._fd, data)
            while written < len(data):  # a regular file takes it whole; this is for the rest
                written += os.write(self._fd, data[written:])

    def close(self) -> None:
        with self._lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    def __enter__(self) -> DecisionLog:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def read(path: str | Path) -> Iterator[tuple[int, dict[str, Any]]]:
    """(line number, record) for every record of a log; a bad line raises naming its number."""
    with Path(path).open(encoding="utf-8") as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                entry = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{number}: not a JSON record: {exc.msg}") from None
            if not isinstance(entry, dict) or not isinstance(entry.get("activation"), dict):
                raise ValueError(f"{path}:{number}: not a decision record (no activation)")
            if entry.get("v") != FORMAT_VERSION:
                raise ValueError(
                    f"{path}:{number}: record format v={entry.get('v')!r}, "
                    f"this version reads v={FORMAT_VERSION}"
                )
            yield number, entry
