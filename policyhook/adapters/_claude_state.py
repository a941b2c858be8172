"""The per-session state the Claude Code hooks share between events.

PreCompact (pins after a refusal) and PostCompact (grounding findings) write it; the SessionStart
that follows a compaction hands it to the new window once. One JSON file per session, named by a
hash of the session id, written atomically.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from policyhook.adapters.claude_code import HookError, check_writable_path

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
