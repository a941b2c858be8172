"""`policyhook demo`: the recompaction failure from the seed, the guard stopping it, and the
way forward it takes.

A config read says the retry ceiling is 7. A deterministic lossy summarizer compacts the window
four times: pass 2 drops the number, pass 3 confabulates "5". Unguarded, the window ends up
stating 5 with full confidence. Guarded, the config source is evicted before pass 3, so pass 3
would re-summarize a claim no store can check any more: it is refused, and so is pass 4, and the
window keeps its last grounded summary, but grows with every refused pass. Guarded with remedies,
each refusal archives the region and puts a pointer in its place: the window stays two messages,
nothing is lost (the archive comes back exactly), and the "5" never enters.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TextIO

from policyhook import remedies
from policyhook._errors import UnsafeRecompactionError
from policyhook._hook import Guard, request
from policyhook._policy import Decision
from policyhook._provenance import Source
from policyhook.testing import capture_decisions

CONFIG = "config/agent.yaml: retry_ceiling: 7  # max retries for flaky tool calls"
TURNS = (
    "user: the deploy step keeps timing out, please keep retrying it",
    "tool(deploy): timeout after 30s (attempt 1)",
    "user: also make sure the notification goes to #ops",
    "tool(deploy): timeout after 30s (attempt 2)",
    "user: what is the status?",
)
#: What each pass of the lossy summarizer says about retries.
CLAIMS = (
    "retry ceiling is 7 (from config)",
    "retries are capped",
    "retries capped at 5",
    "retries capped at 5; stop after the 5th failure",
)


def lossy_summarizer() -> Callable[[list[str]], str]:
    """A stand-in LLM: each pass compresses its input and re-judges the retry detail."""
    claims = iter(CLAIMS)

    def summarize(messages: list[str]) -> str:
        return f"Summary: deploy keeps timing out; notify #ops; {next(claims)}."

    return summarize


@dataclass(frozen=True)
class Pass:
    """One compaction pass of the guarded run."""

    number: int
    depth: int
    live: int
    sources: int
    decision: str
    rule: str
    claim: str


@dataclass(frozen=True)
class RemediedPass:
    """One compaction pass of the run with remedies: what the window holds after it."""

    number: int
    decision: str
    rule: str
    remedy: str
    messages: int
    holds: str


def run(out: TextIO, guard: Guard | None = None) -> list[Pass]:
    """Print the unguarded run, the guarded one and the one with remedies; returns the guarded
    passes (`with_remedies` returns its own)."""
    unguarded = lossy_summarizer()
    window = [CONFIG, TURNS[0]]
    out.write("Without policyhook: four automatic compactions of the same window\n")
    for number in range(1, 5):
        window = [unguarded(window), TURNS[number]]
        out.write(f"  pass {number}: {window[0]}\n")
    out.write("  -> the agent now believes the retry ceiling is 5. The config said 7.\n\n")

    guard = guard or Guard()
    summarize = guard(lossy_summarizer(), summarizer="demo-lossy")
    config = _record_sources(guard)
    names = ", ".join(p.name for p in guard.policies.policies)
    out.write(f"With policyhook (policies {names}, revision {guard.policies.revision}):\n")
    passes: list[Pass] = []
    window = [CONFIG, TURNS[0]]
    for number in range(1, 5):
        with _compaction(guard, config, number, "demo", out) as seen:
            try:
                window = [summarize(window), TURNS[number]]
            except UnsafeRecompactionError as refusal:
                out.write(f"  pass {number} refused: {refusal.message}\n")
                window = [*window, TURNS[number]]
        decision, activation = seen[0]
        region = activation["region"]
        passes.append(
            Pass(
                number=number,
                depth=region["depth"],
                live=len(region["live_sources"]),
                sources=len(region["sources"]),
                decision=decision.effect,
                rule=decision.rule or "-",
                claim=window[0].rpartition("; ")[2].rstrip("."),
            )
        )
    out.write("\n  pass | depth | live sources | decision | rule         | window says\n")
    out.write("  -----|-------|--------------|----------|--------------|------------\n")
    for p in passes:
        out.write(
            f"  {p.number:>4} | {p.depth:>5} | {f'{p.live}/{p.sources}':>12} | {p.decision:<8} "
            f"| {p.rule:<12} | {p.claim}\n"
        )
    confabulated = any("5" in message for message in window)
    out.write(
        f"\nThe confabulated '5' {'ENTERED' if confabulated else 'never entered'} the guarded "
        "window. Every pass was traced and counted (policyhook.guard span, policyhook.decisions).\n"
        f"But each refused pass left the window to grow: {len(window)} messages after pass 4.\n"
    )
    with_remedies(out, guard)
    return passes


@contextmanager
def _compaction(
    guard: Guard, config: Source, number: int, window: str, out: TextIO
) -> Iterator[list[tuple[Decision, Mapping[str, Any]]]]:
    """Pass `number`: an automatic compaction at 92% of the budget, its decisions captured;
    before pass 3 the store evicts the config read."""
    if number == 3:
        guard.store.evict(config.id)
        out.write(f"  before pass 3 the store evicts {config.id!r}\n")
    with (
        request(trigger="automatic", budget_pressure=0.92, window=window),
        capture_decisions(guard) as seen,
    ):
        yield seen


def _record_sources(guard: Guard) -> Source:
    """The runtime registers the config read and every turn as it sees them."""
    config = guard.record_source(CONFIG, kind="config_read", source_id="cfg-retry-ceiling")
    for turn in TURNS:
        guard.record_source(turn, kind="tool_output" if turn.startswith("tool") else "user_turn")
    return config


def with_remedies(out: TextIO, guard: Guard) -> list[RemediedPass]:
    """The guarded run again with `remedy=True`: each refusal's remedy in the window."""
    summarize = guard(lossy_summarizer(), summarizer="demo-lossy", remedy=True)
    config = _record_sources(guard)  # (the config back in the store, if evicted before)
    out.write("\nWith policyhook and remedies (remedy=True), the same passes:\n")
    passes: list[RemediedPass] = []
    window = [CONFIG, TURNS[0]]
    archived: dict[str, list[str]] = {}
    for number in range(1, 5):
        with _compaction(guard, config, number, "demo-remedies", out) as seen:
            result = summarize(window)
        refs = remedies.pointers(result)
        decision, activation = seen[-1]  # the output's, when the input's was an allow
        if refs:
            archived[refs[0]] = window
            what = f"pass {number}'s summary" if "summary" in activation else f"pass {number}"
            out.write(
                f"  {what} refused ({decision.rule}): its {len(window)} messages are archived, "
                "a pointer takes their place\n"
            )
            chars = sum(len(text) for text in window)
            holds = f"pointer to {len(window)} archived messages ({chars} chars)"
        else:
            holds = "summary: " + result.rpartition("; ")[2].rstrip(".")
        window = [result, TURNS[number]]
        passes.append(
            RemediedPass(
                number=number,
                decision=decision.effect,
                rule=decision.rule or "-",
                remedy=(decision.remedy or "-") if refs else "-",
                messages=len(window),
                holds=holds,
            )
        )
    out.write("\n  pass | decision | rule             | remedy | window holds\n")
    out.write("  -----|----------|------------------|--------|-------------\n")
    for p in passes:
        out.write(f"  {p.number:>4} | {p.decision:<8} | {p.rule:<16} | {p.remedy:<6} | {p.holds}\n")
    exact = all(guard.retrieve(ref) == texts for ref, texts in archived.items())
    confabulated = any("5" in remedies.without_pointers(text) for text in window)
    out.write(
        f"\nThe window stayed at {len(window)} messages; every archived message comes back "
        f"{'exactly' if exact else 'ALTERED'} (guard.retrieve(ref)); the '5' "
        f"{'ENTERED' if confabulated else 'never entered'}. Each remedy is traced too "
        "(policyhook.remedy span, policyhook.remedies).\n"
    )
    return passes
