"""Replay a decision log under other policies: which decisions would change, and how.

Beside the decision log (policyhook.decisionlog writes and reads it); `policyhook replay` prints
the report. A decision is the same when its effect, deciding policy and rule are all the same.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TextIO

from policyhook import _activation as schema
from policyhook import decisionlog
from policyhook._policy import PolicySet


@dataclass
class ReplayReport:
    """What replaying a log gave: counts per `old -> new` effect and the first changed records."""

    revision: str
    total: int = 0
    changed: int = 0
    transitions: Counter[str] = field(default_factory=Counter)
    examples: list[dict[str, Any]] = field(default_factory=list)
    seconds: float = 0.0
    #: Lines that are not whole records (torn by a crash or a full disk), skipped.
    unreadable: list[decisionlog.Damaged] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "revision": self.revision,
            "total": self.total,
            "changed": self.changed,
            "transitions": dict(sorted(self.transitions.items())),
            "examples": self.examples,
            "seconds": round(self.seconds, 3),
            "unreadable": len(self.unreadable),
            "unreadable_lines": [str(d) for d in self.unreadable[:20]],
        }


def replay(
    policies: PolicySet,
    log: str | Path,
    *,
    examples: int = 5,
    progress: Callable[[int, float], None] | None = None,
) -> ReplayReport:
    """Re-decide every record of `log` under `policies`.

    A line that is not a whole record (a writer killed mid-line, a full disk) is skipped and
    listed in `report.unreadable`; a whole record whose activation does not validate raises
    ValueError naming its line. Lists the log shortened are replayed at their full length
    (`decisionlog.activation_of`). `progress` is
    called with (records so far, seconds so far) every 2 seconds of a long replay.
    """
    report = ReplayReport(policies.revision)
    started = last = time.monotonic()
    for number, entry in decisionlog.read(log, report.unreadable):
        activation = schema.validate(decisionlog.activation_of(entry), where=f"{log}:{number}")
        decision = policies.decide(activation)
        old = {
            "decision": entry.get("decision"),
            "policy": entry.get("policy") or "",
            "rule": entry.get("rule") or "",
        }
        new = {"decision": decision.effect, "policy": decision.policy, "rule": decision.rule}
        report.transitions[f"{old['decision']} -> {new['decision']}"] += 1
        report.total += 1
        if old != new:
            report.changed += 1
            if len(report.examples) < examples:
                report.examples.append(
                    {
                        "line": number,
                        "decision_id": entry.get("decision_id"),
                        "old": {**old, "revision": entry.get("revision")},
                        "new": {**new, "revision": decision.revision},
                    }
                )
        now = time.monotonic()
        if progress is not None and now - last >= 2.0:
            last = now
            progress(report.total, now - started)
    report.seconds = time.monotonic() - started
    return report


def report_text(report: ReplayReport, out: TextIO) -> None:
    """The summary line, the count of each transition, then the examples."""
    out.write(f"replayed {report.total} decisions under revision {report.revision} ")
    out.write(f"in {report.seconds:.1f}s: {report.changed} would change\n")
    if report.unreadable:
        out.write(f"  {len(report.unreadable)} lines could not be read (skipped):\n")
        for damaged in report.unreadable[:20]:
            out.write(f"    {damaged}\n")
    for transition, count in sorted(report.transitions.items()):
        out.write(f"  {transition:<26} {count}\n")
    for ex in report.examples:
        out.write(
            f"  e.g. line {ex['line']} ({ex['decision_id']}): {_outcome(ex['old'])} -> "
            f"{_outcome(ex['new'])}\n"
        )


def report_json(report: ReplayReport, out: TextIO) -> None:
    json.dump(report.as_json(), out, indent=2)
    out.write("\n")


def _outcome(side: dict[str, Any]) -> str:
    return f"{side['decision']}/{side['policy'] or '-'}/{side['rule'] or '-'}"
