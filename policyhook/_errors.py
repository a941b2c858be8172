"""Exceptions: the refusal an agent runtime catches, and the load errors an operator reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from policyhook._policy import Decision


class UnsafeRecompactionError(RuntimeError):
    """Raised instead of summarizing; the window it was asked to compact is left untouched.

    A RuntimeError because it is a refusal at run time, not a bug in the caller's arguments.
    `store_failed` is True when the store could not answer while the guard decided: what it
    could not read counted as dead, so the same input may be allowed once the store answers
    again (an adapter must not remember such a refusal for good).
    """

    def __init__(self, decision: Decision, *, store_failed: bool = False) -> None:
        self.decision = decision
        self.store_failed = store_failed
        super().__init__(str(self))

    @property
    def policy(self) -> str:
        return self.decision.policy

    @property
    def rule(self) -> str:
        return self.decision.rule

    @property
    def message(self) -> str:
        return self.decision.message

    @property
    def remedy(self) -> str:
        """The way forward the refusing rule names (see `policyhook.remedies`), or ""."""
        return self.decision.remedy

    @property
    def region_id(self) -> str:
        return self.decision.region_id

    @property
    def depth(self) -> int:
        return self.decision.depth

    @property
    def dead_sources(self) -> tuple[str, ...]:
        return self.decision.dead_sources

    @property
    def decision_id(self) -> str:
        return self.decision.decision_id

    def __str__(self) -> str:
        d = self.decision
        dead = ", ".join(d.dead_sources[:5]) or "none"
        if len(d.dead_sources) > 5:
            dead += f" (+{len(d.dead_sources) - 5} more)"
        return (
            f"refused to summarize region {d.region_id} (depth {d.depth}, dead sources: {dead}): "
            f"{d.message} [policy {d.policy!r}, rule {d.rule!r}, decision {d.decision_id}]"
        )


@dataclass(frozen=True)
class PolicyIssue:
    """One problem found while loading policies, located like a compiler error."""

    file: str
    message: str
    line: int | None = None
    column: int | None = None
    policy: str | None = None
    rule: str | None = None
    code: str = "invalid"
    snippet: str | None = None

    def location(self) -> str:
        where = self.file
        if self.line is not None:
            where += f":{self.line}"
            if self.column is not None:
                where += f":{self.column}"
        return where

    def __str__(self) -> str:
        scope = ""
        if self.policy:
            scope = f" policy {self.policy!r}"
            if self.rule:
                scope += f" rule {self.rule!r}"
            scope += ":"
        text = f"{self.location()}: {self.code}:{scope} {self.message}"
        if self.snippet:
            text += "\n" + self.snippet
        return text


class PolicyError(ValueError):
    """A policy set that cannot be loaded; lists every problem found, not just the first."""

    def __init__(self, issues: Sequence[PolicyIssue]) -> None:
        self.issues = tuple(sorted(issues, key=lambda i: (i.file, i.line or 0, i.column or 0)))
        super().__init__(str(self))

    def __str__(self) -> str:
        if len(self.issues) == 1:
            return str(self.issues[0])
        head = f"{len(self.issues)} errors occurred:"
        return "\n".join([head, *(str(i) for i in self.issues)])


class StoreUnavailableError(ConnectionError):
    """A shared store did not answer within its timeout (down, unreachable, connection dropped).

    The guard counts every source of the decision it was asking about as dead (fail closed) and
    logs this message; a write (`record_source`) raises it to the caller.
    """
