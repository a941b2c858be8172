"""Adapters that put the guard in front of real agent frameworks' summarize calls.

Each adapter lives in its own module and imports its framework only there, so `import policyhook`
never needs LangChain or langmem:

- `policyhook.adapters.langchain`: `GuardedSummarizationMiddleware`, a drop-in subclass of
  LangChain v1's `SummarizationMiddleware`.
- `policyhook.adapters.langmem`: `summarize_messages` / `asummarize_messages`, guarded versions of
  langmem's running-summary functions.
- `policyhook.adapters.claude_code`: the `policyhook claude-precompact` command, a Claude Code
  `PreCompact` hook.

All of them decide through `Guard`, so every decision gets the same span, metrics, decision log and
listeners as a decorated summarizer.
"""

from __future__ import annotations

from typing import Any

from policyhook import _shapes
from policyhook._provenance import UNREGISTERED, Region, text_id

__all__ = [
    "MESSAGE_KINDS",
    "content_of",
    "known",
    "message_kind",
    "message_text",
    "untraced_summary",
]

#: Source kind recorded for each LangChain message type (`message.type`).
MESSAGE_KINDS = {
    "human": "user_turn",
    "ai": "ai_turn",
    "tool": "tool_output",
    "system": "system_prompt",
}


def message_kind(message: Any) -> str:
    """The source kind a LangChain message is recorded under (its own type for unknown types)."""
    kind = str(getattr(message, "type", "message"))
    return MESSAGE_KINDS.get(kind, kind)


def content_of(item: Any) -> str | None:
    """The text of a message-like item as the guard reads it, or None when its shape cannot be
    read. For adapters that read known shapes; the guard itself refuses what it cannot read."""
    try:
        return _shapes.text(item)
    except TypeError:
        return None


def message_text(message: Any) -> str:
    """A message's text as archived, and as the guard reads it: its content, plus its tool calls
    (`[tool call] name({...})`), which carry evidence too. TypeError if it cannot be read."""
    return _shapes.text(message, where="message")


def untraced_summary(text: str) -> Region:
    """A summary the guard never saw made: depth 1, resting on a source no store can give back.

    Its one source id (`untraced:...`) is never put in any store, so it is always dead: the default
    policy refuses to summarize it again, and the refusal names it. This is how adapters treat a
    summary made before the guard was installed, or by a process whose store is gone.
    """
    return Region(
        id=text_id("s", text),
        depth=1,
        sources=frozenset({text_id("untraced", text)}),
        source_kinds=frozenset({"untraced_summary"}),
        chars=len(text),
        text=text,
    )


def known(region: Region) -> bool:
    """Whether the guard accounts for all of a summary message's text: a summary it recorded, or
    recorded evidence (a remedy's pointer). Anything else is treated as an untraced summary."""
    return region.depth > 0 or UNREGISTERED not in region.source_kinds
