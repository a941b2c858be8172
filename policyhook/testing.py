"""Helpers for testing code that uses policyhook (as structlog's `capture_logs`)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from policyhook.hook import Guard
from policyhook.policy import Decision


@contextmanager
def capture_decisions(guard: Guard) -> Iterator[list[tuple[Decision, Mapping[str, Any]]]]:
    """Collect (decision, activation) for every decision `guard` makes inside the block."""
    seen: list[tuple[Decision, Mapping[str, Any]]] = []

    def listen(decision: Decision, activation: Mapping[str, Any]) -> None:
        seen.append((decision, activation))

    guard.add_listener(listen)
    try:
        yield seen
    finally:
        guard.remove_listener(listen)
