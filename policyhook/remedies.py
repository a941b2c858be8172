"""Remedies: the way forward after a refusal, so that a refused compaction never strands an agent.

The seed asks two things of a runtime that must not re-compact a region: re-fetch the original
source, or surface the uncertainty; and resolve budget pressure by eviction to external storage,
not by compressing compressed text. Each remedy is one of those, as a library operation:

- `rederive`: summarize the live originals the region rests on instead of the region (chunked
  and concatenated when they exceed the summarizer's budget, so the result is one pass deep);
- `offload`: archive the region's texts losslessly in the store and put a short pointer in their
  place (`Guard.retrieve(ref)` gives them back exactly);
- `pin`: offload, and carry the exact facts the region's live sources state (numbers with their
  keys, identifiers, paths, versions) verbatim beside the pointer, each with its source id;
- `escalate`: ask a person or a callback, bounded by a timeout and a number of attempts, then
  fall back to another remedy. Nothing waits forever.

This module holds the pieces that need no guard (texts in, texts out); `Guard.remedy` runs them
for a refused call with the same telemetry as a decision.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import json
import re
import threading
from collections.abc import Awaitable, Callable, Generator, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from policyhook._policy import REMEDIES

if TYPE_CHECKING:
    from policyhook.grounding import Fact

Remedy = Literal["rederive", "offload", "pin", "escalate"]
#: What a refusal falls back to when its remedy cannot run: lossless, always possible.
FALLBACK: Remedy = "pin"
#: Kind of the store entry that holds an offloaded region.
OFFLOAD_KIND = "offload"
#: Source kind of the pointer text that stands in the window for an offloaded region.
POINTER_KIND = "offload_pointer"
POINTER_PREFIX = "[policyhook offload "
_POINTER_RE = re.compile(re.escape(POINTER_PREFIX) + r"(offload:[0-9a-f]+)\]")
#: A whole pointer: its first line, then the pinned facts it lists.
_BLOCK_RE = re.compile(
    re.escape(POINTER_PREFIX)
    + r"(offload:[0-9a-f]+)\][^\n]*(?:\nExact facts[^\n]*(?:\n- [^\n]*)*)?"
)


#: The key a number is assigned to, right before it: a name (`retry_ceiling`, `cfg.max-conns`),
#: or up to three plain words (`max connections`), then `:` or `=` (quotes around either).
_ASSIGNED_KEY_RE = re.compile(
    r"(?P<words>(?:[A-Za-z]+ ){0,2})(?P<name>[A-Za-z_][\w.\-]*)[\"']?[ \t]*[:=][ \t]*[\"']?$"
)
_WORD_RE = re.compile(r"[\w.\-]+")
#: A fact a pointer lists (`pointer_text`): `- <fact> [<source id>]`.
#: (A fact holds no " [", a source id may: the first one ends the fact.)
_PINNED_LINE_RE = re.compile(r"^- (?P<fact>.*?) \[(?P<source>.*)\]$", re.MULTILINE)


def remedy_name(value: object, where: str = "remedy") -> Remedy:
    """`value` as a Remedy, or a ValueError naming the field and the allowed values."""
    if value not in REMEDIES:
        raise ValueError(f'"{where}" must be one of {", ".join(REMEDIES)}: {value!r}')
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class Pinned:
    """An exact fact carried verbatim beside a pointer or summary, with the source stating it."""

    kind: str
    key: str
    value: str
    source_id: str

    def __str__(self) -> str:
        where = f"{self.key}: " if self.key else ""
        return f"{where}{self.value} [{self.source_id}]"


@dataclass(frozen=True)
class Remedied:
    """What a remedy put in place of the refused region.

    `text` is what the caller puts in the window where the summary would have gone; `remedy` is
    the remedy that made it (after any fallback) and `requested` the one the policy named;
    `reason` says why a fallback was taken. `ref` names the archived originals (offload, pin);
    `spooled`: the store could not take them, so they wait in the guard's spool (readable by
    this process's `Guard.retrieve` only) until the store answers again.
    """

    requested: Remedy
    remedy: Remedy
    text: str
    ref: str | None = None
    pinned: tuple[Pinned, ...] = ()
    reason: str = ""
    archived_chars: int = 0
    archived_items: int = 0
    spooled: bool = False

    @property
    def fell_back(self) -> bool:
        return self.remedy != self.requested


# -- offload ------------------------------------------------------------------------------------


def archive_payload(texts: Sequence[str]) -> str:
    """The store entry of an offloaded region: its texts as a JSON list, exactly."""
    return json.dumps(list(texts), ensure_ascii=False)


def unarchive(payload: str, ref: str) -> list[str]:
    """The texts an offload stored under `ref`; a ValueError when the entry is not one."""
    try:
        texts = json.loads(payload)
    except json.JSONDecodeError as exc:
        raise ValueError(f"store entry {ref!r} is not an offloaded region: {exc}") from None
    if not isinstance(texts, list) or not all(isinstance(t, str) for t in texts):
        raise ValueError(f"store entry {ref!r} is not an offloaded region: not a list of texts")
    return texts


def pointers(text: str) -> list[str]:
    """The offload refs named by the remedy pointers in `text`, in order (for runtimes and tools
    that follow pointers back to the archive)."""
    return _POINTER_RE.findall(text)


def without_pointers(text: str) -> str:
    """`text` with its remedy pointers blanked out (same length, so positions in it hold): what
    a summarizer wrote, for checking its facts. A pointer and its pinned facts are carried
    verbatim, never the summarizer's claim."""
    return _BLOCK_RE.sub(lambda m: " " * len(m.group()), text)


def carried(inputs: Iterable[str], output: str) -> str:
    """`output` with every pointer of `inputs` it lost appended verbatim.

    A pointer is the only way back to an archive, and its pinned facts are carried "outside any
    summary that could re-judge them": a summarizer that drops or rewrites them must not cut the
    path. (Older pointers live inside newer archives, so the window's own pointers suffice.)
    """
    kept = set(pointers(output))
    missing: list[str] = []
    for text in inputs:
        for block in _BLOCK_RE.finditer(text):
            if block.group(1) not in kept:
                kept.add(block.group(1))
                missing.append(block.group(0))
    return "\n\n".join([output.rstrip(), *missing]) if missing else output


def pointer_text(ref: str, texts: Sequence[str], pinned: Sequence[Pinned] = ()) -> str:
    """The short text that stands in the window for an offloaded region.

    It says what was archived, how much, and how to get it back, and lists the pinned facts so
    the agent keeps exact values without a retrieval.
    """
    chars = sum(len(t) for t in texts)
    lines = [
        f"{POINTER_PREFIX}{ref}] {len(texts)} earlier message(s), {chars} characters, were moved "
        f"to storage instead of being summarized again. Retrieve them exactly with the "
        f"`retrieve_context` tool or guard.retrieve({ref!r})."
    ]
    if pinned:
        lines.append("Exact facts from their live sources (verbatim, with source ids):")
        lines.extend(f"- {fact}" for fact in pinned)
    return "\n".join(lines)


# -- rederive -----------------------------------------------------------------------------------


def chunks(texts: Sequence[str], budget_chars: int | None) -> list[list[str]]:
    """`texts` in order, grouped so that each group fits `budget_chars` (one text per group at
    least: a text larger than the budget is its own group, never cut)."""
    if budget_chars is None:
        return [list(texts)] if texts else []
    if budget_chars < 1:
        raise ValueError(f'"budget_chars" must be >= 1: {budget_chars}')
    groups: list[list[str]] = []
    size = 0
    for text in texts:
        if groups and size + len(text) <= budget_chars:
            groups[-1].append(text)
            size += len(text)
        else:
            groups.append([text])
            size = len(text)
    return groups


def merge(summaries: Iterable[str]) -> str:
    """Chunk summaries side by side: each rests on originals, so the whole is one pass deep.
    (Summarizing them again would be a summary of summaries: the thing being avoided.)"""
    return "\n\n".join(s.strip() for s in summaries if s.strip())


# -- escalate -----------------------------------------------------------------------------------

#: An escalation handler gets the refusal and answers with a remedy to run, a text to put in the
#: window (a person's own summary), or None (no answer: fall back).
Answer = str | None
Handler = Callable[[object], Answer]
AsyncHandler = Callable[[object], Awaitable[Answer]]


@dataclass(frozen=True)
class Escalation:
    """Who to ask after a refusal whose remedy is `escalate`, and for how long.

    `handler(refusal)` is called up to `attempts` times, each bounded by `timeout` seconds; a
    handler that raises or times out counts as no answer. With no answer, `fallback` runs.
    A sync handler that never returns is left running in a daemon thread: the call goes on.
    """

    handler: Handler | AsyncHandler
    timeout: float = 30.0
    attempts: int = 1
    fallback: Remedy = FALLBACK

    def __post_init__(self) -> None:
        if not self.timeout > 0:
            raise ValueError(f'"timeout" must be > 0 seconds: {self.timeout}')
        if self.attempts < 1:
            raise ValueError(f'"attempts" must be >= 1: {self.attempts}')
        if remedy_name(self.fallback, "fallback") == "escalate":
            raise ValueError('"fallback" must not be escalate: it would ask again without end')

    def ask(self, refusal: object) -> tuple[Answer, str]:
        """The handler's answer (None: none in time) and, without one, why."""
        reason = ""
        for attempt in range(1, self.attempts + 1):
            outcome: list[tuple[Answer, BaseException | None]] = []
            worker = threading.Thread(
                target=_call_into, args=(self.handler, refusal, outcome), daemon=True
            )
            worker.start()
            worker.join(self.timeout)
            if not outcome:
                reason = f"escalation attempt {attempt}: no answer within {self.timeout:g}s"
                continue
            answer, error = outcome[0]
            if error is not None:
                reason = f"escalation attempt {attempt}: handler raised {error!r}"
            elif answer is None:
                reason = f"escalation attempt {attempt}: handler declined"
            else:
                return answer, ""
        return None, reason

    async def aask(self, refusal: object) -> tuple[Answer, str]:
        """`ask` for async callers: the event loop is never blocked (a sync handler runs in a
        daemon thread; an async one is awaited), and each attempt is bounded by `timeout`."""
        reason = ""
        for attempt in range(1, self.attempts + 1):
            try:
                if inspect.iscoroutinefunction(self.handler):
                    pending: Awaitable[Answer] = self.handler(refusal)
                else:
                    pending = _in_daemon_thread(self.handler, refusal)
                answer = await asyncio.wait_for(pending, self.timeout)
                if answer is not None:
                    return answer, ""
                reason = f"escalation attempt {attempt}: handler declined"
            except TimeoutError:
                reason = f"escalation attempt {attempt}: no answer within {self.timeout:g}s"
            except Exception as exc:
                reason = f"escalation attempt {attempt}: handler raised {exc!r}"
        return None, reason


def _in_daemon_thread(fn: Callable[[object], Any], arg: object) -> asyncio.Future[Any]:
    """Run `fn(arg)` in a daemon thread (one that never answers does not hold the process at
    exit, as executor threads would) and await its result."""
    loop = asyncio.get_running_loop()
    future: asyncio.Future[Any] = loop.create_future()

    def settle(result: Any, error: BaseException | None) -> None:
        if future.done():
            return
        if error is not None:
            future.set_exception(error)
        else:
            future.set_result(result)

    def call() -> None:
        try:
            result, error = fn(arg), None
        except BaseException as exc:  # handed to the awaiting task
            result, error = None, exc
        with contextlib.suppress(RuntimeError):  # the loop closed meanwhile: nobody waits
            loop.call_soon_threadsafe(settle, result, error)

    threading.Thread(target=call, name="policyhook-escalate", daemon=True).start()
    return future


def _call_into(
    handler: Handler | AsyncHandler,
    refusal: object,
    outcome: list[tuple[Answer, BaseException | None]],
) -> None:
    """One escalation attempt in a worker thread; an async handler gets its own event loop."""
    try:
        answer = handler(refusal)
        if inspect.isawaitable(answer):
            answer = asyncio.run(_awaited(answer))
        outcome.append((answer, None))
    except BaseException as exc:  # reported to the asking call as "handler raised"
        outcome.append((None, exc))


async def _awaited(pending: Awaitable[Answer]) -> Answer:
    return await pending


# -- pin ----------------------------------------------------------------------------------------

#: Fact kinds worth carrying verbatim, most load-bearing first: values a summary re-judges.
PIN_KINDS = ("number", "version", "path", "url", "ticket", "hash", "uuid", "identifier", "date")


def pin(texts: Iterable[tuple[str, str]], limit: int = 40) -> tuple[Pinned, ...]:
    """The exact facts stated by `texts` ((source id, text) pairs), at most `limit`.

    Numbers count only with their key beside them (`retry_ceiling: 7`, the key as written): a
    bare number is no fact anyone can re-use. Kinds are taken in `PIN_KINDS` order, each fact
    once, with the first source stating it; an identifier that is a pinned number's key is not
    pinned again on its own. A pointer of an earlier remedy in a text (its region offloaded
    again) hands on the facts it pinned, each with the source it came from; its own wording
    (the ref, the retrieval tool) states no fact.
    """
    found: dict[tuple[str, str, str], Pinned] = {}
    for source_id, text in texts:
        for block in _BLOCK_RE.finditer(text):
            for line in _PINNED_LINE_RE.finditer(block.group()):
                for fact in _listed(line["fact"], line["source"]):
                    found.setdefault((fact.kind, fact.key, fact.value), fact)
        for fact in _pinnable(without_pointers(text), source_id):
            found.setdefault((fact.kind, fact.key, fact.value), fact)
    keys = {
        w for p in found.values() for run in _WORD_RE.findall(p.key) for w in (run, *run.split("."))
    }
    rank = {kind: i for i, kind in enumerate(PIN_KINDS)}
    ordered = sorted(
        (p for p in found.values() if p.kind != "identifier" or p.value not in keys),
        key=lambda p: rank[p.kind],
    )  # stable: first seen first
    return tuple(ordered[:limit])


def _listed(line: str, source_id: str) -> list[Pinned]:
    """The fact a pointer's line lists: the one whose rendering it is (so the kind, lost in the
    text, is found again); all the facts of a line edited by hand."""
    facts = _pinnable(line, source_id)
    exact = [f for f in facts if (f"{f.key}: {f.value}" if f.key else f.value) == line]
    return exact[:1] or facts


def _pinnable(text: str, source_id: str) -> list[Pinned]:
    """The facts of `text` worth pinning (`pin`), each stated by `source_id`."""
    from policyhook.grounding import extract

    return [
        Pinned(
            fact.kind, _key_of(text, fact) if fact.kind == "number" else "", fact.text, source_id
        )
        for fact in extract(text)
        if fact.kind in PIN_KINDS and (fact.kind != "number" or fact.assigned)
    ]


def _key_of(text: str, fact: Fact) -> str:
    """The key a number is assigned to, as written: `retry_ceiling` in `agent.yaml:
    retry_ceiling: 7`, `max connections` in `max connections = 100` (the grounding check's
    key is its context words, `yaml retry_ceiling`)."""
    written = _ASSIGNED_KEY_RE.search(text, max(0, fact.start - 120), fact.start)
    if written is None:
        return fact.key
    words, name = written.group("words", "name")
    return words + name if name.isalpha() else name


# -- one remedy, as a plan the sync and async drivers both run ---------------------------------

#: What a plan asks its driver for: ("summarize", texts) -> the summary of those originals;
#: ("escalate", None) -> the escalation's (answer, reason).
Step = tuple[Literal["summarize"], list[str]] | tuple[Literal["escalate"], None]


@dataclass(frozen=True)
class Situation:
    """What a remedy needs to know of the refused call (gathered by `Guard.remedy`)."""

    requested: Remedy
    texts: tuple[str, ...]  # the input's texts, in order
    live: tuple[tuple[str, str], ...]  # (source id, text) of the live sources, oldest first
    dead: tuple[str, ...]  # source ids no store holds any more
    can_summarize: bool
    budget_chars: int | None
    escalation: Escalation | None
    pin_limit: int = 40


def plan(
    situation: Situation, offload: Callable[[Sequence[str], Sequence[Pinned]], tuple[str, str]]
) -> Generator[Step, Any, Remedied]:
    """Run the requested remedy, falling back to `FALLBACK` (pin: lossless, always possible) when
    it cannot run. `offload(texts, pinned)` archives texts and returns (ref, pointer text)."""
    requested = remedy = situation.requested
    reason = ""
    if remedy == "escalate":
        if situation.escalation is None:
            remedy, reason = FALLBACK, "no escalation handler is configured"
        else:
            answer, why = yield ("escalate", None)
            if answer is None:
                remedy, reason = situation.escalation.fallback, why
            elif answer in REMEDIES and answer != "escalate":
                remedy = answer
            else:  # a person's own text for the window
                return Remedied(requested, "escalate", str(answer))
    if remedy == "rederive":
        if situation.dead:
            remedy = FALLBACK
            reason = (
                f"cannot re-derive: {len(situation.dead)} source(s) are gone from the store "
                f"(e.g. {situation.dead[0]})"
            )
        elif not situation.can_summarize:
            remedy, reason = FALLBACK, "cannot re-derive: no summarizer to run on the originals"
        elif not situation.live:
            remedy, reason = FALLBACK, "cannot re-derive: the region rests on no stored original"
        else:
            originals = [text for _, text in situation.live]
            parts = []
            for group in chunks(originals, situation.budget_chars):
                parts.append((yield ("summarize", group)))
            return Remedied(requested, "rederive", merge(parts), reason=reason)
    pinned = pin(situation.live, situation.pin_limit) if remedy == "pin" else ()
    ref, pointer = offload(situation.texts, pinned)
    return Remedied(
        requested,
        remedy,
        pointer,
        ref=ref,
        pinned=pinned,
        reason=reason,
        archived_chars=sum(len(t) for t in situation.texts),
        archived_items=len(situation.texts),
    )
