"""Helpers for testing code that uses policyhook (as structlog's `capture_logs`), and the policy
test runner behind `policyhook test` (`run_tests`: `*_test.yaml` cases decided and compared)."""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from policyhook._hook import Guard
from policyhook._policy import Decision
from policyhook._tester import CaseResult as CaseResult
from policyhook._tester import PolicyTestError as PolicyTestError
from policyhook._tester import run_tests as run_tests


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
