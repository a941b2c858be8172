"""Property: through a real LangChain agent, a summary whose originals are gone is never summarized.

A hypothesis state machine drives `create_agent` with `GuardedSummarizationMiddleware` (summarize
at 6 messages, keep 2), the way an agent runs: a new turn per step, sources evicted from the store
at random (one, or every one), the guard restarted over the same store (a new process: nothing
cached), over a MemoryStore or a SQLite file, remedies on or off. The summarizing model records each prompt it is given; an oracle
computed from those prompts alone says what each summary rests on (the originals quoted in its
prompt, and what the earlier summaries quoted there rest on). Each time the summarizing model is
called, which is a grant, every summary in its prompt must rest only on originals the store still
holds (`store.sources`, the store's own truth). A
remedy's note (the summary's place taken by a pointer to the archived messages, with their exact
facts pinned) rests on its pointer, a source of its own, and on any summary it keeps.

Texts hold no digits the summaries repeat, so the output check (grounded numbers) has nothing to
refuse. Fixed budgets, derandomized: CI stays bounded.
"""

from __future__ import annotations

import itertools
import os
import re
import tempfile
from pathlib import Path
from typing import Any

import pytest

if not os.environ.get("CI"):  # in CI the adapters extra must be installed: fail, do not skip
    pytest.importorskip("langchain.agents.middleware")

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import (
    FakeListChatModel,
    GenericFakeChatModel,
)
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from policyhook import Guard, MemoryStore, SQLiteStore, Store, UnsafeRecompactionError
from policyhook.adapters.langchain import GuardedSummarizationMiddleware

WORDS = ["retry", "ceiling", "deploy", "window", "billing", "backoff", "jitter", "quota", "shard"]
LETTERS = "abcdefghijklmnopqrstuvwxyz"
#: A remedy's note names the archive its pointer (a source, `<ref>#pointer`) stands for.
POINTER = re.compile(r"\[policyhook offload (offload:[0-9a-f]+)\]")


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


class AgentLoop(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.directory = tempfile.TemporaryDirectory()
        self.store: Store = MemoryStore()
        self.counter = itertools.count()
        self.originals: set[str] = set()  # every turn and answer the agent saw
        self.made_from: dict[str, frozenset[str]] = {}  # summary -> originals it rests on
        self.notes: set[str] = set()  # remedies' texts: recorded as sources
        self.violations: list[str] = []
        self.answers = (AIMessage(f"answer {n:05d} {WORDS[n % 9]}") for n in itertools.count())
        self.config = {"configurable": {"thread_id": "thread-1"}}
        self.checkpointer = InMemorySaver()

    @initialize(remedy=st.booleans(), max_texts=st.sampled_from([64, 65_536]), sqlite=st.booleans())
    def start(self, remedy: bool, max_texts: int, sqlite: bool) -> None:
        self.remedy = remedy
        self.max_texts = max_texts
        self.sqlite = sqlite
        self._new_agent()

    def _new_agent(self) -> None:
        """A guard over the same store and an agent over the same thread: a restarted process
        (over SQLite, a new connection to the same file: nothing of the old one cached)."""
        if self.sqlite:
            if isinstance(self.store, SQLiteStore):
                self.store.close()
            self.store = SQLiteStore(Path(self.directory.name) / "store.db")
        self.guard = Guard(store=self.store, max_texts=self.max_texts)
        middleware = GuardedSummarizationMiddleware(
            RecordingSummarizer(responses=["unused"], machine=self),
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

    # -- the oracle -----------------------------------------------------------------------------

    def held(self) -> set[str]:
        """What the store can give back: the originals' texts, and each remedy's pointer."""
        held = set()
        for source, text in self.store.sources(1_000_000):
            held.add(
                f"pointer:{source.id[: -len('#pointer')]}"
                if source.id.endswith("#pointer")
                else text
            )
        return held

    def summarized(self, prompt: str) -> str:
        """The summarizing model ran (a grant): check what its prompt rests on, make a summary."""
        held = self.held()
        rests = {f"pointer:{ref}" for ref in POINTER.findall(prompt)}
        for summary, sources in self.made_from.items():
            if summary in prompt:
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

    @rule(words=st.lists(st.sampled_from(WORDS), min_size=1, max_size=6))
    def turns(self, words: list[str]) -> None:
        for word in words:
            self.turn(word)

    def turn(self, word: str) -> None:
        question = f"question {next(self.counter):05d} about {word}"
        self.originals.add(question)
        try:
            out = self.agent.invoke({"messages": [HumanMessage(question)]}, self.config)
        except UnsafeRecompactionError:  # not raised: raise_on_refusal is off
            raise AssertionError("the middleware raised with raise_on_refusal off") from None
        for message in out["messages"]:
            text = str(message.content)
            if message.additional_kwargs.get("lc_source") == "summarization":
                body = text.split("\n\n", 1)[-1]
                if body not in self.made_from:
                    self.notes.add(body)  # a remedy's note took the summary's place
            elif isinstance(message, AIMessage | HumanMessage):
                self.originals.add(text)

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
        self.directory.cleanup()


AgentLoop.TestCase.settings = settings(
    max_examples=25,
    stateful_step_count=30,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)
TestAgentLoop = AgentLoop.TestCase


def test_the_oracle_sees_a_wrong_allow() -> None:
    """The oracle is not blind: an unguarded re-summarization of gone originals is reported."""
    machine = AgentLoop()
    first = machine.summarized("question 00001 about retry")
    machine.originals.add("question 00001 about retry")
    machine.made_from[first] = frozenset({"question 00001 about retry"})
    machine.summarized(f"{first}\nquestion 00002")
    machine.teardown()
    assert machine.violations and "1 of its 1 sources are gone" in machine.violations[0]
