"""Wrong allows found by hunting (shapes, cache bounds, faults), each kept as the test that failed
on the code before its fix: a summary whose sources are gone must never be re-summarized because
of how it came back.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from policyhook import Guard, MemoryStore, SQLiteStore

SOURCE = "config read: retry_ceiling = 7 for the billing job"


def summarized_then_evicted(output: str) -> tuple[Guard, str]:
    """A guard that granted one call over SOURCE returning `output`; SOURCE is then evicted.
    Returns the guard and what the caller got back (the output as the summarizer wrote it)."""
    guard = Guard(store=MemoryStore())
    guard.record_source(SOURCE, "config_read", "cfg")
    got = guard(lambda text: output, summarizer="s")(SOURCE)
    guard.store.evict("cfg")
    return guard, got


class TestShortOutputsWithWhitespace:
    """Outputs are recorded stripped; a short one (under the 16 bytes searched inside longer
    text) that comes back as the summarizer wrote it, with its trailing newline, was original
    content resting on nothing (allowed)."""

    @pytest.mark.parametrize("written", ["Ceiling: seven.\n", "  OK\n", "\tdone. \r\n"])
    @pytest.mark.parametrize("shape", ["str", "list", "message", "block"])
    def test_a_short_output_as_returned_is_still_a_summary(self, written: str, shape: str) -> None:
        """The caller's copy of a short output (whitespace around it) is refused once its
        source is gone, whole or as one message of a list, a message dict or a text block."""
        guard, got = summarized_then_evicted(written)
        assert got == written  # the caller gets the output unchanged
        value: object = {
            "str": got,
            "list": ["a new user turn about the deploy", got],
            "message": [{"role": "assistant", "content": got}],
            "block": {"role": "assistant", "content": [{"type": "text", "text": got}]},
        }[shape]
        region = guard.provenance(value)
        assert region.depth == 1
        assert "cfg" in region.sources
        assert guard.check(value, summarizer="p").effect == "deny"

    def test_another_process_recognises_the_returned_short_output(self, tmp_path: Path) -> None:
        """A guard on the same SQLite file, which caches nothing yet, finds it in the store."""
        path = tmp_path / "store.sqlite"
        first = Guard(store=SQLiteStore(path))
        first.record_source(SOURCE, "config_read", "cfg")
        got = first(lambda text: "Ceiling: seven.\n", summarizer="s")(SOURCE)
        first.store.evict("cfg")
        later = Guard(store=SQLiteStore(path))
        assert later.check([{"role": "assistant", "content": got}], summarizer="p").effect == "deny"
