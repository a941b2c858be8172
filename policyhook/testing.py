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
def capture_decisions(
    guard: Guard, *, phase: str | None = None
) -> Iterator[list[tuple[Decision, Mapping[str, Any]]]]:
    """Collect (decision, activation) for every decision `guard` makes inside the block.

    A granted call is decided twice when the policies check outputs (the default does): on its
    input, then on its output (the activation has `summary`). `phase="input"` or `"output"`
    keeps only those; None keeps both, in order.
    """
    if phase not in (None, "input", "output"):
        raise ValueError(f'phase must be "input", "output" or None: {phase!r}')
    seen: list[tuple[Decision, Mapping[str, Any]]] = []

    def listen(decision: Decision, activation: Mapping[str, Any]) -> None:
        if phase is None or ("summary" in activation) == (phase == "output"):
            seen.append((decision, activation))

    guard.add_listener(listen)
    try:
        yield seen
    finally:
        guard.remove_listener(listen)
