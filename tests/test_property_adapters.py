"""Property: through the real adapters, a summary whose originals are gone is never summarized.

Hypothesis state machines live an agent's life through LangChain's `create_agent` with
`GuardedSummarizationMiddleware` and through langmem's running summary: new turns, sources evicted
from the store at random (one, or every one), the guard restarted over the same store (a new
process: nothing cached), over a MemoryStore or a SQLite file, remedies on or off. The summarizing
model records each prompt it is given; an oracle computed from those prompts alone says what each
summary rests on (the originals quoted in its prompt, and what the earlier summaries quoted there
rest on). Each time the summarizing model is called, which is a grant, every summary in its
prompt must rest only on sources the store still holds (`store.sources`, the store's own truth).
A remedy's note (the summary's place taken by a pointer to the archived messages, with their
exact facts pinned) rests on its pointer, a source of its own, and on any summary it keeps.
Hypothesis events count the refusals and re-summarizations reached
(`pytest --hypothesis-show-statistics`).

Texts hold no digits the summaries repeat, so the output check (grounded numbers) has nothing to
refuse. Fixed budgets, derandomized: CI stays bounded.
"""

from __future__ import annotations

import itertools
import math
import os
import re
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import deep
import pytest
from outage import one_fault, store_down

if not os.environ.get("CI"):  # in CI the adapters extra must be installed: fail, do not skip
    pytest.importorskip("langchain.agents.middleware")
    pytest.importorskip("langmem.short_term")

from hypothesis import currently_in_test_context, event
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, AnyMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver
from langmem.short_term import RunningSummary  # type: ignore[import-untyped]

from policyhook import Decision, Guard, MemoryStore, SQLiteStore, Store, remedies
from policyhook.adapters.langchain import GuardedSummarizationMiddleware
from policyhook.adapters.langmem import summarize_messages as langmem_summarize

WORDS = ["retry", "ceiling", "deploy", "window", "billing", "backoff", "jitter", "quota", "shard"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: A remedy's note names the archive its pointer (a source, `<ref>#pointer`) stands for.
POINTER = re.compile(r"\[policyhook offload (offload:[0-9a-f]+)\]")


def reached(what: str) -> None:
    """Count a state the machine reached (`--hypothesis-show-statistics`), inside a test case."""
    if currently_in_test_context():
        event(what)


def spelled(n: int) -> str:
    """`n` in letters (the summaries must hold no digit: grounded numbers would refuse it)."""
    out = ""
    while True:
        n, r = divmod(n, len(LETTERS))
        out += LETTERS[r]
        if n == 0:
            return out


class ToolCallingFake(GenericFakeChatModel):
    """The agent's scripted model; accepts tools (the middleware adds `retrieve_context`)."""

    def bind_tools(self, tools: Any, **kwargs: Any) -> Any:
        return self


class RecordingSummarizer(FakeListChatModel):
    """The summarizing model: a new summary per call, its prompt handed to `machine`."""

    machine: Any = None

    def _call(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> str:
        prompt = "\n".join(str(m.content) for m in messages)
        return str(self.machine.summarized(prompt))


class Loop(RuleBasedStateMachine):
    """An agent's life through one adapter; subclasses say how a turn reaches the summarizer."""

    BUDGET: int  # the most messages the model is given at a turn: the adapter's trigger

    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.store: Store = MemoryStore()
        self.counter = itertools.count()
        self.originals: set[str] = set()  # every turn and answer the agent saw
        self.made_from: dict[str, frozenset[str]] = {}  # summary -> originals it rests on
        self.notes: set[str] = set()  # remedies' texts: recorded as sources
        self.violations: list[str] = []
        self.spools: list[SQLiteStore] = []
        self.window = 0  # messages the model was given at the last turn

    @initialize(
        remedy=st.booleans(),
        max_texts=st.sampled_from([64, 65_536]),
        sqlite=st.booleans(),
        spool=st.booleans(),
    )
    def start(self, remedy: bool, max_texts: int, sqlite: bool, spool: bool) -> None:
        self.remedy = remedy
        self.max_texts = max_texts
        self.sqlite = sqlite
        self.spool = spool
        self._new_agent()

    def _new_agent(self) -> None:
        """A guard over the same store and an agent over the same conversation: a restarted
        process (over SQLite, a new connection to the same file: nothing of the old one cached)."""
        if self.sqlite:
            if isinstance(self.store, SQLiteStore):
                self.store.close()
            self.store = SQLiteStore(Path(self.directory.name) / "store.db")
        spool = None
        if self.spool:  # the same file across restarts: what one process spooled, the next moves
            spool = SQLiteStore(Path(self.directory.name) / "spool.db")
            self.spools.append(spool)
        self.guard = Guard(store=self.store, max_texts=self.max_texts, spool=spool)
        if spool is not None:  # the store back, the next call moves it: no waiting
            self.guard._spool._clock = lambda: math.inf  # type: ignore[union-attr]
        self.guard.add_listener(self._decided)
        self.summarizer = RecordingSummarizer(responses=["unused"], machine=self)
        self._restarted()

    def _decided(self, decision: Decision, activation: Mapping[str, Any]) -> None:
        if "summary" not in activation:  # the input phase: where provenance decides
            reached(
                f"input decision: {decision.effect.value} at depth {activation['region']['depth'] > 0:d}"
            )

    def _restarted(self) -> None:
        """Build the adapter over `self.guard` and `self.summarizer`."""
        raise NotImplementedError

    def turn(self, word: str) -> None:
        """One question and its answer; the adapter summarizes when its trigger says so."""
        raise NotImplementedError

    def in_budget(self) -> None:
        """Every refusal has a way forward that keeps the window in budget: the model is never
        given more messages than the adapter's trigger lets through."""
        assert self.window <= self.BUDGET, f"{self.window} messages, over {self.BUDGET}"

    def summary_in_place(self, text: str) -> None:
        """The conversation now holds `text` where a summary goes: a remedy's note, unless the
        summarizing model wrote it."""
        if text not in self.made_from:
            self.notes.add(text)
            reached("a remedy's note took a summary's place")

    # -- the oracle -----------------------------------------------------------------------------

    def held(self) -> set[str]:
        """What the store can give back: the originals' texts, and each remedy's pointer."""
        held = set()
        # (the store's class method: the truth, read past a fault the machine put on the store)
        for source, text in type(self.store).sources(self.store, 1_000_000):
            pointer = POINTER.search(text) if source.kind == remedies.POINTER_KIND else None
            held.add(text if pointer is None else f"pointer:{pointer[1]}")
        return held

    def summarized(self, prompt: str) -> str:
        """The summarizing model ran (a grant): check what its prompt rests on, make a summary."""
        held = self.held()
        rests = {f"pointer:{ref}" for ref in POINTER.findall(prompt)}
        for summary, sources in self.made_from.items():
            if summary in prompt:
                reached("a summary summarized again")
                gone = sources - held
                if gone:
                    self.violations.append(
                        f"summarized {summary!r} though {len(gone)} of its {len(sources)} "
                        f"sources are gone: {sorted(gone)[:3]}"
                    )
                rests |= sources
        for note in self.notes:  # the facts a note pins verbatim rest on its pointer
            prompt = prompt.replace(note, "")
        rests |= {text for text in self.originals if text in prompt}
        n = next(self.counter)
        summary = f"summary {spelled(n)}: the agent tuned {WORDS[n % 9]} and {WORDS[(n + 4) % 9]}"
        self.made_from[summary] = frozenset(rests)
        return summary

    # -- the agent's life -----------------------------------------------------------------------

    @rule(words=st.lists(st.sampled_from(WORDS), min_size=2, max_size=8))
    def turns(self, words: list[str]) -> None:
        for word in words:
            self.turn(word)
            if self.remedy:
                self.in_budget()

    @rule(
        words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=4),
        at=st.one_of(st.just(0), st.integers(min_value=1, max_value=40)),  # 0: down, half
    )
    def turns_while_the_store_fails(self, words: list[str], at: int) -> None:
        """Turns with the store down (`at` 0) or its `at`-th call failing: the agent goes on
        (no turn raises: what the store could not take is decided as content no store holds),
        and no summary of gone originals is made."""
        with one_fault([self.store], at) if at else store_down(self.store):
            for word in words:
                self.turn(word)
                if self.spool and self.remedy:  # through the outage too
                    self.in_budget()

    @rule(pick=st.one_of(st.integers(min_value=0, max_value=1_000), st.none()))
    def evict(self, pick: int | None) -> None:
        """One held source gone, or (None) every one."""
        held = self.store.sources(1_000_000)
        for source, _ in held if pick is None else held[pick % max(1, len(held)) :][:1]:
            self.store.evict(source.id)

    @rule()
    def restart(self) -> None:
        self._new_agent()

    @invariant()
    def no_summary_of_gone_originals(self) -> None:
        assert not self.violations, self.violations[0]

    def teardown(self) -> None:
        if isinstance(self.store, SQLiteStore):
            self.store.close()
        for spool in self.spools:
            spool.close()
        self.directory.cleanup()


class LangChainLoop(Loop):
    """Through `create_agent` with `GuardedSummarizationMiddleware` (summarize at 6 messages,
    keep 2), one LangGraph thread in a checkpointer that outlives restarts."""

    BUDGET = 6  # the trigger: at 6 messages before the model call, summarized

    def __init__(self) -> None:
        super().__init__()
        self.answers = (AIMessage(f"answer {n:05d} {WORDS[n % 9]}") for n in itertools.count())
        self.config = {"configurable": {"thread_id": "thread-1"}}
        self.checkpointer = InMemorySaver()

    def _restarted(self) -> None:
        middleware = GuardedSummarizationMiddleware(
            self.summarizer,
            guard=self.guard,
            trigger=("messages", 6),
            keep=("messages", 2),
            remedy=self.remedy,
        )
        self.agent: Any = create_agent(
            model=ToolCallingFake(messages=self.answers),
            tools=[],
            middleware=[middleware],
            checkpointer=self.checkpointer,
        )

    def turn(self, word: str) -> None:
        question = f"question {next(self.counter):05d} about {word}"
        self.originals.add(question)
        out = self.agent.invoke({"messages": [HumanMessage(question)]}, self.config)
        self.window = len(out["messages"])
        for message in out["messages"]:
            text = str(message.content)
            if message.additional_kwargs.get("lc_source") == "summarization":
                self.summary_in_place(text.split("\n\n", 1)[-1])  # after upstream's prefix
            elif isinstance(message, AIMessage | HumanMessage):
                self.originals.add(text)


class LangmemLoop(Loop):
    """Through langmem's running summary (`policyhook.adapters.langmem.summarize_messages`): one
    token per message, summarized once 4 new messages piled up."""

    BUDGET = 6  # max_tokens, one token a message: langmem's bound on what it returns

    def __init__(self) -> None:
        super().__init__()
        self.messages: list[AnyMessage] = []
        self.running: RunningSummary | None = None

    def _restarted(self) -> None:
        pass  # langmem keeps no state of its own: the messages and running summary are ours

    def turn(self, word: str) -> None:
        n = next(self.counter)
        question, answer = f"question {n:05d} about {word}", f"answer {n:05d} {WORDS[n % 9]}"
        self.originals |= {question, answer}
        self.messages += [HumanMessage(question, id=f"h{n}"), AIMessage(answer, id=f"a{n}")]
        result = langmem_summarize(
            self.messages,
            running_summary=self.running,
            model=self.summarizer,
            guard=self.guard,
            window="chat-1",
            remedy=self.remedy,
            max_tokens=6,
            max_tokens_before_summary=4,
            max_summary_tokens=1,
            token_counter=lambda messages: len(list(messages)),
        )
        self.running = result.running_summary
        self.window = len(result.messages)
        if self.running is not None:
            self.summary_in_place(self.running.summary)


SETTINGS = deep.suite(40, 30)
LangChainLoop.TestCase.settings = SETTINGS
LangmemLoop.TestCase.settings = SETTINGS
TestLangChainLoop = LangChainLoop.TestCase
TestLangmemLoop = LangmemLoop.TestCase


def test_the_oracle_sees_a_wrong_allow() -> None:
    """The oracle is not blind: an unguarded re-summarization of gone originals is reported."""
    machine = LangChainLoop()
    first = machine.summarized("question 00001 about retry")
    machine.originals.add("question 00001 about retry")
    machine.made_from[first] = frozenset({"question 00001 about retry"})
    machine.summarized(f"{first}\nquestion 00002")
    machine.teardown()
    assert machine.violations and "1 of its 1 sources are gone" in machine.violations[0]
