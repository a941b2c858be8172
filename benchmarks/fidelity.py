"""Fidelity harness: what the gate saves, pass by pass, on seeded repeated-compaction runs.

After the probe-recall method of adk-go PR #1431: facts are planted early in a generated
conversation and asked back after every compaction. One run puts the conditions side by side:

    no-gate           the summarizer is called whenever budget pressure says so
    gate              the guard decides (the default: input, and numbers on the output); a
                      refusal keeps the window as it is
    gate+remedies     a refusal is answered with the policy's remedy (offload, pin, ...)
    gate+grounding    also every fact of a granted output, and no key fact dropped
    everything        both

The summarizers model failures observed in real compactions (deterministic under a seed):

    faithful          keeps every fact verbatim (the control)
    lossy             each pass drops a stated value with probability p, or generalises it to its
                      label ("retry_ceiling: 7" -> "retries are capped"), as in the seed's pass 2
    confabulating     lossy, and a generalised fact gets a plausible nearby value on a later pass
                      ("retries are capped" -> "retry_ceiling: 5"), as in the seed's pass 3

    .venv/bin/python benchmarks/fidelity.py                 # full run: markdown table + PNG
    .venv/bin/python benchmarks/fidelity.py --quick         # the CI-sized run
    .venv/bin/python benchmarks/fidelity.py --json out.json --plot fidelity.png

Metrics per compaction pass: probe recall (planted facts stated exactly in the window, or
retrievable through a pointer the window holds), wrong facts accepted into the window (a planted
key stated with another value: the harness knows the truth), window tokens against the budget,
and the running counts of summarize calls, refusals and remedies applied.
"""

from __future__ import annotations

import argparse
import importlib
import json
import random
import re
import sys
import tempfile
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from importlib import resources
from pathlib import Path
from typing import Any

import policyhook
from policyhook import Guard, UnsafeRecompactionError, remedies
from policyhook.testing import capture_decisions

SUMMARY_HEADER = "Summary of the conversation so far:"
#: Filler vocabulary: turns of realistic length that state no planted fact.
WORDS: tuple[str, ...] = (
    "deploy",
    "staging",
    "canary",
    "latency",
    "alert",
    "queue",
    "cache",
    "schema",
    "replica",
)
WORDS += ("backoff", "session", "payload", "cluster", "artifact", "release", "review", "owner")


@dataclass(frozen=True)
class Fact:
    """A planted fact: stated once early as `key: value`, asked back after every pass."""

    kind: str
    key: str
    value: str
    label: str  # what a lossy summary keeps of it once the value is gone

    @property
    def statement(self) -> str:
        return f"{self.key}: {self.value}"


@dataclass(frozen=True)
class Message:
    role: str
    kind: str  # the source kind it is recorded under
    text: str


def plant(rng: random.Random, count: int) -> list[Fact]:
    """`count` facts of several kinds, values drawn from the seed."""
    makers: list[Callable[[int], Fact]] = [
        lambda i: Fact("config", f"retry_ceiling_{i}", str(rng.randint(3, 12)), "retries capped"),
        lambda i: Fact("tool", f"timeout_ms_{i}", str(rng.randrange(500, 9000, 50)), "timeouts"),
        lambda i: Fact(
            "path",
            f"config_path_{i}",
            f"/srv/{rng.choice(WORDS)}/{rng.choice(WORDS)}-{rng.randint(1, 99)}.yaml",
            "a config file",
        ),
        lambda i: Fact("ident", f"ticket_{i}", f"OPS-{rng.randint(1000, 9999)}", "a ticket"),
        lambda i: Fact(
            "version", f"db_version_{i}", f"{rng.randint(9, 17)}.{rng.randint(0, 9)}", "a db"
        ),
        lambda i: Fact(
            "name", f"owner_{i}", rng.choice(["Priya", "Tomas", "Aiko", "Jonas"]), "an owner"
        ),
        lambda i: Fact("hash", f"build_{i}", f"{rng.getrandbits(28):07x}", "a build"),
        lambda i: Fact("number", f"max_workers_{i}", f"{rng.randint(2, 64)}", "a worker limit"),
    ]
    return [makers[i % len(makers)](i) for i in range(count)]


def filler(rng: random.Random, chars: int) -> str:
    words: list[str] = []
    while sum(len(w) + 1 for w in words) < chars:
        words.append(rng.choice(WORDS))
    return " ".join(words)


def transcript(
    seed: int, facts: int, turns: int, turn_chars: int
) -> tuple[list[Fact], list[Message]]:
    """A seeded conversation: the facts stated in the first turns, then filler turns."""
    rng = random.Random(seed)
    planted = plant(rng, facts)
    messages: list[Message] = []
    for i, fact in enumerate(planted):
        kind = {"config": "config_read", "tool": "tool_output"}.get(fact.kind, "user_turn")
        role = "tool" if kind != "user_turn" else "user"
        text = f"{role}({i}): {fact.statement}. {filler(rng, turn_chars // 2)}"
        messages.append(Message(role, kind, text))
    for i in range(turns - facts):
        role = "user" if i % 2 else "assistant"
        kind = "user_turn" if role == "user" else "ai_turn"
        messages.append(Message(role, kind, f"{role}({facts + i}): {filler(rng, turn_chars)}"))
    return planted, messages


# -- summarizers --------------------------------------------------------------------------------

STATED = re.compile(r"\b([a-z_]+_\d+): (\S+?)(?=[.,;]?(?:\s|$))")


class Summarizer:
    """Deterministic stand-in for an LLM summarizer with one of the observed failure modes."""

    def __init__(self, mode: str, facts: Sequence[Fact], seed: int, p: float = 0.3) -> None:
        if mode not in ("faithful", "lossy", "confabulating"):
            raise ValueError(f'"mode" must be faithful, lossy or confabulating: {mode!r}')
        self.mode, self.p = mode, p
        self.facts = {f.key: f for f in facts}
        self.rng = random.Random(f"{seed}:{mode}")
        self.calls = 0

    def __call__(self, texts: list[str]) -> str:
        self.calls += 1
        joined = "\n".join(texts)
        lines = [SUMMARY_HEADER]
        for key, fact in self.facts.items():
            value = _stated(joined, key)
            generalised = f"- {fact.label} ({key})" in joined
            if value is not None:
                if self.mode != "faithful" and self.rng.random() < self.p:
                    lines.append(f"- {fact.label} ({key})")  # the value judged redundant
                else:
                    lines.append(f"- {key}: {value}")
            elif generalised:
                if self.mode == "confabulating" and self.rng.random() < self.p:
                    lines.append(f"- {key}: {_nearby(fact.value, self.rng)}")  # plausible, wrong
                else:
                    lines.append(f"- {fact.label} ({key})")
        lines.append("- and the discussion that followed")
        return "\n".join(lines)


def _stated(text: str, key: str) -> str | None:
    for found, value in STATED.findall(text):
        if found == key:
            return str(value)
    return None


def _nearby(value: str, rng: random.Random) -> str:
    """A plausible value near `value`: what a summarizer invents once the real one is gone."""
    if value.isdigit():
        return str(max(0, int(value) + rng.choice([-3, -2, -1, 1, 2, 3])))
    digits = [i for i, c in enumerate(value) if c.isdigit()]
    if digits:
        i = rng.choice(digits)
        return value[:i] + str((int(value[i]) + rng.randint(1, 8)) % 10) + value[i + 1 :]
    return value[::-1]


# -- conditions ---------------------------------------------------------------------------------


@dataclass
class Pass:
    """The window right after one compaction trigger."""

    number: int
    recall: float
    wrong: int
    tokens: int
    budget: int
    calls: int
    refusals: int
    remedies: int


@dataclass
class Run:
    condition: str
    summarizer: str
    passes: list[Pass] = field(default_factory=list)
    refused_regions: list[str] = field(default_factory=list)

    def measure(
        self,
        window: Sequence[str],
        facts: Sequence[Fact],
        guard: Guard | None,
        *,
        tokens: int,
        budget: int,
        calls: int,
        refusals: int,
        remedies: int,
    ) -> None:
        """One more Pass: the window's recall (with what its pointers lead to) and wrong facts."""
        recall, wrong = probe(window, facts, _behind(guard, window))
        self.passes.append(
            Pass(len(self.passes) + 1, recall, wrong, tokens, budget, calls, refusals, remedies)
        )

    def refused(self, decided: Sequence[tuple[Any, Any]]) -> int:
        """Note the regions refused in `decided`; how many there were."""
        regions = [d.region_id for d, _ in decided if d.effect == "deny"]
        self.refused_regions += regions
        return len(regions)


def tokens(window: Sequence[str]) -> int:
    return sum(len(t) for t in window) // 4


def probe(
    window: Sequence[str], facts: Sequence[Fact], retrievable: Sequence[str] = ()
) -> tuple[float, int]:
    """(recall, wrong): facts stated exactly in the window or behind its pointers; wrong values."""
    text = "\n".join(window)
    behind = "\n".join(retrievable)
    found = sum(
        1 for f in facts if _stated(text, f.key) == f.value or _stated(behind, f.key) == f.value
    )
    wrong = sum(1 for f in facts if (v := _stated(text, f.key)) is not None and v != f.value)
    return found / len(facts), wrong


@dataclass
class Config:
    seed: int = 7
    facts: int = 8
    turns: int = 120
    turn_chars: int = 600
    budget: int = 2000  # tokens
    trigger: float = 0.8  # compact when the window is this full
    keep: int = 4  # recent messages never summarized
    retention: int = 30  # turns a source stays in the store before it is evicted (dead)
    p: float = 0.3


def run(condition: str, mode: str, cfg: Config) -> Run:
    """One seeded conversation through one condition; a Pass per compaction trigger."""
    facts, messages = transcript(cfg.seed, cfg.facts, cfg.turns, cfg.turn_chars)
    summarizer = Summarizer(mode, facts, cfg.seed, cfg.p)
    guard = _guard(condition)
    remedy = condition in ("gate+remedies", "everything")
    summarize: Callable[[list[str]], str] = (
        guard(summarizer, summarizer=f"fidelity-{mode}", remedy=remedy)
        if guard is not None
        else summarizer
    )
    result = Run(condition, mode)
    window: list[str] = []
    recorded: list[tuple[int, str]] = []  # (turn, source id) in the order recorded
    refusals = remedied = 0
    for turn, message in enumerate(messages):
        window.append(message.text)
        if guard is not None:
            source = guard.record_source(message.text, message.kind)
            recorded.append((turn, source.id))
            while recorded and recorded[0][0] < turn - cfg.retention:
                guard.store.evict(recorded.pop(0)[1])
        if tokens(window) < cfg.trigger * cfg.budget or len(window) <= cfg.keep:
            continue
        head, tail = window[: -cfg.keep], window[-cfg.keep :]
        pressure = min(1.0, tokens(window) / cfg.budget)
        try:
            with policyhook.request(trigger="automatic", budget_pressure=pressure, window="fid"):
                text = summarize(head)
            if remedies.pointers(text):
                remedied += 1
                refusals += 1
            window = [text, *tail]
        except UnsafeRecompactionError:
            refusals += 1
        result.measure(
            window,
            facts,
            guard,
            tokens=tokens(window),
            budget=cfg.budget,
            calls=summarizer.calls,
            refusals=refusals,
            remedies=remedied,
        )
    if guard is not None:
        guard.close()
    return result


#: Output-phase rules of the grounding conditions: a summary may state no fact its input's
#: sources do not state, and may drop no key fact (`key: value`) of its live sources.
GROUNDING_POLICY = """
apiVersion: policyhook.dev/v1
kind: CompactionPolicy
metadata: {name: fidelity-grounding}
spec:
  phase: output
  matchConditions:
    - name: lossy-summarizer
      expression: "!summarizer.lossless && !summarizer.idempotent"
  rules:
    - name: grounded-facts
      expression: summary.ungrounded == 0
      message: the summary states facts no source of its input states
    - name: key-facts-kept
      expression: summary.dropped == 0
      message: the summary drops key facts its live sources state
"""


def _guard(condition: str) -> Guard | None:
    """The guard of a condition: none, the default policy, or the default plus grounding."""
    if condition == "no-gate":
        return None
    if condition not in ("gate+grounding", "everything"):
        return Guard()
    default = resources.files("policyhook").joinpath("default_policy.yaml").read_text("utf-8")
    with tempfile.TemporaryDirectory(prefix="policyhook-fidelity-") as name:  # read once: gone
        folder = Path(name)
        (folder / "default.yaml").write_text(default, encoding="utf-8")
        (folder / "grounding.yaml").write_text(GROUNDING_POLICY, encoding="utf-8")
        return Guard(policyhook.load(folder))


def _behind(guard: Guard | None, window: Sequence[str]) -> list[str]:
    """Every text the window's pointers lead back to, following pointers inside archives too."""
    if guard is None:
        return []
    seen: set[str] = set()
    found: list[str] = []
    pending = [ref for text in window for ref in remedies.pointers(text)]
    while pending:
        ref = pending.pop()
        if ref in seen:
            continue
        seen.add(ref)
        for text in guard.retrieve(ref):
            found.append(text)
            pending += remedies.pointers(text)
    return found


CONDITIONS = ("no-gate", "gate", "gate+remedies", "gate+grounding", "everything")


def runs(cfg: Config, conditions: Sequence[str] = CONDITIONS) -> Iterator[Run]:
    for mode in ("faithful", "lossy", "confabulating"):
        for condition in conditions:
            yield run(condition, mode, cfg)


def _prompt_text(value: Any) -> str:
    """The text of what a chat model is invoked with: a string, messages, or a prompt value."""
    if hasattr(value, "to_messages"):
        value = value.to_messages()
    if isinstance(value, list):
        return "\n".join(str(getattr(m, "content", m)) for m in value)
    return str(value)


def run_langchain(mode: str, cfg: Config, summary_model: Any = None) -> Run:
    """The `everything` condition through the real LangChain v1 middleware in a `create_agent`
    agent (adapters extra): the same conversation, a scripted agent model, and as summarizer the
    scripted `mode` one, or `summary_model`: any LangChain chat model you supply (a real LLM;
    `--langchain-model`, never run in CI). `Run.refused_regions` lists every refused region."""
    from langchain.agents import create_agent
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, HumanMessage
    from langgraph.checkpoint.memory import InMemorySaver

    from policyhook.adapters.langchain import GuardedSummarizationMiddleware

    facts, messages = transcript(cfg.seed, cfg.facts, cfg.turns, cfg.turn_chars)
    summarizer = Summarizer(mode, facts, cfg.seed, cfg.p)
    guard = _guard("everything")
    assert guard is not None
    seen: list[int] = []  # tokens of every model call's input

    class Agent(GenericFakeChatModel):
        def bind_tools(self, tools: object, **kwargs: object) -> Agent:
            return self

        def invoke(self, value: Any, *args: Any, **kwargs: Any) -> AIMessage:  # type: ignore[override]
            texts = [str(m.content) for m in value] if isinstance(value, list) else [str(value)]
            seen.append(tokens(texts))
            return AIMessage("ok")

    class Summarizing(GenericFakeChatModel):
        def invoke(self, value: Any, *args: Any, **kwargs: Any) -> AIMessage:  # type: ignore[override]
            return AIMessage(summarizer([_prompt_text(value)]))

    middleware = GuardedSummarizationMiddleware(
        summary_model if summary_model is not None else Summarizing(messages=iter(())),
        guard=guard,
        trigger=("tokens", int(cfg.trigger * cfg.budget)),
        keep=("messages", cfg.keep),
        token_counter=lambda ms: tokens([str(m.content) for m in ms]),
    )
    agent = create_agent(
        model=Agent(messages=iter(())),
        tools=[],
        middleware=[middleware],
        checkpointer=InMemorySaver(),
    )
    config: Any = {"configurable": {"thread_id": "fidelity"}}
    name = (
        "everything (LangChain)" if summary_model is None else "everything (LangChain, your model)"
    )
    result = Run(name, mode if summary_model is None else type(summary_model).__name__)
    state: dict[str, Any] = {}
    refusals = cursor = 0
    for turn, message in enumerate(messages):
        if turn > cfg.retention:
            guard.store.evict(f"langchain:m{turn - cfg.retention}")
        with capture_decisions(guard) as decided:
            state = agent.invoke({"messages": [HumanMessage(message.text, id=f"m{turn}")]}, config)
        if not decided:
            continue
        refusals += result.refused(decided)
        result.measure(
            [str(m.content) for m in state["messages"]],
            facts,
            guard,
            tokens=max(seen[cursor:]),
            budget=cfg.budget,
            calls=summarizer.calls if summary_model is None else len(result.passes) + 1,
            refusals=refusals,
            remedies=refusals,
        )
        cursor = len(seen)
    guard.close()
    return result


def run_langmem(mode: str, cfg: Config) -> Run:
    """The `everything` condition through policyhook's langmem `summarize_messages` (adapters
    extra): a running summary extended whenever the messages pass the trigger."""
    from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
    from langchain_core.messages import AIMessage, AnyMessage, HumanMessage

    from policyhook.adapters.langmem import summarize_messages

    facts, messages = transcript(cfg.seed, cfg.facts, cfg.turns, cfg.turn_chars)
    summarizer = Summarizer(mode, facts, cfg.seed, cfg.p)
    guard = _guard("everything")
    assert guard is not None

    class Summarizing(GenericFakeChatModel):
        def invoke(self, value: Any, *args: Any, **kwargs: Any) -> AIMessage:  # type: ignore[override]
            return AIMessage(summarizer([_prompt_text(value)]))

    model = Summarizing(messages=iter(()))
    result = Run("everything (langmem)", mode)
    history: list[AnyMessage] = []
    running = None
    refusals = 0
    for turn, message in enumerate(messages):
        if turn > cfg.retention:
            guard.store.evict(f"langmem:m{turn - cfg.retention}")
        history.append(HumanMessage(message.text, id=f"m{turn}"))
        with capture_decisions(guard) as decided:
            out = summarize_messages(
                history,
                running_summary=running,
                model=model,
                guard=guard,
                window="fidelity",
                max_tokens=cfg.budget,
                max_tokens_before_summary=int(cfg.trigger * cfg.budget),
                max_summary_tokens=cfg.budget // 4,
                token_counter=lambda ms: tokens([str(m.content) for m in ms]),
            )
        running = out.running_summary
        if not decided:
            continue
        refusals += result.refused(decided)
        window = [str(m.content) for m in out.messages]
        result.measure(
            window,
            facts,
            guard,
            tokens=tokens(window),
            budget=cfg.budget,
            calls=summarizer.calls,
            refusals=refusals,
            remedies=refusals,
        )
    guard.close()
    return result


# -- report -------------------------------------------------------------------------------------


def table(results: Sequence[Run]) -> str:
    rows = [
        "| summarizer | condition | passes | recall (last) | recall (min) "
        "| wrong facts (sum over passes) "
        "| max tokens / budget | summarize calls | refusals | remedies |",
        "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in results:
        if not r.passes:
            continue
        last = r.passes[-1]
        rows.append(
            f"| {r.summarizer} | {r.condition} | {len(r.passes)} | {last.recall:.0%} "
            f"| {min(p.recall for p in r.passes):.0%} | {sum(p.wrong for p in r.passes)} "
            f"| {max(p.tokens for p in r.passes) / last.budget:.2f} | {last.calls} "
            f"| {last.refusals} | {last.remedies} |"
        )
    return "\n".join(rows)


def plot(results: Sequence[Run], path: Path) -> None:
    """Recall and wrong facts per pass for each condition (needs the `bench` extra)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = [
        m for m in ("faithful", "lossy", "confabulating") if any(r.summarizer == m for r in results)
    ]
    fig, axes = plt.subplots(2, len(modes), figsize=(5 * len(modes), 7), squeeze=False)
    for column, mode in enumerate(modes):
        for r in (r for r in results if r.summarizer == mode):
            xs = [p.number for p in r.passes]
            axes[0][column].plot(xs, [p.recall for p in r.passes], label=r.condition)
            axes[1][column].plot(xs, [p.wrong for p in r.passes], label=r.condition)
        axes[0][column].set_title(f"{mode} summarizer")
        axes[0][column].set_ylabel("probe recall")
        axes[0][column].set_ylim(-0.05, 1.05)
        axes[1][column].set_ylabel("wrong facts in the window")
        axes[1][column].set_xlabel("compaction pass")
        axes[0][column].legend(fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=100)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="the CI-sized run (60 turns)")
    parser.add_argument("--seed", type=int, default=Config.seed)
    parser.add_argument("--json", type=Path, help="write every pass of every run here")
    parser.add_argument("--plot", type=Path, help="write the PNG plot here (the `bench` extra)")
    parser.add_argument(
        "--langchain-model",
        metavar="MODULE:FACTORY",
        help="also run the LangChain condition with the chat model FACTORY() returns (a real "
        "LLM as summarizer, e.g. mypkg.models:summarizer); not run in CI",
    )
    args = parser.parse_args(argv)
    cfg = Config(seed=args.seed, turns=60 if args.quick else Config.turns)
    results = list(runs(cfg))
    try:
        results.append(run_langchain("confabulating", cfg))
        results.append(run_langmem("confabulating", cfg))
        if args.langchain_model:
            module, _, factory = args.langchain_model.partition(":")
            model = getattr(importlib.import_module(module), factory)()
            results.append(run_langchain("confabulating", cfg, summary_model=model))
    except ImportError as missing:  # the adapters extra is not installed
        print(f"(no LangChain run: {missing})", file=sys.stderr)
    print(table(results))
    if args.json:
        args.json.write_text(json.dumps([asdict(r) for r in results], indent=1))
    if args.plot:
        plot(results, args.plot)
        print(f"\nplot: {args.plot}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
